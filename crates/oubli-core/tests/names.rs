//! Directory entries: link, lookup, list, unlink and rename, including replacement and large directories.

mod common;

use oubli_core::{CreateOptions, Error, Store, ROOT_DIR};

fn store() -> Store {
    common::store(CreateOptions::default())
}

#[test]
fn rename_moves_replaces_and_refuses() {
    let s = store();
    let dir = s.create_object(b"dir").unwrap();
    s.link(ROOT_DIR, b"d", dir).unwrap();
    let a = s.create_object(b"").unwrap();
    let b = s.create_object(b"").unwrap();
    s.link(ROOT_DIR, b"a", a).unwrap();
    s.link(dir, b"b", b).unwrap();
    // Refused without replace, nothing changes.
    assert!(matches!(
        s.rename(ROOT_DIR, b"a", dir, b"b", false),
        Err(Error::Exists(_))
    ));
    assert_eq!(s.lookup(ROOT_DIR, b"a").unwrap(), Some(a));
    // Replacing returns the old target.
    assert_eq!(s.rename(ROOT_DIR, b"a", dir, b"b", true).unwrap(), Some(b));
    assert_eq!(s.lookup(ROOT_DIR, b"a").unwrap(), None);
    assert_eq!(s.lookup(dir, b"b").unwrap(), Some(a));
    // Within one directory, to a fresh name.
    assert_eq!(s.rename(dir, b"b", dir, b"c", false).unwrap(), None);
    assert_eq!(s.list(dir).unwrap(), vec![(b"c".to_vec(), a)]);
    assert!(matches!(
        s.rename(dir, b"nope", dir, b"x", true),
        Err(Error::NoName(_))
    ));
}

#[test]
fn many_names_in_one_directory() {
    let s = store();
    for i in 0..3000u64 {
        s.link(ROOT_DIR, format!("file-{i}").as_bytes(), 1000 + i)
            .unwrap();
    }
    s.commit().unwrap();
    for i in (0..3000u64).step_by(2) {
        assert_eq!(
            s.unlink(ROOT_DIR, format!("file-{i}").as_bytes()).unwrap(),
            1000 + i
        );
    }
    let list = s.list(ROOT_DIR).unwrap();
    assert_eq!(list.len(), 1500);
    for (name, target) in list {
        let n: u64 = String::from_utf8(name).unwrap()["file-".len()..]
            .parse()
            .unwrap();
        assert_eq!(n % 2, 1);
        assert_eq!(n + 1000, target);
    }
    assert!(matches!(
        s.link(ROOT_DIR, b"file-1", 1),
        Err(Error::Exists(_))
    ));
}

#[test]
fn extents_and_sparse_punches() {
    let s = store();
    let oid = s.create_object(b"").unwrap();
    let cs = oubli_core::DEFAULT_CELL_SIZE as u64;
    s.write(oid, 0, &vec![1u8; 3 * cs as usize]).unwrap();
    s.write(oid, 10 * cs + 100, b"tail").unwrap();
    assert_eq!(
        s.extents(oid, 0, u64::MAX).unwrap(),
        vec![(0, 3 * cs), (10 * cs + 100, 4)]
    );
    // A discard of a huge range costs what it removes.
    s.truncate(oid, 1 << 40).unwrap();
    s.punch_hole(oid, cs / 2, 1 << 39).unwrap();
    assert_eq!(s.extents(oid, 0, u64::MAX).unwrap(), vec![(0, cs / 2)]);
    assert_eq!(s.read(oid, cs / 2 - 1, 2).unwrap(), vec![1, 0]);
    assert!(s.status().unwrap().pending_deletions > 0);
}
