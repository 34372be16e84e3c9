//! The measurements: each runs every scheme on the same workload, in rounds whose scheme order rotates so that background load falls on all schemes alike.

use crate::store::{KeyMetadata, SchemeStore, SCHEMES};
use crate::workloads::{self, Measured, BLOCK, YCSB};
use oubli_bench_engine::report::{median, say, Rec, MIB};
use oubli_bench_engine::store::{BoxResult, Payload};
use oubli_core::EpochPolicy;
use oubli_media::SplitMix64;
use std::path::Path;
use std::time::{Duration, Instant};

/// The schemes in round `round`'s order: the reference first in round 0, then each in turn.
fn rotated(round: usize) -> Vec<(&'static str, u8)> {
    let mut order = SCHEMES.to_vec();
    order.rotate_left(round % SCHEMES.len());
    order
}

fn ms(secs: f64) -> f64 {
    secs * 1e3
}

/// The sample's value at quantile `q` (nearest rank), of a non-empty sample.
fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// Sizes of the throughput workloads.
pub struct ThroughputSizes {
    pub seq_bytes: u64,
    pub rand_span: u64,
    pub rand_writes: u64,
    pub files: u64,
    pub file_size: u64,
    pub records: u64,
    pub ycsb_ops: u64,
}

fn emit_throughput(
    s: &SchemeStore,
    workload: &str,
    round: usize,
    m: &Measured,
    meta: Option<KeyMetadata>,
) {
    say(format!(
        "throughput {workload} [{}] round {round}: {} ops in {:.3} s = {:.0} ops/s, {:.1} MB/s",
        s.scheme,
        m.ops,
        m.secs,
        m.ops as f64 / m.secs,
        m.bytes as f64 / 1e6 / m.secs
    ));
    let mut rec = Rec::new("throughput")
        .str("scheme", s.scheme)
        .str("workload", workload)
        .int("round", round as u64)
        .int("ops", m.ops)
        .int("bytes", m.bytes)
        .num("secs", m.secs)
        .num("ops_s", m.ops as f64 / m.secs)
        .num("mb_s", m.bytes as f64 / 1e6 / m.secs);
    if let Some(meta) = meta {
        rec = meta.record(rec);
    }
    rec.emit();
}

/// Every throughput workload on a fresh store per scheme; each figure
/// includes the final flush and commit. The key metadata is taken after it.
pub fn throughput(work: &Path, z: &ThroughputSizes, rounds: usize, seed: u64) -> BoxResult<()> {
    say(format!(
        "throughput: seq {} MiB in 1 MiB writes; {} Zipfian 4 KiB overwrites of a {} MiB object; \
         {} files of {} B created then deleted; YCSB A/B/F: {} ops over {} records of 1 KiB in one object; \
         each + flush + commit; {rounds} rounds, scheme order rotating",
        z.seq_bytes / MIB,
        z.rand_writes,
        z.rand_span / MIB,
        z.files,
        z.file_size,
        z.ycsb_ops,
        z.records
    ));
    let dir = work.join("throughput");
    for round in 0..rounds {
        for scheme in rotated(round) {
            let s = SchemeStore::create(&dir, scheme, EpochPolicy::manual())?;
            let m = workloads::sequential(&s.store, z.seq_bytes)?;
            emit_throughput(&s, "seq-1m", round, &m, Some(s.key_metadata()?));
            s.remove();
        }
        for scheme in rotated(round + 1) {
            let s = SchemeStore::create(&dir, scheme, EpochPolicy::manual())?;
            let m = workloads::random_overwrites(&s.store, z.rand_span, z.rand_writes, seed)?;
            emit_throughput(&s, "zipf-4k", round, &m, Some(s.key_metadata()?));
            s.remove();
        }
        for scheme in rotated(round + 2) {
            let s = SchemeStore::create(&dir, scheme, EpochPolicy::manual())?;
            let m = workloads::create_files(&s.store, z.files, z.file_size)?;
            emit_throughput(&s, "files-create", round, &m, Some(s.key_metadata()?));
            let m = workloads::delete_files(&s.store, z.files, z.file_size)?;
            emit_throughput(&s, "files-delete", round, &m, None);
            s.remove();
        }
        for (k, mix) in YCSB.iter().enumerate() {
            for scheme in rotated(round + k) {
                let s = SchemeStore::create(&dir, scheme, EpochPolicy::manual())?;
                let m = workloads::ycsb(&s.store, z.records, z.ycsb_ops, *mix, seed + k as u64)?;
                emit_throughput(&s, mix.name, round, &m, Some(s.key_metadata()?));
                s.remove();
            }
        }
    }
    Ok(())
}

/// Objects of a commit-vs-size store are at most this large (a store is many objects).
const OBJECT_BYTES: u64 = 256 * MIB;

/// A store of `bytes` in objects of at most 256 MiB, filled in 1 MiB writes and committed; returns the objects and their sizes.
fn filled(s: &SchemeStore, bytes: u64) -> BoxResult<Vec<(u64, u64)>> {
    let mut payload = Payload::new(MIB as usize, 4);
    let mut objects = Vec::new();
    let mut left = bytes;
    while left > 0 {
        let len = left.min(OBJECT_BYTES);
        let oid = s.store.create_object(b"")?;
        for i in 0..len / MIB {
            s.store.write(oid, i * MIB, payload.chunk(i))?;
        }
        objects.push((oid, len));
        left -= len;
    }
    s.store.flush()?;
    s.store.commit()?;
    Ok(objects)
}

/// One 4 KiB overwrite at a random block of a random object, flush, then a timed commit (seconds).
fn change_and_commit(
    s: &SchemeStore,
    objects: &[(u64, u64)],
    rng: &mut SplitMix64,
    block: &mut Payload,
) -> BoxResult<f64> {
    let (oid, len) = objects[rng.below(objects.len() as u64) as usize];
    let at = rng.below(len / BLOCK) * BLOCK;
    s.store.write(oid, at, block.chunk(rng.next_u64()))?;
    s.store.flush()?;
    let start = Instant::now();
    s.store.commit()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Commit time with one changed block against store size: for each size,
/// one store per scheme filled and kept open, one warm-up commit each,
/// then `runs` timed commits per store, alternating between the schemes.
pub fn commit_vs_size(work: &Path, sizes: &[u64], runs: usize, seed: u64) -> BoxResult<()> {
    let mut rng = SplitMix64::new(seed);
    let mut block = Payload::new(BLOCK as usize, 6);
    for &bytes in sizes {
        let mut open = Vec::new();
        for scheme in SCHEMES {
            let s = SchemeStore::create_manual(work, "size", scheme)?;
            let fill = Instant::now();
            let objects = filled(&s, bytes)?;
            let fill_s = fill.elapsed().as_secs_f64();
            let warm_up = change_and_commit(&s, &objects, &mut rng, &mut block)?;
            say(format!(
                "commit vs size [{}]: {} MiB filled and committed in {fill_s:.1} s; warm-up commit {:.2} ms",
                s.scheme,
                bytes / MIB,
                ms(warm_up)
            ));
            open.push((s, objects, Vec::new()));
        }
        for run in 0..runs {
            for k in 0..open.len() {
                let (s, objects, times) = &mut open[(k + run) % SCHEMES.len()];
                times.push(ms(change_and_commit(s, objects, &mut rng, &mut block)?));
            }
        }
        for (s, _, times) in open {
            let meta = s.key_metadata()?;
            say(format!(
                "commit vs size [{}]: {} MiB store, 1 changed block: commit median {:.2} ms (min {:.2}, max {:.2}) \
                 over {runs} runs; scheme state {} B",
                s.scheme,
                bytes / MIB,
                median(&times),
                quantile(&times, 0.0),
                quantile(&times, 1.0),
                meta.state_bytes
            ));
            meta.record(
                Rec::new("commit_size")
                    .str("scheme", s.scheme)
                    .int("store_bytes", bytes)
                    .num("commit_ms", median(&times))
                    .num("commit_ms_min", quantile(&times, 0.0))
                    .num("commit_ms_max", quantile(&times, 1.0))
                    .nums("commit_ms_all", &times),
            )
            .emit();
            s.remove();
        }
    }
    Ok(())
}

/// Deletion latency: in a store per scheme holding `base` bytes, a file of
/// `file_size` is created and committed, then removed and committed; the
/// time from the removal until the commit returns (the bytes
/// unrecoverable) is the latency. The schemes take turns, file by file.
pub fn deletion_latency(work: &Path, base: u64, deletions: u64, file_size: u64) -> BoxResult<()> {
    let mut open = Vec::new();
    for scheme in SCHEMES {
        let s = SchemeStore::create_manual(work, "delete", scheme)?;
        workloads::preallocated(&s.store, base, 7)?;
        open.push((s, Vec::new()));
    }
    let mut payload = Payload::new(file_size as usize, 8);
    for i in 0..deletions {
        for k in 0..open.len() {
            let (s, latencies) = &mut open[(k + i as usize) % SCHEMES.len()];
            workloads::create_file(&s.store, i, &mut payload)?;
            s.store.flush()?;
            s.store.commit()?;
            let start = Instant::now();
            workloads::delete_file(&s.store, i)?;
            s.store.commit()?;
            latencies.push(ms(start.elapsed().as_secs_f64()));
        }
    }
    for (s, latencies) in open {
        say(format!(
            "deletion latency [{}]: {deletions} files of {file_size} B in a {} MiB store, rm + commit: \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            s.scheme,
            base / MIB,
            quantile(&latencies, 0.5),
            quantile(&latencies, 0.99),
            quantile(&latencies, 1.0)
        ));
        Rec::new("deletion")
            .str("scheme", s.scheme)
            .int("store_bytes", base)
            .int("file_bytes", file_size)
            .int("deletions", deletions)
            .num("p50_ms", quantile(&latencies, 0.5))
            .num("p99_ms", quantile(&latencies, 0.99))
            .num("max_ms", quantile(&latencies, 1.0))
            .emit();
        s.remove();
    }
    Ok(())
}

/// Throughput of Zipfian 4 KiB overwrites for `seconds` with a commit every
/// `epoch_secs` (the store's interval policy) against no commits at all,
/// on a fresh store each run; per round every scheme runs both modes, the
/// schemes' order rotating and the modes' order alternating.
pub fn epoch_cost(
    work: &Path,
    span: u64,
    seconds: f64,
    epoch_secs: u64,
    rounds: usize,
    seed: u64,
) -> BoxResult<()> {
    let epochs = EpochPolicy {
        interval: Some(Duration::from_secs(epoch_secs)),
        bytes: None,
        deletions: None,
    };
    let mut modes = [("no-epochs", EpochPolicy::manual()), ("epochs", epochs)];
    let dir = work.join("epochs");
    for round in 0..rounds {
        for scheme in rotated(round) {
            for (mode, policy) in modes.iter() {
                let s = SchemeStore::create(&dir, scheme, policy.clone())?;
                let (m, commits) = workloads::overwrites_for(&s.store, span, seconds, seed)?;
                say(format!(
                    "epochs [{}] {mode} round {round}: {:.0} writes/s over {:.1} s, {commits} commits",
                    s.scheme,
                    m.ops as f64 / m.secs,
                    m.secs
                ));
                Rec::new("epoch")
                    .str("scheme", s.scheme)
                    .str("mode", mode)
                    .int("round", round as u64)
                    .int("epoch_secs", epoch_secs)
                    .int("writes", m.ops)
                    .num("secs", m.secs)
                    .num("ops_s", m.ops as f64 / m.secs)
                    .int("commits", commits)
                    .emit();
                s.remove();
            }
            modes.reverse();
        }
    }
    Ok(())
}

/// Sizes of the forest-over-time measurement.
pub struct ForestSizes {
    pub live_files: u64,
    pub churn: u64,
    pub steps: u64,
    pub consolidate_every: u64,
}

/// The forest's roots (and the key storage area's keys) over time under a
/// deleting workload: `live_files` files of 4 KiB, then `steps` steps that
/// each delete `churn` files chosen at random and create as many, and
/// commit. The same steps run on a forest never consolidated, a forest
/// consolidated every `consolidate_every` steps, and a key storage area.
pub fn forest_over_time(work: &Path, z: &ForestSizes, seed: u64) -> BoxResult<()> {
    let khf = SCHEMES[1];
    let ksa = SCHEMES[2];
    let mut stores = Vec::new();
    for (label, scheme, consolidates) in [
        ("forest", khf, false),
        ("forest-consolidated", khf, true),
        ("key-storage-area", ksa, false),
    ] {
        let s = SchemeStore::create_manual(work, label, scheme)?;
        stores.push((label, s, consolidates));
    }
    let mut payload = Payload::new(BLOCK as usize, 9);
    let mut live: Vec<u64> = (0..z.live_files).collect();
    let mut next = z.live_files;
    let mut rng = SplitMix64::new(seed);
    for (label, s, _) in &stores {
        let start = Instant::now();
        for &i in &live {
            workloads::create_file(&s.store, i, &mut payload)?;
        }
        s.store.flush()?;
        s.store.commit()?;
        emit_forest(label, s, 0, ms(start.elapsed().as_secs_f64()), None)?;
    }
    for step in 1..=z.steps {
        let mut victims = Vec::new();
        for _ in 0..z.churn.min(live.len() as u64) {
            victims.push(live.swap_remove(rng.below(live.len() as u64) as usize));
        }
        let born: Vec<u64> = (next..next + z.churn).collect();
        next += z.churn;
        live.extend(&born);
        for (label, s, consolidates) in &stores {
            for &i in &victims {
                workloads::delete_file(&s.store, i)?;
            }
            for &i in &born {
                workloads::create_file(&s.store, i, &mut payload)?;
            }
            s.store.flush()?;
            let start = Instant::now();
            s.store.commit()?;
            let commit_ms = ms(start.elapsed().as_secs_f64());
            let consolidate_ms = if *consolidates && step % z.consolidate_every == 0 {
                let start = Instant::now();
                s.store.consolidate_keys()?;
                Some(ms(start.elapsed().as_secs_f64()))
            } else {
                None
            };
            emit_forest(label, s, step, commit_ms, consolidate_ms)?;
        }
    }
    for (_, s, _) in stores {
        s.remove();
    }
    Ok(())
}

fn emit_forest(
    label: &str,
    s: &SchemeStore,
    step: u64,
    commit_ms: f64,
    consolidate_ms: Option<f64>,
) -> BoxResult<()> {
    let meta = s.key_metadata()?;
    say(format!(
        "forest over time [{label}] step {step}: roots {}, keys {}, state {} B, commit {commit_ms:.2} ms{}",
        meta.roots.map_or("-".into(), |r| r.to_string()),
        meta.keys.map_or("-".into(), |k| k.to_string()),
        meta.state_bytes,
        consolidate_ms.map_or(String::new(), |c| format!(", consolidation {c:.1} ms"))
    ));
    let mut rec = meta
        .record(Rec::new("forest"))
        .str("store", label)
        .str("scheme", s.scheme)
        .int("step", step)
        .num("commit_ms", commit_ms);
    if let Some(c) = consolidate_ms {
        rec = rec.num("consolidate_ms", c);
    }
    rec.emit();
    Ok(())
}
