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

use crate::meta::{Attr, Timestamp, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::options::MountOptions;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use oubli_core::{EpochPolicy, Error as StoreError, Store, ROOT_DIR};
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) type R<T> = Result<T, Errno>;

/// Longest name accepted (as most file systems; `statfs` reports it).
pub(crate) const NAME_MAX: usize = 255;
/// Room for extended attributes per inode (names + values): four values of
/// the kernel's maximum (64 KiB) and their names. They live in the object's
/// metadata, which is rewritten whole on every change of the inode's
/// attributes, so an inode with large ones makes those changes cost more.
pub(crate) const XATTR_ROOM: usize = 4 * (64 * 1024 + 256);
/// The extended attribute that marks a file or directory sensitive.
pub const SENSITIVE_XATTR: &[u8] = b"user.oubli.sensitive";
/// The extended attribute that names a key share: on a directory, every
/// file created beneath it is placed under the share; on an empty file, the
/// file itself (docs/FUSE.md, "Key shares").
pub const SHARE_XATTR: &[u8] = b"user.oubli.share";
/// Prefix of the names a `RENAME_EXCHANGE` parks one side under while it swaps (visible, so a crash loses nothing).
const EXCHANGE_PREFIX: &str = ".oubli-exchange-";

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

/// Inodes kept whole in memory. The kernel references every inode it has
/// in its cache (a million after a walk of a million files) until memory
/// pressure makes it forget them; past this many, clean inodes nobody is
/// using are shed to their lookup count and loaded again when asked for, so
/// the mount's memory does not grow with the kernel's cache (about 300 B per
/// whole inode, 32 B per shed one).
pub(crate) const LOADED_INODES_MAX: usize = 1 << 16;

/// The inodes the kernel knows: whole, or shed to their lookup count.
#[derive(Default)]
struct Inodes {
    loaded: HashMap<u64, Arc<Node>>,
    /// Lookups of inodes whose state was dropped (clean, unused, not deleted).
    shed: HashMap<u64, u64>,
}

impl Inodes {
    fn insert(&mut self, oid: u64, node: Arc<Node>) {
        self.loaded.insert(oid, node);
        if self.loaded.len() > LOADED_INODES_MAX {
            self.shed_unused(LOADED_INODES_MAX / 4);
        }
    }

    /// Sheds up to `count` inodes that only this table holds (no request
    /// has them: every `Arc` is cloned under the table's lock) and that hold
    /// nothing the store lacks: no open handle, no pending attribute, not
    /// deleted (an unlinked inode lives only here until forgotten).
    fn shed_unused(&mut self, count: usize) {
        let victims: Vec<(u64, u64)> = self
            .loaded
            .iter()
            .filter(|(&oid, node)| oid != ROOT_DIR && Arc::strong_count(node) == 1)
            .filter_map(|(&oid, node)| {
                let st = node.st.try_lock().ok()?;
                (st.opens == 0 && !st.dirty && !st.deleted).then_some((oid, st.lookups))
            })
            .take(count)
            .collect();
        for (oid, lookups) in victims {
            self.loaded.remove(&oid);
            if lookups > 0 {
                self.shed.insert(oid, lookups);
            }
        }
    }
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

/// An open directory: its listing, taken once per handle (readdir pages through it).
struct DirHandle {
    oid: u64,
    entries: Option<Arc<Vec<DirEntry>>>,
}

pub(crate) struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
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

/// Changes a `setattr` asks for.
#[derive(Default)]
pub(crate) struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// `Some(None)`: now.
    pub atime: Option<Option<Timestamp>>,
    pub mtime: Option<Option<Timestamp>>,
    pub ctime: Option<Timestamp>,
}

pub(crate) struct Fs {
    pub(crate) store: Arc<Store>,
    gate: RwLock<()>,
    table: Mutex<Inodes>,
    dirs: Mutex<HashMap<u64, DirHandle>>,
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
    /// (directory, name, object) of each removal, oldest first.
    names: Vec<(u64, Vec<u8>, u64)>,
    more: usize,
}

/// How many removed names a failed unmount names (the rest are counted).
const REMOVED_NAMED: usize = 20;

/// The access-time mode of a mount, from its options (the last one wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AtimeMode {
    Never,
    Relative,
    Strict,
}

impl AtimeMode {
    fn of(opts: &MountOptions) -> AtimeMode {
        let mut mode = AtimeMode::Relative;
        for o in opts.extra.iter().chain(&opts.atime) {
            mode = match o.as_str() {
                "noatime" => AtimeMode::Never,
                "atime" | "relatime" | "nostrictatime" => AtimeMode::Relative,
                "strictatime" | "norelatime" => AtimeMode::Strict,
                _ => mode,
            };
        }
        mode
    }
}

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

fn check_name(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// The orphan list's name for an object: its id, fixed width so it sorts.
fn orphan_name(oid: u64) -> [u8; 8] {
    oid.to_be_bytes()
}

/// The granularity at which data and holes are reported (`lseek`,
/// `st_blocks`): a page, as local file systems report blocks. Cells store
/// byte ranges; a block holding any byte of data is data.
pub(crate) const DATA_BLOCK: u64 = 4096;

/// Byte ranges `(start, len)`, ascending, as runs of whole data blocks `(start, end)`.
fn data_blocks(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(start, len) in ranges {
        let s = start - start % DATA_BLOCK;
        let e = (start + len).div_ceil(DATA_BLOCK) * DATA_BLOCK;
        match out.last_mut() {
            Some((_, pe)) if *pe >= s => *pe = (*pe).max(e),
            _ => out.push((s, e)),
        }
    }
    out
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
            next_fh: AtomicU64::new(1),
            orphans: record.orphans,
            owner,
            blksize: status.cell_size.max(64 * 1024),
            read_only: opts.read_only,
            space_from: opts.space_from.clone(),
            show_snapdir: opts.snapdir_visible,
            atime: AtimeMode::of(opts),
            notifier: std::sync::OnceLock::new(),
            removed: Mutex::new(Removed::default()),
            unfinished: Mutex::new(None),
        };
        let node = Arc::new(Node {
            oid: ROOT_DIR,
            st: Mutex::new(State {
                attr: root,
                size: 0,
                dirty: false,
                lookups: 1,
                opens: 0,
                deleted: false,
                stored: std::cell::Cell::new(None),
                cells_undecided: false,
            }),
        });
        lock(&fs.table).insert(ROOT_DIR, node);
        Ok(fs)
    }

    // --- locks and inode table -------------------------------------------

    fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    fn writable(&self) -> R<()> {
        if self.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// Reads an object's attributes and size from the store.
    fn fetch(&self, oid: u64) -> R<(Attr, u64)> {
        let rec = self.store.object(oid).map_err(errno)?;
        let attr = Attr::decode(&rec.meta, oid == ROOT_DIR, self.owner).map_err(|e| {
            eprintln!("oubli-fuse: object {oid}: {e}");
            Errno::EIO
        })?;
        let mut attr = attr;
        if attr.protected && !self.store.list(oid).map_err(errno)?.is_empty() {
            // Another front-end's directory object: browsable, read-only.
            attr.mode = S_IFDIR | 0o555;
            attr.nlink = 2;
            attr.parent = ROOT_DIR;
        }
        let size = match &attr.symlink {
            Some(t) => t.len() as u64,
            None => rec.size,
        };
        Ok((attr, size))
    }

    /// The inode in memory, loading it if needed; `lookups` references are added for the kernel.
    fn node_ref(&self, oid: u64, lookups: u64) -> R<Arc<Node>> {
        let mut table = lock(&self.table);
        let node = match table.loaded.get(&oid) {
            Some(n) => n.clone(),
            None => {
                let (attr, size) = self.fetch(oid)?;
                let node = Arc::new(Node {
                    oid,
                    st: Mutex::new(State {
                        attr,
                        size,
                        dirty: false,
                        lookups: table.shed.remove(&oid).unwrap_or(0),
                        opens: 0,
                        deleted: false,
                        stored: std::cell::Cell::new(None),
                        cells_undecided: false,
                    }),
                });
                table.insert(oid, node.clone());
                node
            }
        };
        if lookups > 0 {
            lock(&node.st).lookups += lookups;
        }
        Ok(node)
    }

    fn node(&self, oid: u64) -> R<Arc<Node>> {
        self.node_ref(oid, 0)
    }

    /// The inode if it is in memory (the table lock is released on return).
    fn cached(&self, oid: u64) -> Option<Arc<Node>> {
        lock(&self.table).loaded.get(&oid).cloned()
    }

    /// Drops an inode from memory once neither the kernel nor a handle uses it (writing back pending changes).
    fn evict_if_unused(&self, oid: u64) {
        let mut table = lock(&self.table);
        let Some(node) = table.loaded.get(&oid).cloned() else {
            return;
        };
        let mut st = lock(&node.st);
        if st.lookups > 0 || st.opens > 0 || oid == ROOT_DIR {
            return;
        }
        if st.dirty && !st.deleted {
            // Under the table lock, so nobody reloads the stale copy meanwhile.
            if let Err(e) = self.persist(oid, &mut st) {
                eprintln!("oubli-fuse: writing back attributes of {oid}: {e:?}");
            }
        }
        table.loaded.remove(&oid);
    }

    /// Writes an inode's attributes to its object.
    fn persist(&self, oid: u64, st: &mut State) -> R<()> {
        // Another front-end's metadata is never replaced by ours.
        if st.deleted || self.read_only || st.attr.protected {
            return Ok(());
        }
        self.store.set_meta(oid, &st.attr.encode()).map_err(errno)?;
        st.dirty = false;
        st.attr.foreign = false;
        Ok(())
    }

    /// Attributes of an object for a listing, without keeping it in memory.
    fn peek_kind(&self, oid: u64) -> Option<FileType> {
        if let Some(node) = lock(&self.table).loaded.get(&oid) {
            return Some(kind_of(lock(&node.st).attr.mode));
        }
        self.fetch(oid).ok().map(|(a, _)| kind_of(a.mode))
    }

    fn file_attr(&self, oid: u64, st: &State) -> FileAttr {
        let a = &st.attr;
        let size = if a.is_dir() { 4096 } else { st.size };
        FileAttr {
            ino: INodeNo(oid),
            size,
            blocks: self.stored_bytes(oid, st).div_ceil(512),
            atime: a.atime.to_system(),
            mtime: a.mtime.to_system(),
            ctime: a.ctime.to_system(),
            crtime: a.btime.to_system(),
            kind: kind_of(a.mode),
            perm: (a.mode & 0o7777) as u16,
            nlink: if st.deleted { 0 } else { a.nlink },
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: self.blksize,
            flags: 0,
        }
    }

    /// What `st_blocks` counts: for a regular file, the 4 KiB blocks
    /// ([`DATA_BLOCK`]) that hold data (holes, never-written ranges and
    /// punched ranges are not counted, so sparse files look sparse, as
    /// `SEEK_DATA`/`SEEK_HOLE` say: the same blocks); for other inodes,
    /// their size.
    fn stored_bytes(&self, oid: u64, st: &State) -> u64 {
        if st.attr.kind() != S_IFREG || st.deleted || st.size == 0 {
            return if st.attr.is_dir() { 4096 } else { st.size };
        }
        if let Some(n) = st.stored.get() {
            return n;
        }
        match self.store.extents(oid, 0, st.size) {
            Ok(mut ranges) => {
                // Preallocated ranges count as well (a write into them does
                // not grow the count, as on a local file system).
                let size = st.size;
                let prealloc = st.attr.prealloc.iter().filter(|&&(s, _)| s < size);
                ranges.extend(prealloc.map(|&(s, e)| (s, e.min(size) - s)));
                ranges.sort_unstable();
                let n = data_blocks(&ranges).iter().map(|(s, e)| e - s).sum();
                st.stored.set(Some(n));
                n
            }
            Err(_) => st.size,
        }
    }

    /// Commits now because something sensitive was deleted or overwritten.
    fn commit_now(&self) {
        if let Err(e) = self.store.commit() {
            eprintln!("oubli-fuse: commit after deleting sensitive data failed (retried at the next commit): {e}");
        }
    }

    /// The directory `oid`, checked to be one and to exist.
    fn dir(&self, oid: u64) -> R<Arc<Node>> {
        let node = self.node(oid)?;
        {
            let st = lock(&node.st);
            if !st.attr.is_dir() {
                return Err(Errno::ENOTDIR);
            }
            if st.deleted {
                return Err(Errno::ENOENT);
            }
        }
        Ok(node)
    }

    /// Touches a directory's mtime/ctime (kept in memory; written back lazily).
    fn touch_dir(&self, dir: &Node, now: Timestamp) -> bool {
        let mut st = lock(&dir.st);
        st.attr.mtime = now;
        st.attr.ctime = now;
        st.dirty = true;
        st.sensitive()
    }

    /// Adjusts a directory's link count (subdirectories) and touches it; written through.
    fn adjust_dir(&self, dir: &Node, delta: i32, now: Timestamp) -> R<bool> {
        let mut st = lock(&dir.st);
        st.attr.nlink = st.attr.nlink.saturating_add_signed(delta).max(2);
        st.attr.mtime = now;
        st.attr.ctime = now;
        self.persist(dir.oid, &mut st)?;
        Ok(st.sensitive())
    }

    // --- lookups and attributes -----------------------------------------

    pub(crate) fn lookup(&self, parent: u64, name: &[u8]) -> R<FileAttr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if name == b"." {
            // Of any inode: the kernel decodes a file handle (NFS export,
            // open_by_handle_at) by looking up "." in the inode it names.
            let node = self.node_ref(parent, 1)?;
            let st = lock(&node.st);
            if st.deleted {
                return Err(Errno::ESTALE);
            }
            return Ok(self.file_attr(parent, &st));
        }
        let dir = self.dir(parent)?;
        let oid = match name {
            b".." => lock(&dir.st).attr.parent.max(ROOT_DIR),
            _ => self
                .store
                .lookup(parent, name)
                .map_err(errno)?
                .ok_or(Errno::ENOENT)?,
        };
        let node = self.node_ref(oid, 1)?;
        let st = lock(&node.st);
        Ok(self.file_attr(oid, &st))
    }

    pub(crate) fn forget(&self, ino: u64, n: u64) {
        {
            let mut table = lock(&self.table);
            if let Some(lookups) = table.shed.get_mut(&ino) {
                *lookups = lookups.saturating_sub(n);
                if *lookups == 0 {
                    table.shed.remove(&ino);
                }
                return;
            }
        }
        if let Some(node) = self.cached(ino) {
            let mut st = lock(&node.st);
            st.lookups = st.lookups.saturating_sub(n);
        }
        self.evict_if_unused(ino);
    }

    pub(crate) fn getattr(&self, ino: u64) -> R<FileAttr> {
        let node = self.node(ino)?;
        let st = lock(&node.st);
        Ok(self.file_attr(ino, &st))
    }

    pub(crate) fn setattr(&self, ino: u64, req: SetAttr, _caller: Caller) -> R<FileAttr> {
        self.writable()?;
        let _g = self.shared();
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        let now = Timestamp::now();
        let mut erased = false;
        if let Some(size) = req.size {
            match st.attr.kind() {
                S_IFREG => {}
                S_IFDIR => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if !st.deleted {
                self.store.truncate(ino, size).map_err(errno)?;
            }
            st.stored.set(None);
            erased = size < st.size;
            st.attr.unpreallocate(size, u64::MAX);
            if size != st.size || req.mtime.is_none() {
                st.attr.mtime = now;
            }
            st.size = size;
        }
        if let Some(mode) = req.mode {
            st.attr.mode = (st.attr.mode & S_IFMT) | (mode & 0o7777);
        }
        if let Some(uid) = req.uid {
            st.attr.uid = uid;
        }
        if let Some(gid) = req.gid {
            st.attr.gid = gid;
        }
        if (req.uid.is_some() || req.gid.is_some())
            && req.mode.is_none()
            && st.attr.kind() != S_IFDIR
        {
            // chown clears set-user-ID and (group-executable) set-group-ID, as the kernel would.
            let m = st.attr.mode;
            if m & S_ISUID != 0 || m & (S_ISGID | S_IXGRP) == (S_ISGID | S_IXGRP) {
                st.attr.mode &= !(S_ISUID | S_ISGID);
            }
        }
        if let Some(t) = req.atime {
            st.attr.atime = t.unwrap_or(now);
        }
        if let Some(t) = req.mtime {
            st.attr.mtime = t.unwrap_or(now);
        }
        st.attr.ctime = req.ctime.unwrap_or(now);
        self.persist(ino, &mut st)?;
        let sensitive = st.sensitive();
        let attr = self.file_attr(ino, &st);
        drop(st);
        if erased && sensitive {
            self.commit_now();
        }
        Ok(attr)
    }

    pub(crate) fn readlink(&self, ino: u64) -> R<Vec<u8>> {
        let node = self.node(ino)?;
        let st = lock(&node.st);
        st.attr.symlink.clone().ok_or(Errno::EINVAL)
    }

    // --- creating names ---------------------------------------------------

    /// Creates an object of `attr` named `name` in `parent`; returns its inode with one kernel reference (and `opens` handles).
    fn new_child(&self, parent: u64, name: &[u8], mut attr: Attr, opens: u32) -> R<FileAttr> {
        self.writable()?;
        check_name(name)?;
        let _g = self.exclusive();
        let dir = self.dir(parent)?;
        if self.store.lookup(parent, name).map_err(errno)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let now = attr.ctime;
        {
            let pst = lock(&dir.st);
            pst.changeable()?;
            if pst.attr.mode & S_ISGID != 0 {
                // BSD group semantics under a set-group-ID directory, as Linux.
                attr.gid = pst.attr.gid;
                if attr.is_dir() {
                    attr.mode |= S_ISGID;
                }
            }
            if let Some(v) = pst.attr.xattrs.get(SENSITIVE_XATTR) {
                // Sensitivity is inherited by everything created inside.
                attr.xattrs.insert(SENSITIVE_XATTR.to_vec(), v.clone());
            }
            if let Some(v) = pst.attr.xattrs.get(SHARE_XATTR) {
                // So is a share, by the files (whose data it keys) and the
                // directories (which pass it on) created inside.
                if matches!(attr.kind(), S_IFREG | S_IFDIR) {
                    attr.xattrs.insert(SHARE_XATTR.to_vec(), v.clone());
                }
            }
        }
        let share = match attr.kind() {
            S_IFREG => attr.xattrs.get(SHARE_XATTR).cloned(),
            _ => None,
        };
        let is_dir = attr.is_dir();
        if is_dir {
            attr.parent = parent;
        }
        let size = attr.symlink.as_ref().map_or(0, |t| t.len() as u64);
        let oid = self.store.create_object(&attr.encode()).map_err(errno)?;
        if let Some(share) = share {
            // Before the name exists: the file is never seen outside its share.
            if let Err(e) = self.place_under_share(oid, &share) {
                let _ = self.store.delete(oid);
                return Err(e);
            }
        }
        if is_dir {
            self.adjust_dir(&dir, 1, now)?;
        } else {
            self.touch_dir(&dir, now);
        }
        if let Err(e) = self.store.link(parent, name, oid) {
            let _ = self.store.delete(oid);
            if is_dir {
                let _ = self.adjust_dir(&dir, -1, now);
            }
            return Err(errno(e));
        }
        let node = Arc::new(Node {
            oid,
            st: Mutex::new(State {
                attr,
                size,
                dirty: false,
                lookups: 1,
                opens,
                deleted: false,
                stored: std::cell::Cell::new(None),
                cells_undecided: false,
            }),
        });
        let st = lock(&node.st);
        let fa = self.file_attr(oid, &st);
        drop(st);
        lock(&self.table).insert(oid, node);
        Ok(fa)
    }

    pub(crate) fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
        caller: Caller,
    ) -> R<FileAttr> {
        let kind = match mode & S_IFMT {
            0 => S_IFREG,
            k @ (S_IFREG | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK) => k,
            _ => return Err(Errno::EINVAL),
        };
        let mut attr = created_attr(kind, mode, umask, caller);
        attr.rdev = rdev;
        self.new_child(parent, name, attr, 0)
    }

    pub(crate) fn mkdir(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> R<FileAttr> {
        let attr = created_attr(S_IFDIR, mode, umask, caller);
        self.new_child(parent, name, attr, 0)
    }

    pub(crate) fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        caller: Caller,
    ) -> R<FileAttr> {
        if target.len() >= libc::PATH_MAX as usize {
            return Err(Errno::ENAMETOOLONG);
        }
        let mut attr = Attr::new(S_IFLNK | 0o777, caller.uid, caller.gid, Timestamp::now());
        attr.symlink = Some(target.to_vec());
        self.new_child(parent, name, attr, 0)
    }

    pub(crate) fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> R<FileAttr> {
        let attr = created_attr(S_IFREG, mode, umask, caller);
        self.new_child(parent, name, attr, 1)
    }

    pub(crate) fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> R<FileAttr> {
        self.writable()?;
        check_name(newname)?;
        let _g = self.exclusive();
        let dir = self.dir(newparent)?;
        let node = self.node(ino)?;
        if self
            .store
            .lookup(newparent, newname)
            .map_err(errno)?
            .is_some()
        {
            return Err(Errno::EEXIST);
        }
        lock(&dir.st).changeable()?;
        let now = Timestamp::now();
        let mut st = lock(&node.st);
        st.changeable()?;
        if st.attr.is_dir() {
            return Err(Errno::EPERM);
        }
        if st.deleted || st.attr.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if st.attr.nlink >= u32::MAX - 1 {
            return Err(Errno::EMLINK);
        }
        // Count first, name second: a crash in between leaves one link too
        // many counted (kept data), never a name on an object counted dead.
        st.attr.nlink += 1;
        st.attr.ctime = now;
        self.persist(ino, &mut st)?;
        if let Err(e) = self.store.link(newparent, newname, ino) {
            st.attr.nlink -= 1;
            let _ = self.persist(ino, &mut st);
            return Err(errno(e));
        }
        st.lookups += 1;
        let fa = self.file_attr(ino, &st);
        drop(st);
        self.touch_dir(&dir, now);
        Ok(fa)
    }

    // --- removing names ---------------------------------------------------

    /// One link of `node` is gone (its name already removed or about to be by
    /// the caller's next engine step). With no link left, the object is
    /// erased — now, or when its last handle closes. Returns whether it was
    /// sensitive. The caller holds the gate exclusively and has put the object
    /// on the orphan list if `last` is set.
    fn drop_link(&self, node: &Node, now: Timestamp) -> R<bool> {
        let mut st = lock(&node.st);
        let sensitive = st.sensitive();
        if st.attr.is_dir() {
            st.attr.nlink = 0;
        } else {
            st.attr.nlink = st.attr.nlink.saturating_sub(1);
        }
        st.attr.ctime = now;
        if st.attr.nlink > 0 || st.opens > 0 {
            self.persist(node.oid, &mut st)?;
        }
        Ok(sensitive)
    }

    /// After the name is gone: erases the object if nothing holds it any more.
    fn finish_unlinked(&self, node: &Node) -> R<()> {
        let mut st = lock(&node.st);
        if st.attr.nlink > 0 || st.opens > 0 || st.deleted {
            return Ok(());
        }
        self.store.delete(node.oid).map_err(errno)?;
        st.deleted = true;
        drop(st);
        self.store
            .unlink(self.orphans, &orphan_name(node.oid))
            .map_err(errno)?;
        Ok(())
    }

    /// Whether removing one link of `node` removes its last one.
    fn last_link(&self, node: &Node) -> bool {
        let st = lock(&node.st);
        st.attr.is_dir() || st.attr.nlink <= 1
    }

    fn list_orphan(&self, oid: u64) -> R<()> {
        match self.store.link(self.orphans, &orphan_name(oid), oid) {
            Ok(()) | Err(StoreError::Exists(_)) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }

    pub(crate) fn unlink(&self, parent: u64, name: &[u8]) -> R<()> {
        self.remove(parent, name, false)
    }

    pub(crate) fn rmdir(&self, parent: u64, name: &[u8]) -> R<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> R<()> {
        self.writable()?;
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if want_dir && name == b"." {
            return Err(Errno::EINVAL);
        }
        if want_dir && name == b".." {
            return Err(Errno::ENOTEMPTY);
        }
        let _g = self.exclusive();
        let dir = self.dir(parent)?;
        let oid = self
            .store
            .lookup(parent, name)
            .map_err(errno)?
            .ok_or(Errno::ENOENT)?;
        let node = self.node(oid)?;
        lock(&dir.st).changeable()?;
        lock(&node.st).changeable()?;
        let is_dir = lock(&node.st).attr.is_dir();
        match (want_dir, is_dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            _ => {}
        }
        if is_dir && !self.store.list(oid).map_err(errno)?.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let now = Timestamp::now();
        let last = self.last_link(&node);
        // Orphan list first: whatever commit falls between the steps below,
        // a crash leaves the object either named or listed for erasure.
        if last {
            self.list_orphan(oid)?;
        }
        let mut sensitive = self.drop_link(&node, now)?;
        sensitive |= if is_dir {
            self.adjust_dir(&dir, -1, now)?
        } else {
            self.touch_dir(&dir, now)
        };
        self.store.unlink(parent, name).map_err(errno)?;
        self.note_removed(parent, name, oid);
        if last {
            self.finish_unlinked(&node)?;
        }
        drop(node);
        self.evict_if_unused(oid);
        if sensitive {
            self.commit_now();
        }
        Ok(())
    }

    // --- rename -----------------------------------------------------------

    pub(crate) fn rename(
        &self,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> R<()> {
        self.writable()?;
        check_name(name)?;
        check_name(newname)?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return Err(Errno::EINVAL);
        }
        let _g = self.exclusive();
        let src_dir = self.dir(parent)?;
        let dst_dir = self.dir(newparent)?;
        let src = self
            .store
            .lookup(parent, name)
            .map_err(errno)?
            .ok_or(Errno::ENOENT)?;
        let dst = self.store.lookup(newparent, newname).map_err(errno)?;
        for oid in [Some(parent), Some(newparent), Some(src), dst]
            .into_iter()
            .flatten()
        {
            lock(&self.node(oid)?.st).changeable()?;
        }
        if exchange {
            let dst = dst.ok_or(Errno::ENOENT)?;
            return self.exchange(&src_dir, name, src, &dst_dir, newname, dst);
        }
        if dst == Some(src) {
            // Two links of one file: POSIX says do nothing.
            return Ok(());
        }
        if noreplace && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        let node = self.node(src)?;
        let src_is_dir = lock(&node.st).attr.is_dir();
        if src_is_dir && parent != newparent && self.is_ancestor(src, newparent)? {
            return Err(Errno::EINVAL);
        }
        let now = Timestamp::now();
        let mut sensitive = false;
        let mut victim = None;
        if let Some(d) = dst {
            let vnode = self.node(d)?;
            let v_is_dir = lock(&vnode.st).attr.is_dir();
            match (src_is_dir, v_is_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.store.list(d).map_err(errno)?.is_empty() => {
                    return Err(Errno::ENOTEMPTY)
                }
                _ => {}
            }
            let last = self.last_link(&vnode);
            if last {
                self.list_orphan(d)?;
            }
            sensitive |= self.drop_link(&vnode, now)?;
            if v_is_dir {
                // The replaced directory's `..` link to the new parent goes.
                sensitive |= self.adjust_dir(&dst_dir, -1, now)?;
            }
            victim = Some((vnode, last));
        }
        {
            let mut st = lock(&node.st);
            sensitive |= st.sensitive();
            st.attr.ctime = now;
            if src_is_dir && parent != newparent {
                st.attr.parent = newparent;
            }
            self.persist(src, &mut st)?;
        }
        if src_is_dir && parent != newparent {
            sensitive |= self.adjust_dir(&src_dir, -1, now)?;
            self.adjust_dir(&dst_dir, 1, now)?;
        } else {
            sensitive |= self.touch_dir(&src_dir, now);
            self.touch_dir(&dst_dir, now);
        }
        // One engine step moves the name (and replaces the target's): both land in one log batch.
        self.store
            .rename(parent, name, newparent, newname, true)
            .map_err(errno)?;
        if let Some((vnode, last)) = victim {
            self.note_removed(newparent, newname, vnode.oid);
            if last {
                self.finish_unlinked(&vnode)?;
            }
            let oid = vnode.oid;
            drop(vnode);
            self.evict_if_unused(oid);
        }
        if sensitive {
            self.commit_now();
        }
        Ok(())
    }

    /// Whether directory `dir` is `of` or one of its ancestors.
    fn is_ancestor(&self, dir: u64, of: u64) -> R<bool> {
        let mut cur = of;
        for _ in 0..4096 {
            if cur == dir {
                return Ok(true);
            }
            if cur == ROOT_DIR {
                return Ok(false);
            }
            let node = self.node(cur)?;
            let parent = lock(&node.st).attr.parent;
            if parent == 0 || parent == cur {
                return Ok(false);
            }
            cur = parent;
        }
        Err(Errno::ELOOP)
    }

    /// `RENAME_EXCHANGE`: swaps two names. The engine moves one name at a time,
    /// so one side is parked under a visible temporary name in between: a
    /// crash leaves both objects named.
    fn exchange(
        &self,
        a_dir: &Node,
        a_name: &[u8],
        a: u64,
        b_dir: &Node,
        b_name: &[u8],
        b: u64,
    ) -> R<()> {
        if a == b {
            return Ok(());
        }
        let an = self.node(a)?;
        let bn = self.node(b)?;
        let a_is_dir = lock(&an.st).attr.is_dir();
        let b_is_dir = lock(&bn.st).attr.is_dir();
        if a_dir.oid != b_dir.oid {
            if a_is_dir && self.is_ancestor(a, b_dir.oid)? {
                return Err(Errno::EINVAL);
            }
            if b_is_dir && self.is_ancestor(b, a_dir.oid)? {
                return Err(Errno::EINVAL);
            }
        }
        let now = Timestamp::now();
        let park = format!("{EXCHANGE_PREFIX}{b}").into_bytes();
        for (node, new_parent, is_dir) in [(&an, b_dir.oid, a_is_dir), (&bn, a_dir.oid, b_is_dir)] {
            let mut st = lock(&node.st);
            st.attr.ctime = now;
            if is_dir {
                st.attr.parent = new_parent;
            }
            self.persist(node.oid, &mut st)?;
        }
        if a_dir.oid != b_dir.oid && a_is_dir != b_is_dir {
            let (gain, lose) = if a_is_dir {
                (b_dir, a_dir)
            } else {
                (a_dir, b_dir)
            };
            self.adjust_dir(gain, 1, now)?;
            self.adjust_dir(lose, -1, now)?;
        }
        self.touch_dir(a_dir, now);
        self.touch_dir(b_dir, now);
        self.store
            .rename(b_dir.oid, b_name, a_dir.oid, &park, false)
            .map_err(errno)?;
        self.store
            .rename(a_dir.oid, a_name, b_dir.oid, b_name, false)
            .map_err(errno)?;
        self.store
            .rename(a_dir.oid, &park, a_dir.oid, a_name, false)
            .map_err(errno)?;
        Ok(())
    }

    // --- files --------------------------------------------------------------

    pub(crate) fn open(&self, ino: u64, write: bool) -> R<()> {
        if write {
            self.writable()?;
        }
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        if st.deleted {
            return Err(Errno::ENOENT);
        }
        if write {
            st.changeable()?;
        } else if self.atime == AtimeMode::Strict && st.attr.kind() == S_IFREG {
            // Reads the page cache serves never reach this file system: under
            // strictatime the open for reading counts as the access.
            self.accessed(&mut st);
        }
        st.opens += 1;
        Ok(())
    }

    pub(crate) fn release(&self, ino: u64) {
        let Some(node) = self.cached(ino) else {
            return;
        };
        let last_handle_of_unlinked = {
            let mut st = lock(&node.st);
            st.opens = st.opens.saturating_sub(1);
            if st.opens == 0 && st.attr.nlink > 0 && st.dirty {
                if let Err(e) = self.persist(ino, &mut st) {
                    eprintln!("oubli-fuse: writing back attributes of {ino}: {e:?}");
                }
            }
            st.opens == 0 && st.attr.nlink == 0 && !st.deleted
        };
        if last_handle_of_unlinked && !self.read_only {
            let _g = self.exclusive();
            let sensitive = lock(&node.st).sensitive();
            if let Err(e) = self.finish_unlinked(&node) {
                eprintln!(
                    "oubli-fuse: erasing unlinked object {ino}: {e:?} (erased at the next mount)"
                );
            }
            if sensitive {
                self.commit_now();
            }
        }
        drop(node);
        self.evict_if_unused(ino);
    }

    #[cfg(test)]
    pub(crate) fn read(&self, ino: u64, offset: u64, size: u32) -> R<Vec<u8>> {
        let mut data = Vec::new();
        let n = self.read_into(ino, offset, size, &mut data)?;
        data.truncate(n);
        Ok(data)
    }

    /// Reads up to `size` bytes at `offset` into a buffer the caller keeps
    /// (see [`Store::read_into`]): the bytes read are `buf[..n]`.
    pub(crate) fn read_into(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        buf: &mut Vec<u8>,
    ) -> R<usize> {
        let n = self
            .store
            .read_into(ino, offset, size as usize, buf)
            .map_err(errno)?;
        if let Some(node) = self.cached(ino) {
            self.accessed(&mut lock(&node.st));
        }
        Ok(n)
    }

    /// Whether the kernel must not cache attributes (strictatime: every
    /// access moves the access time, and the open that does it comes after
    /// the lookup that would have cached the old one).
    pub(crate) fn attrs_always_fresh(&self) -> bool {
        self.atime == AtimeMode::Strict
    }

    /// Moves the access time as the mount's access-time mode says: never
    /// (`noatime`), at every access (`strictatime`), or when it is older
    /// than the last change or a day old (`relatime`, the default). Kept in
    /// memory and written back lazily, as every timestamp.
    fn accessed(&self, st: &mut State) {
        let now = Timestamp::now();
        let a = &st.attr;
        let due = match self.atime {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relative => {
                a.atime <= a.mtime || a.atime <= a.ctime || now.secs - a.atime.secs >= 86_400
            }
        };
        if due && !self.read_only {
            st.attr.atime = now;
            st.dirty = true;
        }
    }

    pub(crate) fn write(&self, ino: u64, offset: u64, data: &[u8]) -> R<u32> {
        self.writable()?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(Errno::EFBIG);
        }
        let _g = self.shared();
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        let overwrote = offset < st.size && !data.is_empty();
        if st.cells_undecided && !data.is_empty() {
            // The first write into a file preallocated empty: one that starts
            // it with at least a whole cell streams (`cp`, a download, fio's
            // sequential writes, the kernel's writeback of them) and keeps
            // the store's cells; any other is a write in place, and gets
            // small ones (DESIGN §3). Writes to one file come here one at a
            // time (the node's lock), so no other write races this choice.
            st.cells_undecided = false;
            let streams = offset == 0
                && data.len() as u64 >= u64::from(self.store.cell_size_of(ino).map_err(errno)?);
            if !streams {
                self.store.use_small_cells(ino).map_err(errno)?;
            }
        }
        self.store.write(ino, offset, data).map_err(errno)?;
        st.stored.set(None);
        let end = offset + data.len() as u64;
        if end > st.size && !data.is_empty() {
            st.size = end;
        }
        let now = Timestamp::now();
        st.attr.mtime = now;
        st.attr.ctime = now;
        st.dirty = true;
        let sensitive = st.sensitive();
        drop(st);
        if overwrote && sensitive {
            self.commit_now();
        }
        Ok(data.len() as u32)
    }

    /// The medium's room as (total, free, available) bytes: the store's
    /// own measure, which leaves out the reserve it keeps for deleting,
    /// committing and cleaning (writes get ENOSPC once only that is left),
    /// else the host file system's under `space_from`.
    fn room(&self) -> Option<(u64, u64, u64)> {
        match self.store.space() {
            Ok(Some(s)) => Some((s.total, s.available, s.available)),
            _ => self.space_from.as_deref().and_then(host_space),
        }
    }

    /// An allocating fallocate promises that writes into the range will find
    /// room. Nothing is preallocated (cells are written when data is), so
    /// the promise is checked against what the medium can take now: the
    /// range must fit in the free space `statfs` reports (the store's file
    /// system's, net of the sealing overhead), or the call fails with ENOSPC
    /// instead of a later write.
    fn check_room(&self, length: u64) -> R<()> {
        let Some((_, _, avail)) = self.room() else {
            return Ok(());
        };
        if length > net_of_overhead(avail) {
            return Err(Errno::ENOSPC);
        }
        Ok(())
    }

    /// The kernel's rule when `caller` changes a file's data
    /// (`file_remove_privs`): set-user-ID goes, and set-group-ID when the
    /// file is group-executable or the caller is outside its group — unless
    /// the caller is root (CAP_FSETID). Returns whether the mode changed.
    fn drop_privs(st: &mut State, caller: Caller) -> bool {
        let m = st.attr.mode;
        if caller.uid == 0 || m & (S_ISUID | S_ISGID) == 0 {
            return false;
        }
        let mut kill = m & S_ISUID;
        if m & S_ISGID != 0 && (m & S_IXGRP != 0 || !caller.in_group(st.attr.gid)) {
            kill |= S_ISGID;
        }
        st.attr.mode &= !kill;
        kill != 0
    }

    pub(crate) fn fallocate(
        &self,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
        caller: Caller,
    ) -> R<()> {
        self.writable()?;
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;
        if mode & !(KEEP_SIZE | PUNCH_HOLE | ZERO_RANGE) != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        if mode & PUNCH_HOLE != 0 && (mode & KEEP_SIZE == 0 || mode & ZERO_RANGE != 0) {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if length == 0 {
            return Err(Errno::EINVAL);
        }
        if mode & (PUNCH_HOLE | ZERO_RANGE) == 0 {
            self.check_room(length)?;
        }
        let _g = self.shared();
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        if st.attr.kind() != S_IFREG {
            return Err(Errno::ENODEV);
        }
        let mut erased = false;
        let mut prealloc_changed = false;
        st.stored.set(None);
        if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 {
            // No preallocation: a zeroed range is a hole, and its old bytes are erased.
            if offset < st.size {
                self.store.punch_hole(ino, offset, length).map_err(errno)?;
                erased = true;
            }
            prealloc_changed = st.attr.unpreallocate(offset, end);
        }
        if mode & KEEP_SIZE == 0 && end > st.size {
            self.store.truncate(ino, end).map_err(errno)?;
            st.size = end;
        }
        if mode & (PUNCH_HOLE | ZERO_RANGE) == 0 && offset < st.size {
            // Preallocation stores nothing (a log-structured store could not
            // keep the room for later writes anyway): the range is noted so
            // that it counts in st_blocks, and reads as zeros, as a hole
            // does. Storing zeros cost the range's size in writes, and a
            // file written after its preallocation twice its size.
            let size = st.size;
            st.attr.preallocate(offset, end.min(size));
            prealloc_changed = true;
            // A file preallocated before it holds data is most often written
            // in place (a database, a VM image, fio's random writes): its
            // first write chooses its cells (see `write`).
            st.cells_undecided = !self.store.holds_data(ino).map_err(errno)?;
        }
        let now = Timestamp::now();
        if mode & (PUNCH_HOLE | ZERO_RANGE) != 0 || mode & KEEP_SIZE == 0 {
            st.attr.mtime = now;
            st.attr.ctime = now;
            st.dirty = true;
        }
        // As a local file system's fallocate (file_modified), in every mode.
        let privs_dropped = Self::drop_privs(&mut st, caller);
        if privs_dropped {
            st.attr.ctime = now;
        }
        if privs_dropped || prealloc_changed {
            self.persist(ino, &mut st)?;
        }
        if privs_dropped {
            // The kernel may have cached the mode it set itself just before
            // (it drops set-user-ID on its own, not always set-group-ID).
            self.tell_kernel_attrs_changed(ino);
        }
        let sensitive = st.sensitive();
        drop(st);
        if erased && sensitive {
            self.commit_now();
        }
        Ok(())
    }

    /// `lseek(SEEK_DATA / SEEK_HOLE)` from the store's allocated cells (the
    /// kernel answers the other whences itself).
    pub(crate) fn lseek(&self, ino: u64, offset: i64, whence: i32) -> R<i64> {
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        let size = {
            let node = self.node(ino)?;
            let st = lock(&node.st);
            st.size
        };
        let Ok(mut pos) = u64::try_from(offset) else {
            return Err(Errno::ENXIO);
        };
        if pos >= size {
            return Err(Errno::ENXIO);
        }
        // Scanned a window at a time (a dense file's cells are many), from
        // the start of `pos`'s block: data is reported in whole blocks.
        const WINDOW: u64 = 64 << 20;
        let mut from = pos - pos % DATA_BLOCK;
        loop {
            let window_end = from.saturating_add(WINDOW).min(size);
            let extents = self
                .store
                .extents(ino, from, window_end - from)
                .map_err(errno)?;
            let blocks = data_blocks(&extents);
            // The first block run that ends after `pos`, cut to the file.
            let run = blocks
                .iter()
                .map(|&(s, e)| (s.max(pos), e.min(size)))
                .find(|&(s, e)| s < e);
            match (whence, run) {
                (libc::SEEK_DATA, Some((start, _))) => return Ok(start as i64),
                (libc::SEEK_DATA, None) => {}
                (_, None) => return Ok(pos as i64),
                (_, Some((start, _))) if start > pos => return Ok(pos as i64),
                (_, Some((_, end))) if end < window_end => return Ok(end as i64),
                (_, Some(_)) => pos = window_end,
            }
            from = window_end;
            pos = pos.max(window_end);
            if from >= size {
                // Past the last data there is only the hole at the end of the file.
                return if whence == libc::SEEK_DATA {
                    Err(Errno::ENXIO)
                } else {
                    Ok(size as i64)
                };
            }
        }
    }

    /// fsync / fdatasync / fsyncdir: the inode's pending attributes, then every write so far, made durable (intent log).
    pub(crate) fn fsync(&self, ino: u64) -> R<()> {
        if self.read_only {
            return Ok(());
        }
        let _g = self.shared();
        if let Some(node) = self.cached(ino) {
            let mut st = lock(&node.st);
            if st.dirty {
                self.persist(ino, &mut st)?;
            }
        }
        self.store.flush().map_err(errno)
    }

    // --- directories --------------------------------------------------------

    pub(crate) fn opendir(&self, ino: u64) -> R<u64> {
        self.dir(ino)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.dirs).insert(
            fh,
            DirHandle {
                oid: ino,
                entries: None,
            },
        );
        Ok(fh)
    }

    /// Calls `add(entry, next offset)` from `offset` on until it returns true (reply full).
    pub(crate) fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(&DirEntry, u64) -> bool,
    ) -> R<()> {
        let cached = {
            let dirs = lock(&self.dirs);
            let h = dirs.get(&fh).ok_or(Errno::EBADF)?;
            if h.oid != ino {
                return Err(Errno::EBADF);
            }
            if offset == 0 {
                None
            } else {
                h.entries.clone()
            }
        };
        let entries = match cached {
            Some(e) => e,
            None => {
                // Taken once per handle (and on rewind): the listing is O(n),
                // every later page is a slice of it.
                let e = Arc::new(self.listing(ino)?);
                if let Some(h) = lock(&self.dirs).get_mut(&fh) {
                    h.entries = Some(e.clone());
                }
                e
            }
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            if add(e, i as u64 + 1) {
                break;
            }
        }
        Ok(())
    }

    fn listing(&self, ino: u64) -> R<Vec<DirEntry>> {
        let node = self.node(ino)?;
        let (parent, deleted) = {
            let st = lock(&node.st);
            (st.attr.parent.max(ROOT_DIR), st.deleted)
        };
        let mut out = vec![
            DirEntry {
                ino,
                kind: FileType::Directory,
                name: b".".to_vec(),
            },
            DirEntry {
                ino: parent,
                kind: FileType::Directory,
                name: b"..".to_vec(),
            },
        ];
        if deleted {
            return Ok(out);
        }
        if ino == ROOT_DIR && self.show_snapdir {
            out.push(DirEntry {
                ino: crate::snapdir::SNAPDIR_INO,
                kind: FileType::Directory,
                name: crate::snapdir::SNAPDIR_NAME.to_vec(),
            });
        }
        for (name, target) in self.store.list(ino).map_err(errno)? {
            if ino == ROOT_DIR && name == crate::snapdir::SNAPDIR_NAME {
                continue; // shadowed by the snapshot directory
            }
            // A name whose object is gone cannot be opened; leave it out.
            if let Some(kind) = self.peek_kind(target) {
                out.push(DirEntry {
                    ino: target,
                    kind,
                    name,
                });
            }
        }
        Ok(out)
    }

    pub(crate) fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }

    // --- extended attributes -------------------------------------------------

    /// Binds an empty object's cells to the share named `value`.
    fn place_under_share(&self, oid: u64, value: &[u8]) -> R<()> {
        let name = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
        self.store.set_share(oid, name).map_err(|e| {
            eprintln!("oubli-fuse: placing object {oid} under share {name:?}: {e}");
            match e {
                StoreError::NoShare(_) | StoreError::ShareDestroyed(_) => Errno::EINVAL,
                other => errno(other),
            }
        })
    }

    /// `setxattr(user.oubli.share)`: a directory passes the share on to what
    /// is created in it; an empty file is placed under it at once. A file
    /// that holds data, or another share already, is refused (EBUSY): data
    /// written before is never moved under a share (THREAT_MODEL.md).
    fn set_share_xattr(&self, ino: u64, st: &State, value: &[u8]) -> R<()> {
        let name = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
        let known = self
            .store
            .shares()
            .into_iter()
            .any(|s| s.name == name && s.destroyed_at.is_none());
        if !known {
            eprintln!("oubli-fuse: no share {name:?} (oubli share ls)");
            return Err(Errno::EINVAL);
        }
        match st.attr.kind() {
            S_IFDIR => Ok(()),
            S_IFREG => match self.store.share_of(ino).map_err(errno)? {
                Some(current) if current == name => Ok(()),
                Some(_) => Err(Errno::EBUSY),
                None if st.size > 0 => Err(Errno::EBUSY),
                None => self.place_under_share(ino, value),
            },
            _ => Err(Errno::EPERM),
        }
    }

    pub(crate) fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> R<()> {
        self.writable()?;
        check_xattr_name(name)?;
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        let exists = st.attr.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::NO_XATTR);
        }
        let old = st.attr.xattrs.get(name).map_or(0, |v| name.len() + v.len());
        if st.attr.xattr_bytes() - old + name.len() + value.len() > XATTR_ROOM {
            return Err(Errno::ENOSPC);
        }
        if name == SHARE_XATTR {
            self.set_share_xattr(ino, &st, value)?;
        }
        st.attr.xattrs.insert(name.to_vec(), value.to_vec());
        st.attr.ctime = Timestamp::now();
        self.persist(ino, &mut st)
    }

    pub(crate) fn getxattr(&self, ino: u64, name: &[u8]) -> R<Vec<u8>> {
        check_xattr_name(name)?;
        let node = self.node(ino)?;
        let st = lock(&node.st);
        st.attr.xattrs.get(name).cloned().ok_or(Errno::NO_XATTR)
    }

    pub(crate) fn listxattr(&self, ino: u64) -> R<Vec<u8>> {
        let node = self.node(ino)?;
        let st = lock(&node.st);
        let mut out = Vec::new();
        for name in st.attr.xattrs.keys() {
            out.extend_from_slice(name);
            out.push(0);
        }
        Ok(out)
    }

    pub(crate) fn removexattr(&self, ino: u64, name: &[u8]) -> R<()> {
        self.writable()?;
        check_xattr_name(name)?;
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        if name == SHARE_XATTR && st.attr.kind() == S_IFREG && st.attr.xattrs.contains_key(name) {
            // A file's data stays under its share for good.
            return Err(Errno::EPERM);
        }
        if st.attr.xattrs.remove(name).is_none() {
            return Err(Errno::NO_XATTR);
        }
        st.attr.ctime = Timestamp::now();
        self.persist(ino, &mut st)
    }

    // --- permissions ---------------------------------------------------------

    /// `access(2)`, for mounts without `default_permissions` (the kernel checks otherwise).
    pub(crate) fn access(&self, ino: u64, mask: i32, caller: Caller) -> R<()> {
        let node = self.node(ino)?;
        let st = lock(&node.st);
        if mask == libc::F_OK {
            return Ok(());
        }
        if mask & libc::W_OK != 0 && self.read_only {
            return Err(Errno::EROFS);
        }
        let mode = st.attr.mode;
        if caller.uid == 0 {
            // Root may do anything, except execute a file nobody may execute.
            if mask & libc::X_OK != 0 && mode & 0o111 == 0 && !st.attr.is_dir() {
                return Err(Errno::EACCES);
            }
            return Ok(());
        }
        let bits = if caller.uid == st.attr.uid {
            (mode >> 6) & 7
        } else if caller.gid == st.attr.gid {
            (mode >> 3) & 7
        } else {
            mode & 7
        };
        if (mask as u32) & !bits & 7 != 0 {
            return Err(Errno::EACCES);
        }
        Ok(())
    }

    // --- whole file system ---------------------------------------------------

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

    /// Notes a name removed in the open epoch (what a failed final commit names).
    fn note_removed(&self, dir: u64, name: &[u8], oid: u64) {
        let epoch = self.store.epoch();
        let mut r = lock(&self.removed);
        if r.epoch != epoch {
            // A commit landed since: what was noted is erased.
            *r = Removed {
                epoch,
                ..Removed::default()
            };
        }
        if r.names.len() < REMOVED_NAMED {
            r.names.push((dir, name.to_vec(), oid));
        } else {
            r.more += 1;
        }
    }

    /// The names removed in the open epoch as paths from the mount's root
    /// (`.../NAME` where the directory's place is not known any more), and
    /// how many more were removed.
    fn removed_paths(&self) -> (Vec<String>, usize) {
        let r = lock(&self.removed);
        if r.epoch != self.store.epoch() {
            return (Vec::new(), 0);
        }
        let paths = r
            .names
            .iter()
            .map(|(dir, name, _)| {
                let name = String::from_utf8_lossy(name);
                match self.dir_path(*dir, &r.names, 0) {
                    Some(d) => format!("{d}/{name}"),
                    None => format!(".../{name}"),
                }
            })
            .collect();
        (paths, r.more)
    }

    /// The path of directory `dir` from the root (`""` for the root): up its
    /// parent links, or through the removals noted when it was removed too.
    fn dir_path(&self, dir: u64, removed: &[(u64, Vec<u8>, u64)], depth: usize) -> Option<String> {
        if dir == ROOT_DIR {
            return Some(String::new());
        }
        if depth > 4096 {
            return None;
        }
        let (parent, name) = match removed.iter().rev().find(|(_, _, oid)| *oid == dir) {
            Some((parent, name, _)) => (*parent, name.clone()),
            None => {
                let parent = self.fetch(dir).ok()?.0.parent;
                let (name, _) = self
                    .store
                    .list(parent)
                    .ok()?
                    .into_iter()
                    .find(|(_, target)| *target == dir)?;
                (parent, name)
            }
        };
        let above = self.dir_path(parent, removed, depth + 1)?;
        Some(format!("{above}/{}", String::from_utf8_lossy(&name)))
    }

    /// Runs `f` with no namespace operation half done and every pending
    /// attribute written (a snapshot then shows what a clean unmount would).
    pub(crate) fn quiesced<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        let _g = self.exclusive();
        self.persist_all();
        f(&self.store)
    }

    /// Erases the file or directory tree at `path` (components from the
    /// root) from the live tree and from every snapshot: the live names go
    /// as by `rm -r` (every hard link of the objects too), and each snapshot
    /// loses the objects at that path in it and the objects removed here.
    pub(crate) fn redact(&self, path: &[Vec<u8>]) -> io::Result<crate::Redacted> {
        let store_err = |e: StoreError| io::Error::other(e.to_string());
        let sys = |e: Errno| io::Error::from_raw_os_error(e.code());
        self.writable().map_err(sys)?;
        let (last, dirs) = path.split_last().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "redact needs a path below the mount point",
            )
        })?;
        let mut oids = BTreeSet::new();
        let live = resolve(&self.store, path).map_err(store_err)?;
        if let Some(oid) = live {
            subtree(&self.store, oid, &mut oids).map_err(store_err)?;
        }
        for snap in self.store.snapshots() {
            let view = self.store.snapshot(&snap.name).map_err(store_err)?;
            if let Some(oid) = resolve(&view, path).map_err(store_err)? {
                subtree(&view, oid, &mut oids).map_err(store_err)?;
            }
        }
        if oids.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        if let Some(oid) = live {
            let parent = resolve(&self.store, dirs)
                .map_err(store_err)?
                .unwrap_or(ROOT_DIR);
            self.remove_tree(parent, last, oid).map_err(sys)?;
            // Other hard links of the removed files, anywhere in the tree.
            for (dir, name) in self.names_of(&oids).map_err(store_err)? {
                match self.unlink(dir, &name) {
                    Ok(()) => self.tell_kernel_gone(dir, &name),
                    Err(Errno::ENOENT) => {}
                    Err(e) => return Err(sys(e)),
                }
            }
        }
        let oids: Vec<u64> = oids.into_iter().collect();
        let still_open = oids
            .iter()
            .filter(|&&oid| self.store.exists(oid).unwrap_or(false))
            .count();
        let snapshots = self.store.redact_snapshots(&oids).map_err(store_err)?;
        Ok(crate::Redacted {
            live: live.is_some(),
            objects: oids.len(),
            still_open,
            snapshots,
        })
    }

    /// `rm -r` of `name` in `parent` (object `oid`), through the usual calls.
    fn remove_tree(&self, parent: u64, name: &[u8], oid: u64) -> R<()> {
        let is_dir = self.fetch(oid)?.0.is_dir();
        if is_dir {
            for (child, target) in self.store.list(oid).map_err(errno)? {
                self.remove_tree(oid, &child, target)?;
            }
            self.rmdir(parent, name)?;
        } else {
            self.unlink(parent, name)?;
        }
        self.tell_kernel_gone(parent, name);
        Ok(())
    }

    /// Drops the kernel's cached attributes of `ino` (not its cached pages:
    /// an offset of -1), so the next stat asks again. Safe inside a request:
    /// the kernel takes no inode lock for it.
    fn tell_kernel_attrs_changed(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }

    /// Drops the kernel's cached name, which it did not remove itself.
    fn tell_kernel_gone(&self, parent: u64, name: &[u8]) {
        use std::os::unix::ffi::OsStrExt;
        if let Some(n) = self.notifier.get() {
            // ENOENT: the kernel did not have it cached.
            let _ = n.inval_entry(INodeNo(parent), std::ffi::OsStr::from_bytes(name));
        }
    }

    /// Every live name (directory, name) that points at one of `oids` (a
    /// walk of the whole tree; empty at once when none of them is linked).
    fn names_of(&self, oids: &BTreeSet<u64>) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let linked = oids.iter().any(|&oid| {
            self.fetch(oid)
                .map(|(a, _)| a.nlink > 0 && !a.is_dir())
                .unwrap_or(false)
        });
        let mut out = Vec::new();
        if !linked {
            return Ok(out);
        }
        let mut dirs = vec![ROOT_DIR];
        while let Some(dir) = dirs.pop() {
            for (name, target) in self.store.list(dir)? {
                if oids.contains(&target) {
                    out.push((dir, name));
                } else if self.fetch(target).is_ok_and(|(a, _)| a.is_dir()) {
                    dirs.push(target);
                }
            }
        }
        Ok(out)
    }

    #[cfg(test)]
    pub(crate) fn fs_record(&self) -> Option<crate::meta::FsRecord> {
        let root = self.cached(ROOT_DIR)?;
        let st = lock(&root.st);
        st.attr.fs.clone()
    }
}

/// The object at `path` (components from the root) in `store`, if any.
fn resolve(store: &Store, path: &[Vec<u8>]) -> Result<Option<u64>, StoreError> {
    let mut at = ROOT_DIR;
    for name in path {
        match store.lookup(at, name)? {
            Some(next) => at = next,
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

/// Adds `oid` and, for a directory, every object beneath it in `store` to
/// `out` (which may hold objects found in other roots: each root is walked
/// in full, since the same directory may hold other files in each).
fn subtree(store: &Store, oid: u64, out: &mut BTreeSet<u64>) -> Result<(), StoreError> {
    let mut todo = vec![oid];
    let mut seen = BTreeSet::new();
    while let Some(oid) = todo.pop() {
        if !seen.insert(oid) {
            continue;
        }
        out.insert(oid);
        // A file lists no names.
        todo.extend(store.list(oid)?.into_iter().map(|(_, target)| target));
    }
    Ok(())
}

fn check_xattr_name(name: &[u8]) -> R<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(Errno::ERANGE);
    }
    // POSIX ACLs would need enforcement the kernel only does with FUSE_POSIX_ACL.
    if name.starts_with(b"system.") {
        return Err(Errno::EOPNOTSUPP);
    }
    if [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        Ok(())
    } else {
        Err(Errno::EOPNOTSUPP)
    }
}

/// (total, free, available to unprivileged users) bytes of the file system holding `path`.
/// Of `bytes` free on the store's file system, what data can fill once
/// sealed: a 16-byte tag per cell and the key tree's nodes, about 0.2%
/// (charged as 1/512).
fn net_of_overhead(bytes: u64) -> u64 {
    bytes - bytes / 513
}

fn host_space(path: &std::path::Path) -> Option<(u64, u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: FFI; `c` is a valid NUL-terminated path and `s` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let s = unsafe { s.assume_init() };
    let f = s.f_frsize;
    Some((s.f_blocks * f, s.f_bfree * f, s.f_bavail * f))
}

/// Attributes of a node the caller creates: the file type, the requested
/// permission bits less the umask, the caller as owner, all times now.
fn created_attr(kind: u32, mode: u32, umask: u32, caller: Caller) -> Attr {
    Attr::new(
        kind | (mode & 0o7777 & !umask),
        caller.uid,
        caller.gid,
        Timestamp::now(),
    )
}

#[cfg(test)]
mod tests {
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
}
