//! Consolidation of a key scheme with keys outside the tree (Lethe): the live tree re-keyed under fresh keys (DESIGN §16).

use super::clean::Appender;
use super::*;

/// What a consolidation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsolidateReport {
    /// Cells re-sealed under fresh keys.
    pub cells_rekeyed: u64,
    /// Cells left under their old keys (their share's key is unavailable).
    pub cells_skipped: u64,
    /// Bytes of plaintext re-sealed.
    pub bytes_resealed: u64,
    /// Forest roots before and after (`None`: not a forest).
    pub roots_before: Option<u64>,
    pub roots_after: Option<u64>,
}

impl Store {
    /// Re-seals every cell and node of the live tree under fresh keys and
    /// commits, so that the key scheme holds the live data under as few
    /// roots as its allocation order allows (a keyed hash forest fragmented
    /// by deletions goes back to about one root per 4096 live units).
    /// Costs a read and a re-seal of all live data; snapshots keep the keys
    /// (and roots) of the units they share. Nothing to do (an empty report)
    /// under the parent-pointer scheme.
    pub fn consolidate_keys(&self) -> Result<ConsolidateReport> {
        self.lock().consolidate_keys()
    }
}

impl Engine {
    fn consolidate_keys(&mut self) -> Result<ConsolidateReport> {
        self.writable()?;
        let scheme = self.ctx.scheme.clone();
        if !scheme.keeps_keys_outside_tree() {
            return Ok(ConsolidateReport::default());
        }
        // A copy of all live data: new data as far as the medium's room
        // goes, so refused (`NoSpace`, nothing changed) where it would eat
        // into the reserve that deletes, commits and the cleaner need.
        self.admit(self.live_bytes)?;
        // Everything buffered into the tree, and a tree the medium holds.
        self.commit()?;
        // Measured again (the commit marked the measure stale): the
        // headroom above may be a second old, and the commit took room.
        self.admit(self.live_bytes)?;
        let mut report = ConsolidateReport {
            roots_before: scheme.stats().roots,
            ..ConsolidateReport::default()
        };
        // The share key of each object placed under one, looked up before
        // the tree is borrowed; `None`: the share's key cannot be had (its
        // cells stay as they are).
        let mut shares: HashMap<u64, Option<SecretKey>> = HashMap::new();
        if !self.shares.is_empty() {
            let mut placed = Vec::new();
            let (from, to) = (Key::new(0, 0, 0), Key::new(u64::MAX, 0, 0));
            self.tree.scan(&from, &to, &self.ctx, &mut |k, v| {
                if let Value::Share(_) = v {
                    placed.push(k.oid);
                }
                true
            })?;
            for oid in placed {
                shares.insert(oid, self.share_key_in(&self.tree, oid).ok().flatten());
            }
        }
        let mut out = Appender::of(self);
        let mut tree = std::mem::take(&mut self.tree);
        let mut freed = Vec::new();
        let ctx = &self.ctx;
        // Every node is rewritten at once (no budget): a pass cut short
        // could not tell, after a commit, the nodes it already rewrote.
        let mut unlimited = usize::MAX;
        let result = tree.rewrite(
            ctx,
            &mut freed,
            &mut unlimited,
            None,
            &|_| true,
            &mut |k, v| {
                let Value::Cell(c) = v else {
                    return Ok(Visit::Unchanged);
                };
                let share = match shares.get(&k.oid) {
                    None => None,
                    Some(Some(s)) => Some(s.clone()),
                    Some(None) => {
                        report.cells_skipped += 1;
                        return Ok(Visit::Unchanged);
                    }
                };
                let plain = open_cell_unit(
                    &*ctx.medium,
                    &*ctx.provider,
                    &*ctx.scheme,
                    // The object's cell size comes after its cells in the
                    // tree: messages name the cell by index.
                    0,
                    k.oid,
                    k.off,
                    c,
                    share.as_ref(),
                )?;
                let (key, key_ref) = ctx.scheme.allocate(&*ctx.provider);
                let key = match &share {
                    Some(s) => crate::share::bind(&*ctx.provider, s, &key),
                    None => key,
                };
                let mut sealed = Vec::with_capacity(plain.len() + TAG_LEN);
                sealed.extend_from_slice(&plain);
                ctx.provider
                    .seal(&key, &cell_aad(k.oid, k.off, c.start, c.len), &mut sealed);
                c.addr = out.append(&*ctx.medium, &sealed, "re-sealing a live cell")?;
                c.key = key_ref;
                report.cells_rekeyed += 1;
                report.bytes_resealed += plain.len() as u64;
                Ok(Visit::Changed)
            },
        );
        self.tree = tree;
        out.give_back(self);
        // The old nodes are dead (the new ones are counted as the commit
        // writes them); the old cells are replaced one for one.
        self.release_nodes(freed);
        self.snapshot_generation += 1;
        if let Err(e) = result {
            // Out of room (DESIGN §7, "A full medium"): each cell re-sealed
            // so far names a copy that landed, the others their old units,
            // so the tree is whole; the next commit writes the nodes the
            // pass changed, and a later pass re-seals what is left.
            if !matches!(e, Error::NoSpace(_)) {
                self.poisoned = Some(format!("consolidation: {e}"));
            }
            return Err(e);
        }
        self.commit()?;
        report.roots_after = scheme.stats().roots;
        Ok(report)
    }
}
