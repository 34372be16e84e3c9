//! Unit tests of the file system without the kernel: orphans, other front-ends' objects, the inode cap.

use super::inodes::LOADED_INODES_MAX;
use super::*;
use oubli_core::{CreateOptions, Options};

fn store() -> Arc<Store> {
    let options = Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    };
    Arc::new(
        Store::create(
            Arc::new(oubli_media::MemMedium::new()),
            |r| Ok(oubli_vault::MemoryVault::new(r.clone())),
            CreateOptions::default(),
            options,
        )
        .unwrap(),
    )
}

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

#[test]
fn files_unlinked_while_open_are_erased_by_the_next_mount() {
    let store = store();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    assert!(fs.fs_record().unwrap().mounted);
    let f = fs
        .create(ROOT_DIR, b"open-file", 0o644, 0, ME)
        .unwrap()
        .ino
        .0;
    fs.write(f, 0, b"secret").unwrap();
    fs.unlink(ROOT_DIR, b"open-file").unwrap();
    assert!(store.exists(f).unwrap(), "kept while open");
    let orphans = fs.fs_record().unwrap().orphans;
    assert_eq!(store.list(orphans).unwrap().len(), 1);
    // Crash: the handle is never released, no unmount.
    store.flush().unwrap();
    drop(fs);
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    assert!(!store.exists(f).unwrap(), "erased at the next mount");
    assert!(store.list(orphans).unwrap().is_empty());
    fs.destroy();
    assert!(!fs.fs_record().unwrap().mounted);
}

#[test]
fn last_close_erases_and_empties_the_orphan_list() {
    let store = store();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let f = fs.create(ROOT_DIR, b"f", 0o644, 0, ME).unwrap().ino.0;
    fs.open(f, false).unwrap();
    fs.unlink(ROOT_DIR, b"f").unwrap();
    fs.release(f);
    assert!(store.exists(f).unwrap(), "one handle still open");
    fs.release(f);
    assert!(!store.exists(f).unwrap());
    let orphans = fs.fs_record().unwrap().orphans;
    assert!(store.list(orphans).unwrap().is_empty());
    // Not open at all: erased with its name.
    let g = fs.create(ROOT_DIR, b"g", 0o644, 0, ME).unwrap().ino.0;
    fs.release(g);
    fs.unlink(ROOT_DIR, b"g").unwrap();
    assert!(!store.exists(g).unwrap());
}

/// The kernel's writeback cache sends a file's dirty pages before it
/// releases the file; a write that comes after the last close of an
/// unlinked file anyway (a late writeback) is dropped: the object is gone,
/// and nothing may bring it back or seal its data.
#[test]
fn a_write_after_the_last_close_of_an_unlinked_file_stores_nothing() {
    let medium = Arc::new(oubli_media::MemMedium::new());
    let store = Arc::new(
        Store::create(
            medium.clone(),
            |r| Ok(oubli_vault::MemoryVault::new(r.clone())),
            CreateOptions::default(),
            Options {
                policy: EpochPolicy::manual(),
                ..Options::default()
            },
        )
        .unwrap(),
    );
    let used_bytes = || {
        use oubli_core::Medium;
        let segments = medium.list_segments().unwrap();
        segments
            .into_iter()
            .map(|s| medium.segment_len(s).unwrap().unwrap_or(0))
            .sum::<u64>()
    };
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let f = fs.create(ROOT_DIR, b"f", 0o644, 0, ME).unwrap().ino.0;
    fs.write(f, 0, b"written while open").unwrap();
    fs.unlink(ROOT_DIR, b"f").unwrap();
    fs.release(f);
    assert!(!store.exists(f).unwrap());
    store.flush().unwrap();
    let used = used_bytes();
    let late = vec![7u8; 256 * 1024];
    assert_eq!(fs.write(f, 0, &late), Ok(late.len() as u32));
    assert!(
        !store.exists(f).unwrap(),
        "a late write brought the object back"
    );
    store.flush().unwrap();
    assert_eq!(used_bytes(), used, "a late write reached the medium");
}

#[test]
fn other_front_ends_objects_are_read_only() {
    let store = store();
    let dir = store
        .create_object(b"oubli-nbd exports directory v1")
        .unwrap();
    store.link(ROOT_DIR, b".nbd-exports", dir).unwrap();
    let disk = store.create_object(b"oubli-nbd export v1").unwrap();
    store.write(disk, 0, b"block device image").unwrap();
    store.link(dir, b"disk", disk).unwrap();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let d = fs.lookup(ROOT_DIR, b".nbd-exports").unwrap();
    assert_eq!((d.kind, d.perm), (FileType::Directory, 0o555));
    let f = fs.lookup(dir, b"disk").unwrap();
    assert_eq!((f.kind, f.perm, f.size), (FileType::RegularFile, 0o444, 18));
    assert_eq!(fs.read(disk, 0, 5).unwrap(), b"block");
    assert_eq!(fs.unlink(dir, b"disk"), Err(Errno::EPERM));
    assert_eq!(fs.rmdir(ROOT_DIR, b".nbd-exports"), Err(Errno::EPERM));
    assert_eq!(
        fs.rename(ROOT_DIR, b".nbd-exports", ROOT_DIR, b"x", 0),
        Err(Errno::EPERM)
    );
    assert_eq!(fs.write(disk, 0, b"x"), Err(Errno::EPERM));
    assert_eq!(fs.open(disk, true), Err(Errno::EPERM));
    assert_eq!(
        fs.create(dir, b"new", 0o644, 0, ME).err(),
        Some(Errno::EPERM)
    );
    assert_eq!(fs.setxattr(disk, b"user.x", b"1", 0), Err(Errno::EPERM));
    fs.release(disk);
    fs.destroy();
    // Their metadata was never rewritten.
    assert_eq!(store.object(disk).unwrap().meta, b"oubli-nbd export v1");
    assert_eq!(
        store.object(dir).unwrap().meta,
        b"oubli-nbd exports directory v1"
    );
}

#[test]
fn foreign_objects_show_as_files() {
    let store = store();
    let oid = store
        .create_object(br#"{"kind":"file","mtime":1}"#)
        .unwrap();
    store.write(oid, 0, b"from the CLI").unwrap();
    store.link(ROOT_DIR, b"put", oid).unwrap();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let a = fs.lookup(ROOT_DIR, b"put").unwrap();
    assert_eq!((a.kind, a.size, a.nlink), (FileType::RegularFile, 12, 1));
    assert_eq!(fs.read(oid, 0, 100).unwrap(), b"from the CLI");
    let root = fs.getattr(ROOT_DIR).unwrap();
    assert_eq!((root.kind, root.perm), (FileType::Directory, 0o755));
}

#[test]
fn inodes_past_the_cap_are_shed_and_come_back_whole() {
    let store = store();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let keep_open = fs.create(ROOT_DIR, b"open", 0o600, 0, ME).unwrap().ino.0;
    let unlinked = fs.create(ROOT_DIR, b"gone", 0o600, 0, ME).unwrap().ino.0;
    fs.unlink(ROOT_DIR, b"gone").unwrap();
    fs.release(unlinked); // deleted, still known to the kernel
    let count = LOADED_INODES_MAX + 5_000;
    let inos: Vec<u64> = (0..count)
        .map(|i| {
            let name = format!("f{i}");
            let ino = fs.create(ROOT_DIR, name.as_bytes(), 0o600 | (i as u32 & 0o77), 0, ME);
            let ino = ino.unwrap().ino.0;
            fs.release(ino);
            if i % 2 == 1 {
                fs.lookup(ROOT_DIR, name.as_bytes()).unwrap(); // a second reference
            }
            ino
        })
        .collect();
    {
        let table = lock(&fs.table);
        assert!(
            table.loaded.len() <= LOADED_INODES_MAX,
            "{}",
            table.loaded.len()
        );
        assert!(table.shed.len() >= count - LOADED_INODES_MAX);
        for kept in [ROOT_DIR, keep_open, unlinked] {
            assert!(table.loaded.contains_key(&kept), "{kept} was shed");
        }
    }
    // A shed inode comes back whole, with the change made to it kept.
    let first = inos[0];
    let req = SetAttr {
        mode: Some(0o640),
        ..SetAttr::default()
    };
    fs.setattr(first, req, ME).unwrap();
    for (i, &ino) in inos.iter().enumerate().skip(1) {
        assert_eq!(fs.getattr(ino).unwrap().perm, 0o600 | (i as u16 & 0o77));
    }
    assert_eq!(fs.getattr(first).unwrap().perm, 0o640);
    assert_eq!(fs.getattr(unlinked).unwrap().nlink, 0);
    // The kernel's lookups were carried through shedding: after one
    // forget each, the inodes looked up twice are still known.
    for &ino in inos.iter().chain([&unlinked]) {
        fs.forget(ino, 1);
    }
    {
        let table = lock(&fs.table);
        for (i, ino) in inos.iter().enumerate() {
            let known = table.loaded.contains_key(ino) || table.shed.contains_key(ino);
            assert_eq!(known, i % 2 == 1, "inode {i}");
        }
    }
    for &ino in inos.iter().skip(1).step_by(2) {
        fs.forget(ino, 1);
    }
    let table = lock(&fs.table);
    assert!(table.shed.is_empty(), "{} shed left", table.shed.len());
    let mut left: Vec<u64> = table.loaded.keys().copied().collect();
    left.sort();
    assert_eq!(left, vec![ROOT_DIR, keep_open]);
}

/// The certificate's list of removals: paths, objects and sizes of the
/// open epoch's removals, up to [`REMOVED_LISTED`] then counted, while a
/// failed unmount's message names only the first [`REMOVED_NAMED`]; a
/// commit starts the list again.
#[test]
fn removals_list_the_open_epochs_paths_up_to_the_cap() {
    let store = store();
    let fs = Fs::new(store.clone(), &MountOptions::default()).unwrap();
    let dir = fs.mkdir(ROOT_DIR, b"dir", 0o755, 0, ME).unwrap().ino.0;
    let f = fs.create(dir, b"f", 0o644, 0, ME).unwrap().ino.0;
    fs.write(f, 0, &[7u8; 1234]).unwrap();
    fs.unlink(dir, b"f").unwrap();
    fs.rmdir(ROOT_DIR, b"dir").unwrap();
    let listed: Vec<(String, u64, u64)> = fs
        .removals()
        .paths
        .into_iter()
        .map(|r| (r.path, r.object_id, r.bytes))
        .collect();
    assert_eq!(
        listed,
        [("dir/f".to_string(), f, 1234), ("dir".to_string(), dir, 0)]
    );
    // Past the cap only a count (the objects need not exist for the list).
    for i in 0..REMOVED_LISTED as u64 + 3 {
        fs.note_removed(ROOT_DIR, format!("n{i}").as_bytes(), 1 << 40 | i);
    }
    let removals = fs.removals();
    assert_eq!(removals.paths.len(), REMOVED_LISTED);
    assert_eq!(removals.more, 5);
    assert_eq!(
        removals.paths.last().unwrap().path,
        format!("n{}", REMOVED_LISTED - 3)
    );
    let (named, more) = fs.removed_paths();
    assert_eq!(named.len(), REMOVED_NAMED);
    assert_eq!(named[..3], ["/dir/f", "/dir", "/n0"]);
    assert_eq!(more, REMOVED_LISTED + 3 + 2 - REMOVED_NAMED);
    store.commit().unwrap();
    assert_eq!(fs.removals(), crate::Removals::default());
    assert_eq!(fs.removed_paths(), (Vec::new(), 0));
}
