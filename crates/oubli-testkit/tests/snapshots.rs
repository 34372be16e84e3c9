//! Snapshots against the adversary: removing one erases exactly what only it held; redaction erases one object from every version; the cleaner keeps what any root needs.

use oubli_core::{Medium, Store, Vault};
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::adversary::check_promise;
use oubli_testkit::marker::{self, Marker};
use oubli_testkit::workload::{Runner, Step, Workload};
use oubli_testkit::{harness, Adversary};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The markers only one snapshot of the model holds (not the live store,
/// not another snapshot): what removing it must erase.
fn unique_to(runner: &Runner, name: &str) -> BTreeSet<Marker> {
    let mut mine = BTreeSet::new();
    for data in runner.model.snapshots[name].values() {
        marker::scan(data, &mut mine);
    }
    let mut others = runner.model.clone();
    others.snapshots.remove(name);
    let elsewhere = others.live_markers();
    mine.difference(&elsewhere).copied().collect()
}

/// ≥ 20 epochs with snapshots taken, removed and redacted at random among
/// writes, overwrites, truncates, punches, deletes and cleaner runs. After
/// every few commits the adversary holds every byte ever written and the
/// vault: nothing that only a removed snapshot (or nothing at all) held
/// opens; everything the live store or a kept snapshot holds opens; the
/// store and every snapshot read back as the model says.
#[test]
fn removed_snapshots_and_redacted_objects_never_open_after_the_next_commit() {
    for scheme in harness::SCHEMES {
        removed_snapshots_and_redacted_objects_never_open_after_the_next_commit_with(scheme);
    }
}

fn removed_snapshots_and_redacted_objects_never_open_after_the_next_commit_with(scheme: u8) {
    let options = harness::options(31);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let workload = Workload::with_snapshots(31, 1400, 64 * 1024, 25);
    let mut runner = Runner::default();
    // Markers that were held by a snapshot alone when it was removed or redacted.
    let mut only_in_removed = BTreeSet::new();
    let mut checks = 0;
    for step in &workload.steps {
        if let Step::SnapshotRemove { pick } = step {
            let names: Vec<String> = runner.model.snapshots.keys().cloned().collect();
            if !names.is_empty() {
                let name = &names[*pick as usize % names.len()];
                only_in_removed.extend(unique_to(&runner, name));
            }
        }
        runner.step(&store, step).expect("step");
        if *step == Step::Commit && runner.commits % 3 == 0 {
            check_promise(&recording, &*vault, &runner, options.provider.clone());
            checks += 1;
        }
    }
    store.commit().unwrap();
    runner.note_commit();
    check_promise(&recording, &*vault, &runner, options.provider.clone());
    assert_eq!(runner.model.diff(&store), None);
    let report = store.fsck(&mut |_| {}).unwrap();
    assert_eq!(report.problems, Vec::<String>::new());
    let count = |f: fn(&Step) -> bool| workload.count(f);
    println!(
        "snapshots: {} epochs, {checks} checks, {} snapshots taken, {} removed, {} redactions, {} kept at the end; {} marker blocks held only by removed snapshots, none recovered",
        runner.commits,
        count(|s| *s == Step::SnapshotCreate),
        count(|s| matches!(s, Step::SnapshotRemove { .. })),
        count(|s| matches!(s, Step::Redact { .. })),
        runner.model.snapshots.len(),
        only_in_removed.len()
    );
    assert!(runner.commits >= 20, "only {} epochs", runner.commits);
    assert!(count(|s| *s == Step::SnapshotCreate) >= 20);
    assert!(count(|s| matches!(s, Step::SnapshotRemove { .. })) >= 10);
    assert!(count(|s| matches!(s, Step::Redact { .. })) >= 10);
    assert!(!runner.model.snapshots.is_empty());
    assert!(
        only_in_removed.len() > 100,
        "the workload removed too little snapshot-only data: {}",
        only_in_removed.len()
    );
    assert!(only_in_removed.is_subset(&runner.erased));

    // Control: every old vault key recovers what only removed snapshots held.
    let adversary = Adversary::seize(&recording);
    let recovered = adversary.recovered_markers(&vault.history(), options.provider.clone());
    let back = recovered.intersection(&only_in_removed).count();
    assert!(
        back * 2 > only_in_removed.len(),
        "with old vault keys the adversary should recover removed snapshots: {back} of {}",
        only_in_removed.len()
    );
}

/// A snapshot costs no copy: taking it writes only what changed since the
/// last commit, whatever the store holds; reading it gives the old data
/// after the live store has been overwritten; `rm` does not erase what a
/// snapshot holds, `snapshot rm` + commit does; the cleaner keeps a
/// snapshot's data and gives the space back once it is removed.
#[test]
fn snapshot_lifecycle_space_and_cleaning() {
    for scheme in harness::SCHEMES {
        snapshot_lifecycle_space_and_cleaning_with(scheme);
    }
}

fn snapshot_lifecycle_space_and_cleaning_with(scheme: u8) {
    let options = harness::options(32);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let oid = store.create_object(b"").unwrap();
    let old = marker::data(1, 2 << 20);
    store.write(oid, 0, &old).unwrap();
    store.commit().unwrap();
    let before = store.status().unwrap().medium_bytes;
    store.snapshot_create("before", None).unwrap();
    let grew = store.status().unwrap().medium_bytes - before;
    assert!(
        grew < 16 * 1024,
        "a snapshot of a committed 2 MiB store wrote {grew} bytes"
    );
    assert!(store.snapshot_create("before", None).is_err());
    assert!(store.snapshot_create("a/b", None).is_err());

    // Overwrite everything: the live store has new data, the snapshot the old.
    let new = marker::data(2, 2 << 20);
    store.write(oid, 0, &new).unwrap();
    store.commit().unwrap();
    let view = store.snapshot("before").unwrap();
    assert!(view.read(oid, 0, old.len()).unwrap() == old);
    assert!(store.read(oid, 0, new.len()).unwrap() == new);
    assert!(view.write(oid, 0, b"x").is_err(), "a snapshot is read-only");
    assert_eq!(store.snapshots_holding(oid).unwrap(), vec!["before"]);
    let usage = store.snapshot_usage().unwrap();
    assert_eq!(usage.len(), 1);
    assert!(
        usage[0].unique_bytes >= 2 << 20,
        "unique {}",
        usage[0].unique_bytes
    );

    // The cleaner traces the snapshot: nothing it holds is lost.
    store.gc(0.99).unwrap();
    let view = store.snapshot("before").unwrap();
    assert!(view.read(oid, 0, old.len()).unwrap() == old);
    let mut old_markers = BTreeSet::new();
    marker::scan(&old, &mut old_markers);
    let held = vault.readable_records().unwrap();
    let adversary = Adversary::seize(&recording);
    assert!(old_markers.is_subset(&adversary.recovered_markers(&held, options.provider.clone())));

    // Removing it erases the old data at the next commit; the space comes back.
    store.snapshot_remove("before").unwrap();
    assert!(store.snapshot_remove("before").is_err());
    store.commit().unwrap();
    store.gc(0.99).unwrap();
    let adversary = Adversary::seize(&recording);
    let held = vault.readable_records().unwrap();
    let recovered = adversary.recovered_markers(&held, options.provider.clone());
    assert!(recovered.intersection(&old_markers).next().is_none());
    let after = store.status().unwrap().medium_bytes;
    assert!(
        after < before + (512 << 10),
        "after removing the snapshot and cleaning: {after} bytes, {before} before it"
    );
    assert!(store.read(oid, 0, new.len()).unwrap() == new);
}

/// A store reopened keeps its snapshots (from the superblock's table, or
/// from the intent log when no commit came after them).
#[test]
fn snapshots_survive_reopening_from_the_table_and_from_the_log() {
    for scheme in harness::SCHEMES {
        snapshots_survive_reopening_from_the_table_and_from_the_log_with(scheme);
    }
}

fn snapshots_survive_reopening_from_the_table_and_from_the_log_with(scheme: u8) {
    let options = harness::options(33);
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, vault) = harness::create_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
    let oid = store.create_object(b"").unwrap();
    store.write(oid, 0, b"first").unwrap();
    store.snapshot_create("one", Some(4_000_000_000)).unwrap();
    store.commit().unwrap();
    store.write(oid, 0, b"second").unwrap();
    store.snapshot_create("two", None).unwrap();
    store.write(oid, 0, b"third!").unwrap();
    store.flush().unwrap();
    drop(store);
    let store = Store::open(medium as Arc<dyn Medium>, vault, options).unwrap();
    let names: Vec<_> = store.snapshots().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["one", "two"]);
    assert_eq!(store.snapshots()[0].expires_at, Some(4_000_000_000));
    assert_eq!(
        store.snapshot("one").unwrap().read(oid, 0, 6).unwrap(),
        b"first"
    );
    assert_eq!(
        store.snapshot("two").unwrap().read(oid, 0, 6).unwrap(),
        b"second"
    );
    assert_eq!(store.read(oid, 0, 6).unwrap(), b"third!");
    assert_eq!(store.expire_snapshots(4_000_000_000).unwrap(), ["one"]);
    assert_eq!(store.snapshots().len(), 1);
}

/// `snapshot rm --purge` in one step (`Store::snapshot_remove_and_commit`,
/// no intent-log write before the commit): the data only the snapshot held
/// does not open for the adversary with every byte ever written and the
/// current vault, the removal survives reopening, and the live data opens.
#[test]
fn removing_and_committing_in_one_step_erases_and_is_durable() {
    for scheme in harness::SCHEMES {
        removing_and_committing_in_one_step_erases_and_is_durable_with(scheme);
    }
}

fn removing_and_committing_in_one_step_erases_and_is_durable_with(scheme: u8) {
    let options = harness::options(33);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let old = store.create_object(b"").unwrap();
    store.write(old, 0, &marker::data(1, 200_000)).unwrap();
    let kept = store.create_object(b"").unwrap();
    store.write(kept, 0, &marker::data(2, 200_000)).unwrap();
    store.snapshot_create("v1", None).unwrap();
    store.delete(old).unwrap();
    store.commit().unwrap();
    let seize = || {
        Adversary::seize(&recording)
            .recovered_markers(&[vault.load().unwrap()], options.provider.clone())
    };
    let only_v1: BTreeSet<Marker> = (0..200_000 / marker::BLOCK)
        .map(|b| (1, b as u32))
        .collect();
    assert!(
        only_v1.is_subset(&seize()),
        "held by the snapshot until removed"
    );

    let epoch = store.epoch();
    store.snapshot_remove_and_commit("v1").unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    let after = seize();
    assert!(
        after.is_disjoint(&only_v1),
        "the removed snapshot's data opens"
    );
    assert!((0..200_000 / marker::BLOCK).all(|b| after.contains(&(2, b as u32))));
    assert!(matches!(
        store.snapshot_remove_and_commit("v1"),
        Err(oubli_core::Error::NoSnapshot(_))
    ));
    drop(store);
    let store = Store::open(
        recording.clone() as Arc<dyn Medium>,
        vault.clone() as Arc<dyn Vault>,
        options.clone(),
    )
    .unwrap();
    assert!(store.snapshots().is_empty());
}
