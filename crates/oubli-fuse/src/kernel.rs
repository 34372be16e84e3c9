//! The kernel side: `fuser::Filesystem` requests translated to [`Fs`] calls and their replies.
//!
//! Each request is routed by its inode number ([`crate::snapdir`]): the live
//! file system, `.snapshots`, or one snapshot's read-only file system, whose
//! replies carry their inode numbers translated back.

use crate::fs::{after_offset, Caller, DirEntry, Fs, SetAttr, NAME_MAX, R};
use crate::meta::Timestamp;
use crate::snapdir::{self, attr_in, in_snapshot, Place, Snapdir, SNAPDIR_INO, SNAPDIR_NAME};
use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long the kernel may cache names and attributes of the live tree (an
/// hour, as a local file system's that it never asks again). Every change
/// but a redaction's passes through the kernel, which applies it to its
/// caches; a redaction tells it (`fs/notify.rs`). Snapshots' are never
/// cached ([`ttl`]). docs/FUSE.md, "The kernel's caches".
const TTL: Duration = Duration::from_secs(3600);
/// Largest write (and read-ahead) the kernel sends in one request.
pub(crate) const MAX_IO: u32 = 1 << 20;

pub(crate) struct Kernel {
    pub(crate) fs: Arc<Fs>,
    snaps: Snapdir<Fs>,
    writers: Arc<Writers>,
    destroyed: bool,
}

/// The live inodes the kernel holds open for writing, with how many
/// handles: only these can have pages in the kernel's writeback cache that
/// this file system has not received (a close writes a file's dirty pages
/// back and waits for them; a writable mapping keeps its handle open).
/// [`crate::write_back_kernel_cache`] waits for their writes.
#[derive(Default)]
pub(crate) struct Writers(Mutex<HashMap<u64, u32>>);

impl Writers {
    fn opened(&self, ino: u64) {
        *self.lock().entry(ino).or_insert(0) += 1;
    }

    fn released(&self, ino: u64) {
        let mut map = self.lock();
        if let Some(n) = map.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                map.remove(&ino);
            }
        }
    }

    /// The inodes open for writing now.
    pub(crate) fn inodes(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Kernel {
    pub(crate) fn new(fs: Arc<Fs>, snaps: Snapdir<Fs>, writers: Arc<Writers>) -> Kernel {
        Kernel {
            fs,
            snaps,
            writers,
            destroyed: false,
        }
    }

    /// The file system serving `ino`, the object there, and its slot (0:
    /// live). `.snapshots` has no object: EROFS for what would change it,
    /// the callers that can read it handle it first.
    fn on(&self, ino: u64) -> R<(Arc<Fs>, u64, u16)> {
        match self.snaps.place(ino)? {
            Place::Live(oid) => Ok((self.fs.clone(), oid, 0)),
            Place::Snapdir => Err(Errno::EROFS),
            Place::Snap { slot, fs, oid } => Ok((fs, oid, slot)),
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
        match r {
            Ok(attr) => reply.entry(
                &ttl(attr.ino, self.fs.attrs_always_fresh()),
                &attr,
                Generation(0),
            ),
            Err(e) => reply.error(e),
        }
    }

    /// Runs an inode request on its file system, translating the reply's inode.
    fn attr_of(
        &self,
        ino: u64,
        f: impl FnOnce(&Fs, u64) -> R<fuser::FileAttr>,
    ) -> R<fuser::FileAttr> {
        let (fs, oid, slot) = self.on(ino)?;
        f(&fs, oid).map(|a| attr_in(slot, a))
    }

    /// A change under `parent` named `name`: only in the live tree, and
    /// never to `.snapshots` itself (`creating`: it exists, EEXIST).
    fn live_parent(&self, parent: u64, name: &[u8], creating: bool) -> R<()> {
        if in_snapshot(parent) {
            return Err(Errno::EROFS);
        }
        if parent == oubli_core::ROOT_DIR && name == SNAPDIR_NAME {
            return Err(if creating {
                Errno::EEXIST
            } else {
                Errno::EROFS
            });
        }
        Ok(())
    }

    /// The attributes of any inode, `.snapshots` included (no reference taken).
    fn attr_of_any(&self, ino: u64) -> R<fuser::FileAttr> {
        if ino == SNAPDIR_INO {
            self.snapdir_attr()
        } else {
            self.attr_of(ino, |fs, oid| fs.getattr(oid))
        }
    }

    /// Gives back one reference the kernel did not take after all.
    fn forget_one(&self, ino: u64) {
        if let Ok((fs, oid, _)) = self.on(ino) {
            fs.forget(oid, 1);
        }
    }

    fn snapdir_attr(&self) -> R<fuser::FileAttr> {
        Ok(self.snaps.attr(self.fs.getattr(oubli_core::ROOT_DIR)?))
    }

    fn lookup_in(&self, parent: u64, name: &[u8]) -> R<fuser::FileAttr> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        match self.snaps.place(parent)? {
            Place::Live(oubli_core::ROOT_DIR) if name == SNAPDIR_NAME => self.snapdir_attr(),
            Place::Live(oid) => self.fs.lookup(oid, name),
            Place::Snapdir => match name {
                b"." => self.snapdir_attr(),
                b".." => self.fs.lookup(oubli_core::ROOT_DIR, b"."),
                _ => {
                    let (slot, fs) = self.snaps.lookup(name)?;
                    fs.lookup(oubli_core::ROOT_DIR, b".")
                        .map(|a| attr_in(slot, a))
                }
            },
            Place::Snap {
                oid: oubli_core::ROOT_DIR,
                ..
            } if name == b".." => self.snapdir_attr(),
            Place::Snap { slot, fs, oid } => fs.lookup(oid, name).map(|a| attr_in(slot, a)),
        }
    }

    /// `.snapshots`' listing: `.`, `..`, then one directory per snapshot,
    /// each beside its offset (a hash of its name, as in every listing:
    /// a snapshot removed while a reader pages through the listing moves
    /// no other name), in offset order.
    fn snapdir_listing(&self) -> R<Vec<(u64, DirEntry)>> {
        let mut out = vec![
            DirEntry {
                ino: SNAPDIR_INO,
                kind: FileType::Directory,
                name: b".".to_vec(),
            },
            DirEntry {
                ino: oubli_core::ROOT_DIR,
                kind: FileType::Directory,
                name: b"..".to_vec(),
            },
        ];
        for (name, ino) in self.snaps.entries()? {
            out.push(DirEntry {
                ino,
                kind: FileType::Directory,
                name,
            });
        }
        Ok(self.fs.in_offset_order(out))
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn time(t: TimeOrNow) -> Option<Timestamp> {
    match t {
        TimeOrNow::SpecificTime(t) => Some(Timestamp::from_system(t)),
        TimeOrNow::Now => None,
    }
}

/// How long the kernel may keep a name or attribute of `ino`: snapshots'
/// not at all, so that a snapshot removed or redacted (by the control
/// socket, retention, another thread) is gone from the next lookup on; and
/// nothing under `strictatime`, whose every access moves a timestamp.
fn ttl(ino: INodeNo, fresh: bool) -> Duration {
    if fresh || in_snapshot(ino.0) {
        Duration::ZERO
    } else {
        TTL
    }
}

/// The entry of a name that does not exist (node 0: a negative entry).
fn no_such_name() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

/// Replies to getxattr/listxattr: the size when asked for it, ERANGE when the buffer is too small.
fn xattr(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, Errno>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for Kernel {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests: fewer round trips, whole cells sealed straight from the request.
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        // Requests in one directory may run in parallel (the engine serialises what must be).
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        // Listings carry each entry's attributes (one request for `ls -l`,
        // `find`, `git status` instead of one lookup per name); the kernel
        // asks for them when lookups follow a listing.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        // File handles (name_to_handle_at, NFS re-export) outlive the
        // kernel's caches and remounts: inode numbers are object ids, never
        // reused, and "." / ".." are answered by id.
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        if self.fs.writeback {
            // Small writes gather in the page cache and come as large ones
            // (FUSE.md, "The writeback cache"); the kernel then owns size,
            // mtime and ctime, and sends them by setattr.
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        // Set-id bits are dropped here, not by the kernel, on write,
        // truncate and chown (`Fs::drop_privs_for`, `Fs::setattr`): the
        // kernel then marks the super block SB_NOSEC, and stops asking for
        // `security.capability` (a GETXATTR round trip) at every write(2)
        // to a file that has none — more requests than the WRITEs
        // themselves for buffered 4 KiB writes (FUSE.md, "Requests a
        // write costs"). A write that must drop bits comes through
        // unbuffered, flagged FUSE_WRITE_KILL_SUIDGID.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        Ok(())
    }

    fn destroy(&mut self) {
        if !std::mem::replace(&mut self.destroyed, true) {
            self.fs.destroy();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_in(parent.0, name.as_bytes()) {
            // No name appears in the live tree but through the kernel, which
            // then drops what it remembered: it may remember the absence
            // (node 0), as for a name it looked up (git, a shell's PATH).
            Err(Errno::ENOENT) if !in_snapshot(parent.0) => {
                reply.entry(&TTL, &no_such_name(), Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Ok((fs, oid, _)) = self.on(ino.0) {
            fs.forget(oid, nlookup);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = if ino.0 == SNAPDIR_INO {
            self.snapdir_attr()
        } else {
            self.attr_of(ino.0, |fs, oid| fs.getattr(oid))
        };
        match attr {
            Ok(attr) => reply.attr(&ttl(attr.ino, self.fs.attrs_always_fresh()), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime: ctime.map(Timestamp::from_system),
        };
        match self.attr_of(ino.0, |fs, oid| fs.setattr(oid, change, caller(req))) {
            Ok(attr) => reply.attr(&ttl(attr.ino, self.fs.attrs_always_fresh()), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.on(ino.0).and_then(|(fs, oid, _)| fs.readlink(oid)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name.as_bytes();
        self.entry(
            reply,
            self.live_parent(parent.0, name, true).and_then(|()| {
                self.fs
                    .mknod(parent.0, name, mode, umask, rdev, caller(req))
            }),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name.as_bytes();
        self.entry(
            reply,
            self.live_parent(parent.0, name, true)
                .and_then(|()| self.fs.mkdir(parent.0, name, mode, umask, caller(req))),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes();
        empty(
            reply,
            self.live_parent(parent.0, name, false)
                .and_then(|()| self.fs.unlink(parent.0, name)),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes();
        empty(
            reply,
            self.live_parent(parent.0, name, false)
                .and_then(|()| self.fs.rmdir(parent.0, name)),
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = link_name.as_bytes();
        self.entry(
            reply,
            self.live_parent(parent.0, name, true).and_then(|()| {
                self.fs
                    .symlink(parent.0, name, target.as_os_str().as_bytes(), caller(req))
            }),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.as_bytes(), newname.as_bytes());
        let checked = self
            .live_parent(newparent.0, newname, false)
            .and_then(|()| match self.live_parent(parent.0, name, false) {
                // Out of a snapshot into the live tree: another device, as for ZFS's .zfs.
                Err(Errno::EROFS) if in_snapshot(parent.0) => Err(Errno::EXDEV),
                other => other,
            });
        empty(
            reply,
            checked.and_then(|()| {
                self.fs
                    .rename(parent.0, name, newparent.0, newname, flags.bits())
            }),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let newname = newname.as_bytes();
        let checked = self.live_parent(newparent.0, newname, true).and_then(|()| {
            if in_snapshot(ino.0) {
                Err(Errno::EXDEV)
            } else {
                Ok(())
            }
        });
        self.entry(
            reply,
            checked.and_then(|()| self.fs.link(ino.0, newparent.0, newname)),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        match self.on(ino.0).and_then(|(fs, oid, _)| fs.open(oid, write)) {
            // A snapshot's data bypasses the page cache: nothing of a removed
            // or redacted snapshot stays readable from the kernel's copy.
            Ok(()) if in_snapshot(ino.0) => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO)
            }
            // Every change passes through this mount, so cached pages stay valid across opens.
            Ok(()) => {
                if write {
                    self.writers.opened(ino.0);
                }
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Each request loop keeps the buffer its replies are made in (DESIGN
        // §10 counts up to 2 MiB of it per loop): a fresh one would be
        // allocated and zeroed for every read.
        thread_local! {
            static REPLY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        REPLY.with_borrow_mut(|buf| {
            match self
                .on(ino.0)
                .and_then(|(fs, oid, _)| fs.read_into(oid, offset, size, buf))
            {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(e),
            }
            // Past 2 MiB (a read over `MAX_IO`, which the kernel does not
            // send) the buffer is not kept.
            if buf.capacity() > 2 * MAX_IO as usize {
                *buf = Vec::new();
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The writer lacks CAP_FSETID: its write drops the file's set-id
        // bits, as a local file system's would (FUSE_HANDLE_KILLPRIV_V2).
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.on(ino.0).and_then(|(fs, oid, _)| {
            if kill {
                fs.drop_privs_for(oid, caller(req))?;
            }
            fs.write(oid, offset, data)
        }) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) promises nothing about durability; fsync does. Nothing
        // here needs the close either: locks are the kernel's own (no
        // getlk/setlk here), and the kernel writes a cached file's dirty
        // pages back and reports their errors before it would send FLUSH.
        // ENOSYS tells it so once for the mount (`fc->no_flush`): every
        // later close(2) skips the round trip, two of a new file's nine
        // requests when a shell writes it, one of every file read
        // (docs/FUSE.md, "Requests a close costs").
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY && !in_snapshot(ino.0) {
            self.writers.released(ino.0);
        }
        if let Ok((fs, oid, _)) = self.on(ino.0) {
            fs.release(oid);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.on(ino.0).and_then(|(fs, oid, _)| fs.fsync(oid)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // The kernel keeps a live directory's listing across opens and
        // drops it at every change it makes there and at every change it
        // is told of (fs/notify.rs); snapshots change without it (docs/FUSE.md,
        // "The kernel's caches").
        let keep = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
        let opened = if ino.0 == SNAPDIR_INO {
            Ok((0, FopenFlags::empty())) // listed afresh at every readdir from offset 0
        } else {
            self.on(ino.0).and_then(|(fs, oid, slot)| {
                let flags = if slot == 0 { keep } else { FopenFlags::empty() };
                fs.opendir(oid).map(|fh| (fh, flags))
            })
        };
        match opened {
            Ok((fh, flags)) => reply.opened(FileHandle(fh), flags),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        // `snap_root`: listing a snapshot's root, whose parent is `.snapshots`.
        let mut add = |e: &DirEntry, next: u64, slot: u16, snap_root: bool| {
            let ino = match e.name.as_slice() {
                b".." if snap_root => SNAPDIR_INO,
                _ if e.ino == SNAPDIR_INO => SNAPDIR_INO,
                _ => snapdir::ino(slot, e.ino),
            };
            reply.add(INodeNo(ino), next, e.kind, OsStr::from_bytes(&e.name))
        };
        let r = if ino.0 == SNAPDIR_INO {
            self.snapdir_listing().map(|entries| {
                for (at, e) in after_offset(&entries, offset) {
                    if add(e, *at, 0, false) {
                        break;
                    }
                }
            })
        } else {
            self.on(ino.0).and_then(|(fs, oid, slot)| {
                let snap_root = slot > 0 && oid == oubli_core::ROOT_DIR;
                fs.readdir(oid, fh.0, offset, &mut |e, next| {
                    add(e, next, slot, snap_root)
                })
            })
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// A listing with each entry's attributes: every entry but `.` and
    /// `..` is a lookup (the kernel takes a reference to it, which is
    /// counted here and forgotten again if the entry does not fit).
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let fresh = self.fs.attrs_always_fresh();
        // The listed directory's own attributes stand in for `.` and `..`
        // (the kernel takes none from them) with their inode numbers.
        let dir_attr = match self.attr_of_any(ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        // `entry` looks one entry up (with its reference); `(ino, name, next)`.
        let mut add = |ino: u64, name: &[u8], next: u64, entry: &dyn Fn() -> R<fuser::FileAttr>| {
            let dots = matches!(name, b"." | b"..");
            let attr = if dots {
                fuser::FileAttr {
                    ino: INodeNo(ino),
                    kind: FileType::Directory,
                    ..dir_attr
                }
            } else {
                match entry() {
                    Ok(a) => a,
                    // Gone since the listing was taken: left out, as readdir does.
                    Err(_) => return false,
                }
            };
            let ttl = ttl(attr.ino, fresh);
            let full = reply.add(
                attr.ino,
                next,
                OsStr::from_bytes(name),
                &ttl,
                &attr,
                Generation(0),
            );
            if full && !dots {
                self.forget_one(attr.ino.0);
            }
            full
        };
        let r = if ino.0 == SNAPDIR_INO {
            self.snapdir_listing().map(|entries| {
                for (at, e) in after_offset(&entries, offset) {
                    if add(e.ino, &e.name, *at, &|| {
                        self.lookup_in(SNAPDIR_INO, &e.name)
                    }) {
                        break;
                    }
                }
            })
        } else {
            self.on(ino.0).and_then(|(fs, oid, slot)| {
                let snap_root = slot > 0 && oid == oubli_core::ROOT_DIR;
                fs.readdir(oid, fh.0, offset, &mut |e, next| {
                    let ino = match e.name.as_slice() {
                        b".." if snap_root => SNAPDIR_INO,
                        _ if e.ino == SNAPDIR_INO => SNAPDIR_INO,
                        _ => snapdir::ino(slot, e.ino),
                    };
                    add(ino, &e.name, next, &|| {
                        if e.ino == SNAPDIR_INO {
                            self.snapdir_attr()
                        } else {
                            fs.entry_attr(e.ino).map(|a| attr_in(slot, a))
                        }
                    })
                })
            })
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        if let Ok((fs, _, _)) = self.on(_ino.0) {
            fs.releasedir(fh.0);
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.on(ino.0).and_then(|(fs, oid, _)| fs.fsync(oid)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.bfree,
                s.bavail,
                s.files,
                s.ffree,
                s.bsize,
                NAME_MAX as u32,
                s.bsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.on(ino.0)
                .and_then(|(fs, oid, _)| fs.setxattr(oid, name.as_bytes(), value, flags)),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let value = match self.snaps.place(ino.0) {
            Ok(Place::Snapdir) => Err(Errno::NO_XATTR),
            _ => self
                .on(ino.0)
                .and_then(|(fs, oid, _)| fs.getxattr(oid, name.as_bytes())),
        };
        xattr(reply, size, value);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = match self.snaps.place(ino.0) {
            Ok(Place::Snapdir) => Ok(Vec::new()),
            _ => self.on(ino.0).and_then(|(fs, oid, _)| fs.listxattr(oid)),
        };
        xattr(reply, size, names);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            self.on(ino.0)
                .and_then(|(fs, oid, _)| fs.removexattr(oid, name.as_bytes())),
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mask = mask.bits();
        let r = match self.snaps.place(ino.0) {
            Ok(Place::Snapdir) if mask & libc::W_OK != 0 => Err(Errno::EROFS),
            Ok(Place::Snapdir) => Ok(()),
            _ => self
                .on(ino.0)
                .and_then(|(fs, oid, _)| fs.access(oid, mask, caller(req))),
        };
        empty(reply, r);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name.as_bytes();
        match self
            .live_parent(parent.0, name, true)
            .and_then(|()| self.fs.create(parent.0, name, mode, umask, caller(req)))
        {
            Ok(attr) => {
                // Counted as release counts it: by the handle's access mode.
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    self.writers.opened(attr.ino.0);
                }
                reply.created(
                    &ttl(attr.ino, self.fs.attrs_always_fresh()),
                    &attr,
                    Generation(0),
                    FileHandle(0),
                    FopenFlags::FOPEN_KEEP_CACHE,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self
            .on(ino.0)
            .and_then(|(fs, oid, _)| fs.lseek(oid, offset, whence))
        {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            self.on(ino.0)
                .and_then(|(fs, oid, _)| fs.fallocate(oid, offset, length, mode, caller(req))),
        );
    }
}
