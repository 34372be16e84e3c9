//! Simulator seed 200536: a write's partial last marker block, completed by the zeros of a hole after it, is not data the adversary must open.

use oubli_core::Medium;
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::adversary::check_promise;
use oubli_testkit::harness;
use oubli_testkit::marker::{self, BLOCK};
use oubli_testkit::workload::{Runner, Step};
use std::sync::Arc;

/// Write 42 of a run is 4031 bytes: 125 whole marker blocks and 31 bytes
/// of block 125, whose 32nd byte (the last of its check) happens to be 0.
/// Written before a hole (the object extends past it), the object reads
/// block 125 whole, so a scan of the model finds it; but no write ever
/// put it on the medium whole, and the adversary, who sees the stored
/// bytes only, cannot find it. The oracle asks the adversary for the
/// blocks written whole that the store still holds, and for nothing else
/// (seed 200536 failed on this: "the adversary cannot open live data").
#[test]
fn a_partial_marker_block_completed_by_a_hole_is_not_asked_of_the_adversary() {
    let options = harness::options(200_536);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create_with(
        recording.clone() as Arc<dyn Medium>,
        &options,
        harness::SCHEMES[2],
    );
    let mut runner = Runner::default();
    runner.step(&store, &Step::Create).unwrap();
    // Writes 1 to 41: one byte each, no whole block.
    for _ in 1..42 {
        let write = Step::Write {
            pick: 0,
            off: 0,
            len: 1,
        };
        runner.step(&store, &write).unwrap();
    }
    let (off, len, size) = (41_023u64, 4031u32, 95_629u64);
    runner
        .step(&store, &Step::Truncate { pick: 0, size })
        .unwrap();
    runner
        .step(&store, &Step::Write { pick: 0, off, len })
        .unwrap();
    runner.step(&store, &Step::Commit).unwrap();

    let block = (42u64, 125u32);
    let whole = marker::data(block.0, (block.1 as usize + 1) * BLOCK);
    let oid = *runner.model.objects.keys().last().unwrap();
    let at = off + u64::from(block.1) * BLOCK as u64;
    assert_eq!(
        store.read(oid, at, BLOCK).unwrap(),
        whole[block.1 as usize * BLOCK..],
        "the store reads write 42's block 125 whole (its last byte from the hole)"
    );
    assert!(runner.model.live_markers().contains(&block));
    assert!(!runner.written.contains(&block), "never written whole");
    assert!(runner.live_markers().contains(&(42, 124)));
    assert!(!runner.live_markers().contains(&block));
    // The promise: write 42's whole blocks open for the adversary, and it
    // is not asked for block 125.
    check_promise(&recording, &*vault, &runner, options.provider.clone());
}
