//! Durability and erasure: flush appends the epoch's intent log; commit seals the tree under a new epoch key and rotates the vault (DESIGN §4–5).

use super::*;

impl Store {
    /// Makes every write so far durable (intent log), without ending the epoch.
    pub fn flush(&self) -> Result<()> {
        self.lock().flush()
    }

    /// Ends the epoch now: every deletion before it becomes unrecoverable.
    pub fn commit(&self) -> Result<()> {
        self.lock().commit()
    }

    /// Alias of [`commit`](Self::commit): the erasure barrier.
    pub fn purge(&self) -> Result<()> {
        self.commit()
    }

    /// Commits if the epoch policy says so (call it from a timer).
    pub fn tick(&self) {
        self.lock().maybe_commit();
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
    /// Ops queued before the commit started: the new superblock's tree holds
    /// them. Those queued after are not in it and go to the new epoch's log.
    pending_at_commit: usize,
    /// The epoch's counters when the commit started; what was counted after
    /// belongs to the new epoch (deletions made meanwhile are still pending).
    stats_at_commit: EpochStats,
}

/// What a commit that reached the vault leaves of the epoch it ended: nothing
/// (the tree holds it all), or what was accepted while its outcome was unknown.
enum Carry {
    Nothing,
    AcceptedMeanwhile {
        pending_at_commit: usize,
        stats_at_commit: EpochStats,
    },
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
                let carry = Carry::AcceptedMeanwhile {
                    pending_at_commit: unknown.pending_at_commit,
                    stats_at_commit: unknown.stats_at_commit,
                };
                self.finish_commit(unknown.next, unknown.slot, unknown.log, carry);
                // The rotation may have stopped between its two steps. If the
                // old key cannot be destroyed yet, that is no reason to refuse
                // the flush that asked: `status` shows it, commits retry.
                if let Err(e) = self.erase_vault_leftovers(previous) {
                    self.last_commit_error = Some(e.to_string());
                }
                Ok(())
            }
            // The epoch stays open; the ops queued before and after the
            // attempt are all still pending for this epoch's log.
            Ok(now) if now.epoch == self.epoch && now.key == self.epoch_key => Ok(()),
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

    pub(super) fn flush(&mut self) -> Result<()> {
        self.writable()?;
        self.resolve_vault_unknown()?;
        self.write_out_all()?;
        for &oid in &self.size_dirty {
            let record = self.record(oid)?;
            self.pending.push(Op::SetObject { oid, record });
        }
        if self.pending.is_empty() {
            if self.unsynced {
                self.sync("syncing data")?;
            }
            return Ok(());
        }
        // The data a batch refers to must be durable before the batch is,
        // and the frame before the tally that counts it. A medium that keeps
        // appends in order gives both without a sync in between (what
        // survives a cut is data, then frame, then tally, up to some point),
        // so there the flush is one sync: one request on object storage.
        let in_order = self.ctx.medium.keeps_append_order();
        if self.unsynced && !in_order {
            self.sync("syncing data before the intent log")?;
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
        let frame = if journal.is_empty() {
            log::seal_frame(&keys, self.log_seq, &self.pending)
        } else {
            let mut ops: Vec<Op> = journal.into_iter().map(Op::Scheme).collect();
            ops.extend(self.pending.iter().cloned());
            log::seal_frame(&keys, self.log_seq, &ops)
        };
        let tally = log::seal_tally(
            &keys,
            self.log_seq + 1,
            self.log_offset + frame.len() as u64,
        );
        let capacity = self.ctx.medium.segment_capacity();
        if self.log.format != LogFormat::V2
            || self.log_offset + frame.len() as u64 > capacity
            || self.tally_offset + tally.len() as u64 > capacity
        {
            // A full log (or a format-1 epoch, which has no tally): the
            // commit puts everything in the tree and starts a fresh log.
            return self.commit();
        }
        let tally_segment = self.log.tally.expect("a format-2 log has a tally");
        // The frame, then the tally that counts it: a batch is acknowledged
        // only once both are durable, so replay can tell a torn tail (not
        // counted) from a truncated or damaged log (counted, missing).
        if let Err(e) = self
            .ctx
            .medium
            .append(self.log.segment, self.log_offset, &frame)
        {
            return self.poison("appending to the intent log", e);
        }
        if !in_order {
            self.sync("syncing the intent log")?;
        }
        if let Err(e) = self
            .ctx
            .medium
            .append(tally_segment, self.tally_offset, &tally)
        {
            return self.poison("appending to the intent log's tally", e);
        }
        self.sync("syncing the intent log's tally")?;
        self.log_offset += frame.len() as u64;
        self.tally_offset += tally.len() as u64;
        self.log_seq += 1;
        self.ctx.scheme.journal_logged(logged);
        self.pending.clear();
        self.size_dirty.clear();
        Ok(())
    }

    pub(super) fn maybe_commit(&mut self) {
        if self.read_only || self.poisoned.is_some() {
            return;
        }
        if self.vault_leftover.is_some() {
            if let Err(e) = self.retry_vault_leftovers(false) {
                self.last_commit_error = Some(e.to_string());
            }
        }
        let p = &self.policy;
        let changed = self.stats.bytes_written > 0 || self.stats.deletions > 0;
        let due = p.bytes.is_some_and(|b| self.stats.bytes_written >= b)
            || p.deletions.is_some_and(|d| self.stats.deletions >= d)
            || (changed
                && p.interval
                    .is_some_and(|i| now_secs().saturating_sub(self.committed_at) >= i.as_secs()));
        if !due {
            return;
        }
        match self.commit() {
            Ok(()) => self.last_commit_error = None,
            // Keep-the-epoch-open policy: nothing is lost, erasure is delayed,
            // the next trigger retries and `status` reports why.
            Err(e) => {
                self.last_commit_error = Some(e.to_string());
                return;
            }
        }
        self.maybe_clean();
    }

    pub(super) fn commit(&mut self) -> Result<()> {
        let result = self.commit_inner();
        match &result {
            Ok(()) => self.vault_down = None,
            Err(e @ (Error::Vault(_) | Error::VaultStateUnknown(_)))
                if self.vault_failure == VaultFailurePolicy::RefuseWrites =>
            {
                self.vault_down = Some((e.to_string(), std::time::Instant::now()));
            }
            Err(_) => {}
        }
        result
    }

    /// The commit protocol of DESIGN §4. `Ok` only once the new epoch is
    /// committed *and* the vault holds no older key.
    pub(super) fn commit_inner(&mut self) -> Result<()> {
        self.writable()?;
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
        let next = VaultRecord {
            store_id: self.store_id,
            epoch: self.epoch + 1,
            key: self.ctx.provider.random_key(),
        };
        // A key scheme with keys outside the tree forgets every key no
        // retained root reaches, and its state goes under the new epoch key.
        let scheme_state = self.persist_scheme_state(&catalog, &next)?;
        // 3. Nodes durable before the superblock that names them.
        self.sync("syncing tree nodes")?;
        // 4. The new superblock, sealed by a fresh epoch key, in the other slot.
        let log = LogPlace {
            segment: self.alloc_segment(),
            tally: Some(self.alloc_segment()),
            format: LogFormat::V2,
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
        let slot = self.active_slot.other();
        if let Err(e) = self.ctx.medium.write_superblock(slot, &sealed) {
            return self.poison("writing the superblock", e);
        }
        self.sync("syncing the superblock")?;
        // 5. Only now replace the key in the vault: this is the commit point.
        let previous = self.epoch;
        if let Err(e) = self.vault.store(&next) {
            let why = e.to_string();
            match self.vault.load() {
                // The new record is in: committed. Its second step (destroying
                // the old record) may not have happened: finished below.
                Ok(now) if now.epoch == next.epoch && now.key == next.key => {}
                // The vault still holds the current key: the epoch stays open,
                // the intent log keeps every flushed write, a retry will commit.
                Ok(now) if now.epoch == self.epoch && now.key == self.epoch_key => {
                    return Err(Error::Vault(e));
                }
                _ => {
                    self.vault_unknown = Some(UnknownRotation {
                        next,
                        slot,
                        log,
                        why: why.clone(),
                        pending_at_commit: self.pending.len(),
                        stats_at_commit: self.stats.clone(),
                    });
                    return Err(Error::VaultStateUnknown(why));
                }
            }
            self.finish_commit(next, slot, log, Carry::Nothing);
            return self.erase_vault_leftovers(previous);
        }
        self.finish_commit(next, slot, log, Carry::Nothing);
        if self.vault_leftover.is_some() {
            // An older leftover this rotation did not replace.
            return self.erase_vault_leftovers(previous);
        }
        Ok(())
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

    fn finish_commit(&mut self, next: VaultRecord, slot: Slot, log: LogPlace, carry: Carry) {
        let old_log = self.log;
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
        match carry {
            Carry::Nothing => {
                self.pending.clear();
                self.size_dirty.clear();
                self.stats = EpochStats::default();
            }
            Carry::AcceptedMeanwhile {
                pending_at_commit,
                stats_at_commit,
            } => {
                // Accepted while the vault's answer was unknown: not in the
                // new superblock's tree, so they stay queued for the new
                // epoch's log, and its deletions stay pending. (Grown sizes
                // are logged again: harmless, a record replaces itself.)
                self.pending
                    .drain(..pending_at_commit.min(self.pending.len()));
                self.stats = self.stats.since(&stats_at_commit);
            }
        }
        self.committed_at = now_secs();
        // Space only: the old log and unreachable segments are already unreadable.
        let mut doomed = std::mem::take(&mut self.doomed_segments);
        doomed.push(old_log.segment);
        doomed.extend(old_log.tally);
        let _no_readers = self.ctx.io_guard.write().unwrap_or_else(|p| p.into_inner());
        for seg in doomed {
            if Some(seg) != self.data_segment.map(|(s, _)| s) {
                let _ = self.ctx.medium.delete_segment(seg);
            }
        }
    }
}
