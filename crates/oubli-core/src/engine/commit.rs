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

impl Engine {
    pub(super) fn resolve_vault_unknown(&mut self) -> Result<()> {
        let Some((record, slot, log_segment, why)) = self.vault_unknown.take() else {
            return Ok(());
        };
        match self.ctx_vault_load() {
            Ok(now) if now.epoch == record.epoch && now.key == record.key => {
                self.finish_commit(record, slot, log_segment);
                Ok(())
            }
            Ok(now) if now.epoch == self.epoch && now.key == self.epoch_key => Ok(()),
            Ok(_) => {
                self.poisoned =
                    Some("the vault holds a key from neither the current nor the new epoch".into());
                Err(Error::VaultStateUnknown(why))
            }
            Err(e) => {
                let msg = e.to_string();
                self.vault_unknown = Some((record, slot, log_segment, why));
                Err(Error::VaultStateUnknown(msg))
            }
        }
    }

    pub(super) fn ctx_vault_load(&self) -> Result<VaultRecord, crate::vault::VaultError> {
        self.vault.load()
    }

    pub(super) fn flush(&mut self) -> Result<()> {
        self.writable()?;
        self.resolve_vault_unknown()?;
        self.write_out_all()?;
        for oid in std::mem::take(&mut self.size_dirty) {
            let record = self.record(oid)?;
            self.pending.push(Op::SetObject { oid, record });
        }
        if self.pending.is_empty() {
            if self.unsynced {
                self.sync("syncing data")?;
            }
            return Ok(());
        }
        // The data a batch refers to must be durable before the batch is.
        if self.unsynced {
            self.sync("syncing data before the intent log")?;
        }
        let frame = log::seal_frame(
            &*self.ctx.provider,
            &self.epoch_key,
            &self.store_id,
            self.epoch,
            self.log_seq,
            &self.pending,
        );
        if self.log_offset + frame.len() as u64 > self.ctx.medium.segment_capacity() {
            return self.commit();
        }
        if let Err(e) = self
            .ctx
            .medium
            .append(self.log_segment, self.log_offset, &frame)
        {
            return self.poison("appending to the intent log", e);
        }
        self.sync("syncing the intent log")?;
        self.log_offset += frame.len() as u64;
        self.log_seq += 1;
        self.pending.clear();
        Ok(())
    }

    pub(super) fn maybe_commit(&mut self) {
        if self.read_only || self.poisoned.is_some() {
            return;
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

    pub(super) fn commit_inner(&mut self) -> Result<()> {
        self.writable()?;
        self.resolve_vault_unknown()?;
        // 1. Everything buffered becomes units in the tree.
        self.write_out_all()?;
        self.size_dirty.clear();
        // 2. Every changed node is sealed under a fresh key, children first.
        let mut tree = std::mem::take(&mut self.tree);
        let persisted = tree.persist(&mut |node: &Arc<Node>| {
            let mut bytes = encode_node(node);
            let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
            self.ctx
                .provider
                .seal(&key, &node_aad(node.level()), &mut bytes);
            let at = self.append_unit(&bytes)?;
            self.live_bytes += bytes.len() as u64;
            self.ctx
                .cache
                .borrow_mut()
                .insert(at, node.clone(), bytes.len());
            Ok(NodePtr {
                addr: at,
                len: bytes.len() as u32,
                key: key_ref,
            })
        });
        self.tree = tree;
        let root = persisted?;
        // 3. Nodes durable before the superblock that names them.
        self.sync("syncing tree nodes")?;
        // 4. The new superblock, sealed by a fresh epoch key, in the other slot.
        let next = VaultRecord {
            store_id: self.store_id,
            epoch: self.epoch + 1,
            key: self.ctx.provider.random_key(),
        };
        let new_log = self.alloc_segment();
        let header = Header {
            version: FORMAT_VERSION,
            store_id: self.store_id,
            epoch: next.epoch,
        };
        let committed_at = now_secs();
        let body = Body {
            cell_size: self.cell_size,
            root,
            next_oid: self.next_oid,
            next_segment: self.next_segment,
            log_segment: new_log,
            live_bytes: self.live_bytes,
            committed_at,
        };
        let sealed = superblock::seal(&*self.ctx.provider, &next.key, &header, &body);
        let slot = self.active_slot.other();
        if let Err(e) = self.ctx.medium.write_superblock(slot, &sealed) {
            return self.poison("writing the superblock", e);
        }
        self.sync("syncing the superblock")?;
        // 5. Only now replace the key in the vault: this is the commit point.
        if let Err(e) = self.vault.store(&next) {
            let why = e.to_string();
            return match self.vault.load() {
                Ok(now) if now.epoch == next.epoch && now.key == next.key => {
                    self.finish_commit(next, slot, new_log);
                    self.committed_at = committed_at;
                    Ok(())
                }
                // The vault still holds the current key: the epoch stays open,
                // the intent log keeps every flushed write, a retry will commit.
                Ok(now) if now.epoch == self.epoch && now.key == self.epoch_key => {
                    Err(Error::Vault(e))
                }
                _ => {
                    self.vault_unknown = Some((next, slot, new_log, why.clone()));
                    Err(Error::VaultStateUnknown(why))
                }
            };
        }
        self.finish_commit(next, slot, new_log);
        self.committed_at = committed_at;
        Ok(())
    }

    pub(super) fn finish_commit(&mut self, next: VaultRecord, slot: Slot, new_log: SegmentId) {
        let old_log = self.log_segment;
        self.epoch = next.epoch;
        self.epoch_key = next.key;
        self.active_slot = slot;
        self.log_segment = new_log;
        self.log_offset = 0;
        self.log_seq = 0;
        self.pending.clear();
        self.stats = EpochStats::default();
        self.committed_at = now_secs();
        // Space only: the old log and unreachable segments are already unreadable.
        let mut doomed = std::mem::take(&mut self.doomed_segments);
        doomed.push(old_log);
        let _no_readers = self.ctx.io_guard.write().unwrap_or_else(|p| p.into_inner());
        for seg in doomed {
            if Some(seg) != self.data_segment.map(|(s, _)| s) {
                let _ = self.ctx.medium.delete_segment(seg);
            }
        }
    }
}
