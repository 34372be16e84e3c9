//! The oubli workloads: stores on a timed `DirMedium` with a `MemoryVault`, and what each benchmark does to them.

use crate::report::{io_summary, mb_per_s, median, say, Cpu, Rec, MIB};
use crate::timed::{IoSnapshot, Kind, Timed};
use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store, Vault};
use oubli_media::{DirMedium, SplitMix64};
use oubli_vault::MemoryVault;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// An open store with the handles the benchmark needs next to it.
/// Field order matters: the store is dropped (and flushed) before the medium.
pub struct Handle {
    pub store: Store,
    pub medium: Arc<Timed<DirMedium>>,
    pub vault: Arc<MemoryVault>,
    pub dir: PathBuf,
}

fn options() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        ..Default::default()
    }
}

impl Handle {
    /// A new store in `dir` (which must not hold one).
    pub fn create(dir: &Path) -> BoxResult<Handle> {
        let medium = Arc::new(Timed::new(DirMedium::create(dir)?));
        let mut kept = None;
        let store = Store::create(
            medium.clone() as Arc<dyn Medium>,
            |record| {
                let v = Arc::new(MemoryVault::new(record.clone()));
                kept = Some(v.clone());
                Ok(v)
            },
            CreateOptions::default(),
            options(),
        )?;
        Ok(Handle {
            store,
            medium,
            vault: kept.expect("Store::create calls make_vault"),
            dir: dir.to_path_buf(),
        })
    }

    /// Drops this handle (flushing, releasing the directory lock) and opens the store again.
    pub fn reopen(self) -> BoxResult<Handle> {
        let (vault, dir) = self.close();
        Handle::open(&dir, vault)
    }

    /// Drops the store (flushing it) and the medium (releasing the directory
    /// lock); returns what is needed to open the store again.
    pub fn close(self) -> (Arc<MemoryVault>, PathBuf) {
        let Handle {
            store,
            medium,
            vault,
            dir,
        } = self;
        drop(store);
        drop(medium);
        (vault, dir)
    }

    pub fn open(dir: &Path, vault: Arc<MemoryVault>) -> BoxResult<Handle> {
        let medium = Arc::new(Timed::new(DirMedium::open(dir)?));
        let store = Store::open(
            medium.clone() as Arc<dyn Medium>,
            vault.clone() as Arc<dyn Vault>,
            options(),
        )?;
        Ok(Handle {
            store,
            medium,
            vault,
            dir: dir.to_path_buf(),
        })
    }

    pub fn io(&self) -> IoSnapshot {
        self.medium.snapshot()
    }

    pub fn cell_size(&self) -> BoxResult<u64> {
        Ok(self.store.status()?.cell_size as u64)
    }
}

/// Pseudo-random payload; every chunk carries its index in its first 8 bytes
/// so that reads can be checked and no two chunks are equal.
pub struct Payload {
    buf: Vec<u8>,
}

impl Payload {
    pub fn new(len: usize, seed: u64) -> Payload {
        let mut rng = SplitMix64::new(seed);
        let mut buf = vec![0u8; len];
        for c in buf.chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        Payload { buf }
    }

    pub fn chunk(&mut self, index: u64) -> &[u8] {
        self.buf[..8].copy_from_slice(&index.to_le_bytes());
        &self.buf
    }
}

/// Writes `bytes` (a multiple of 1 MiB) to `oid` in 1 MiB writes from offset 0; returns seconds.
pub fn fill(h: &Handle, oid: u64, bytes: u64, payload: &mut Payload) -> BoxResult<f64> {
    let start = Instant::now();
    for i in 0..bytes / MIB {
        h.store.write(oid, i * MIB, payload.chunk(i))?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Prints and emits `store.overhead()` after a workload. `logical` is what
/// the application wrote (distinct bytes), against which a second
/// percentage is given: the engine's own figure counts the zero gaps that
/// partial writes leave inside a cell as data.
pub fn report_overhead(h: &Handle, pattern: &str, logical: u64) -> BoxResult<()> {
    let o = h.store.overhead()?;
    let st = h.store.status()?;
    let meta = o.node_bytes + o.tag_bytes;
    let of_logical = 100.0 * meta as f64 / logical as f64;
    say(format!(
        "overhead {pattern}: {} nodes = {} B, {} cells, tags {} B, data {} B -> {:.4} % \
         (of {} B the application wrote: {:.4} %); medium holds {} B",
        o.nodes,
        o.node_bytes,
        o.cells,
        o.tag_bytes,
        o.data_bytes,
        o.percent(),
        logical,
        of_logical,
        st.medium_bytes
    ));
    Rec::new("overhead")
        .str("pattern", pattern)
        .int("nodes", o.nodes)
        .int("node_bytes", o.node_bytes)
        .int("cells", o.cells)
        .int("tag_bytes", o.tag_bytes)
        .int("data_bytes", o.data_bytes)
        .num("percent", o.percent())
        .int("logical_bytes", logical)
        .num("percent_of_logical", of_logical)
        .int("medium_bytes", st.medium_bytes)
        .int("live_bytes", st.live_bytes)
        .emit();
    Ok(())
}

/// Sequential write of `bytes` in 1 MiB writes + flush (+ commit), the
/// sequential-pattern overhead, then warm and cold sequential reads.
pub fn sequential(dir: &Path, bytes: u64, keep: bool) -> BoxResult<()> {
    let h = Handle::create(dir)?;
    let oid = h.store.create_object(b"")?;
    h.store.commit()?;
    let mut payload = Payload::new(MIB as usize, 1);

    let io0 = h.io();
    let cpu0 = Cpu::now();
    let start = Instant::now();
    for i in 0..bytes / MIB {
        h.store.write(oid, i * MIB, payload.chunk(i))?;
    }
    let write_s = start.elapsed().as_secs_f64();
    h.store.flush()?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = Cpu::now().since(&cpu0);
    let io1 = h.io();
    h.store.commit()?;
    let total = start.elapsed().as_secs_f64();
    let io2 = h.io();
    let io = io1.since(&io0);
    let commit_io = io2.since(&io1);
    say(format!(
        "seq write {} MiB in 1 MiB writes + flush: {secs:.3} s = {:.1} MB/s \
         (writes alone {write_s:.3} s = {:.1} MB/s; flush {:.3} s; medium: {}; time outside the medium {:.3} s; \
         process CPU: user {:.3} s, system {:.3} s)",
        bytes / MIB,
        mb_per_s(bytes, secs),
        mb_per_s(bytes, write_s),
        secs - write_s,
        io_summary(&io),
        secs - io.total_secs(),
        cpu.user,
        cpu.sys
    ));
    say(format!(
        "seq write + final commit: {total:.3} s = {:.1} MB/s (commit {:.1} ms: {})",
        mb_per_s(bytes, total),
        (total - secs) * 1e3,
        io_summary(&commit_io)
    ));
    Rec::new("seq_write")
        .int("bytes", bytes)
        .int("write_size", MIB)
        .num("secs", secs)
        .num("mb_s", mb_per_s(bytes, secs))
        .num("write_s", write_s)
        .num("mb_s_before_flush", mb_per_s(bytes, write_s))
        .num("flush_s", secs - write_s)
        .num("commit_s", total - secs)
        .num("secs_with_commit", total)
        .num("mb_s_with_commit", mb_per_s(bytes, total))
        .num("outside_medium_s", secs - io.total_secs())
        .cpu(&cpu)
        .io(&io)
        .emit();
    report_overhead(&h, "seq_1mib", bytes)?;

    // Warm: the page cache still holds the segments, the node cache is empty.
    let h = h.reopen()?;
    read_back(&h, oid, bytes, "warm")?;
    // Cold: the segment files are evicted from the page cache too.
    let (vault, dir) = h.close();
    let evicted = crate::plain::evict_tree(&dir);
    let h = Handle::open(&dir, vault)?;
    if let Err(e) = evicted {
        say(format!(
            "could not evict the store from the page cache: {e}"
        ));
    } else {
        read_back(&h, oid, bytes, "cold")?;
    }
    drop(h);
    if !keep {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

fn read_back(h: &Handle, oid: u64, bytes: u64, cache: &str) -> BoxResult<()> {
    let io0 = h.io();
    let cpu0 = Cpu::now();
    let start = Instant::now();
    for i in 0..bytes / MIB {
        let data = h.store.read(oid, i * MIB, MIB as usize)?;
        if data.len() != MIB as usize || data[..8] != i.to_le_bytes() {
            return Err(format!("read back wrong data at MiB {i}").into());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = Cpu::now().since(&cpu0);
    let io = h.io().since(&io0);
    say(format!(
        "seq read ({cache} page cache, cold node cache) {} MiB in 1 MiB reads: {secs:.3} s = {:.1} MB/s \
         (medium: {}; time outside the medium {:.3} s; process CPU: user {:.3} s, system {:.3} s)",
        bytes / MIB,
        mb_per_s(bytes, secs),
        io_summary(&io),
        secs - io.total_secs(),
        cpu.user,
        cpu.sys
    ));
    Rec::new("seq_read")
        .str("page_cache", cache)
        .int("bytes", bytes)
        .num("secs", secs)
        .num("mb_s", mb_per_s(bytes, secs))
        .num("outside_medium_s", secs - io.total_secs())
        .cpu(&cpu)
        .io(&io)
        .emit();
    Ok(())
}

/// Random 4 KiB writes at `offsets` into a sparse object of `span` bytes, flush;
/// then commit and the random-pattern overhead.
pub fn random(dir: &Path, span: u64, offsets: &[u64], block: &[u8], keep: bool) -> BoxResult<()> {
    let h = Handle::create(dir)?;
    let oid = h.store.create_object(b"")?;
    h.store.truncate(oid, span)?;
    h.store.commit()?;
    let bytes = offsets.len() as u64 * block.len() as u64;
    let mut payload = block.to_vec();

    let io0 = h.io();
    let cpu0 = Cpu::now();
    let start = Instant::now();
    for (i, &off) in offsets.iter().enumerate() {
        payload[..8].copy_from_slice(&(i as u64).to_le_bytes());
        h.store.write(oid, off, &payload)?;
    }
    let write_s = start.elapsed().as_secs_f64();
    h.store.flush()?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = Cpu::now().since(&cpu0);
    let io = h.io().since(&io0);
    let c0 = Instant::now();
    h.store.commit()?;
    let commit_s = c0.elapsed().as_secs_f64();
    let appended = io.get(Kind::Append).bytes;
    let iops = offsets.len() as f64 / secs;
    say(format!(
        "random {} B writes: {} writes ({} MiB) over {} MiB + flush: {secs:.3} s = {iops:.0} IOPS = {:.1} MB/s \
         (writes alone {write_s:.3} s; flush {:.3} s; medium: {}; time outside the medium {:.3} s; \
         {appended} B appended = {:.2}x write amplification; commit after it {:.1} ms)",
        block.len(),
        offsets.len(),
        bytes / MIB,
        span / MIB,
        mb_per_s(bytes, secs),
        secs - write_s,
        io_summary(&io),
        secs - io.total_secs(),
        appended as f64 / bytes as f64,
        commit_s * 1e3
    ));
    Rec::new("rand_write")
        .int("writes", offsets.len() as u64)
        .int("write_size", block.len() as u64)
        .int("bytes", bytes)
        .int("span", span)
        .num("secs", secs)
        .num("iops", iops)
        .num("mb_s", mb_per_s(bytes, secs))
        .num("write_s", write_s)
        .num("flush_s", secs - write_s)
        .num("commit_s", commit_s)
        .num("outside_medium_s", secs - io.total_secs())
        .num("write_amplification", appended as f64 / bytes as f64)
        .cpu(&cpu)
        .io(&io)
        .emit();
    let distinct: HashSet<u64> = offsets.iter().copied().collect();
    report_overhead(&h, "rand_4k", distinct.len() as u64 * block.len() as u64)?;
    drop(h);
    if !keep {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// One timed commit after `cells` 4 KiB overwrites (one per cell) and a flush.
struct CommitRun {
    write_s: f64,
    flush_s: f64,
    commit_s: f64,
    io: IoSnapshot,
}

fn change_and_commit(
    h: &Handle,
    oid: u64,
    cells: &[u64],
    cell_size: u64,
    rng: &mut SplitMix64,
    block: &mut [u8],
) -> BoxResult<CommitRun> {
    let blocks_per_cell = (cell_size / block.len() as u64).max(1);
    let start = Instant::now();
    for &cell in cells {
        block[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
        let off = cell * cell_size + rng.below(blocks_per_cell) * block.len() as u64;
        h.store.write(oid, off, block)?;
    }
    let write_s = start.elapsed().as_secs_f64();
    let f0 = Instant::now();
    h.store.flush()?;
    let flush_s = f0.elapsed().as_secs_f64();
    let io0 = h.io();
    let c0 = Instant::now();
    h.store.commit()?;
    let commit_s = c0.elapsed().as_secs_f64();
    Ok(CommitRun {
        write_s,
        flush_s,
        commit_s,
        io: h.io().since(&io0),
    })
}

/// `k` distinct values below `n` (partial Fisher-Yates over `pool`, which holds 0..n).
fn pick(pool: &mut [u64], k: usize, rng: &mut SplitMix64) -> Vec<u64> {
    let n = pool.len();
    for i in 0..k.min(n) {
        let j = i + rng.below((n - i) as u64) as usize;
        pool.swap(i, j);
    }
    pool[..k.min(n)].to_vec()
}

fn commit_record(name: &str, runs: &[CommitRun]) -> Rec {
    let ms =
        |f: &dyn Fn(&CommitRun) -> f64| -> Vec<f64> { runs.iter().map(|r| f(r) * 1e3).collect() };
    let commit = ms(&|r| r.commit_s);
    let n = runs.len() as f64;
    let mut avg_io = IoSnapshot::default();
    for r in runs {
        for i in 0..avg_io.0.len() {
            avg_io.0[i].calls += r.io.0[i].calls;
            avg_io.0[i].secs += r.io.0[i].secs;
            avg_io.0[i].bytes += r.io.0[i].bytes;
        }
    }
    let nodes = avg_io.get(Kind::Append).calls as f64 / n;
    let node_bytes = avg_io.get(Kind::Append).bytes as f64 / n;
    let sync_ms = avg_io.get(Kind::Sync).secs / n * 1e3;
    let sb_ms = avg_io.get(Kind::Superblock).secs / n * 1e3;
    let io_ms = avg_io.total_secs() / n * 1e3;
    let cpu = ms(&|r| r.commit_s - r.io.total_secs());
    Rec::new(name)
        .int("runs", runs.len() as u64)
        .num("commit_ms", median(&commit))
        .num(
            "commit_ms_min",
            commit.iter().cloned().fold(f64::INFINITY, f64::min),
        )
        .num("commit_ms_max", commit.iter().cloned().fold(0.0, f64::max))
        .nums("commit_ms_all", &commit)
        .num("flush_ms", median(&ms(&|r| r.flush_s)))
        .num("write_ms", median(&ms(&|r| r.write_s)))
        .num("nodes_written", nodes)
        .num("node_bytes_written", node_bytes)
        .num("commit_sync_ms", sync_ms)
        .num("commit_superblock_ms", sb_ms)
        .num("commit_io_ms", io_ms)
        .num("commit_cpu_ms", median(&cpu))
}

/// Commit time against the number of changed cells, in a store of `bytes`.
pub fn commit_vs_units(
    dir: &Path,
    bytes: u64,
    ks: &[u64],
    runs: usize,
    seed: u64,
    keep: bool,
) -> BoxResult<()> {
    let h = Handle::create(dir)?;
    let oid = h.store.create_object(b"")?;
    let mut payload = Payload::new(MIB as usize, 2);
    let fill_s = fill(&h, oid, bytes, &mut payload)?;
    h.store.commit()?;
    let cs = h.cell_size()?;
    let ncells = bytes / cs;
    say(format!(
        "commit vs changed cells: store of {} MiB ({ncells} cells of {cs} B) filled in {fill_s:.2} s; \
         {runs} runs per k, each: k 4 KiB overwrites in k distinct random cells, flush, timed commit",
        bytes / MIB
    ));
    let mut rng = SplitMix64::new(seed);
    let mut pool: Vec<u64> = (0..ncells).collect();
    let mut block = Payload::new(4096, 3).buf;
    for &k in ks {
        if k > ncells {
            say(format!(
                "  k = {k}: skipped, the store has only {ncells} cells"
            ));
            continue;
        }
        let mut results = Vec::new();
        for _ in 0..runs {
            let cells = pick(&mut pool, k as usize, &mut rng);
            results.push(change_and_commit(
                &h, oid, &cells, cs, &mut rng, &mut block,
            )?);
        }
        let rec = commit_record("commit_units", &results)
            .int("k", k)
            .int("store_bytes", bytes);
        let commit: Vec<f64> = results.iter().map(|r| r.commit_s * 1e3).collect();
        let flush: Vec<f64> = results.iter().map(|r| r.flush_s * 1e3).collect();
        let nodes = results
            .iter()
            .map(|r| r.io.get(Kind::Append).calls)
            .sum::<u64>() as f64
            / results.len() as f64;
        say(format!(
            "  k = {k:>6}: commit median {:.2} ms (min {:.2}, max {:.2}); {nodes:.0} nodes written per commit; \
             flush before it {:.2} ms; the {k} overwrites took {:.1} ms",
            median(&commit),
            commit.iter().cloned().fold(f64::INFINITY, f64::min),
            commit.iter().cloned().fold(0.0, f64::max),
            median(&flush),
            median(&results.iter().map(|r| r.write_s * 1e3).collect::<Vec<_>>())
        ));
        rec.emit();
    }
    drop(h);
    if !keep {
        std::fs::remove_dir_all(dir)?;
    }
    Ok(())
}

/// One store of the commit-vs-size comparison.
pub struct SizedStore<'a> {
    pub dir: &'a Path,
    pub label: &'a str,
    pub bytes: u64,
}

/// Commit time with one changed cell, in stores of different sizes. The
/// stores are filled first and kept open; their timed commits then
/// alternate (small, big, small, big, ...) so that background load on the
/// machine or the disk falls on both alike.
pub fn commit_vs_size(stores: &[SizedStore], runs: usize, seed: u64, keep: bool) -> BoxResult<()> {
    struct Open {
        h: Handle,
        oid: u64,
        ncells: u64,
        cs: u64,
        fill_mb_s: f64,
        fill_io: IoSnapshot,
        first_commit_s: f64,
        warm_s: f64,
        results: Vec<CommitRun>,
    }
    let mut rng = SplitMix64::new(seed);
    let mut block = Payload::new(4096, 5).buf;
    let mut open = Vec::new();
    for s in stores {
        let h = Handle::create(s.dir)?;
        let oid = h.store.create_object(b"")?;
        let mut payload = Payload::new(MIB as usize, 4);
        let io0 = h.io();
        let f0 = Instant::now();
        fill(&h, oid, s.bytes, &mut payload)?;
        h.store.flush()?;
        let fill_flush_s = f0.elapsed().as_secs_f64();
        let c0 = Instant::now();
        h.store.commit()?;
        let first_commit_s = c0.elapsed().as_secs_f64();
        let fill_io = h.io().since(&io0);
        let cs = h.cell_size()?;
        let ncells = s.bytes / cs;
        // One warm-up run, not counted.
        let cell = rng.below(ncells);
        let warm = change_and_commit(&h, oid, &[cell], cs, &mut rng, &mut block)?;
        open.push(Open {
            h,
            oid,
            ncells,
            cs,
            fill_mb_s: mb_per_s(s.bytes, fill_flush_s),
            fill_io,
            first_commit_s,
            warm_s: warm.commit_s,
            results: Vec::new(),
        });
    }
    for _ in 0..runs {
        for o in open.iter_mut() {
            let cell = rng.below(o.ncells);
            let r = change_and_commit(&o.h, o.oid, &[cell], o.cs, &mut rng, &mut block)?;
            o.results.push(r);
        }
    }
    for (s, o) in stores.iter().zip(open) {
        let ov = o.h.store.overhead()?;
        let commit: Vec<f64> = o.results.iter().map(|r| r.commit_s * 1e3).collect();
        say(format!(
            "commit vs store size [{}]: {} MiB store ({} cells, {} tree nodes) filled at {:.1} MB/s \
             (medium: {}), first commit {:.1} ms; 1 changed cell: commit median {:.2} ms over {runs} runs \
             (min {:.2}, max {:.2}; warm-up {:.2} ms; runs alternate between the stores)",
            s.label,
            s.bytes / MIB,
            o.ncells,
            ov.nodes,
            o.fill_mb_s,
            io_summary(&o.fill_io),
            o.first_commit_s * 1e3,
            median(&commit),
            commit.iter().cloned().fold(f64::INFINITY, f64::min),
            commit.iter().cloned().fold(0.0, f64::max),
            o.warm_s * 1e3
        ));
        commit_record("commit_size", &o.results)
            .str("label", s.label)
            .int("store_bytes", s.bytes)
            .int("tree_nodes", ov.nodes)
            .num("fill_mb_s", o.fill_mb_s)
            .num("warmup_commit_ms", o.warm_s * 1e3)
            .emit();
        drop(o.h);
        if !keep {
            std::fs::remove_dir_all(s.dir)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_is_distinct() {
        let mut rng = SplitMix64::new(9);
        let mut pool: Vec<u64> = (0..100).collect();
        let got = pick(&mut pool, 40, &mut rng);
        assert_eq!(got.len(), 40);
        assert_eq!(got.iter().collect::<HashSet<_>>().len(), 40);
        assert!(got.iter().all(|&c| c < 100));
        assert_eq!(pick(&mut pool, 500, &mut rng).len(), 100);
    }

    #[test]
    fn small_store_round_trip_and_reopen() {
        let dir = std::env::temp_dir().join(format!("oubli-bench-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let h = Handle::create(&dir).unwrap();
        let oid = h.store.create_object(b"").unwrap();
        let mut p = Payload::new(MIB as usize, 1);
        fill(&h, oid, 2 * MIB, &mut p).unwrap();
        h.store.commit().unwrap();
        assert!(h.io().get(Kind::Append).bytes >= 2 * MIB);
        let h = h.reopen().unwrap();
        let data = h.store.read(oid, MIB, MIB as usize).unwrap();
        assert_eq!(data[..8], 1u64.to_le_bytes());
        drop(h);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
