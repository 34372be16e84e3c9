//! The cleaner: reclaims segments whose units are dead, copying live units as they are, a slice at a time between other work (DESIGN §7).

use super::*;

/// Live bytes one slice of a cleaner run copies at most before it lets go
/// of the engine lock: a millisecond or two of copying, which the change
/// that runs the slice waits for (a whole run under the lock was a pause of
/// up to 600 ms for every writer).
const SLICE_BYTES: u64 = 1 << 20;

/// What a cleaner run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: usize,
    pub bytes_reclaimed: u64,
    pub bytes_moved: u64,
}

impl Store {
    /// Reclaims segments whose live share is below `threshold` (0..=1),
    /// copying their live units, then commits; returns once their space is
    /// free. An automatic run in progress gives way to it.
    pub fn gc(&self, threshold: f64) -> Result<GcReport> {
        let report = {
            let mut e = self.lock();
            e.cleaning = None;
            match e.start_clean(threshold, u64::MAX)? {
                Some(report) => report,
                None => loop {
                    if let Some(report) = e.clean_slice()? {
                        break report;
                    }
                    if e.cleaner_needs_commit() {
                        e.commit()?;
                    }
                },
            }
        };
        self.commit()?;
        Ok(report)
    }
}

/// A cleaner run in progress: its victims chosen, their live units being
/// moved out a slice at a time.
pub(super) struct CleanRun {
    victims: BTreeSet<SegmentId>,
    mover: Mover,
    /// Where the next slice starts.
    cursor: Cursor,
    report: GcReport,
    /// Live bytes the victims held when the run started.
    to_move: u64,
    /// Memory the nodes the run changed may still take before a commit
    /// writes them out ([`Options::dirty_tree_bytes`] after each commit).
    node_budget: usize,
    /// The epoch `node_budget` was counted in.
    budget_epoch: u64,
}

impl CleanRun {
    pub(super) fn progress(&self) -> CleanerProgress {
        CleanerProgress {
            victims: self.victims.len(),
            bytes_moved: self.mover.bytes,
            bytes_to_move: self.to_move,
        }
    }
}

/// A place in the roots a run goes through: the live tree, then each
/// snapshot's in name order.
#[derive(Clone, Default)]
struct Cursor {
    /// `None`: the live tree.
    snapshot: Option<String>,
    /// `None`: the root's first key.
    key: Option<Key>,
}

/// Copies the live cells of victim segments to the end of the data
/// segments, remembering where each went so that a cell several roots
/// share is copied once and every root points at the same copy.
struct Mover {
    out: Appender,
    moved: HashMap<u64, u64>,
    /// Bytes copied so far in the run.
    bytes: u64,
    /// Where the current slice stops copying.
    limit: u64,
}

/// Appends units to the data segments while the tree is borrowed (the
/// engine's own `append_unit` needs it whole); the engine takes its
/// position back with [`Appender::give_back`].
#[derive(Clone, Copy)]
pub(super) struct Appender {
    pub(super) data_segment: Option<(SegmentId, u64)>,
    pub(super) next_segment: SegmentId,
    pub(super) target: u64,
    /// Where the data segments ended when it was made: what it appends
    /// lies between there and where it leaves them.
    from: u64,
}

impl Appender {
    pub(super) fn of(e: &Engine) -> Appender {
        Appender {
            data_segment: e.data_segment,
            next_segment: e.next_segment,
            target: e.segment_target,
            from: e.data_end(),
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
        let started = e.next_segment..self.next_segment;
        e.data_segment = self.data_segment;
        e.next_segment = self.next_segment;
        e.mark_unsynced();
        // A moved unit may be a snapshot's too (the cleaner moves a unit
        // once for every root that shares it): what was appended is never
        // rewritten in place. The foreground's units before it still may be.
        e.copied_between(self.from, e.data_end(), started);
    }
}

impl Mover {
    /// Moves what `tree` has in `victims` from the key `from` on, until the
    /// slice's copy limit or the changed nodes' `budget`; returns the key
    /// the next slice starts at, or `None` at the tree's end.
    fn relocate(
        &mut self,
        victims: &BTreeSet<SegmentId>,
        tree: &mut Tree,
        ctx: &Ctx,
        freed: &mut Vec<NodePtr>,
        budget: &mut usize,
        from: Option<&Key>,
    ) -> Result<Option<Key>> {
        tree.rewrite(
            ctx,
            freed,
            budget,
            from,
            &|p: &NodePtr| victims.contains(&addr_segment(p.addr)),
            &mut |_, v| {
                let Value::Cell(c) = v else {
                    return Ok(Visit::Unchanged);
                };
                if !victims.contains(&addr_segment(c.addr)) {
                    return Ok(Visit::Unchanged);
                }
                if let Some(&to) = self.moved.get(&c.addr) {
                    c.addr = to;
                    return Ok(Visit::Changed);
                }
                if self.bytes >= self.limit {
                    return Ok(Visit::Stop);
                }
                let mut buf = vec![0u8; c.sealed_len() as usize];
                ctx.medium
                    .read(addr_segment(c.addr), addr_offset(c.addr) as u64, &mut buf)
                    .map_err(|e| read_error("a live cell during cleaning", e))?;
                let to = self.out.append(&*ctx.medium, &buf, "copying a live cell")?;
                self.moved.insert(c.addr, to);
                c.addr = to;
                self.bytes += buf.len() as u64;
                Ok(Visit::Changed)
            },
        )
    }
}

/// What a cleaner run's trace goes through, taken under the engine lock:
/// every root and the other units the store names, and the first segment
/// that may get units after that moment. The trace itself may then run
/// without the lock (DESIGN §7).
pub(super) struct TraceStart {
    roots: Vec<Tree>,
    /// The catalog's and the key scheme's units.
    units: Vec<(u64, u64)>,
    /// The data segment being filled when the roots were taken (or the
    /// next one): it and every later segment may hold units the roots do
    /// not show, so the run neither dooms nor empties them.
    floor: SegmentId,
    /// A context for loading nodes without the engine lock (no node cache:
    /// a trace reads each node once).
    detached: Ctx,
}

impl TraceStart {
    /// Sealed bytes each segment holds that the roots reach, loading nodes
    /// through `src`. A unit several roots share counts once.
    pub(super) fn segment_usage(&self, src: &dyn NodeSource) -> Result<HashMap<SegmentId, u64>> {
        // Only units several roots share need remembering (a set of every
        // address would be tens of MiB at a million files).
        let shared = self.roots.len() > 1;
        let mut seen = HashSet::new();
        let mut live: HashMap<SegmentId, u64> = HashMap::new();
        let mut mark = |at: u64, len: u64| {
            if !shared || seen.insert(at) {
                *live.entry(addr_segment(at)).or_default() += len;
            }
        };
        for tree in &self.roots {
            each_unit(tree, src, &mut mark)?;
        }
        for &(at, len) in &self.units {
            mark(at, len);
        }
        Ok(live)
    }

    /// [`segment_usage`](Self::segment_usage) without the engine lock.
    pub(super) fn trace_detached(&self) -> Result<HashMap<SegmentId, u64>> {
        self.segment_usage(&self.detached)
    }
}

impl Engine {
    /// Takes what a trace goes through (see [`TraceStart`]).
    pub(super) fn trace_start(&self) -> TraceStart {
        TraceStart {
            roots: self.roots().cloned().collect(),
            units: (self.catalog_unit.iter().chain(&self.scheme_state_units))
                .map(|t| (t.addr, t.len as u64))
                .collect(),
            floor: self.data_segment.map_or(self.next_segment, |(s, _)| s),
            detached: Ctx {
                medium: self.ctx.medium.clone(),
                provider: self.ctx.provider.clone(),
                scheme: self.ctx.scheme.clone(),
                cache: RefCell::new(NodeCache::with_limit(0)),
                io_guard: self.ctx.io_guard.clone(),
            },
        }
    }

    /// Whether the [`CleanerPolicy`] wants a run now: dead bytes past both
    /// its share and its amount, and no run in progress.
    pub(super) fn clean_due(&mut self) -> bool {
        let policy = self.cleaner;
        if policy.min_dead_bytes == u64::MAX || self.cleaning.is_some() {
            return false;
        }
        let total = match self.medium_bytes() {
            Ok(t) => t,
            Err(e) => {
                self.last_commit_error = Some(format!("cleaner: {e}"));
                return false;
            }
        };
        let dead = total.saturating_sub(self.live_bytes);
        if self.space.short() {
            // Writes are (or are about to be) refused for want of room:
            // any dead segment's worth is worth a run, whatever the share.
            return dead >= self.segment_target.min(1 << 20);
        }
        dead >= policy.min_dead_bytes && (dead as f64) >= policy.dead_share * total as f64
    }

    /// Starts the policy's run (if none started meanwhile) from a trace of
    /// `start`, made with or without the lock. The changes that follow
    /// carry it out, a slice each ([`Store::settle`]); an idle store's
    /// timer finishes it. A trace made without it may fail where the roots
    /// it went through lost units meanwhile (a key scheme forgets the keys
    /// of what a commit erased): it is then made again under the lock.
    pub(super) fn start_traced_run(
        &mut self,
        start: TraceStart,
        live: Result<HashMap<SegmentId, u64>>,
    ) {
        if self.cleaning.is_some() || self.writable().is_err() {
            return;
        }
        let traced = match live {
            Ok(live) => Ok((start, live)),
            Err(_) => {
                let start = self.trace_start();
                start.segment_usage(&self.ctx).map(|live| (start, live))
            }
        };
        let policy = self.cleaner;
        let started = traced.and_then(|(start, live)| {
            self.start_clean_with(&start, &live, policy.threshold, policy.max_move_bytes)
        });
        if let Err(e) = started {
            self.last_commit_error = Some(format!("cleaner: {e}"));
        }
    }

    /// The bytes in the medium's segments, but for those being deleted (a
    /// listing: once per epoch at most).
    pub(super) fn medium_bytes(&self) -> Result<u64> {
        let mut total = 0;
        let medium = &self.ctx.medium;
        for s in medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?
        {
            if self.reclaimer.is_unfinished(s) {
                continue;
            }
            total += medium
                .segment_len(s)
                .map_err(|e| Error::io("reading segment size", e))?
                .unwrap_or(0);
        }
        Ok(total)
    }

    /// Starts cleaning segments whose live share is under `threshold`,
    /// emptiest first, to copy at most about `max_move` live bytes.
    /// Segments no root reaches any more are doomed at once: the next
    /// commit deletes them. Returns the report if nothing is left to move
    /// (no run starts), `None` if a run started.
    pub(super) fn start_clean(
        &mut self,
        threshold: f64,
        max_move: u64,
    ) -> Result<Option<GcReport>> {
        self.writable()?;
        let start = self.trace_start();
        let live = start.segment_usage(&self.ctx)?;
        self.start_clean_with(&start, &live, threshold, max_move)
    }

    /// [`start_clean`](Self::start_clean) from `live`, a trace of `start`.
    /// Sound however long ago `start` was taken: no change adds a reference
    /// to a unit no root reached (units are only appended, at `floor` or
    /// after; a snapshot copies the live tree), so a segment below `floor`
    /// the trace found unreached is unreached still; one that lost units
    /// since only looks fuller than it is.
    fn start_clean_with(
        &mut self,
        start: &TraceStart,
        live: &HashMap<SegmentId, u64>,
        threshold: f64,
        max_move: u64,
    ) -> Result<Option<GcReport>> {
        self.writable()?;
        let current = self.data_segment.map(|(s, _)| s);
        let mut report = GcReport::default();
        let mut candidates = Vec::new();
        let segments = self
            .ctx
            .medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?;
        let doomed: HashSet<SegmentId> = self.doomed_segments.iter().copied().collect();
        for seg in segments {
            if Some(seg) == current
                || seg >= start.floor
                || seg == self.log.segment
                || Some(seg) == self.log.tally
                || doomed.contains(&seg)
                || self.reclaimer.is_unfinished(seg)
            {
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
                // No root reaches it, and no change ever adds a reference to
                // an old segment; but the last commit's tree may still name
                // it (a change accepted while that commit ran may have
                // dropped it), so it goes with the next commit.
                self.doomed_segments.push(seg);
                report.segments_deleted += 1;
                report.bytes_reclaimed += size;
            } else if (used as f64) < threshold * size as f64 {
                candidates.push((used as f64 / size as f64, seg, used, size));
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        // On a full medium, no more than the room left (the reserve is
        // there for this) less what the commit needs: the victims' space
        // comes back only after it.
        let room = self.cleaner_room();
        let mut victims = BTreeSet::new();
        let mut to_move = 0u64;
        for (_, seg, used, size) in candidates {
            if to_move + used > room {
                continue;
            }
            if !victims.is_empty() && to_move + used > max_move {
                break;
            }
            to_move += used;
            victims.insert(seg);
            report.bytes_reclaimed += size - used;
        }
        if victims.is_empty() {
            return Ok(Some(report));
        }
        self.cleaning = Some(CleanRun {
            victims,
            mover: Mover {
                out: Appender::of(self),
                moved: HashMap::new(),
                bytes: 0,
                limit: 0,
            },
            cursor: Cursor::default(),
            report,
            to_move,
            node_budget: 0,
            budget_epoch: self.epoch.wrapping_sub(1),
        });
        Ok(None)
    }

    /// Whether the cleaner wants a commit: to delete the segments it
    /// doomed, or to write out the nodes its run changed.
    pub(super) fn cleaner_wants_commit(&self) -> bool {
        !self.doomed_segments.is_empty() || self.cleaner_needs_commit()
    }

    /// Whether the run in progress waits for a commit to write out the
    /// nodes it changed (relocating decodes and changes every node on the
    /// way to what moves: five to eight times its sealed bytes in memory).
    pub(super) fn cleaner_needs_commit(&self) -> bool {
        self.cleaning
            .as_ref()
            .is_some_and(|run| run.budget_epoch == self.epoch && run.node_budget == 0)
    }

    /// One slice of the run in progress: moves live cells as they are (same
    /// key, same sealed bytes), once however many roots share them, up to
    /// [`SLICE_BYTES`] or the changed-tree budget; nodes in victims are
    /// rewritten by the next commit under fresh keys. Returns the report
    /// once the run is over.
    ///
    /// Between slices the lock is let go and other changes run, a commit
    /// among them. None of them puts a reference to a victim behind the
    /// cursor: a change adds units only at the end of the data segments,
    /// and the one change that copies references, taking a snapshot, copies
    /// the live tree, which the run goes through first, into a root it goes
    /// through after. So once the cursor has passed the last root, no root
    /// reaches the victims and they are doomed. A commit already in flight
    /// may still name them: it took the segments doomed before its capture
    /// ([`CommitPlan`]), these go with the next one.
    pub(super) fn clean_slice(&mut self) -> Result<Option<GcReport>> {
        let Some(mut run) = self.cleaning.take() else {
            return Ok(None);
        };
        self.writable()?;
        if run.budget_epoch != self.epoch {
            // Not zero: a run that may change nothing would never end.
            run.node_budget = self.dirty_tree_cap.max(1);
            run.budget_epoch = self.epoch;
        }
        if run.node_budget == 0 {
            // Waiting for the commit `cleaner_needs_commit` asks for.
            self.cleaning = Some(run);
            return Ok(None);
        }
        run.mover.out = Appender::of(self);
        run.mover.limit = run.mover.bytes + SLICE_BYTES;
        let mut budget = run.node_budget;
        let result = self.relocate_from(&mut run, &mut budget);
        run.node_budget = budget;
        run.mover.out.give_back(self);
        match result {
            // The medium had no room for a copy and took nothing
            // (DESIGN §7, "A full medium"): every pointer moved so far
            // names a copy that landed, and the rest still name their
            // victims, so the run stays where its cursor is and the next
            // slice goes over that stretch again (what was moved is no
            // longer in a victim).
            Err(e @ Error::NoSpace(_)) => {
                self.cleaning = Some(run);
                Err(e)
            }
            Err(e) => {
                // Units were appended and nodes changed: the in-memory
                // state may be ahead of anything a commit can vouch for.
                self.poisoned = Some(format!("cleaner: {e}"));
                Err(e)
            }
            Ok(Some(next)) => {
                run.cursor = next;
                self.cleaning = Some(run);
                Ok(None)
            }
            Ok(None) => {
                run.report.bytes_moved = run.mover.bytes;
                run.report.segments_deleted += run.victims.len();
                self.doomed_segments.extend(run.victims.iter().copied());
                // Views of snapshots taken earlier may point into the victims.
                self.snapshot_generation += 1;
                Ok(Some(run.report))
            }
        }
    }

    /// Relocates what every root has in the run's victims from its cursor
    /// on; returns where the next slice starts, or `None` at the end of the
    /// last root. The live tree's old nodes are released, a snapshot's are
    /// shared and only traced.
    fn relocate_from(&mut self, run: &mut CleanRun, budget: &mut usize) -> Result<Option<Cursor>> {
        let cursor = run.cursor.clone();
        if cursor.snapshot.is_none() {
            let mut tree = std::mem::take(&mut self.tree);
            let mut freed = Vec::new();
            let result = run.mover.relocate(
                &run.victims,
                &mut tree,
                &self.ctx,
                &mut freed,
                budget,
                cursor.key.as_ref(),
            );
            self.tree = tree;
            self.release_nodes(freed);
            if let Some(key) = result? {
                return Ok(Some(Cursor {
                    snapshot: None,
                    key: Some(key),
                }));
            }
        }
        let names: Vec<String> = match &cursor.snapshot {
            None => self.snapshots.keys().cloned().collect(),
            Some(at) => self
                .snapshots
                .range(at.clone()..)
                .map(|(n, _)| n.clone())
                .collect(),
        };
        for name in names {
            let from = match &cursor.snapshot {
                Some(at) if *at == name => cursor.key,
                _ => None,
            };
            let Some(snapshot) = self.snapshots.get_mut(&name) else {
                continue;
            };
            let stopped = run.mover.relocate(
                &run.victims,
                &mut snapshot.tree,
                &self.ctx,
                &mut Vec::new(),
                budget,
                from.as_ref(),
            )?;
            if let Some(key) = stopped {
                return Ok(Some(Cursor {
                    snapshot: Some(name),
                    key: Some(key),
                }));
            }
        }
        Ok(None)
    }
}
