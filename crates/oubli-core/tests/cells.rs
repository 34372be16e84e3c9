//! One cell size per object: streamed files keep the store's cells, objects written in place get small ones, and the choice survives a crash, a commit and a snapshot.

mod common;

use common::{bytes, pending_erasure};

use oubli_core::{CreateOptions, Store, DEFAULT_CELL_SIZE, SMALL_CELL_SIZE};
use oubli_media::TearMode;
use std::sync::Arc;

const LARGE: u32 = DEFAULT_CELL_SIZE;
const SMALL: u32 = SMALL_CELL_SIZE;

#[test]
fn streamed_files_keep_the_store_cells_and_sparse_ones_get_small_cells() {
    let s = common::store(CreateOptions::default());
    // Appends in small pieces: a stream.
    let streamed = s.create_object(b"").unwrap();
    for i in 0..40u8 {
        s.write(streamed, u64::from(i) * 4096, &bytes(i, 4096))
            .unwrap();
    }
    assert_eq!(s.cell_size_of(streamed).unwrap(), LARGE);
    // A small file in one write: one partial cell of the store's size.
    let small_file = s.create_object(b"").unwrap();
    s.write(small_file, 0, b"hello").unwrap();
    assert_eq!(s.cell_size_of(small_file).unwrap(), LARGE);
    // A first write past the start of an empty (say truncated-up) object.
    let sparse = s.create_object(b"").unwrap();
    s.truncate(sparse, 1 << 20).unwrap();
    s.write(sparse, 300_000, &bytes(9, 10_000)).unwrap();
    assert_eq!(s.cell_size_of(sparse).unwrap(), SMALL);
    // An explicit choice before any data, refused after.
    let chosen = s.create_object(b"").unwrap();
    assert!(s.use_small_cells(chosen).unwrap());
    s.write(chosen, 0, &bytes(3, 100_000)).unwrap();
    assert_eq!(s.cell_size_of(chosen).unwrap(), SMALL);
    assert!(!s.use_small_cells(streamed).unwrap());
    assert_eq!(s.cell_size_of(streamed).unwrap(), LARGE);
    // Reads see what was written, across cells of either size.
    assert_eq!(
        s.read(sparse, 299_000, 12_000).unwrap()[1000..11_000],
        bytes(9, 10_000)[..]
    );
    assert_eq!(s.read(chosen, 0, 100_000).unwrap(), bytes(3, 100_000));
    assert_eq!(
        s.extents(sparse, 0, 1 << 20).unwrap(),
        vec![(300_000, 10_000)]
    );
}

#[test]
fn a_small_write_in_place_re_seals_a_small_cell_only() {
    let s = common::store(CreateOptions::default());
    let large = s.create_object(b"").unwrap();
    let small = s.create_object(b"").unwrap();
    assert!(s.use_small_cells(small).unwrap());
    for oid in [large, small] {
        s.write(oid, 0, &bytes(1, 1 << 20)).unwrap();
    }
    s.commit().unwrap();
    s.write(large, 40_960, &bytes(2, 4096)).unwrap();
    s.flush().unwrap();
    let after_large = pending_erasure(&s);
    s.commit().unwrap();
    s.write(small, 40_960, &bytes(2, 4096)).unwrap();
    s.flush().unwrap();
    let after_small = pending_erasure(&s);
    assert!(after_large >= u64::from(LARGE), "{after_large}");
    assert!(after_small < u64::from(LARGE) / 4, "{after_small}");
    for oid in [large, small] {
        let mut want = bytes(1, 1 << 20);
        want[40_960..45_056].copy_from_slice(&bytes(2, 4096));
        assert_eq!(s.read(oid, 0, 1 << 20).unwrap(), want);
    }
}

#[test]
fn the_choice_survives_a_crash_a_commit_and_a_snapshot() {
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), common::options());
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 8192, &bytes(5, 20_000)).unwrap();
    s.flush().unwrap();
    // Logged before its cells: a cut after the flush replays both.
    let cut = Arc::new(medium.crash(TearMode::DropUnsynced, 1));
    drop(s);
    let s = Store::open(cut.clone(), vault.clone(), common::options()).unwrap();
    assert_eq!(s.cell_size_of(oid).unwrap(), SMALL);
    assert_eq!(s.read(oid, 8192, 20_000).unwrap(), bytes(5, 20_000));
    s.commit().unwrap();
    s.snapshot_create("before", None).unwrap();
    s.write(oid, 8192, &bytes(6, 4096)).unwrap();
    s.commit().unwrap();
    drop(s);
    let s = Store::open(cut, vault, common::options()).unwrap();
    assert_eq!(s.cell_size_of(oid).unwrap(), SMALL);
    let view = s.snapshot("before").unwrap();
    assert_eq!(view.read(oid, 8192, 20_000).unwrap(), bytes(5, 20_000));
    assert_eq!(view.cell_size_of(oid).unwrap(), SMALL);
    assert_eq!(s.read(oid, 8192, 4096).unwrap(), bytes(6, 4096));
    assert!(s.fsck(&mut |_| {}).unwrap().problems.is_empty());
}

#[test]
fn a_store_of_small_cells_has_only_those() {
    let s = common::store(CreateOptions {
        cell_size: 4096,
        ..CreateOptions::default()
    });
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 100_000, &bytes(1, 9000)).unwrap();
    assert!(s.use_small_cells(oid).unwrap());
    assert_eq!(s.cell_size_of(oid).unwrap(), 4096);
}
