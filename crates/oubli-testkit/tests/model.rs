//! Property test: random operations (snapshots and redactions among them), clean reopens and crashes, always compared with the reference model — in memory and on simulated raw NAND.

use oubli_core::{Medium, Store};
use oubli_media::{MemMedium, TearMode};
use oubli_testkit::workload::{Runner, Step};
use oubli_testkit::{harness, nand};
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Action {
    Do(Step),
    /// Drop the store (which flushes) and open it again: nothing is lost.
    Reopen,
    /// Power cut: only what the last flush or commit acknowledged survives
    /// (on NAND: the chip as it is, unsynced pages already programmed
    /// included, partial pages still in memory lost).
    Crash,
}

const MAX: u64 = 40_000;

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        2 => Just(Action::Do(Step::Create)),
        6 => (any::<u32>(), 0..MAX, 1..64_000u32).prop_map(|(pick, off, len)| Action::Do(Step::Write { pick, off, len })),
        2 => (any::<u32>(), 0..MAX).prop_map(|(pick, size)| Action::Do(Step::Truncate { pick, size })),
        2 => (any::<u32>(), 0..MAX, 0..20_000u64).prop_map(|(pick, off, len)| Action::Do(Step::Punch { pick, off, len })),
        1 => any::<u32>().prop_map(|pick| Action::Do(Step::Delete { pick })),
        2 => Just(Action::Do(Step::Flush)),
        1 => Just(Action::Do(Step::Commit)),
        1 => Just(Action::Do(Step::SnapshotCreate)),
        1 => any::<u32>().prop_map(|pick| Action::Do(Step::SnapshotRemove { pick })),
        1 => any::<u32>().prop_map(|pick| Action::Do(Step::Redact { pick })),
        1 => Just(Action::Do(Step::ShareCreate)),
        2 => any::<u32>().prop_map(|pick| Action::Do(Step::CreateShared { pick })),
        1 => any::<u32>().prop_map(|pick| Action::Do(Step::ShareDestroy { pick })),
        1 => Just(Action::Reopen),
        1 => Just(Action::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(
        actions in proptest::collection::vec(action(), 1..80),
        seed in any::<u64>(),
        scheme in proptest::sample::select(harness::SCHEMES.to_vec()),
    ) {
        let options = harness::options(seed);
        let mut medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
        let (store, vault) = harness::create_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
        let mut store = Some(store);
        let mut runner = Runner::default();
        for a in &actions {
            match a {
                Action::Do(step) => runner.step(store.as_ref().unwrap(), step).unwrap(),
                Action::Reopen => {
                    drop(store.take());
                    runner.acked = runner.model.clone();
                    store = Some(Store::open(medium.clone() as Arc<dyn Medium>, vault.clone(), options.clone()).unwrap());
                    store.as_ref().unwrap().set_share_opener(runner.share_opener());
                }
                Action::Crash => {
                    let crashed = Arc::new(medium.crash(TearMode::DropUnsynced, seed));
                    let reopened = Store::open(crashed.clone() as Arc<dyn Medium>, vault.clone(), options.clone()).unwrap();
                    reopened.set_share_opener(runner.share_opener());
                    // The old handle is abandoned; its drop-time flush goes to the dead medium.
                    drop(store.replace(reopened));
                    medium = crashed;
                    runner.model = runner.acked.clone();
                }
            }
            let s = store.as_ref().unwrap();
            if let Some(diff) = runner.model.diff(s) {
                panic!("after {a:?}: {diff}");
            }
            // Space accounting is exact: live bytes are what the tree references.
            let o = s.overhead().unwrap();
            prop_assert_eq!(s.status().unwrap().live_bytes, o.node_bytes + o.data_bytes + o.tag_bytes, "after {:?}", a);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The same on a store on simulated raw NAND (its vault on the chip); a
    /// reopen powers the chip up again from its image.
    #[test]
    fn store_on_nand_matches_model(
        actions in proptest::collection::vec(action(), 1..60),
        seed in any::<u64>(),
        scheme in proptest::sample::select(harness::SCHEMES.to_vec()),
    ) {
        let options = harness::options(seed);
        let mut s = nand::create_with(&options, scheme);
        let mut runner = Runner::default();
        for a in &actions {
            match a {
                Action::Do(step) => runner.step(&s.store, step).unwrap(),
                Action::Reopen => {
                    let chip = s.ubi.chip().clone();
                    drop(s);
                    runner.acked = runner.model.clone();
                    s = nand::reopen(&chip, &options).unwrap();
                    s.store.set_share_opener(runner.share_opener());
                }
                Action::Crash => {
                    let chip = s.ubi.chip().clone();
                    let again = nand::reopen(&chip, &options).unwrap();
                    again.store.set_share_opener(runner.share_opener());
                    // The old handle is abandoned on the old chip.
                    drop(std::mem::replace(&mut s, again));
                    runner.model = runner.acked.clone();
                }
            }
            if let Some(diff) = runner.model.diff(&s.store) {
                panic!("after {a:?}: {diff}");
            }
            let o = s.store.overhead().unwrap();
            prop_assert_eq!(s.store.status().unwrap().live_bytes, o.node_bytes + o.data_bytes + o.tag_bytes, "after {:?}", a);
        }
    }
}
