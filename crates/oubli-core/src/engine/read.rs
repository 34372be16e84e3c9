//! The read path: pointers resolved under the engine lock, units read and opened on the calling thread after it is released.

use super::*;
use crate::unit::cell_span;

/// A unit a read must open after the engine lock is released.
pub(super) struct PendingRead {
    oid: u64,
    cell: u64,
    /// The object's cell size (for messages).
    cell_size: u32,
    cref: CellRef,
    /// Where in the output the first byte of the cell unit would go (may be negative).
    out_at: i64,
    /// The key of the share the object is under, if any.
    share: Option<SecretKey>,
}

/// How a read is carried out once the engine lock is released.
pub(super) enum ReadPlan {
    /// The read is exactly a run of whole cells, back to back in one
    /// segment: one medium read into the buffer that becomes the output.
    Run(Vec<PendingRead>),
    /// Anything else: the output with the bytes of buffered cells copied in
    /// (zeros elsewhere), and the units to open into it.
    Pieces(Vec<u8>, Vec<PendingRead>),
}

/// Names a cell unit in an error message.
pub(super) fn cell_what(p: &PendingRead) -> String {
    describe_cell(p.oid, p.cell, &p.cref, p.cell_size)
}

impl Store {
    /// Opens `units` (ascending cells of one read) into `out`, whose first
    /// byte is byte `base` of the whole read. Units contiguous on the medium
    /// are read with one call and opened in place.
    pub(super) fn open_units(
        &self,
        out: &mut [u8],
        base: i64,
        units: &[PendingRead],
    ) -> Result<()> {
        const MAX_RUN: u64 = 8 << 20;
        let sh = &self.shared;
        let mut i = 0;
        while i < units.len() {
            let start = units[i].cref.addr;
            let mut end = start + units[i].cref.sealed_len();
            let mut j = i + 1;
            while j < units.len()
                && units[j].cref.addr == end
                && addr_segment(end) == addr_segment(start)
                && end - start < MAX_RUN
            {
                end += units[j].cref.sealed_len();
                j += 1;
            }
            // Ciphertext only: units that lie wholly inside the output are
            // decrypted there, so no plaintext is left in this buffer.
            let mut buf = vec![0u8; (end - start) as usize];
            sh.medium
                .read(addr_segment(start), addr_offset(start) as u64, &mut buf)
                .map_err(|e| read_error(&cell_what(&units[i]), e))?;
            let mut at = 0;
            for p in &units[i..j] {
                let sealed = &mut buf[at..at + p.cref.sealed_len() as usize];
                at += sealed.len();
                let corrupt = || Error::Corrupt(cell_what(p));
                let key = self.unit_key(p)?;
                let aad = cell_aad(p.oid, p.cell, p.cref.start, p.cref.len);
                let dst = p.out_at - base;
                let len = p.cref.len as usize;
                if dst >= 0 && dst as usize + len <= out.len() {
                    let (ct, tag) = sealed.split_at(len);
                    let target = &mut out[dst as usize..dst as usize + len];
                    target.copy_from_slice(ct);
                    let tag: &[u8; TAG_LEN] = tag.try_into().expect("tag length");
                    sh.provider
                        .open_detached(&key, &aad, target, tag)
                        .map_err(|_| corrupt())?;
                    continue;
                }
                // A unit cut by the ends of the read: opened where it lies
                // in the read buffer, copied out, and wiped there.
                let opened = sh.provider.open_in_place(&key, &aad, sealed);
                let Ok(len) = opened else {
                    wipe(sealed);
                    return Err(corrupt());
                };
                let lo = dst.max(0);
                let hi = (dst + len as i64).min(out.len() as i64);
                if lo < hi {
                    let src = (lo - dst) as usize;
                    out[lo as usize..hi as usize]
                        .copy_from_slice(&sealed[src..src + (hi - lo) as usize]);
                }
                wipe(sealed);
            }
            i = j;
        }
        Ok(())
    }

    /// The key `p` was sealed under (bound to its object's share, if any).
    fn unit_key(&self, p: &PendingRead) -> Result<SecretKey> {
        let sh = &self.shared;
        let key = sh
            .scheme
            .resolve(&p.cref.key)
            .map_err(|_| Error::Corrupt(cell_what(p)))?;
        Ok(match &p.share {
            Some(s) => crate::share::bind(&*sh.provider, s, &key),
            None => key,
        })
    }

    /// Opens a [`ReadPlan::Run`] in the buffer it is read into, `buf`
    /// (grown if short, never shrunk): each unit's plaintext written where it
    /// belongs in the output while it is decrypted, over the tags before it.
    /// The read costs the copy from the medium and the AES; a reused `buf`
    /// spares the zeroing of a fresh one too. Returns the output's length.
    fn open_run(&self, units: &[PendingRead], buf: &mut Vec<u8>) -> Result<usize> {
        let sh = &self.shared;
        let cs = units[0].cref.len as usize;
        let unit = cs + TAG_LEN;
        let start = units[0].cref.addr;
        let sealed = units.len() * unit;
        if buf.len() < sealed {
            buf.resize(sealed, 0);
        }
        let buf = &mut buf[..sealed];
        sh.medium
            .read(addr_segment(start), addr_offset(start) as u64, buf)
            .map_err(|e| read_error(&cell_what(&units[0]), e))?;
        for (k, p) in units.iter().enumerate() {
            let aad = cell_aad(p.oid, p.cell, p.cref.start, p.cref.len);
            // Unit k lies at k * unit; its plaintext goes to k * cs.
            let opened = self.unit_key(p).and_then(|key| {
                sh.provider
                    .open_within(&key, &aad, &mut buf[k * cs..(k + 1) * unit], k * TAG_LEN)
                    .map_err(|_| Error::Corrupt(cell_what(p)))
            });
            if let Err(e) = opened {
                wipe(buf);
                return Err(e);
            }
        }
        // Past the output: the last units' tags and what their plaintext
        // left behind when it moved down.
        let len = units.len() * cs;
        wipe(&mut buf[len..]);
        Ok(len)
    }

    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    pub fn read(&self, oid: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let n = self.read_into(oid, offset, len, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// [`read`](Self::read) into a buffer the caller keeps from one read to
    /// the next: the bytes read are `buf[..n]` for the `n` returned (short at
    /// the end of the object). `buf` is grown when it is too small and never
    /// shrunk; what lies past `n` is unspecified. A server that answers many
    /// large reads spares the allocation and zeroing of a fresh output each
    /// time (a 1 MiB `vec![0; n]` is a `memset` once the allocator serves it
    /// from its heap).
    pub fn read_into(&self, oid: u64, offset: u64, len: usize, buf: &mut Vec<u8>) -> Result<usize> {
        // A unit rewritten in place between the plan and the medium read
        // does not open (`rewrite.rs`): the read is planned again. The last
        // try keeps the engine lock through its I/O, so that nothing is
        // rewritten under it and a read always ends.
        const TRIES_WITHOUT_LOCK: usize = 3;
        for _ in 0..TRIES_WITHOUT_LOCK {
            let (plan, seen, _guard) = {
                let e = self.lock_beside_commit();
                let plan = e.plan_read(oid, offset, len)?;
                (plan, self.rewrite_count(), self.reading_guard())
            };
            match self.carry_out(plan, buf) {
                Err(_) if self.rewrite_count() != seen => continue,
                done => return done,
            }
        }
        let e = self.lock_beside_commit();
        let plan = e.plan_read(oid, offset, len)?;
        let _guard = self.reading_guard();
        let done = self.carry_out(plan, buf);
        drop(e);
        done
    }

    /// Held from before the engine lock is released until a read's I/O is
    /// done: no segment the read needs can be deleted meanwhile.
    fn reading_guard(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.shared
            .io_guard
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Reads and opens what [`Engine::plan_read`] planned, on the calling
    /// thread, like a write's sealing (DESIGN §10).
    fn carry_out(&self, plan: ReadPlan, buf: &mut Vec<u8>) -> Result<usize> {
        match plan {
            ReadPlan::Run(units) => self.open_run(&units, buf),
            ReadPlan::Pieces(out, pending) => {
                // The planned output (holes as zeros, buffered cells copied
                // in) becomes the buffer.
                *buf = out;
                self.open_units(buf, 0, &pending)?;
                Ok(buf.len())
            }
        }
    }

    /// The allocated ranges of `[offset, offset+len)` as `(start, length)`,
    /// ascending and merged; everything else reads as zeros (a hole).
    pub fn extents(&self, oid: u64, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let e = self.lock_beside_commit();
        let size = e.record(oid)?.size;
        let end = offset.saturating_add(len).min(size);
        let mut out: Vec<(u64, u64)> = Vec::new();
        if offset >= end {
            return Ok(out);
        }
        let cell_size = e.cells_of(&e.tree, oid)?;
        // Data ranges (start -> length) per cell: stored ranges less their holes.
        let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
        let put = |ranges: &mut BTreeMap<u64, u64>, cell: u64, data: Vec<(u32, u32)>| {
            let at = cell_span(cell, cell_size).0;
            for (a, b) in data {
                ranges.insert(at + a as u64, (b - a) as u64);
            }
        };
        // The object's own cells, then the small cells of split ones (`split.rs`).
        let ids = split::cell_ids_over(offset, end, cell_size);
        for range in &ids {
            e.tree.scan(
                &cell_key(oid, range.start),
                &cell_key(oid, range.end),
                &e.ctx,
                &mut |k, v| {
                    if let Value::Cell(c) = v {
                        put(&mut ranges, k.off, c.data_ranges());
                    }
                    true
                },
            )?;
        }
        let buffered = ids
            .iter()
            .flat_map(|r| e.dirty.range((oid, r.start)..(oid, r.end)));
        for (&(_, cell), d) in buffered {
            // A buffered cell replaces whatever the tree holds for it.
            let (at, size) = cell_span(cell, cell_size);
            ranges.retain(|&s, _| !(at..at + u64::from(size)).contains(&s));
            let end = d.start + d.data.len() as u32;
            put(
                &mut ranges,
                cell,
                crate::holes::data_ranges(d.start, end, &d.holes),
            );
        }
        for (s, l) in ranges {
            let (s, t) = (s.max(offset), (s + l).min(end));
            if s >= t {
                continue;
            }
            match out.last_mut() {
                Some((ps, pl)) if *ps + *pl == s => *pl += t - s,
                _ => out.push((s, t - s)),
            }
        }
        Ok(out)
    }
}

impl Engine {
    /// Lists the units a read must open outside the lock, and copies the
    /// bytes of buffered cells into its output unless it is a whole run.
    pub(super) fn plan_read(&self, oid: u64, offset: u64, len: usize) -> Result<ReadPlan> {
        let record = self.record(oid)?;
        let end = offset.saturating_add(len as u64).min(record.size);
        if offset >= end {
            return Ok(ReadPlan::Pieces(Vec::new(), Vec::new()));
        }
        let share = self.share_key_in(&self.tree, oid)?;
        let cell_size = self.cells_of(&self.tree, oid)?;
        let cs = u64::from(cell_size);
        let (first, past) = (offset / cs, end.div_ceil(cs));
        // One walk over the read's cells (not a lookup from the root per
        // cell: this runs under the engine lock). A buffered cell replaces
        // what the tree holds for it.
        // Sized for every cell at once (a 1 MiB read of 4 KiB cells grew it
        // eight times, each a copy).
        let mut pending = Vec::with_capacity((past - first).min(1 << 13) as usize);
        // The object's own cells, then the small cells of split ones (`split.rs`).
        let ids = split::cell_ids_over(offset, end, cell_size);
        for range in &ids {
            self.tree.scan(
                &cell_key(oid, range.start),
                &cell_key(oid, range.end),
                &self.ctx,
                &mut |k, v| {
                    if let Value::Cell(c) = v {
                        if !self.dirty.contains_key(&(oid, k.off)) {
                            let at = cell_span(k.off, cell_size).0;
                            pending.push(PendingRead {
                                oid,
                                cell: k.off,
                                cell_size,
                                out_at: (at + c.start as u64) as i64 - offset as i64,
                                cref: c.clone(),
                                share: share.clone(),
                            });
                        }
                    }
                    true
                },
            )?;
        }
        let buffered: Vec<_> = ids
            .iter()
            .flat_map(|r| self.dirty.range((oid, r.start)..(oid, r.end)))
            .collect();
        if buffered.is_empty() && is_whole_run(&pending, offset, end, cs) {
            return Ok(ReadPlan::Run(pending));
        }
        let mut out = vec![0u8; (end - offset) as usize];
        for (&(_, cell), d) in buffered {
            let data_at = cell_span(cell, cell_size).0 + d.start as u64;
            let lo = data_at.max(offset);
            let hi = (data_at + d.data.len() as u64).min(end);
            if lo < hi {
                let src = &d.data[(lo - data_at) as usize..][..(hi - lo) as usize];
                out[(lo - offset) as usize..][..(hi - lo) as usize].copy_from_slice(src);
            }
        }
        Ok(ReadPlan::Pieces(out, pending))
    }
}

/// Whether `pending` is exactly the cells of `[offset, end)`, each whole (no
/// holes), back to back in one segment: what [`Store::open_run`] reads.
fn is_whole_run(pending: &[PendingRead], offset: u64, end: u64, cs: u64) -> bool {
    let Some(head) = pending.first() else {
        return false;
    };
    let unit = cs + TAG_LEN as u64;
    let last = head.cref.addr + (pending.len() as u64 - 1) * unit;
    offset.is_multiple_of(cs)
        && end.is_multiple_of(cs)
        && pending.len() as u64 == (end - offset) / cs
        && addr_segment(last) == addr_segment(head.cref.addr)
        && pending.iter().enumerate().all(|(k, p)| {
            p.cell == offset / cs + k as u64
                && p.cref.start == 0
                && u64::from(p.cref.len) == cs
                && p.cref.holes.is_empty()
                && p.cref.addr == head.cref.addr + k as u64 * unit
        })
}
