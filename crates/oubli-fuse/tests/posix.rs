//! POSIX conformance through a real mount: file types, modes and ownership, links, rename, truncate, timestamps, xattrs, and the errno of each failure.

mod common;
use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

fn mounted() -> Option<Mounted> {
    fuse_available().then(|| Mounted::new(mem_store(), default_options()))
}

/// Runs `f` with the calling thread's file-system uid/gid switched (FUSE sees them as the caller).
fn as_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: FFI; setfsuid/setfsgid change only this thread's file-system ids.
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
    }
    let out = f();
    // SAFETY: as above, back to root.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(0);
    }
    out
}

fn listxattr(p: &Path) -> Vec<String> {
    let c = cpath(p);
    let mut buf = vec![0u8; 4096];
    // SAFETY: FFI with a valid path and a writable buffer.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = check(n as i32).expect("listxattr") as usize;
    buf[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect()
}

fn removexattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: FFI with valid strings.
    check(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }).map(|_| ())
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (a, b) = (cpath(from), cpath(to));
    // SAFETY: FFI with valid paths; AT_FDCWD resolves them from the cwd (they are absolute).
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
    .map(|_| ())
}

fn mknod(p: &Path, mode: u32, dev: u64) -> std::io::Result<()> {
    let c = cpath(p);
    // SAFETY: FFI with a valid path.
    check(unsafe { libc::mknod(c.as_ptr(), mode, dev) }).map(|_| ())
}

fn check_off(rc: libc::off_t) -> std::io::Result<libc::off_t> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn fallocate(f: &File, mode: i32, offset: i64, len: i64) -> std::io::Result<()> {
    // SAFETY: FFI on an open descriptor.
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) }).map(|_| ())
}

#[test]
fn file_types() {
    let Some(m) = mounted() else { return };
    fs::write(m.path("f"), b"data").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    std::os::unix::fs::symlink("f", m.path("l")).unwrap();
    mknod(&m.path("p"), libc::S_IFIFO | 0o600, 0).unwrap();
    mknod(&m.path("c"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)).unwrap();
    mknod(&m.path("b"), libc::S_IFBLK | 0o600, libc::makedev(7, 0)).unwrap();
    mknod(&m.path("s"), libc::S_IFSOCK | 0o600, 0).unwrap();
    let t = |n: &str| fs::symlink_metadata(m.path(n)).unwrap().file_type();
    assert!(t("f").is_file());
    assert!(t("d").is_dir());
    assert!(t("l").is_symlink());
    assert!(t("p").is_fifo());
    assert!(t("c").is_char_device());
    assert!(t("b").is_block_device());
    assert!(t("s").is_socket());
    assert_eq!(
        fs::symlink_metadata(m.path("c")).unwrap().rdev(),
        libc::makedev(1, 3)
    );
    assert_eq!(fs::read_link(m.path("l")).unwrap(), Path::new("f"));
    assert_eq!(fs::read(m.path("l")).unwrap(), b"data");
    assert_eq!(fs::symlink_metadata(m.path("l")).unwrap().len(), 1);
    // readdir reports the same types.
    let mut seen: Vec<(String, bool, bool)> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            (
                e.file_name().into_string().unwrap(),
                ft.is_dir(),
                ft.is_symlink(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 7);
    assert!(seen.contains(&("d".into(), true, false)));
    assert!(seen.contains(&("l".into(), false, true)));
}

#[test]
fn modes_and_ownership() {
    let Some(m) = mounted() else { return };
    let f = m.path("f");
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o640)
        .open(&f)
        .unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!(md.mode() & 0o7777, 0o640 & !0o022);
    assert_eq!((md.uid(), md.gid()), (0, 0));
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o4751);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // chown clears set-user-ID.
    assert_eq!(md.mode() & 0o7777, 0o751);

    // A set-group-ID directory hands its group down.
    let d = m.path("shared");
    fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, None, Some(4242)).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o2777)).unwrap();
    fs::write(d.join("x"), b"").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    assert_eq!(fs::metadata(d.join("x")).unwrap().gid(), 4242);
    let sub = fs::metadata(d.join("sub")).unwrap();
    assert_eq!(sub.gid(), 4242);
    assert_eq!(sub.mode() & 0o2000, 0o2000);

    // default_permissions: the kernel checks the stored modes.
    fs::create_dir(m.path("private")).unwrap();
    fs::set_permissions(m.path("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(m.path("private/secret"), b"s").unwrap();
    as_user(1000, 1000, || {
        assert_eq!(errno(fs::read(m.path("private/secret"))), libc::EACCES);
        assert_eq!(errno(fs::write(m.path("private/new"), b"")), libc::EACCES);
        assert_eq!(
            errno(fs::set_permissions(&f, fs::Permissions::from_mode(0o777))),
            libc::EPERM
        );
        assert_eq!(
            errno(std::os::unix::fs::chown(&f, Some(1000), None)),
            libc::EPERM
        );
        // Own files in a world-writable directory are fine.
        fs::write(d.join("mine"), b"m").unwrap();
        assert_eq!(fs::metadata(d.join("mine")).unwrap().uid(), 1000);
    });
}

#[test]
fn hard_links() {
    let Some(m) = mounted() else { return };
    fs::write(m.path("a"), b"shared").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    fs::hard_link(m.path("a"), m.path("d/b")).unwrap();
    fs::hard_link(m.path("a"), m.path("c")).unwrap();
    let (a, b) = (
        fs::metadata(m.path("a")).unwrap(),
        fs::metadata(m.path("d/b")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 3);
    fs::write(m.path("d/b"), b"changed").unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), b"changed");
    fs::remove_file(m.path("a")).unwrap();
    assert_eq!(fs::metadata(m.path("c")).unwrap().nlink(), 2);
    fs::remove_file(m.path("c")).unwrap();
    assert_eq!(fs::metadata(m.path("d/b")).unwrap().nlink(), 1);
    assert_eq!(fs::read(m.path("d/b")).unwrap(), b"changed");
    assert_eq!(errno(fs::hard_link(m.path("d"), m.path("d2"))), libc::EPERM);
    assert_eq!(
        errno(fs::hard_link(m.path("d/b"), m.path("d/b"))),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs::hard_link(m.path("missing"), m.path("x"))),
        libc::ENOENT
    );
    // Directory link counts: 2 + subdirectories.
    fs::create_dir(m.path("d/s1")).unwrap();
    fs::create_dir(m.path("d/s2")).unwrap();
    assert_eq!(fs::metadata(m.path("d")).unwrap().nlink(), 4);
    fs::remove_dir(m.path("d/s1")).unwrap();
    assert_eq!(fs::metadata(m.path("d")).unwrap().nlink(), 3);
}

#[test]
fn rename() {
    let Some(m) = mounted() else { return };
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    fs::create_dir_all(m.path("d1/sub")).unwrap();
    fs::create_dir(m.path("d2")).unwrap();
    fs::write(m.path("d1/sub/f"), b"F").unwrap();

    // Plain rename and replacing an existing file.
    fs::rename(m.path("a"), m.path("a2")).unwrap();
    assert_eq!(errno(fs::metadata(m.path("a"))), libc::ENOENT);
    fs::rename(m.path("a2"), m.path("b")).unwrap();
    assert_eq!(fs::read(m.path("b")).unwrap(), b"A");

    // Directories, across parents: contents and link counts follow.
    let before = fs::metadata(m.path("d1")).unwrap().nlink();
    fs::rename(m.path("d1/sub"), m.path("d2/moved")).unwrap();
    assert_eq!(fs::read(m.path("d2/moved/f")).unwrap(), b"F");
    assert_eq!(fs::metadata(m.path("d1")).unwrap().nlink(), before - 1);
    assert_eq!(fs::metadata(m.path("d2")).unwrap().nlink(), 3);
    // `..` of the moved directory is its new parent.
    assert_eq!(
        fs::metadata(m.path("d2/moved/..")).unwrap().ino(),
        fs::metadata(m.path("d2")).unwrap().ino()
    );

    // Replacing an empty directory works; a non-empty one does not.
    fs::create_dir(m.path("empty")).unwrap();
    fs::rename(m.path("d2/moved"), m.path("empty")).unwrap();
    assert_eq!(fs::read(m.path("empty/f")).unwrap(), b"F");
    fs::create_dir(m.path("full")).unwrap();
    fs::write(m.path("full/x"), b"").unwrap();
    assert_eq!(
        errno(fs::rename(m.path("d1"), m.path("full"))),
        libc::ENOTEMPTY
    );
    // Type mismatches.
    assert_eq!(errno(fs::rename(m.path("b"), m.path("full"))), libc::EISDIR);
    assert_eq!(
        errno(fs::rename(m.path("full"), m.path("b"))),
        libc::ENOTDIR
    );
    // A directory cannot move into itself.
    assert_eq!(
        errno(fs::rename(m.path("empty"), m.path("empty/inside"))),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs::rename(m.path("nothing"), m.path("x"))),
        libc::ENOENT
    );

    // renameat2 flags.
    fs::write(m.path("p"), b"P").unwrap();
    fs::write(m.path("q"), b"Q").unwrap();
    assert_eq!(
        errno(renameat2(
            &m.path("p"),
            &m.path("q"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    renameat2(&m.path("p"), &m.path("q"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("p")).unwrap(), b"Q");
    assert_eq!(fs::read(m.path("q")).unwrap(), b"P");
    renameat2(&m.path("p"), &m.path("full"), libc::RENAME_EXCHANGE).unwrap();
    assert!(fs::metadata(m.path("p")).unwrap().is_dir());
    assert_eq!(fs::read(m.path("full")).unwrap(), b"Q");
    assert_eq!(fs::read(m.path("p/x")).unwrap(), b"");
    renameat2(&m.path("p"), &m.path("r"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(
        errno(renameat2(
            &m.path("r"),
            &m.path("nonexistent"),
            libc::RENAME_EXCHANGE
        )),
        libc::ENOENT
    );
    // Nothing left parked by the exchanges.
    let names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with(".oubli")), "{names:?}");
}

/// With the kernel's writeback cache on (and off, the same results): a
/// partial-page write through a write-only handle (the kernel reads the
/// page first), `O_APPEND` against another handle's extension (the kernel
/// resolves it against its own size), and a truncate below dirty pages —
/// read back through the mount, and from the store after a remount.
#[test]
fn size_append_and_partial_pages_with_and_without_the_writeback_cache() {
    if !fuse_available() {
        return;
    }
    for writeback in [true, false] {
        let mut opts = default_options();
        opts.writeback_cache = writeback;
        let mut m = Mounted::new(mem_store(), opts.clone());
        let p = m.path("f");
        let mut want = vec![b'a'; 10_000];
        fs::write(&p, &want).unwrap();
        // Write-only, in the middle of a page.
        let wo = OpenOptions::new().write(true).open(&p).unwrap();
        wo.write_all_at(b"XYZ", 5_000).unwrap();
        drop(wo);
        want[5_000..5_003].copy_from_slice(b"XYZ");
        // O_APPEND on one handle, the file extended through another between.
        let mut app = OpenOptions::new().append(true).open(&p).unwrap();
        app.write_all(b"1").unwrap();
        let other = OpenOptions::new().write(true).open(&p).unwrap();
        other.write_all_at(&[b'b'; 100], 10_001).unwrap();
        app.write_all(b"2").unwrap();
        drop((app, other));
        want.push(b'1');
        want.extend_from_slice(&[b'b'; 100]);
        want.push(b'2');
        assert_eq!(fs::read(&p).unwrap(), want, "writeback {writeback}");
        // A truncate below pages written a moment before (still dirty with the cache).
        let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        rw.write_all_at(&[b'c'; 8192], 20_000).unwrap();
        rw.set_len(12_000).unwrap();
        rw.write_all_at(b"end", 11_997).unwrap();
        drop(rw);
        want.resize(12_000, 0);
        want[11_997..].copy_from_slice(b"end");
        assert_eq!(fs::metadata(&p).unwrap().len(), 12_000);
        assert_eq!(fs::read(&p).unwrap(), want, "writeback {writeback}");
        let store = m.store.clone();
        m.unmount();
        let m = Mounted::new(store, opts);
        assert_eq!(
            fs::read(m.path("f")).unwrap(),
            want,
            "writeback {writeback}: after a remount"
        );
    }
}

/// A file written and closed, never synced, counts its blocks at once,
/// while the kernel holds its attributes from the create (with the
/// writeback cache the data reaches the mount only at the close): a
/// file showing 0 blocks is archived as all holes by `tar -S`.
#[test]
fn a_closed_file_counts_its_blocks_without_a_sync() {
    let Some(m) = mounted() else { return };
    let p = m.path("written");
    let f = File::create(&p).unwrap();
    assert_eq!(f.metadata().unwrap().blocks(), 0);
    f.write_all_at(&[7u8; 10_000], 0).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().blocks() * 512, 12_288);
    // Grown by a truncate first (the kernel caches the attributes of its
    // reply), then written: the same.
    let sparse = m.path("grown");
    let f = File::create(&sparse).unwrap();
    f.set_len(100_001).unwrap();
    f.write_all_at(b"x", 100_000).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&sparse).unwrap().blocks() * 512, 4096);
}

#[test]
fn truncate_extend_and_sparse() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all(&[1u8; 100_000]).unwrap();
    f.set_len(50_000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 50_000);
    f.set_len(200_000).unwrap();
    let data = fs::read(&p).unwrap();
    assert_eq!(data.len(), 200_000);
    assert!(data[..50_000].iter().all(|b| *b == 1));
    assert!(
        data[50_000..].iter().all(|b| *b == 0),
        "extension reads as zeros"
    );
    // O_TRUNC
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);

    // Sparse: a write far out leaves a hole of zeros.
    f.write_all_at(b"end", 10_000_000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 10_000_003);
    let mut buf = vec![9u8; 4096];
    f.read_exact_at(&mut buf, 5_000_000).unwrap();
    assert!(buf.iter().all(|b| *b == 0));

    // Large files: past 4 GiB.
    let big = m.path("big");
    let g = File::create(&big).unwrap();
    let at = 5u64 << 30;
    g.write_all_at(b"beyond four gigabytes", at).unwrap();
    assert_eq!(fs::metadata(&big).unwrap().len(), at + 21);
    let mut back = [0u8; 21];
    File::open(&big)
        .unwrap()
        .read_exact_at(&mut back, at)
        .unwrap();
    assert_eq!(&back, b"beyond four gigabytes");
    g.set_len(at - 1).unwrap();
    assert_eq!(fs::metadata(&big).unwrap().len(), at - 1);

    // Truncating a directory fails.
    fs::create_dir(m.path("d")).unwrap();
    assert_eq!(
        errno(OpenOptions::new().write(true).open(m.path("d"))),
        libc::EISDIR
    );
}

#[test]
fn fallocate_and_punch_hole() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&vec![0xAB; 200_000], 0).unwrap();
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        10_000,
        100_000,
    )
    .unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 200_000);
    let data = fs::read(&p).unwrap();
    assert!(data[..10_000].iter().all(|b| *b == 0xAB));
    assert!(data[10_000..110_000].iter().all(|b| *b == 0));
    assert!(data[110_000..].iter().all(|b| *b == 0xAB));
    // Plain fallocate extends; KEEP_SIZE does not.
    fallocate(&f, 0, 150_000, 100_000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 250_000);
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 1_000_000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 250_000);
    // Zero range.
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 0, 5).unwrap();
    assert_eq!(&fs::read(&p).unwrap()[..6], &[0, 0, 0, 0, 0, 0xAB]);
    // SEEK_DATA / SEEK_HOLE report data in 4 KiB blocks.
    let seek = |off: i64, whence: i32| {
        // SAFETY: FFI on an open descriptor.
        check_off(unsafe { libc::lseek(f.as_raw_fd(), off, whence) })
    };
    let s = m.path("sparse");
    let g = File::create(&s).unwrap();
    g.write_all_at(b"data", 1 << 20).unwrap();
    g.set_len(4 << 20).unwrap();
    let seek_g = |off: i64, whence: i32| {
        // SAFETY: FFI on an open descriptor.
        check_off(unsafe { libc::lseek(g.as_raw_fd(), off, whence) })
    };
    assert_eq!(seek_g(0, libc::SEEK_DATA).unwrap(), 1 << 20);
    assert_eq!(seek_g(0, libc::SEEK_HOLE).unwrap(), 0);
    let hole = seek_g(1 << 20, libc::SEEK_HOLE).unwrap();
    assert_eq!(hole, (1 << 20) + 4096);
    assert_eq!(errno(seek_g(2 << 20, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(seek_g(2 << 20, libc::SEEK_HOLE).unwrap(), 2 << 20);
    assert_eq!(errno(seek_g(4 << 20, libc::SEEK_HOLE)), libc::ENXIO);
    // The zeroed first 5 bytes share a block with data: data from 0; a
    // zeroed whole block is a hole, inside a cell as anywhere.
    assert_eq!(seek(0, libc::SEEK_DATA).unwrap(), 0);
    fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 0, 8192).unwrap();
    assert_eq!(seek(0, libc::SEEK_DATA).unwrap(), 8192);
    assert_eq!(seek(0, libc::SEEK_HOLE).unwrap(), 0);
    // Punching without KEEP_SIZE is not supported (as on Linux).
    assert_eq!(
        errno(fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 10)),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096)),
        libc::EOPNOTSUPP
    );
}

#[test]
fn timestamps() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    fs::write(&p, b"x").unwrap();
    let t = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let f = File::options().write(true).open(&p).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.modified().unwrap(), t);
    assert_eq!(md.accessed().unwrap(), t);
    let ctime0 = (md.ctime(), md.ctime_nsec());
    std::thread::sleep(Duration::from_millis(20));
    (&f).write_all(b"more").unwrap();
    let md = fs::metadata(&p).unwrap();
    assert!(md.modified().unwrap() > t, "write moves mtime");
    assert!((md.ctime(), md.ctime_nsec()) > ctime0, "write moves ctime");
    let ctime1 = (md.ctime(), md.ctime_nsec());
    std::thread::sleep(Duration::from_millis(20));
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    let md = fs::metadata(&p).unwrap();
    assert!((md.ctime(), md.ctime_nsec()) > ctime1, "chmod moves ctime");
    // Creating a name moves the directory's mtime.
    let dir0 = fs::metadata(&m.mnt).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    fs::write(m.path("g"), b"").unwrap();
    assert!(fs::metadata(&m.mnt).unwrap().modified().unwrap() > dir0);
    // Before 1970 works too.
    let old = UNIX_EPOCH - Duration::from_secs(86_400);
    f.set_times(fs::FileTimes::new().set_modified(old)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().modified().unwrap(), old);
}

#[test]
fn extended_attributes() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    fs::write(&p, b"").unwrap();
    setxattr(&p, "user.one", b"1", 0).unwrap();
    setxattr(&p, "user.two", b"22", 0).unwrap();
    assert_eq!(getxattr(&p, "user.two", 64).unwrap(), b"22");
    assert_eq!(getxattr(&p, "user.two", 0).unwrap().len(), 2, "size query");
    assert_eq!(errno(getxattr(&p, "user.two", 1)), libc::ERANGE);
    let mut names = listxattr(&p);
    names.sort();
    assert_eq!(names, ["user.one", "user.two"]);
    assert_eq!(
        errno(setxattr(&p, "user.one", b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        errno(setxattr(&p, "user.new", b"x", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    setxattr(&p, "user.one", b"replaced", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&p, "user.one", 64).unwrap(), b"replaced");
    removexattr(&p, "user.one").unwrap();
    assert_eq!(errno(getxattr(&p, "user.one", 64)), libc::ENODATA);
    assert_eq!(errno(removexattr(&p, "user.one")), libc::ENODATA);
    assert_eq!(errno(setxattr(&p, "bogus.ns", b"x", 0)), libc::EOPNOTSUPP);
    // One value of the kernel's maximum (65,536 bytes), as a local file
    // system takes; four of them fit in an inode, a fifth does not.
    for i in 0..4 {
        setxattr(&p, &format!("user.big{i}"), &vec![i as u8; 65_536], 0).unwrap();
    }
    assert_eq!(
        getxattr(&p, "user.big3", 65_536).unwrap(),
        vec![3u8; 65_536]
    );
    assert_eq!(
        errno(setxattr(&p, "user.big4", &vec![7u8; 65_536], 0)),
        libc::ENOSPC
    );
    // Each reads back whole.
    assert_eq!(
        getxattr(&p, "user.big0", 65_536).unwrap(),
        vec![0u8; 65_536]
    );
    // Directories and trusted.* too.
    fs::create_dir(m.path("d")).unwrap();
    setxattr(&m.path("d"), "trusted.t", b"t", 0).unwrap();
    assert_eq!(getxattr(&m.path("d"), "trusted.t", 8).unwrap(), b"t");
}

#[test]
fn errno_of_failures() {
    let Some(m) = mounted() else { return };
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"").unwrap();
    fs::write(m.path("file"), b"").unwrap();
    assert_eq!(errno(fs::create_dir(m.path("d"))), libc::EEXIST);
    assert_eq!(
        errno(
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.path("file"))
        ),
        libc::EEXIST
    );
    assert_eq!(
        errno(std::os::unix::fs::symlink("x", m.path("file"))),
        libc::EEXIST
    );
    assert_eq!(errno(fs::read(m.path("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::remove_file(m.path("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::remove_dir(m.path("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::write(m.path("nope/x"), b"")), libc::ENOENT);
    assert_eq!(errno(fs::remove_dir(m.path("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_file(m.path("d"))), libc::EISDIR);
    assert_eq!(errno(fs::remove_dir(m.path("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::metadata(m.path("file/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::create_dir(m.path("file/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::read_dir(m.path("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_dir(m.path("d/."))), libc::EINVAL);
    assert_eq!(errno(fs::read_link(m.path("file"))), libc::EINVAL);
    let long = "n".repeat(256);
    assert_eq!(errno(fs::write(m.path(&long), b"")), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::create_dir(m.path(&long))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::metadata(m.path(&long))), libc::ENAMETOOLONG);
    let ok = "n".repeat(255);
    fs::write(m.path(&ok), b"").unwrap();
    assert_eq!(
        errno(fs::hard_link(m.path("file"), m.path(&long))),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(fs::rename(m.path("file"), m.path(&long))),
        libc::ENAMETOOLONG
    );
    // The mount is not a way out of the file system.
    assert_eq!(
        errno(fs::hard_link(m.path("file"), m.tmp.path().join("outside"))),
        libc::EXDEV
    );
}

#[test]
fn unlinked_while_open() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all(b"still here").unwrap();
    let objects_with_file = m.store.objects().unwrap().len();
    fs::remove_file(&p).unwrap();
    assert_eq!(errno(fs::metadata(&p)), libc::ENOENT);
    // The handle keeps working.
    f.write_all(b", and more").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here, and more");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(
        m.store.objects().unwrap().len(),
        objects_with_file,
        "kept while open"
    );
    drop(f);
    // The last handle gone: the object goes too (the kernel's release is asynchronous).
    let mut gone = false;
    for _ in 0..200 {
        if m.store.objects().unwrap().len() == objects_with_file - 1 {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "object erased after the last close");
}

#[test]
fn readdir_and_seekdir() {
    let Some(m) = mounted() else { return };
    for i in 0..3000 {
        File::create(m.path(&format!("file-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3000);
    assert_eq!(names[0], "file-00000");
    assert_eq!(names[2999], "file-02999");
    // `.` and `..` are listed by readdir(3).
    let c = cpath(&m.mnt);
    // SAFETY: FFI: opendir/readdir/telldir/seekdir/closedir on a valid path, entries read before the next call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null());
        let mut all = Vec::new();
        let mut pos_100 = 0;
        loop {
            if all.len() == 100 {
                pos_100 = libc::telldir(d);
            }
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            all.push(std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_owned());
        }
        assert_eq!(all.len(), 3002);
        assert!(all.iter().any(|n| n.to_bytes() == b".."));
        libc::seekdir(d, pos_100);
        let e = libc::readdir(d);
        assert_eq!(
            std::ffi::CStr::from_ptr((*e).d_name.as_ptr()),
            all[100].as_c_str()
        );
        libc::closedir(d);
    }
}

#[test]
fn statfs_fsync_and_mount_names() {
    if !fuse_available() {
        return;
    }
    let mut opts = default_options();
    opts.parse("fsname=oubli-test-dev,subtype=oubli").unwrap();
    let m = Mounted::new(mem_store(), opts);
    let f = File::create(m.path("f")).unwrap();
    (&f).write_all(&[1u8; 1 << 20]).unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    File::open(&m.mnt).unwrap().sync_all().unwrap();
    let c = cpath(&m.mnt);
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: FFI with a valid path and a writable statvfs.
    check(unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) }).unwrap();
    // SAFETY: statvfs succeeded.
    let s = unsafe { s.assume_init() };
    assert_eq!(s.f_namemax, 255);
    assert!(s.f_blocks > 0 && s.f_bfree > 0);
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
        .expect("mount listed");
    assert!(line.starts_with("oubli-test-dev "), "{line}");
    assert_eq!(line.split(' ').nth(2), Some("fuse.oubli"), "{line}");
}

#[test]
fn remount_keeps_everything() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"persisted").unwrap();
    std::os::unix::fs::symlink("d/f", m.path("l")).unwrap();
    fs::set_permissions(m.path("d/f"), fs::Permissions::from_mode(0o600)).unwrap();
    setxattr(&m.path("d/f"), "user.k", b"v", 0).unwrap();
    let t = UNIX_EPOCH + Duration::new(1_234_567_890, 5);
    File::options()
        .write(true)
        .open(m.path("d/f"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    let ino = fs::metadata(m.path("d/f")).unwrap().ino();
    m.unmount();
    let m2 = Mounted::new(store, default_options());
    assert_eq!(fs::read(m2.path("d/f")).unwrap(), b"persisted");
    assert_eq!(fs::read(m2.path("l")).unwrap(), b"persisted");
    let md = fs::metadata(m2.path("d/f")).unwrap();
    assert_eq!((md.mode() & 0o7777, md.ino()), (0o600, ino));
    assert_eq!(md.modified().unwrap(), t);
    assert_eq!(getxattr(&m2.path("d/f"), "user.k", 8).unwrap(), b"v");
    assert_eq!(fs::metadata(m2.path("d")).unwrap().nlink(), 2);
}

#[test]
fn read_only_mount() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    fs::write(m.path("f"), b"kept").unwrap();
    m.unmount();
    let epoch = store.epoch();
    let mut opts = default_options();
    opts.parse("ro").unwrap();
    let mut m = Mounted::new(store.clone(), opts);
    assert_eq!(fs::read(m.path("f")).unwrap(), b"kept");
    assert_eq!(errno(fs::write(m.path("f"), b"x")), libc::EROFS);
    assert_eq!(errno(fs::remove_file(m.path("f"))), libc::EROFS);
    assert_eq!(errno(fs::create_dir(m.path("d"))), libc::EROFS);
    m.unmount();
    assert_eq!(store.epoch(), epoch, "a read-only mount writes nothing");
}

/// Writes and truncates by a user without CAP_FSETID drop set-id bits as a
/// local file system's do, root's keep them, and file capabilities go at
/// a write, a truncate and a chown: the mount, not the kernel, does both
/// (FUSE_HANDLE_KILLPRIV_V2, which spares a GETXATTR at every write(2)).
#[test]
fn writes_truncates_and_chowns_drop_set_id_bits_and_capabilities() {
    let Some(m) = mounted() else { return };
    let p = m.path("f");
    fs::write(&p, vec![1u8; 8192]).unwrap();
    std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
    let set = |bits: u32| fs::set_permissions(&p, fs::Permissions::from_mode(bits)).unwrap();
    let bits = || fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
    let write = || {
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"x", 100).unwrap();
    };
    let truncate = || {
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(4000).unwrap();
    };
    // By the owner (uid 1000, in the file's group): (mode before, change,
    // mode after, what went wrong otherwise).
    let by_owner: [(u32, &dyn Fn(), u32, &str); 4] = [
        // Set-user-ID: dropped by a write and a truncate.
        (0o4666, &write, 0o666, "set-user-ID kept by a write"),
        (0o4666, &truncate, 0o666, "set-user-ID kept by a truncate"),
        // Set-group-ID without group execute, writer in the group: kept.
        (
            0o2666,
            &write,
            0o2666,
            "set-group-ID dropped for a group member",
        ),
        // Group-executable: dropped.
        (0o2676, &write, 0o676, "group-executable set-group-ID kept"),
    ];
    for (before, change, after, why) in by_owner {
        set(before);
        as_user(1000, 1000, change);
        assert_eq!(bits(), after, "{why}");
    }
    // Root (CAP_FSETID) keeps both.
    set(0o6666);
    write();
    truncate();
    assert_eq!(bits(), 0o6666, "root's write dropped a set-id bit");
    // File capabilities (cap_net_bind_service, revision 2) go at a write,
    // a truncate and a chown, whoever makes them.
    let caps: [u8; 20] = [0, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    set(0o755);
    let ways: [(&str, &dyn Fn()); 3] = [
        ("write", &write),
        ("truncate", &truncate),
        ("chown", &|| {
            std::os::unix::fs::chown(&p, Some(1001), None).unwrap()
        }),
    ];
    for (way, change) in ways {
        setxattr(&p, "security.capability", &caps, 0).unwrap();
        assert_eq!(getxattr(&p, "security.capability", 64).unwrap(), caps);
        change();
        assert_eq!(
            errno(getxattr(&p, "security.capability", 64)),
            libc::ENODATA,
            "file capabilities kept by a {way}"
        );
    }
}

/// fallocate, punch hole and zero range by an unprivileged user drop the
/// set-id bits as a local file system does (set-user-ID always;
/// set-group-ID when group-executable or the caller is outside the group);
/// root keeps them.
#[test]
fn fallocate_by_an_unprivileged_user_drops_set_id_bits() {
    let Some(m) = mounted() else { return };
    let fallocate = |p: &Path, mode: i32| {
        let f = OpenOptions::new().write(true).open(p).unwrap();
        // SAFETY: FFI on an open descriptor.
        check(unsafe { libc::fallocate(f.as_raw_fd(), mode, 0, 4096) }).unwrap();
    };
    let modes = [
        0,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        libc::FALLOC_FL_ZERO_RANGE,
    ];
    for (i, mode) in modes.into_iter().enumerate() {
        let p = m.path(&format!("f{i}"));
        fs::write(&p, vec![1u8; 8192]).unwrap();
        std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
        let set = |bits: u32| fs::set_permissions(&p, fs::Permissions::from_mode(bits)).unwrap();
        let bits = || fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        // Set-user-ID: dropped for the owner too.
        set(0o4666);
        as_user(1000, 1000, || fallocate(&p, mode));
        assert_eq!(bits(), 0o666, "mode {mode}: set-user-ID kept");
        // Set-group-ID without group execute, caller in the group: kept.
        set(0o2666);
        as_user(1000, 1000, || fallocate(&p, mode));
        assert_eq!(
            bits(),
            0o2666,
            "mode {mode}: set-group-ID dropped for a group member"
        );
        // ... caller outside the group: dropped.
        as_user(1001, 1001, || fallocate(&p, mode));
        assert_eq!(
            bits(),
            0o666,
            "mode {mode}: set-group-ID kept for an outsider"
        );
        // Both bits, outsider: both go, though the kernel drops set-user-ID
        // itself first and caches the mode it set (xfstests generic/683).
        set(0o6666);
        as_user(1001, 1001, || fallocate(&p, mode));
        assert_eq!(bits(), 0o666, "mode {mode}: outsider kept a set-id bit");
        // Group-executable: dropped even for a member.
        set(0o2676);
        as_user(1000, 1000, || fallocate(&p, mode));
        assert_eq!(
            bits(),
            0o676,
            "mode {mode}: group-executable set-group-ID kept"
        );
        // Root keeps them (CAP_FSETID).
        set(0o6777);
        fallocate(&p, mode);
        assert_eq!(bits(), 0o6777, "mode {mode}: root dropped set-id bits");
    }
}

/// A setting of the mount's backing device (bdi.rs) as the mount meets it:
/// `get` reads it through sysfs; the kernel gives every FUSE mount
/// `kernel`; as root the mount sets `raised` unasked and each of `asked`
/// (option, value) when told (value 0: the kernel's); `invalid` options are
/// refused when parsed; without root an explicit option is refused rather
/// than silently ignored, and the kernel's value stays.
struct DeviceSetting {
    get: fn(&Path) -> std::io::Result<u32>,
    kernel: u32,
    raised: u32,
    asked: &'static [(&'static str, u32)],
    invalid: &'static [&'static str],
}

impl DeviceSetting {
    fn check(&self) {
        if !fuse_available() {
            return;
        }
        let value = |opts: &str| {
            let mut o = default_options();
            o.parse(opts).unwrap();
            let m = Mounted::new(mem_store(), o);
            (self.get)(&m.mnt).unwrap()
        };
        for bad in self.invalid {
            assert!(default_options().parse(bad).is_err(), "{bad} accepted");
        }
        // SAFETY: FFI call without arguments that cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            let mut o = default_options();
            o.parse(self.asked[0].0).unwrap();
            let tmp = tempfile::tempdir().unwrap();
            let refused = oubli_fuse::mount(mem_store(), tmp.path(), o);
            assert!(matches!(refused, Err(oubli_fuse::Error::Options(_))));
            assert_eq!(value(""), self.kernel, "left as the kernel gives it");
            return;
        }
        assert_eq!(value(""), self.raised, "not raised unasked");
        for &(opts, want) in self.asked {
            let want = if want == 0 { self.kernel } else { want };
            assert_eq!(value(opts), want, "-o {opts}");
        }
    }
}

/// The readahead window: 128 KiB from the kernel, 1 MiB as root,
/// `-o readahead=KIB`.
#[test]
fn the_readahead_window_is_raised_and_takes_an_option() {
    DeviceSetting {
        get: oubli_fuse::bdi::readahead,
        kernel: 128,
        raised: 1024,
        asked: &[
            ("readahead=256", 256),
            ("readahead=4096", 4096),
            ("readahead=0", 0),
        ],
        invalid: &["readahead=65537", "readahead=lots"],
    }
    .check();
}

/// The share of the system's dirty-page limit: 1 % from the kernel, 10 %
/// as root, `-o dirty_share=PERCENT`.
#[test]
fn the_dirty_page_share_is_raised_and_takes_an_option() {
    DeviceSetting {
        get: oubli_fuse::bdi::dirty_share,
        kernel: 1,
        raised: oubli_fuse::bdi::DEFAULT_DIRTY_SHARE,
        asked: &[("dirty_share=25", 25), ("dirty_share=0", 0)],
        invalid: &["dirty_share=101", "dirty_share=half"],
    }
    .check();
}

/// Access-time options are mount flags (not FUSE data options): accepted,
/// and visible in /proc/self/mounts; `dev` and `suid` are honoured as root.
#[test]
fn atime_options_dev_and_suid_reach_the_mount() {
    if !fuse_available() {
        return;
    }
    let mount_line = |m: &Mounted| {
        fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
            .expect("mount listed")
            .to_string()
    };
    let mut opts = default_options();
    opts.parse("nodiratime,strictatime,lazytime").unwrap();
    let m = Mounted::new(mem_store(), opts);
    let line = mount_line(&m);
    assert!(
        line.contains("nodiratime") && !line.contains("relatime"),
        "{line}"
    );
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    fs::write(m.path("f"), b"x").unwrap();
    drop(m);

    let mut opts = default_options();
    opts.parse("relatime,dev,suid").unwrap();
    let m = Mounted::new(mem_store(), opts);
    let line = mount_line(&m);
    assert!(line.contains("relatime"), "{line}");
    assert!(
        !line.contains("nosuid") && !line.contains("nodev"),
        "{line}"
    );
    // A device node made on the mount opens (/dev/null's numbers).
    let node = cpath(&m.path("null"));
    // SAFETY: FFI with a valid path.
    check(unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) })
        .unwrap();
    OpenOptions::new()
        .write(true)
        .open(m.path("null"))
        .unwrap()
        .write_all(b"into /dev/null")
        .unwrap();
}

/// A mount of a fresh store on a 24 MiB tmpfs of its own, that file
/// system's space reported by statfs; `None` (skipped, said why) without
/// FUSE or without root to mount the tmpfs. The tmpfs goes with the guard.
fn mounted_on_a_small_disk() -> Option<(tempfile::TempDir, impl Drop, Mounted)> {
    if !fuse_available() {
        return None;
    }
    let small = tempfile::tempdir().unwrap();
    let target = cpath(small.path());
    let (tmpfs, size) = (
        std::ffi::CString::new("tmpfs").unwrap(),
        std::ffi::CString::new("size=24m").unwrap(),
    );
    // SAFETY: FFI with valid C strings.
    if unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            target.as_ptr(),
            tmpfs.as_ptr(),
            0,
            size.as_ptr().cast(),
        )
    } != 0
    {
        eprintln!(
            "skipped: mounting a tmpfs needs root ({})",
            std::io::Error::last_os_error()
        );
        return None;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: FFI with a valid C string.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let unmount = Unmount(target);
    let dir = small.path().join("store");
    let medium = oubli_media::DirMedium::create(&dir).unwrap();
    let store = store_on(std::sync::Arc::new(medium), store_options());
    let mut opts = default_options();
    opts.space_from = Some(dir);
    // Dropped in reverse: the mount, then the tmpfs, then its directory.
    Some((small, unmount, Mounted::new(store, opts)))
}

/// On a store whose file system is nearly full, fallocate that could not be
/// written later fails with ENOSPC at once, and statfs reports that file
/// system's size. (Needs root to mount a 24 MiB tmpfs for the store.)
#[test]
fn fallocate_beyond_the_free_space_fails_with_enospc() {
    let Some((_small, _unmount, m)) = mounted_on_a_small_disk() else {
        return;
    };
    let f = File::create(m.path("big")).unwrap();
    let fallocate = |len: i64| {
        // SAFETY: FFI on an open descriptor.
        check(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) })
    };
    assert_eq!(errno(fallocate(64 << 20)), libc::ENOSPC);
    assert_eq!(
        f.metadata().unwrap().len(),
        0,
        "a refused fallocate changed the size"
    );
    fallocate(4 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 4 << 20);
    let c = cpath(&m.mnt);
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: FFI with a valid path and a writable statvfs.
    check(unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) }).unwrap();
    // SAFETY: statvfs succeeded.
    let s = unsafe { s.assume_init() };
    let total = s.f_blocks * s.f_frsize;
    assert!(
        (20 << 20..=28 << 20).contains(&total),
        "statfs reports {total} bytes"
    );
}

/// Data the store has no room for is reported to the program that wrote
/// it, at close(2) at the latest, for every file: the mount answers FLUSH
/// with ENOSYS (no round trip per close after the first), and the kernel
/// still writes a file's cached pages back at close and returns their
/// error. Both files are bigger than the disk; each must fail (a write
/// refused at once without the writeback cache, else the close), and a
/// small file written after them is whole. (Needs root, as above.)
#[test]
fn every_close_reports_data_the_store_had_no_room_for() {
    let Some((_small, _unmount, m)) = mounted_on_a_small_disk() else {
        return;
    };
    use std::os::fd::IntoRawFd;
    let chunk = vec![0x5au8; 1 << 20];
    for name in ["first", "second"] {
        let mut f = File::create(m.path(name)).unwrap();
        let written = (0..40).try_for_each(|_| f.write_all(&chunk));
        // SAFETY: FFI on a descriptor this test owns (taken from `f`).
        let closed = check(unsafe { libc::close(f.into_raw_fd()) });
        match (written, closed) {
            (Err(e), _) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{name}: {e}"),
            (Ok(()), Err(e)) => assert!(
                matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EIO)),
                "{name}: close failed with {e}"
            ),
            (Ok(()), Ok(_)) => {
                panic!("{name}: 40 MiB on a 24 MiB disk, and close reported nothing")
            }
        }
        // Its space comes back once the removal is committed. The purge's
        // syncfs reports the failed writeback once more (the file system's
        // error not yet seen by a syncfs), after its commit; the next is clean.
        fs::remove_file(m.path(name)).unwrap();
        if let Err(e) = m.session().purge() {
            assert!(e.to_string().contains("writing back"), "{e}");
            m.session().purge().unwrap();
        }
    }
    fs::write(m.path("small"), b"fits").unwrap();
    assert_eq!(fs::read(m.path("small")).unwrap(), b"fits");
}

/// `st_blocks` counts the 4 KiB blocks that hold data, not the size: a
/// sparse file looks sparse (as `cp --sparse`, `tar -S` and `rsync -S`
/// test it), a full one does not, and both agree with SEEK_DATA/SEEK_HOLE.
#[test]
fn st_blocks_counts_stored_bytes() {
    let Some(m) = mounted() else { return };
    let sparse = m.path("sparse");
    let f = File::create(&sparse).unwrap();
    f.set_len(100_001).unwrap();
    f.write_all_at(b"x", 100_000).unwrap();
    // Blocks count what the mount stores: with the writeback cache, once
    // the kernel has written the byte back (FUSE.md, "The writeback cache").
    f.sync_all().unwrap();
    let meta = fs::metadata(&sparse).unwrap();
    assert_eq!(meta.len(), 100_001);
    assert_eq!(
        meta.blocks() * 512,
        4096,
        "one byte written reports {} blocks",
        meta.blocks()
    );
    // SAFETY: FFI on an open descriptor.
    let data = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(data, 100_000 - 100_000 % 4096);
    f.sync_all().unwrap();
    assert_eq!(
        fs::metadata(&sparse).unwrap().blocks() * 512,
        4096,
        "after the flush too"
    );

    let full = m.path("full");
    fs::write(&full, vec![7u8; 100_001]).unwrap();
    assert!(fs::metadata(&full).unwrap().blocks() * 512 >= 100_001);
    // Punching whole cells gives their space back.
    let f = OpenOptions::new().write(true).open(&full).unwrap();
    // SAFETY: FFI on an open descriptor.
    check(unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            65_536,
        )
    })
    .unwrap();
    let after = fs::metadata(&full).unwrap().blocks() * 512;
    assert_eq!(
        after,
        (100_001u64 - 65_536).div_ceil(4096) * 4096,
        "{after} bytes after punching 64 KiB"
    );
    // A copy with holes kept is as sparse as the original.
    let copy = m.path("copy");
    let out = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&sparse)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(fs::metadata(&copy).unwrap().blocks() * 512 <= 4096);
    assert_eq!(fs::read(&copy).unwrap(), fs::read(&sparse).unwrap());
}

/// fallocate preallocates inside the file: the range counts in
/// `st_blocks` and reads as zeros (a hole for SEEK_DATA, as an unwritten
/// extent of ext4 or XFS), writing into it does not grow the allocation
/// (xfstests generic/568), and data already there is kept.
#[test]
fn fallocate_preallocates_inside_the_file() {
    let Some(m) = mounted() else { return };
    let p = m.path("prealloc");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all_at(b"keep", 40_000).unwrap();
    // SAFETY: FFI on an open descriptor.
    check(unsafe { libc::fallocate(f.as_raw_fd(), 0, 4095, 100_000) }).unwrap();
    let blocks = || fs::metadata(&p).unwrap().blocks() * 512;
    let before = blocks();
    assert_eq!(before, (104_095u64.div_ceil(4096)) * 4096);
    // SAFETY: FFI on an open descriptor.
    let data = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(data, 36_864, "preallocated blocks are holes until written");
    f.write_all_at(b"xy", 4095).unwrap();
    // SAFETY: FFI on an open descriptor.
    let data = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(data, 0, "the block holding byte 4095 is data");
    f.write_all_at(&[5u8; 8192], 60_000).unwrap();
    assert_eq!(blocks(), before);
    let back = fs::read(&p).unwrap();
    assert_eq!(back.len(), 104_095);
    assert_eq!(&back[40_000..40_004], b"keep");
    assert_eq!(&back[4095..4097], b"xy");
    assert!(back[4097..40_000].iter().all(|b| *b == 0));
}

/// fallocate stores nothing: a large preallocation costs no data on the
/// medium (it once stored zeros, twice the writes for a file written
/// after it); the ranges it notes survive a remount and shrink with
/// truncation and punching. The first write into a file preallocated
/// empty chooses its cells: the store's when it starts the file with at
/// least a whole cell (a stream), small ones otherwise (in place).
#[test]
fn fallocate_stores_nothing_and_the_first_write_chooses_the_cells() {
    if !fuse_available() {
        return;
    }
    const MIB: u64 = 1 << 20;
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    let blocks = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    let preallocated = |name: &str, len: u64| {
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(m.path(name))
            .unwrap();
        fallocate(&f, 0, 0, len as i64).unwrap();
        f
    };
    let stored = |s: &oubli_core::Store| {
        s.flush().unwrap();
        s.status().unwrap().medium_bytes
    };
    let cells = |p: &Path| store.cell_size_of(fs::metadata(p).unwrap().ino()).unwrap();

    let before = stored(&store);
    let idle = preallocated("idle", 64 * MIB);
    let grown = stored(&store) - before;
    assert!(grown < 64 << 10, "a 64 MiB fallocate stored {grown} bytes");
    assert_eq!(blocks(&m.path("idle")), 64 * MIB);
    assert!(fs::read(m.path("idle")).unwrap().iter().all(|b| *b == 0));
    drop(idle);

    let stream = preallocated("stream", 8 * MIB);
    let chunk = vec![0x5Au8; MIB as usize];
    for i in 0..8 {
        stream.write_all_at(&chunk, i * MIB).unwrap();
        if i == 0 {
            // With the writeback cache the first write the mount sees is
            // the kernel's writeback, whose first request a flusher under
            // the mount's dirty limit may cut short (CI saw 4 KiB cells
            // once): written back at once, the stream starts at offset 0.
            stream.sync_data().unwrap();
        }
    }
    stream.sync_all().unwrap();
    assert_eq!(
        cells(&m.path("stream")),
        32768,
        "a streamed file keeps the store's cells"
    );
    assert_eq!(blocks(&m.path("stream")), 8 * MIB);
    let in_place = preallocated("in-place", 8 * MIB);
    in_place.write_all_at(&[1u8; 4096], 3 * MIB).unwrap();
    in_place.sync_all().unwrap();
    assert_eq!(
        cells(&m.path("in-place")),
        4096,
        "written at random: small cells"
    );
    let header = preallocated("header", 8 * MIB);
    header.write_all_at(&[2u8; 4096], 0).unwrap();
    header.sync_all().unwrap();
    assert_eq!(
        cells(&m.path("header")),
        4096,
        "a page at the start: small cells"
    );
    assert_eq!(blocks(&m.path("header")), 8 * MIB);
    drop((stream, in_place, header));

    m.unmount();
    m = Mounted::new(store.clone(), default_options());
    let idle = m.path("idle");
    assert_eq!(
        blocks(&idle),
        64 * MIB,
        "the preallocation survives a remount"
    );
    let f = OpenOptions::new().write(true).open(&idle).unwrap();
    fallocate(
        &f,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        0,
        MIB as i64,
    )
    .unwrap();
    assert_eq!(
        blocks(&idle),
        63 * MIB,
        "punching gives preallocated room back"
    );
    f.set_len(2 * MIB).unwrap();
    f.set_len(4 * MIB).unwrap();
    assert_eq!(blocks(&idle), MIB, "truncation drops what lies past it");
    assert!(fs::read(&idle).unwrap().iter().all(|b| *b == 0));
}

/// A 4 KiB punch inside a 32 KiB cell, and the gap between two writes in
/// one cell, are holes for SEEK_DATA/SEEK_HOLE and `st_blocks` alike, and
/// stay holes across a remount; writing into them makes them data again.
#[test]
fn holes_inside_a_cell_are_holes() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    let blocks = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    let seek = |p: &Path, off: i64, whence: i32| {
        let f = File::open(p).unwrap();
        // SAFETY: FFI on an open descriptor.
        check_off(unsafe { libc::lseek(f.as_raw_fd(), off, whence) }).unwrap()
    };
    let punched = m.path("punched");
    fs::write(&punched, vec![9u8; 3 * 32768]).unwrap();
    let f = OpenOptions::new().write(true).open(&punched).unwrap();
    // SAFETY: FFI on an open descriptor.
    check(unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            4096,
            4096,
        )
    })
    .unwrap();
    drop(f);
    let gaps = m.path("gaps");
    let g = File::create(&gaps).unwrap();
    g.write_all_at(b"head", 10).unwrap();
    g.write_all_at(b"tail", 20_000).unwrap();
    drop(g);
    for round in ["mounted", "remounted"] {
        let (punched, gaps) = (m.path("punched"), m.path("gaps"));
        assert_eq!(seek(&punched, 0, libc::SEEK_HOLE), 4096, "{round}");
        assert_eq!(seek(&punched, 4096, libc::SEEK_DATA), 8192, "{round}");
        assert_eq!(blocks(&punched), 3 * 32768 - 4096, "{round}");
        assert_eq!(seek(&gaps, 0, libc::SEEK_HOLE), 4096, "{round}");
        assert_eq!(seek(&gaps, 4096, libc::SEEK_DATA), 16384, "{round}");
        assert_eq!(blocks(&gaps), 2 * 4096, "{round}");
        let data = fs::read(&punched).unwrap();
        assert!(data[4096..8192].iter().all(|b| *b == 0), "{round}");
        assert!(data[..4096].iter().chain(&data[8192..]).all(|b| *b == 9));
        m.unmount();
        m = Mounted::new(store.clone(), default_options());
    }
    let gaps = m.path("gaps");
    OpenOptions::new()
        .write(true)
        .open(&gaps)
        .unwrap()
        .write_all_at(&[1u8; 4096], 4096)
        .unwrap();
    assert_eq!(seek(&gaps, 0, libc::SEEK_HOLE), 8192);
    assert_eq!(blocks(&gaps), 3 * 4096);
}

/// A file handle (name_to_handle_at) opens again with open_by_handle_at
/// after a remount — nothing of the kernel's caches is left — for a file
/// and a directory; a deleted file's handle is stale. (NFS re-export needs
/// the same.)
#[test]
fn file_handles_survive_a_remount() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/f"), b"by handle").unwrap();
    fs::write(m.path("gone"), b"x").unwrap();
    let handle_of = |p: &Path| -> Vec<u8> {
        let c = cpath(p);
        // struct file_handle: u32 handle_bytes, i32 handle_type, then the bytes (MAX_HANDLE_SZ 128).
        let mut buf = vec![0u8; 8 + 128];
        buf[..4].copy_from_slice(&128u32.to_ne_bytes());
        let mut mount_id = 0;
        // SAFETY: FFI with a valid path and a buffer laid out as struct file_handle.
        check(unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                libc::AT_FDCWD,
                c.as_ptr(),
                buf.as_mut_ptr(),
                &mut mount_id as *mut libc::c_int,
                0,
            ) as libc::c_int
        })
        .expect("name_to_handle_at");
        buf
    };
    let file = handle_of(&m.path("d/f"));
    let dir = handle_of(&m.path("d"));
    let gone = handle_of(&m.path("gone"));
    fs::remove_file(m.path("gone")).unwrap();
    m.unmount();
    let m = Mounted::new(store, default_options());
    let root = File::open(&m.mnt).unwrap();
    let open = |h: &[u8], flags: i32| {
        let mut h = h.to_vec();
        // SAFETY: FFI with an open mount descriptor and a struct file_handle buffer.
        check(unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                root.as_raw_fd(),
                h.as_mut_ptr(),
                flags,
            ) as libc::c_int
        })
    };
    let fd = open(&file, libc::O_RDONLY).expect("open_by_handle_at of a file after a remount");
    // SAFETY: the descriptor was just opened and is owned here.
    let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut text = String::new();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "by handle");
    let fd = open(&dir, libc::O_RDONLY | libc::O_DIRECTORY).expect("a directory's handle");
    // SAFETY: as above.
    drop(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    assert_eq!(errno(open(&gone, libc::O_RDONLY)), libc::ESTALE);
}

/// noatime never moves the access time; strictatime moves it at every
/// access, even one the page cache serves; relatime (the default) only when
/// it is older than the last change.
#[test]
fn access_time_follows_the_mount_mode() {
    if !fuse_available() {
        return;
    }
    let atime = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.atime(), m.atime_nsec())
    };
    for (option, moves_first, moves_again) in [
        ("noatime", false, false),
        ("strictatime", true, true),
        ("relatime", true, false),
    ] {
        let mut opts = default_options();
        opts.parse(option).unwrap();
        let m = Mounted::new(mem_store(), opts);
        let p = m.path("f");
        fs::write(&p, b"data").unwrap();
        let before = atime(&p);
        std::thread::sleep(Duration::from_millis(1100));
        fs::read(&p).unwrap();
        let after_first = atime(&p);
        assert_eq!(after_first != before, moves_first, "{option}: first read");
        std::thread::sleep(Duration::from_millis(1100));
        fs::read(&p).unwrap();
        assert_eq!(
            atime(&p) != after_first,
            moves_again,
            "{option}: second read"
        );
    }
}
