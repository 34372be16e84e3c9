//! What only some key schemes do: consolidation of a keyed hash forest fragmented by deletions.

use oubli_core::{Medium, Store};
use oubli_crypto::{SCHEME_KEYED_HASH_FOREST, SCHEME_KEY_STORAGE_AREA, SCHEME_PARENT_POINTER};
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::adversary::{check_no_rederivation_on, check_promise};
use oubli_testkit::harness;
use oubli_testkit::workload::{Runner, Step};
use std::sync::Arc;

/// 2,000 cells written, every other one punched: the forest's live leaves
/// scatter into about a thousand roots. Consolidation re-seals the live
/// tree under fresh leaves and commits: the forest shrinks to a handful of
/// roots, the data reads back (also after a reopen), nothing deleted opens
/// — not even for an adversary who knows every unit's place and leaf.
#[test]
fn consolidation_brings_a_fragmented_forest_back_to_few_roots() {
    for scheme in harness::SCHEMES {
        let options = harness::options(41);
        let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
            harness::TEST_SEGMENT,
        )));
        let (store, vault) =
            harness::create_with(recording.clone() as Arc<dyn Medium>, &options, scheme);
        let cell = u64::from(harness::TEST_CELL);
        let mut runner = Runner::default();
        let len = (2000 * cell) as u32;
        let mut steps = vec![
            Step::Create,
            Step::Write {
                pick: 0,
                off: 0,
                len,
            },
            Step::Commit,
        ];
        let punch = |i: u64| Step::Punch {
            pick: 0,
            off: i * cell,
            len: cell,
        };
        steps.extend((0..2000).step_by(2).map(punch));
        steps.push(Step::Commit);
        for step in &steps {
            runner.step(&store, step).unwrap();
        }
        let before = store.status().unwrap().key_scheme_stats.roots;
        let report = store.consolidate_keys().unwrap();
        runner.acked = runner.model.clone();
        runner.note_commit();
        let after = store.status().unwrap().key_scheme_stats.roots;
        let name = harness::scheme_name(scheme);
        match scheme {
            SCHEME_PARENT_POINTER => assert_eq!(report, Default::default()),
            _ => assert_eq!(report.cells_rekeyed, 1000, "{name}: {report:?}"),
        }
        if scheme == SCHEME_KEYED_HASH_FOREST {
            let (before, after) = (before.unwrap(), after.unwrap());
            assert!(
                before >= 1000,
                "the punches should fragment: {before} roots"
            );
            assert_eq!(report.roots_before, Some(before));
            assert_eq!(report.roots_after, Some(after));
            // One tree's worth of live leaves, plus at most fanout − 1
            // roots per level where they start inside a tree.
            assert!(
                after <= 2 + 15 + 31 + 7,
                "{after} roots after consolidation"
            );
            println!("consolidation: {before} roots -> {after}");
        }
        assert_eq!(runner.model.diff(&store), None, "{name}");
        check_promise(&recording, &*vault, &runner, options.provider.clone());
        check_no_rederivation_on(
            &recording,
            scheme,
            &vault,
            &runner,
            options.provider.clone(),
        );
        drop(store);
        let reopened = Store::open(
            recording.clone() as Arc<dyn Medium>,
            vault.clone(),
            options.clone(),
        )
        .unwrap();
        assert_eq!(runner.model.diff(&reopened), None, "{name} after a reopen");
    }
}

/// A scheme state larger than a segment (a key storage area of 20,000
/// keys is about 640 KiB; test segments hold 256 KiB) is written in
/// chunks: the store commits, the cleaner keeps every chunk, and it
/// reopens with every unit readable.
#[test]
fn a_scheme_state_larger_than_a_segment_is_committed_in_chunks() {
    for scheme in harness::SCHEMES {
        let options = harness::options(43);
        let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
        let (store, vault) =
            harness::create_with(medium.clone() as Arc<dyn Medium>, &options, scheme);
        let mut runner = Runner::default();
        let mut steps = Vec::new();
        for pick in 0..20_000 {
            steps.push(Step::Create);
            steps.push(Step::Write {
                pick,
                off: 0,
                len: 1,
            });
        }
        steps.push(Step::Commit);
        for step in &steps {
            runner.step(&store, step).unwrap();
        }
        let state = store.status().unwrap().key_scheme_stats.state_bytes;
        if scheme == SCHEME_KEY_STORAGE_AREA {
            assert!(state > harness::TEST_SEGMENT, "{state} bytes of state");
        }
        store.gc(1.0).unwrap();
        drop(store);
        let reopened = Store::open(
            medium.clone() as Arc<dyn Medium>,
            vault.clone(),
            options.clone(),
        )
        .unwrap();
        assert_eq!(
            runner.model.diff(&reopened),
            None,
            "{}",
            harness::scheme_name(scheme)
        );
    }
}
