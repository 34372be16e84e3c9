//! Overwrites in place: a unit that nothing but the live tree in memory names yet is written over by its replacement, instead of the replacement being appended.
//!
//! A log-structured store appends every overwrite, so a file rewritten at
//! random puts every version on the disk and leaves the cleaner to copy the
//! live ones out (DESIGN §7, "Overwrites in place"). Between two namings —
//! an intent-log frame, a tree persisted for a commit or a snapshot — the
//! units appended to the data segments are named by nothing on the
//! medium. Replacing one of them by a unit of the same length (a cell
//! rewritten whole, the common case) reuses its place: the page cache takes
//! the overwrite and the disk sees one version. Erasure is unchanged: the
//! old unit's key goes at the next commit as if the unit had moved, and a
//! copy the disk kept is ciphertext under that key.
//!
//! Readers outside the engine lock may hold the old pointer while its bytes
//! change under them: [`Shared::rewrites`] counts rewrites, and a read whose
//! unit does not open retries when the count moved since it planned.

use super::*;

impl Engine {
    /// Everything appended so far is named (a frame or a persisted tree now
    /// refers to it, or may): from here on, only later units are rewritten.
    pub(super) fn name_units(&mut self) {
        self.unnamed_from = self.unnamed_from.max(self.data_end());
        self.unnamed_segments.clear();
        self.unnamed_segments
            .extend(self.data_segment.map(|(seg, _)| seg));
        self.copied.clear();
        self.pending_puts.clear();
    }

    /// Where the next unit appended to the data segments would begin, or
    /// a place before it (the next segment's start).
    pub(super) fn data_end(&self) -> u64 {
        match self.data_segment {
            Some((seg, off)) => addr(seg, off as u32),
            None => addr(self.next_segment, 0),
        }
    }

    /// The cleaner (or a consolidation) appended copies of units between
    /// `from` and `to`, starting the data segments `started` for them:
    /// those copies are never rewritten in place (a snapshot may name
    /// them too), but they name nothing else, so the units appended
    /// before them stay rewritable. (A slice used to name everything,
    /// which left a store being cleaned, a device's writeback say, with
    /// no overwrite in place at all.)
    pub(super) fn copied_between(
        &mut self,
        from: u64,
        to: u64,
        started: std::ops::Range<SegmentId>,
    ) {
        self.unnamed_segments.extend(started);
        if to <= from {
            return;
        }
        // Slices with no foreground append between them make one range.
        if let Some(mut last) = self.copied.last_entry() {
            if *last.get() == from {
                *last.get_mut() = to;
                return;
            }
        }
        self.copied.insert(from, to);
    }

    /// Queues `op` for the next frame. The `PutCell` of a unit rewritten in
    /// place takes the place of the one that put the unit it replaced: that
    /// one is in `pending` (nothing named the unit), and no op after it
    /// touches the cell (the tree still pointed at its unit). So the log
    /// replays to the same tree, and a cell rewritten over and over between
    /// two flushes costs the queue one op, not one per write — the queue's
    /// cap (a flush at `PENDING_OPS_MAX`) then counts cells, not writes.
    pub(super) fn queue_for_log(&mut self, op: Op) {
        if let Op::PutCell { oid, cell, cref } = &op {
            if let Some(&i) = self.pending_puts.get(&cref.addr) {
                let same_cell = matches!(
                    self.pending.get(i),
                    Some(Op::PutCell { oid: o, cell: c, cref: r })
                        if o == oid && c == cell && r.addr == cref.addr
                );
                if same_cell {
                    self.pending[i] = op;
                    return;
                }
            }
            if self.may_rewrite(cref.addr) {
                self.pending_puts.insert(cref.addr, self.pending.len());
            }
        }
        self.pending.push(op);
    }

    /// `pending` was cleared or its front taken: the indices moved.
    pub(super) fn pending_moved(&mut self) {
        self.pending_puts.clear();
    }

    /// A data segment was started by a change: what it takes is named by
    /// nothing until the next naming.
    pub(super) fn data_segment_started(&mut self, seg: SegmentId) {
        self.unnamed_segments.push(seg);
    }

    /// Whether the unit at `at` may yet be rewritten: in a data segment,
    /// appended since the last naming. (The address alone would not do: an
    /// intent-log segment made after the naming holds cells its frames
    /// name.) A pointer to a unit that may not stays valid for as long as
    /// the unit is in the tree.
    pub(super) fn may_rewrite(&self, at: u64) -> bool {
        self.can_rewrite
            && at >= self.unnamed_from
            && self.unnamed_segments.contains(&addr_segment(at))
            && self
                .copied
                .range(..=at)
                .next_back()
                .is_none_or(|(_, &end)| at >= end)
    }

    /// Where the new unit of `cell` (`len` sealed bytes) goes if it can
    /// take its predecessor's place: that unit's address.
    pub(super) fn place_of_replaced(&self, oid: u64, cell: u64, len: usize) -> Result<Option<u64>> {
        // Cheap refusals first: a flush sealing cells into its frame, or a
        // segment with nothing appended since the last naming.
        if !self.can_rewrite || self.frame_cells.is_some() {
            return Ok(None);
        }
        match self.data_segment {
            Some((seg, off)) if addr(seg, off as u32) > self.unnamed_from => {}
            _ => return Ok(None),
        }
        Ok(match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
            Some(Value::Cell(c)) if c.sealed_len() == len as u64 && self.may_rewrite(c.addr) => {
                Some(c.addr)
            }
            _ => None,
        })
    }

    /// Writes `sealed` (`units` units, one after another) over the units
    /// at `at` and after it (see the module docs). False if the medium
    /// refuses: the caller appends them instead (the old units, torn or
    /// not, leave the tree either way and nothing durable names them).
    pub(super) fn rewrite_in_place(&mut self, at: u64, sealed: &[u8], units: usize) -> bool {
        // Before the bytes change: a reader that sees them changed sees
        // the count moved too.
        self.rewrites.fetch_add(1, Ordering::SeqCst);
        let (seg, off) = (addr_segment(at), addr_offset(at) as u64);
        if self.ctx.medium.rewrite(seg, off, sealed).is_err() {
            return false;
        }
        self.units_rewritten += units as u64;
        self.mark_unsynced();
        true
    }
}

impl Store {
    /// How many units have been rewritten in place so far: a read that
    /// planned at this count and whose unit did not open may retry if it
    /// moved.
    pub(super) fn rewrite_count(&self) -> u64 {
        self.shared.rewrites.load(Ordering::SeqCst)
    }
}
