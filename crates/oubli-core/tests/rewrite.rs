//! Overwrites in place: a cell rewritten before anything durable names its unit reuses the unit's place, reads racing the rewrite never fail, and a crash or a reopen finds what was flushed.

mod common;

use oubli_core::{CreateOptions, Medium, Store, SMALL_CELL_SIZE};
use oubli_media::{MemMedium, SplitMix64, TearMode};
use oubli_vault::MemoryVault;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const CELL: usize = SMALL_CELL_SIZE as usize;

/// A cell's content: its index and a version, repeated (any torn or stale
/// mix of two versions is told apart from a real one).
fn content(cell: u64, version: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(CELL);
    while v.len() < CELL {
        v.extend_from_slice(&cell.to_le_bytes());
        v.extend_from_slice(&version.to_le_bytes());
    }
    v
}

/// The version a cell's bytes hold, if they are one whole version of it.
fn version_of(cell: u64, bytes: &[u8]) -> Option<u64> {
    let version = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    (bytes == content(cell, version)).then_some(version)
}

fn medium_bytes(m: &MemMedium) -> u64 {
    m.list_segments()
        .unwrap()
        .iter()
        .map(|&id| m.segment_len(id).unwrap().unwrap_or(0))
        .sum()
}

/// An object of `cells` 4 KiB cells, written whole, flushed.
fn object(s: &Store, cells: u64) -> u64 {
    let oid = s.create_object(b"").unwrap();
    assert!(s.use_small_cells(oid).unwrap());
    for c in 0..cells {
        s.write(oid, c * CELL as u64, &content(c, 0)).unwrap();
    }
    s.flush().unwrap();
    oid
}

/// `oid`'s cells hold the versions in `latest`, and still do after a
/// flush, a crash and a reopen.
fn holds_after_flush_and_crash(
    s: Store,
    medium: &MemMedium,
    vault: &Arc<MemoryVault>,
    oid: u64,
    latest: &[u64],
) {
    let check = |s: &Store, when: &str| {
        for (c, &version) in latest.iter().enumerate() {
            let got = s.read(oid, c as u64 * CELL as u64, CELL).unwrap();
            assert_eq!(
                version_of(c as u64, &got),
                Some(version),
                "cell {c}, {when}"
            );
        }
    };
    check(&s, "before the crash");
    s.flush().unwrap();
    let crashed = Arc::new(medium.crash(TearMode::DropUnsynced, 1));
    drop(s);
    check(&common::reopen(crashed, vault), "after the crash");
}

#[test]
fn random_overwrites_between_flushes_take_their_units_place() {
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), common::options());
    let cells = 512; // 2 MiB: more than the write buffer keeps
    let oid = object(&s, cells);
    let before = medium_bytes(&medium);
    let mut rng = SplitMix64::new(7);
    let mut latest = vec![0u64; cells as usize];
    for round in 1..=8u64 {
        for _ in 0..cells {
            let c = rng.below(cells);
            latest[c as usize] = round;
            s.write(oid, c * CELL as u64, &content(c, round)).unwrap();
        }
    }
    let rewritten = s.status().unwrap().units_rewritten;
    let grown = medium_bytes(&medium) - before;
    // 4,096 writes of 4 KiB: appended, they would be 16 MiB more.
    assert!(
        rewritten > 1000,
        "only {rewritten} units rewritten in place"
    );
    assert!(grown < 6 << 20, "the medium grew by {grown} bytes");
    holds_after_flush_and_crash(s, &medium, &vault, oid, &latest);
}

#[test]
fn nothing_a_flush_or_commit_named_is_rewritten() {
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), common::options());
    let cells = 512;
    let oid = object(&s, cells);
    let mut rng = SplitMix64::new(11);
    let mut durable = vec![0u64; cells as usize];
    let mut latest = vec![0u64; cells as usize];
    for round in 1..=12u64 {
        for _ in 0..cells / 2 {
            let c = rng.below(cells);
            latest[c as usize] = round;
            s.write(oid, c * CELL as u64, &content(c, round)).unwrap();
        }
        // A cut now, after writes that rewrote units in place since the
        // last flush or commit, finds exactly what that one made durable:
        // whether the rewrites reached the medium or not, none of them
        // wrote over a unit it names.
        for tear in [TearMode::DropUnsynced, TearMode::KeepAll] {
            let crashed = Arc::new(medium.crash(tear, round));
            let s2 = common::reopen_read_only(crashed, &vault);
            for c in 0..cells {
                let got = s2.read(oid, c * CELL as u64, CELL).unwrap();
                assert_eq!(
                    version_of(c, &got),
                    Some(durable[c as usize]),
                    "cell {c}, round {round}, {tear:?}"
                );
            }
        }
        match round % 3 {
            0 => s.commit().unwrap(),
            1 => s.flush().unwrap(),
            _ => continue,
        }
        durable.clone_from(&latest);
    }
    assert!(s.status().unwrap().units_rewritten > 0);
}

#[test]
fn reads_racing_rewrites_see_a_whole_version_and_never_fail() {
    let (s, _medium, _vault) =
        common::store_with_parts(CreateOptions::default(), common::options());
    let s = Arc::new(s);
    let cells = 384;
    let oid = object(&s, cells);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(100 + r);
                let mut buf = Vec::new();
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // One cell, or a run of them (the path that opens units in place).
                    let c = rng.below(cells - 4);
                    let n = 1 + rng.below(4);
                    let len = s
                        .read_into(oid, c * CELL as u64, n as usize * CELL, &mut buf)
                        .unwrap_or_else(|e| panic!("read of cells {c}..{}: {e}", c + n));
                    for k in 0..n {
                        let at = (k as usize) * CELL;
                        assert!(len >= at + CELL);
                        assert!(
                            version_of(c + k, &buf[at..at + CELL]).is_some(),
                            "cell {} torn",
                            c + k
                        );
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    // Long enough for the readers to race many rewrites even on a loaded
    // machine.
    let mut rng = SplitMix64::new(3);
    let started = std::time::Instant::now();
    let mut round = 0u64;
    while started.elapsed() < std::time::Duration::from_millis(1500) {
        round += 1;
        for _ in 0..cells / 4 {
            let c = rng.below(cells);
            s.write(oid, c * CELL as u64, &content(c, round)).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 0);
    assert!(s.status().unwrap().units_rewritten > 1000);
}

#[test]
fn partial_writes_racing_rewrites_lose_nothing() {
    // Two writers, each owning one half of a few cells, write their halves:
    // a merge reads the cell's old content outside the lock, while the
    // other writer's merge rewrites the unit in place under it. Using that
    // stale content would put back the other writer's older half.
    let (s, _medium, _vault) =
        common::store_with_parts(CreateOptions::default(), common::options());
    let s = Arc::new(s);
    let cells = 4u64;
    let oid = object(&s, cells);
    // More than the write buffer keeps, left buffered: from now on each
    // cell a merge completes is sealed at once.
    let filler = s.create_object(b"").unwrap();
    assert!(s.use_small_cells(filler).unwrap());
    for c in 0..300 {
        s.write(filler, c * CELL as u64, &content(c, 0)).unwrap();
    }
    let half = CELL / 2;
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(w + 40);
                let mut last = vec![0u8; cells as usize];
                for i in 1..=20_000u32 {
                    let c = rng.below(cells);
                    let v = (i % 250) as u8 + 1;
                    last[c as usize] = v;
                    s.write(oid, c * CELL as u64 + w * half as u64, &vec![v; half])
                        .unwrap();
                    let got = s
                        .read(oid, c * CELL as u64 + w * half as u64, half)
                        .unwrap();
                    assert!(
                        got.iter().all(|&b| b == v),
                        "cell {c}: writer {w}'s half lost at once"
                    );
                }
                last
            })
        })
        .collect();
    let last: Vec<Vec<u8>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    for c in 0..cells {
        let got = s.read(oid, c * CELL as u64, CELL).unwrap();
        for (w, mine) in last.iter().enumerate() {
            let part = &got[w * half..(w + 1) * half];
            assert!(
                part.iter().all(|&b| b == mine[c as usize]),
                "cell {c}: writer {w}'s last half lost"
            );
        }
    }
    assert!(s.status().unwrap().units_rewritten > 1000);
}

#[test]
fn a_cell_rewritten_over_and_over_queues_one_change_and_replays_to_the_last() {
    let options = oubli_core::Options {
        small_writes_buffered: 0,
        ..common::options()
    };
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), options);
    let cells = 256;
    let oid = object(&s, cells);
    let mut latest = vec![0u64; cells as usize];
    let hot = 64;
    for round in 1..=50u64 {
        for c in 0..hot {
            latest[c as usize] = round;
            s.write(oid, c * CELL as u64, &content(c, round)).unwrap();
        }
        if round == 20 {
            // Other changes to some of the cells between rewrites: a punch
            // and a write after it (a fresh unit), then rewrites again.
            s.punch_hole(oid, 8 * CELL as u64, 4 * CELL as u64).unwrap();
            for c in 8..12 {
                s.write(oid, c * CELL as u64, &content(c, round)).unwrap();
            }
        }
    }
    let rewritten = s.status().unwrap().units_rewritten;
    assert!(rewritten > 2500, "{rewritten} units rewritten in place");
    let before = medium_bytes(&medium);
    s.flush().unwrap();
    // The frame holds one change per cell, not one per write (3,200
    // `PutCell`s of ~100 bytes would be over 300 KiB).
    let frame = medium_bytes(&medium) - before;
    assert!(frame < 48 << 10, "the flush logged {frame} bytes");
    // ...and the log replays to the last version of every cell.
    let crashed = Arc::new(medium.crash(TearMode::DropUnsynced, 5));
    drop(s);
    let s = common::reopen(crashed, &vault);
    for c in 0..cells {
        let got = s.read(oid, c * CELL as u64, CELL).unwrap();
        assert_eq!(version_of(c, &got), Some(latest[c as usize]), "cell {c}");
    }
}

/// `cells` consecutive cells from `first`, each at `version`: one write.
fn run_of(first: u64, cells: u64, version: u64) -> Vec<u8> {
    (first..first + cells)
        .flat_map(|c| content(c, version))
        .collect()
}

#[test]
fn large_writes_over_unnamed_runs_take_their_place() {
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), common::options());
    let cells = 1024; // 4 MiB in 4 KiB cells
    let oid = object(&s, cells);
    let before = medium_bytes(&medium);
    let mut rng = SplitMix64::new(21);
    let mut latest = vec![0u64; cells as usize];
    // Writes of 16–64 cells (64–256 KiB, a block device's writeback) at
    // random cell boundaries, 8 rounds of the object's size.
    let mut written = 0;
    for version in 1.. {
        if written >= 8 * cells {
            break;
        }
        let n = 16 + rng.below(49);
        let first = rng.below(cells - n);
        s.write(oid, first * CELL as u64, &run_of(first, n, version))
            .unwrap();
        latest[first as usize..(first + n) as usize].fill(version);
        written += n;
    }
    let rewritten = s.status().unwrap().units_rewritten;
    let grown = medium_bytes(&medium) - before;
    // 32 MiB of writes: appended, the medium would grow by that much.
    assert!(
        rewritten > 4 * cells,
        "only {rewritten} units rewritten in place"
    );
    assert!(grown < 12 << 20, "the medium grew by {grown} bytes");
    holds_after_flush_and_crash(s, &medium, &vault, oid, &latest);
}

#[test]
fn units_the_cleaner_copies_are_never_rewritten_and_the_rest_still_are() {
    // Small segments, so that the cleaner has victims; a commit at the
    // second deletion, which starts a cleaner run that the changes after
    // it carry out a slice each.
    let options = oubli_core::Options {
        small_writes_buffered: 0,
        policy: oubli_core::EpochPolicy {
            deletions: Some(2),
            ..oubli_core::EpochPolicy::manual()
        },
        cleaner: oubli_core::CleanerPolicy {
            dead_share: 0.3,
            min_dead_bytes: 1 << 20,
            threshold: 0.6,
            max_move_bytes: u64::MAX,
        },
        ..common::options()
    };
    let medium = Arc::new(MemMedium::with_segment_capacity(256 << 10));
    let (s, vault) = common::store_on(medium.clone(), CreateOptions::default(), options);
    let small = |s: &Store| {
        let oid = s.create_object(b"").unwrap();
        assert!(s.use_small_cells(oid).unwrap());
        oid
    };
    // Kept (and held by a snapshot) and doomed interleaved: a quarter of
    // every segment stays live, and the cleaner copies it out.
    let (kept, doomed, tiny, hot) = (small(&s), small(&s), small(&s), small(&s));
    let cells = 2048u64;
    for c in 0..cells {
        s.write(kept, c * CELL as u64, &content(c, 0)).unwrap();
        for k in 0..3 {
            let d = 3 * c + k;
            s.write(doomed, d * CELL as u64, &content(d, 0)).unwrap();
        }
    }
    s.write(tiny, 0, b"x").unwrap();
    s.flush().unwrap();
    s.delete(doomed).unwrap();
    s.snapshot_create("before", None).unwrap();
    s.delete(tiny).unwrap();
    assert!(
        s.status().unwrap().cleaner.is_some(),
        "no cleaner run started"
    );
    // While the run goes on (each change carries out a slice): runs of
    // kept cells overwritten, from the first (whose units the cleaner
    // copied first: those copies the snapshot shares, and they must stay
    // as they are), and a hot run written twice in a row (the second
    // write may take the first's place: a slice names only what it
    // copied).
    let run = 16;
    let mut latest = vec![0u64; cells as usize];
    let mut hot_rewrites = 0;
    let mut version = 0;
    while s.status().unwrap().cleaner.is_some() && version < 1000 {
        version += 1;
        let first = (version - 1) * run % cells;
        s.write(kept, first * CELL as u64, &run_of(first, run, version))
            .unwrap();
        latest[first as usize..(first + run) as usize].fill(version);
        s.write(hot, 0, &run_of(0, run, version)).unwrap();
        let before = s.status().unwrap().units_rewritten;
        s.write(hot, 0, &run_of(0, run, version + 1)).unwrap();
        hot_rewrites += u64::from(s.status().unwrap().units_rewritten >= before + run);
    }
    eprintln!("{version} rounds of writes during the cleaner run");
    assert!(s.status().unwrap().cleaner.is_none(), "the run never ended");
    assert!(
        hot_rewrites > version / 2,
        "{hot_rewrites} runs rewritten in place in {version} pairs of writes during the run"
    );
    let check = |s: &Store, when: &str| {
        let snap = s.snapshot("before").unwrap();
        for c in 0..cells {
            let got = snap
                .read(kept, c * CELL as u64, CELL)
                .unwrap_or_else(|e| panic!("snapshot, cell {c}, {when}: {e}"));
            assert_eq!(version_of(c, &got), Some(0), "snapshot, cell {c}, {when}");
            let got = s.read(kept, c * CELL as u64, CELL).unwrap();
            assert_eq!(
                version_of(c, &got),
                Some(latest[c as usize]),
                "cell {c}, {when}"
            );
        }
    };
    check(&s, "after the run");
    s.commit().unwrap();
    let crashed = Arc::new(medium.crash(TearMode::DropUnsynced, 3));
    drop(s);
    check(&common::reopen(crashed, &vault), "reopened");
}
