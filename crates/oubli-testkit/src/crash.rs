//! The crash sweep: cut the power at every I/O point of a workload, reopen, and check both halves of the guarantee.

use crate::adversary::{check_no_rederivation, Adversary};
use crate::harness;
use crate::vault::RecordingVault;
use crate::workload::{Runner, Step, Workload};
use oubli_core::{Medium, Options, Store, Vault};
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
    for step in &workload.steps {
        steps_run += 1;
        if runner.step(&store, step).is_err() {
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
        &runner,
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

fn verify_after_crash(
    stack: &Stack,
    vault: &Arc<RecordingVault>,
    runner: &Runner,
    options: &Options,
    (scheme, mode): (u8, CutMode),
    seed: u64,
) {
    let crashed = Arc::new(RecordingMedium::new(
        stack.inner().inner().crash(mode.tear, seed),
    ));
    let store = Store::open(
        crashed.clone() as Arc<dyn Medium>,
        vault.clone(),
        options.clone(),
    )
    .unwrap_or_else(|e| panic!("store does not reopen after a cut ({mode:?}): {e}"));
    store.set_share_opener(runner.share_opener());
    if let (Some(acked), Some(in_flight)) = (runner.acked.diff(&store), runner.model.diff(&store)) {
        panic!(
            "after a cut ({mode:?}) the store matches neither the acknowledged state ({acked}) nor the in-flight one ({in_flight})"
        );
    }
    // Everything the vault holds, not only its current record.
    let held = vault.readable_records().expect("vault");
    // ...and every share vault's content.
    let shares = runner.share_keys();
    for adversary in [Adversary::seize(stack.inner()), Adversary::seize(&crashed)] {
        check_no_rederivation(
            &adversary,
            scheme,
            &vault.history(),
            &**vault,
            runner,
            options.provider.clone(),
        );
        let recovered =
            adversary.recovered_markers_with_shares(&held, &shares, options.provider.clone());
        let leaked: Vec<_> = recovered.intersection(&runner.erased).take(3).collect();
        assert!(
            leaked.is_empty(),
            "after a cut ({mode:?}) committed deletions are recoverable: {leaked:?}"
        );
    }
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
    let options = harness::options(seed);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) =
        harness::create_flaky_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
    let mut runner = Runner::default();
    let mut commits = 0;
    let mut cut = false;
    for step in &workload.steps {
        if *step == Step::Commit {
            if commits == nth {
                vault.cut_between_steps_next_store();
                vault.fail_erase(true);
                match store.commit() {
                    Err(oubli_core::Error::ErasureIncomplete { .. }) => {}
                    other => panic!("a cut rotation must report incomplete erasure, got {other:?}"),
                }
                assert!(
                    vault.readable_records().expect("vault").len() > 1,
                    "the cut left the old key readable"
                );
                // The epoch did end: the new superblock holds everything.
                runner.acked = runner.model.clone();
                runner.note_commit();
                cut = true;
                break;
            }
            commits += 1;
        }
        runner.step(&store, step).expect("workload step");
    }
    if !cut {
        return false;
    }
    drop(store);
    vault.fail_erase(false);
    let crashed = Arc::new(RecordingMedium::new(recording.inner().crash(tear, seed)));
    let reopened = Store::open(
        crashed.clone() as Arc<dyn Medium>,
        vault.clone(),
        options.clone(),
    )
    .unwrap_or_else(|e| panic!("store does not reopen after a cut rotation ({tear:?}): {e}"));
    assert_eq!(
        runner.acked.diff(&reopened),
        None,
        "a cut rotation ({tear:?}) lost acknowledged writes"
    );
    let held = vault.readable_records().expect("vault");
    assert_eq!(held.len(), 1, "the reopen left an older key in the vault");
    for adversary in [Adversary::seize(&recording), Adversary::seize(&crashed)] {
        let recovered = adversary.recovered_markers(&held, options.provider.clone());
        let leaked: Vec<_> = recovered.intersection(&runner.erased).take(3).collect();
        assert!(
            leaked.is_empty(),
            "after a cut rotation ({tear:?}) deletions of the ended epoch are recoverable: {leaked:?}"
        );
    }
    true
}
