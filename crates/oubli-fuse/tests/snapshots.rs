//! Snapshots through the mount: `.snapshots/SNAP/` shows the store as it was, refuses every write with EROFS, hides from the root's listing unless asked, follows removal and redaction at once; `user.oubli.share` places new files under a key share.

mod common;
use common::*;
use oubli_core::VaultRecord;
use oubli_vault::MemoryVault;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn snapshot(m: &Mounted, name: &str) {
    m.session()
        .handle()
        .quiesced(|s| s.snapshot_create(name, None))
        .unwrap();
}

#[test]
fn snapshot_directory_shows_the_past_and_refuses_every_write() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let p = |n: &str| m.path(n);
    fs::create_dir(p("dir")).unwrap();
    fs::write(p("dir/a"), b"version one").unwrap();
    fs::write(p("b"), vec![7u8; 100_000]).unwrap();
    std::os::unix::fs::symlink("dir/a", p("link")).unwrap();
    setxattr(&p("b"), "user.tag", b"kept", 0).unwrap();
    snapshot(&m, "monday");

    fs::write(p("dir/a"), b"version two").unwrap();
    fs::remove_file(p("b")).unwrap();
    fs::write(p("c"), b"new").unwrap();

    // Hidden from the root's listing, reachable by name, read-only.
    assert!(!names(&m.mnt).contains(&".snapshots".to_string()));
    let snapdir = p(".snapshots");
    let meta = fs::metadata(&snapdir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o555);
    assert_eq!(names(&snapdir), vec!["monday"]);

    let s = |n: &str| snapdir.join("monday").join(n);
    assert_eq!(names(&snapdir.join("monday")), vec!["b", "dir", "link"]);
    assert_eq!(fs::read(s("dir/a")).unwrap(), b"version one");
    assert_eq!(fs::read(s("b")).unwrap(), vec![7u8; 100_000]);
    assert_eq!(fs::read_link(s("link")).unwrap(), Path::new("dir/a"));
    assert_eq!(fs::read(s("link")).unwrap(), b"version one");
    assert_eq!(getxattr(&s("b"), "user.tag", 256).unwrap(), b"kept");
    assert_eq!(errno(fs::metadata(s("c"))), libc::ENOENT);
    assert_eq!(fs::read(p("dir/a")).unwrap(), b"version two");
    // Inode numbers of their own; `..` of a snapshot's root is .snapshots.
    let (live_dir, snap_dir) = (
        fs::metadata(p("dir")).unwrap(),
        fs::metadata(s("dir")).unwrap(),
    );
    assert_ne!(live_dir.ino(), snap_dir.ino());
    assert_eq!(
        fs::metadata(snapdir.join("monday/..")).unwrap().ino(),
        meta.ino()
    );
    assert_eq!(
        fs::metadata(snapdir.join("monday/dir/..")).unwrap().ino(),
        fs::metadata(snapdir.join("monday")).unwrap().ino()
    );
    assert_eq!(
        fs::metadata(snapdir.join("..")).unwrap().ino(),
        fs::metadata(&m.mnt).unwrap().ino()
    );

    // Every write is EROFS.
    let rofs = libc::EROFS;
    assert_eq!(errno(File::create(s("new"))), rofs);
    assert_eq!(errno(File::create(s("dir/a"))), rofs);
    assert_eq!(errno(OpenOptions::new().append(true).open(s("b"))), rofs);
    assert_eq!(errno(fs::create_dir(s("d2"))), rofs);
    assert_eq!(errno(fs::remove_dir(s("dir"))), rofs);
    assert_eq!(errno(fs::remove_file(s("b"))), rofs);
    assert_eq!(errno(fs::rename(s("b"), s("b2"))), rofs);
    assert_eq!(errno(fs::rename(p("c"), s("c"))), rofs);
    assert_eq!(errno(std::os::unix::fs::symlink("x", s("l2"))), rofs);
    assert_eq!(errno(fs::hard_link(p("c"), s("c"))), rofs);
    assert_eq!(
        errno(fs::set_permissions(
            s("b"),
            fs::Permissions::from_mode(0o600)
        )),
        rofs
    );
    assert_eq!(errno(OpenOptions::new().write(true).open(s("dir/a"))), rofs);
    assert_eq!(errno(setxattr(&s("b"), "user.more", b"x", 0)), rofs);
    assert_eq!(errno(removexattr(&s("b"), "user.tag")), rofs);
    assert_eq!(errno(fs::create_dir(snapdir.join("new-snapshot"))), rofs);
    assert_eq!(errno(File::create(snapdir.join("f"))), rofs);
    // Out of a snapshot into the live tree: another device, as ZFS's .zfs.
    assert_eq!(errno(fs::rename(s("b"), p("b-again"))), libc::EXDEV);
    assert_eq!(errno(fs::hard_link(s("b"), p("b-again"))), libc::EXDEV);
    // `.snapshots` itself cannot be made, replaced or removed.
    assert_eq!(errno(fs::create_dir(p(".snapshots"))), libc::EEXIST);
    assert_eq!(errno(File::create_new(p(".snapshots"))), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(p(".snapshots"))), rofs);
    assert_eq!(errno(fs::rename(p("dir"), p(".snapshots"))), rofs);
    // Reading a snapshot's copy still works after all that; the live tree is unchanged.
    assert_eq!(fs::read(s("b")).unwrap(), vec![7u8; 100_000]);
    assert_eq!(names(&m.mnt), vec!["c", "dir", "link"]);

    // A second snapshot, then the first removed: gone at once from the directory.
    snapshot(&m, "tuesday");
    assert_eq!(names(&snapdir), vec!["monday", "tuesday"]);
    let kept = File::open(s("b")).unwrap();
    m.store.snapshot_remove("monday").unwrap();
    m.session().purge().unwrap();
    assert_eq!(names(&snapdir), vec!["tuesday"]);
    assert_eq!(errno(fs::metadata(s("dir/a"))), libc::ENOENT);
    // A handle opened before reads nothing of a removed snapshot.
    let mut buf = [0u8; 16];
    assert!(std::os::unix::fs::FileExt::read_at(&kept, &mut buf, 0).is_err());
    assert_eq!(
        fs::read(snapdir.join("tuesday/dir/a")).unwrap(),
        b"version two"
    );
    assert_eq!(
        oubli_core::Store::fsck(&m.store, &mut |_| {})
            .unwrap()
            .problems
            .len(),
        0
    );
}

#[test]
fn snapdir_visible_lists_it_in_the_root() {
    if !fuse_available() {
        return;
    }
    let mut options = default_options();
    options.parse("snapdir=visible").unwrap();
    let m = Mounted::new(mem_store(), options);
    fs::write(m.path("f"), b"x").unwrap();
    snapshot(&m, "s");
    assert_eq!(names(&m.mnt), vec![".snapshots", "f"]);
    assert_eq!(names(&m.path(".snapshots/s")), vec!["f"]);
    // `find` walks into it and back without loops.
    let out = std::process::Command::new("find")
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8(out.stdout).unwrap();
    assert!(listed.contains(".snapshots/s/f"), "{listed}");
}

#[test]
fn redact_erases_a_path_from_the_live_tree_and_every_snapshot() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let p = |n: &str| m.path(n);
    fs::create_dir_all(p("case/docs")).unwrap();
    fs::write(p("case/docs/report"), b"personal data").unwrap();
    fs::write(p("case/summary"), b"more personal data").unwrap();
    fs::hard_link(p("case/summary"), p("summary-link")).unwrap();
    fs::write(p("keep"), b"unrelated").unwrap();
    snapshot(&m, "s1");
    fs::remove_file(p("case/docs/report")).unwrap(); // gone live, still in s1
    snapshot(&m, "s2");

    let handle = m.session().handle();
    let r = handle.redact(Path::new("case")).unwrap();
    assert!(r.live);
    assert_eq!(r.snapshots, vec!["s1".to_string(), "s2".to_string()]);
    assert_eq!(r.objects, 4, "case, docs, report, summary");
    assert_eq!(r.still_open, 0);
    for gone in ["case", "summary-link"] {
        assert_eq!(errno(fs::metadata(p(gone))), libc::ENOENT, "{gone}");
    }
    for snap in ["s1", "s2"] {
        let root = p(&format!(".snapshots/{snap}"));
        assert_eq!(names(&root), vec!["keep"], "{snap}");
        assert_eq!(fs::read(root.join("keep")).unwrap(), b"unrelated");
    }
    assert_eq!(fs::read(p("keep")).unwrap(), b"unrelated");
    // A path only a snapshot holds, named through the snapshot directory.
    fs::write(p("draft"), b"draft").unwrap();
    snapshot(&m, "s3");
    fs::remove_file(p("draft")).unwrap();
    let r = handle.redact(Path::new(".snapshots/s3/draft")).unwrap();
    assert!(!r.live);
    assert_eq!(r.snapshots, vec!["s3".to_string()]);
    assert_eq!(errno(fs::metadata(p(".snapshots/s3/draft"))), libc::ENOENT);
    let missing = handle.redact(Path::new("no/such/file")).unwrap_err();
    assert_eq!(missing.raw_os_error(), Some(libc::ENOENT));
    m.session().purge().unwrap();
    let report = m.store.fsck(&mut |_| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_directory_marked_with_a_share_places_new_files_under_it() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let p = |n: &str| m.path(n);
    let share_vault = std::sync::Arc::new(MemoryVault::empty());
    let sv = share_vault.clone();
    m.store
        .share_create("tenant", "mem:tenant", move |r: &VaultRecord| {
            oubli_core::Vault::store(&*sv, r)?;
            Ok(sv)
        })
        .unwrap();
    fs::create_dir(p("tenant")).unwrap();
    fs::write(p("before"), b"written before").unwrap();
    assert_eq!(
        errno(setxattr(&p("tenant"), "user.oubli.share", b"nobody", 0)),
        libc::EINVAL
    );
    setxattr(&p("tenant"), "user.oubli.share", b"tenant", 0).unwrap();
    // A file with data is not moved under a share; an empty one is.
    assert_eq!(
        errno(setxattr(&p("before"), "user.oubli.share", b"tenant", 0)),
        libc::EBUSY
    );
    File::create(p("empty")).unwrap();
    setxattr(&p("empty"), "user.oubli.share", b"tenant", 0).unwrap();
    assert_eq!(
        errno(removexattr(&p("empty"), "user.oubli.share")),
        libc::EPERM
    );

    fs::create_dir(p("tenant/sub")).unwrap();
    File::create(p("tenant/sub/file"))
        .unwrap()
        .write_all(b"tenant data")
        .unwrap();
    fs::write(p("tenant/top"), b"tenant top").unwrap();
    let oid = |path: &str| fs::metadata(p(path)).unwrap().ino();
    for (path, share) in [
        ("tenant/sub/file", Some("tenant")),
        ("tenant/top", Some("tenant")),
        ("empty", Some("tenant")),
        ("before", None),
    ] {
        assert_eq!(
            m.store.share_of(oid(path)).unwrap().as_deref(),
            share,
            "{path}"
        );
    }
    assert_eq!(
        getxattr(&p("tenant/sub"), "user.oubli.share", 256).unwrap(),
        b"tenant"
    );
    snapshot(&m, "with-share");

    // Destroying the share: its files read as errors, live and in the snapshot; the rest reads.
    m.store.share_destroy("tenant", &*share_vault).unwrap();
    for path in [
        "tenant/sub/file",
        "tenant/top",
        ".snapshots/with-share/tenant/top",
    ] {
        assert_eq!(errno(fs::read(p(path))), libc::EIO, "{path}");
    }
    assert_eq!(fs::read(p("before")).unwrap(), b"written before");
    assert_eq!(
        fs::read(p(".snapshots/with-share/before")).unwrap(),
        b"written before"
    );
    // New files cannot be placed under a destroyed share.
    assert_eq!(errno(File::create(p("tenant/later"))), libc::EINVAL);
}

/// Issue 39 item 4 through the mount: `user.oubli.share` set on a file
/// while a large write to it is held at the gate between sealing its whole
/// cells (outside the engine lock) and taking the lock. The mount handles
/// both under the file's own lock, so the xattr waits for the write and is
/// then refused (EBUSY: the file holds data); every byte reads back and
/// the file is under no share. (The engine's own re-check under its lock,
/// for callers that do not serialise, is tested in oubli-testkit's
/// `shares::a_share_placed_while_a_large_write_seals_covers_all_its_cells`.)
#[test]
fn a_share_xattr_set_while_a_large_write_seals_waits_and_loses_nothing() {
    if !fuse_available() {
        return;
    }
    let gate = std::sync::Arc::new(oubli_testkit::gate::GateProvider::new(
        oubli_core::Options::default().provider,
    ));
    let mut options = store_options();
    options.provider = gate.clone();
    let m = Mounted::new(
        store_on(std::sync::Arc::new(oubli_media::MemMedium::new()), options),
        default_options(),
    );
    let share_vault = std::sync::Arc::new(MemoryVault::empty());
    let sv = share_vault.clone();
    m.store
        .share_create("tenant", "mem:tenant", move |r: &VaultRecord| {
            oubli_core::Vault::store(&*sv, r)?;
            Ok(sv)
        })
        .unwrap();
    let path = m.path("big");
    File::create(&path).unwrap();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    gate.hold();
    let writer = {
        let (path, data) = (path.clone(), data.clone());
        std::thread::spawn(move || {
            let mut f = OpenOptions::new().write(true).open(&path)?;
            f.write_all(&data)?;
            f.sync_all()
        })
    };
    // The write has sealed its first cells and waits before the lock.
    gate.wait_for_waiters(1);
    let setter = {
        let path = path.clone();
        std::thread::spawn(move || setxattr(&path, "user.oubli.share", b"tenant", 0))
    };
    gate.release();
    writer.join().unwrap().unwrap();
    assert_eq!(errno(setter.join().unwrap()), libc::EBUSY);
    assert!(fs::read(&path).unwrap() == data, "the data reads back");
    let oid = fs::metadata(&path).unwrap().ino();
    assert_eq!(m.store.share_of(oid).unwrap(), None);
}
