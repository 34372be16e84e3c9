//! A medium that runs out of room at the I/O points of a workload's flushes and commits (issue 39 item 1): the store is not poisoned, the retry succeeds, the model agrees, and the adversary recovers nothing deleted before a commit.

use oubli_core::{Error, Medium};
use oubli_media::{FaultMedium, MemMedium, RecordingMedium};
use oubli_testkit::adversary::check_promise;
use oubli_testkit::harness;
use oubli_testkit::workload::{Runner, Step, Workload};
use std::sync::Arc;

/// Every flush and commit of a workload (puts, overwrites, truncates,
/// punches, deletes, snapshots) finds no room at one of its first I/O
/// points, a different one each time: it fails with `NoSpace` (or, past
/// the commit point, succeeds), the same step then succeeds (the room came
/// back), the store matches the model, and after every third commit an
/// adversary holding every byte ever written and the vault recovers
/// nothing deleted before it — and everything live.
#[test]
fn no_space_in_every_flush_and_commit_of_a_workload() {
    for scheme in harness::SCHEMES {
        let options = harness::options(11);
        let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
            harness::TEST_SEGMENT,
        )));
        let medium = Arc::new(FaultMedium::new(recording.clone()));
        let (store, vault) =
            harness::create_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
        let workload = Workload::generate(11, 600, 64 * 1024, 25);
        let mut runner = Runner::default();
        let (mut armed, mut refused) = (0u64, 0);
        for step in &workload.steps {
            let durable = matches!(step, Step::Flush | Step::Commit);
            if durable {
                medium.arm_no_space(medium.points() + armed % 7);
                armed += 1;
            }
            match runner.step(&store, step) {
                Ok(()) => {}
                Err(Error::NoSpace(why)) if durable => {
                    refused += 1;
                    runner
                        .step(&store, step)
                        .unwrap_or_else(|e| panic!("{step:?} after {why}: {e}"));
                }
                Err(e) => panic!("{step:?}: {e}"),
            }
            // A point past the step's last is never reached.
            medium.arm_no_space(u64::MAX);
            if let Some(diff) = runner.model.diff(&store) {
                panic!("after {step:?}: {diff}");
            }
            if *step == Step::Commit && runner.commits % 3 == 0 {
                check_promise(&recording, &*vault, &runner, options.provider.clone());
            }
        }
        store.commit().unwrap();
        runner.note_commit();
        check_promise(&recording, &*vault, &runner, options.provider.clone());
        println!(
            "scheme {scheme}: {} flushes and commits, {refused} refused, {} commits",
            armed, runner.commits
        );
        assert!(refused >= 10, "scheme {scheme}: only {refused} refusals");
    }
}
