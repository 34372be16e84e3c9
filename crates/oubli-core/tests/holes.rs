//! Holes inside a cell: punched and never-written ranges are not data (extents), read as zeros, and survive a flush, a crash and a commit.

mod common;

use common::options;
use oubli_core::{CreateOptions, Store, DEFAULT_CELL_SIZE};
use oubli_media::MemMedium;
use oubli_vault::MemoryVault;
use std::sync::Arc;

struct Fixture {
    medium: Arc<MemMedium>,
    vault: Arc<MemoryVault>,
}

impl Fixture {
    fn new() -> (Fixture, Store) {
        let (store, medium, vault) = common::store_with_parts(CreateOptions::default(), options());
        (Fixture { medium, vault }, store)
    }

    fn reopen(&self) -> Store {
        Store::open(self.medium.clone(), self.vault.clone(), options()).unwrap()
    }
}

const CS: u64 = DEFAULT_CELL_SIZE as u64;

#[test]
fn a_punch_inside_a_cell_is_a_hole_after_flush_crash_and_commit() {
    let (fx, s) = Fixture::new();
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 0, &vec![7u8; 3 * CS as usize]).unwrap();
    s.punch_hole(oid, 4096, 4096).unwrap();
    let want = vec![(0, 4096), (8192, 3 * CS - 8192)];
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), want);
    let data = s.read(oid, 0, 3 * CS as usize).unwrap();
    assert!(data[4096..8192].iter().all(|b| *b == 0));
    assert!(data[..4096].iter().chain(&data[8192..]).all(|b| *b == 7));
    // Flushed, then the process dies: the intent log keeps the hole.
    s.flush().unwrap();
    drop(s);
    let s = fx.reopen();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), want);
    // Committed: the tree keeps it.
    s.commit().unwrap();
    drop(s);
    let s = fx.reopen();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), want);
    assert_eq!(s.read(oid, 0, 3 * CS as usize).unwrap(), data);
    // Writing into the hole makes it data again.
    s.write(oid, 5000, b"back").unwrap();
    assert_eq!(
        s.extents(oid, 0, u64::MAX).unwrap(),
        vec![(0, 4096), (5000, 4), (8192, 3 * CS - 8192)]
    );
    s.write(oid, 4096, &[1u8; 4096]).unwrap();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), vec![(0, 3 * CS)]);
}

#[test]
fn the_gap_between_two_writes_in_one_cell_is_a_hole() {
    let (fx, s) = Fixture::new();
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 10, b"head").unwrap();
    s.write(oid, 20_000, b"tail").unwrap();
    let want = vec![(10, 4), (20_000, 4)];
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), want);
    s.commit().unwrap();
    drop(s);
    let s = fx.reopen();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), want);
    let data = s.read(oid, 0, 20_004).unwrap();
    assert_eq!(&data[10..14], b"head");
    assert_eq!(&data[20_000..], b"tail");
    assert!(data[14..20_000].iter().all(|b| *b == 0));
    // Punching what is left at either end shrinks the stored range; the
    // last data going takes the cell with it.
    s.punch_hole(oid, 0, 100).unwrap();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), vec![(20_000, 4)]);
    s.punch_hole(oid, 19_000, 2_000).unwrap();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), vec![]);
}

#[test]
fn many_holes_in_one_cell_keep_the_largest_and_lose_no_data() {
    let (fx, s) = Fixture::new();
    let oid = s.create_object(b"").unwrap();
    let pattern: Vec<u8> = (0..CS).map(|i| (i % 251) as u8 + 1).collect();
    s.write(oid, 0, &pattern).unwrap();
    let mut want = pattern.clone();
    // 30 punches of growing size: only the 16 largest stay holes.
    for i in 0..30u64 {
        let (at, len) = (100 + i * 1000, 10 + i * 10);
        s.punch_hole(oid, at, len).unwrap();
        want[at as usize..(at + len) as usize].fill(0);
    }
    s.commit().unwrap();
    drop(s);
    let s = fx.reopen();
    assert_eq!(s.read(oid, 0, CS as usize).unwrap(), want);
    let extents = s.extents(oid, 0, u64::MAX).unwrap();
    assert_eq!(extents.len(), oubli_core::holes::MAX_HOLES + 1);
    let holes: u64 = CS - extents.iter().map(|(_, l)| l).sum::<u64>();
    assert_eq!(holes, (14..30).map(|i| 10 + i * 10).sum::<u64>());
}

/// A punch of a range that holds no cells (a discard of what an earlier
/// discard, or the server's ext4 inference, already dropped) changes
/// nothing and logs nothing: the flush after it writes no byte.
#[test]
fn a_punch_of_nothing_logs_nothing() {
    let (fx, store) = Fixture::new();
    let cs = DEFAULT_CELL_SIZE as u64;
    let oid = store.create_object(b"").unwrap();
    store.write(oid, 0, &vec![7u8; 8 * cs as usize]).unwrap();
    store.punch_hole(oid, 2 * cs, 4 * cs).unwrap();
    store.flush().unwrap();
    let medium_bytes = || {
        use oubli_core::Medium;
        let m = &fx.medium;
        m.list_segments()
            .unwrap()
            .iter()
            .map(|&s| m.segment_len(s).unwrap().unwrap_or(0))
            .sum::<u64>()
    };
    let before = medium_bytes();
    store.punch_hole(oid, 2 * cs, 4 * cs).unwrap();
    store.punch_hole(oid, 3 * cs, cs).unwrap();
    store.flush().unwrap();
    assert_eq!(
        medium_bytes(),
        before,
        "an empty punch reached the intent log"
    );
    // A punch that does drop something is still logged, and survives.
    store.punch_hole(oid, 0, cs).unwrap();
    store.flush().unwrap();
    assert!(medium_bytes() > before);
    drop(store);
    let store = fx.reopen();
    assert_eq!(
        store.read(oid, 0, cs as usize).unwrap(),
        vec![0u8; cs as usize]
    );
    let tail = store.read(oid, 6 * cs, 2 * cs as usize).unwrap();
    assert_eq!(tail, vec![7u8; 2 * cs as usize]);
}

#[test]
fn punch_holes_is_the_same_punches_counted_as_one_deletion() {
    let (fx, batched) = Fixture::new();
    let (_, one_by_one) = Fixture::new();
    let ranges = [
        (CS, CS),
        (3 * CS + 100, 2 * CS),
        (7 * CS - 10, 20),
        (9 * CS, CS),
    ];
    let mut oids = vec![];
    for s in [&batched, &one_by_one] {
        let oid = s.create_object(b"").unwrap();
        s.write(oid, 0, &vec![9u8; 12 * CS as usize]).unwrap();
        s.commit().unwrap();
        oids.push(oid);
    }
    batched.punch_holes(oids[0], &ranges).unwrap();
    for &(offset, len) in &ranges {
        one_by_one.punch_hole(oids[1], offset, len).unwrap();
    }
    let read_all = |s: &Store, oid| s.read(oid, 0, 12 * CS as usize).unwrap();
    assert_eq!(read_all(&batched, oids[0]), read_all(&one_by_one, oids[1]));
    assert_eq!(
        batched.extents(oids[0], 0, u64::MAX).unwrap(),
        one_by_one.extents(oids[1], 0, u64::MAX).unwrap()
    );
    // The batch is one deletion event (its partial cells' rewrites count
    // on their own, as for a single punch); one punch per range counts each.
    let (b, o) = (
        batched.status().unwrap().pending_deletions,
        one_by_one.status().unwrap().pending_deletions,
    );
    assert!(b < o, "batched {b} deletions, one by one {o}");
    // Logged like single punches: a crash after the flush keeps them all.
    let want = read_all(&batched, oids[0]);
    batched.flush().unwrap();
    drop(batched);
    assert_eq!(read_all(&fx.reopen(), oids[0]), want);
}

/// `write_inside` (a block device's writes) never grows an object: a write
/// that would end past its size is refused whole, and the size and bytes
/// stay as they were; one that ends at the size goes through.
#[test]
fn write_inside_refuses_to_grow_an_object() {
    let s = common::store(CreateOptions::default());
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 0, &vec![1u8; 2 * CS as usize]).unwrap();
    let err = s
        .write_inside(oid, CS, &vec![2u8; CS as usize + 1])
        .unwrap_err();
    assert!(matches!(err, oubli_core::Error::PastEnd(_)), "{err}");
    assert_eq!(s.size(oid).unwrap(), 2 * CS);
    assert!(s
        .read(oid, 0, 2 * CS as usize)
        .unwrap()
        .iter()
        .all(|b| *b == 1));
    s.write_inside(oid, CS, &vec![2u8; CS as usize]).unwrap();
    assert_eq!(s.read(oid, CS, 1).unwrap(), [2]);
    let shrinks = s.shrink_generation();
    s.truncate(oid, CS).unwrap();
    assert!(
        s.shrink_generation() > shrinks,
        "a truncate counts as a shrink"
    );
    assert!(s.write_inside(oid, CS - 1, b"ab").is_err());
    assert_eq!(s.size(oid).unwrap(), CS);
}
