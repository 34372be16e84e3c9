//! The automatic cleaner: a store overwritten again and again under an epoch policy stays bounded in size and loses nothing.

use oubli_core::{CleanerPolicy, EpochPolicy, Medium, Store};
use oubli_media::{MemMedium, SplitMix64};
use oubli_testkit::{harness, marker};
use std::sync::Arc;

const OBJECT: u64 = 512 * 1024;

/// Overwrites random cells of one object 5,000 times (20 MB in all) with a
/// commit every 256 KiB written; returns the store and what it must hold.
fn overwrite_workload(cleaner: CleanerPolicy) -> (Store, Vec<u8>) {
    let mut options = harness::options(11);
    options.policy = EpochPolicy {
        bytes: Some(256 * 1024),
        ..EpochPolicy::manual()
    };
    options.cleaner = cleaner;
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, _vault) = harness::create(medium as Arc<dyn Medium>, &options);
    let oid = store.create_object(b"").unwrap();
    let mut model = marker::data(1, OBJECT as usize);
    store.write(oid, 0, &model).unwrap();
    let mut rng = SplitMix64::new(3);
    let cell = harness::TEST_CELL as u64;
    for i in 0..5_000u64 {
        let at = rng.below(OBJECT / cell) * cell;
        let data = marker::data(2 + i, cell as usize);
        store.write(oid, at, &data).unwrap();
        model[at as usize..(at + cell) as usize].copy_from_slice(&data);
    }
    store.flush().unwrap();
    assert!(store.read(oid, 0, OBJECT as usize).unwrap() == model);
    (store, model)
}

#[test]
fn the_cleaner_keeps_an_overwritten_store_bounded() {
    let cleaner = CleanerPolicy {
        dead_share: 0.5,
        min_dead_bytes: 1 << 20,
        threshold: 0.5,
        max_move_bytes: 512 * 1024,
    };
    let (store, _) = overwrite_workload(cleaner);
    let status = store.status().unwrap();
    eprintln!(
        "with the cleaner: {} bytes on the medium, {} live, epoch {}",
        status.medium_bytes, status.live_bytes, status.epoch
    );
    assert!(
        status.medium_bytes < 4 << 20,
        "{} bytes on the medium for {} live",
        status.medium_bytes,
        status.live_bytes
    );
    let report = store.fsck(&mut |_| {}).unwrap();
    assert_eq!(report.problems, Vec::<String>::new());
    // Without the cleaner the same workload leaves most of its 20 MB behind.
    let (store, _) = overwrite_workload(CleanerPolicy::off());
    let without = store.status().unwrap().medium_bytes;
    eprintln!("without: {without} bytes on the medium");
    assert!(without > 10 << 20);
}
