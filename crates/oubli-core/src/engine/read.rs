//! The read path: pointers resolved under the engine lock, units read and opened after it is released, in parallel for large reads.

use super::write::crypto_parts;
use super::*;
use rayon::prelude::*;

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
                let key = sh.scheme.resolve(&p.cref.key).map_err(|_| corrupt())?;
                let key = match &p.share {
                    Some(s) => crate::share::bind(&*sh.provider, s, &key),
                    None => key,
                };
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

    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    pub fn read(&self, oid: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        let (mut out, pending, _guard) = {
            let e = self.lock_beside_commit();
            let (out, pending) = e.plan_read(oid, offset, len)?;
            // Taken before the engine lock is released: no segment this read
            // needs can be deleted until it is done.
            let guard = self
                .shared
                .io_guard
                .read()
                .unwrap_or_else(|p| p.into_inner());
            (out, pending, guard)
        };
        let sealed_bytes = pending.iter().map(|p| p.cref.sealed_len() as usize).sum();
        let parts = crypto_parts(sealed_bytes);
        if parts == 1 {
            self.open_units(&mut out, 0, &pending)?;
        } else {
            // Each part opens a run of cells into its own part of the output.
            let per = pending.len().div_ceil(parts);
            let runs: Vec<&[PendingRead]> = pending.chunks(per).collect();
            let mut work = Vec::with_capacity(runs.len());
            let mut rest: &mut [u8] = &mut out;
            let mut base = 0i64;
            for (k, run) in runs.iter().enumerate() {
                let end = match runs.get(k + 1) {
                    Some(next) => next[0].out_at.clamp(base, base + rest.len() as i64),
                    None => base + rest.len() as i64,
                };
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut((end - base) as usize);
                work.push((mine, base, *run));
                rest = tail;
                base = end;
            }
            work.into_par_iter()
                .try_for_each(|(mine, base, run)| self.open_units(mine, base, run))?;
        }
        Ok(out)
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
        let cs = u64::from(e.cells_of(&e.tree, oid)?);
        // Data ranges (start -> length) per cell: stored ranges less their holes.
        let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
        let put = |ranges: &mut BTreeMap<u64, u64>, cell: u64, data: Vec<(u32, u32)>| {
            for (a, b) in data {
                ranges.insert(cell * cs + a as u64, (b - a) as u64);
            }
        };
        e.tree.scan(
            &cell_key(oid, offset / cs),
            &cell_key(oid, end.div_ceil(cs)),
            &e.ctx,
            &mut |k, v| {
                if let Value::Cell(c) = v {
                    put(&mut ranges, k.off, c.data_ranges());
                }
                true
            },
        )?;
        for (&(_, cell), d) in e.dirty.range((oid, offset / cs)..(oid, end.div_ceil(cs))) {
            // A buffered cell replaces whatever the tree holds for it.
            ranges.retain(|&s, _| s / cs != cell);
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
    /// Copies buffered bytes of a read into the output and lists the units
    /// still to open (outside the lock).
    pub(super) fn plan_read(
        &self,
        oid: u64,
        offset: u64,
        len: usize,
    ) -> Result<(Vec<u8>, Vec<PendingRead>)> {
        let record = self.record(oid)?;
        let end = offset.saturating_add(len as u64).min(record.size);
        if offset >= end {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let share = self.share_key_in(&self.tree, oid)?;
        let cell_size = self.cells_of(&self.tree, oid)?;
        let cs = u64::from(cell_size);
        let (first, past) = (offset / cs, end.div_ceil(cs));
        // One walk over the read's cells (not a lookup from the root per
        // cell: this runs under the engine lock). A buffered cell replaces
        // what the tree holds for it.
        let mut pending = Vec::new();
        self.tree.scan(
            &cell_key(oid, first),
            &cell_key(oid, past),
            &self.ctx,
            &mut |k, v| {
                if let Value::Cell(c) = v {
                    if !self.dirty.contains_key(&(oid, k.off)) {
                        pending.push(PendingRead {
                            oid,
                            cell: k.off,
                            cell_size,
                            out_at: (k.off * cs + c.start as u64) as i64 - offset as i64,
                            cref: c.clone(),
                            share: share.clone(),
                        });
                    }
                }
                true
            },
        )?;
        for (&(_, cell), d) in self.dirty.range((oid, first)..(oid, past)) {
            let data_at = cell * cs + d.start as u64;
            let lo = data_at.max(offset);
            let hi = (data_at + d.data.len() as u64).min(end);
            if lo < hi {
                let src = &d.data[(lo - data_at) as usize..][..(hi - lo) as usize];
                out[(lo - offset) as usize..][..(hi - lo) as usize].copy_from_slice(src);
            }
        }
        Ok((out, pending))
    }
}
