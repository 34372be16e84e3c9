//! `oubli-bench-engine`: the engine benchmark — throughput, commit latency and key-metadata overhead on a real `DirMedium`, beside plain-file baselines.
//!
//! Usage: `oubli-bench-engine WORKDIR [options]` (see `--help`). Every
//! result is printed to stdout as one JSON object per line; lines starting
//! with `# ` are the same results for people. `bench/engine/run` turns the
//! JSON lines into the ratio table and `bench/out/engine.png`.

mod aead;
mod scale;
mod stall;

use oubli_bench_engine::{free_space, main_of, parse_size, plain, report, store};
use report::{mb_per_s, say, Rec, MIB};
use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use store::BoxResult;

const GROUPS: [&str; 11] = [
    "aead",
    "plain",
    "seq",
    "rand",
    "commit-units",
    "commit-size",
    "commit-stall",
    "flush-stall",
    "cap-stall",
    "cleaner-stall",
    "scale",
];

const HELP: &str = "\
usage: oubli-bench-engine WORKDIR [options]

Runs each measurement on a DirMedium created under WORKDIR (which should be
on the file system you care about; the plain-file baselines go there too).
Sizes accept K, M, G suffixes (binary: 1M = 1 MiB).

  --seq-size SIZE      sequential write/read volume, in 1 MiB writes   [1G]
  --rand-size SIZE     volume of random 4 KiB writes                   [64M]
  --rand-span SIZE     size of the sparse object they land in          [1G]
  --units LIST         changed-cell counts for commit vs units  [1,10,100,1000,10000]
  --units-store SIZE   store size for commit vs units   [max(100M, 1.25 x cells needed)]
  --small-size SIZE    small store for commit vs store size            [100M]
  --big-size SIZE      big store for commit vs store size              [2G]
  --commit-runs N      timed commits per k (median reported)           [7]
  --size-runs N        timed commits per store size (median reported)  [11]
  --aead-size SIZE     volume per in-process AEAD measurement          [512M]
  --stall-secs S       seconds of each commit-stall, flush-stall and cap-stall run [10]
  --stall-rounds N     commit-stall rounds (each: no commits, a commit every 1 s, the policy's every 1 s, in the background), and flush-stall and cap-stall rounds [3]
  --vault-delay MS     the commit-stall, cap-stall and cleaner-stall vault's rotation time [50]
  --clean-span SIZE    object the cleaner-stall writer goes round      [1G]
  --clean-total SIZE   bytes the cleaner-stall writer writes per run   [6G]
  --clean-rounds N     cleaner-stall rounds (each: cleaner off, default, default with background commits) [2]
  --scale LIST         file counts of the scale stores                  [10000,100000,1000000]
  --only LIST          comma-separated subset of: aead,plain,seq,rand,commit-units,commit-size,commit-stall,flush-stall,cap-stall,cleaner-stall,scale
  --seed N             seed of the random offsets                      [42]
  --keep               keep the stores and files (default: removed after each benchmark)
";

struct Config {
    work: PathBuf,
    seq: u64,
    rand: u64,
    rand_span: u64,
    units: Vec<u64>,
    units_store: Option<u64>,
    small: u64,
    big: u64,
    commit_runs: usize,
    size_runs: usize,
    aead: u64,
    stall_secs: f64,
    stall_rounds: usize,
    vault_delay_ms: u64,
    clean_span: u64,
    clean_total: u64,
    clean_rounds: usize,
    scale: Vec<u64>,
    only: HashSet<String>,
    seed: u64,
    keep: bool,
}

/// A comma-separated list of counts.
fn parse_counts(s: &str) -> Result<Vec<u64>, String> {
    s.split(',')
        .map(|n| {
            n.trim()
                .parse::<u64>()
                .map_err(|_| format!("bad count {n:?}"))
        })
        .collect()
}

/// Rounds down to whole MiB (every workload writes in 1 MiB writes), at least 1 MiB.
fn whole_mib(n: u64) -> u64 {
    (n / MIB).max(1) * MIB
}

fn parse_args(args: Vec<String>) -> Result<Config, String> {
    let mut work = None;
    let mut c = Config {
        work: PathBuf::new(),
        seq: 1 << 30,
        rand: 64 << 20,
        rand_span: 1 << 30,
        units: vec![1, 10, 100, 1000, 10000],
        units_store: None,
        small: 100 << 20,
        big: 2 << 30,
        commit_runs: 7,
        size_runs: 11,
        aead: 512 << 20,
        stall_secs: 10.0,
        stall_rounds: 3,
        vault_delay_ms: 50,
        clean_span: 1 << 30,
        clean_total: 6 << 30,
        clean_rounds: 2,
        scale: vec![10_000, 100_000, 1_000_000],
        only: GROUPS.iter().map(|s| s.to_string()).collect(),
        seed: 42,
        keep: false,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--seq-size" => c.seq = whole_mib(parse_size(&value()?)?),
            "--rand-size" => c.rand = parse_size(&value()?)?.max(4096),
            "--rand-span" => c.rand_span = whole_mib(parse_size(&value()?)?),
            "--units-store" => c.units_store = Some(whole_mib(parse_size(&value()?)?)),
            "--small-size" => c.small = whole_mib(parse_size(&value()?)?),
            "--big-size" => c.big = whole_mib(parse_size(&value()?)?),
            "--aead-size" => c.aead = whole_mib(parse_size(&value()?)?),
            "--scale" => c.scale = parse_counts(&value()?)?,
            "--units" => c.units = parse_counts(&value()?)?,
            "--commit-runs" => c.commit_runs = value()?.parse().map_err(|_| "bad --commit-runs")?,
            "--size-runs" => c.size_runs = value()?.parse().map_err(|_| "bad --size-runs")?,
            "--seed" => c.seed = value()?.parse().map_err(|_| "bad --seed")?,
            "--stall-secs" => c.stall_secs = value()?.parse().map_err(|_| "bad --stall-secs")?,
            "--stall-rounds" => {
                c.stall_rounds = value()?.parse().map_err(|_| "bad --stall-rounds")?
            }
            "--vault-delay" => {
                c.vault_delay_ms = value()?.parse().map_err(|_| "bad --vault-delay")?
            }
            "--clean-span" => c.clean_span = whole_mib(parse_size(&value()?)?),
            "--clean-total" => c.clean_total = whole_mib(parse_size(&value()?)?),
            "--clean-rounds" => {
                c.clean_rounds = value()?.parse().map_err(|_| "bad --clean-rounds")?
            }
            "--only" => {
                let v = value()?;
                c.only = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = c.only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
                    return Err(format!("unknown benchmark {bad:?} in --only"));
                }
            }
            "--keep" => c.keep = true,
            f if f.starts_with('-') => return Err(format!("unknown option {f}")),
            _ if work.is_none() => work = Some(PathBuf::from(&a)),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    c.work = work.ok_or("missing WORKDIR")?;
    if c.commit_runs == 0 || c.size_runs == 0 {
        return Err("--commit-runs and --size-runs must be at least 1".into());
    }
    Ok(c)
}

/// Peak disk use of the selected benchmarks (each removes its files before the next starts).
fn space_needed(c: &Config, units_store: u64, cell: u64) -> u64 {
    let on = |g: &str| c.only.contains(g);
    let mut peak = 0u64;
    if on("plain") {
        peak = peak.max(c.seq).max(c.rand * 2);
    }
    if on("seq") {
        peak = peak.max(c.seq + c.seq / 50);
    }
    if on("rand") {
        // Cells that several writes hit are sealed more than once.
        peak = peak.max(c.rand * 4);
    }
    if on("commit-units") {
        let changed: u64 = c.units.iter().sum::<u64>() * c.commit_runs as u64 * cell;
        peak = peak.max(units_store + changed + changed / 10);
    }
    if on("commit-size") {
        // Both stores stay open while their commits alternate.
        peak = peak.max((c.big + c.small) + (c.big + c.small) / 50);
    }
    if on("cleaner-stall") {
        // With the cleaner off, every byte written stays on the medium.
        peak = peak.max(c.clean_total + c.clean_total / 50);
    }
    peak + (256 << 20)
}

fn run(c: &Config) -> BoxResult<()> {
    std::fs::create_dir_all(&c.work)?;
    let work = c.work.canonicalize()?;
    let on = |g: &str| c.only.contains(g);
    let cell = oubli_core::DEFAULT_CELL_SIZE as u64;
    let units_store = c.units_store.unwrap_or_else(|| {
        let need = c.units.iter().copied().max().unwrap_or(1) * cell;
        whole_mib((need + need / 4).max(100 << 20) + MIB - 1)
    });
    let need = space_needed(c, units_store, cell);
    let free = free_space(&work)?;
    if free < need {
        return Err(format!(
            "{} has {} MiB free but this run needs about {} MiB (shrink it with --big-size / --seq-size)",
            work.display(),
            free / MIB,
            need / MIB
        )
        .into());
    }
    say(format!(
        "oubli engine benchmark in {} (DirMedium, EpochPolicy::manual, cell size {cell} B). \
         The vault is a MemoryVault: vault writes are not what is measured.",
        work.display()
    ));
    say("MB = 10^6 bytes (as openssl speed); MiB = 2^20 bytes.");
    Rec::new("config")
        .str("workdir", &work.display().to_string())
        .str("medium", "dir")
        .str("vault", "memory (not measured)")
        .str("policy", "manual")
        .int("cell_size", cell)
        .int("seq_bytes", c.seq)
        .int("rand_bytes", c.rand)
        .int("rand_span", c.rand_span)
        .nums(
            "units",
            &c.units.iter().map(|&k| k as f64).collect::<Vec<_>>(),
        )
        .int("units_store_bytes", units_store)
        .int("small_store_bytes", c.small)
        .int("big_store_bytes", c.big)
        .int("commit_runs", c.commit_runs as u64)
        .int("size_runs", c.size_runs as u64)
        .int("seed", c.seed)
        .int("disk_free_bytes", free)
        .int("disk_needed_bytes", need)
        .emit();

    if on("aead") {
        aead::run(c.aead);
    }

    let mut rng = oubli_media::SplitMix64::new(c.seed);
    let writes = (c.rand / 4096).max(1);
    let offsets: Vec<u64> = (0..writes)
        .map(|_| rng.below(c.rand_span / 4096) * 4096)
        .collect();
    let block = store::Payload::new(4096, 7).chunk(0).to_vec();

    if on("plain") {
        let path = work.join("plain-seq.dat");
        let mut payload = store::Payload::new(MIB as usize, 1);
        let w = plain::seq_write(&path, c.seq / MIB, &mut |i| payload.chunk(i).to_vec())?;
        let secs = w.write_s + w.sync_s;
        say(format!(
            "plain file seq write {} MiB (1 MiB write_all + sync_all): {secs:.3} s = {:.1} MB/s \
             (writes {:.3} s = {:.1} MB/s, sync_all {:.3} s)",
            c.seq / MIB,
            mb_per_s(c.seq, secs),
            w.write_s,
            mb_per_s(c.seq, w.write_s),
            w.sync_s
        ));
        Rec::new("plain_seq_write")
            .int("bytes", c.seq)
            .num("secs", secs)
            .num("mb_s", mb_per_s(c.seq, secs))
            .num("write_s", w.write_s)
            .num("mb_s_before_sync", mb_per_s(c.seq, w.write_s))
            .num("sync_s", w.sync_s)
            .emit();
        for cache in ["warm", "cold"] {
            if cache == "cold" {
                plain::evict(&path)?;
            }
            let (len, secs) = plain::seq_read(&path)?;
            say(format!(
                "plain file seq read ({cache} page cache) {} MiB in 1 MiB reads: {secs:.3} s = {:.1} MB/s",
                len / MIB,
                mb_per_s(len, secs)
            ));
            Rec::new("plain_seq_read")
                .str("page_cache", cache)
                .int("bytes", len)
                .num("secs", secs)
                .num("mb_s", mb_per_s(len, secs))
                .emit();
        }
        std::fs::remove_file(&path)?;

        let path = work.join("plain-rand.dat");
        let w = plain::rand_write(&path, c.rand_span, &offsets, &block)?;
        let secs = w.write_s + w.sync_s;
        let bytes = writes * 4096;
        say(format!(
            "plain file random 4 KiB pwrite x {writes} over a sparse {} MiB file + sync_all: {secs:.3} s = \
             {:.0} IOPS = {:.1} MB/s (sync_all {:.3} s)",
            c.rand_span / MIB,
            writes as f64 / secs,
            mb_per_s(bytes, secs),
            w.sync_s
        ));
        Rec::new("plain_rand_write")
            .int("writes", writes)
            .int("bytes", bytes)
            .int("span", c.rand_span)
            .num("secs", secs)
            .num("iops", writes as f64 / secs)
            .num("mb_s", mb_per_s(bytes, secs))
            .num("sync_s", w.sync_s)
            .emit();
        if !c.keep {
            std::fs::remove_file(&path)?;
        }
    }

    if on("seq") {
        store::sequential(&work.join("store-seq"), c.seq, c.keep)?;
    }
    if on("rand") {
        store::random(
            &work.join("store-rand"),
            c.rand_span,
            &offsets,
            &block,
            c.keep,
        )?;
    }
    if on("commit-units") {
        store::commit_vs_units(
            &work.join("store-units"),
            units_store,
            &c.units,
            c.commit_runs,
            c.seed + 1,
            c.keep,
        )?;
    }
    if on("commit-size") {
        let (small, big) = (work.join("store-small"), work.join("store-big"));
        store::commit_vs_size(
            &[
                store::SizedStore {
                    dir: &small,
                    label: "small",
                    bytes: c.small,
                },
                store::SizedStore {
                    dir: &big,
                    label: "big",
                    bytes: c.big,
                },
            ],
            c.size_runs,
            c.seed + 2,
            c.keep,
        )?;
    }
    if on("commit-stall") {
        stall::commit_stall(
            &work,
            c.stall_secs,
            64 << 20,
            c.vault_delay_ms,
            c.stall_rounds,
        )?;
    }
    if on("flush-stall") {
        stall::flush_stall(&work, c.stall_secs, 64 << 20, c.stall_rounds)?;
    }
    if on("cap-stall") {
        stall::cap_stall(&work, c.stall_secs, c.vault_delay_ms, c.stall_rounds)?;
    }
    if on("cleaner-stall") {
        stall::cleaner_stall(
            &work,
            c.clean_span,
            c.clean_total,
            c.vault_delay_ms,
            c.clean_rounds,
        )?;
    }
    if on("scale") {
        scale::scale(&work, &c.scale, c.commit_runs, c.keep)?;
    }
    Rec::new("done").emit();
    Ok(())
}

fn main() -> ExitCode {
    main_of("oubli-bench-engine", HELP, parse_args, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options() {
        let c = parse_args(args(
            "/tmp/x --big-size 256M --units=1,10 --only seq,rand --keep",
        ))
        .unwrap();
        assert_eq!(c.work, PathBuf::from("/tmp/x"));
        assert_eq!(c.big, 256 << 20);
        assert_eq!(c.units, vec![1, 10]);
        assert!(c.only.contains("seq") && !c.only.contains("aead"));
        assert!(c.keep);
        assert_eq!(c.seq, 1 << 30);
        assert!(parse_args(args("--only nope /x")).is_err());
        assert!(parse_args(args("--keep")).is_err());
        assert_eq!(parse_args(args("--help")).err(), Some(String::new()));
    }
}
