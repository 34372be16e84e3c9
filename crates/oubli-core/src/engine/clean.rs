//! The cleaner: reclaims segments whose units are dead, copying live units as they are (DESIGN §7).

use super::*;

/// What a cleaner run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: usize,
    pub bytes_reclaimed: u64,
    pub bytes_moved: u64,
}

impl Store {
    /// Reclaims segments whose live share is below `threshold` (0..=1), copying their live units.
    pub fn gc(&self, threshold: f64) -> Result<GcReport> {
        self.lock().gc(threshold, u64::MAX)
    }
}

/// Copies the live cells of victim segments to the end of the data
/// segments, remembering where each went so that a cell several roots
/// share is copied once and every root points at the same copy.
struct Mover {
    out: Appender,
    moved: HashMap<u64, u64>,
    bytes: u64,
}

/// Appends units to the data segments while the tree is borrowed (the
/// engine's own `append_unit` needs it whole); the engine takes its
/// position back with [`Appender::give_back`].
#[derive(Clone, Copy)]
pub(super) struct Appender {
    pub(super) data_segment: Option<(SegmentId, u64)>,
    pub(super) next_segment: SegmentId,
    pub(super) target: u64,
}

impl Appender {
    pub(super) fn of(e: &Engine) -> Appender {
        Appender {
            data_segment: e.data_segment,
            next_segment: e.next_segment,
            target: e.segment_target,
        }
    }

    /// Appends `bytes`; returns their address.
    pub(super) fn append(&mut self, medium: &dyn Medium, bytes: &[u8], what: &str) -> Result<u64> {
        let need = bytes.len() as u64;
        let (seg, off) = match self.data_segment {
            Some((s, o)) if o + need <= self.target => (s, o),
            _ => {
                self.next_segment += 1;
                (self.next_segment - 1, 0)
            }
        };
        medium
            .append(seg, off, bytes)
            .map_err(|e| Error::io(what, e))?;
        self.data_segment = Some((seg, off + need));
        Ok(addr(seg, off as u32))
    }

    pub(super) fn give_back(self, e: &mut Engine) {
        e.data_segment = self.data_segment;
        e.next_segment = self.next_segment;
        e.unsynced = true;
    }
}

impl Mover {
    /// Moves what `tree` has in `victims`, changing at most `budget` bytes
    /// of nodes; returns whether it moved everything.
    fn relocate(
        &mut self,
        victims: &BTreeSet<SegmentId>,
        tree: &mut Tree,
        ctx: &Ctx,
        freed: &mut Vec<NodePtr>,
        budget: &mut usize,
    ) -> Result<bool> {
        tree.rewrite(
            ctx,
            freed,
            budget,
            &|p: &NodePtr| victims.contains(&addr_segment(p.addr)),
            &mut |_, v| {
                let Value::Cell(c) = v else { return Ok(false) };
                if !victims.contains(&addr_segment(c.addr)) {
                    return Ok(false);
                }
                if let Some(&to) = self.moved.get(&c.addr) {
                    c.addr = to;
                    return Ok(true);
                }
                let mut buf = vec![0u8; c.sealed_len() as usize];
                ctx.medium
                    .read(addr_segment(c.addr), addr_offset(c.addr) as u64, &mut buf)
                    .map_err(|e| read_error("a live cell during cleaning", e))?;
                let to = self.out.append(&*ctx.medium, &buf, "copying a live cell")?;
                self.moved.insert(c.addr, to);
                c.addr = to;
                self.bytes += buf.len() as u64;
                Ok(true)
            },
        )
    }
}

impl Engine {
    /// Sealed bytes each segment holds that some root reaches: the live
    /// tree, every snapshot, and the snapshot table. A unit shared by
    /// several roots counts once.
    pub(super) fn segment_usage(&self) -> Result<HashMap<SegmentId, u64>> {
        // Only units several roots share need remembering (a set of every
        // address would be tens of MiB at a million files).
        let shared = !self.snapshots.is_empty();
        let mut seen = HashSet::new();
        let mut live: HashMap<SegmentId, u64> = HashMap::new();
        let mut mark = |at: u64, len: u64| {
            if !shared || seen.insert(at) {
                *live.entry(addr_segment(at)).or_default() += len;
            }
        };
        for tree in self.roots() {
            self.each_unit(tree, &mut mark)?;
        }
        for t in self.catalog_unit.iter().chain(&self.scheme_state_units) {
            mark(t.addr, t.len as u64);
        }
        Ok(live)
    }

    /// Runs the cleaner if the [`CleanerPolicy`] says so.
    pub(super) fn maybe_clean(&mut self) {
        let policy = self.cleaner;
        if policy.min_dead_bytes == u64::MAX {
            return;
        }
        let total = match self.medium_bytes() {
            Ok(t) => t,
            Err(e) => {
                self.last_commit_error = Some(format!("cleaner: {e}"));
                return;
            }
        };
        let dead = total.saturating_sub(self.live_bytes);
        if dead < policy.min_dead_bytes || (dead as f64) < policy.dead_share * total as f64 {
            return;
        }
        if let Err(e) = self.gc(policy.threshold, policy.max_move_bytes) {
            self.last_commit_error = Some(format!("cleaner: {e}"));
        }
    }

    /// The bytes in the medium's segments (a listing: once per epoch at most).
    pub(super) fn medium_bytes(&self) -> Result<u64> {
        let mut total = 0;
        let medium = &self.ctx.medium;
        for s in medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?
        {
            total += medium
                .segment_len(s)
                .map_err(|e| Error::io("reading segment size", e))?
                .unwrap_or(0);
        }
        Ok(total)
    }

    /// Cleans segments whose live share is under `threshold`, emptiest first,
    /// copying at most about `max_move` live bytes.
    pub(super) fn gc(&mut self, threshold: f64, max_move: u64) -> Result<GcReport> {
        self.writable()?;
        // The in-memory tree must equal the committed one before segments
        // that only it leaves unreferenced may go.
        self.commit()?;
        let live = self.segment_usage()?;
        let current = self.data_segment.map(|(s, _)| s);
        let mut report = GcReport::default();
        let mut candidates = Vec::new();
        let segments = self
            .ctx
            .medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?;
        for seg in segments {
            if Some(seg) == current || seg == self.log.segment || Some(seg) == self.log.tally {
                continue;
            }
            let size = self
                .ctx
                .medium
                .segment_len(seg)
                .map_err(|e| Error::io("reading segment size", e))?
                .unwrap_or(0);
            let used = live.get(&seg).copied().unwrap_or(0);
            if used == 0 {
                let _no_readers = self.ctx.io_guard.write().unwrap_or_else(|p| p.into_inner());
                self.ctx
                    .medium
                    .delete_segment(seg)
                    .map_err(|e| Error::io("deleting a dead segment", e))?;
                report.segments_deleted += 1;
                report.bytes_reclaimed += size;
            } else if (used as f64) < threshold * size as f64 {
                candidates.push((used as f64 / size as f64, seg, used, size));
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut victims = BTreeSet::new();
        let mut to_move = 0u64;
        for (_, seg, used, size) in candidates {
            if !victims.is_empty() && to_move + used > max_move {
                break;
            }
            to_move += used;
            victims.insert(seg);
            report.bytes_reclaimed += size - used;
        }
        if victims.is_empty() {
            return Ok(report);
        }
        // Move live cells as they are (same key, same sealed bytes), once
        // however many roots share them; nodes in victims are rewritten by
        // the commit under fresh keys. Relocating decodes and changes every
        // node on the way to what moves (five to eight times its sealed
        // bytes in memory, and a victim may hold 64 MiB of nodes), so a
        // pass stops changing nodes at the changed-tree cap; the commit
        // after it writes them out and the next pass goes on. The victims
        // go with the commit after the pass that found nothing left in them
        // (DESIGN §10, "Memory is bounded").
        let mut mover = Mover {
            out: Appender::of(self),
            moved: HashMap::new(),
            bytes: 0,
        };
        loop {
            mover.out = Appender::of(self);
            // Not zero: a pass that may change nothing would never end.
            let mut budget = self.dirty_tree_cap.max(1);
            let result = self.relocate_everywhere(&mut mover, &victims, &mut budget);
            mover.out.give_back(self);
            match result {
                Ok(true) => break,
                Ok(false) => self.commit()?,
                Err(e) => {
                    self.poisoned = Some(format!("cleaner: {e}"));
                    return Err(e);
                }
            }
        }
        report.bytes_moved = mover.bytes;
        report.segments_deleted += victims.len();
        self.doomed_segments.extend(victims.iter().copied());
        self.commit()?;
        Ok(report)
    }

    /// Relocates what every root has in `victims`, within one `budget` of
    /// changed nodes; returns whether nothing is left in them. The live
    /// tree's old nodes are released, a snapshot's are shared and only traced.
    fn relocate_everywhere(
        &mut self,
        mover: &mut Mover,
        victims: &BTreeSet<SegmentId>,
        budget: &mut usize,
    ) -> Result<bool> {
        let mut tree = std::mem::take(&mut self.tree);
        let mut freed = Vec::new();
        let mut result = mover.relocate(victims, &mut tree, &self.ctx, &mut freed, budget);
        self.tree = tree;
        self.release_nodes(freed);
        let mut snapshots = std::mem::take(&mut self.snapshots);
        for s in snapshots.values_mut() {
            result = match result {
                Ok(complete) => mover
                    .relocate(victims, &mut s.tree, &self.ctx, &mut Vec::new(), budget)
                    .map(|done| complete && done),
                Err(e) => Err(e),
            };
        }
        self.snapshots = snapshots;
        self.snapshot_generation += 1;
        result
    }
}
