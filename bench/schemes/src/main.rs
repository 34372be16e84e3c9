//! `oubli-bench-schemes`: the three key schemes side by side on identical workloads, in one run — throughput, key metadata, commit time against store size, deletion latency, the 5 s epoch's cost and the forest's size over time.
//!
//! Usage: `oubli-bench-schemes WORKDIR [options]` (see `--help`). Every
//! result is one JSON line on stdout; lines starting with `# ` are the same
//! for people. `bench/schemes/run` turns them into the tables and plots
//! (`bench/schemes/report.py`).

mod phases;
mod store;
mod workloads;
mod zipf;

use oubli_bench_engine::report::{say, Rec, MIB};
use oubli_bench_engine::store::BoxResult;
use oubli_bench_engine::{free_space, main_of, parse_size, Args};
use phases::{ForestSizes, ThroughputSizes};
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;

const PHASES: [&str; 5] = ["throughput", "commit-size", "deletion", "epochs", "forest"];

const HELP: &str = "\
usage: oubli-bench-schemes WORKDIR [options]

Every store is a DirMedium under WORKDIR with a file vault (light KDF),
one per key scheme: parent-pointer, keyed-hash-forest, key-storage-area.
Sizes accept K, M, G suffixes (binary).

  --quick              small sizes and one round: a smoke run of a minute or two
  --rounds N           rounds of the throughput and epoch phases          [3]
  --sizes LIST         store sizes for commit vs store size       [100M,1G,4G]
  --commit-runs N      timed commits per scheme and size                  [7]
  --deletions N        files removed per scheme for the deletion latency  [100]
  --epoch-seconds S    seconds of each epoch-phase run                    [15]
  --epoch N            the epoch: a commit every N seconds (Lethe's: 5)   [5]
  --only LIST          a subset of throughput,commit-size,deletion,epochs,forest
  --seed N             seed of the workloads                              [42]
";

struct Config {
    work: PathBuf,
    quick: bool,
    rounds: usize,
    throughput: ThroughputSizes,
    sizes: Vec<u64>,
    commit_runs: usize,
    deletion_base: u64,
    deletions: u64,
    deletion_file: u64,
    epoch_span: u64,
    epoch_seconds: f64,
    epoch: u64,
    forest: ForestSizes,
    only: HashSet<String>,
    seed: u64,
}

impl Config {
    fn full() -> Config {
        Config {
            work: PathBuf::new(),
            quick: false,
            rounds: 3,
            throughput: ThroughputSizes {
                seq_bytes: 256 * MIB,
                rand_span: 256 * MIB,
                rand_writes: 32_768,
                files: 5_000,
                file_size: 4096,
                records: 65_536,
                ycsb_ops: 100_000,
            },
            sizes: vec![100 * MIB, 1024 * MIB, 4096 * MIB],
            commit_runs: 7,
            deletion_base: 256 * MIB,
            deletions: 100,
            deletion_file: 64 * 1024,
            epoch_span: 256 * MIB,
            epoch_seconds: 15.0,
            epoch: 5,
            forest: ForestSizes {
                live_files: 20_000,
                churn: 1_000,
                steps: 30,
                consolidate_every: 10,
            },
            only: PHASES.iter().map(|p| p.to_string()).collect(),
            seed: 42,
        }
    }

    /// The smoke run: every phase, small.
    fn quick(self) -> Config {
        Config {
            quick: true,
            rounds: 1,
            throughput: ThroughputSizes {
                seq_bytes: 32 * MIB,
                rand_span: 32 * MIB,
                rand_writes: 4_096,
                files: 500,
                file_size: 4096,
                records: 8_192,
                ycsb_ops: 10_000,
            },
            sizes: vec![16 * MIB, 64 * MIB, 256 * MIB],
            commit_runs: 3,
            deletion_base: 16 * MIB,
            deletions: 20,
            epoch_span: 32 * MIB,
            epoch_seconds: 6.0,
            forest: ForestSizes {
                live_files: 2_000,
                churn: 200,
                steps: 8,
                consolidate_every: 4,
            },
            ..self
        }
    }
}

fn parse_args(args: Vec<String>) -> Result<Config, String> {
    let mut c = if args.iter().any(|a| a == "--quick") {
        Config::full().quick()
    } else {
        Config::full()
    };
    let mut work = None;
    let mut args = Args::new(args);
    while let Some(flag) = args.next_arg() {
        let f = flag.as_str();
        match f {
            "-h" | "--help" => return Err(String::new()),
            "--quick" => {}
            "--rounds" => c.rounds = args.number(f)?.max(1) as usize,
            "--sizes" => {
                c.sizes = args
                    .value(f)?
                    .split(',')
                    .map(|s| parse_size(s).map(|b| (b / MIB).max(1) * MIB))
                    .collect::<Result<_, _>>()?
            }
            "--commit-runs" => c.commit_runs = args.number(f)?.max(1) as usize,
            "--deletions" => c.deletions = args.number(f)?.max(1),
            "--epoch-seconds" => {
                c.epoch_seconds = args.value(f)?.parse().map_err(|_| "bad --epoch-seconds")?
            }
            "--epoch" => c.epoch = args.number(f)?.max(1),
            "--seed" => c.seed = args.number(f)?,
            "--only" => {
                c.only = args
                    .value(f)?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .collect();
                if let Some(bad) = c.only.iter().find(|p| !PHASES.contains(&p.as_str())) {
                    return Err(format!("unknown phase {bad:?} in --only"));
                }
            }
            _ if f.starts_with('-') => return Err(format!("unknown option {f}")),
            _ if work.is_none() => work = Some(PathBuf::from(f)),
            _ => return Err(format!("unexpected argument {f:?}")),
        }
    }
    c.work = work.ok_or("missing WORKDIR")?;
    Ok(c)
}

/// Peak disk use: the commit-vs-size phase keeps one store per scheme of
/// the largest size open at once; every other phase needs far less.
fn space_needed(c: &Config) -> u64 {
    let largest = c.sizes.iter().copied().max().unwrap_or(0);
    let stores = 3 * (largest + largest / 20);
    stores.max(4 * c.epoch_span) + (512 * MIB)
}

fn run(c: &Config) -> BoxResult<()> {
    std::fs::create_dir_all(&c.work)?;
    let work = c.work.canonicalize()?;
    let on = |p: &str| c.only.contains(p);
    let need = if on("commit-size") {
        space_needed(c)
    } else {
        4 * c.epoch_span + 512 * MIB
    };
    let free = free_space(&work)?;
    if free < need {
        return Err(format!(
            "{} has {} MiB free but this run needs about {} MiB (try --sizes or --quick)",
            work.display(),
            free / MIB,
            need / MIB
        )
        .into());
    }
    say(format!(
        "oubli key-scheme benchmark in {} (DirMedium, file vault, 32 KiB cells, cleaner off){}",
        work.display(),
        if c.quick { ", --quick" } else { "" }
    ));
    let z = &c.throughput;
    Rec::new("config")
        .str("workdir", &work.display().to_string())
        .int("quick", c.quick as u64)
        .int("rounds", c.rounds as u64)
        .int("seq_bytes", z.seq_bytes)
        .int("rand_span", z.rand_span)
        .int("rand_writes", z.rand_writes)
        .int("files", z.files)
        .int("file_size", z.file_size)
        .int("records", z.records)
        .int("ycsb_ops", z.ycsb_ops)
        .nums(
            "sizes",
            &c.sizes.iter().map(|&s| s as f64).collect::<Vec<_>>(),
        )
        .int("commit_runs", c.commit_runs as u64)
        .int("deletion_base", c.deletion_base)
        .int("deletions", c.deletions)
        .int("deletion_file", c.deletion_file)
        .int("epoch_span", c.epoch_span)
        .num("epoch_seconds", c.epoch_seconds)
        .int("epoch", c.epoch)
        .int("forest_live_files", c.forest.live_files)
        .int("forest_churn", c.forest.churn)
        .int("forest_steps", c.forest.steps)
        .int("forest_consolidate_every", c.forest.consolidate_every)
        .int("seed", c.seed)
        .int("disk_free_bytes", free)
        .emit();
    if on("throughput") {
        phases::throughput(&work, z, c.rounds, c.seed)?;
    }
    if on("deletion") {
        phases::deletion_latency(&work, c.deletion_base, c.deletions, c.deletion_file)?;
    }
    if on("forest") {
        phases::forest_over_time(&work, &c.forest, c.seed)?;
    }
    if on("epochs") {
        phases::epoch_cost(
            &work,
            c.epoch_span,
            c.epoch_seconds,
            c.epoch,
            c.rounds,
            c.seed,
        )?;
    }
    if on("commit-size") {
        phases::commit_vs_size(&work, &c.sizes, c.commit_runs, c.seed)?;
    }
    Rec::new("done").emit();
    Ok(())
}

fn main() -> ExitCode {
    main_of("oubli-bench-schemes", HELP, parse_args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let parse = |line: &str| parse_args(line.split_whitespace().map(String::from).collect());
        let c = parse("/tmp/x --quick --sizes 1M,2G --only forest,epochs").unwrap();
        assert!(c.quick && c.rounds == 1);
        assert_eq!(c.sizes, vec![MIB, 2048 * MIB]);
        assert!(c.only.contains("forest") && !c.only.contains("throughput"));
        assert_eq!(Config::full().rounds, 3);
        assert!(parse("/x --only nope").is_err());
        assert!(parse("--quick").is_err());
    }
}
