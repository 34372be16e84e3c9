//! Scale: commit time and open time (open + first readdir) of stores holding 10⁴, 10⁵ and 10⁶ small files, and the process's peak memory.

use crate::report::{median, say, Rec};
use crate::store::{BoxResult, Handle};
use oubli_core::ROOT_DIR;
use std::path::Path;
use std::time::Instant;

/// Files per directory: a tree as a file system would have, not one flat
/// directory of a million names.
const PER_DIR: u64 = 1000;

/// Peak resident set of this process so far (VmHWM), in bytes.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Fills a fresh store with `files` files of 100 bytes in directories of
/// [`PER_DIR`], committing every 100,000 files (as the epoch policy would).
fn fill(h: &Handle, files: u64) -> BoxResult<()> {
    let body = [7u8; 100];
    let mut dir = ROOT_DIR;
    for f in 0..files {
        if f % PER_DIR == 0 {
            dir = h.store.create_object(b"dir")?;
            h.store
                .link(ROOT_DIR, format!("d{}", f / PER_DIR).as_bytes(), dir)?;
        }
        let oid = h.store.create_object(b"file")?;
        h.store.write(oid, 0, &body)?;
        h.store.link(dir, format!("f{f}").as_bytes(), oid)?;
        if f % 100_000 == 99_999 {
            h.store.commit()?;
        }
    }
    h.store.commit()?;
    Ok(())
}

pub fn scale(work: &Path, counts: &[u64], runs: usize, keep: bool) -> BoxResult<()> {
    say(format!(
        "scale: stores of {counts:?} files (100 B each, {PER_DIR} per directory); \
         per store: a timed commit after one 4 KiB overwrite (median of {runs}), then \
         a timed open (Store::open) and first readdir (root, then its first directory)"
    ));
    for &files in counts {
        let dir = work.join(format!("scale-{files}"));
        let h = Handle::create(&dir)?;
        let t = Instant::now();
        fill(&h, files)?;
        let fill_s = t.elapsed().as_secs_f64();
        let target = h.store.lookup(ROOT_DIR, b"d0")?.ok_or("d0 missing")?;
        let file = h.store.lookup(target, b"f0")?.ok_or("f0 missing")?;
        let mut commits = Vec::new();
        for run in 0..runs {
            h.store.write(file, 0, &[run as u8; 4096])?;
            h.store.flush()?;
            let t = Instant::now();
            h.store.commit()?;
            commits.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let (vault, path) = h.close();
        let t = Instant::now();
        let h = Handle::open(&path, vault)?;
        let open_ms = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let top = h.store.list(ROOT_DIR)?;
        let first = h
            .store
            .list(top.iter().find(|(n, _)| n == b"d0").ok_or("d0")?.1)?;
        let readdir_ms = t.elapsed().as_secs_f64() * 1000.0;
        // What a cleaner run's start costs under the engine lock: the trace
        // of every root (here through `gc` with nothing to move, so the
        // figure also holds the commit that ends it).
        let t = Instant::now();
        h.store.gc(0.0)?;
        let trace_ms = t.elapsed().as_secs_f64() * 1000.0;
        let commit_ms = median(&commits);
        say(format!(
            "scale {files} files: filled in {fill_s:.1} s; commit {commit_ms:.1} ms (median of {runs}); \
             open {open_ms:.1} ms, first readdir {readdir_ms:.1} ms ({} + {} names); \
             cleaner trace (gc with nothing to move) {trace_ms:.0} ms; peak RSS {} MiB",
            top.len(),
            first.len(),
            peak_rss() >> 20
        ));
        Rec::new("scale")
            .int("files", files)
            .num("fill_s", fill_s)
            .num("commit_ms", commit_ms)
            .nums("commit_ms_runs", &commits)
            .num("open_ms", open_ms)
            .num("first_readdir_ms", readdir_ms)
            .num("cleaner_trace_ms", trace_ms)
            .int("peak_rss_bytes", peak_rss())
            .emit();
        let (_, path) = h.close();
        if !keep {
            std::fs::remove_dir_all(&path)?;
        }
    }
    Ok(())
}
