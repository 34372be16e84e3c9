//! The crash sweep on raw NAND: cut the power at every program and erase of a workload (torn programs too), re-attach, check both halves of the guarantee.

use oubli_core::Vault;
use oubli_nand::{carve_block, FIRST_SEGMENT_LNUM};
use oubli_testkit::adversary::check_promise_with_keys;
use oubli_testkit::workload::{Runner, Workload};
use oubli_testkit::{harness, nand};

/// Program/erase operations of the workload after the store was created,
/// and how many erase blocks of segments it erased.
fn count_ops(seed: u64, workload: &Workload, scheme: u8) -> (u64, usize) {
    let options = harness::options(seed);
    let s = nand::create_with(&options, scheme);
    let start = s.ubi.chip().ops();
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&s.store, step).unwrap();
    }
    let erased_segment_blocks = s
        .ubi
        .chip()
        .history()
        .iter()
        .filter_map(|(_, raw)| carve_block(raw, nand::geometry()))
        .filter(|b| b.lnum >= FIRST_SEGMENT_LNUM)
        .count();
    (s.ubi.chip().ops() - start, erased_segment_blocks)
}

/// Runs the workload cut at operation `point` (torn after `torn` raw
/// bytes if given); returns whether the cut struck.
fn cut_at(seed: u64, workload: &Workload, scheme: u8, point: u64, torn: Option<usize>) -> bool {
    let options = harness::options(seed);
    let s = nand::create_with(&options, scheme);
    let chip = s.ubi.chip().clone();
    chip.arm_cut(chip.ops() + point, torn);
    let mut runner = Runner::default();
    let mut cut = false;
    for step in &workload.steps {
        if runner.step(&s.store, step).is_err() {
            cut = true;
            break;
        }
    }
    if !cut {
        return false;
    }
    drop(s.store);
    let again = nand::reopen(&chip, &options).unwrap_or_else(|e| {
        panic!("cut at {point} (torn {torn:?}): the store does not reopen: {e}")
    });
    if let (Some(acked), Some(in_flight)) = (
        runner.acked.diff(&again.store),
        runner.model.diff(&again.store),
    ) {
        panic!(
            "cut at {point} (torn {torn:?}): the store matches neither the acknowledged state ({acked}) \
             nor the in-flight one ({in_flight})"
        );
    }
    // Opening erased any leftover vault record: the chip holds one.
    assert_eq!(
        again.vault.readable_records().unwrap().len(),
        1,
        "cut at {point}"
    );
    let new_chip = again.ubi.chip().clone();
    let (adversary, keys) = nand::seize(&[&chip, &new_chip], &new_chip, options.provider.clone());
    // The sweep checks only the deletion half: live data of the in-flight
    // state may be legitimately gone.
    let mut deletion_only = Runner::default();
    deletion_only.erased = runner.erased.clone();
    check_promise_with_keys(&adversary, &keys, &deletion_only, options.provider.clone());
    drop(again);
    true
}

/// Cuts at every program and erase of `workload` on a store of `scheme`
/// (every `OUBLI_NAND_SWEEP_STEP`th one if set), each once whole and once
/// torn (half a page or more, its OOB missing — the page fails its checksums).
fn sweep(seed: u64, workload: Workload, scheme: u8) -> usize {
    let (ops, erased_segment_blocks) = count_ops(seed, &workload, scheme);
    let step: u64 = std::env::var("OUBLI_NAND_SWEEP_STEP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut struck = 0;
    for point in (0..ops).step_by(step as usize) {
        for torn in [None, Some(1024 + (point as usize % 1000))] {
            if cut_at(seed, &workload, scheme, point, torn) {
                struck += 1;
            }
        }
    }
    println!(
        "nand crash sweep (seed {seed}, {}): {ops} program/erase points, {struck} cuts struck, \
         {erased_segment_blocks} segment blocks erased",
        harness::scheme_name(scheme)
    );
    assert!(
        struck >= 2 * ops.div_ceil(step),
        "the cuts must strike: {struck} of {ops}"
    );
    erased_segment_blocks
}

#[test]
fn every_cut_reopens_keeps_acknowledged_writes_and_leaks_nothing() {
    for scheme in harness::SCHEMES {
        sweep(41, Workload::generate(41, 240, 24 * 1024, 12), scheme);
    }
}

/// Larger objects: segments span several erase blocks, rotate, and the
/// cleaner moves live cells and deletes (erases) whole segments.
#[test]
fn every_cut_with_segment_rotation_and_cleaning() {
    let erased = sweep(
        42,
        Workload::generate(42, 160, 160 * 1024, 16),
        harness::SCHEMES[0],
    );
    assert!(erased > 0, "the workload must delete segments");
}
