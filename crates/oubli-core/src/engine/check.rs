//! Looking at a store: status, fsck, the audit (the adversary against this store) and key-tree overhead.

use super::*;
use crate::audit::AuditReport;

/// A snapshot of the store's state for `oubli status`.
#[derive(Debug, Clone)]
pub struct Status {
    pub epoch: u64,
    pub committed_at: u64,
    pub seconds_since_commit: u64,
    /// Deletions (unlinks, truncates, overwrites, punches) since the last commit: erased at the next one.
    pub pending_deletions: u64,
    /// Sealed bytes those deletions freed.
    pub pending_erasure_bytes: u64,
    pub bytes_written_this_epoch: u64,
    pub live_bytes: u64,
    pub medium_bytes: u64,
    pub dead_bytes: u64,
    pub segments: usize,
    pub unflushed_bytes: u64,
    pub vault: VaultInfo,
    pub vault_writes: Option<u64>,
    pub cell_size: u32,
    pub provider: &'static str,
    pub key_scheme: &'static str,
    /// The key scheme's own figures (state size, forest roots).
    pub key_scheme_stats: oubli_crypto::SchemeStats,
    pub policy: EpochPolicy,
    /// Seconds until the interval policy commits, if it is set.
    pub next_commit_in: Option<u64>,
    /// Why the last automatic commit failed (the epoch stays open and is retried).
    pub last_commit_error: Option<String>,
    /// Epochs whose key the vault still holds besides the current one: a
    /// rotation stopped between writing the new key and destroying the old.
    /// Their deletions are recoverable until the vault erases them (retried
    /// at every commit and open): "erasure incomplete".
    pub vault_leftover_epochs: Vec<u64>,
    /// Why the vault could not destroy them.
    pub vault_leftover_error: Option<String>,
    /// Share vaults this process found holding an older record they could
    /// not destroy ([`Store::share_leftovers`] opens them all to look).
    pub share_leftovers: Vec<ShareLeftover>,
    /// Snapshots kept: deletions in the live store do not erase what they hold.
    pub snapshots: usize,
    pub medium: String,
    /// The automatic cleaner's run in progress, if any.
    pub cleaner: Option<CleanerProgress>,
    /// Segments the cleaner emptied, deleted when the next commit lands.
    pub segments_awaiting_commit: usize,
    /// Units written over in place since the store was opened, instead of
    /// appended (DESIGN §7, "Overwrites in place").
    pub units_rewritten: u64,
    /// Large cells split into small ones since the store was opened (a
    /// write at random into a streamed file), and split cells put back
    /// whole by a write over all of them (DESIGN §3, "Split cells").
    pub cells_split: u64,
    pub cells_rejoined: u64,
    /// The medium's size, free space and the reserve kept for deletes,
    /// commits and the cleaner (`None`: the medium cannot tell, or did not
    /// answer).
    pub space: Option<crate::SpaceInfo>,
}

/// How far the automatic cleaner's run has got (the changes carry it out,
/// a slice each, and the timer finishes it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanerProgress {
    /// Segments it empties.
    pub victims: usize,
    /// Live bytes copied out of them so far (cells several roots share count once).
    pub bytes_moved: u64,
    /// Live bytes they held when the run started.
    pub bytes_to_move: u64,
}

/// What fsck found.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    pub objects: u64,
    pub cells: u64,
    pub nodes: u64,
    pub bytes_checked: u64,
    pub problems: Vec<String>,
}

/// Metadata of the key tree relative to the data it protects.
#[derive(Debug, Clone, Default)]
pub struct Overhead {
    pub nodes: u64,
    pub node_bytes: u64,
    pub cells: u64,
    pub data_bytes: u64,
    pub tag_bytes: u64,
}

impl Overhead {
    /// (node bytes + AEAD tags) / data bytes, in percent.
    pub fn percent(&self) -> f64 {
        if self.data_bytes == 0 {
            return 0.0;
        }
        100.0 * (self.node_bytes + self.tag_bytes) as f64 / self.data_bytes as f64
    }
}

impl Store {
    pub fn status(&self) -> Result<Status> {
        self.lock().status()
    }

    /// Every live object id with its record, ascending.
    pub fn objects(&self) -> Result<Vec<(u64, ObjectRecord)>> {
        let e = self.lock();
        let mut out = Vec::new();
        e.tree.scan(
            &Key::MIN,
            &Key::new(u64::MAX, u8::MAX, u64::MAX),
            &e.ctx,
            &mut |k, v| {
                if let Value::Object(r) = v {
                    out.push((k.oid, r.clone()));
                }
                true
            },
        )?;
        Ok(out)
    }

    /// Checks the whole store: every node and every cell reachable from the
    /// root is read and authenticated, and the structure is consistent.
    pub fn fsck(&self, progress: &mut dyn FnMut(u64)) -> Result<FsckReport> {
        self.lock().fsck(progress)
    }

    /// Plays the adversary against this store's medium with the current vault
    /// content: opens everything it can and sorts it into live units, units
    /// deleted since the last commit (erased at the next one) and leaks.
    pub fn audit(&self) -> Result<AuditReport> {
        self.audit_with(&[], &[])
    }

    /// [`audit`](Self::audit) with more for the adversary: old copies of the
    /// medium (backups, snapshots, what an SSD kept) and old vault records. A
    /// unit is live if the current tree still references its key (the cleaner
    /// moves units without changing their key), pending if it comes from the
    /// current epoch, and leaked otherwise.
    pub fn audit_with(
        &self,
        copies: &[Arc<dyn Medium>],
        old_keys: &[VaultRecord],
    ) -> Result<AuditReport> {
        let e = self.lock();
        // Live: what the live tree or a snapshot still holds.
        let mut live: Vec<[u8; 32]> = Vec::new();
        for tree in e.roots() {
            tree.walk(&e.ctx, &mut |_, node| {
                if let Node::Leaf(entries) = node {
                    for (_, v) in entries {
                        if let Value::Cell(c) = v {
                            live.push(*c.key.expose());
                        }
                    }
                }
                Ok(())
            })?;
        }
        let mut live = Zeroizing::new(live);
        live.sort_unstable();
        // The adversary reads the vault's whole content: any older key a
        // rotation left behind comes with the current one.
        let mut keys = e.vault.readable_records()?;
        let vault_leftovers: Vec<u64> = keys.iter().skip(1).map(|r| r.epoch).collect();
        keys.extend(old_keys.iter().cloned());
        let mut report = AuditReport::default();
        let mut epochs = BTreeSet::new();
        // (key, epoch) of every unit opened, from every medium; a unit copied
        // by the cleaner or present in several copies counts once.
        let mut opened: Zeroizing<Vec<([u8; 32], u64)>> = Zeroizing::new(Vec::new());
        let media = std::iter::once(e.ctx.medium.clone()).chain(copies.iter().cloned());
        for medium in media {
            let mut superblocks = Vec::new();
            for slot in [Slot::A, Slot::B] {
                if let Some(b) = medium
                    .read_superblock(slot)
                    .map_err(|err| Error::io("reading superblock", err))?
                {
                    superblocks.push(b);
                }
            }
            // The shares this process holds open: their data is live, not lost.
            let share_keys: Vec<(u32, SecretKey)> = e
                .share_keys
                .borrow()
                .iter()
                .map(|(id, k)| (*id, k.clone()))
                .collect();
            let recovery = crate::audit::recover_with_shares(
                &superblocks,
                medium,
                &keys,
                &share_keys,
                e.ctx.provider.clone(),
            );
            epochs.extend(recovery.epochs_opened.iter().copied());
            report.unreadable_units += recovery.failures;
            for u in &recovery.units {
                let epoch = u.source.epoch();
                opened.push((*u.key.expose(), epoch));
            }
        }
        // Newest epoch first, so a unit still in the current epoch is judged by it.
        opened.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        opened.dedup_by(|a, b| a.0 == b.0);
        for (key, epoch) in opened.iter() {
            report.units_opened += 1;
            if live.binary_search(key).is_ok() {
                report.live_units += 1;
            } else if *epoch == e.epoch {
                report.pending_units += 1;
            } else {
                report.leaked_units += 1;
            }
        }
        report.epochs_opened = epochs.into_iter().collect();
        report.vault_leftover_epochs = vault_leftovers;
        Ok(report)
    }

    /// The record the vault holds now (read, not changed): certificates of
    /// sanitization commit to its digest before and after a commit.
    pub fn vault_record(&self) -> Result<VaultRecord> {
        let vault = self.lock().vault.clone();
        Ok(vault.load()?)
    }

    /// Key-tree metadata accounting (for the overhead benchmark).
    pub fn overhead(&self) -> Result<Overhead> {
        let e = self.lock();
        let mut o = Overhead::default();
        e.tree.walk(&e.ctx, &mut |ptr, node| {
            if let Some(p) = ptr {
                o.node_bytes += p.len as u64;
            }
            o.nodes += 1;
            if let Node::Leaf(entries) = node {
                for (_, v) in entries {
                    if let Value::Cell(c) = v {
                        o.data_bytes += c.len as u64;
                        o.tag_bytes += TAG_LEN as u64;
                        o.cells += 1;
                    }
                }
            }
            Ok(())
        })?;
        Ok(o)
    }
}

impl Engine {
    pub(super) fn status(&self) -> Result<Status> {
        let medium = &self.ctx.medium;
        let segments = medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?
            .into_iter()
            .filter(|&s| !self.reclaimer.is_unfinished(s))
            .count();
        let medium_bytes = self.medium_bytes()?;
        let since = now_secs().saturating_sub(self.committed_at);
        Ok(Status {
            epoch: self.epoch,
            committed_at: self.committed_at,
            seconds_since_commit: since,
            pending_deletions: self.stats.deletions + self.stats.overwrites,
            pending_erasure_bytes: self.stats.freed_bytes,
            bytes_written_this_epoch: self.stats.bytes_written,
            live_bytes: self.live_bytes,
            medium_bytes,
            dead_bytes: medium_bytes.saturating_sub(self.live_bytes),
            segments,
            unflushed_bytes: self.dirty_bytes as u64,
            vault: self.vault.info(),
            vault_writes: self.vault.write_count().ok(),
            cell_size: self.cell_size,
            provider: self.ctx.provider.name(),
            key_scheme: self.ctx.scheme.name(),
            key_scheme_stats: self.ctx.scheme.stats(),
            policy: self.policy.clone(),
            next_commit_in: self
                .policy
                .interval
                .map(|i| i.as_secs().saturating_sub(since)),
            last_commit_error: self.last_commit_error.clone(),
            vault_leftover_epochs: self
                .vault_leftover
                .as_ref()
                .map(|l| l.epochs.clone())
                .unwrap_or_default(),
            vault_leftover_error: self.vault_leftover.as_ref().map(|l| l.why.clone()),
            share_leftovers: self.known_share_leftovers(),
            snapshots: self.snapshots.len(),
            medium: medium.describe(),
            cleaner: self.cleaning.as_ref().map(|run| run.progress()),
            segments_awaiting_commit: self.doomed_segments.len(),
            units_rewritten: self.units_rewritten,
            cells_split: self.cells_split,
            cells_rejoined: self.cells_rejoined,
            space: self.space_now().ok().flatten(),
        })
    }

    pub(super) fn fsck(&self, progress: &mut dyn FnMut(u64)) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        // Units shared by several roots (the live tree, snapshots) are read once.
        let mut seen = HashSet::new();
        let names = std::iter::once(String::new()).chain(self.snapshots.keys().cloned());
        for (tree, snapshot) in self.roots().zip(names) {
            let within = |what: String| match snapshot.as_str() {
                "" => what,
                s => format!("{what} (in snapshot {s})"),
            };
            let mut cells = Vec::new();
            let mut sizes = HashMap::new();
            let mut cell_sizes = HashMap::new();
            tree.walk(&self.ctx, &mut |ptr, node| {
                match ptr {
                    Some(p) if !seen.insert(p.addr) => {}
                    Some(p) => {
                        report.nodes += 1;
                        report.bytes_checked += p.len as u64;
                    }
                    None => report.nodes += 1,
                }
                if let Node::Leaf(entries) = node {
                    for (k, v) in entries {
                        match v {
                            Value::Object(r) => {
                                if snapshot.is_empty() {
                                    report.objects += 1;
                                }
                                sizes.insert(k.oid, r.size);
                            }
                            Value::Cell(c) => cells.push((k.oid, k.off, c.clone())),
                            Value::CellSize(s) => {
                                cell_sizes.insert(k.oid, u64::from(*s));
                            }
                            Value::Names(_) | Value::Share(_) => {}
                        }
                    }
                }
                Ok(())
            })?;
            // A split cell's small cells never live beside the cell itself (`split.rs`).
            let whole: HashSet<(u64, u64)> = cells
                .iter()
                .filter(|(_, cell, _)| *cell < crate::unit::SPLIT_CELLS)
                .map(|(oid, cell, _)| (*oid, *cell))
                .collect();
            for (oid, cell, c) in cells {
                let object_cells = cell_sizes
                    .get(&oid)
                    .copied()
                    .unwrap_or(self.cell_size as u64);
                // The cell's own span: the object's cells, or a small cell of a split one.
                let (at, cs) = crate::unit::cell_span(cell, object_cells as u32);
                let cs = u64::from(cs);
                if cell >= crate::unit::SPLIT_CELLS && object_cells <= cs {
                    report.problems.push(within(format!(
                        "object {oid} has split cells but no larger cells to split"
                    )));
                }
                if cell >= crate::unit::SPLIT_CELLS && whole.contains(&(oid, at / object_cells)) {
                    report.problems.push(within(format!(
                        "object {oid} holds byte {at} both in a cell and in a split cell's small cell"
                    )));
                }
                if c.start as u64 + c.len as u64 > cs {
                    report.problems.push(within(format!(
                        "cell {cell} of object {oid} is longer than its cells ({cs} B)"
                    )));
                }
                match sizes.get(&oid) {
                    None => report.problems.push(within(format!(
                        "cell {cell} belongs to missing object {oid}"
                    ))),
                    Some(size) if at + c.start as u64 >= *size => report.problems.push(within(
                        format!("cell {cell} of object {oid} lies beyond its size {size}"),
                    )),
                    _ => {}
                }
                if !seen.insert(c.addr) {
                    continue;
                }
                report.cells += 1;
                match self.read_cell_in(tree, oid, cell, &c) {
                    // Erased on purpose: not damage.
                    Ok(_) | Err(Error::ShareDestroyed(_)) => {}
                    Err(e) => report.problems.push(within(e.to_string())),
                }
                report.bytes_checked += c.sealed_len();
                progress(c.sealed_len());
            }
        }
        Ok(report)
    }
}
