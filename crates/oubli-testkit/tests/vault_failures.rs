//! A vault that fails, is unreachable or returns garbage at commit time never costs data.

use oubli_core::{Error, Medium, Store, Vault};
use oubli_media::{MemMedium, RecordingMedium, TearMode};
use oubli_testkit::workload::{Runner, Step};
use oubli_testkit::{harness, Adversary};
use oubli_vault::{FlakyVault, MemoryVault};
use std::sync::Arc;

struct Setup {
    medium: Arc<RecordingMedium<MemMedium>>,
    vault: Arc<FlakyVault<MemoryVault>>,
    store: Store,
    runner: Runner,
    options: oubli_core::Options,
}

fn setup(scheme: u8) -> Setup {
    let options = harness::options(5);
    let medium = Arc::new(RecordingMedium::new(MemMedium::new()));
    let (store, vault) =
        harness::create_flaky_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
    let mut runner = Runner::default();
    for step in [
        Step::Create,
        Step::Write {
            pick: 0,
            off: 0,
            len: 30_000,
        },
        Step::Create,
        Step::Write {
            pick: 1,
            off: 0,
            len: 30_000,
        },
        Step::Commit,
        Step::Delete { pick: 0 },
        Step::Write {
            pick: 0,
            off: 5_000,
            len: 10_000,
        },
        Step::Flush,
    ] {
        runner.step(&store, &step).unwrap();
    }
    Setup {
        medium,
        vault,
        store,
        runner,
        options,
    }
}

impl Setup {
    /// Cuts the power now and reopens (the open's error returned); checks
    /// the acknowledged state.
    fn crash_and_reopen_checked(&self) -> Result<Store, Error> {
        let crashed = Arc::new(self.medium.inner().crash(TearMode::DropUnsynced, 1));
        let store = Store::open(
            crashed as Arc<dyn Medium>,
            self.vault.clone(),
            self.options.clone(),
        )?;
        assert_eq!(self.runner.acked.diff(&store), None);
        Ok(store)
    }

    /// Cuts the power now and reopens; checks the acknowledged state.
    fn crash_and_reopen(&self) -> Store {
        let crashed = Arc::new(self.medium.inner().crash(TearMode::DropUnsynced, 1));
        let store = Store::open(
            crashed as Arc<dyn Medium>,
            self.vault.clone(),
            self.options.clone(),
        )
        .unwrap();
        assert_eq!(self.runner.acked.diff(&store), None);
        store
    }

    fn assert_erased(&self) {
        let adversary = Adversary::seize(&self.medium);
        let held = self.vault.readable_records().unwrap();
        let recovered = adversary.recovered_markers(&held, self.options.provider.clone());
        assert!(recovered.is_disjoint(&self.runner.erased));
    }
}

#[test]
fn failed_vault_write_keeps_the_epoch_open_and_loses_nothing() {
    for scheme in harness::SCHEMES {
        failed_vault_write_keeps_the_epoch_open_and_loses_nothing_with(scheme);
    }
}

fn failed_vault_write_keeps_the_epoch_open_and_loses_nothing_with(scheme: u8) {
    let mut s = setup(scheme);
    let epoch = s.store.epoch();
    s.vault.fail_next_stores(1);
    assert!(matches!(s.store.commit(), Err(Error::Vault(_))));
    assert_eq!(s.store.epoch(), epoch, "the epoch stays open");
    // Writes go on and are durable while the commit is pending.
    s.runner
        .step(
            &s.store,
            &Step::Write {
                pick: 0,
                off: 0,
                len: 4_000,
            },
        )
        .unwrap();
    s.runner.step(&s.store, &Step::Flush).unwrap();
    drop(s.crash_and_reopen());
    // The retry commits, and only then is the deletion erased.
    s.runner.step(&s.store, &Step::Commit).unwrap();
    assert_eq!(s.store.epoch(), epoch + 1);
    s.assert_erased();
}

#[test]
fn vault_written_but_reporting_failure_counts_as_committed() {
    for scheme in harness::SCHEMES {
        vault_written_but_reporting_failure_counts_as_committed_with(scheme);
    }
}

fn vault_written_but_reporting_failure_counts_as_committed_with(scheme: u8) {
    let mut s = setup(scheme);
    let epoch = s.store.epoch();
    s.vault.fail_after_write_next_store();
    s.runner.step(&s.store, &Step::Commit).unwrap();
    assert_eq!(s.store.epoch(), epoch + 1);
    s.assert_erased();
    // Crash during that rotation: the store opens at the new epoch.
    let reopened = s.crash_and_reopen();
    assert_eq!(reopened.epoch(), epoch + 1);
}

#[test]
fn unreachable_vault_blocks_durability_until_it_answers() {
    for scheme in harness::SCHEMES {
        unreachable_vault_blocks_durability_until_it_answers_with(scheme);
    }
}

fn unreachable_vault_blocks_durability_until_it_answers_with(scheme: u8) {
    let mut s = setup(scheme);
    let epoch = s.store.epoch();
    s.vault.unavailable(true);
    assert!(matches!(s.store.commit(), Err(Error::VaultStateUnknown(_))));
    // A flush now could be lost (the vault may hold the next key): refused, not acknowledged.
    s.runner
        .step(
            &s.store,
            &Step::Write {
                pick: 0,
                off: 0,
                len: 100,
            },
        )
        .unwrap();
    assert!(matches!(s.store.flush(), Err(Error::VaultStateUnknown(_))));
    s.vault.unavailable(false);
    // Once the vault answers (it still holds the old key), work resumes.
    s.runner.step(&s.store, &Step::Flush).unwrap();
    assert_eq!(s.store.epoch(), epoch);
    s.runner.step(&s.store, &Step::Commit).unwrap();
    s.assert_erased();
    drop(s.crash_and_reopen());
}

#[test]
fn garbage_from_the_vault_is_an_error_never_data() {
    for scheme in harness::SCHEMES {
        garbage_from_the_vault_is_an_error_never_data_with(scheme);
    }
}

fn garbage_from_the_vault_is_an_error_never_data_with(scheme: u8) {
    let s = setup(scheme);
    s.vault.garbage_on_next_load();
    let crashed = Arc::new(s.medium.inner().crash(TearMode::DropUnsynced, 1));
    match Store::open(
        crashed as Arc<dyn Medium>,
        s.vault.clone(),
        s.options.clone(),
    ) {
        Err(Error::Corrupt(_)) => {}
        Err(e) => panic!("expected an integrity error, got {e}"),
        Ok(_) => panic!("a garbage key opened the store"),
    }
    // The vault itself is intact: the next load opens the store.
    assert_eq!(s.runner.acked.diff(&s.crash_and_reopen()), None);
}

#[test]
fn refuse_writes_policy_stops_changes_until_a_commit_lands() {
    for scheme in harness::SCHEMES {
        refuse_writes_policy_stops_changes_until_a_commit_lands_with(scheme);
    }
}

fn refuse_writes_policy_stops_changes_until_a_commit_lands_with(scheme: u8) {
    let mut s = setup(scheme);
    // Reopen (a copy of the medium) under the refuse-writes policy.
    s.options.vault_failure = oubli_core::VaultFailurePolicy::RefuseWrites;
    let store = Store::open(
        Arc::new(s.medium.inner().clone_state()) as Arc<dyn Medium>,
        s.vault.clone(),
        s.options.clone(),
    )
    .unwrap();
    s.vault.unavailable(true);
    assert!(store.commit().is_err());
    // New changes are refused, reads still work.
    assert!(matches!(
        store.create_object(b""),
        Err(Error::WritesRefused(_))
    ));
    assert!(matches!(store.delete(3), Err(Error::WritesRefused(_))));
    assert!(store.read(3, 0, 10).is_ok());
    s.vault.unavailable(false);
    // An explicit commit lands and writes resume.
    store.commit().unwrap();
    let oid = store.create_object(b"").unwrap();
    store.write(oid, 0, b"after").unwrap();
    assert_eq!(store.read(oid, 0, 5).unwrap(), b"after");
}

/// Issue 9 item 4: while a rotation's outcome is unknown, writes, deletions
/// and object growth are still accepted in memory; when the vault answers
/// that the new key is in, none of them may be lost: they go to the new
/// epoch's log (the next flush is acknowledged only once they are durable)
/// and the deletions stay pending until the next commit erases them.
#[test]
fn operations_accepted_while_the_outcome_is_unknown_are_kept_and_erased_later() {
    for scheme in harness::SCHEMES {
        operations_accepted_while_the_outcome_is_unknown_are_kept_and_erased_later_with(scheme);
    }
}

fn operations_accepted_while_the_outcome_is_unknown_are_kept_and_erased_later_with(scheme: u8) {
    let mut s = setup(scheme);
    let epoch = s.store.epoch();
    // The vault takes the new key but its answer is lost, and the engine's
    // question afterwards gets a record it cannot place: outcome unknown.
    s.vault.fail_after_write_next_store();
    s.vault.garbage_on_next_load();
    assert!(matches!(s.store.commit(), Err(Error::VaultStateUnknown(_))));
    let before = s.store.status().unwrap().pending_deletions;
    for step in [
        Step::Delete { pick: 1 },
        Step::Create,
        Step::Write {
            pick: 1,
            off: 0,
            len: 20_000,
        },
        Step::Write {
            pick: 0,
            off: 0,
            len: 3_000,
        },
    ] {
        s.runner.step(&s.store, &step).unwrap();
    }
    // The vault answers again: it holds the new key, so the commit happened.
    s.runner.step(&s.store, &Step::Flush).unwrap();
    assert_eq!(s.store.epoch(), epoch + 1);
    let status = s.store.status().unwrap();
    assert!(
        status.pending_deletions >= 2,
        "the deletion and the overwrite made meanwhile are pending, got {} (was {before})",
        status.pending_deletions
    );
    // Acknowledged by that flush: a power cut keeps all of it.
    drop(s.crash_and_reopen());
    // The next commit erases what was deleted while the outcome was unknown.
    s.runner.step(&s.store, &Step::Commit).unwrap();
    s.assert_erased();
    drop(s.crash_and_reopen());
}

/// Issue 9 item 4: a commit that fails at the vault must not forget which
/// objects grew, or the next flush logs their data without their size.
#[test]
fn a_failed_commit_does_not_forget_grown_sizes() {
    for scheme in harness::SCHEMES {
        a_failed_commit_does_not_forget_grown_sizes_with(scheme);
    }
}

fn a_failed_commit_does_not_forget_grown_sizes_with(scheme: u8) {
    let mut s = setup(scheme);
    s.runner
        .step(
            &s.store,
            &Step::Write {
                pick: 1,
                off: 30_000,
                len: 9_000,
            },
        )
        .unwrap();
    s.vault.fail_next_stores(1);
    assert!(matches!(s.store.commit(), Err(Error::Vault(_))));
    s.runner.step(&s.store, &Step::Flush).unwrap();
    drop(s.crash_and_reopen());
}

/// Issue 39, item 6: an open whose recovery commit (a log to replay) meets
/// an old vault record it cannot erase — a leftover of an earlier cut
/// rotation, or its own rotation cut between its two steps — still opens
/// (DESIGN §6: a leftover must not stop the open) with every acknowledged
/// write, and reports the leftover until a later commit erases it.
#[test]
fn a_recovery_commit_that_cannot_erase_a_leftover_still_opens() {
    for scheme in harness::SCHEMES {
        for own_rotation_cut in [false, true] {
            a_recovery_commit_that_cannot_erase_a_leftover_still_opens_with(
                scheme,
                own_rotation_cut,
            );
        }
    }
}

fn a_recovery_commit_that_cannot_erase_a_leftover_still_opens_with(
    scheme: u8,
    own_rotation_cut: bool,
) {
    let mut s = setup(scheme);
    if own_rotation_cut {
        // The recovery commit's own rotation stops between its steps.
        s.vault.cut_between_steps_next_store();
    } else {
        // An earlier rotation was cut; the store keeps running.
        s.vault.cut_between_steps_next_store();
        s.vault.fail_erase(true);
        assert!(matches!(
            s.store.commit(),
            Err(Error::ErasureIncomplete { .. })
        ));
        s.runner.acked = s.runner.model.clone();
        s.runner.note_commit();
        // Something in the new epoch's log for the open to replay.
        for step in [
            Step::Write {
                pick: 0,
                off: 1_000,
                len: 4_000,
            },
            Step::Flush,
        ] {
            s.runner.step(&s.store, &step).unwrap();
        }
    }
    s.vault.fail_erase(true);
    let epoch_before = s.store.status().unwrap().epoch;
    let reopened = s.crash_and_reopen_checked().unwrap_or_else(|e| {
        panic!(
            "{} (own rotation cut: {own_rotation_cut}): the open failed: {e}",
            harness::scheme_name(scheme)
        )
    });
    let status = reopened.status().unwrap();
    assert!(status.epoch > epoch_before, "the recovery commit happened");
    if own_rotation_cut {
        // (An earlier leftover is overwritten by the recovery commit's
        // rotation, as a file or TPM vault's is: only a cut one leaves
        // the previous key readable.)
        assert!(s.vault.readable_records().unwrap().len() > 1);
        assert!(
            !status.vault_leftover_epochs.is_empty(),
            "the leftover is reported"
        );
    }
    // Once the vault can erase again, the next commit finishes the job.
    s.vault.fail_erase(false);
    reopened.commit().unwrap();
    assert!(reopened.status().unwrap().vault_leftover_epochs.is_empty());
    assert_eq!(s.vault.readable_records().unwrap().len(), 1);
    if own_rotation_cut {
        s.runner.note_commit();
    }
    s.assert_erased();
}
