//! The write path: whole cells sealed before the lock, partial cells merged in a buffer, truncate, punch and delete — every way a unit leaves the tree.

use super::*;
use crate::holes::{self, Holes};
use crate::unit::{cell_span, SPLIT_CELLS};

/// The whole cells of one write, sealed before the engine lock is taken and
/// laid out back to back (ciphertext ‖ tag per cell) so they are appended to
/// the medium in one piece. Dropped, it lets go of its keys: those in the
/// tree by then are placed already, and the others never will be (a write
/// that failed, a run not used), so a commit's sweep may revoke them.
pub(super) struct SealedRun {
    /// The object's cell size they were cut in.
    cell_size: u32,
    /// The share the object was under when they were sealed (their keys
    /// are bound to it): the run is used only if it still is.
    share: Option<u32>,
    first_cell: u64,
    /// `key_refs.len()` units of `cell_size + TAG_LEN` bytes each.
    bytes: Vec<u8>,
    key_refs: Vec<KeyRef>,
    scheme: Arc<dyn KeyScheme>,
}

impl Drop for SealedRun {
    fn drop(&mut self) {
        self.key_refs.iter().for_each(|k| self.scheme.placed(k));
    }
}

/// The opened old content of a cell a write merges into, read before the
/// engine lock was taken; used only if the tree still points at `addr` and
/// the unit there is the one that was read: one that may be rewritten in
/// place (`rewrite.rs`) only if no unit was rewritten since.
pub(super) struct Prefetched {
    cell: u64,
    addr: u64,
    pub(super) plain: PlainBuf,
    /// The unit at `addr` could not be rewritten when it was read.
    stable: bool,
    /// [`Shared::rewrites`] when the read was planned.
    rewrites_seen: u64,
}

impl Prefetched {
    /// Whether this is the content of `c`, the unit the tree now names for `cell`.
    pub(super) fn is_of(&self, cell: u64, c: &CellRef, rewrites_now: u64) -> bool {
        self.cell == cell
            && self.addr == c.addr
            && (self.stable || self.rewrites_seen == rewrites_now)
    }
}

/// Plaintext of one cell waiting to be sealed: bytes `[start, start+data.len())`
/// of the cell, of which `holes` (zeros there) were never written or were punched.
pub(super) struct DirtyCell {
    pub(super) start: u32,
    pub(super) data: PlainBuf,
    pub(super) holes: Holes,
}

impl Store {
    /// Writes `data` at `offset`, extending the object if needed. The old
    /// bytes of an overwritten range are erased at the next commit.
    pub fn write(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.write_checked(oid, offset, data, false)
    }

    /// [`write`](Self::write) for an object whose size is fixed (a block
    /// device's export): refused with [`Error::PastEnd`], writing nothing,
    /// if it would end past the object's size — checked under the engine
    /// lock with the write, so a truncate that a caller's own check raced
    /// with cannot be undone by the write growing the object back.
    pub fn write_inside(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        self.write_checked(oid, offset, data, true)
    }

    fn write_checked(&self, oid: u64, offset: u64, data: &[u8], inside: bool) -> Result<()> {
        let sealed = self.seal_whole_cells(oid, offset, data);
        let mut prefetched = Vec::new();
        let mut e = self.lock_beside_commit();
        // The old content of a partly overwritten cell (at most the first and
        // the last of the write) is read and opened without the lock, so
        // writers to other cells and readers go on meanwhile. A writer that
        // replaces the cell in between makes the merge read it again, under
        // the lock; one retry here keeps that rare.
        for _ in 0..2 {
            let wanted = e.cells_to_merge(oid, offset, data.len() as u64, &prefetched)?;
            if wanted.is_empty() {
                break;
            }
            let cell_size = e.cells_of(&e.tree, oid)?;
            let share = e.share_key_in(&e.tree, oid)?;
            let rewrites_seen = self.rewrite_count();
            let wanted: Vec<_> = wanted
                .into_iter()
                .map(|(cell, c)| (cell, !e.may_rewrite(c.addr), c))
                .collect();
            let guard = self
                .shared
                .io_guard
                .read()
                .unwrap_or_else(|p| p.into_inner());
            drop(e);
            let sh = &self.shared;
            for (cell, stable, c) in wanted {
                let opened = open_cell_unit(
                    &*sh.medium,
                    &*sh.provider,
                    &*sh.scheme,
                    cell_size,
                    oid,
                    cell,
                    &c,
                    share.as_ref(),
                );
                let plain = match opened {
                    Ok(plain) => plain,
                    // Rewritten in place meanwhile: the merge reads the
                    // new unit under the lock.
                    Err(_) if !stable && self.rewrite_count() != rewrites_seen => continue,
                    Err(e) => return Err(e),
                };
                prefetched.retain(|p: &Prefetched| p.cell != cell);
                prefetched.push(Prefetched {
                    cell,
                    addr: c.addr,
                    plain,
                    stable,
                    rewrites_seen,
                });
            }
            drop(guard);
            e = self.lock_beside_commit();
        }
        if inside {
            let size = e.record(oid)?.size;
            let end = offset.saturating_add(data.len() as u64);
            if end > size {
                return Err(Error::PastEnd(format!(
                    "a write at {offset} of {} bytes ends past the object's end ({size} bytes)",
                    data.len()
                )));
            }
        }
        e.write(oid, offset, data, sealed, &mut prefetched)?;
        self.settle(e);
        Ok(())
    }

    /// Seals every whole, aligned cell of a write under a fresh key, before
    /// the engine lock is taken.
    pub(super) fn seal_whole_cells(&self, oid: u64, offset: u64, data: &[u8]) -> Option<SealedRun> {
        // A small write is buffered, whole cells or not (`SMALL_WRITE`).
        if data.len() <= SMALL_WRITE {
            return None;
        }
        let end = offset.checked_add(data.len() as u64)?;
        // The object's cell size (decided now if this is its first data)
        // and its share. What fails here, the write reports under the lock.
        let (cell_size, share_id, share) = {
            let mut e = self.lock_beside_commit();
            let cell_size = e.cells_for_write(oid, offset).ok()?;
            let share_id = e.share_id_in(&e.tree, oid).ok()?;
            (cell_size, share_id, e.share_key_in(&e.tree, oid).ok()?)
        };
        let cs = cell_size as usize;
        let first = offset.div_ceil(cs as u64);
        let count = (end / cs as u64).checked_sub(first).filter(|&n| n > 0)? as usize;
        let unit = cs + TAG_LEN;
        let mut keys = Vec::with_capacity(count);
        let mut key_refs = Vec::with_capacity(count);
        let provider = &*self.shared.provider;
        for (key, key_ref) in self.shared.scheme.allocate_detached_many(provider, count) {
            let key = match &share {
                Some(s) => crate::share::bind(provider, s, &key),
                None => key,
            };
            keys.push(key);
            key_refs.push(key_ref);
        }
        // Filled as it is sealed, never zeroed first (a 1 MiB write spent
        // more on clearing the buffer than on copying into it).
        let mut bytes = Vec::with_capacity(count * unit);
        let skip = (first * cs as u64 - offset) as usize;
        // On the calling thread: on a machine whose other cores are busy
        // with the kernel's side of the request (FUSE, NBD), handing parts
        // to other threads made sequential writes slower (DESIGN §10).
        for (i, (plain, key)) in data[skip..skip + count * cs]
            .chunks_exact(cs)
            .zip(&keys)
            .enumerate()
        {
            let start = bytes.len();
            bytes.extend_from_slice(plain);
            let cell = first + i as u64;
            let aad = cell_aad(oid, cell, 0, cs as u32);
            let tag = provider.seal_detached(key, &aad, &mut bytes[start..]);
            bytes.extend_from_slice(&tag);
        }
        Some(SealedRun {
            cell_size,
            share: share_id,
            first_cell: first,
            bytes,
            key_refs,
            scheme: self.shared.scheme.clone(),
        })
    }

    /// Sets the size; bytes past a smaller size are erased at the next commit.
    pub fn truncate(&self, oid: u64, size: u64) -> Result<()> {
        let mut e = self.lock_beside_commit();
        let truncated = e.as_one_deletion(|e| e.truncate(oid, size));
        // Counted under the lock, failed or not: whoever sees the new count
        // and asks for the size waits for this truncate to be over.
        self.shrinks.fetch_add(1, Ordering::SeqCst);
        truncated?;
        self.settle(e);
        Ok(())
    }

    /// Zeroes `[offset, offset+len)` (deallocating whole cells); the old bytes are erased at the next commit.
    pub fn punch_hole(&self, oid: u64, offset: u64, len: u64) -> Result<()> {
        self.punch_holes(oid, &[(offset, len)])
    }

    /// Punches every `(offset, len)` range as one deletion, under one hold of
    /// the engine lock: what a block device learns is freed by one file-system
    /// commit (thousands of extents after an `rm -rf`) costs one lock and one
    /// epoch-policy check instead of one each. Stops at the first range that
    /// fails; the ranges before it stay punched.
    pub fn punch_holes(&self, oid: u64, ranges: &[(u64, u64)]) -> Result<()> {
        let mut e = self.lock_beside_commit();
        let punched = e.as_one_deletion(|e| {
            ranges
                .iter()
                .try_for_each(|&(offset, len)| e.punch(oid, offset, len))
        });
        self.settle(e);
        punched
    }

    /// Deletes the object and all its data; erased at the next commit.
    pub fn delete(&self, oid: u64) -> Result<()> {
        let mut e = self.lock_beside_commit();
        let deleted = e.delete(oid);
        self.shrinks.fetch_add(1, Ordering::SeqCst); // as in `truncate`
        deleted?;
        self.settle(e);
        Ok(())
    }
}

impl Engine {
    pub(super) fn read_cell(&self, oid: u64, cell: u64, c: &CellRef) -> Result<PlainBuf> {
        self.read_cell_in(&self.tree, oid, cell, c)
    }

    /// Opens a cell of object `oid` of `tree` (the live tree or a snapshot's).
    pub(super) fn read_cell_in(
        &self,
        tree: &Tree,
        oid: u64,
        cell: u64,
        c: &CellRef,
    ) -> Result<PlainBuf> {
        let share = self.share_key_in(tree, oid)?;
        open_cell_unit(
            &*self.ctx.medium,
            &*self.ctx.provider,
            &*self.ctx.scheme,
            self.cells_of(tree, oid)?,
            oid,
            cell,
            c,
            share.as_ref(),
        )
    }

    /// The current content of a cell as (start, bytes, holes): buffered, or read from the tree.
    pub(super) fn cell_content(
        &self,
        oid: u64,
        cell: u64,
    ) -> Result<Option<(u32, PlainBuf, Holes)>> {
        if let Some(d) = self.dirty.get(&(oid, cell)) {
            return Ok(Some((d.start, PlainBuf::copy_of(&d.data), d.holes.clone())));
        }
        match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
            Some(Value::Cell(c)) => {
                let plain = self.read_cell(oid, cell, &c)?;
                Ok(Some((c.start, plain, c.holes)))
            }
            _ => Ok(None),
        }
    }

    pub(super) fn set_dirty(
        &mut self,
        oid: u64,
        cell: u64,
        start: u32,
        data: PlainBuf,
        holes: Holes,
    ) {
        self.dirty_bytes += data.len();
        let d = DirtyCell { start, data, holes };
        if let Some(old) = self.dirty.insert((oid, cell), d) {
            self.dirty_bytes -= old.data.len();
        }
    }

    pub(super) fn take_dirty(&mut self, oid: u64, cell: u64) -> Option<DirtyCell> {
        let d = self.dirty.remove(&(oid, cell))?;
        self.dirty_bytes -= d.data.len();
        Some(d)
    }

    /// Seals a buffered cell into a new unit under a fresh key and puts it
    /// in the tree (holes at either end of its range are not stored).
    pub(super) fn write_out(&mut self, oid: u64, cell: u64) -> Result<()> {
        let Some(d) = self.take_dirty(oid, cell) else {
            return Ok(());
        };
        let end = d.start + d.data.len() as u32;
        let mut holes = d.holes.clone();
        let (s, e) = holes::trim(d.start, end, &mut holes);
        let result = if s >= e {
            self.apply(Op::DropCell { oid, cell }, true)
        } else {
            let bytes = &d.data[(s - d.start) as usize..(e - d.start) as usize];
            self.seal_cell(oid, cell, s, bytes, holes)
        };
        match (&result, &mut self.frame_cells) {
            // The medium had no room and took nothing (the tree is as
            // before): the cell stays buffered for the next try, so that
            // what was accepted is not lost.
            (Err(Error::NoSpace(_)), _) => self.set_dirty(oid, cell, d.start, d.data, d.holes),
            // Sealed into a flush's frame, whose head may yet find no
            // room: kept until then.
            (Ok(()), Some(frame)) => frame.taken.push(((oid, cell), d)),
            _ => {}
        }
        result
    }

    /// Seals `bytes` as the new content of a cell (from `start`) and puts it in the tree.
    pub(super) fn seal_cell(
        &mut self,
        oid: u64,
        cell: u64,
        start: u32,
        bytes: &[u8],
        holes: Holes,
    ) -> Result<()> {
        let len = bytes.len() as u32;
        let share = self.share_key_in(&self.tree, oid)?;
        let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
        let key = self.bind_share(share.as_ref(), key);
        let mut sealed = Vec::with_capacity(bytes.len() + TAG_LEN);
        sealed.extend_from_slice(bytes);
        self.ctx
            .provider
            .seal(&key, &cell_aad(oid, cell, start, len), &mut sealed);
        let addr = match self.place_of_replaced(oid, cell, sealed.len())? {
            Some(at) if self.rewrite_in_place(at, &sealed, 1) => at,
            _ => self.append_unit(&sealed)?,
        };
        let cref = CellRef {
            start,
            len,
            addr,
            key: key_ref,
            holes,
        };
        self.apply(Op::PutCell { oid, cell, cref }, true)
    }

    /// Puts a run of sealed whole cells in the tree. A cell whose old unit
    /// may still be rewritten (`rewrite.rs`) takes that unit's place; the
    /// others are appended, in as few pieces as segment boundaries allow.
    /// Consecutive cells bound the same way (over consecutive old units, or
    /// appended) go in one write: a block device's writeback sends the same
    /// extents again and again, so a rewritten run is usually one write.
    /// `old_size` is the object's size before the write: cells from it on
    /// hold nothing to take the place of (a stream's appends, the tail of
    /// a write that extends the object), so they are not looked up.
    pub(super) fn put_run(&mut self, oid: u64, run: SealedRun, old_size: u64) -> Result<()> {
        let unit = run.cell_size as usize + TAG_LEN;
        let count = run.key_refs.len();
        let places = (run.first_cell..run.first_cell + count as u64)
            .map(|cell| {
                if cell * u64::from(run.cell_size) < old_size {
                    self.place_of_replaced(oid, cell, unit)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        // Borrowed: the run lets go of them all when dropped (`placed` again
        // for those in the tree is nothing), whether this ends well or not.
        let mut key_refs = run.key_refs.iter();
        // One lookup for the run (most rewrites cross no split cell), then
        // one per cell only if it does.
        let old_cells = run.first_cell
            ..(run.first_cell + count as u64).min(old_size.div_ceil(u64::from(run.cell_size)));
        let rejoins = self.any_split(oid, old_cells.clone(), run.cell_size)?;
        let mut groups = Vec::new();
        let mut i = 0;
        while i < count {
            let j = i + same_way(&places[i..], unit as u64);
            groups.push((i, j));
            i = j;
        }
        // The appends first, before the tree changes: a run that finds no
        // room on the medium (`NoSpace`, nothing appended) leaves the
        // object as it was.
        let mut appended = Vec::new();
        for &(i, j) in &groups {
            if places[i].is_none() {
                appended.push(self.append_units(&run.bytes[i * unit..j * unit], unit)?);
            }
        }
        let mut appended = appended.into_iter();
        for (i, j) in groups {
            let bytes = &run.bytes[i * unit..j * unit];
            let addrs = match places[i] {
                None => appended.next().expect("appended above"),
                Some(at) if self.rewrite_in_place(at, bytes, j - i) => {
                    (0..j - i).map(|k| at + (k * unit) as u64).collect()
                }
                Some(_) => self.append_units(bytes, unit)?,
            };
            // Into the tree right after their bytes, so that a failure
            // further on leaves no cell pointing at a unit written over.
            for (k, addr) in addrs.into_iter().enumerate() {
                let cell = run.first_cell + (i + k) as u64;
                let key = key_refs.next().expect("one key per unit").clone();
                self.take_dirty(oid, cell);
                if rejoins && old_cells.contains(&cell) {
                    // Written whole again: a split cell is put back whole
                    // (`split.rs`), its small cells dropped in this batch.
                    self.rejoin(oid, cell, run.cell_size)?;
                }
                let cref = CellRef {
                    start: 0,
                    len: run.cell_size,
                    addr,
                    key,
                    holes: Holes::new(),
                };
                self.apply(Op::PutCell { oid, cell, cref }, true)?;
            }
        }
        Ok(())
    }

    /// Appends `bytes` (units of `unit` bytes) in as few pieces as segment
    /// boundaries allow; returns each unit's address.
    pub(super) fn append_units(&mut self, bytes: &[u8], unit: usize) -> Result<Vec<u64>> {
        let mut addrs = Vec::with_capacity(bytes.len() / unit);
        for piece in self.split_for_segments(bytes, unit) {
            let base = self.append_unit(piece)?;
            addrs.extend((0..piece.len() / unit).map(|k| base + (k * unit) as u64));
        }
        Ok(addrs)
    }

    /// Cuts `bytes` (units of `unit` bytes) into pieces that each fit the
    /// current data segment or a fresh one.
    pub(super) fn split_for_segments<'b>(&self, bytes: &'b [u8], unit: usize) -> Vec<&'b [u8]> {
        let mut pieces = Vec::new();
        let mut room = match self.data_segment {
            Some((_, off)) => self.segment_target.saturating_sub(off),
            None => 0,
        };
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut fit = (room as usize / unit) * unit;
            if fit == 0 {
                room = self.segment_target;
                fit = ((room as usize / unit) * unit).max(unit);
            }
            let (piece, tail) = rest.split_at(fit.min(rest.len()));
            pieces.push(piece);
            room = room.saturating_sub(piece.len() as u64);
            rest = tail;
        }
        pieces
    }

    pub(super) fn write_out_all(&mut self) -> Result<()> {
        let cells: Vec<(u64, u64)> = self.dirty.keys().copied().collect();
        for (oid, cell) in cells {
            self.write_out(oid, cell)?;
        }
        Ok(())
    }

    pub(super) fn write(
        &mut self,
        oid: u64,
        offset: u64,
        data: &[u8],
        sealed: Option<SealedRun>,
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<()> {
        self.mutable()?;
        let mut record = self.record(oid)?;
        if data.is_empty() {
            // POSIX: a zero-length write does not extend the object.
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::Invalid("write past 2^64".into()))?;
        // Refused before anything changes once only the reserve is left.
        self.admit(data.len() as u64)?;
        let cs = u64::from(self.cells_for_write(oid, offset)?);
        // A run cut in other cells (the object's first write raced another
        // that decided otherwise), or sealed before the object was placed
        // under a share (`set_share` takes an empty object while the run
        // is sealed without the lock), is not used: its cells go the slow
        // way, sealed here under what the object is now.
        let share = self.share_id_in(&self.tree, oid)?;
        let sealed = sealed.filter(|run| u64::from(run.cell_size) == cs && run.share == share);
        // Whether the write replaced bytes of sealed units: an overwrite is a
        // deletion (the old bytes are erased at the next commit), an append
        // that only extends a cell is not.
        let freed_before = self.stats.units_freed;
        // The run of whole cells, sealed before the lock was taken, goes
        // first: its appends are what may find no room (`NoSpace`, nothing
        // appended), and then nothing of the write may have changed yet —
        // not even the partial cell before it, merged into the buffer.
        let run_cells = match sealed {
            Some(run) => {
                let cells = run.first_cell..run.first_cell + run.key_refs.len() as u64;
                self.put_run(oid, run, record.size)?;
                cells
            }
            None => 0..0,
        };
        let at_random = !self.continues_last_write(oid, offset, end);
        let mut pos = offset;
        let mut overwrote = false;
        while pos < end {
            let cell = pos / cs;
            if run_cells.contains(&cell) {
                pos = run_cells.end * cs;
                continue;
            }
            let from = (pos % cs) as u32;
            let n = (cs - from as u64).min(end - pos) as u32;
            let chunk = &data[(pos - offset) as usize..(pos - offset) as usize + n as usize];
            overwrote |=
                self.write_in_cell(oid, cell, cs as u32, from, chunk, at_random, prefetched)?;
            pos += n as u64;
        }
        if overwrote || self.stats.units_freed > freed_before {
            self.stats.overwrites += 1;
        }
        if end > record.size {
            record.size = end;
            self.tree_insert(object_key(oid), Value::Object(record))?;
            self.size_stamp += 1;
            self.size_dirty.insert(oid, self.size_stamp);
        }
        self.stats.bytes_written += data.len() as u64;
        if self.dirty_bytes + self.dirty.len() * DIRTY_CELL_OVERHEAD > WRITE_BUFFER_MAX {
            match self.write_out_all() {
                // The write is in (buffered, accepted): what found no room
                // stays buffered for the next flush, as in `merge_into_cell`.
                Err(Error::NoSpace(_)) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// The cells a write of `len` bytes at `offset` only partly covers whose
    /// old content the merge needs: in the tree, not buffered, not wholly
    /// inside the write, and not among `prefetched` already.
    pub(super) fn cells_to_merge(
        &self,
        oid: u64,
        offset: u64,
        len: u64,
        prefetched: &[Prefetched],
    ) -> Result<Vec<(u64, CellRef)>> {
        let cs = u64::from(self.cells_of(&self.tree, oid)?);
        let end = offset.saturating_add(len);
        // A missing object has no cells: the write itself reports it.
        if len == 0 {
            return Ok(Vec::new());
        }
        // The cells holding the write's first and last byte: the object's
        // own, or the small cells of a split one.
        let mut edges = Vec::new();
        for byte in [offset, end - 1] {
            let cell = byte / cs;
            let id = match self.is_split(oid, cell, cs as u32)? {
                true => split::split_ids_over(byte, byte + 1).start,
                false => cell,
            };
            if edges.last() != Some(&id) {
                edges.push(id);
            }
        }
        let mut wanted = Vec::new();
        for cell in edges {
            let (at, size) = cell_span(cell, cs as u32);
            let size = u64::from(size);
            let from = offset.max(at) - at;
            let to = end.min(at + size) - at;
            if (from == 0 && to == size) || self.dirty.contains_key(&(oid, cell)) {
                continue;
            }
            if let Some(Value::Cell(c)) = self.tree.get(&cell_key(oid, cell), &self.ctx)? {
                let covered = from <= c.start as u64 && c.start as u64 + c.len as u64 <= to;
                let now = self.rewrites.load(Ordering::SeqCst);
                let have = prefetched.iter().any(|p| p.is_of(cell, &c, now));
                if !covered && !have {
                    wanted.push((cell, c));
                }
            }
        }
        Ok(wanted)
    }

    /// Writes `chunk` at byte `from` of a cell: into its buffered content in
    /// place when it fits there, else merged with the cell's old content (the
    /// new content spans both ranges; gaps are zeros) and buffered. A cell
    /// that becomes whole is sealed at once. Returns whether the chunk
    /// replaced bytes of the cell's sealed unit.
    pub(super) fn merge_into_cell(
        &mut self,
        oid: u64,
        cell: u64,
        cell_size: u32,
        from: u32,
        chunk: &[u8],
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<bool> {
        let to = from + chunk.len() as u32;
        if let Some(d) = self.dirty.get_mut(&(oid, cell)) {
            if d.start <= from && to as usize <= d.start as usize + d.data.len() {
                let at = (from - d.start) as usize;
                d.data[at..at + chunk.len()].copy_from_slice(chunk);
                holes::remove(&mut d.holes, from, to);
                return Ok(false);
            }
        }
        let mut replaced_sealed = false;
        let old = match self.take_dirty(oid, cell) {
            Some(d) => Some((d.start, d.data, d.holes)),
            None => match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
                // Wholly overwritten: the old bytes are not needed.
                Some(Value::Cell(c)) if from <= c.start && c.start + c.len <= to => {
                    replaced_sealed = true;
                    None
                }
                Some(Value::Cell(c)) => {
                    replaced_sealed = from < c.start + c.len && c.start < to;
                    let now = self.rewrites.load(Ordering::SeqCst);
                    let at = prefetched.iter().position(|p| p.is_of(cell, &c, now));
                    let plain = match at {
                        Some(i) => prefetched.swap_remove(i).plain,
                        None => self.read_cell(oid, cell, &c)?,
                    };
                    Some((c.start, plain, c.holes))
                }
                _ => None,
            },
        };
        let (start, bytes, gaps) = merged(old, from, chunk);
        let full = start == 0 && bytes.len() as u64 == u64::from(cell_size);
        self.set_dirty(oid, cell, start, bytes, gaps);
        // A whole cell has nothing more to wait for; the next flush's frame
        // takes a few (`small_writes_buffered`), a stream's go now.
        if full && self.dirty_bytes > self.small_writes_buffered {
            match self.write_out(oid, cell) {
                // No room now: the cell stays buffered (accepted; the next
                // flush writes it or reports the medium still full).
                Err(Error::NoSpace(_)) => {}
                other => other?,
            }
        }
        Ok(replaced_sealed)
    }

    /// Keeps only the bytes of a cell inside `[keep_from, keep_to)` (cell-relative), zeroing `[zero_from, zero_to)`.
    pub(super) fn rewrite_cell(
        &mut self,
        oid: u64,
        cell: u64,
        zero_from: u32,
        zero_to: u32,
    ) -> Result<()> {
        let Some((start, mut bytes, mut gaps)) = self.cell_content(oid, cell)? else {
            return Ok(());
        };
        let end = start + bytes.len() as u32;
        if zero_to <= start || zero_from >= end {
            return Ok(());
        }
        // The zeroed range becomes a hole; holes at either end of the
        // range are cut off, so a cell that is all hole goes.
        holes::add(&mut gaps, zero_from, zero_to);
        let (s, e) = holes::trim(start, end, &mut gaps);
        if s >= e {
            self.take_dirty(oid, cell);
            return self.apply(Op::DropCell { oid, cell }, true);
        }
        for i in zero_from.max(s)..zero_to.min(e) {
            bytes[(i - start) as usize] = 0;
        }
        let kept = PlainBuf::copy_of(&bytes[(s - start) as usize..(e - start) as usize]);
        self.set_dirty(oid, cell, s, kept, gaps);
        // Seal now: the old unit (with the removed bytes) must leave the tree
        // before the next commit, and an unflushed buffer is not in the tree.
        match self.write_out(oid, cell) {
            // No room (another program filled the disk): the cut cell
            // stays buffered, which reads see, and a commit seals every
            // buffered cell before it captures the tree — so the old unit
            // still leaves it before any commit lands. A delete on a full
            // disk must work.
            Err(Error::NoSpace(_)) => Ok(()),
            other => other,
        }
    }

    /// Runs a truncate or punch: if it sealed units away (a cell cut short
    /// and rewritten) without counting a deletion itself, it counts as one.
    fn as_one_deletion(&mut self, op: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let (freed, deletions) = (self.stats.units_freed, self.stats.deletions);
        op(self)?;
        if self.stats.deletions == deletions && self.stats.units_freed > freed {
            self.stats.deletions += 1;
        }
        Ok(())
    }

    pub(super) fn truncate(&mut self, oid: u64, size: u64) -> Result<()> {
        self.mutable()?;
        let mut record = self.record(oid)?;
        if size < record.size {
            let cs = self.cells_of(&self.tree, oid)?;
            self.clear(oid, size, u64::MAX, cs)?;
        }
        record.size = size;
        self.size_dirty.remove(&oid);
        self.apply(Op::SetObject { oid, record }, true)
    }

    pub(super) fn punch(&mut self, oid: u64, offset: u64, len: u64) -> Result<()> {
        self.mutable()?;
        let record = self.record(oid)?;
        let end = offset.saturating_add(len).min(record.size);
        if offset >= end {
            return Ok(());
        }
        let cs = self.cells_of(&self.tree, oid)?;
        self.clear(oid, offset, end, cs)
    }

    /// Zeroes bytes `[lo, hi)` of `oid` (`hi` = `u64::MAX`: to the end),
    /// whose cells are `cs` bytes: cells wholly inside are dropped (with
    /// the small cells of those split), the cells at either end rewritten
    /// without the bytes.
    fn clear(&mut self, oid: u64, lo: u64, hi: u64, cs: u32) -> Result<()> {
        let csz = u64::from(cs);
        let to_end = hi == u64::MAX;
        let (first_whole, end_whole) = (lo.div_ceil(csz), if to_end { hi } else { hi / csz });
        if first_whole > end_whole {
            // Inside one cell.
            let cell = lo / csz;
            return self.clear_in_cell(oid, cell, cs, (lo % csz) as u32, (hi - cell * csz) as u32);
        }
        if !lo.is_multiple_of(csz) {
            self.clear_in_cell(oid, lo / csz, cs, (lo % csz) as u32, cs)?;
        }
        if first_whole < end_whole {
            self.drop_cell_ids(oid, first_whole..end_whole.min(SPLIT_CELLS))?;
            if cs > SMALL_CELL_SIZE {
                let from = split::split_ids(first_whole, cs).start;
                let to = match to_end {
                    true => u64::MAX,
                    false => split::split_ids(end_whole, cs).start,
                };
                self.drop_cell_ids(oid, from..to)?;
            }
        }
        if !to_end && !hi.is_multiple_of(csz) {
            self.clear_in_cell(oid, end_whole, cs, 0, (hi % csz) as u32)?;
        }
        Ok(())
    }

    /// Zeroes `[zero_from, zero_to)` of large cell `cell` (of `cs` bytes):
    /// in the cell, or in the small cells of a split one.
    fn clear_in_cell(
        &mut self,
        oid: u64,
        cell: u64,
        cs: u32,
        zero_from: u32,
        zero_to: u32,
    ) -> Result<()> {
        if !self.is_split(oid, cell, cs)? {
            return self.rewrite_cell(oid, cell, zero_from, zero_to);
        }
        let small = u64::from(SMALL_CELL_SIZE);
        let base = cell * u64::from(cs);
        let (lo, hi) = (base + u64::from(zero_from), base + u64::from(zero_to));
        let (first_whole, end_whole) = (lo.div_ceil(small), hi / small);
        if first_whole > end_whole {
            let sub = lo / small;
            let (from, to) = ((lo % small) as u32, (hi - sub * small) as u32);
            return self.rewrite_cell(oid, SPLIT_CELLS + sub, from, to);
        }
        if !lo.is_multiple_of(small) {
            self.rewrite_cell(
                oid,
                SPLIT_CELLS + lo / small,
                (lo % small) as u32,
                SMALL_CELL_SIZE,
            )?;
        }
        self.drop_cell_ids(oid, SPLIT_CELLS + first_whole..SPLIT_CELLS + end_whole)?;
        if !hi.is_multiple_of(small) {
            self.rewrite_cell(oid, SPLIT_CELLS + end_whole, 0, (hi % small) as u32)?;
        }
        Ok(())
    }

    pub(super) fn delete(&mut self, oid: u64) -> Result<()> {
        self.mutable()?;
        self.record(oid)?;
        if oid == ROOT_DIR {
            return Err(Error::Invalid(
                "the root directory cannot be deleted".into(),
            ));
        }
        let doomed: Vec<(u64, u64)> = self
            .dirty
            .range((oid, 0)..=(oid, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for (o, c) in doomed {
            self.take_dirty(o, c);
        }
        self.size_dirty.remove(&oid);
        self.apply(Op::DeleteObject { oid }, true)
    }
}

/// How many of `places` (the first included) go the same way as the first:
/// over consecutive old units of one segment, or appended.
fn same_way(places: &[Option<u64>], unit: u64) -> usize {
    let Some(&first) = places.first() else {
        return 0;
    };
    let follows = |k: usize, p: &Option<u64>| match (first, p) {
        (Some(at), Some(here)) => {
            *here == at + k as u64 * unit && addr_segment(*here) == addr_segment(at)
        }
        (None, None) => true,
        _ => false,
    };
    places
        .iter()
        .enumerate()
        .take_while(|(k, p)| follows(*k, p))
        .count()
}

/// A cell's content `(start, bytes, holes)` with `chunk` written at byte
/// `from` of the cell over its old content `old`, if any: the new content
/// spans both ranges, and the zeros between them are holes.
pub(super) fn merged(
    old: Option<(u32, PlainBuf, Holes)>,
    from: u32,
    chunk: &[u8],
) -> (u32, PlainBuf, Holes) {
    let to = from + chunk.len() as u32;
    let (start, bytes, mut gaps) = match old {
        Some((old_start, mut old, mut gaps)) if !old.is_empty() => {
            let old_end = old_start + old.len() as u32;
            if old_start <= from && to <= old_end {
                old[(from - old_start) as usize..][..chunk.len()].copy_from_slice(chunk);
                (old_start, old, gaps)
            } else {
                let (s, e) = (old_start.min(from), old_end.max(to));
                let mut merged = PlainBuf::zeroed((e - s) as usize);
                merged[(old_start - s) as usize..][..old.len()].copy_from_slice(&old);
                merged[(from - s) as usize..][..chunk.len()].copy_from_slice(chunk);
                // The zeros between the old range and the new bytes were never written.
                holes::add(&mut gaps, to, old_start);
                holes::add(&mut gaps, old_end, from);
                (s, merged, gaps)
            }
        }
        _ => (from, PlainBuf::copy_of(chunk), Holes::new()),
    };
    holes::remove(&mut gaps, from, to);
    (start, bytes, gaps)
}
