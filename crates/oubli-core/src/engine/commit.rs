//! Durability and erasure: flush appends the epoch's intent log; commit seals the tree under a new epoch key and rotates the vault (DESIGN §4–5).

use super::*;

/// Nodes made in memory before their memory is first measured.
const DIRTY_NODES_FIRST_MEASURE: usize = 64;
/// Changes waiting for the intent log above which the store flushes by
/// itself (each holds 120 bytes and what it points to: a cell's holes, an
/// object record's metadata, a bucket of names). A flush names every unit
/// it logs, after which an overwrite can no longer take its place
/// (`rewrite.rs`); rewrites replace their op instead of adding one, so
/// this counts cells, and 2¹⁷ lets a file of up to 512 MiB in 4 KiB cells
/// be rewritten at random whole between two flushes (fio's random map
/// comes back to a cell only after all the others).
pub(super) const PENDING_OPS_MAX: usize = 1 << 17;
/// Cleaner slices a [`Store::tick`] carries out at most (up to 1 MiB copied each).
const TICK_SLICES: usize = 64;

impl Store {
    /// Makes every write so far durable (intent log), without ending the epoch.
    ///
    /// Buffered cells are sealed and the intent-log frame is made under the
    /// engine lock; the syncs and the log's appends run without it, so that
    /// writes (from other threads, other NBD connections) go on meanwhile.
    /// What they change waits for the next flush. Commits, other flushes
    /// and the operations that take [`lock`](Self::lock) wait for this one
    /// (DESIGN §10).
    pub fn flush(&self) -> Result<()> {
        self.core.flush_beside_writes()
    }

    /// Ends the epoch now: every deletion before it becomes unrecoverable.
    ///
    /// The tree is captured and sealed under the engine lock; the syncs, the
    /// superblock write and the vault rotation (20–50 ms on a TPM or a
    /// token) run without it, so reads and writes go on meanwhile. What they
    /// change is not in the new epoch's tree: it stays queued for the new
    /// epoch's intent log (and its deletions pending for the next commit).
    /// A flush, a snapshot, the cleaner and other commits wait for it
    /// (DESIGN §10).
    pub fn commit(&self) -> Result<()> {
        let result = self.core.commit_beside_writes();
        // What the commit made unreachable is deleted by a thread of its
        // own; the caller who asked for a commit gets the space back too.
        self.shared.reclaimer.wait_idle();
        if result.is_ok() {
            self.lock().clean_if_short();
        }
        result
    }

    /// Alias of [`commit`](Self::commit): the erasure barrier.
    pub fn purge(&self) -> Result<()> {
        self.commit()
    }

    /// Commits if the epoch policy says so, and finishes a cleaner run that
    /// changes were carrying out (call it from a timer: a store with no
    /// changes coming would otherwise leave the run where it stopped).
    ///
    /// A tick does at most 64 slices (`TICK_SLICES`), so that the timer's
    /// other duties (a server's control socket) wait at most that long.
    pub fn tick(&self) {
        self.core.tally_beside_writes();
        for _ in 0..TICK_SLICES {
            let e = self.lock();
            let cleaning = e.cleaning.is_some();
            if !self.settle_as(e, Settler::Timer) || !cleaning {
                return;
            }
        }
    }

    /// After a change: see [`settle_as`](Self::settle_as).
    pub(super) fn settle<'a>(&'a self, e: MutexGuard<'a, Engine>) -> bool {
        self.settle_as(e, Settler::Change)
    }

    /// After a change or on the timer: runs the epoch policy, committing
    /// with the lock released across the I/O (as [`commit`](Self::commit))
    /// when it is due; otherwise carries out one slice of a cleaner run in
    /// progress. Returns false if a commit it ran failed.
    fn settle_as<'a>(&'a self, mut e: MutexGuard<'a, Engine>, settler: Settler) -> bool {
        if e.pending.len() > e.pending_ops_max && !e.io_in_flight() {
            // Bounds the memory of the changes waiting for the intent log:
            // logging them early only makes them durable sooner. A failure
            // poisons the store, which the next change reports.
            let _ = e.flush();
        }
        while let Some(due) = e.commit_due(settler) {
            if e.committing {
                // A bound reached beside the commit in flight (memory, or
                // the next epoch's count triggers: a writer outrunning the
                // commits): wait for it to land, then look again.
                drop(e);
                e = self.lock();
                continue;
            }
            if settler == Settler::Change && e.background_commits {
                if e.commit_requested.is_some() {
                    // The memory cap reached again (by a quarter) before the
                    // committer took the request: wait until it captures
                    // the tree, which leaves no changed node behind.
                    e = Core::unpoisoned(self.core.commit_landed.wait(e));
                    continue;
                }
                // The policy's commit, or the memory cap's with none in
                // flight: both go to the committer thread, and the change
                // returns (the next bound waits for that commit to land).
                let epoch = e.epoch;
                e.commit_requested = Some(CommitRequest { due, epoch });
                drop(e);
                if self.wake_committer() {
                    return true;
                }
                // No thread to run it: the change does, as without the option.
                e = self.lock_beside_commit();
                e.commit_requested = None;
            }
            let may_clean = e.cleaner_may_start();
            drop(e);
            return self.core.policy_commit(may_clean);
        }
        // Beside a commit in flight too: the segments a slice dooms wait
        // for the commit after it.
        if e.cleaning.is_some() {
            if let Err(err) = e.clean_slice() {
                e.last_commit_error = Some(format!("cleaner: {err}"));
            }
        }
        true
    }

    /// Asks the committer thread for the commit the epoch policy wants,
    /// starting the thread the first time (and again if it died). False if
    /// no thread could be started.
    fn wake_committer(&self) -> bool {
        let mut slot = self.committer.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|t| t.is_finished()) {
            // It panicked; a commit it had in flight was marked (the store
            // is poisoned), a request it had not begun is still set.
            let _ = slot.take().map(|t| t.join());
        }
        if slot.is_none() {
            let core = self.core.clone();
            let spawned = std::thread::Builder::new()
                .name("oubli-committer".into())
                .spawn(move || core.run_committer());
            match spawned {
                Ok(t) => *slot = Some(t),
                Err(_) => return false,
            }
        }
        self.core.commit_wanted.notify_all();
        true
    }

    /// Stops the committer thread once the commit it was asked for (if
    /// any) has landed.
    pub(super) fn stop_committer(&mut self) {
        let slot = self.committer.get_mut().unwrap_or_else(|p| p.into_inner());
        let Some(thread) = slot.take() else {
            return;
        };
        self.core.lock_beside_commit().closing = true;
        self.core.commit_wanted.notify_all();
        let _ = thread.join();
    }
}

impl Core {
    /// [`Store::flush`]: the frame is made under the lock, synced and
    /// appended without it.
    fn flush_beside_writes(&self) -> Result<()> {
        // Every write the caller made is in any flush that begins after
        // this point. Callers that queue behind a flush in flight (several
        // connections, or threads, each syncing) find that one of them
        // already made such a flush while they waited, and are done: one
        // frame and its syncs serve them all (group commit).
        let ticket = self.lock_beside_commit().flushes_begun;
        loop {
            let mut e = self.lock();
            if e.flushed_through > ticket {
                return e.writable();
            }
            let Some(mut plan) = e.begin_flush()? else {
                return Ok(());
            };
            let owed = plan.owed;
            let medium = e.ctx.medium.clone();
            let in_flight = self.flush_in_flight(e);
            let outcome = plan.write(&*medium);
            in_flight.land().end_flush(plan, outcome)?;
            if !owed {
                return Ok(());
            }
            // An earlier flush, stopped by a full medium, is done: now
            // the one this caller asked for.
        }
    }

    /// The timer's tally record ([`Engine::begin_tally`]), synced without
    /// the lock like a flush. A failure poisons the store, which the next
    /// change reports.
    fn tally_beside_writes(&self) {
        let mut e = self.lock();
        let Some(mut plan) = e.begin_tally() else {
            return;
        };
        let medium = e.ctx.medium.clone();
        let in_flight = self.flush_in_flight(e);
        let outcome = plan.write(&*medium);
        let _ = in_flight.land().end_flush(plan, outcome);
    }

    /// [`Store::commit`] without waiting for the segments it doomed to be
    /// deleted (the epoch policy's commits).
    fn commit_beside_writes(&self) -> Result<()> {
        let mut e = self.lock();
        let plan = match e.begin_commit() {
            Ok(plan) => plan,
            Err(err) => {
                let result = Err(err);
                e.note_commit_result(&result);
                return result;
            }
        };
        let (medium, vault) = (e.ctx.medium.clone(), e.vault.clone());
        let in_flight = self.commit_in_flight(e);
        let outcome = plan.write(&*medium, &*vault);
        let mut e = in_flight.land();
        let result = e.end_commit(plan, outcome, true);
        e.note_commit_result(&result);
        result
    }

    /// A commit the epoch policy asked for, then what follows it (a cleaner
    /// run may start). False if it failed.
    fn policy_commit(&self, may_clean: bool) -> bool {
        let result = self.commit_beside_writes();
        let ok = result.is_ok();
        let trace = self.lock().after_policy_commit(result, may_clean);
        if let Some(start) = trace {
            // The trace reads and opens every node the roots reach (a
            // quarter of a second at 10⁶ files): without the lock, so
            // that no change waits for it (DESIGN §7).
            let live = start.trace_detached();
            self.lock().start_traced_run(start, live);
        }
        ok
    }

    /// The committer thread: runs each commit a change asked for, until the
    /// store closes (a request still open then is carried out first, so
    /// that closing right after a change the policy answered still ends
    /// the epoch).
    fn run_committer(&self) {
        let mut e = self.lock_beside_commit();
        loop {
            while e.commit_requested.is_none() && !e.closing {
                e = Self::unpoisoned(self.commit_wanted.wait(e));
            }
            let Some(request) = e.commit_requested.take() else {
                return;
            };
            // A writer held at the memory cap may wait for the request to
            // be taken.
            self.commit_landed.notify_all();
            while e.committing {
                e = Self::unpoisoned(self.commit_landed.wait(e));
            }
            // A commit made since the request (`Store::commit`, the timer)
            // may have ended the epoch already. The memory cap's request
            // stands until then: its measure is taken once per quarter of
            // growth, so asking again could say no.
            let cap_stands = request.due == Due::Bound && e.epoch == request.epoch;
            if !cap_stands && e.commit_due(Settler::Change).is_none() {
                continue;
            }
            let may_clean = e.cleaner_may_start();
            drop(e);
            self.policy_commit(may_clean);
            e = self.lock_beside_commit();
        }
    }
}

/// A commit a change asked the committer thread for.
#[derive(Clone, Copy)]
pub(super) struct CommitRequest {
    /// Why it was due.
    due: Due,
    /// The epoch it was asked in: a commit that ended that epoch since
    /// answered it.
    epoch: u64,
}

/// Who settles the store: a change, in its caller's path, or the timer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Settler {
    Change,
    Timer,
}

/// Why a commit is due.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Due {
    /// A bound that holds whoever runs the commits: the tree nodes changed
    /// since the last commit reached their memory cap, or the changes made
    /// beside a commit in flight reached the epoch policy's count triggers
    /// again (a writer outrunning the commits). The change that got there
    /// waits for the commit in flight, if any, then commits (or, with
    /// background commits, asks the committer thread for one).
    Bound,
    /// The epoch policy, or (on the timer) a cleaner run's space.
    Policy,
}

/// What a flush's I/O returns: the step that failed, and why.
pub(super) type IoOutcome = std::result::Result<(), (&'static str, std::io::Error)>;

/// What sealing the buffered cells into a frame changed in memory
/// ([`Engine::undo_frame_cells`]).
pub(super) struct FrameUndo {
    tree: Tree,
    pending: usize,
    live_bytes: u64,
    stats: EpochStats,
    /// The buffered cells sealed into the frame.
    taken: Vec<((u64, u64), DirtyCell)>,
}

/// A flush made under the lock, waiting for its I/O: the data sync, then
/// the intent-log frame and (each flush in format 2, when due in format 6)
/// the tally record that counts it.
pub(super) struct FlushPlan {
    /// Units were appended to data segments since the last sync, and the
    /// medium does not keep appends in order: the data is synced before
    /// the frame that names it.
    sync_data: bool,
    /// `None`: no ops were pending and no tally record is due; only the
    /// data is synced.
    log: Option<LogAppend>,
    /// The medium keeps appends in order: the last sync covers the data,
    /// the frame and the tally.
    in_order: bool,
    /// [`Engine::appends`] when the plan was made.
    appends: u64,
    /// The key scheme's journal records the frame holds.
    logged: usize,
    /// Its place among the flushes begun ([`Engine::flushes_begun`]).
    number: u64,
    /// An earlier flush that stopped for want of room, run again
    /// ([`Engine::owed_flush`]): the caller makes its own after it.
    owed: bool,
}

/// What a flush appends to the intent log, with the places: a frame (or
/// the rest of one, whose head with the cells went down under the lock)
/// and a tally record.
pub(super) struct LogAppend {
    segment: SegmentId,
    offset: u64,
    /// What of the frame is still to append (empty: all of it went down
    /// under the lock, or there is no frame).
    frame: Vec<u8>,
    /// Whether the plan has a frame (the timer's tally record alone has
    /// not): it is synced before the tally record that counts it.
    has_frame: bool,
    /// The tally segment, the record's place and the record.
    tally: Option<(SegmentId, u64, Vec<u8>)>,
}

impl FlushPlan {
    /// The flush's I/O, which may run without the engine lock: at most one
    /// at a time, since a medium's `sync` may return before the data of a
    /// sync running beside it is down (`DirMedium` takes its dirty set,
    /// then fsyncs).
    ///
    /// Each append that lands is struck off the plan, so that a plan
    /// stopped by a full medium (whose failed append left nothing) is run
    /// again from where it stopped: the same bytes at the same places,
    /// never two messages under one key and nonce.
    pub(super) fn write(&mut self, medium: &dyn Medium) -> IoOutcome {
        let Some(log) = &mut self.log else {
            return medium.sync().map_err(|e| ("syncing data", e));
        };
        if self.sync_data {
            medium
                .sync()
                .map_err(|e| ("syncing data before the intent log", e))?;
        }
        if !log.frame.is_empty() {
            medium
                .append(log.segment, log.offset, &log.frame)
                .map_err(|e| ("appending to the intent log", e))?;
            log.frame = Vec::new();
        }
        // The frame, then the tally that counts it: a batch is counted only
        // once it is durable, so replay can tell a torn tail (not counted)
        // from a truncated or damaged log (counted, missing).
        if let Some((segment, offset, record)) = &log.tally {
            if !self.in_order && log.has_frame {
                medium.sync().map_err(|e| ("syncing the intent log", e))?;
            }
            medium
                .append(*segment, *offset, record)
                .map_err(|e| ("appending to the intent log's tally", e))?;
            log.tally = None;
        }
        medium.sync().map_err(|e| ("syncing the intent log", e))
    }

    /// Whether the plan's frame is still wholly to append: a plan that a
    /// full medium stopped before it may be dropped, its frame never
    /// having reached the medium ([`Engine::apply_durably`]).
    pub(super) fn frame_unwritten(&self) -> bool {
        self.log
            .as_ref()
            .is_some_and(|log| log.has_frame && !log.frame.is_empty())
    }
}

/// A commit sealed in memory, waiting for its I/O: the new superblock and
/// the vault record that will make it current.
pub(super) struct CommitPlan {
    next: VaultRecord,
    slot: Slot,
    log: LogPlace,
    sealed: Vec<u8>,
    /// The vault's record for the epoch being ended, to tell after a failed
    /// rotation whether the vault still holds it.
    current: VaultRecord,
    covered: Covered,
    /// The segments doomed when the tree was captured: this commit's tree
    /// names none of them, so they go once it lands. Segments doomed later
    /// wait for the next commit (this one's tree may still name them).
    doomed: Vec<SegmentId>,
}

/// What [`CommitPlan::write`] achieved.
pub(super) enum CommitOutcome {
    /// A medium write or sync failed (the store is poisoned).
    MediumFailed(&'static str, std::io::Error),
    /// The vault refused and still holds the current key.
    VaultRefused(crate::vault::VaultError),
    /// The vault failed and cannot tell which key it holds.
    VaultUnknown(String),
    /// The vault reported an error but holds the new key.
    StoredWithError,
    Stored,
}

impl CommitPlan {
    /// Steps 3–5 of the commit (DESIGN §4): nodes durable, then the new
    /// superblock in the other slot, then the vault rotation (the commit
    /// point). Touches only the medium and the vault, so it runs without the
    /// engine lock.
    pub(super) fn write(&self, medium: &dyn Medium, vault: &dyn Vault) -> CommitOutcome {
        // 3. Nodes durable before the superblock that names them.
        if let Err(e) = medium.sync() {
            return CommitOutcome::MediumFailed("syncing tree nodes", e);
        }
        if let Err(e) = medium.write_superblock(self.slot, &self.sealed) {
            return CommitOutcome::MediumFailed("writing the superblock", e);
        }
        if let Err(e) = medium.sync() {
            return CommitOutcome::MediumFailed("syncing the superblock", e);
        }
        // 5. Only now replace the key in the vault: this is the commit point.
        let Err(e) = vault.store(&self.next) else {
            return CommitOutcome::Stored;
        };
        match vault.load() {
            Ok(now) if now.epoch == self.next.epoch && now.key == self.next.key => {
                CommitOutcome::StoredWithError
            }
            Ok(now) if now.epoch == self.current.epoch && now.key == self.current.key => {
                CommitOutcome::VaultRefused(e)
            }
            _ => CommitOutcome::VaultUnknown(e.to_string()),
        }
    }
}

/// A rotation whose outcome the vault could not tell: the new superblock is
/// written, the vault may or may not hold the new key. Everything needed to
/// finish the commit once the vault answers "new", and to keep what was
/// accepted in the meantime.
pub(super) struct UnknownRotation {
    next: VaultRecord,
    slot: Slot,
    log: LogPlace,
    why: String,
    covered: Covered,
    doomed: Vec<SegmentId>,
}

/// What the new superblock's tree holds of the epoch being ended: the
/// state when the commit captured its tree. What came after is not in it.
#[derive(Clone)]
pub(super) struct Covered {
    /// Ops queued before the capture; those queued after go to the new
    /// epoch's log.
    pending: usize,
    /// The epoch's counters at the capture; what was counted after belongs
    /// to the new epoch (deletions made meanwhile are still pending).
    stats: EpochStats,
    /// Objects whose size grew up to this stamp have their record in the
    /// tree; a growth after it must still be logged.
    size_stamp: u64,
}

/// What a commit that reached the vault leaves of the epoch it ended: nothing
/// (the tree holds it all), or what was accepted after its capture — while
/// its I/O ran without the lock, or while the vault's answer was unknown.
enum Carry {
    Nothing,
    AcceptedMeanwhile(Covered),
}

impl Engine {
    /// Asks the vault again about a rotation whose outcome was unknown.
    pub(super) fn resolve_vault_unknown(&mut self) -> Result<()> {
        let Some(unknown) = self.vault_unknown.take() else {
            return Ok(());
        };
        match self.vault.load() {
            Ok(now) if now.epoch == unknown.next.epoch && now.key == unknown.next.key => {
                let previous = self.epoch;
                let carry = Carry::AcceptedMeanwhile(unknown.covered);
                self.finish_commit(
                    unknown.next,
                    unknown.slot,
                    unknown.log,
                    carry,
                    unknown.doomed,
                );
                // The rotation may have stopped between its two steps. If the
                // old key cannot be destroyed yet, that is no reason to refuse
                // the flush that asked: `status` shows it, commits retry.
                if let Err(e) = self.erase_vault_leftovers(previous) {
                    self.last_commit_error = Some(e.to_string());
                }
                Ok(())
            }
            // The epoch stays open; the ops queued before and after the
            // attempt are all still pending for this epoch's log, and its
            // doomed segments wait for the next commit.
            Ok(now) if now.epoch == self.epoch && now.key == self.epoch_key => {
                self.doomed_segments.extend(unknown.doomed);
                Ok(())
            }
            Ok(_) => {
                self.poisoned =
                    Some("the vault holds a key from neither the current nor the new epoch".into());
                Err(Error::VaultStateUnknown(unknown.why))
            }
            Err(e) => {
                self.vault_unknown = Some(unknown);
                Err(Error::VaultStateUnknown(e.to_string()))
            }
        }
    }

    /// Destroys the records the vault holds besides the current one (the
    /// key of `previous` after a rotation cut between its two steps). Until
    /// that succeeds, the deletions of `previous` are not erased: the error
    /// says so and `status` shows it.
    pub(super) fn erase_vault_leftovers(&mut self, previous: u64) -> Result<()> {
        match self.vault.erase_leftovers() {
            Ok(()) => {
                self.vault_leftover = None;
                Ok(())
            }
            Err(e) => {
                let epochs = self.leftover_epochs().unwrap_or_else(|_| vec![previous]);
                let epoch = epochs.first().copied().unwrap_or(previous);
                self.vault_leftover = Some(VaultLeftover {
                    epochs,
                    why: e.to_string(),
                    since: std::time::Instant::now(),
                });
                Err(Error::ErasureIncomplete {
                    epoch,
                    why: e.to_string(),
                })
            }
        }
    }

    /// Epochs of the records the vault still holds besides the current one.
    pub(super) fn leftover_epochs(&self) -> Result<Vec<u64>, crate::vault::VaultError> {
        let records = self.vault.readable_records()?;
        Ok(records
            .iter()
            .skip(1)
            .map(|r| r.epoch)
            .filter(|&e| e != self.epoch)
            .collect())
    }

    /// Retries a vault erasure that failed, at most every [`VAULT_RETRY`].
    fn retry_vault_leftovers(&mut self, force: bool) -> Result<()> {
        let Some(left) = &self.vault_leftover else {
            return Ok(());
        };
        if !force && left.since.elapsed() < VAULT_RETRY {
            return Err(Error::ErasureIncomplete {
                epoch: left.epochs.first().copied().unwrap_or(self.epoch),
                why: left.why.clone(),
            });
        }
        let previous = left.epochs.first().copied().unwrap_or(self.epoch);
        self.erase_vault_leftovers(previous)
    }

    /// A flush with everything under the lock (the caller holds it through
    /// a larger operation: a snapshot, a share, closing the store).
    pub(super) fn flush(&mut self) -> Result<()> {
        loop {
            let Some(mut plan) = self.begin_flush()? else {
                return Ok(());
            };
            let owed = plan.owed;
            let outcome = plan.write(&*self.ctx.medium);
            self.end_flush(plan, outcome)?;
            if !owed {
                return Ok(());
            }
        }
    }

    /// The flush's work under the lock: buffered writes sealed, the pending
    /// ops (and the key scheme's journal) sealed into the next frame of the
    /// intent log, its place reserved. `None` when there is nothing to make
    /// durable, or when the log was full and a commit did the job.
    pub(super) fn begin_flush(&mut self) -> Result<Option<FlushPlan>> {
        self.commit_owed_at_open()?;
        self.writable()?;
        self.resolve_vault_unknown()?;
        // A flush that a full medium stopped goes first: the frames after
        // it in the log are replayed only if it is there.
        if let Some(plan) = self.owed_flush.take() {
            return Ok(Some(plan));
        }
        // Format 6: the buffered cells go into the frame, whose one sync
        // makes both durable (its authentication covers them, so a frame
        // whose cells did not all land does not open). The frame must fit
        // the log segment with its cells: else they go to a data segment
        // and the commit below starts a fresh log.
        let cells_at = self.log_offset + log::FRAME_HEADER_V3 as u64;
        let cells_bound = (self.dirty_bytes + self.dirty.len() * TAG_LEN) as u64;
        if self.log.format == LogFormat::V3
            && !self.dirty.is_empty()
            && cells_at + cells_bound <= self.ctx.medium.segment_capacity()
        {
            self.frame_cells = Some(FrameCells {
                segment: self.log.segment,
                at: cells_at,
                bytes: Vec::with_capacity(cells_bound as usize),
                taken: Vec::new(),
            });
        }
        // What sealing the cells into the frame changes, to be undone if
        // the medium has no room for them: a clone of the tree is its
        // root (nodes are copied on write), the buffered cells are kept
        // as they are taken.
        let undo = self.frame_cells.is_some().then(|| FrameUndo {
            tree: self.tree.clone(),
            pending: self.pending.len(),
            live_bytes: self.live_bytes,
            stats: self.stats.clone(),
            taken: Vec::new(),
        });
        let written = self.write_out_all();
        // The frame's ops name every unit appended so far (and a commit it
        // may fall back to, the tree): none may be rewritten in place now.
        self.name_units();
        let (cells, taken) = self
            .frame_cells
            .take()
            .map(|c| (c.bytes, c.taken))
            .unwrap_or_default();
        let undo = undo.map(|u| FrameUndo { taken, ..u });
        if let Err(e) = written {
            if !cells.is_empty() {
                // The tree names cells of a frame that will not be written.
                self.poisoned = Some(format!("sealing cells into the intent log: {e}"));
            }
            return Err(e);
        }
        for &oid in self.size_dirty.keys() {
            let record = self.record(oid)?;
            self.pending.push(Op::SetObject { oid, record });
        }
        // The data a batch refers to must be durable before the batch is,
        // and the frame before the tally that counts it. A medium that keeps
        // appends in order gives both without a sync in between (what
        // survives a cut is data, then frame, then tally, up to some point),
        // so there the flush is one sync: one request on object storage.
        let in_order = self.ctx.medium.keeps_append_order();
        if self.pending.is_empty() {
            if !self.unsynced {
                return Ok(None);
            }
            return Ok(Some(FlushPlan {
                sync_data: true,
                log: None,
                in_order,
                appends: self.appends,
                logged: 0,
                number: self.next_flush_number(),
                owed: false,
            }));
        }
        let keys = LogKeys {
            provider: &*self.ctx.provider,
            epoch_key: &self.epoch_key,
            store_id: &self.store_id,
            epoch: self.epoch,
        };
        // Keys the scheme made since the last flush that these ops need
        // (a keyed hash forest's new tree) go first in the same batch.
        let journal = self.ctx.scheme.journal();
        let logged = journal.len();
        let with_journal;
        let ops: &[Op] = if journal.is_empty() {
            &self.pending
        } else {
            with_journal = journal
                .into_iter()
                .map(Op::Scheme)
                .chain(self.pending.iter().cloned())
                .collect::<Vec<_>>();
            &with_journal
        };
        let (head, frame) = match self.log.format {
            LogFormat::V3 => {
                let frame = log::seal_frame_v3(&keys, self.log_seq, cells, ops);
                (frame.head, frame.batch)
            }
            _ => (Vec::new(), log::seal_frame(&keys, self.log_seq, ops)),
        };
        let frame_end = self.log_offset + (head.len() + frame.len()) as u64;
        let tally_due = self.log.format != LogFormat::V3
            || in_order
            || match self.tally_cadence {
                TallyCadence::EveryFlush => true,
                TallyCadence::Every(interval) => self.tally_written_at.elapsed() >= interval,
                TallyCadence::EveryNthFrame(n) => (self.log_seq + 1).is_multiple_of(n.max(1)),
            };
        let tally = tally_due.then(|| log::seal_tally(&keys, self.log_seq + 1, frame_end));
        let capacity = self.ctx.medium.segment_capacity();
        let tally_len = tally.as_ref().map_or(0, |t| t.len() as u64);
        let has_cells = head.len() > log::FRAME_HEADER_V3;
        let sync_data = self.unsynced && !in_order;
        let fits = self.log.format != LogFormat::V1
            && frame_end <= capacity
            && self.tally_offset + tally_len <= capacity;
        // With no data sync to wait for, the whole frame goes down now (one
        // append); else its head alone.
        let (head, frame) = if has_cells && !sync_data && fits {
            ([head, frame].concat(), Vec::new())
        } else {
            (head, frame)
        };
        if self.log.format == LogFormat::V3 && frame_end > self.log_reserved {
            // A hint (the append reports what fails): room for the next
            // megabyte of frames, so that their syncs change no metadata.
            let upto = (frame_end + LOG_RESERVE).min(capacity);
            if self.ctx.medium.reserve(self.log.segment, upto).is_ok() {
                self.log_reserved = upto;
            }
        }
        if has_cells {
            // The cells go down now, under the lock, so that reads find them
            // where the tree says; the batch may have to wait for a data
            // sync. (Should the frame not fit after all, the commit below
            // syncs them with the tree that names them.)
            if let Err(e) = self
                .ctx
                .medium
                .append(self.log.segment, self.log_offset, &head)
            {
                if no_room(&e) {
                    // Nothing landed: the cells go back to the buffer and
                    // the tree to what it named before, as if this flush
                    // had not begun.
                    if let Some(undo) = undo {
                        self.undo_frame_cells(undo);
                    }
                }
                return self.medium_failed("appending cells to the intent log", e);
            }
            self.log_holds_cells = true;
        }
        if !fits {
            // A full log (or a format-1 epoch, which has no tally): the
            // commit puts everything in the tree and starts a fresh log.
            // The cells appended above are the tree's now: the log ends
            // past them (the end the commit gives `finish_segment`, and
            // where a later frame goes should the commit fail).
            if has_cells {
                self.log_offset += head.len() as u64;
            }
            self.commit()?;
            return Ok(None);
        }
        let (offset, frame) = if has_cells {
            (self.log_offset + head.len() as u64, frame)
        } else {
            (self.log_offset, [head, frame].concat())
        };
        let tally = tally.map(|record| {
            let place = (
                self.log.tally.expect("a format-2 log has a tally"),
                self.tally_offset,
                record,
            );
            self.tally_offset += tally_len;
            self.tally_counts = self.log_seq + 1;
            self.tally_written_at = std::time::Instant::now();
            place
        });
        let plan = FlushPlan {
            sync_data,
            log: Some(LogAppend {
                segment: self.log.segment,
                offset,
                frame,
                has_frame: true,
                tally,
            }),
            in_order,
            appends: self.appends,
            logged,
            number: self.next_flush_number(),
            owed: false,
        };
        // The frame's place is taken now: ops accepted while its I/O runs
        // go to the next frame, after it. Should the I/O fail, the store
        // is poisoned, and replay stops at the last frame that opens.
        self.log_offset = frame_end;
        self.log_seq += 1;
        self.pending.clear();
        self.pending_moved();
        self.size_dirty.clear();
        Ok(Some(plan))
    }

    /// The store's timer: a tally record for the frames a format-6 log's
    /// tally has not counted for longer than its interval (flushes stopped
    /// coming). `None` when none is due.
    pub(super) fn begin_tally(&mut self) -> Option<FlushPlan> {
        let TallyCadence::Every(interval) = self.tally_cadence else {
            return None;
        };
        // Not while a frame waits for room: the record would count it.
        if self.log.format != LogFormat::V3
            || self.owed_flush.is_some()
            || self.tally_counts == self.log_seq
            || self.tally_written_at.elapsed() < interval
            || self.writable().is_err()
        {
            return None;
        }
        let keys = LogKeys {
            provider: &*self.ctx.provider,
            epoch_key: &self.epoch_key,
            store_id: &self.store_id,
            epoch: self.epoch,
        };
        let record = log::seal_tally(&keys, self.log_seq, self.log_offset);
        let tally_len = record.len() as u64;
        if self.tally_offset + tally_len > self.ctx.medium.segment_capacity() {
            return None;
        }
        let place = (self.log.tally?, self.tally_offset, record);
        self.tally_offset += tally_len;
        self.tally_counts = self.log_seq;
        self.tally_written_at = std::time::Instant::now();
        Some(FlushPlan {
            sync_data: false,
            log: Some(LogAppend {
                segment: self.log.segment,
                offset: self.log_offset,
                frame: Vec::new(),
                has_frame: false,
                tally: Some(place),
            }),
            in_order: self.ctx.medium.keeps_append_order(),
            appends: self.appends,
            logged: 0,
            // Not a flush: the ops waiting for the next frame are not in it.
            number: 0,
            owed: false,
        })
    }

    /// Puts back what sealing cells into a frame changed, the frame's head
    /// having found no room: the tree as it was (the cells' new units
    /// were never written, and their keys, placed in no tree a commit
    /// keeps, are swept), the ops it queued gone, the cells buffered again.
    fn undo_frame_cells(&mut self, undo: FrameUndo) {
        self.tree = undo.tree;
        self.pending.truncate(undo.pending);
        self.pending_moved();
        self.live_bytes = undo.live_bytes;
        self.stats = undo.stats;
        for ((oid, cell), d) in undo.taken {
            self.set_dirty(oid, cell, d.start, d.data, d.holes);
        }
    }

    /// Numbers a flush being made ([`Engine::flushes_begun`]).
    fn next_flush_number(&mut self) -> u64 {
        self.flushes_begun += 1;
        self.flushes_begun
    }

    /// Applies what [`FlushPlan::write`] did (the lock held again).
    pub(super) fn end_flush(&mut self, mut plan: FlushPlan, outcome: IoOutcome) -> Result<()> {
        if let Err((context, e)) = outcome {
            if no_room(&e) {
                // The failed step left nothing: the rest of the plan (a
                // frame and its tally, or the timer's tally record) is
                // run again first thing by the next flush, so that the
                // log and its tally go on without a gap; the ops stay
                // accepted and the store usable.
                plan.owed = true;
                self.owed_flush = Some(plan);
            }
            return self.medium_failed(context, e);
        }
        self.flushed_through = self.flushed_through.max(plan.number);
        // Every sync came after the capture: what was appended up to it is
        // durable, and if nothing was appended since, nothing is unsynced.
        if self.appends == plan.appends {
            self.unsynced = false;
        }
        self.ctx.scheme.journal_logged(plan.logged);
        Ok(())
    }

    /// Whether, and why, a commit is due now: for the epoch policy never
    /// while one is in flight or asked of the committer thread, for memory
    /// always. Retries a failed vault erasure on the way.
    pub(super) fn commit_due(&mut self, settler: Settler) -> Option<Due> {
        if self.read_only || self.poisoned.is_some() {
            return None;
        }
        // Beside a commit in flight too: the nodes changed meanwhile are the
        // next epoch's, and the change that takes them over the cap waits
        // for that commit to land and commits them. So with the policy's
        // counts: with background commits nothing else would hold a lone
        // writer back, and epochs would grow by what it writes during each
        // commit (whose sync has that much more to write out).
        if self.dirty_tree_over_cap() || self.policy_outrun() {
            return Some(Due::Bound);
        }
        if self.committing || self.commit_requested.is_some() {
            return None;
        }
        if self.vault_leftover.is_some() {
            if let Err(e) = self.retry_vault_leftovers(false) {
                self.last_commit_error = Some(e.to_string());
            }
        }
        // A cleaner run doomed segments (the commit deletes them), or
        // changed as many nodes as it may before they are written out. Those
        // commits are for space: the timer runs them, not a writer (whose
        // change would wait for them), and so does the epoch policy's next.
        let wanted =
            (settler == Settler::Timer && self.cleaner_wants_commit()) || self.epoch_policy_due();
        wanted.then_some(Due::Policy)
    }

    /// Whether the [`EpochPolicy`] wants a commit.
    fn epoch_policy_due(&self) -> bool {
        let p = &self.policy;
        let changed =
            self.stats.bytes_written > 0 || self.stats.deletions > 0 || self.stats.overwrites > 0;
        self.policy_counts_reached(&self.stats)
            || (changed
                && p.interval
                    .is_some_and(|i| now_secs().saturating_sub(self.committed_at) >= i.as_secs()))
    }

    /// Whether `stats` reach the policy's bytes or deletions trigger.
    fn policy_counts_reached(&self, stats: &EpochStats) -> bool {
        let p = &self.policy;
        p.bytes.is_some_and(|b| stats.bytes_written >= b)
            || p.deletions.is_some_and(|d| stats.deletions >= d)
    }

    /// Whether what was counted beside the commit in flight (the next
    /// epoch's changes) already reaches the policy's bytes or deletions.
    fn policy_outrun(&self) -> bool {
        self.in_flight_covers
            .as_ref()
            .is_some_and(|covered| self.policy_counts_reached(&self.stats.since(covered)))
    }

    /// Whether the commit that is due may start a cleaner run after it. Not
    /// when only the cleaner asked for it (to delete what it emptied, or to
    /// write out the nodes it changed): each commit leaves garbage of its
    /// own (the nodes, catalog and key-scheme state it replaces), and runs
    /// would follow one another, a vault write each, in a store nobody
    /// writes to.
    fn cleaner_may_start(&self) -> bool {
        !self.cleaner_wants_commit() || self.epoch_policy_due()
    }

    /// True when the tree nodes changed since the last commit hold more
    /// memory than [`Options::dirty_tree_bytes`]. Measuring walks them, so
    /// it is done each time their count has grown by a quarter (at least
    /// [`DIRTY_NODES_FIRST_MEASURE`]): the walks cost O(1) per node made,
    /// and the cap is overshot by about a quarter at most.
    fn dirty_tree_over_cap(&mut self) -> bool {
        let nodes = self.tree.dirty_nodes();
        if nodes < self.dirty_nodes_measured {
            // A commit wrote them out since.
            self.dirty_nodes_measured = 0;
        }
        let next = (self.dirty_nodes_measured + self.dirty_nodes_measured / 4)
            .max(DIRTY_NODES_FIRST_MEASURE);
        if nodes < next {
            return false;
        }
        self.dirty_nodes_measured = nodes;
        self.tree.dirty_mem_bytes() > self.dirty_tree_cap
    }

    /// Records how a commit the policy asked for went; after success,
    /// returns what a cleaner run's trace must go through if one is due.
    /// Keep-the-epoch-open policy: a failure loses nothing, erasure is
    /// delayed, the next trigger retries and `status` reports why.
    pub(super) fn after_policy_commit(
        &mut self,
        result: Result<()>,
        may_clean: bool,
    ) -> Option<clean::TraceStart> {
        match result {
            Ok(()) => {
                self.last_commit_error = None;
                (may_clean && self.clean_due()).then(|| self.trace_start())
            }
            Err(e) => {
                self.last_commit_error = Some(e.to_string());
                None
            }
        }
    }

    /// The epoch policy under the lock (commits holding it): for callers
    /// inside a larger locked operation.
    pub(super) fn maybe_commit(&mut self) {
        if self.commit_due(Settler::Change).is_some() {
            let may_clean = self.cleaner_may_start();
            let result = self.commit();
            if let Some(start) = self.after_policy_commit(result, may_clean) {
                let live = start.segment_usage(&self.ctx);
                self.start_traced_run(start, live);
            }
        }
    }

    pub(super) fn commit(&mut self) -> Result<()> {
        let result = self.commit_inner();
        self.note_commit_result(&result);
        result
    }

    /// Under the refuse-writes policy, a commit the vault could not take
    /// stops new changes until one lands.
    pub(super) fn note_commit_result(&mut self, result: &Result<()>) {
        if matches!(result, Ok(()) | Err(Error::ErasureIncomplete { .. })) {
            self.full_at_open = None;
        }
        match result {
            Ok(()) => self.vault_down = None,
            Err(e @ (Error::Vault(_) | Error::VaultStateUnknown(_)))
                if self.vault_failure == VaultFailurePolicy::RefuseWrites =>
            {
                self.vault_down = Some((e.to_string(), std::time::Instant::now()));
            }
            Err(_) => {}
        }
    }

    /// The commit protocol of DESIGN §4, all under the engine lock (the
    /// cleaner's, snapshots' and shares' commits, and a flush whose log is
    /// full). `Ok` only once the new epoch is committed *and* the vault holds
    /// no older key. [`Store::commit`] runs the same steps but releases the
    /// lock across the I/O.
    pub(super) fn commit_inner(&mut self) -> Result<()> {
        let plan = self.begin_commit()?;
        let outcome = plan.write(&*self.ctx.medium, &*self.vault);
        self.end_commit(plan, outcome, false)
    }

    /// Steps 1–4 of the commit in memory: every buffered write becomes units
    /// in the tree, every changed node is sealed and appended, and the new
    /// superblock is sealed under a fresh epoch key. Nothing is synced and
    /// no superblock or vault is written yet: that is [`CommitPlan::write`].
    pub(super) fn begin_commit(&mut self) -> Result<CommitPlan> {
        // A store opened on a full medium commits: that ends the state.
        self.committable()?;
        if self.committing {
            // Unreachable through `Store` (`lock` waits for the commit in
            // flight); refused rather than run two rotations at once.
            return Err(Error::Invalid("a commit is already in progress".into()));
        }
        self.resolve_vault_unknown()?;
        // A leftover from an earlier rotation: try again first (the rotation
        // below would overwrite a file or TPM leftover anyway).
        let _ = self.retry_vault_leftovers(true);
        // 1. Everything buffered becomes units in the tree.
        self.write_out_all()?;
        // 2. Every changed node is sealed under a fresh key, children first.
        let root = self.persist_live_tree()?;
        // Every snapshot's changed nodes (after a redaction or a cleaner
        // run) and the table of their roots.
        let catalog = self.persist_catalog()?;
        // 4. The new superblock, sealed by a fresh epoch key, for the other slot.
        let next = VaultRecord {
            store_id: self.store_id,
            epoch: self.epoch + 1,
            key: self.ctx.provider.random_key(),
        };
        // A key scheme with keys outside the tree forgets every key no
        // retained root reaches, and its state goes under the new epoch key
        // (appended with the nodes: synced before the superblock).
        let scheme_state = self.persist_scheme_state(&catalog, &next)?;
        let log = LogPlace {
            segment: self.alloc_segment(),
            tally: Some(self.alloc_segment()),
            format: LogFormat::V3,
        };
        let header = Header {
            version: FORMAT_VERSION,
            store_id: self.store_id,
            epoch: next.epoch,
        };
        let body = Body {
            cell_size: self.cell_size,
            root,
            next_oid: self.next_oid,
            next_segment: self.next_segment,
            log_segment: log.segment,
            log_tally: log.tally,
            live_bytes: self.live_bytes,
            committed_at: now_secs(),
            catalog,
            key_scheme: self.ctx.scheme.id(),
            scheme_state,
        };
        let sealed = superblock::seal(&*self.ctx.provider, &next.key, &header, &body);
        Ok(CommitPlan {
            next,
            slot: self.active_slot.other(),
            log,
            sealed,
            current: VaultRecord {
                store_id: self.store_id,
                epoch: self.epoch,
                key: self.epoch_key.clone(),
            },
            covered: Covered {
                pending: self.pending.len(),
                stats: self.stats.clone(),
                size_stamp: self.size_stamp,
            },
            doomed: std::mem::take(&mut self.doomed_segments),
        })
    }

    /// Applies what [`CommitPlan::write`] did. `concurrent`: the lock was
    /// released meanwhile, so ops queued since [`begin_commit`] are not in
    /// the new tree and stay queued for the new epoch's log.
    pub(super) fn end_commit(
        &mut self,
        plan: CommitPlan,
        outcome: CommitOutcome,
        concurrent: bool,
    ) -> Result<()> {
        let CommitPlan {
            next,
            slot,
            log,
            covered,
            doomed,
            ..
        } = plan;
        let carry = || {
            if concurrent {
                Carry::AcceptedMeanwhile(covered.clone())
            } else {
                Carry::Nothing
            }
        };
        let previous = self.epoch;
        match outcome {
            // Out of room, the failed step left nothing (the `Medium`
            // contract): as when the vault refuses, the epoch stays open
            // and a retry commits. A superblock written but not synced is
            // in the slot the retry writes again; the vault still holds
            // the current key, so it never opens (DESIGN §7).
            CommitOutcome::MediumFailed(context, e) => {
                self.doomed_segments.extend(doomed);
                self.medium_failed(context, e)
            }
            // The vault still holds the current key: the epoch stays open,
            // the intent log keeps every flushed write, a retry will commit.
            CommitOutcome::VaultRefused(e) => {
                self.doomed_segments.extend(doomed);
                Err(Error::Vault(e))
            }
            CommitOutcome::VaultUnknown(why) => {
                self.vault_unknown = Some(UnknownRotation {
                    next,
                    slot,
                    log,
                    why: why.clone(),
                    covered,
                    doomed,
                });
                Err(Error::VaultStateUnknown(why))
            }
            // The new record is in: committed. Its second step (destroying
            // the old record) may not have happened: finished here.
            CommitOutcome::StoredWithError => {
                self.finish_commit(next, slot, log, carry(), doomed);
                self.erase_vault_leftovers(previous)
            }
            CommitOutcome::Stored => {
                self.finish_commit(next, slot, log, carry(), doomed);
                if self.vault_leftover.is_some() {
                    // An older leftover this rotation did not replace.
                    return self.erase_vault_leftovers(previous);
                }
                Ok(())
            }
        }
    }

    /// Tells the key scheme which keys every retained root (the live tree,
    /// each snapshot, the catalog) still reaches — the other keys it holds
    /// become underivable — and seals its state for epoch `next` (`None`
    /// for the parent-pointer scheme). Runs after every node of the
    /// commit is sealed, so the trace sees the new roots; its cost is a
    /// walk of the metadata of every root (DESIGN §3).
    fn persist_scheme_state(
        &mut self,
        catalog: &Option<NodePtr>,
        next: &VaultRecord,
    ) -> Result<Option<NodePtr>> {
        let scheme = self.ctx.scheme.clone();
        if !scheme.keeps_keys_outside_tree() {
            return Ok(None);
        }
        let mut live = Vec::new();
        for tree in self.roots() {
            tree.walk(&self.ctx, &mut |ptr, node| {
                live.extend(ptr.map(|p| p.key.clone()));
                if let Node::Leaf(entries) = node {
                    for (_, v) in entries {
                        if let Value::Cell(c) = v {
                            live.push(c.key.clone());
                        }
                    }
                }
                Ok(())
            })?;
        }
        live.extend(catalog.iter().map(|c| c.key.clone()));
        {
            // A read or a write's merge that captured a cell pointer under
            // the engine lock resolves its key after releasing it, holding
            // the I/O guard: the sweep waits for those, so no unit it was
            // promised vanishes under it.
            let _no_readers = self.ctx.io_guard.write().unwrap_or_else(|p| p.into_inner());
            scheme
                .sweep(&live)
                .map_err(|e| Error::Corrupt(format!("key scheme: {e}")))?;
        }
        let Some(mut plain) = scheme.commit_state() else {
            return Ok(None);
        };
        let provider = self.ctx.provider.clone();
        let store_id = self.store_id;
        // Chunks well under a segment, so that a state of any size fits.
        let chunk = (self.segment_target / 4).clamp(4096, 1 << 20) as usize;
        let written = crate::scheme_state::write(
            &*provider,
            &next.key,
            &store_id,
            next.epoch,
            &plain,
            chunk,
            &mut |sealed| self.append_unit(sealed),
        );
        wipe(&mut plain);
        let written = written?;
        self.scheme_state_units = written.units;
        Ok(Some(written.index))
    }

    fn finish_commit(
        &mut self,
        next: VaultRecord,
        slot: Slot,
        log: LogPlace,
        carry: Carry,
        mut doomed: Vec<SegmentId>,
    ) {
        let (old_log, old_log_end) = (self.log, self.log_offset);
        // The new state holds the keys the scheme made before the commit:
        // the new epoch's log need not carry them again.
        self.ctx.scheme.committed();
        self.epoch = next.epoch;
        self.epoch_key = next.key;
        self.active_slot = slot;
        self.log = log;
        self.log_offset = 0;
        self.tally_offset = 0;
        self.log_seq = 0;
        self.tally_counts = 0;
        self.log_reserved = 0;
        match carry {
            Carry::Nothing => {
                self.pending.clear();
                self.pending_moved();
                self.size_dirty.clear();
                self.stats = EpochStats::default();
            }
            Carry::AcceptedMeanwhile(covered) => {
                // Accepted after the capture: not in the new superblock's
                // tree, so they stay queued for the new epoch's log, and
                // their deletions stay pending.
                self.pending
                    .drain(..covered.pending.min(self.pending.len()));
                self.pending_moved();
                self.stats = self.stats.since(&covered.stats);
                self.size_dirty
                    .retain(|_, grown_at| *grown_at > covered.size_stamp);
            }
        }
        self.committed_at = now_secs();
        // A frame that found no room belongs to the old log: the new
        // tree holds what it carried.
        self.owed_flush = None;
        // Space only: the old log and unreachable segments are already
        // unreadable. Deleting them is slow (a file system frees their
        // blocks): a thread of its own does it, outside the lock.
        // A format-6 log that carries cells the tree names is the cleaner's,
        // like a data segment (its frames died with the old epoch key).
        if std::mem::take(&mut self.log_holds_cells) {
            // Without the room reserved for frames that will not come (a
            // hint: the zeros would only cost space until the cleaner).
            let _ = self.ctx.medium.finish_segment(old_log.segment, old_log_end);
        } else {
            doomed.push(old_log.segment);
        }
        doomed.extend(old_log.tally);
        let current = self.data_segment.map(|(s, _)| s);
        doomed.retain(|&seg| Some(seg) != current);
        self.reclaimer.hand_over(doomed);
        // The commit wrote nodes and will free segments: writes refused
        // for want of room ask the medium again.
        self.space.stale();
    }
}
