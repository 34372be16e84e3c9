//! `pending_deletions` counts every kind of deletion the threat model names — overwrites, truncates and punches included — and nothing else.

mod common;

use oubli_core::{CreateOptions, Store};

fn store() -> Store {
    common::store(CreateOptions {
        cell_size: 4096,
        ..CreateOptions::default()
    })
}

fn pending(s: &Store) -> u64 {
    s.status().unwrap().pending_deletions
}

#[test]
fn overwrites_truncates_and_punches_are_deletions_appends_are_not() {
    let s = store();
    let oid = s.create_object(b"").unwrap();
    s.write(oid, 0, &[1u8; 10_000]).unwrap();
    s.commit().unwrap();
    assert_eq!(pending(&s), 0);
    // Appending (also into the sealed, partly filled last cell) deletes nothing.
    s.write(oid, 10_000, &[2u8; 100]).unwrap();
    s.flush().unwrap();
    s.write(oid, 10_100, &[2u8; 100]).unwrap();
    s.flush().unwrap();
    assert_eq!(pending(&s), 0, "appends are not deletions");
    // A sub-cell overwrite of sealed bytes is one.
    s.write(oid, 10, &[3u8; 10]).unwrap();
    assert_eq!(pending(&s), 1, "a partial overwrite");
    s.commit().unwrap();
    // An overwrite of whole cells (sealed before the lock) is one.
    s.write(oid, 4096, &[4u8; 4096]).unwrap();
    assert_eq!(pending(&s), 1, "a whole-cell overwrite");
    s.commit().unwrap();
    // Truncating inside a cell, and punching inside one.
    s.truncate(oid, 9_000).unwrap();
    assert_eq!(pending(&s), 1, "a truncate within a cell");
    s.punch_hole(oid, 100, 50).unwrap();
    assert_eq!(pending(&s), 2, "a punch within a cell");
    s.commit().unwrap();
    assert_eq!(pending(&s), 0);
}
