//! The kernel side: `fuser::Filesystem` requests translated to [`Fs`] calls and their replies.

use crate::fs::{Caller, Fs, SetAttr, NAME_MAX};
use crate::meta::Timestamp;
use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How long the kernel may cache names and attributes. Every change goes
/// through this mount, so the kernel's copies can only be stale after a
/// change it made itself and invalidates.
const TTL: Duration = Duration::from_secs(1);
/// Largest write (and read-ahead) the kernel sends in one request.
const MAX_IO: u32 = 1 << 20;

pub(crate) struct Kernel {
    pub(crate) fs: Arc<Fs>,
    destroyed: bool,
}

impl Kernel {
    pub(crate) fn new(fs: Arc<Fs>) -> Kernel {
        Kernel {
            fs,
            destroyed: false,
        }
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn time(t: TimeOrNow) -> Option<Timestamp> {
    match t {
        TimeOrNow::SpecificTime(t) => Some(Timestamp::from_system(t)),
        TimeOrNow::Now => None,
    }
}

fn entry(reply: ReplyEntry, r: Result<fuser::FileAttr, Errno>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
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
        Ok(())
    }

    fn destroy(&mut self) {
        if !std::mem::replace(&mut self.destroyed, true) {
            self.fs.destroy();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.fs.lookup(parent.0, name.as_bytes()));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
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
        match self.fs.setattr(ino.0, change, caller(req)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
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
        entry(
            reply,
            self.fs
                .mknod(parent.0, name.as_bytes(), mode, umask, rdev, caller(req)),
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
        entry(
            reply,
            self.fs
                .mkdir(parent.0, name.as_bytes(), mode, umask, caller(req)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.unlink(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.rmdir(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.fs.symlink(
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                caller(req),
            ),
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
        empty(
            reply,
            self.fs.rename(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                flags.bits(),
            ),
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
        entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        match self.fs.open(ino.0, write) {
            // Every change passes through this mount, so cached pages stay valid across opens.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
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
        match self.fs.read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write(ino.0, offset, data) {
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
        // close(2) promises nothing about durability; fsync does.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(ino.0);
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
        empty(reply, self.fs.fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        let r = self.fs.readdir(ino.0, fh.0, offset, &mut |e, next| {
            reply.add(INodeNo(e.ino), next, e.kind, OsStr::from_bytes(&e.name))
        });
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
        self.fs.releasedir(fh.0);
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
        empty(reply, self.fs.fsync(ino.0));
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
            self.fs.setxattr(ino.0, name.as_bytes(), value, flags),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr(reply, size, self.fs.getxattr(ino.0, name.as_bytes()));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr(reply, size, self.fs.listxattr(ino.0));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.fs.access(ino.0, mask.bits(), caller(req)));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .fs
            .create(parent.0, name.as_bytes(), mode, umask, caller(req))
        {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE,
            ),
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
        match self.fs.lseek(ino.0, offset, whence) {
            Ok(at) => reply.offset(at),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.fallocate(ino.0, offset, length, mode));
    }
}
