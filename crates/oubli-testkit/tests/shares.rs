//! Key shares against the adversary: destroying a share erases its data everywhere at once, even for whoever kept every main-vault key ever written.

use oubli_core::{Error, Medium, ShareRecord, Store, Vault, VaultRecord};
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::gate::GateProvider;
use oubli_testkit::marker::{self, Marker};
use oubli_testkit::{harness, Adversary};
use oubli_vault::{FlakyVault, MemoryVault};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

fn markers(data: &[u8]) -> BTreeSet<Marker> {
    let mut out = BTreeSet::new();
    marker::scan(data, &mut out);
    out
}

/// The share vaults a test can reach, by address.
type Reachable = Arc<Mutex<Vec<(String, Arc<MemoryVault>)>>>;

/// An opener that reaches the share vaults of a test (by address).
fn opener(vaults: Reachable) -> Arc<oubli_core::ShareOpener> {
    Arc::new(move |share: &ShareRecord| {
        let vaults = vaults.lock().unwrap();
        let (_, v) = vaults
            .iter()
            .find(|(address, _)| *address == share.vault)
            .ok_or_else(|| format!("no vault at {}", share.vault))?;
        Ok(Box::new(v.clone()) as Box<dyn Vault>)
    })
}

/// Data placed under a share: readable while the share's vault is there,
/// in the live store and in a snapshot; after `share_destroy` the adversary
/// holding every byte the medium ever held, every main-vault key ever
/// written and the share vault's current content opens none of it, while
/// data outside the share still opens. A control that kept a copy of the
/// share's key before the destruction recovers it.
#[test]
fn a_destroyed_share_erases_its_data_even_from_every_old_main_key() {
    for scheme in harness::SCHEMES {
        a_destroyed_share_erases_its_data_even_from_every_old_main_key_with(scheme);
    }
}

fn a_destroyed_share_erases_its_data_even_from_every_old_main_key_with(scheme: u8) {
    let options = harness::options(41);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let share_vault = Arc::new(MemoryVault::empty());
    let sv = share_vault.clone();
    let info = store
        .share_create("tenant-a", "mem:tenant-a", move |record: &VaultRecord| {
            sv.store(record)?;
            Ok(sv)
        })
        .unwrap();
    assert_eq!((info.id, info.open), (1, true));

    let secret = marker::data(1, 300_000);
    let plain = marker::data(2, 200_000);
    let a = store.create_object(b"").unwrap();
    store.set_share(a, "tenant-a").unwrap();
    store.write(a, 0, &secret).unwrap();
    let b = store.create_object(b"").unwrap();
    store.write(b, 0, &plain).unwrap();
    store.commit().unwrap();
    store.snapshot_create("before", None).unwrap();
    // More writes to the shared object, flushed (in the log) and committed.
    store.write(a, 100_000, &marker::data(3, 50_000)).unwrap();
    store.flush().unwrap();
    store.commit().unwrap();
    assert_eq!(store.share_of(a).unwrap().as_deref(), Some("tenant-a"));
    assert_eq!(store.share_of(b).unwrap(), None);
    // An object with data cannot be placed under a share afterwards.
    assert!(matches!(
        store.set_share(b, "tenant-a"),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        store.set_share(b, "nobody"),
        Err(Error::NoShare(_))
    ));
    let view = store.snapshot("before").unwrap();
    assert!(view.read(a, 0, secret.len()).unwrap() == secret);
    let key_copy = share_vault.load().unwrap();

    // Before the destruction: with the share key, everything opens; without
    // it, nothing under the share does, even with every main key.
    let adversary = Adversary::seize(&recording);
    let all_main_keys = vault.history();
    let with_share = adversary.recovered_markers_with_shares(
        &all_main_keys,
        &[(1, key_copy.key.clone())],
        options.provider.clone(),
    );
    let secret_markers = markers(&secret);
    assert!(secret_markers.is_subset(&with_share));
    let without_share = adversary.recovered_markers(&all_main_keys, options.provider.clone());
    assert!(without_share.is_disjoint(&secret_markers));
    assert!(markers(&plain).is_subset(&without_share));

    store.share_destroy("tenant-a", &*share_vault).unwrap();
    assert!(matches!(
        store.read(a, 0, 10),
        Err(Error::ShareDestroyed(name)) if name == "tenant-a"
    ));
    assert!(matches!(
        store.snapshot("before").unwrap().read(a, 0, 10),
        Err(Error::ShareDestroyed(_))
    ));
    assert!(store.read(b, 0, plain.len()).unwrap() == plain);
    // The share vault holds a random key now, and nothing older.
    let held = share_vault.readable_records().unwrap();
    assert_eq!(held.len(), 1);
    assert_ne!(held[0].key, key_copy.key);

    // Every past medium state, every main key ever, the share vault now.
    let adversary = Adversary::seize(&recording);
    let recovered = adversary.recovered_markers_with_shares(
        &vault.history(),
        &[(1, held[0].key.clone())],
        options.provider.clone(),
    );
    assert!(
        recovered.is_disjoint(&secret_markers),
        "destroyed share's data opened"
    );
    assert!(recovered.is_disjoint(&markers(&marker::data(3, 50_000))));
    assert!(markers(&plain).is_subset(&recovered));
    // Control: a copy of the share's key from before opens it all.
    let control = adversary.recovered_markers_with_shares(
        &vault.history(),
        &[(1, key_copy.key.clone())],
        options.provider.clone(),
    );
    assert!(secret_markers.is_subset(&control));
    // Erased on purpose is not damage.
    let report = store.fsck(&mut |_| {}).unwrap();
    assert_eq!(report.problems, Vec::<String>::new());
}

/// A share whose vault cannot be reached: its data reads as an error that
/// names the share and the vault; everything else works. Once the vault is
/// back, the data reads. Shares survive reopening (the catalog).
#[test]
fn an_unreachable_share_vault_fails_only_its_data() {
    for scheme in harness::SCHEMES {
        an_unreachable_share_vault_fails_only_its_data_with(scheme);
    }
}

fn an_unreachable_share_vault_fails_only_its_data_with(scheme: u8) {
    let options = harness::options(42);
    let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
    let (store, vault) = harness::create_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
    let share_vault = Arc::new(MemoryVault::empty());
    let sv = share_vault.clone();
    store
        .share_create("case-17", "usb-token-17", move |record: &VaultRecord| {
            sv.store(record)?;
            Ok(sv)
        })
        .unwrap();
    let a = store.create_object(b"").unwrap();
    store.set_share(a, "case-17").unwrap();
    store.write(a, 0, b"privileged").unwrap();
    let b = store.create_object(b"").unwrap();
    store.write(b, 0, b"public").unwrap();
    store.flush().unwrap();
    drop(store);

    // Reopened without the share vault.
    let reachable = Arc::new(Mutex::new(Vec::new()));
    let store = Store::open(
        medium.clone() as Arc<dyn Medium>,
        vault.clone(),
        options.clone(),
    )
    .unwrap();
    store.set_share_opener(opener(reachable.clone()));
    match store.read(a, 0, 10) {
        Err(Error::ShareUnavailable { name, vault, .. }) => {
            assert_eq!((name.as_str(), vault.as_str()), ("case-17", "usb-token-17"))
        }
        other => panic!("expected ShareUnavailable, got {other:?}"),
    }
    assert!(store.write(a, 0, b"x").is_err());
    assert_eq!(store.read(b, 0, 6).unwrap(), b"public");
    assert_eq!(store.shares()[0].name, "case-17");
    assert!(!store.shares()[0].open);
    // The token is plugged in.
    reachable
        .lock()
        .unwrap()
        .push(("usb-token-17".to_string(), share_vault.clone()));
    assert_eq!(store.read(a, 0, 10).unwrap(), b"privileged");
    assert!(store.shares()[0].open);
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium as Arc<dyn Medium>, vault, options).unwrap();
    store.set_share_opener(opener(reachable));
    assert_eq!(store.read(a, 0, 10).unwrap(), b"privileged");
    assert_eq!(store.objects().unwrap().len(), 3);
}

/// A long workload with snapshots and shares (created, used, destroyed)
/// among writes, deletes and cleaner runs: after every few commits the
/// adversary holds every byte ever written, the vault and every share
/// vault's content; nothing deleted or under a destroyed share opens,
/// everything live does, and the store matches the model.
#[test]
fn shares_and_snapshots_under_the_adversary_for_many_epochs() {
    for scheme in harness::SCHEMES {
        shares_and_snapshots_under_the_adversary_for_many_epochs_with(scheme);
    }
}

fn shares_and_snapshots_under_the_adversary_for_many_epochs_with(scheme: u8) {
    use oubli_testkit::adversary::check_promise;
    use oubli_testkit::workload::{Runner, Step, Workload};
    let options = harness::options(43);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let workload = Workload::with_shares(43, 1400, 64 * 1024, 25);
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&store, step).expect("step");
        if *step == Step::Commit && runner.commits % 3 == 0 {
            check_promise(&recording, &*vault, &runner, options.provider.clone());
        }
    }
    store.commit().unwrap();
    runner.note_commit();
    check_promise(&recording, &*vault, &runner, options.provider.clone());
    assert_eq!(runner.model.diff(&store), None);
    let mut under_destroyed = BTreeSet::new();
    let snapshots = runner.model.snapshots.values().flat_map(|s| s.iter());
    for (oid, data) in runner.model.objects.iter().chain(snapshots) {
        if runner.model.destroyed.contains(oid) {
            marker::scan(data, &mut under_destroyed);
        }
    }
    println!(
        "shares: {} epochs, {} shares ({} destroyed), {} objects under destroyed shares holding {} marker blocks, none recovered",
        runner.commits,
        runner.shares.len(),
        runner.shares.iter().filter(|s| s.2).count(),
        runner.model.destroyed.len(),
        under_destroyed.len()
    );
    assert!(runner.commits >= 20);
    assert!(runner.shares.iter().filter(|s| s.2).count() >= 3);
    assert!(under_destroyed.len() > 50, "{}", under_destroyed.len());
    assert!(under_destroyed.is_subset(&runner.erased));
    assert_eq!(
        store.fsck(&mut |_| {}).unwrap().problems,
        Vec::<String>::new()
    );
}

/// Issue 39, item 4: a large write seals its whole cells outside the engine
/// lock, under the share its object had then; `set_share` accepts the object
/// meanwhile (it holds no data yet). Held at the gate between the sealing
/// and the lock, the write must not land cells sealed without the share in
/// an object now under it: every byte reads back, and destroying the share
/// makes all of it unrecoverable, even with every main key ever written.
#[test]
fn a_share_placed_while_a_large_write_seals_covers_all_its_cells() {
    for scheme in harness::SCHEMES {
        a_share_placed_while_a_large_write_seals_covers_all_its_cells_with(scheme);
    }
}

fn a_share_placed_while_a_large_write_seals_covers_all_its_cells_with(scheme: u8) {
    let mut options = harness::options(47);
    let gate = Arc::new(GateProvider::new(options.provider.clone()));
    options.provider = gate.clone();
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let store = Arc::new(store);
    let share_vault = Arc::new(MemoryVault::empty());
    let sv = share_vault.clone();
    store
        .share_create("tenant", "mem:tenant", move |record: &VaultRecord| {
            sv.store(record)?;
            Ok(sv)
        })
        .unwrap();
    let oid = store.create_object(b"").unwrap();
    let secret = marker::data(1, 8 * harness::TEST_CELL as usize);
    gate.hold();
    let writer = {
        let (store, secret) = (store.clone(), secret.clone());
        std::thread::spawn(move || store.write(oid, 0, &secret))
    };
    // The writer has sealed (or is sealing) its cells without the share.
    gate.wait_for_waiters(1);
    store.set_share(oid, "tenant").unwrap();
    gate.release();
    writer.join().unwrap().unwrap();

    assert_eq!(store.share_of(oid).unwrap().as_deref(), Some("tenant"));
    let read = store.read(oid, 0, secret.len()).unwrap_or_else(|e| {
        panic!(
            "{}: acknowledged data lost: {e}",
            harness::scheme_name(scheme)
        )
    });
    assert!(
        read == secret,
        "{}: data differs",
        harness::scheme_name(scheme)
    );
    store.commit().unwrap();
    assert!(store.read(oid, 0, secret.len()).unwrap() == secret);

    store.share_destroy("tenant", &*share_vault).unwrap();
    assert!(matches!(
        store.read(oid, 0, 10),
        Err(Error::ShareDestroyed(_))
    ));
    let held = share_vault.readable_records().unwrap();
    let recovered = Adversary::seize(&recording).recovered_markers_with_shares(
        &vault.history(),
        &[(1, held[0].key.clone())],
        options.provider.clone(),
    );
    assert!(
        recovered.is_disjoint(&markers(&secret)),
        "{}: cells of the destroyed share's object opened",
        harness::scheme_name(scheme)
    );
}

/// Issue 39, item 3: a share destruction cut between the share vault's two
/// steps (the random key in, the old record not yet erased, the store not
/// told). The retry finishes it; until the old record is erased the share
/// is reported (`share_leftovers`, `status`); a later process's open of the
/// share vault erases it; and once it is gone, an adversary holding the
/// vault's whole content and every main key opens nothing under the share.
#[test]
fn a_share_destruction_cut_between_its_vault_steps_is_finished_and_reported() {
    for scheme in harness::SCHEMES {
        a_share_destruction_cut_between_its_vault_steps_is_finished_and_reported_with(scheme);
    }
}

fn a_share_destruction_cut_between_its_vault_steps_is_finished_and_reported_with(scheme: u8) {
    let name = harness::scheme_name(scheme);
    let options = harness::options(49);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let share_vault = Arc::new(FlakyVault::new(MemoryVault::empty()));
    let sv = share_vault.clone();
    store
        .share_create("tenant", "mem:tenant", move |record: &VaultRecord| {
            sv.store(record)?;
            Ok(sv)
        })
        .unwrap();
    let secret = marker::data(1, 100_000);
    let oid = store.create_object(b"").unwrap();
    store.set_share(oid, "tenant").unwrap();
    store.write(oid, 0, &secret).unwrap();
    store.commit().unwrap();

    // The cut: the random key is in, the old record stays, the call fails.
    share_vault.cut_between_steps_next_store();
    share_vault.fail_erase(true);
    assert!(store.share_destroy("tenant", &*share_vault).is_err());
    assert_eq!(share_vault.readable_records().unwrap().len(), 2);
    let leftovers = store.share_leftovers();
    assert_eq!(leftovers.len(), 1, "{name}: the leftover is reported");
    assert_eq!(leftovers[0].name, "tenant");
    assert_eq!(store.status().unwrap().share_leftovers, leftovers);
    // A retry while the vault still cannot erase fails and says so again.
    assert!(store.share_destroy("tenant", &*share_vault).is_err());
    assert_eq!(store.share_leftovers().len(), 1);

    // A new process: opening the share vault (to read the data) erases it.
    drop(store);
    share_vault.fail_erase(false);
    let store = Store::open(
        recording.clone() as Arc<dyn Medium>,
        vault.clone(),
        options.clone(),
    )
    .unwrap();
    let flaky = share_vault.clone();
    store.set_share_opener(Arc::new(move |_: &ShareRecord| {
        Ok(Box::new(flaky.clone()) as Box<dyn Vault>)
    }));
    assert!(matches!(
        store.read(oid, 0, 10),
        Err(Error::ShareDestroyed(_))
    ));
    assert_eq!(
        share_vault.readable_records().unwrap().len(),
        1,
        "{name}: the open of the share vault erased the old record"
    );
    assert!(store.share_leftovers().is_empty());

    // The retry finishes the destruction (it was refused: "does not hold share").
    store
        .share_destroy("tenant", &*share_vault)
        .unwrap_or_else(|e| panic!("{name}: the retried destruction failed: {e}"));
    assert!(store.shares()[0].destroyed_at.is_some());
    let held = share_vault.readable_records().unwrap();
    let recovered = Adversary::seize(&recording).recovered_markers_with_shares(
        &vault.history(),
        &[(1, held[0].key.clone())],
        options.provider.clone(),
    );
    assert!(
        recovered.is_disjoint(&markers(&secret)),
        "{name}: data under the destroyed share opened"
    );
}
