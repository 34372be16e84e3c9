//! Threads writing and reading their own objects while another commits and cleans: no errors, no torn or stale data.

use oubli_core::Medium;
use oubli_media::{MemMedium, SplitMix64};
use oubli_testkit::{harness, marker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn readers_and_writers_race_commits_and_the_cleaner() {
    let options = harness::options(3);
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, _vault) = harness::create(medium as Arc<dyn Medium>, &options);
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let maintainer = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                store.commit().unwrap();
                store.gc(0.7).unwrap();
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
}
