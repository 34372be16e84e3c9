//! File contents: open and release, read, write, fallocate, `SEEK_DATA`/`SEEK_HOLE`, fsync, and the access time reads move.

use super::{errno, lock, Caller, Fs, State, R, S_ISGID, S_ISUID, S_IXGRP};
use crate::meta::{Timestamp, S_IFREG};
use crate::options::MountOptions;
use fuser::Errno;

/// The access-time mode of a mount, from its options (the last one wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtimeMode {
    Never,
    Relative,
    Strict,
}

impl AtimeMode {
    pub(super) fn of(opts: &MountOptions) -> AtimeMode {
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

/// The granularity at which data and holes are reported (`lseek`,
/// `st_blocks`): a page, as local file systems report blocks. Cells store
/// byte ranges; a block holding any byte of data is data.
pub(crate) const DATA_BLOCK: u64 = 4096;

/// Byte ranges `(start, len)`, ascending, as runs of whole data blocks `(start, end)`.
pub(super) fn data_blocks(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
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
    pub(crate) fn open(&self, ino: u64, write: bool) -> R<()> {
        if write {
            self.writable()?;
        }
        let node = self.node(ino)?;
        if self.writeback
            && !self.store.shares().is_empty()
            && self.store.share_of(ino).is_ok_and(|s| s.is_some())
        {
            // A file under a key share: the pages the writeback cache keeps
            // after a write would outlive the share's destruction (DESIGN
            // §13), so each open drops them and reads come from the store,
            // which refuses once the share is gone.
            let _ = self.kernel_writes_back(ino, 0);
        }
        let mut st = lock(&node.st);
        if st.deleted {
            return Err(Errno::ENOENT);
        }
        if write {
            st.changeable()?;
        } else if (self.atime == AtimeMode::Strict
            || self.writeback && self.atime == AtimeMode::Relative)
            && st.attr.kind() == S_IFREG
        {
            // Reads the page cache serves never reach this file system: under
            // strictatime the open for reading counts as the access. So it
            // does under relatime with the writeback cache, whose pages
            // written are cached whole, so that the first read after a
            // change comes from them (relatime moves the time once after
            // each change, so the open is as good as the read).
            if self.accessed(&mut st) && self.writeback {
                // The kernel keeps the attributes it has for a second, and
                // no read of ours tells it the access time moved.
                st.opens += 1;
                drop(st);
                self.tell_kernel_attrs_changed(ino);
                return Ok(());
            }
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
            let mut st = lock(&node.st);
            let before = st.attr.atime;
            self.accessed(&mut st);
            let moved = st.attr.atime != before;
            drop(st);
            if moved && !self.attrs_always_fresh() {
                // The kernel keeps the attributes it has (kernel.rs, TTL)
                // and learns of no access time that a read moves.
                self.tell_kernel_attrs_changed(ino);
            }
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
    /// memory and written back lazily, as every timestamp. Returns whether
    /// it moved.
    fn accessed(&self, st: &mut State) -> bool {
        let now = Timestamp::now();
        let a = &st.attr;
        let due = match self.atime {
            AtimeMode::Never => false,
            AtimeMode::Strict => true,
            AtimeMode::Relative => {
                // One clock stamps all three (the kernel's coarse clock,
                // Timestamp::now), so a change in the tick of the last
                // access shows the same time, and counts as later.
                a.atime <= a.mtime || a.atime <= a.ctime || now.secs - a.atime.secs >= 86_400
            }
        };
        if due && !self.read_only {
            st.attr.atime = now;
            st.dirty = true;
        }
        due && !self.read_only
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
        if st.deleted {
            // The kernel's writeback of pages dirtied before the last close
            // of an unlinked file, arriving after it (the kernel sends them
            // before the release, so this is a late straggler): the object
            // is erased, and nothing may bring it back or seal its bytes.
            return Ok(data.len() as u32);
        }
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
        // A write inside a file whose every block holds data (known from an
        // earlier `st_blocks`) leaves the count as it was: kept, and the
        // kernel not told (below).
        let end = offset + data.len() as u64;
        let blocks_kept =
            end <= st.size && st.stored.get() == Some(st.size.div_ceil(DATA_BLOCK) * DATA_BLOCK);
        self.store.write(ino, offset, data).map_err(errno)?;
        if !blocks_kept {
            st.stored.set(None);
        }
        if end > st.size && !data.is_empty() {
            st.size = end;
        }
        if !self.writeback {
            let now = Timestamp::now();
            st.attr.mtime = now;
            st.attr.ctime = now;
            st.dirty = true;
        }
        // (With the writeback cache the kernel stamps mtime and ctime at
        // write(2) and sends them by setattr once the data is written back:
        // a write arriving here at writeback is not the time of the change.)
        let sensitive = st.sensitive();
        drop(st);
        if self.writeback && !blocks_kept {
            // The kernel's cached attributes predate this writeback: its
            // st_blocks would show the file without these bytes (a file that
            // looks sparse or empty to cp and tar). Not for every write: with
            // the cache, each write(2) after this asks for the attributes
            // again (the kernel checks size and mode at every write), which
            // halved fsync'd 4 KiB writes with 4 jobs.
            self.tell_kernel_attrs_changed(ino);
        }
        if overwrote && sensitive {
            self.commit_now();
        }
        Ok(data.len() as u32)
    }

    /// The medium's room as (total, free, available) bytes: the store's
    /// own measure, which leaves out the reserve it keeps for deleting,
    /// committing and cleaning (writes get ENOSPC once only that is left),
    /// else the host file system's under `space_from`.
    pub(super) fn room(&self) -> Option<(u64, u64, u64)> {
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
    pub(super) fn drop_privs(st: &mut State, caller: Caller) -> bool {
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

    /// A write by `caller`, who lacks CAP_FSETID, is coming (the kernel
    /// flagged it FUSE_WRITE_KILL_SUIDGID): the file's set-id bits go by
    /// the kernel's rule ([`Self::drop_privs`]), and its file capabilities
    /// (`security.capability`) with them, as `file_remove_privs` would.
    pub(crate) fn drop_privs_for(&self, ino: u64, caller: Caller) -> R<()> {
        self.writable()?;
        let node = self.node(ino)?;
        let mut st = lock(&node.st);
        st.changeable()?;
        let dropped = Self::drop_privs(&mut st, caller) | Self::drop_caps(&mut st);
        if !dropped {
            return Ok(());
        }
        st.attr.ctime = Timestamp::now();
        self.persist(ino, &mut st)?;
        drop(st);
        self.tell_kernel_attrs_changed(ino);
        Ok(())
    }

    /// Removes the file's capabilities (`security.capability`); returns
    /// whether it had any.
    pub(super) fn drop_caps(st: &mut State) -> bool {
        st.attr.xattrs.remove(&b"security.capability"[..]).is_some()
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
        let Ok(mut pos) = u64::try_from(offset) else {
            return Err(Errno::ENXIO);
        };
        if self.writeback && !self.kernel_writes_back(ino, pos) {
            // Another request is having pages written back: answer without
            // the kernel's dirty data, conservatively — everything up to
            // the size is data (never a hole where the kernel holds bytes).
            let size = lock(&self.node(ino)?.st).size;
            return match whence {
                _ if pos >= size => Err(Errno::ENXIO),
                libc::SEEK_DATA => Ok(pos as i64),
                _ => Ok(size as i64),
            };
        }
        let size = {
            let node = self.node(ino)?;
            let st = lock(&node.st);
            st.size
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

    /// With the writeback cache the kernel may hold a file's data that this
    /// file system has not seen (and `SEEK_DATA` would call a hole): has it
    /// write the file's dirty pages from `from` on back, and drop them (the
    /// kernel's reverse invalidation writes dirty pages back first and
    /// waits for those writes). Another request loop serves the writes, so
    /// one request at a time does this; false if another one is (or there
    /// is only one loop).
    fn kernel_writes_back(&self, ino: u64, from: u64) -> bool {
        let (Some(notifier), Some(one)) = (self.notifier.get(), &self.writing_back) else {
            return false;
        };
        let Ok(_one) = one.try_lock() else {
            return false;
        };
        // ENOENT: the kernel has no such inode cached, so no pages either.
        let _ = notifier.inval_inode(fuser::INodeNo(ino), from.min(i64::MAX as u64) as i64, 0);
        true
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
}

/// Of `bytes` free on the store's file system, what data can fill once
/// sealed: a 16-byte tag per cell and the key tree's nodes, about 0.2%
/// (charged as 1/512).
pub(super) fn net_of_overhead(bytes: u64) -> u64 {
    bytes - bytes / 513
}

/// (total, free, available to unprivileged users) bytes of the file system holding `path`.
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
