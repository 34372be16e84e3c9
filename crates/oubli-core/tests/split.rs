//! Split cells: a streamed file's large cell that a write lands in at random becomes small cells, later writes there re-seal 4 KiB, a stream puts it back whole, and every state survives a crash, a commit, a snapshot and fsck.

mod common;

use common::{bytes, pending_erasure};

use oubli_core::{CreateOptions, Store, DEFAULT_CELL_SIZE};
use oubli_media::TearMode;
use std::sync::Arc;

const LARGE: u64 = DEFAULT_CELL_SIZE as u64;
const MIB: usize = 1 << 20;
/// A sealed unit's tag.
const TAG: u64 = 16;

/// The units of data the live tree holds (fsck's count).
fn cells(s: &Store) -> u64 {
    s.fsck(&mut |_| {}).unwrap().cells
}

/// Writes `data` at `at` in both the store and the model.
fn write(s: &Store, oid: u64, model: &mut [u8], at: usize, data: &[u8]) {
    s.write(oid, at as u64, data).unwrap();
    model[at..at + data.len()].copy_from_slice(data);
}

/// A store holding a 1 MiB object written as one stream (32 KiB cells),
/// committed: the object and its content.
fn streamed_file() -> (Store, u64, Vec<u8>) {
    let s = common::store(CreateOptions::default());
    let oid = s.create_object(b"").unwrap();
    let model = bytes(1, MIB);
    s.write(oid, 0, &model).unwrap();
    s.commit().unwrap();
    (s, oid, model)
}

fn no_problems(s: &Store) {
    let report = s.fsck(&mut |_| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_random_write_splits_a_streamed_cell_and_later_ones_there_cost_a_small_cell() {
    let (s, oid, mut model) = streamed_file();
    assert_eq!(s.cell_size_of(oid).unwrap() as u64, LARGE);
    assert_eq!(cells(&s), 32);

    // The first write at random into cell 1 frees the whole cell's unit
    // and seals its eight small cells.
    write(&s, oid, &mut model, 40_960, &bytes(2, 4096));
    s.flush().unwrap();
    assert_eq!(pending_erasure(&s), LARGE + TAG);
    assert_eq!(cells(&s), 32 - 1 + 8);
    s.commit().unwrap();
    // Later writes there, at random: one small cell each.
    write(&s, oid, &mut model, 36_864, &bytes(3, 4096));
    write(&s, oid, &mut model, 53_248, &bytes(4, 4096));
    s.flush().unwrap();
    assert_eq!(pending_erasure(&s), 2 * (4096 + TAG));
    // A write across cells 1 and 2, unaligned: cell 2 splits as well.
    write(&s, oid, &mut model, 62_000, &bytes(5, 6000));
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    s.commit().unwrap();
    assert_eq!(cells(&s), 32 - 2 + 16);
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    assert_eq!(
        s.extents(oid, 0, MIB as u64).unwrap(),
        vec![(0, MIB as u64)]
    );
    no_problems(&s);
}

#[test]
fn a_stream_puts_split_cells_back_whole() {
    let (s, oid, mut model) = streamed_file();
    for k in 0..32 {
        write(&s, oid, &mut model, k * 32_768 + 8192, &bytes(k as u8, 100));
    }
    s.commit().unwrap();
    assert_eq!(cells(&s), 32 * 8);
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    // The file rewritten as a stream: every cell whole again, the small
    // cells erased at the commit.
    let model = bytes(9, MIB);
    s.write(oid, 0, &model).unwrap();
    s.flush().unwrap();
    assert_eq!(pending_erasure(&s), 32 * 8 * (4096 + TAG));
    s.commit().unwrap();
    assert_eq!(cells(&s), 32);
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    no_problems(&s);
}

#[test]
fn a_stream_in_small_writes_over_a_file_does_not_split_it() {
    let (s, oid, _) = streamed_file();
    // `dd conv=notrunc bs=4k`: each write continues the last one.
    s.write(oid, 0, &bytes(2, 4096)).unwrap();
    for k in 1..256u64 {
        s.write(oid, k * 4096, &bytes((2 + k) as u8, 4096)).unwrap();
    }
    s.commit().unwrap();
    // Only the first cell (its first write was not a continuation) split.
    assert_eq!(cells(&s), 32 - 1 + 8);
}

#[test]
fn truncate_and_punch_cut_split_cells_to_the_byte() {
    let (s, oid, mut model) = streamed_file();
    for k in 0..32 {
        write(
            &s,
            oid,
            &mut model,
            k * 32_768 + 5000,
            &bytes(k as u8, 3000),
        );
    }
    s.commit().unwrap();
    // A punch inside one small cell, one across small cells of two split
    // cells, and a truncate inside a small cell.
    for (at, len) in [(70_000usize, 100usize), (100_000, 70_000)] {
        s.punch_hole(oid, at as u64, len as u64).unwrap();
        model[at..at + len].fill(0);
    }
    s.truncate(oid, 500_001).unwrap();
    model.truncate(500_001);
    s.commit().unwrap();
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    let holes = s.extents(oid, 0, MIB as u64).unwrap();
    assert_eq!(
        holes,
        vec![(0, 70_000), (70_100, 29_900), (170_000, 500_001 - 170_000)]
    );
    // Grown back: what the truncate cut reads as zeros.
    s.truncate(oid, MIB as u64).unwrap();
    model.resize(MIB, 0);
    assert_eq!(s.read(oid, 0, MIB).unwrap(), model);
    no_problems(&s);
}

#[test]
fn split_cells_survive_a_crash_a_snapshot_and_a_reopen() {
    let (s, medium, vault) = common::store_with_parts(CreateOptions::default(), common::options());
    let oid = s.create_object(b"").unwrap();
    let mut model = bytes(1, 256 << 10);
    s.write(oid, 0, &model).unwrap();
    s.commit().unwrap();
    s.snapshot_create("before", None).unwrap();
    let before = model.clone();
    write(&s, oid, &mut model, 40_960, &bytes(2, 4096));
    write(&s, oid, &mut model, 12_345, &bytes(3, 777));
    s.flush().unwrap();
    // Cut after the flush: the split and the writes in it are replayed.
    let cut = Arc::new(medium.crash(TearMode::DropUnsynced, 1));
    drop(s);
    let s = Store::open(cut.clone(), vault.clone(), common::options()).unwrap();
    assert_eq!(s.read(oid, 0, 256 << 10).unwrap(), model);
    assert_eq!(
        s.snapshot("before")
            .unwrap()
            .read(oid, 0, 256 << 10)
            .unwrap(),
        before
    );
    s.commit().unwrap();
    write(&s, oid, &mut model, 45_056, &bytes(4, 4096));
    s.commit().unwrap();
    drop(s);
    let s = Store::open(cut, vault, common::options()).unwrap();
    assert_eq!(s.read(oid, 0, 256 << 10).unwrap(), model);
    no_problems(&s);
}
