//! The deletion guarantee tested the way an attacker breaks it: every byte ever written, the current vault, the password.

use oubli_core::Medium;
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::harness;
use oubli_testkit::workload::{Runner, Step, Workload};
use oubli_testkit::Adversary;
use std::sync::Arc;

/// ≥ 20 epochs of puts, overwrites, truncates, punches and deletes. After
/// every commit the adversary seizes every past state of the medium and the
/// current vault: nothing deleted before that commit opens. Live data does.
#[test]
fn nothing_deleted_before_the_last_commit_opens() {
    let options = harness::options(11);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create(recording.clone() as Arc<dyn Medium>, &options);
    let workload = Workload::generate(11, 1200, 64 * 1024, 25);
    let mut runner = Runner::default();
    let mut checked = 0;
    for step in &workload.steps {
        runner.step(&store, step).expect("step");
        if *step == Step::Commit && runner.commits % 3 == 0 {
            check(&recording, &vault, &runner, &options);
            checked += 1;
        }
    }
    store.commit().unwrap();
    runner.note_commit();
    check(&recording, &vault, &runner, &options);
    println!(
        "adversary: {} epochs, {} checks over every past state, {} deleted marker blocks, none recovered",
        runner.commits,
        checked + 1,
        runner.erased.len()
    );
    assert!(runner.commits >= 20, "only {} epochs", runner.commits);
    assert!(checked >= 5);
    assert!(
        runner.erased.len() > 1000,
        "workload erased too little: {}",
        runner.erased.len()
    );
    assert_eq!(runner.model.diff(&store), None);
}

fn check(
    recording: &RecordingMedium<MemMedium>,
    vault: &oubli_testkit::RecordingVault,
    runner: &Runner,
    options: &oubli_core::Options,
) {
    let adversary = Adversary::seize(recording);
    assert!(
        adversary.plaintext_markers().is_empty(),
        "plaintext on the medium"
    );
    let current = oubli_core::Vault::load(vault).unwrap();
    let recovered = adversary.recovered_markers(&[current], options.provider.clone());
    let leaked: Vec<_> = recovered.intersection(&runner.erased).take(5).collect();
    assert!(
        leaked.is_empty(),
        "deleted data recovered after commit: {leaked:?}"
    );
    // The adversary is not blind: with the current key it reads all live data.
    let live = runner.model.live_markers();
    assert!(
        live.is_subset(&recovered),
        "adversary failed to read live data"
    );
}

/// Control: an adversary that also kept an old vault key does recover deleted
/// data — so the test above can fail, and the vault overwrite is what matters.
#[test]
fn control_old_vault_keys_do_recover_deleted_data() {
    let options = harness::options(12);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create(recording.clone() as Arc<dyn Medium>, &options);
    let workload = Workload::generate(12, 600, 64 * 1024, 25);
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&store, step).unwrap();
    }
    store.commit().unwrap();
    runner.note_commit();
    let adversary = Adversary::seize(&recording);
    let recovered = adversary.recovered_markers(&vault.history(), options.provider.clone());
    let leaked = recovered.intersection(&runner.erased).count();
    assert!(
        leaked * 2 > runner.erased.len(),
        "with every old key the adversary should recover most deleted data; got {leaked} of {}",
        runner.erased.len()
    );
}

/// Deletions since the last commit are still recoverable (the promise is per
/// epoch), and `purge` ends that window at once.
#[test]
fn purge_closes_the_window() {
    let options = harness::options(13);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create(recording.clone() as Arc<dyn Medium>, &options);
    let mut runner = Runner::default();
    runner.step(&store, &Step::Create).unwrap();
    runner
        .step(
            &store,
            &Step::Write {
                pick: 0,
                off: 0,
                len: 20_000,
            },
        )
        .unwrap();
    runner.step(&store, &Step::Commit).unwrap();
    let written = runner.written.clone();
    runner.step(&store, &Step::Delete { pick: 0 }).unwrap();
    runner.step(&store, &Step::Flush).unwrap();
    let current = || vec![oubli_core::Vault::load(&*vault).unwrap()];
    let before =
        Adversary::seize(&recording).recovered_markers(&current(), options.provider.clone());
    assert!(
        written.is_subset(&before),
        "before the purge the deletion is still pending"
    );
    assert_eq!(store.audit().unwrap().pending_units, 5);
    store.purge().unwrap();
    let after =
        Adversary::seize(&recording).recovered_markers(&current(), options.provider.clone());
    assert!(after.is_disjoint(&written));
    let report = store.audit().unwrap();
    assert_eq!((report.pending_units, report.leaked_units), (0, 0));
}

/// `Store::audit_with` (what `oubli audit --with-copy` runs): an old copy of
/// the medium yields nothing deleted; an old copy plus an old vault key does,
/// and the cleaner's moves are not mistaken for leaks.
#[test]
fn audit_with_old_copies_and_old_keys() {
    let options = harness::options(14);
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, vault) = harness::create(medium.clone() as Arc<dyn Medium>, &options);
    let mut runner = Runner::default();
    for step in Workload::generate(14, 300, 64 * 1024, 1000).steps {
        if step != Step::Commit {
            runner.step(&store, &step).unwrap();
        }
    }
    store.commit().unwrap();
    let copy: Arc<dyn Medium> = Arc::new(medium.clone_state());
    let old_key = oubli_core::Vault::load(&*vault).unwrap();
    for pick in 0..3 {
        runner.step(&store, &Step::Delete { pick }).unwrap();
    }
    store.commit().unwrap();
    store.gc(0.9).unwrap();
    let clean = store.audit_with(std::slice::from_ref(&copy), &[]).unwrap();
    assert_eq!(
        (clean.leaked_units, clean.pending_units),
        (0, 0),
        "{clean:?}"
    );
    assert!(clean.live_units > 0);
    let control = store.audit_with(&[copy], &[old_key]).unwrap();
    assert!(control.leaked_units > 0, "{control:?}");
}
