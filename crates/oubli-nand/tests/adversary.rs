//! The deletion guarantee on raw NAND: a chip-off reader holding every past state of the image, the chip's vault block and the password.

use oubli_nand::NandChip;
use oubli_testkit::adversary::check_promise_with_keys;
use oubli_testkit::workload::{Runner, Step, Workload};
use oubli_testkit::{harness, nand};
use std::sync::Arc;

/// ≥ 20 epochs of puts, overwrites, truncates, punches and deletes on a
/// NAND store. After every third commit the adversary carves the raw image
/// at every past state and reads the vault out of the chip as it is now:
/// nothing deleted before that commit opens, and live data does.
#[test]
fn nothing_deleted_before_the_last_commit_opens_from_the_raw_image() {
    for scheme in harness::SCHEMES {
        nothing_deleted_from_the_raw_image_with(scheme);
    }
}

fn nothing_deleted_from_the_raw_image_with(scheme: u8) {
    let options = harness::options(31);
    let s = nand::create_with(&options, scheme);
    let chip = s.ubi.chip().clone();
    let workload = Workload::generate(31, 900, 48 * 1024, 25);
    let mut runner = Runner::default();
    let mut checked = 0;
    for step in &workload.steps {
        runner.step(&s.store, step).expect("step");
        if *step == Step::Commit && runner.commits % 3 == 0 {
            let (adversary, keys) = nand::seize(&[&chip], &chip, options.provider.clone());
            assert_eq!(keys.len(), 1, "the chip holds one vault record");
            check_promise_with_keys(&adversary, &keys, &runner, options.provider.clone());
            checked += 1;
        }
    }
    s.store.commit().unwrap();
    runner.note_commit();
    let (adversary, keys) = nand::seize(&[&chip], &chip, options.provider.clone());
    check_promise_with_keys(&adversary, &keys, &runner, options.provider.clone());
    let wear = oubli_nand::NandMedium::new(s.ubi.clone())
        .unwrap()
        .wear(10_000, None);
    println!(
        "nand adversary: {} epochs, {} checks, {} deleted marker blocks, none recovered; \
         {} erasures, erase counts {}..{}, Hoover {:.3}",
        runner.commits,
        checked + 1,
        runner.erased.len(),
        wear.total_erases,
        wear.min,
        wear.max,
        wear.hoover
    );
    assert!(runner.commits >= 20, "only {} epochs", runner.commits);
    assert!(checked >= 5);
    assert!(
        runner.erased.len() > 500,
        "erased too little: {}",
        runner.erased.len()
    );
    assert_eq!(runner.model.diff(&s.store), None);
}

/// Control: a chip whose erase only pretends (the old blocks stay where a
/// chip-off reader finds them — the store's and the vault's alike) gives
/// the old vault records, hence the deleted data, back. So the test above
/// can fail, and the erase is what it rests on.
#[test]
fn control_a_chip_whose_erase_does_nothing_gives_deleted_data_back() {
    let options = harness::options(32);
    let s = nand::create(&options);
    let chip = s.ubi.chip().clone();
    chip.set_erase_remaps(true);
    let workload = Workload::generate(32, 500, 48 * 1024, 25);
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&s.store, step).unwrap();
    }
    s.store.commit().unwrap();
    runner.note_commit();
    let (adversary, keys) = nand::seize(&[&chip], &chip, options.provider.clone());
    assert!(
        keys.len() > 10,
        "the old vault records are still on the chip: {}",
        keys.len()
    );
    let recovered = adversary.recovered_markers(&keys, options.provider.clone());
    let leaked = recovered.intersection(&runner.erased).count();
    assert!(
        leaked * 2 > runner.erased.len(),
        "with erases that do nothing the adversary should recover most deleted data; got {leaked} of {}",
        runner.erased.len()
    );
}

/// The same promise read from the image *file*, as `oubli` leaves it on
/// disk: the bytes of the file after the last commit (its vault block
/// included) plus every block content the chip ever erased.
#[test]
fn the_image_file_holds_nothing_deleted_after_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chip.img");
    let chip = Arc::new(NandChip::create(&path, nand::geometry(), &[5], None).unwrap());
    chip.record_history(true);
    let options = harness::options(33);
    let s = nand::create_on(chip.clone(), &options);
    let workload = Workload::generate(33, 400, 48 * 1024, 20);
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&s.store, step).expect("step");
    }
    s.store.commit().unwrap();
    runner.note_commit();
    let on_disk = NandChip::from_image(std::fs::read(&path).unwrap()).unwrap();
    let (adversary, keys) = nand::seize(&[&chip, &on_disk], &on_disk, options.provider.clone());
    assert_eq!(keys.len(), 1, "the file holds one vault record");
    assert!(runner.erased.len() > 100, "erased {}", runner.erased.len());
    check_promise_with_keys(&adversary, &keys, &runner, options.provider.clone());
}
