//! The file system proper: inodes, names, open handles and the erasure rules over `Store` objects, independent of the kernel protocol.
//!
//! Every inode is a store object (inode number = object id); its POSIX
//! attributes live in the object's metadata ([`crate::meta`]); directories are
//! directory objects. Nothing is erased here: the engine's delete, unlink,
//! truncate, punch and overwrite do that at the next commit. What this layer
//! decides is *when* to call them — on the last link and the last handle —
//! and when to commit at once (anything marked sensitive).
//!
//! Locks, outermost first: `gate` (namespace operations take it exclusively,
//! data mutations and flushes shared: no engine commit or flush can fall
//! between the steps of one namespace operation), then the inode table, then
//! one inode at a time; the engine's own lock is innermost. The table lock is
//! never taken while an inode lock is held.
//!
//! The submodules hold `Fs`'s operations by concern: [`inodes`] the inode
//! table, [`dir`] names (lookup, create, link, remove, rename, listings),
//! [`io`] file contents, [`attr`] attributes, extended attributes and
//! permissions, [`snap`] snapshots and redaction. This file holds the types
//! they share and the whole-file-system operations (mount, statfs, flush,
//! purge, unmount).

mod attr;
mod dir;
mod inodes;
mod io;
mod notify;
mod snap;
#[cfg(test)]
mod tests;

pub(crate) use attr::SetAttr;
pub(crate) use dir::{after_offset, DirEntry};
use dir::{DirHandle, DirOffsets};
use inodes::Inodes;
use io::{net_of_overhead, AtimeMode};

use crate::meta::{Attr, Timestamp, S_IFDIR, S_IFLNK, S_IFMT};
use crate::options::MountOptions;
use fuser::{Errno, FileType};
use oubli_core::{EpochPolicy, Error as StoreError, Store, ROOT_DIR};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

pub(crate) type R<T> = Result<T, Errno>;

/// Longest name accepted (as most file systems; `statfs` reports it).
pub(crate) const NAME_MAX: usize = 255;
/// The extended attribute that marks a file or directory sensitive.
pub const SENSITIVE_XATTR: &[u8] = b"user.oubli.sensitive";
/// The extended attribute that names a key share: on a directory, every
/// file created beneath it is placed under the share; on an empty file, the
/// file itself (docs/FUSE.md, "Key shares").
pub const SHARE_XATTR: &[u8] = b"user.oubli.share";

const S_ISUID: u32 = libc::S_ISUID;
const S_ISGID: u32 = libc::S_ISGID;
const S_IXGRP: u32 = libc::S_IXGRP;

/// Who asks: the caller's credentials from the kernel request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// The calling process (its supplementary groups are read from /proc when needed).
    pub pid: u32,
}

impl Caller {
    /// Whether the caller is in group `gid`: its primary group, or one of
    /// the supplementary groups of its process (FUSE requests carry only the first).
    fn in_group(&self, gid: u32) -> bool {
        if self.gid == gid {
            return true;
        }
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .ok()
            .and_then(|status| {
                let line = status.lines().find(|l| l.starts_with("Groups:"))?;
                Some(line[7..].split_whitespace().any(|g| g.parse() == Ok(gid)))
            })
            .unwrap_or(false)
    }
}

/// Maps an engine error to the errno a program sees.
pub(crate) fn errno(e: StoreError) -> Errno {
    match e {
        StoreError::NoObject(_) | StoreError::NoName(_) => Errno::ENOENT,
        StoreError::Exists(_) => Errno::EEXIST,
        StoreError::Invalid(_) => Errno::EINVAL,
        StoreError::ReadOnly => Errno::EROFS,
        StoreError::NoSpace(_) => Errno::ENOSPC,
        other => {
            eprintln!("oubli-fuse: store error: {other}");
            Errno::EIO
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in one request must not wedge the mount: the state it guarded
    // is still consistent enough to serve (each update is a single assignment).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One inode in memory.
pub(crate) struct Node {
    oid: u64,
    st: Mutex<State>,
}

struct State {
    attr: Attr,
    /// The object's size (symlinks: the target's length).
    size: u64,
    /// `attr` holds changes not yet in the store (timestamps only: everything
    /// else is written through at once).
    dirty: bool,
    /// References the kernel holds (lookups minus forgets).
    lookups: u64,
    /// Open file handles.
    opens: u32,
    /// The object is gone from the store (served from memory until forgotten).
    deleted: bool,
    /// Bytes the object stores (its cells' ranges): `st_blocks`. Counted
    /// when asked, forgotten by every change to the data.
    stored: std::cell::Cell<Option<u64>>,
    /// Preallocated while it held no data: its first write chooses its
    /// cells (DESIGN §3). Kept in memory only: after a remount the engine's
    /// own rule decides.
    cells_undecided: bool,
}

impl Node {
    /// An inode in memory as the store holds it: nothing unwritten, not
    /// deleted, its stored bytes not yet counted.
    fn new(oid: u64, attr: Attr, size: u64, lookups: u64, opens: u32) -> Arc<Node> {
        Arc::new(Node {
            oid,
            st: Mutex::new(State {
                attr,
                size,
                dirty: false,
                lookups,
                opens,
                deleted: false,
                stored: std::cell::Cell::new(None),
                cells_undecided: false,
            }),
        })
    }
}

impl State {
    fn sensitive(&self) -> bool {
        self.attr.xattrs.contains_key(SENSITIVE_XATTR)
    }

    /// Refuses changes to another front-end's objects (the NBD exports and their directory).
    fn changeable(&self) -> R<()> {
        if self.attr.protected {
            Err(Errno::EPERM)
        } else {
            Ok(())
        }
    }
}

/// What `statfs` reports.
pub(crate) struct FsStat {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
}

pub(crate) struct Fs {
    pub(crate) store: Arc<Store>,
    gate: RwLock<()>,
    table: Mutex<Inodes>,
    dirs: Mutex<HashMap<u64, DirHandle>>,
    /// Where each name sits in a listing (dir.rs).
    dir_offsets: DirOffsets,
    next_fh: AtomicU64,
    orphans: u64,
    owner: (u32, u32),
    blksize: u32,
    read_only: bool,
    space_from: Option<PathBuf>,
    /// The root's listing shows `.snapshots` (`-o snapdir=visible`).
    show_snapdir: bool,
    /// When reads move the access time.
    atime: AtimeMode,
    /// The kernel's writeback cache is on: it owns size, mtime and ctime of
    /// the files it caches and sends them by setattr (io.rs, attr.rs).
    pub(crate) writeback: bool,
    /// Held by the one request that has the kernel write a file's pages back
    /// (`SEEK_DATA`/`SEEK_HOLE`, io.rs); `None` with a single request loop,
    /// which could not serve those writes while it waits.
    writing_back: Option<Mutex<()>>,
    /// Tells the kernel about names removed other than by its own requests (redaction).
    pub(crate) notifier: std::sync::OnceLock<fuser::Notifier>,
    /// Names removed in the open epoch: what the message names when the
    /// unmount's commit fails and they stay recoverable.
    removed: Mutex<Removed>,
    /// What the unmount left undone, once it ran ([`Fs::destroy`]).
    unfinished: Mutex<Option<crate::Unfinished>>,
}

/// Names removed in one epoch (the open one): a bounded list, and a count past it.
#[derive(Default)]
struct Removed {
    epoch: u64,
    /// Each removal, oldest first (at most [`REMOVED_LISTED`]).
    names: Vec<Removal>,
    more: usize,
}

/// One name removed: from directory `dir`, the object it named, and that
/// object's size then (0 for a directory).
struct Removal {
    dir: u64,
    name: Vec<u8>,
    oid: u64,
    bytes: u64,
}

/// How many removed names a failed unmount names (the rest are counted).
const REMOVED_NAMED: usize = 20;

/// How many removals of one epoch the mount keeps for the certificate of
/// its commit (the rest are counted): a path is ~100 bytes, so ~10 MB at most.
pub(crate) const REMOVED_LISTED: usize = 100_000;

fn kind_of(mode: u32) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

impl Fs {
    /// Prepares a store for mounting: gives the root directory POSIX
    /// attributes on first use, creates the orphan list, and erases what a
    /// crash left in it (files unlinked while open).
    pub(crate) fn new(store: Arc<Store>, opts: &MountOptions) -> Result<Fs, StoreError> {
        // SAFETY: FFI calls without arguments that cannot fail.
        let me = unsafe { (libc::geteuid(), libc::getegid()) };
        let owner = opts.root_owner.unwrap_or(me);
        let status = store.status()?;
        let root_rec = store.object(ROOT_DIR)?;
        let mut root = Attr::decode(&root_rec.meta, true, owner).map_err(StoreError::Corrupt)?;
        let mut changed = false;
        if root.foreign {
            let now = Timestamp::now();
            let fresh = Attr::new(S_IFDIR | 0o755, owner.0, owner.1, now);
            root = Attr {
                parent: ROOT_DIR,
                ..fresh
            };
            changed = true;
        }
        if let (Some(p), false) = (&opts.policy, opts.read_only) {
            // The mount's triggers replace the store's; unset ones keep the store's.
            let current = status.policy.clone();
            store.set_policy(EpochPolicy {
                interval: p.interval.or(current.interval),
                bytes: p.bytes.or(current.bytes),
                deletions: p.deletions.or(current.deletions),
            });
        }
        let mut record = root.fs.clone().unwrap_or_default();
        if !opts.read_only {
            if record.orphans == 0 {
                let list = Attr::new(S_IFDIR | 0o700, 0, 0, Timestamp::now());
                record.orphans = store.create_object(&list.encode())?;
                changed = true;
            }
            // Files unlinked while open when the last session ended (crash):
            // their last link is gone, so they are erased now.
            for (name, oid) in store.list(record.orphans)? {
                let unlinked = match store.object(oid) {
                    Ok(rec) => Attr::decode(&rec.meta, false, owner)
                        .map(|a| a.nlink == 0)
                        .unwrap_or(true),
                    Err(StoreError::NoObject(_)) => false,
                    Err(e) => return Err(e),
                };
                if unlinked {
                    store.delete(oid)?;
                }
                store.unlink(record.orphans, &name)?;
                changed = true;
            }
            if !record.mounted {
                record.mounted = true;
                changed = true;
            }
        }
        root.fs = Some(record.clone());
        if changed && !opts.read_only {
            store.set_meta(ROOT_DIR, &root.encode())?;
            store.flush()?;
        }
        let fs = Fs {
            store,
            gate: RwLock::new(()),
            table: Mutex::new(Inodes::default()),
            dirs: Mutex::new(HashMap::new()),
            dir_offsets: DirOffsets::new(),
            next_fh: AtomicU64::new(1),
            orphans: record.orphans,
            owner,
            blksize: status.cell_size.max(64 * 1024),
            read_only: opts.read_only,
            space_from: opts.space_from.clone(),
            show_snapdir: opts.snapdir_visible,
            atime: AtimeMode::of(opts),
            writeback: opts.writeback_cache && !opts.read_only,
            writing_back: (opts.threads > 1).then(|| Mutex::new(())),
            notifier: std::sync::OnceLock::new(),
            removed: Mutex::new(Removed::default()),
            unfinished: Mutex::new(None),
        };
        let node = Node::new(ROOT_DIR, root, 0, 1, 0);
        lock(&fs.table).insert(ROOT_DIR, node);
        Ok(fs)
    }

    /// Commits now because something sensitive was deleted or overwritten.
    fn commit_now(&self) {
        if let Err(e) = self.store.commit() {
            eprintln!("oubli-fuse: commit after deleting sensitive data failed (retried at the next commit): {e}");
        }
    }

    pub(crate) fn statfs(&self) -> R<FsStat> {
        let status = self.store.status().map_err(errno)?;
        let bsize: u64 = 4096;
        let used = status.medium_bytes.max(status.live_bytes);
        let (total, free, avail) = match self.room() {
            // What data can still take: the host's free space less the
            // sealing overhead (the same share fallocate checks against).
            Some((total, free, avail)) => (
                total.max(used + free),
                net_of_overhead(free),
                net_of_overhead(avail),
            ),
            // Unknown medium: report the used space plus a nominal 1 TiB free.
            None => (used + (1 << 40), 1 << 40, 1 << 40),
        };
        let files: u64 = 1 << 32;
        let inodes = {
            let table = lock(&self.table);
            (table.loaded.len() + table.shed.len()) as u64
        };
        Ok(FsStat {
            blocks: total / bsize,
            bfree: free / bsize,
            bavail: avail / bsize,
            files,
            ffree: files - inodes,
            bsize: bsize as u32,
        })
    }

    /// Writes back every pending attribute change; returns how many inodes' failed.
    fn persist_all(&self) -> usize {
        let nodes: Vec<Arc<Node>> = lock(&self.table).loaded.values().cloned().collect();
        let mut failed = 0;
        for node in nodes {
            let mut st = lock(&node.st);
            if st.dirty {
                if let Err(e) = self.persist(node.oid, &mut st) {
                    eprintln!("oubli-fuse: writing back attributes of {}: {e:?}", node.oid);
                    failed += 1;
                }
            }
        }
        failed
    }

    /// The erasure barrier: pending attributes written, then the epoch ends.
    pub(crate) fn purge(&self) -> Result<(), StoreError> {
        let _g = self.exclusive();
        self.persist_all();
        self.store.purge()
    }

    /// Makes everything durable without ending the epoch.
    pub(crate) fn flush_all(&self) -> Result<(), StoreError> {
        let _g = self.exclusive();
        self.persist_all();
        self.store.flush()
    }

    /// Timer: lets the store's epoch policy fire on an idle store (the
    /// interval); between requests, so that no commit splits a namespace operation.
    pub(crate) fn tick(&self) {
        if self.read_only {
            return;
        }
        let _g = self.exclusive();
        self.store.tick();
    }

    /// Unmount: pending attributes written, the mounted flag cleared, the
    /// epoch committed. What did not happen is kept for [`Fs::take_unfinished`]:
    /// the session's end reports it, so that nobody takes a failed commit
    /// (deletions still recoverable) for a clean unmount.
    pub(crate) fn destroy(&self) {
        if self.read_only {
            return;
        }
        let _g = self.exclusive();
        let mut unwritten = self.persist_all();
        if let Some(root) = self.cached(ROOT_DIR) {
            let mut st = lock(&root.st);
            if let Some(fs) = st.attr.fs.as_mut() {
                fs.mounted = false;
            }
            if let Err(e) = self.persist(ROOT_DIR, &mut st) {
                eprintln!("oubli-fuse: writing the root directory at unmount: {e:?}");
                unwritten += 1;
            }
        }
        let commit = self.store.commit().err();
        // The commit failed: its writes may still reach the intent log.
        let flush = commit.as_ref().and_then(|e| {
            eprintln!("oubli-fuse: commit at unmount failed: {e}");
            self.store.flush().err()
        });
        if commit.is_none() && unwritten == 0 {
            return;
        }
        let pending_deletions = self
            .store
            .status()
            .map(|s| s.pending_deletions)
            .unwrap_or_default();
        let (removed, removed_more) = self.removed_paths();
        *lock(&self.unfinished) = Some(crate::Unfinished {
            commit,
            flush,
            attributes_unwritten: unwritten,
            pending_deletions,
            removed,
            removed_more,
        });
    }

    /// What the unmount left undone, if it ran and left anything.
    pub(crate) fn take_unfinished(&self) -> Option<crate::Unfinished> {
        lock(&self.unfinished).take()
    }

    /// Notes a name removed in the open epoch: what a failed final commit
    /// names, and what the certificate of the commit lists.
    fn note_removed(&self, dir: u64, name: &[u8], oid: u64) {
        // The node is still loaded (the caller holds it) and no lock of it is held.
        let bytes = self
            .cached(oid)
            .map(|node| {
                let st = lock(&node.st);
                if st.attr.is_dir() {
                    0
                } else {
                    st.size
                }
            })
            .unwrap_or(0);
        let epoch = self.store.epoch();
        let mut r = lock(&self.removed);
        if r.epoch != epoch {
            // A commit landed since: what was noted is erased.
            *r = Removed {
                epoch,
                ..Removed::default()
            };
        }
        if r.names.len() < REMOVED_LISTED {
            r.names.push(Removal {
                dir,
                name: name.to_vec(),
                oid,
                bytes,
            });
        } else {
            r.more += 1;
        }
    }

    /// The names removed in the open epoch as paths from the mount's root
    /// (`.../NAME` where the directory's place is not known any more), at
    /// most [`REMOVED_NAMED`] for a message, and how many more were removed.
    fn removed_paths(&self) -> (Vec<String>, usize) {
        let r = lock(&self.removed);
        if r.epoch != self.store.epoch() {
            return (Vec::new(), 0);
        }
        let mut paths = RemovedPaths::new(&r.names);
        let named = r
            .names
            .iter()
            .take(REMOVED_NAMED)
            .map(|removal| match paths.of(self, removal) {
                unknown if unknown.starts_with(".../") => unknown,
                path => format!("/{path}"),
            })
            .collect();
        let more = r.names.len().saturating_sub(REMOVED_NAMED) + r.more;
        (named, more)
    }

    /// What was removed in the open epoch, for the certificate of its
    /// commit: each removal's path (relative to the mount's root), object,
    /// size, and what still holds the object (another name, an open file,
    /// snapshots). Run quiesced, so that the store shows every attribute.
    pub(crate) fn removals(&self) -> crate::Removals {
        let r = lock(&self.removed);
        if r.epoch != self.store.epoch() {
            return crate::Removals::default();
        }
        let mut paths = RemovedPaths::new(&r.names);
        let list = r
            .names
            .iter()
            .map(|removal| {
                let (still_linked, still_open) = match self.fetch(removal.oid) {
                    Ok((attr, _)) => (attr.nlink > 0, attr.nlink == 0),
                    Err(_) => (false, false),
                };
                crate::RemovedPath {
                    path: paths.of(self, removal),
                    object_id: removal.oid,
                    bytes: removal.bytes,
                    still_linked,
                    still_open,
                    snapshots: self
                        .store
                        .snapshots_holding(removal.oid)
                        .unwrap_or_default(),
                }
            })
            .collect();
        crate::Removals {
            paths: list,
            more: r.more as u64,
        }
    }

    #[cfg(test)]
    pub(crate) fn fs_record(&self) -> Option<crate::meta::FsRecord> {
        let root = self.cached(ROOT_DIR)?;
        let st = lock(&root.st);
        st.attr.fs.clone()
    }
}

/// Paths of removed names, resolving each directory once: up its parent
/// links while it lives, or through the removal that removed it (the
/// latest one noted for that object).
struct RemovedPaths<'a> {
    names: &'a [Removal],
    /// Object id → the last removal of it.
    removal_of: HashMap<u64, usize>,
    /// Directory → its path from the root (`None`: not known).
    dirs: HashMap<u64, Option<String>>,
}

impl<'a> RemovedPaths<'a> {
    fn new(names: &'a [Removal]) -> RemovedPaths<'a> {
        let removal_of = names.iter().enumerate().map(|(i, r)| (r.oid, i)).collect();
        RemovedPaths {
            names,
            removal_of,
            dirs: HashMap::new(),
        }
    }

    /// The path of `removal` without a leading `/` (`.../NAME` where its
    /// directory's place is not known).
    fn of(&mut self, fs: &Fs, removal: &Removal) -> String {
        let name = String::from_utf8_lossy(&removal.name);
        match self.dir(fs, removal.dir, 0) {
            Some(d) if d.is_empty() => name.into_owned(),
            Some(d) => format!("{d}/{name}"),
            None => format!(".../{name}"),
        }
    }

    /// The path of directory `dir` from the root (`""` for the root).
    fn dir(&mut self, fs: &Fs, dir: u64, depth: usize) -> Option<String> {
        if dir == ROOT_DIR {
            return Some(String::new());
        }
        if let Some(known) = self.dirs.get(&dir) {
            return known.clone();
        }
        if depth > 4096 {
            return None;
        }
        let found = match self.removal_of.get(&dir) {
            Some(&i) => Some((self.names[i].dir, self.names[i].name.clone())),
            None => fs.fetch(dir).ok().and_then(|(attr, _)| {
                let parent = attr.parent;
                let (name, _) = fs
                    .store
                    .list(parent)
                    .ok()?
                    .into_iter()
                    .find(|(_, target)| *target == dir)?;
                Some((parent, name))
            }),
        };
        let path = found.and_then(|(parent, name)| {
            let above = self.dir(fs, parent, depth + 1)?;
            let name = String::from_utf8_lossy(&name);
            Some(if above.is_empty() {
                name.into_owned()
            } else {
                format!("{above}/{name}")
            })
        });
        self.dirs.insert(dir, path.clone());
        path
    }
}
