//! Split cells: a large cell that a write lands in at random becomes small cells, so later writes there re-seal 4 KiB, not the whole cell (DESIGN §3).
//!
//! An object keeps the cell size it got at its first write ([`cells`]); a
//! file written as a stream and then updated in place (a restored VM image
//! or database, a torrent) would re-seal a whole large cell for each 4 KiB
//! write. So a write that is not the continuation of the object's last one
//! and replaces part of a sealed large cell *splits* it: the cell's content,
//! with the write merged in, is sealed as small cells (ids from
//! [`SPLIT_CELLS`]) in one append, and the large cell leaves the tree — all
//! in one engine call, hence one log batch, so a crash sees the cell whole
//! or split, never both. Later writes there go to the small cells. A write
//! that covers a whole large cell again (a stream rewriting the file) puts
//! it back whole and drops its small cells in the same call.
//!
//! Erasure is unchanged: the old large unit is freed by the split like any
//! overwritten unit, and each small cell is a unit of its own under its
//! own key, erased when it is overwritten, cut or dropped.

use super::*;
use crate::holes::{self, Holes};
use crate::unit::SPLIT_CELLS;
use std::ops::Range;
use write::Prefetched;

/// Objects whose last write's end is remembered (to tell a stream from
/// writes at random); past this many the memory is cleared.
const WRITE_ENDS_MAX: usize = 4096;

/// The ids of the small cells that large cell `cell` of a `cell_size`
/// object splits into.
pub(super) fn split_ids(cell: u64, cell_size: u32) -> Range<u64> {
    let per = u64::from(cell_size / SMALL_CELL_SIZE);
    SPLIT_CELLS + cell * per..SPLIT_CELLS + (cell + 1) * per
}

/// The ids of the small cells covering any byte of `[from, to)`.
pub(super) fn split_ids_over(from: u64, to: u64) -> Range<u64> {
    let small = u64::from(SMALL_CELL_SIZE);
    SPLIT_CELLS + from / small..SPLIT_CELLS + to.div_ceil(small)
}

/// The ranges of cell ids that may hold bytes `[offset, end)` of an object
/// whose cells are `cell_size`: its own cells, then, if those are larger
/// than small ones, the small cells of split ones.
pub(super) fn cell_ids_over(offset: u64, end: u64, cell_size: u32) -> Vec<Range<u64>> {
    let cs = u64::from(cell_size);
    let mut ids = Vec::with_capacity(2);
    ids.push(offset / cs..end.div_ceil(cs));
    if cell_size > SMALL_CELL_SIZE {
        ids.push(split_ids_over(offset, end));
    }
    ids
}

impl Engine {
    /// Whether large cell `cell` of `oid` (cell size `cs`) is split: some
    /// of its small cells are buffered or in the tree. A buffered cell is
    /// never split (a split takes only a sealed one, and puts it back whole
    /// only through the tree): a stream's writes into its cell in memory
    /// skip the lookup.
    pub(super) fn is_split(&self, oid: u64, cell: u64, cs: u32) -> Result<bool> {
        if self.dirty.contains_key(&(oid, cell)) {
            return Ok(false);
        }
        self.any_split(oid, cell..cell + 1, cs)
    }

    /// Whether any of the large cells `cells` of `oid` (cell size `cs`) is
    /// split: one lookup for a run of them.
    pub(super) fn any_split(&self, oid: u64, cells: Range<u64>, cs: u32) -> Result<bool> {
        if cs <= SMALL_CELL_SIZE || cells.is_empty() {
            return Ok(false);
        }
        let ids = split_ids(cells.start, cs).start..split_ids(cells.end - 1, cs).end;
        if self
            .dirty
            .range((oid, ids.start)..(oid, ids.end))
            .next()
            .is_some()
        {
            return Ok(true);
        }
        self.any_key_in(cell_key(oid, ids.start), cell_key(oid, ids.end))
    }

    /// Whether a write at `offset` continues `oid`'s last write (a stream,
    /// which keeps large cells whole); remembers where this one ends.
    pub(super) fn continues_last_write(&mut self, oid: u64, offset: u64, end: u64) -> bool {
        let continues = self.write_ends.get(&oid) == Some(&offset);
        if self.write_ends.len() >= WRITE_ENDS_MAX && !self.write_ends.contains_key(&oid) {
            self.write_ends.clear();
        }
        self.write_ends.insert(oid, end);
        continues
    }

    /// Writes `chunk` at byte `from` of large cell `cell` (of `cs` bytes):
    /// into its small cells if it is split, splitting it first if this
    /// write lands at random in its sealed content, else into the cell.
    /// Returns whether sealed bytes were replaced.
    #[allow(clippy::too_many_arguments)] // the cell's identity, the write, and what was read for it
    pub(super) fn write_in_cell(
        &mut self,
        oid: u64,
        cell: u64,
        cs: u32,
        from: u32,
        chunk: &[u8],
        at_random: bool,
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<bool> {
        if !self.is_split(oid, cell, cs)? {
            if let Some(c) = self.splits(oid, cell, cs, from, chunk.len() as u32, at_random)? {
                match self.split_cell(oid, cell, cs, c, from, chunk, prefetched) {
                    // No room for the small cells (nothing appended, the
                    // cell whole): the write is buffered in the cell as
                    // it would be without splits — a write that another
                    // cell of it already changed must not fail half done.
                    Err(Error::NoSpace(_)) => {}
                    done => return done,
                }
            }
            return self.merge_into_cell(oid, cell, cs, from, chunk, prefetched);
        }
        let small = SMALL_CELL_SIZE;
        let first = split_ids(cell, cs).start;
        let mut replaced = false;
        let mut at = from;
        let to = from + chunk.len() as u32;
        while at < to {
            let (sub, sub_from) = (at / small, at % small);
            let n = (small - sub_from).min(to - at);
            let piece = &chunk[(at - from) as usize..][..n as usize];
            let id = first + u64::from(sub);
            replaced |= self.merge_into_cell(oid, id, small, sub_from, piece, prefetched)?;
            at += n;
        }
        Ok(replaced)
    }

    /// The sealed unit of large cell `cell` if a write of `len` bytes at
    /// `from` splits it: at random, into cells larger than small ones,
    /// over part (not all) of the unit's bytes, with the cell not buffered
    /// (a buffered cell takes the write in memory), and the unit holding
    /// more than a small cell's bytes (re-sealing a smaller one, say a
    /// small file's, costs no more than a small cell would).
    fn splits(
        &self,
        oid: u64,
        cell: u64,
        cs: u32,
        from: u32,
        len: u32,
        at_random: bool,
    ) -> Result<Option<CellRef>> {
        let to = from + len;
        if !at_random
            || cs <= SMALL_CELL_SIZE
            || (from == 0 && to == cs)
            || self.dirty.contains_key(&(oid, cell))
        {
            return Ok(None);
        }
        Ok(match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
            Some(Value::Cell(c))
                if c.len > SMALL_CELL_SIZE && from < c.start + c.len && c.start < to =>
            {
                Some(c)
            }
            _ => None,
        })
    }

    /// Splits large cell `cell` (unit `c`) with `chunk` written at `from`:
    /// its content is sealed as small cells in one append, which take its
    /// place in the tree.
    #[allow(clippy::too_many_arguments)] // the cell's identity, its unit, and the write
    fn split_cell(
        &mut self,
        oid: u64,
        cell: u64,
        cs: u32,
        c: CellRef,
        from: u32,
        chunk: &[u8],
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<bool> {
        let now = self.rewrites.load(Ordering::SeqCst);
        let old = match prefetched.iter().position(|p| p.is_of(cell, &c, now)) {
            Some(i) => prefetched.swap_remove(i).plain,
            None => self.read_cell(oid, cell, &c)?,
        };
        let (start, bytes, gaps) = write::merged(Some((c.start, old, c.holes)), from, chunk);
        let end = start + bytes.len() as u32;
        let share = self.share_key_in(&self.tree, oid)?;
        let small = SMALL_CELL_SIZE;
        // Sealed back to back, appended in one piece.
        let mut sealed = Vec::with_capacity(bytes.len() + (cs / small) as usize * TAG_LEN);
        let mut units: Vec<(u64, CellRef)> = Vec::new();
        for (k, id) in split_ids(cell, cs).enumerate() {
            let base = k as u32 * small;
            let mut sub_holes: Holes = gaps.clone();
            let (s, e) = holes::trim(start.max(base), end.min(base + small), &mut sub_holes);
            if s >= e {
                continue;
            }
            let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
            let key = self.bind_share(share.as_ref(), key);
            let (s, e) = (s - base, e - base);
            let at = sealed.len();
            sealed.extend_from_slice(
                &bytes[(base + s - start) as usize..(base + e - start) as usize],
            );
            let tag = self.ctx.provider.seal_detached(
                &key,
                &cell_aad(oid, id, s, e - s),
                &mut sealed[at..],
            );
            sealed.extend_from_slice(&tag);
            let holes = sub_holes
                .iter()
                .map(|&(a, b)| (a - base, b - base))
                .collect();
            let cref = CellRef {
                start: s,
                len: e - s,
                addr: at as u64,
                key: key_ref,
                holes,
            };
            units.push((id, cref));
        }
        let appended = match units.is_empty() {
            true => Ok(0),
            false => self.append_unit(&sealed),
        };
        drop(bytes);
        let base = match appended {
            Ok(base) => base,
            Err(e) => {
                // Nothing appended: the keys are let go of, the cell stays whole.
                units
                    .iter()
                    .for_each(|(_, c)| self.ctx.scheme.placed(&c.key));
                return Err(e);
            }
        };
        for (id, mut cref) in units {
            cref.addr += base;
            self.apply(
                Op::PutCell {
                    oid,
                    cell: id,
                    cref,
                },
                true,
            )?;
        }
        self.as_overwrite(|e| e.apply(Op::DropCell { oid, cell }, true))?;
        self.cells_split += 1;
        Ok(true)
    }

    /// Puts large cell `cell` (of `cs` bytes) back whole: drops its small
    /// cells, buffered or in the tree, whose content a write replaces whole.
    pub(super) fn rejoin(&mut self, oid: u64, cell: u64, cs: u32) -> Result<()> {
        if !self.is_split(oid, cell, cs)? {
            return Ok(());
        }
        self.as_overwrite(|e| e.drop_cell_ids(oid, split_ids(cell, cs)))?;
        self.cells_rejoined += 1;
        Ok(())
    }

    /// Runs `op`, which drops cells a write replaces: the write counts as
    /// an overwrite, not a deletion (the epoch policy's deletion trigger
    /// counts removals).
    pub(super) fn as_overwrite(&mut self, op: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        let deletions = self.stats.deletions;
        let done = op(self);
        self.stats.deletions = deletions;
        done
    }

    /// Drops cells `ids` of `oid` (one kind: large or small), buffered or in the tree.
    pub(super) fn drop_cell_ids(&mut self, oid: u64, ids: Range<u64>) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let buffered: Vec<u64> = self
            .dirty
            .range((oid, ids.start)..(oid, ids.end))
            .map(|(&(_, c), _)| c)
            .collect();
        for c in buffered {
            self.take_dirty(oid, c);
        }
        self.apply(
            Op::DropCells {
                oid,
                from: ids.start,
                to: ids.end,
            },
            true,
        )
    }
}
