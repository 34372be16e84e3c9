//! The kernel's caches (names, attributes, pages, listings) against removals it does not make itself: a redaction through the control path, a snapshot removed; a listing the kernel keeps across opens, reset under a reader halfway through it. A stale name disappears at once and its data never reads again (docs/FUSE.md, "The kernel's caches").

mod common;
use common::*;
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Fills the kernel's caches with `names`: their entries and attributes
/// (stat), the listings of their directories, and the pages of the files.
fn cache(m: &Mounted, names: &[&str]) {
    for n in names {
        let p = m.path(n);
        let md = fs::metadata(&p).unwrap();
        if md.is_dir() {
            fs::read_dir(&p).unwrap().for_each(drop);
        } else {
            fs::read(&p).unwrap();
        }
        fs::metadata(&p).unwrap();
    }
}

/// Whatever `name` now gives: its bytes, or the errno that refused them.
fn read_by_name(m: &Mounted, name: &str) -> Result<Vec<u8>, i32> {
    let mut out = Vec::new();
    File::open(m.path(name))
        .and_then(|mut f| f.read_to_end(&mut out))
        .map(|_| out)
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// A redaction removes names the kernel holds in its caches, one of them
/// a file another reader keeps open (so the object outlives the name, for
/// that reader only, as after an unlink): every removed name is gone at
/// once — stat and open answer ENOENT, never the cached entry and never the
/// bytes — the listings no longer show them, and the open reader's fstat
/// shows no link left.
#[test]
fn a_redacted_name_leaves_the_kernel_caches_at_once() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let p = |n: &str| m.path(n);
    fs::create_dir_all(p("case/docs")).unwrap();
    fs::write(p("case/docs/report"), b"SECRET report").unwrap();
    fs::write(p("case/summary"), b"SECRET summary").unwrap();
    fs::hard_link(p("case/summary"), p("summary-link")).unwrap();
    fs::write(p("keep"), b"unrelated").unwrap();
    let removed = [
        "case/docs/report",
        "case/docs",
        "case/summary",
        "case",
        "summary-link",
    ];
    cache(&m, &removed);
    cache(&m, &["", "keep"]);
    let reader = File::open(p("case/summary")).unwrap();
    assert_eq!(reader.metadata().unwrap().nlink(), 2);

    let r = m.session().handle().redact(Path::new("case")).unwrap();
    assert_eq!(r.still_open, 1, "the summary is open");
    for name in removed {
        assert_eq!(
            errno(fs::symlink_metadata(p(name))),
            libc::ENOENT,
            "{name}: the name outlived its redaction in the kernel's cache"
        );
        assert_eq!(
            read_by_name(&m, name),
            Err(libc::ENOENT),
            "{name}: opened by its removed name"
        );
    }
    let listed: Vec<_> = fs::read_dir(p(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, ["keep"], "the root's listing");
    assert_eq!(
        reader.metadata().unwrap().nlink(),
        0,
        "the open reader's fstat still counts the removed links"
    );
    assert_eq!(fs::read(p("keep")).unwrap(), b"unrelated");
}

/// A redaction changes directories whose attributes and listing the
/// kernel holds without the removed names in its cache (a fresh mount:
/// only the parent was looked at): the parent's link count and listing are
/// right at once.
#[test]
fn a_redaction_refreshes_the_directories_it_changed() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    fs::create_dir_all(m.path("top/case/sub")).unwrap();
    fs::write(m.path("top/case/f"), b"SECRET").unwrap();
    fs::write(m.path("top/kept"), b"kept").unwrap();
    m.unmount();
    let m = Mounted::new(store, default_options());
    assert_eq!(fs::metadata(m.path("top")).unwrap().nlink(), 3);
    m.session().handle().redact(Path::new("top/case")).unwrap();
    assert_eq!(
        fs::metadata(m.path("top")).unwrap().nlink(),
        2,
        "the parent's cached link count outlived the redaction"
    );
    let listed: Vec<_> = fs::read_dir(m.path("top"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, ["kept"]);
}

/// A snapshot removed while the kernel holds its names, attributes and a
/// file of it open: its names are gone at once and nothing of it reads
/// again, through the old names or the open file (snapshots are never
/// cached by the kernel: they change without it).
#[test]
fn a_removed_snapshot_leaves_the_kernel_caches_at_once() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let p = |n: &str| m.path(n);
    fs::create_dir(p("dir")).unwrap();
    fs::write(p("dir/f"), b"SECRET in a snapshot").unwrap();
    let handle = m.session().handle();
    handle.quiesced(|s| s.snapshot_create("s", None)).unwrap();
    let names = [".snapshots/s/dir/f", ".snapshots/s/dir", ".snapshots/s"];
    cache(&m, &names);
    let mut reader = File::open(p(".snapshots/s/dir/f")).unwrap();

    handle.quiesced(|s| s.snapshot_remove("s")).unwrap();
    for name in names {
        assert_eq!(
            errno(fs::symlink_metadata(p(name))),
            libc::ENOENT,
            "{name}: the snapshot's name outlived it"
        );
        assert_eq!(read_by_name(&m, name), Err(libc::ENOENT), "{name}");
    }
    let mut buf = Vec::new();
    assert!(
        reader.read_to_end(&mut buf).is_err(),
        "the removed snapshot's file read {:?}",
        String::from_utf8_lossy(&buf)
    );
    assert_eq!(fs::read(p("dir/f")).unwrap(), b"SECRET in a snapshot");
}

/// The names one `getdents64` call on `dir` gives, at most about `bytes`
/// of them (`.` and `..` left out); empty at the end of the listing.
fn next_names(dir: &File, bytes: usize) -> Vec<String> {
    let mut buf = vec![0u8; bytes];
    // SAFETY: FFI: the kernel writes at most `buf.len()` bytes into `buf`,
    // which outlives the call, through a descriptor `dir` keeps open.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            dir.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    assert!(n >= 0, "getdents64: {}", std::io::Error::last_os_error());
    let (mut at, mut names) = (0, Vec::new());
    while at < n as usize {
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
        let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
        let name = &buf[at + 19..at + reclen];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
        if name != b"." && name != b".." {
            names.push(String::from_utf8(name.to_vec()).unwrap());
        }
        at += reclen;
    }
    names
}

/// The first page of `dir`'s listing, `bytes` of it: some names, fewer
/// than `under` (so that the listing goes on after them).
fn first_page(dir: &File, bytes: usize, under: usize) -> Vec<String> {
    let page = next_names(dir, bytes);
    assert!(!page.is_empty() && page.len() < under, "{}", page.len());
    page
}

/// Pages through the rest of `dir`'s listing, `bytes` at a time, into `seen`.
fn read_on_to_the_end(dir: &File, bytes: usize, seen: &mut Vec<String>) {
    loop {
        let more = next_names(dir, bytes);
        if more.is_empty() {
            return;
        }
        seen.extend(more);
    }
}

/// `seen` holds no name twice and every name of `survivors`.
fn assert_each_listed_once(seen: &[String], survivors: &HashSet<String>) {
    let mut once = HashSet::new();
    let twice: Vec<_> = seen.iter().filter(|n| !once.insert(n.as_str())).collect();
    assert!(twice.is_empty(), "listed twice: {twice:?}");
    let lost: Vec<_> = survivors
        .iter()
        .filter(|n| !once.contains(n.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} names never listed: {lost:?}",
        lost.len()
    );
}

fn listing(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// The kernel keeps a directory's listing across opens (FOPEN_CACHE_DIR).
/// A reader halfway through it removes the names it has read; another
/// reader then lists the changed directory, which makes the kernel drop
/// the old listing and take a new one; the first reader goes on from
/// where it stopped. It gets every name that was never removed exactly
/// once (what POSIX promises, and what `rm -rf` of a large directory needs:
/// with offsets that were positions in a listing it went on at the same
/// position of the new, shorter one and skipped as many names as had gone),
/// and the second reader none of the removed names.
#[test]
fn a_listing_reset_halfway_by_another_reader_loses_no_name() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    let dir = m.path("big");
    fs::create_dir(&dir).unwrap();
    let all: HashSet<String> = (0..400).map(|i| format!("name-{i:04}")).collect();
    for n in &all {
        File::create(dir.join(n)).unwrap();
    }
    assert_eq!(
        listing(&dir).len(),
        all.len(),
        "the listing the kernel keeps"
    );

    let reader = File::open(&dir).unwrap();
    let mut seen = first_page(&reader, 1024, all.len() / 4);
    let removed: HashSet<String> = seen.iter().cloned().collect();
    for n in &removed {
        fs::remove_file(dir.join(n)).unwrap();
    }
    let survivors: HashSet<String> = all.difference(&removed).cloned().collect();
    let relisted = listing(&dir);
    assert_eq!(
        relisted.len(),
        survivors.len(),
        "the second reader's listing"
    );
    assert!(
        relisted.iter().all(|n| survivors.contains(n)),
        "a removed name listed"
    );

    read_on_to_the_end(&reader, 1024, &mut seen);
    assert_each_listed_once(&seen, &survivors);
}

/// The same for `.snapshots`, whose listing changes without the kernel
/// (listed afresh at each request, never cached): snapshots removed
/// while a reader pages through it, after the reader has got their names,
/// leave it every other snapshot's name exactly once (with positions for
/// offsets it skipped as many as had gone).
#[test]
fn a_snapshot_removed_while_snapshots_are_listed_moves_no_other_name() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    fs::write(m.path("f"), b"data").unwrap();
    let handle = m.session().handle();
    let all: HashSet<String> = (0..60).map(|i| format!("snapshot-{i:03}")).collect();
    for n in &all {
        handle.quiesced(|s| s.snapshot_create(n, None)).unwrap();
    }
    let reader = File::open(m.path(".snapshots")).unwrap();
    let mut seen = first_page(&reader, 512, all.len() / 3);
    let removed: HashSet<String> = seen.iter().cloned().collect();
    for n in &removed {
        handle.quiesced(|s| s.snapshot_remove(n)).unwrap();
    }
    read_on_to_the_end(&reader, 512, &mut seen);
    let survivors = all.difference(&removed).cloned().collect();
    assert_each_listed_once(&seen, &survivors);
}
