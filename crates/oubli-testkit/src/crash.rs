//! The crash sweep: cut the power at every I/O point of a workload, reopen, and check both halves of the guarantee.

use crate::adversary::{check_no_rederivation, Adversary};
use crate::harness;
use crate::vault::RecordingVault;
use crate::workload::{Runner, Step, Workload};
use oubli_core::{Medium, Options, Store, Vault, VaultRecord};
use oubli_media::{Fault, FaultMedium, MemMedium, RecordingMedium, TearMode};
use std::sync::Arc;

type Stack = FaultMedium<RecordingMedium<MemMedium>>;

/// How one cut point is exercised.
#[derive(Clone, Copy, Debug)]
pub struct CutMode {
    pub fault: Fault,
    pub tear: TearMode,
    /// The medium keeps appends in order ([`MemMedium::in_order`], as the
    /// S3 medium does): the engine's flush is then one sync, and `tear`
    /// must be one that keeps a prefix of the pending writes.
    pub in_order: bool,
}

/// The medium under a sweep: power cuts and tears over a recording of every
/// byte, over memory (in order or not).
fn stack(in_order: bool) -> Arc<Stack> {
    let mem = MemMedium::with_segment_capacity(harness::TEST_SEGMENT);
    let mem = if in_order { mem.in_order() } else { mem };
    Arc::new(FaultMedium::new(RecordingMedium::new(mem)))
}

/// What one cut left behind, for the caller's bookkeeping.
pub struct CutOutcome {
    /// The workload ran to completion without reaching the cut.
    pub completed: bool,
    pub steps_run: usize,
}

/// Runs the workload on a fresh store, cutting the power at I/O point
/// `point` (counted after the store was created), crashes the medium with
/// `mode`, reopens it and checks:
/// * the store opens;
/// * its content equals the state acknowledged by the last flush or commit,
///   or the state of the flush/commit that was in flight;
/// * nothing deleted before the last successful commit opens for an
///   adversary holding every byte ever written plus the current vault.
///
/// Panics with a description of the violated property.
pub fn cut_at(
    workload: &Workload,
    seed: u64,
    scheme: u8,
    point: Option<u64>,
    mode: CutMode,
) -> CutOutcome {
    let options = harness::options(seed);
    let stack = stack(mode.in_order);
    let (store, vault) = harness::create_with(stack.clone() as Arc<dyn Medium>, &options, scheme);
    if let Some(p) = point {
        stack.arm(stack.points() + p, mode.fault);
    }
    let mut runner = Runner::default();
    let mut steps_run = 0;
    let mut cut = false;
    // The state before the step the cut hit: a call durable when it returns
    // (a snapshot taken, removed or redacted, a share created) first makes
    // durable what was accepted before it, then its own change, so a cut
    // between the two leaves this state (DESIGN §7, `apply_durably`).
    let mut before = vec![runner.model.clone()];
    for step in &workload.steps {
        steps_run += 1;
        before = vec![runner.model.clone()];
        if runner.step(&store, step).is_err() {
            if let Step::Redact { .. } = step {
                // A redaction deletes the object, then redacts the
                // snapshots, whose call makes the delete durable first: a
                // cut between the two leaves it gone from the live tree
                // only.
                let mut between = before[0].clone();
                between.objects = runner.model.objects.clone();
                before.push(between);
            }
            cut = true;
            break;
        }
    }
    if !cut {
        return CutOutcome {
            completed: true,
            steps_run,
        };
    }
    drop(store);
    verify_after_crash(
        &stack,
        &vault,
        (&runner, &before[..]),
        &options,
        (scheme, mode),
        seed ^ point.unwrap_or(0),
    );
    CutOutcome {
        completed: false,
        steps_run,
    }
}

/// Counts the I/O points of a workload after store creation, on an
/// in-order medium or not (flushes sync less on the former).
pub fn count_points(workload: &Workload, seed: u64, scheme: u8, in_order: bool) -> u64 {
    count_points_and_rewrites(workload, seed, scheme, in_order).0
}

/// [`count_points`], and whether the store rewrote any unit in place
/// (so that the sweep cuts rewrites too).
pub fn count_points_and_rewrites(
    workload: &Workload,
    seed: u64,
    scheme: u8,
    in_order: bool,
) -> (u64, bool) {
    let options = harness::options(seed);
    let stack = stack(in_order);
    let (store, _vault) = harness::create_with(stack.clone() as Arc<dyn Medium>, &options, scheme);
    let start = stack.points();
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&store, step).expect("workload without faults");
    }
    (stack.points() - start, stack.inner().rewrote())
}

/// The status of a fresh store after `workload` ran on it without faults:
/// what a sweep of the workload exercises (cells split and put back
/// whole, units rewritten in place).
pub fn status_after(workload: &Workload, seed: u64, scheme: u8) -> oubli_core::Status {
    let options = harness::options(seed);
    let stack = stack(false);
    let (store, _vault) = harness::create_with(stack as Arc<dyn Medium>, &options, scheme);
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&store, step).expect("workload without faults");
    }
    store.status().expect("status")
}

fn verify_after_crash(
    stack: &Stack,
    vault: &Arc<RecordingVault>,
    (runner, before): (&Runner, &[crate::Model]),
    options: &Options,
    (scheme, mode): (u8, CutMode),
    seed: u64,
) {
    let what = format!("a cut ({mode:?})");
    let (_store, crashed) = reopen_after_cut(
        stack.inner(),
        (mode.tear, seed),
        vault.clone(),
        (runner, before),
        options,
        &what,
    );
    // Everything the vault holds, not only its current record.
    let held = vault.readable_records().expect("vault");
    for adversary in [Adversary::seize(stack.inner()), Adversary::seize(&crashed)] {
        check_no_rederivation(
            &adversary,
            scheme,
            &vault.history(),
            &**vault,
            runner,
            options.provider.clone(),
        );
        assert_nothing_erased_opens(&adversary, &held, runner, options, &what);
    }
}

/// The recorded memory a vault-cut sweep runs on.
fn recorded_memory() -> Arc<RecordingMedium<MemMedium>> {
    Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )))
}

/// Crashes the memory under `recording` (`tear` deciding what unsynced
/// writes survive, `seed` where tears land), reopens the store on it with
/// the runner's share opener, and checks the store holds the acknowledged
/// state, the one in flight or one of `before` (states between the step in
/// flight's durable parts);
/// `what` names the cut in the panics. Returns the store and the crashed
/// medium (recorded, for the adversary).
fn reopen_after_cut(
    recording: &RecordingMedium<MemMedium>,
    (tear, seed): (TearMode, u64),
    vault: Arc<dyn Vault>,
    (runner, before): (&Runner, &[crate::Model]),
    options: &Options,
    what: &str,
) -> (Store, Arc<RecordingMedium<MemMedium>>) {
    let crashed = Arc::new(RecordingMedium::new(recording.inner().crash(tear, seed)));
    let store = Store::open(crashed.clone() as Arc<dyn Medium>, vault, options.clone())
        .unwrap_or_else(|e| panic!("store does not reopen after {what}: {e}"));
    store.set_share_opener(runner.share_opener());
    if let (Some(acked), Some(in_flight), true) = (
        runner.acked.diff(&store),
        runner.model.diff(&store),
        before.iter().all(|b| b.diff(&store).is_some()),
    ) {
        panic!(
            "after {what} the store matches neither the acknowledged state ({acked}) nor the in-flight one ({in_flight}) nor one between the step in flight's durable parts"
        );
    }
    (store, crashed)
}

/// Asserts that `adversary`, holding the vault records `held` and every
/// share vault's content too, opens nothing the runner erased (deleted
/// before the last commit, or under a destroyed share).
fn assert_nothing_erased_opens(
    adversary: &Adversary,
    held: &[VaultRecord],
    runner: &Runner,
    options: &Options,
    what: &str,
) {
    let recovered = adversary.recovered_markers_with_shares(
        held,
        &runner.share_keys(),
        options.provider.clone(),
    );
    let leaked: Vec<_> = recovered.intersection(&runner.erased).take(3).collect();
    assert!(
        leaked.is_empty(),
        "after {what} deleted or destroyed data opens: {leaked:?}"
    );
}

/// Runs the workload with a [`FlakyVault`] and cuts the `nth` commit's
/// rotation between its two vault steps: the new key is in, the old one
/// still readable, and the process dies there (its erasure of the old key
/// fails, then the medium loses power, dropping, tearing or keeping unsynced
/// writes per `tear`). The store must reopen at the new epoch with every
/// acknowledged write; the reopen must destroy the old key; and an
/// adversary holding every byte ever written plus *everything the vault
/// holds* must open nothing deleted before that commit. Returns `false` if
/// the workload has fewer than `nth + 1` commits.
pub fn cut_rotation(
    workload: &Workload,
    seed: u64,
    scheme: u8,
    nth: usize,
    tear: TearMode,
) -> bool {
    cut_rotation_at(workload, seed, scheme, nth, VaultCut::BetweenSteps, tear)
}

/// [`cut_rotation`] with the `nth` commit's vault write cut at `cut`:
/// before anything reached the vault (the commit fails, the epoch stays
/// open: the reopen finds the acknowledged state of that epoch), after the
/// whole write (the commit is done: the reopen is at the new epoch), or
/// between its two steps. In every case the reopened vault holds one
/// record and nothing committed as deleted opens.
pub fn cut_rotation_at(
    workload: &Workload,
    seed: u64,
    scheme: u8,
    nth: usize,
    cut: VaultCut,
    tear: TearMode,
) -> bool {
    let options = harness::options(seed);
    let recording = recorded_memory();
    let (store, vault) =
        harness::create_flaky_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let mut runner = Runner::default();
    let mut commits = 0;
    let mut struck = false;
    for step in &workload.steps {
        if *step == Step::Commit {
            if commits == nth {
                arm(&vault, cut);
                let committed = match (cut, store.commit()) {
                    (VaultCut::BetweenSteps, Err(oubli_core::Error::ErasureIncomplete { .. })) => {
                        assert!(
                            vault.readable_records().expect("vault").len() > 1,
                            "the cut left the old key readable"
                        );
                        true
                    }
                    (VaultCut::AfterWrite, Ok(())) => true,
                    (VaultCut::BeforeWrite, Err(oubli_core::Error::Vault(_))) => false,
                    (cut, other) => {
                        panic!("a rotation cut {cut:?} must not end with {other:?}")
                    }
                };
                if committed {
                    // The epoch did end: the new superblock holds everything.
                    runner.acked = runner.model.clone();
                    runner.note_commit();
                }
                struck = true;
                break;
            }
            commits += 1;
        }
        runner.step(&store, step).expect("workload step");
    }
    if !struck {
        return false;
    }
    drop(store);
    vault.fail_erase(false);
    let what = format!("a cut rotation ({cut:?}, {tear:?})");
    let (_reopened, crashed) = reopen_after_cut(
        &recording,
        (tear, seed),
        vault.clone(),
        (&runner, &[]),
        &options,
        &what,
    );
    let held = vault.readable_records().expect("vault");
    assert_eq!(
        held.len(),
        1,
        "the reopen left an older key in the vault ({cut:?}, {tear:?})"
    );
    // Deletions of the ended epoch must not open.
    for adversary in [Adversary::seize(&recording), Adversary::seize(&crashed)] {
        assert_nothing_erased_opens(&adversary, &held, &runner, &options, &what);
    }
    true
}

/// Where a vault write is cut: inside its steps or between them. Every real
/// vault writes a new record, then destroys the old one (DESIGN §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaultCut {
    /// The write fails before anything reaches the vault.
    BeforeWrite,
    /// The new record is in and the old one destroyed, but the call fails
    /// (the power went before the caller heard back).
    AfterWrite,
    /// The new record is in, the old one still readable, and the vault
    /// cannot destroy it until the process is gone.
    BetweenSteps,
}

pub const VAULT_CUTS: [VaultCut; 3] = [
    VaultCut::BeforeWrite,
    VaultCut::AfterWrite,
    VaultCut::BetweenSteps,
];

/// Arms `vault` so that its next `store` is cut at `cut`.
fn arm<V: Vault>(vault: &oubli_vault::FlakyVault<V>, cut: VaultCut) {
    match cut {
        VaultCut::BeforeWrite => vault.fail_next_stores(1),
        VaultCut::AfterWrite => vault.fail_after_write_next_store(),
        VaultCut::BetweenSteps => {
            vault.cut_between_steps_next_store();
            vault.fail_erase(true);
        }
    }
}

/// Runs the workload (which must destroy key shares) and cuts the `nth`
/// share destruction's write to the share vault at `cut`; the process dies
/// there (the medium loses power, `tear` deciding what unsynced writes
/// survive). The store must reopen with the acknowledged state (under a
/// share whose vault holds the random key, objects read as destroyed); a
/// retried `share_destroy` must finish (or, cut before the vault changed,
/// destroy the share for the first time); the share vault must then hold
/// nothing older; and an adversary holding every byte ever written, the
/// main vault's whole content and every share vault's must open nothing
/// deleted before the last commit and nothing under a destroyed share.
/// Returns `false` if the workload has fewer than `nth + 1` destructions.
pub fn cut_share_destroy(
    workload: &Workload,
    seed: u64,
    scheme: u8,
    nth: usize,
    cut: VaultCut,
    tear: TearMode,
) -> bool {
    let options = harness::options(seed);
    let recording = recorded_memory();
    let (store, vault) =
        harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let mut runner = Runner::default();
    let mut destroys = 0;
    let mut struck = None;
    for step in &workload.steps {
        if let Step::ShareDestroy { pick } = step {
            // The share the step picks (as `Runner::step` does).
            let live: Vec<usize> = (0..runner.shares.len())
                .filter(|&i| !runner.shares[i].2)
                .collect();
            if !live.is_empty() && destroys == nth {
                let picked = live[*pick as usize % live.len()];
                let destroyed_before = (
                    runner.model.destroyed.clone(),
                    runner.acked.destroyed.clone(),
                );
                arm(&runner.shares[picked].1, cut);
                // Told "failed" after the whole write, the engine asks the
                // vault and finishes; cut before or between, it fails.
                let done = runner.step(&store, step).is_ok();
                assert_eq!(
                    done,
                    cut == VaultCut::AfterWrite,
                    "a share destruction cut {cut:?}"
                );
                if cut == VaultCut::BeforeWrite {
                    // Nothing changed: the share is live, its data too.
                    runner.shares[picked].2 = false;
                    (runner.model.destroyed, runner.acked.destroyed) = destroyed_before;
                }
                struck = Some(picked);
                break;
            }
            if !live.is_empty() {
                destroys += 1;
            }
        }
        runner.step(&store, step).expect("workload step");
    }
    let Some(picked) = struck else {
        return false;
    };
    let (name, share_vault) = (
        runner.shares[picked].0.clone(),
        runner.shares[picked].1.clone(),
    );
    if cut == VaultCut::BetweenSteps {
        assert_eq!(
            share_vault.readable_records().expect("share vault").len(),
            2,
            "the cut left the share's key readable"
        );
    }
    drop(store);
    share_vault.fail_erase(false);
    let what = format!("a cut share destruction ({cut:?}, {tear:?})");
    let (reopened, crashed) = reopen_after_cut(
        &recording,
        (tear, seed),
        vault.clone(),
        (&runner, &[]),
        &options,
        &what,
    );
    // The retry finishes the job (the first try, if the vault never changed;
    // nothing is left to do if the call finished).
    if cut == VaultCut::BeforeWrite {
        let doomed: Vec<u64> = runner
            .model
            .share_of
            .iter()
            .filter(|(_, s)| **s == picked)
            .map(|(oid, _)| *oid)
            .collect();
        runner.model.destroyed.extend(&doomed);
        runner.shares[picked].2 = true;
    }
    if cut != VaultCut::AfterWrite {
        reopened
            .share_destroy(&name, &*share_vault)
            .unwrap_or_else(|e| {
                panic!("a retried share destruction failed ({cut:?}, {tear:?}): {e}")
            });
        runner.acked = runner.model.clone();
        runner.note_commit();
    }
    assert_eq!(
        runner.acked.diff(&reopened),
        None,
        "after the retry ({cut:?}, {tear:?})"
    );
    assert_eq!(
        share_vault.readable_records().expect("share vault").len(),
        1,
        "the share vault still holds an older record ({cut:?}, {tear:?})"
    );
    assert!(reopened.share_leftovers().is_empty());
    let held = vault.readable_records().expect("vault");
    for adversary in [Adversary::seize(&recording), Adversary::seize(&crashed)] {
        assert_nothing_erased_opens(&adversary, &held, &runner, &options, &what);
    }
    true
}
