//! Names: lookup, creating, linking, removing and renaming them, and directory listings.

use super::{errno, lock, Caller, Fs, Node, NAME_MAX, R, SENSITIVE_XATTR, SHARE_XATTR, S_ISGID};
use crate::meta::{Attr, Timestamp, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use fuser::{Errno, FileAttr, FileType};
use oubli_core::{Error as StoreError, ROOT_DIR};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Prefix of the names a `RENAME_EXCHANGE` parks one side under while it swaps (visible, so a crash loses nothing).
const EXCHANGE_PREFIX: &str = ".oubli-exchange-";

/// An open directory: its listing, taken at the first page and at every
/// rewind, each entry beside its offset, in offset order (readdir pages
/// through it).
pub(super) struct DirHandle {
    oid: u64,
    entries: Option<Arc<Vec<(u64, DirEntry)>>>,
}

/// Where a listing continues after `.` and after `..` ([`DirOffsets::of`]).
const DOT_OFFSET: u64 = 1;
const DOTDOT_OFFSET: u64 = 2;

/// The offset of each name in a listing: a keyed hash of the name, so that
/// it does not move when other names come and go. The kernel keeps a
/// directory's listing across opens (`FOPEN_CACHE_DIR`, kernel.rs opendir)
/// and, when it has lost the cached pages or another reader has reset them
/// (also halfway through a listing), asks on from the offset it stopped at
/// with a handle whose own listing may be older or newer than the pages it
/// served; an index into a listing would then skip or repeat names that
/// outlived the change (`rm -rf` of a large directory read its first names
/// from the cache and stopped with ENOTEMPTY). The key is random per mount,
/// so no one can choose names whose offsets collide: two names of one
/// directory share an offset with chance about n²/2⁶⁴, and then a page
/// that ends between them loses the second (ext4's hashed directories, with
/// their 64-bit offsets, make the same trade).
pub(super) struct DirOffsets(std::collections::hash_map::RandomState);

impl DirOffsets {
    pub(super) fn new() -> Self {
        Self(std::collections::hash_map::RandomState::new())
    }

    /// `.` and `..` at 1 and 2, every other name in `3..2⁶³` (the kernel's
    /// directory position is a signed 64-bit offset; 0 is the start).
    fn of(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        match name {
            b"." => DOT_OFFSET,
            b".." => DOTDOT_OFFSET,
            _ => (self.0.hash_one(name) >> 1).max(DOTDOT_OFFSET + 1),
        }
    }
}

pub(crate) struct DirEntry {
    pub ino: u64,
    pub kind: FileType,
    pub name: Vec<u8>,
}

/// The entries of a listing in offset order that come after `offset`.
pub(crate) fn after_offset(entries: &[(u64, DirEntry)], offset: u64) -> &[(u64, DirEntry)] {
    &entries[entries.partition_point(|(at, _)| *at <= offset)..]
}

pub(super) fn check_name(name: &[u8]) -> R<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// The orphan list's name for an object: its id, fixed width so it sorts.
pub(super) fn orphan_name(oid: u64) -> [u8; 8] {
    oid.to_be_bytes()
}

impl Fs {
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
        let node = Node::new(oid, attr, size, 1, opens);
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
    pub(super) fn finish_unlinked(&self, node: &Node) -> R<()> {
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

    pub(super) fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> R<()> {
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
                // Taken at the first page (and on rewind, and when the
                // kernel continues with a handle it listed nothing with):
                // the listing is O(n log n), every later page a slice of it.
                let e = Arc::new(self.in_offset_order(self.listing(ino)?));
                if let Some(h) = lock(&self.dirs).get_mut(&fh) {
                    h.entries = Some(e.clone());
                }
                e
            }
        };
        for (at, e) in after_offset(&entries, offset) {
            if add(e, *at) {
                break;
            }
        }
        Ok(())
    }

    /// `entries` (`.` and `..` among them), each beside its offset, in
    /// offset order: for every listing the kernel pages through, also
    /// `.snapshots`' (kernel.rs), whose names change without it.
    pub(crate) fn in_offset_order(&self, entries: Vec<DirEntry>) -> Vec<(u64, DirEntry)> {
        let mut out: Vec<(u64, DirEntry)> = entries
            .into_iter()
            .map(|e| (self.dir_offsets.of(&e.name), e))
            .collect();
        out.sort_unstable_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
        out
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

    /// An entry's attributes for a listing that carries them
    /// (READDIRPLUS), with one kernel reference taken, as a lookup does.
    pub(crate) fn entry_attr(&self, oid: u64) -> R<FileAttr> {
        let node = self.node_ref(oid, 1)?;
        let st = lock(&node.st);
        Ok(self.file_attr(oid, &st))
    }

    pub(crate) fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }
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
