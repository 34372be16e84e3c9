//! Threads writing and reading their own objects while another commits and cleans: no errors, no torn or stale data.

use oubli_core::{CleanerPolicy, EpochPolicy, Medium, Store, ROOT_DIR};
use oubli_media::{MemMedium, SplitMix64};
use oubli_testkit::{harness, marker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn readers_and_writers_race_commits_and_the_cleaner() {
    for scheme in harness::SCHEMES {
        readers_and_writers_race_with(scheme);
    }
}

fn readers_and_writers_race_with(scheme: u8) {
    let store = race(harness::options(3), scheme, |store, _| {
        store.commit().unwrap();
        store.gc(0.7).unwrap();
    });
    assert_eq!(
        store.fsck(&mut |_| {}).unwrap().problems,
        Vec::<String>::new()
    );
}

/// The same race with the cleaner the store runs by itself: the epoch
/// policy commits every 256 KiB written, each commit may start a run, and
/// the writers' own changes carry it out a slice each, beside commits in
/// flight, while another thread takes and drops snapshots (whose trees the
/// run goes through too) and reads one of them.
#[test]
fn readers_and_writers_race_the_cleaner_running_in_slices() {
    // The policy's commits in the path of the change that makes them due,
    // then on the committer thread (as the mount and the server run them).
    let modes = harness::SCHEMES
        .iter()
        .flat_map(|&s| [(s, false), (s, true)]);
    for (scheme, background_commits) in modes {
        let mut options = harness::options(4);
        options.background_commits = background_commits;
        options.policy = EpochPolicy {
            bytes: Some(256 << 10),
            ..EpochPolicy::manual()
        };
        options.cleaner = CleanerPolicy {
            dead_share: 0.2,
            min_dead_bytes: 256 << 10,
            threshold: 0.8,
            max_move_bytes: 4 << 20,
        };
        let store = race(options, scheme, |store, round| {
            store.tick();
            if round % 8 == 0 {
                store
                    .snapshot_create(&format!("s{round:06}"), None)
                    .unwrap();
                let names: Vec<_> = store.snapshots().into_iter().map(|s| s.name).collect();
                if names.len() > 2 {
                    store.snapshot_remove(&names[0]).unwrap();
                }
                // A snapshot's view reads what the cleaner moves in its
                // tree. It may fail (an error, never other bytes) only once
                // the generation that tells its holders to drop it moved.
                let generation = store.snapshot_generation();
                let view = store.snapshot(names.last().unwrap()).unwrap();
                let read_all = || -> oubli_core::Result<()> {
                    for (_, oid) in view.list(ROOT_DIR)? {
                        let size = view.size(oid)? as usize;
                        view.read(oid, 0, size)?;
                    }
                    Ok(())
                };
                if let Err(e) = read_all() {
                    assert_ne!(
                        store.snapshot_generation(),
                        generation,
                        "a view failed before its generation moved: {e}"
                    );
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        });
        // The timer finishes a run; the commit that ends one may start another.
        for _ in 0..100 {
            store.tick();
            if store.status().unwrap().cleaner.is_none() {
                break;
            }
        }
        let status = store.status().unwrap();
        assert!(status.cleaner.is_none(), "{:?}", status.cleaner);
        let problems = store.fsck(&mut |_| {}).unwrap().problems;
        assert!(
            problems.is_empty(),
            "{} problems, the first: {:?}",
            problems.len(),
            &problems[..problems.len().min(3)]
        );
        eprintln!(
            "scheme {scheme}, background commits {background_commits}: epoch {}, {} bytes on the medium, {} live",
            status.epoch, status.medium_bytes, status.live_bytes
        );
        // The workers wrote over 50 MB: runs went through.
        assert!(
            status.medium_bytes < 8 << 20,
            "the cleaner left {} bytes on the medium for {} live",
            status.medium_bytes,
            status.live_bytes
        );
    }
}

/// Four threads write, truncate and read their own objects (named in the
/// root directory) while another calls `maintain` with a round number
/// until they are done; returns the store.
fn race(
    options: oubli_core::Options,
    scheme: u8,
    maintain: impl Fn(&Store, u64) + Send + 'static,
) -> Arc<Store> {
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, _vault) = harness::create_with(medium as Arc<dyn Medium>, &options, scheme);
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let maintainer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                maintain(&store, rounds);
                rounds += 1;
            }
            rounds
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let oid = store.create_object(b"").unwrap();
                store
                    .link(ROOT_DIR, format!("t{t}").as_bytes(), oid)
                    .unwrap();
                let mut model: Vec<u8> = Vec::new();
                let mut rng = SplitMix64::new(t);
                for i in 0..400u64 {
                    let off = rng.below(200_000);
                    let len = 1 + rng.below(70_000) as usize;
                    let data = marker::data(t << 32 | i, len);
                    store.write(oid, off, &data).unwrap();
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                    if i % 7 == 0 {
                        let size = rng.below(model.len() as u64 + 1);
                        store.truncate(oid, size).unwrap();
                        model.truncate(size as usize);
                    }
                    let at = rng.below(model.len() as u64 + 1) as usize;
                    let got = store.read(oid, at as u64, 50_000).unwrap();
                    assert_eq!(
                        got,
                        model[at..(at + 50_000).min(model.len())],
                        "thread {t} step {i}"
                    );
                }
                assert_eq!(store.read(oid, 0, model.len() + 1).unwrap(), model);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(maintainer.join().unwrap() > 0);
    store
}

/// Writers share the cells of one object, each owning its own slice of every
/// cell, while another thread flushes (so cells keep turning from buffered to
/// sealed) and commits. A write that merged into a stale copy of a cell (one
/// opened before another writer replaced it) would lose that writer's bytes.
#[test]
fn writers_sharing_cells_lose_nothing() {
    // The race is narrow: several rounds make a stale merge likely to show.
    // Under a scheme with keys outside the tree, a merge that read a cell a
    // commit just swept would fail to resolve its key.
    for scheme in harness::SCHEMES {
        for round in 0..4 {
            writers_sharing_cells_round(round, scheme);
        }
    }
}

fn writers_sharing_cells_round(round: u64, scheme: u8) {
    const THREADS: u64 = 4;
    const CELLS: u64 = 2;
    let cell = harness::TEST_CELL as u64;
    let slice = cell / THREADS;
    let options = harness::options(5 + round);
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, _vault) = harness::create_with(medium as Arc<dyn Medium>, &options, scheme);
    let store = Arc::new(store);
    let oid = store.create_object(b"").unwrap();
    store
        .write(oid, 0, &vec![0xee; (CELLS * cell) as usize])
        .unwrap();
    store.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flusher = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                store.flush().unwrap();
                if rounds.is_multiple_of(16) {
                    store.commit().unwrap();
                }
                rounds += 1;
                // The engine mutex is not fair: without a pause the flusher
                // can starve the writers for seconds.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            rounds
        })
    };
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(100 * (round + 1) + t);
                let mut last = vec![None; CELLS as usize];
                for i in 0..10_000u64 {
                    let c = rng.below(CELLS);
                    let data = marker::data(t << 32 | i, slice as usize);
                    store.write(oid, c * cell + t * slice, &data).unwrap();
                    last[c as usize] = Some(data);
                }
                last
            })
        })
        .collect();
    let last: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    assert!(flusher.join().unwrap() > 0);
    let whole = store.read(oid, 0, (CELLS * cell) as usize).unwrap();
    for (t, cells) in last.iter().enumerate() {
        for (c, data) in cells.iter().enumerate() {
            let at = (c as u64 * cell + t as u64 * slice) as usize;
            let want = data.clone().unwrap_or_else(|| vec![0xee; slice as usize]);
            assert!(
                whole[at..at + slice as usize] == want[..],
                "thread {t}'s slice of cell {c} lost its last write"
            );
        }
    }
}

/// Commits run without the engine lock across their syncs and vault
/// rotation (DESIGN §10), so writers overwrite, truncate and flush while
/// the vault rotates — here a slow one. After the writers stop and one
/// last commit, the adversary holding every byte ever written and the
/// vault finds every live marker and none that was overwritten or cut
/// off; with every key the vault ever held (the control), it finds some.
#[test]
fn deletions_beside_commits_are_erased_by_the_next_commit() {
    for scheme in harness::SCHEMES {
        deletions_beside_commits_with(scheme);
    }
}

fn deletions_beside_commits_with(scheme: u8) {
    use oubli_core::Vault;
    use oubli_media::RecordingMedium;
    use oubli_testkit::{adversary::Adversary, vault::RecordingVault};
    use oubli_vault::SlowVault;
    use std::collections::BTreeSet;
    use std::time::Duration;

    let options = harness::options(11);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let mut slot = None;
    let store = oubli_core::Store::create(
        recording.clone() as Arc<dyn Medium>,
        |record| {
            let v = Arc::new(SlowVault::new(
                RecordingVault::new(record.clone()),
                Duration::from_millis(3),
            ));
            slot = Some(v.clone());
            Ok(v)
        },
        oubli_core::CreateOptions {
            cell_size: harness::TEST_CELL,
            key_scheme: scheme,
        },
        options.clone(),
    )
    .unwrap();
    let vault = slot.unwrap();
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut commits = 0;
            while !stop.load(Ordering::Relaxed) {
                store.commit().unwrap();
                commits += 1;
            }
            commits
        })
    };
    let writers: Vec<_> = (0..3u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let oid = store.create_object(b"").unwrap();
                let (mut model, mut written) = (Vec::new(), BTreeSet::new());
                let mut rng = SplitMix64::new(100 + t);
                for i in 0..300u64 {
                    let off = rng.below(60_000);
                    let data = marker::data(t << 32 | i, 1 + rng.below(9_000) as usize);
                    marker::scan(&data, &mut written);
                    store.write(oid, off, &data).unwrap();
                    let end = off as usize + data.len();
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                    if i % 11 == 0 {
                        let size = rng.below(model.len() as u64 + 1);
                        store.truncate(oid, size).unwrap();
                        model.truncate(size as usize);
                    }
                    if i % 5 == 0 {
                        store.flush().unwrap();
                    }
                }
                assert_eq!(store.read(oid, 0, model.len() + 1).unwrap(), model);
                let mut live = BTreeSet::new();
                marker::scan(&model, &mut live);
                (live, written)
            })
        })
        .collect();
    let (mut live, mut written) = (BTreeSet::new(), BTreeSet::new());
    for w in writers {
        let (l, all) = w.join().unwrap();
        live.extend(l);
        written.extend(all);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(
        committer.join().unwrap() > 3,
        "too few commits beside the writers"
    );
    store.commit().unwrap();
    let erased: BTreeSet<_> = written.difference(&live).copied().collect();
    assert!(!erased.is_empty() && !live.is_empty());

    let adversary = Adversary::seize(&recording);
    assert!(
        adversary.plaintext_markers().is_empty(),
        "plaintext on the medium"
    );
    let held = vault.readable_records().unwrap();
    let recovered = adversary.recovered_markers(&held, options.provider.clone());
    let leaked: Vec<_> = recovered.intersection(&erased).take(5).collect();
    assert!(leaked.is_empty(), "deleted data recovered: {leaked:?}");
    let missing: Vec<_> = live.difference(&recovered).take(5).collect();
    assert!(missing.is_empty(), "live data not recovered: {missing:?}");
    // The control: every key the vault ever held opens deleted data.
    let every_key = vault.inner().history();
    let control = adversary.recovered_markers(&every_key, options.provider.clone());
    assert!(
        control.intersection(&erased).next().is_some(),
        "the control adversary recovered nothing deleted: the check is blind"
    );
}
