//! Attributes (`getattr`, `setattr`, `st_blocks`), extended attributes (sensitivity, key shares) and `access(2)`.

use super::io::data_blocks;
use super::{
    errno, kind_of, lock, Caller, Fs, State, NAME_MAX, R, SHARE_XATTR, S_ISGID, S_ISUID, S_IXGRP,
};
use crate::meta::{Timestamp, S_IFDIR, S_IFMT, S_IFREG};
use fuser::{Errno, FileAttr, INodeNo};
use oubli_core::Error as StoreError;

/// Room for extended attributes per inode (names + values): four values of
/// the kernel's maximum (64 KiB) and their names. They live in the object's
/// metadata, which is rewritten whole on every change of the inode's
/// attributes, so an inode with large ones makes those changes cost more.
pub(crate) const XATTR_ROOM: usize = 4 * (64 * 1024 + 256);

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

impl SetAttr {
    /// Only given mtime and/or ctime: what the kernel sends for a file in
    /// its writeback cache (`fuse_flush_times`). A `touch` (now) or a
    /// utimensat that sets the access time as well is not one.
    fn only_kernel_times(&self) -> bool {
        let SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            ctime,
        } = self;
        mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && !matches!(mtime, Some(None))
            && (mtime.is_some() || ctime.is_some())
    }
}

impl Fs {
    pub(super) fn file_attr(&self, oid: u64, st: &State) -> FileAttr {
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

    pub(crate) fn getattr(&self, ino: u64) -> R<FileAttr> {
        let node = self.node(ino)?;
        let st = lock(&node.st);
        Ok(self.file_attr(ino, &st))
    }

    pub(crate) fn setattr(&self, ino: u64, req: SetAttr, caller: Caller) -> R<FileAttr> {
        self.writable()?;
        let _g = self.shared();
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        let now = Timestamp::now();
        if self.writeback && req.only_kernel_times() {
            // The kernel's own mtime/ctime of a file it caches (writeback
            // cache), sent after it wrote the data back, at fsync and close:
            // kept in memory and written back lazily as a write's
            // timestamps are without the cache, instead of rewriting the
            // object's record for every fsync.
            if let Some(Some(t)) = req.mtime {
                st.attr.mtime = t;
            }
            if let Some(t) = req.ctime {
                st.attr.ctime = t;
            }
            st.dirty = true;
            return Ok(self.file_attr(ino, &st));
        }
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
            // A truncate by a caller without CAP_FSETID drops set-id bits
            // as a write does, and file capabilities go whoever truncates:
            // the kernel leaves both to the mount (FUSE_HANDLE_KILLPRIV_V2),
            // and fuser does not pass on its FATTR_KILL_SUIDGID, so the
            // set-id rule is applied here to every caller but root.
            let set_id = req.mode.is_none() && Fs::drop_privs(&mut st, caller);
            if set_id | Fs::drop_caps(&mut st) {
                st.attr.ctime = now;
            }
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
            // chown clears set-user-ID and (group-executable) set-group-ID,
            // and the file's capabilities, as the kernel would.
            Fs::drop_caps(&mut st);
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

    /// Binds an empty object's cells to the share named `value`.
    pub(super) fn place_under_share(&self, oid: u64, value: &[u8]) -> R<()> {
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

    /// Drops the kernel's cached attributes of `ino` (not its cached pages:
    /// an offset of -1), so the next stat asks again. Safe inside a request:
    /// the kernel takes no inode lock for it.
    pub(super) fn tell_kernel_attrs_changed(&self, ino: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(ino), -1, 0);
        }
    }
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
