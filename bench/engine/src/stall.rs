//! Stalls: a 4 KiB random writer while commits happen every second (another thread's, or the epoch policy's) against a vault slowed on purpose, or while another thread writes and flushes back to back (a database committing transactions), a file maker whose only commits are the changed-tree cap's, and a streaming writer with the automatic cleaner on, each beside the same writer without them.

use crate::report::{mb_per_s, say, Rec, MIB};
use crate::store::BoxResult;
use oubli_core::{CleanerPolicy, CreateOptions, EpochPolicy, Medium, Options, Store, Vault};
use oubli_media::{DirMedium, SplitMix64};
use oubli_vault::{MemoryVault, SlowVault};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one run measured.
struct Run {
    /// Latency of every write, in seconds, sorted.
    latencies: Vec<f64>,
    secs: f64,
    /// How long each commit took, where another thread made them.
    commits: Vec<f64>,
    /// Epochs the store went through.
    epochs: u64,
}

impl Run {
    /// A run's figures: `latencies` in any order.
    fn new(mut latencies: Vec<f64>, secs: f64, commits: Vec<f64>, epochs: u64) -> Run {
        latencies.sort_by(f64::total_cmp);
        Run {
            latencies,
            secs,
            commits,
            epochs,
        }
    }

    fn pct(&self, p: f64) -> f64 {
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i.min(self.latencies.len() - 1)]
    }
    fn writes_per_s(&self) -> f64 {
        self.latencies.len() as f64 / self.secs
    }

    /// `latency p50 …, p99 …, max …`, in milliseconds.
    fn latency_line(&self) -> String {
        format!(
            "latency p50 {:.3} ms, p99 {:.3} ms, max {:.1} ms",
            1000.0 * self.pct(0.5),
            1000.0 * self.pct(0.99),
            1000.0 * self.pct(1.0)
        )
    }

    /// The record of a stall run: its mode and round, the vault's delay,
    /// operations per second (named `rate`), latencies and commits.
    fn rec(&self, bench: &str, mode: &str, round: usize, vault_delay_ms: u64, rate: &str) -> Rec {
        Rec::new(bench)
            .str("mode", mode)
            .int("round", round as u64)
            .int("vault_delay_ms", vault_delay_ms)
            .num(rate, self.writes_per_s())
            .num("p50_ms", 1000.0 * self.pct(0.5))
            .num("p99_ms", 1000.0 * self.pct(0.99))
            .num("max_ms", 1000.0 * self.pct(1.0))
            .int("commits", self.epochs)
    }
}

/// A store on a fresh `DirMedium` in `dir` whose vault's rotation takes `vault_delay`.
fn slow_vault_store(dir: &Path, vault_delay: Duration, options: Options) -> BoxResult<Store> {
    let medium = Arc::new(DirMedium::create(dir)?);
    let store = Store::create(
        medium as Arc<dyn Medium>,
        |record| {
            let v = Arc::new(SlowVault::new(
                MemoryVault::new(record.clone()),
                vault_delay,
            ));
            Ok(v as Arc<dyn Vault>)
        },
        CreateOptions::default(),
        options,
    )?;
    Ok(store)
}

/// What runs beside the stall writer.
#[derive(Clone, Copy)]
enum Beside {
    None,
    /// Another thread, calling `Store::commit` at this period.
    Commits(Duration),
    /// Another thread writing 4 KiB to an object of its own and flushing,
    /// back to back: a database committing transactions (an `fsync`
    /// through the mount, an NBD FLUSH, each time).
    FsyncLoop,
    /// The epoch policy, on an interval of one second: in the path of the
    /// writer whose change makes it due, or on the committer thread.
    Policy {
        background: bool,
    },
}

/// One writer thread writing 4 KiB blocks at random aligned offsets of a
/// `span`-byte object for `seconds`, with `beside`. The vault's rotation
/// takes `vault_delay`.
fn run_once(
    dir: &Path,
    seconds: f64,
    span: u64,
    vault_delay: Duration,
    beside: Beside,
) -> BoxResult<Run> {
    let (policy, background_commits) = match beside {
        Beside::Policy { background } => (
            EpochPolicy {
                interval: Some(Duration::from_secs(1)),
                ..EpochPolicy::manual()
            },
            background,
        ),
        _ => (EpochPolicy::manual(), false),
    };
    let store = slow_vault_store(
        dir,
        vault_delay,
        Options {
            policy,
            background_commits,
            ..Default::default()
        },
    )?;
    let store = Arc::new(store);
    let oid = store.create_object(b"")?;
    store.commit()?;
    let first_epoch = store.epoch();
    let stop = Arc::new(AtomicBool::new(false));
    let periodic = match beside {
        Beside::Commits(period) => Some(period),
        Beside::FsyncLoop => Some(Duration::ZERO),
        _ => None,
    };
    // The fsync loop's own object (its transactions).
    let own = match beside {
        Beside::FsyncLoop => Some(store.create_object(b"")?),
        _ => None,
    };
    let committer = periodic.map(|period| {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || -> Result<Vec<f64>, oubli_core::Error> {
            let mut took = Vec::new();
            let mut next = Instant::now() + period;
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if now < next {
                    std::thread::sleep((next - now).min(Duration::from_millis(20)));
                    continue;
                }
                next += period;
                let t = Instant::now();
                match own {
                    Some(oid) => {
                        let at = (took.len() as u64 % 256) * 4096;
                        store.write(oid, at, &[took.len() as u8; 4096])?;
                        store.flush()?;
                    }
                    None => store.commit()?,
                }
                took.push(t.elapsed().as_secs_f64());
            }
            Ok(took)
        })
    });
    let mut rng = SplitMix64::new(9);
    let mut block = vec![0u8; 4096];
    let blocks = (span / 4096).max(1);
    let mut latencies = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let at = rng.below(blocks) * 4096;
        block[..8].copy_from_slice(&at.to_le_bytes());
        let t = Instant::now();
        store.write(oid, at, &block)?;
        latencies.push(t.elapsed().as_secs_f64());
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let commits = match committer {
        Some(c) => c.join().map_err(|_| "committer panicked")??,
        None => Vec::new(),
    };
    let epochs = store.epoch() - first_epoch;
    drop(store);
    Ok(Run::new(latencies, secs, commits, epochs))
}

/// Runs the writer with no commits, with another thread's commit every
/// second, and with the epoch policy's (interval 1 s) in the writer's path
/// and on the committer thread, each `rounds` times alternately; reports
/// p50/p99/max write latency and the throughput ratio.
pub fn commit_stall(
    work: &Path,
    seconds: f64,
    span: u64,
    vault_delay_ms: u64,
    rounds: usize,
) -> BoxResult<()> {
    let delay = Duration::from_millis(vault_delay_ms);
    say(format!(
        "commit stall: one thread writes 4 KiB at random offsets of a {} MiB object for {seconds} s; \
         another commits every 1 s, or the epoch policy does (interval 1 s: policy-1s in the \
         writer's path, policy-1s-background on the committer thread); the vault's rotation \
         takes {vault_delay_ms} ms (SlowVault); against the same writer with no commits; \
         {rounds} round(s), alternating",
        span >> 20
    ));
    for round in 1..=rounds {
        for (mode, beside) in [
            ("no-commits", Beside::None),
            ("commit-every-1s", Beside::Commits(Duration::from_secs(1))),
            ("policy-1s", Beside::Policy { background: false }),
            ("policy-1s-background", Beside::Policy { background: true }),
        ] {
            let dir = work.join(format!("stall-{mode}-{round}"));
            let run = run_once(&dir, seconds, span, delay, beside)?;
            std::fs::remove_dir_all(&dir)?;
            let ms = |s: f64| s * 1000.0;
            let mut commits = run.commits.clone();
            commits.sort_by(f64::total_cmp);
            let commit_median = commits.get(commits.len() / 2).copied().unwrap_or(0.0);
            // Another thread's commits are timed; the policy's are counted.
            let took = if commits.is_empty() {
                String::new()
            } else {
                format!(" (median {:.1} ms)", ms(commit_median))
            };
            say(format!(
                "commit stall {mode} round {round}: {:.0} writes/s ({:.1} MB/s), {}; {} commits{took}",
                run.writes_per_s(),
                mb_per_s(run.latencies.len() as u64 * 4096, run.secs),
                run.latency_line(),
                run.epochs,
            ));
            run.rec("commit_stall", mode, round, vault_delay_ms, "writes_per_s")
                .num("commit_median_ms", ms(commit_median))
                .emit();
        }
    }
    Ok(())
}

/// The writer of [`commit_stall`] beside another thread that writes 4 KiB
/// and flushes, back to back (`fsync-loop`), against the same writer alone
/// (`no-flushes`), `rounds` times alternately; reports p50/p99/max write
/// latency, the throughput ratio, and the loop's transactions per second
/// and median time. A flush that held the engine lock through its syncs
/// stalled the writer for most of the run.
pub fn flush_stall(work: &Path, seconds: f64, span: u64, rounds: usize) -> BoxResult<()> {
    say(format!(
        "flush stall: one thread writes 4 KiB at random offsets of a {} MiB object for \
         {seconds} s; another writes 4 KiB to an object of its own and flushes, back to \
         back (fsync-loop: a database committing transactions, each flush syncing the \
         data, the intent log and its tally), or nothing runs beside it (no-flushes); no \
         commits; {rounds} round(s), alternating",
        span >> 20
    ));
    for round in 1..=rounds {
        for (mode, beside) in [
            ("no-flushes", Beside::None),
            ("fsync-loop", Beside::FsyncLoop),
        ] {
            let dir = work.join(format!("flush-{mode}-{round}"));
            let run = run_once(&dir, seconds, span, Duration::ZERO, beside)?;
            std::fs::remove_dir_all(&dir)?;
            let mut flushes = run.commits.clone();
            flushes.sort_by(f64::total_cmp);
            let median = flushes.get(flushes.len() / 2).copied().unwrap_or(0.0);
            let per_s = flushes.len() as f64 / run.secs;
            say(format!(
                "flush stall {mode} round {round}: {:.0} writes/s ({:.1} MB/s), {}; {per_s:.0} \
                 transactions/s beside it (median {:.2} ms)",
                run.writes_per_s(),
                mb_per_s(run.latencies.len() as u64 * 4096, run.secs),
                run.latency_line(),
                median * 1000.0,
            ));
            run.rec("flush_stall", mode, round, 0, "writes_per_s")
                .num("transactions_per_s", per_s)
                .num("transaction_median_ms", median * 1000.0)
                .emit();
        }
    }
    Ok(())
}

/// A writer that makes empty named files in one directory for `seconds`,
/// on a manual epoch policy: its only commits are the ones the changed-tree
/// cap forces (every few hundred thousand files at the default 64 MiB), in
/// its own path or, with `background_commits`, on the committer thread.
fn files_once(
    dir: &Path,
    seconds: f64,
    vault_delay: Duration,
    background_commits: bool,
) -> BoxResult<Run> {
    let store = slow_vault_store(
        dir,
        vault_delay,
        Options {
            policy: EpochPolicy::manual(),
            background_commits,
            ..Default::default()
        },
    )?;
    let first_epoch = store.epoch();
    let mut latencies = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        let name = format!("file-{i:08}");
        let t = Instant::now();
        let oid = store.create_object(b"")?;
        store.link(oubli_core::ROOT_DIR, name.as_bytes(), oid)?;
        latencies.push(t.elapsed().as_secs_f64());
        i += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let epochs = store.epoch() - first_epoch;
    drop(store);
    Ok(Run::new(latencies, secs, Vec::new(), epochs))
}

/// The changed-tree cap's commits: the file maker with them in its path
/// (`cap-in-writer-path`) and on the committer thread (`cap-background`),
/// `rounds` times alternately; reports p50/p99/max per file and the
/// throughput ratio.
pub fn cap_stall(work: &Path, seconds: f64, vault_delay_ms: u64, rounds: usize) -> BoxResult<()> {
    let delay = Duration::from_millis(vault_delay_ms);
    say(format!(
        "cap stall: one thread makes empty named files in one directory for {seconds} s on a \
         manual epoch policy, so that its only commits are the changed-tree cap's (64 MiB of \
         changed nodes): in the writer's path (cap-in-writer-path) or on the committer thread \
         (cap-background); the vault's rotation takes {vault_delay_ms} ms; {rounds} round(s), \
         alternating"
    ));
    for round in 1..=rounds {
        for (mode, background) in [("cap-in-writer-path", false), ("cap-background", true)] {
            let dir = work.join(format!("cap-{mode}-{round}"));
            let run = files_once(&dir, seconds, delay, background)?;
            std::fs::remove_dir_all(&dir)?;
            say(format!(
                "cap stall {mode} round {round}: {:.0} files/s, {}; {} commits",
                run.writes_per_s(),
                run.latency_line(),
                run.epochs,
            ));
            run.rec("cap_stall", mode, round, vault_delay_ms, "files_per_s")
                .emit();
        }
    }
    Ok(())
}

/// Where the cleaner-stall writer puts its 1 MiB writes.
#[derive(Clone, Copy)]
enum Pattern {
    /// In order, round and round: whole segments die (the cleaner deletes them).
    Sequential,
    /// At random aligned offsets: segments die partly (the cleaner copies
    /// what is left in them).
    Random,
}

/// One writer: `total` bytes in 1 MiB writes over a `span`-byte object, on
/// the default epoch policy and the given cleaner policy. Every overwrite
/// leaves dead bytes, so the cleaner runs every few commits when it is on.
fn stream_once(
    dir: &Path,
    span: u64,
    total: u64,
    pattern: Pattern,
    vault_delay: Duration,
    cleaner: CleanerPolicy,
    background_commits: bool,
) -> BoxResult<(Run, u64)> {
    let store = slow_vault_store(
        dir,
        vault_delay,
        Options {
            cleaner,
            background_commits,
            ..Default::default()
        },
    )?;
    let oid = store.create_object(b"")?;
    let mut block = vec![0u8; 1 << 20];
    let mut rng = SplitMix64::new(7);
    for chunk in block.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let blocks = (span >> 20).max(1);
    let mut latencies = Vec::new();
    let start = Instant::now();
    for i in 0..(total >> 20) {
        let at = match pattern {
            Pattern::Sequential => (i % blocks) << 20,
            // The first round fills the object, so reads of it find data.
            Pattern::Random if i < blocks => i << 20,
            Pattern::Random => rng.below(blocks) << 20,
        };
        block[..8].copy_from_slice(&i.to_le_bytes());
        let t = Instant::now();
        store.write(oid, at, &block)?;
        latencies.push(t.elapsed().as_secs_f64());
    }
    store.flush()?;
    let secs = start.elapsed().as_secs_f64();
    // What a mount's or server's timer does within a few seconds: finish
    // the cleaner's run (a tick copies up to 64 MiB, a run 128 MiB) and
    // commit what it emptied.
    for _ in 0..4 {
        store.tick();
    }
    store.commit()?;
    let medium_bytes = store.status()?.medium_bytes;
    drop(store);
    Ok((Run::new(latencies, secs, Vec::new(), 0), medium_bytes))
}

/// The automatic cleaner's pause: a streaming writer with the default
/// cleaner policy beside the same writer with the cleaner off, and with
/// the policy's commits on the committer thread (`background_commits`, as
/// a mount or a server runs), `rounds` times alternately; reports
/// p50/p99/max write latency, throughput and the medium's size at the end
/// (what the cleaner kept from growing).
pub fn cleaner_stall(
    work: &Path,
    span: u64,
    total: u64,
    vault_delay_ms: u64,
    rounds: usize,
) -> BoxResult<()> {
    let delay = Duration::from_millis(vault_delay_ms);
    say(format!(
        "cleaner stall: one thread writes {} MiB in 1 MiB writes over a {} MiB object, in order \
         (seq) or at random aligned offsets after a first fill (rand), on the default epoch \
         policy (a commit per GiB); the vault's rotation takes {vault_delay_ms} ms; default \
         cleaner against the cleaner off, the policy's commits in the writer's path, then \
         (cleaner-default-background) on the committer thread; {rounds} round(s), alternating",
        total >> 20,
        span >> 20
    ));
    for round in 1..=rounds {
        for (pattern, name) in [(Pattern::Sequential, "seq"), (Pattern::Random, "rand")] {
            for (mode, policy, background) in [
                ("cleaner-off", CleanerPolicy::off(), false),
                ("cleaner-default", CleanerPolicy::default(), false),
                ("cleaner-default-background", CleanerPolicy::default(), true),
            ] {
                let dir = work.join(format!("cleaner-{name}-{mode}-{round}"));
                let (run, medium_bytes) =
                    stream_once(&dir, span, total, pattern, delay, policy, background)?;
                std::fs::remove_dir_all(&dir)?;
                report_stream(name, mode, round, vault_delay_ms, &run, medium_bytes);
            }
        }
    }
    Ok(())
}

/// Prints and records one cleaner-stall run.
fn report_stream(
    pattern: &str,
    mode: &str,
    round: usize,
    vault_delay_ms: u64,
    run: &Run,
    medium_bytes: u64,
) {
    let ms = |s: f64| s * 1000.0;
    let rate = mb_per_s(run.latencies.len() as u64 * MIB, run.secs);
    say(format!(
        "cleaner stall {pattern} {mode} round {round}: {rate:.1} MB/s, latency p50 {:.2} ms, \
         p99 {:.2} ms, p99.9 {:.1} ms, max {:.1} ms; medium {} MiB at the end",
        ms(run.pct(0.5)),
        ms(run.pct(0.99)),
        ms(run.pct(0.999)),
        ms(run.pct(1.0)),
        medium_bytes >> 20
    ));
    Rec::new("cleaner_stall")
        .str("pattern", pattern)
        .str("mode", mode)
        .int("round", round as u64)
        .int("vault_delay_ms", vault_delay_ms)
        .num("mb_per_s", rate)
        .num("p50_ms", ms(run.pct(0.5)))
        .num("p99_ms", ms(run.pct(0.99)))
        .num("p999_ms", ms(run.pct(0.999)))
        .num("max_ms", ms(run.pct(1.0)))
        .int("medium_bytes", medium_bytes)
        .emit();
}
