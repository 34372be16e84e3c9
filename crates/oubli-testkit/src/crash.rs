//! The crash sweep: cut the power at every I/O point of a workload, reopen, and check both halves of the guarantee.

use crate::adversary::Adversary;
use crate::harness;
use crate::vault::RecordingVault;
use crate::workload::{Runner, Workload};
use oubli_core::{Medium, Options, Store, Vault};
use oubli_media::{Fault, FaultMedium, MemMedium, RecordingMedium, TearMode};
use std::sync::Arc;

type Stack = FaultMedium<RecordingMedium<MemMedium>>;

/// How one cut point is exercised.
#[derive(Clone, Copy, Debug)]
pub struct CutMode {
    pub fault: Fault,
    pub tear: TearMode,
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
pub fn cut_at(workload: &Workload, seed: u64, point: Option<u64>, mode: CutMode) -> CutOutcome {
    let options = harness::options(seed);
    let stack = Arc::new(FaultMedium::new(RecordingMedium::new(
        MemMedium::with_segment_capacity(harness::TEST_SEGMENT),
    )));
    let (store, vault) = harness::create(stack.clone() as Arc<dyn Medium>, &options);
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
        mode,
        seed ^ point.unwrap_or(0),
    );
    CutOutcome {
        completed: false,
        steps_run,
    }
}

/// Counts the I/O points of a workload after store creation.
pub fn count_points(workload: &Workload, seed: u64) -> u64 {
    let options = harness::options(seed);
    let stack = Arc::new(FaultMedium::new(RecordingMedium::new(
        MemMedium::with_segment_capacity(harness::TEST_SEGMENT),
    )));
    let (store, _vault) = harness::create(stack.clone() as Arc<dyn Medium>, &options);
    let start = stack.points();
    let mut runner = Runner::default();
    for step in &workload.steps {
        runner.step(&store, step).expect("workload without faults");
    }
    stack.points() - start
}

fn verify_after_crash(
    stack: &Stack,
    vault: &Arc<RecordingVault>,
    runner: &Runner,
    options: &Options,
    mode: CutMode,
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
    if let (Some(acked), Some(in_flight)) = (runner.acked.diff(&store), runner.model.diff(&store)) {
        panic!(
            "after a cut ({mode:?}) the store matches neither the acknowledged state ({acked}) nor the in-flight one ({in_flight})"
        );
    }
    let current = vault.load().expect("vault");
    for adversary in [Adversary::seize(stack.inner()), Adversary::seize(&crashed)] {
        let recovered =
            adversary.recovered_markers(std::slice::from_ref(&current), options.provider.clone());
        let leaked: Vec<_> = recovered.intersection(&runner.erased).take(3).collect();
        assert!(
            leaked.is_empty(),
            "after a cut ({mode:?}) committed deletions are recoverable: {leaked:?}"
        );
    }
}
