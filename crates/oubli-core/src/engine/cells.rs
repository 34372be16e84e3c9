//! One cell size per object: which cells an object's data is cut in, and when that is decided (DESIGN §3).
//!
//! An object's cells are the store's size (32 KiB by default: about 0.16 %
//! key metadata) unless it gets small ones ([`SMALL_CELL_SIZE`]: a 4 KiB
//! write in place re-seals 4 KiB, not 32). The choice is made once, before
//! the object holds any data, and kept for its life (a `KIND_CELLS` tree
//! entry, logged as op 14): by a front-end that knows the object will be
//! written in place ([`Store::use_small_cells`]: a block device's export, a
//! file preallocated empty whose first write is not a stream's start —
//! the mount decides that, [`Store::holds_data`] telling it the object is
//! still empty), or by the engine at the first write, which gives
//! small cells when that write is neither at the object's start nor at its
//! end (a sparse file written at random). Streamed files — every write an
//! append — keep the store's cells; one of their cells that is later
//! written at random is split into small ones (`split.rs`).

use super::*;

impl Store {
    /// Gives `oid` small cells ([`SMALL_CELL_SIZE`]) if it holds no data
    /// yet: for objects that will be written in place at random. Returns
    /// whether the object has small cells now (false: it already holds data
    /// in the store's cells, which stay).
    pub fn use_small_cells(&self, oid: u64) -> Result<bool> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        e.record(oid)?;
        let small = e.cells_of(&e.tree, oid)? == e.small_cells();
        if small || e.holds_data(oid)? {
            return Ok(small);
        }
        e.set_small_cells(oid)?;
        Ok(true)
    }

    /// Whether `oid` holds any data (buffered or sealed): a front-end that
    /// would choose the object's cells asks before its first write.
    pub fn holds_data(&self, oid: u64) -> Result<bool> {
        let e = self.lock_beside_commit();
        e.record(oid)?;
        e.holds_data(oid)
    }

    /// The cell size of `oid`'s data.
    pub fn cell_size_of(&self, oid: u64) -> Result<u32> {
        let e = self.lock_beside_commit();
        e.record(oid)?;
        e.cells_of(&e.tree, oid)
    }
}

impl Engine {
    /// Small cells, or the store's when those are no larger.
    pub(super) fn small_cells(&self) -> u32 {
        SMALL_CELL_SIZE.min(self.cell_size)
    }

    /// The cell size of `oid`'s data in `tree` (the live tree or a snapshot's).
    pub(super) fn cells_of(&self, tree: &Tree, oid: u64) -> Result<u32> {
        if self.cell_size <= SMALL_CELL_SIZE {
            // No object of such a store has other cells.
            return Ok(self.cell_size);
        }
        Ok(match tree.get(&Key::new(oid, KIND_CELLS, 0), &self.ctx)? {
            Some(Value::CellSize(size)) => size,
            _ => self.cell_size,
        })
    }

    /// The cell size a write at `offset` uses, deciding it when this is the
    /// object's first data (see the module comment).
    pub(super) fn cells_for_write(&mut self, oid: u64, offset: u64) -> Result<u32> {
        let cells = self.cells_of(&self.tree, oid)?;
        if cells == self.small_cells() || offset == 0 {
            return Ok(cells);
        }
        // An append (at the end) streams: the store's cells.
        if offset == self.record(oid)?.size || self.holds_data(oid)? {
            return Ok(cells);
        }
        self.set_small_cells(oid)?;
        Ok(self.small_cells())
    }

    fn set_small_cells(&mut self, oid: u64) -> Result<()> {
        // Also reached from a write's sealing before the write's own checks.
        self.mutable()?;
        let cell_size = self.small_cells();
        self.apply(Op::SetCellSize { oid, cell_size }, true)
    }

    /// Whether `oid` has any cell, buffered or in the tree.
    pub(super) fn holds_data(&self, oid: u64) -> Result<bool> {
        if self
            .dirty
            .range((oid, 0)..=(oid, u64::MAX))
            .next()
            .is_some()
        {
            return Ok(true);
        }
        self.any_key_in(cell_key(oid, 0), Key::new(oid, KIND_CELL + 1, 0))
    }
}
