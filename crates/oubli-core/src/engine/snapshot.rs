//! Snapshots: create (keep the live root), remove (drop a root: erased at the next commit), read (a read-only store on a kept root), redact (erase objects from every snapshot) and space accounting.

use super::*;
use crate::catalog::{Catalog, CATALOG_AAD};
use crate::snapshot::{check_name, SnapshotRecord};

/// A snapshot held by the engine: its record and the tree it keeps (clean,
/// except between a redaction or a cleaner run and the next commit).
#[derive(Clone)]
pub(super) struct Snapshot {
    pub(super) record: SnapshotRecord,
    pub(super) tree: Tree,
}

impl Snapshot {
    pub(super) fn new(record: SnapshotRecord) -> Snapshot {
        let tree = Tree::on_medium(record.root.clone());
        Snapshot { record, tree }
    }
}

/// A snapshot as `oubli snapshot ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The epoch in which it was taken.
    pub epoch: u64,
    /// When retention removes it (seconds since the Unix epoch).
    pub expires_at: Option<u64>,
}

/// The space a snapshot holds (sealed bytes of cells and nodes on the medium).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotUsage {
    pub name: String,
    /// Bytes that only this snapshot reaches: what removing it frees (and erases).
    pub unique_bytes: u64,
    /// Bytes it shares with the live store or another snapshot.
    pub shared_bytes: u64,
}

fn info(s: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        name: s.name.clone(),
        created_at: s.created_at,
        epoch: s.epoch,
        expires_at: s.expires_at,
    }
}

impl Store {
    /// Takes a snapshot of the whole store as it is now (every object and
    /// name, flushed writes and buffered ones alike). Costs what changed
    /// since the last commit, never the store's size: the live tree's
    /// changed nodes are written and its root is kept; no vault write.
    pub fn snapshot_create(&self, name: &str, expires_at: Option<u64>) -> Result<SnapshotInfo> {
        check_name(name).map_err(Error::Invalid)?;
        let mut e = self.lock();
        e.mutable()?;
        if e.snapshots.contains_key(name) {
            return Err(Error::Exists(format!("snapshot {name}")));
        }
        e.write_out_all()?;
        let root = e.persist_live_tree()?;
        // The nodes the record names are durable before the log frame that holds it.
        e.sync("syncing tree nodes for a snapshot")?;
        let record = SnapshotRecord {
            name: name.to_string(),
            created_at: now_secs(),
            epoch: e.epoch,
            expires_at,
            root,
        };
        e.apply_durably(Op::PutSnapshot {
            snapshot: record.clone(),
        })?;
        Ok(info(&record))
    }

    /// Every snapshot, in name order.
    pub fn snapshots(&self) -> Vec<SnapshotInfo> {
        self.lock()
            .snapshots
            .values()
            .map(|s| info(&s.record))
            .collect()
    }

    /// Removes a snapshot: at the next commit, every unit that only it
    /// reached is unrecoverable. Nothing the live store or another snapshot
    /// needs is touched. Durable when this returns.
    pub fn snapshot_remove(&self, name: &str) -> Result<()> {
        let mut e = self.lock();
        e.mutable()?;
        if !e.snapshots.contains_key(name) {
            return Err(Error::NoSnapshot(name.to_string()));
        }
        e.apply_durably(Op::DropSnapshot {
            name: name.to_string(),
        })?;
        e.maybe_commit();
        Ok(())
    }

    /// Removes a snapshot and commits: what only it held is unrecoverable
    /// when this returns (`oubli snapshot rm --purge`). One durability point
    /// instead of two: the removal is not written to the intent log first,
    /// since the commit's superblock holds it. If the commit fails, the
    /// removal stays pending (logged at the next flush) and the error says so.
    pub fn snapshot_remove_and_commit(&self, name: &str) -> Result<()> {
        let mut e = self.lock();
        e.drop_snapshot(name)?;
        e.commit()
    }

    /// Removes every snapshot whose expiry time is at or before `now`;
    /// returns their names.
    pub fn expire_snapshots(&self, now: u64) -> Result<Vec<String>> {
        let expired: Vec<String> = self
            .snapshots()
            .into_iter()
            .filter(|s| s.expires_at.is_some_and(|t| t <= now))
            .map(|s| s.name)
            .collect();
        for name in &expired {
            self.snapshot_remove(name)?;
        }
        Ok(expired)
    }

    /// A read-only store showing the snapshot `name`: every read of the
    /// front-ends (objects, names, data, extents) works on it. It shares the
    /// medium with this store; a removed snapshot's view fails its reads
    /// once the cleaner has reclaimed the space (an error, never wrong data).
    pub fn snapshot(&self, name: &str) -> Result<Store> {
        let e = self.lock();
        let snap = e
            .snapshots
            .get(name)
            .ok_or_else(|| Error::NoSnapshot(name.to_string()))?;
        let view = e.read_only_view(snap.tree.clone());
        let reclaimer = view.reclaimer.clone();
        // A snapshot's tree names no unit that may be rewritten in place.
        let rewrites = view.rewrites.clone();
        Ok(Store::around(
            view,
            Shared {
                medium: self.shared.medium.clone(),
                provider: self.shared.provider.clone(),
                scheme: self.shared.scheme.clone(),
                cell_size: self.shared.cell_size,
                io_guard: self.shared.io_guard.clone(),
                reclaimer,
                rewrites,
            },
        ))
    }

    /// A number that changes whenever a view from [`Store::snapshot`] may
    /// be stale: a snapshot taken, removed or redacted, a share created or
    /// destroyed, the cleaner run, a commit that rewrote snapshot trees. A
    /// front-end that keeps views (the mount's `.snapshots`) drops them when
    /// it changes, so that nothing removed, redacted or destroyed stays
    /// readable through a view's cached keys.
    pub fn snapshot_generation(&self) -> u64 {
        self.lock().snapshot_generation
    }

    /// The snapshots in which object `oid` exists.
    pub fn snapshots_holding(&self, oid: u64) -> Result<Vec<String>> {
        let e = self.lock();
        let mut out = Vec::new();
        for (name, s) in &e.snapshots {
            if s.tree.get(&object_key(oid), &e.ctx)?.is_some() {
                out.push(name.clone());
            }
        }
        Ok(out)
    }

    /// The object `name` names in directory `dir` of each snapshot that has it.
    pub fn lookup_in_snapshots(&self, dir: u64, name: &[u8]) -> Result<Vec<(String, u64)>> {
        let e = self.lock();
        let hash = name_hash(name);
        let mut out = Vec::new();
        for (snap, s) in &e.snapshots {
            if let Some(Value::Names(b)) = s.tree.get(&Key::new(dir, KIND_NAMES, hash), &e.ctx)? {
                if let Some((_, t)) = b.entries.iter().find(|(n, _)| n == name) {
                    out.push((snap.clone(), *t));
                }
            }
        }
        Ok(out)
    }

    /// Erases objects from every snapshot: their data, records and every
    /// name that points at them, in each snapshot that holds them (the
    /// snapshots stay otherwise intact). The live store is the caller's to
    /// change. Returns the snapshots that held any of them. Durable when
    /// this returns; unrecoverable after the next commit.
    pub fn redact_snapshots(&self, oids: &[u64]) -> Result<Vec<String>> {
        let mut e = self.lock();
        e.mutable()?;
        let mut holding = BTreeSet::new();
        for (name, s) in &e.snapshots {
            for &oid in oids {
                if s.tree.get(&object_key(oid), &e.ctx)?.is_some() {
                    holding.insert(name.clone());
                }
            }
        }
        if holding.is_empty() {
            return Ok(Vec::new());
        }
        e.apply_durably(Op::RedactSnapshots {
            oids: oids.to_vec(),
        })?;
        e.maybe_commit();
        Ok(holding.into_iter().collect())
    }

    /// The bytes each snapshot holds alone and shares (a walk of every
    /// retained tree: it costs the metadata of the store times the
    /// number of snapshots, read from the medium or the node cache).
    pub fn snapshot_usage(&self) -> Result<Vec<SnapshotUsage>> {
        let e = self.lock();
        // Unit address → (sealed bytes, how many roots reach it, the last one that did).
        let mut units: HashMap<u64, (u64, u32, usize)> = HashMap::new();
        let mut totals = vec![0u64; e.snapshots.len()];
        for (i, tree) in e.roots().enumerate() {
            e.each_unit(tree, &mut |at, len| {
                let u = units.entry(at).or_insert((len, 0, i));
                u.1 += 1;
                u.2 = i;
                if i > 0 {
                    totals[i - 1] += len;
                }
            })?;
        }
        let mut unique = vec![0u64; e.snapshots.len()];
        for (len, owners, last) in units.values() {
            if *owners == 1 && *last > 0 {
                unique[last - 1] += len;
            }
        }
        Ok(e.snapshots
            .keys()
            .enumerate()
            .map(|(i, name)| SnapshotUsage {
                name: name.clone(),
                unique_bytes: unique[i],
                shared_bytes: totals[i] - unique[i],
            })
            .collect())
    }
}

impl Engine {
    /// Applies `op`, a change to the catalog (a snapshot taken, removed or
    /// redacted, a share created), and makes it durable in a frame of its
    /// own, for a call that is durable when it returns. A call that answers
    /// `NoSpace` must have changed nothing (DESIGN §7, "A full medium"):
    /// what was accepted before goes to the medium first, so that its
    /// `NoSpace` comes before `op` is applied; should the medium then have
    /// no room for the frame, `op` is taken back, the frame never having
    /// reached the medium. A frame that did reach it is made durable
    /// instead (its tally record waits for the next flush): the call then
    /// succeeds.
    pub(super) fn apply_durably(&mut self, op: Op) -> Result<()> {
        self.flush()?;
        let before = (
            self.snapshots.clone(),
            self.shares.clone(),
            self.stats.clone(),
            (self.log_offset, self.log_seq),
            (self.tally_offset, self.tally_counts, self.tally_written_at),
        );
        // Nothing buffered is left: the frame holds the op alone, no cells.
        let alone = self.dirty.is_empty() && self.pending.is_empty();
        self.apply(op.clone(), true)?;
        let full = match self.flush() {
            Err(e @ Error::NoSpace(_)) if alone => e,
            other => return other,
        };
        let (snapshots, shares, stats, log, tally) = before;
        let taken_back = match &self.owed_flush {
            Some(plan) if plan.frame_unwritten() => {
                self.owed_flush = None;
                (self.log_offset, self.log_seq) = log;
                (self.tally_offset, self.tally_counts, self.tally_written_at) = tally;
                true
            }
            Some(_) => {
                // The frame is on the medium: replay finds it once synced.
                return self
                    .ctx
                    .medium
                    .sync()
                    .or_else(|e| self.medium_failed("syncing the intent log", e));
            }
            // The log was full and the commit that was to hold the op
            // found no room: the op waits in `pending`.
            None if (self.log_offset, self.log_seq) == log && self.pending.last() == Some(&op) => {
                self.pending.pop();
                self.pending_moved();
                true
            }
            None => false,
        };
        if taken_back {
            self.snapshots = snapshots;
            self.shares = shares;
            self.stats = stats;
            self.snapshot_generation += 1;
        }
        Err(full)
    }

    fn drop_snapshot(&mut self, name: &str) -> Result<()> {
        self.mutable()?;
        if !self.snapshots.contains_key(name) {
            return Err(Error::NoSnapshot(name.to_string()));
        }
        self.apply(
            Op::DropSnapshot {
                name: name.to_string(),
            },
            true,
        )
    }

    /// Writes the live tree's changed nodes under fresh keys (children
    /// first); returns its root. Used by every commit and by snapshots.
    pub(super) fn persist_live_tree(&mut self) -> Result<Option<(NodePtr, u8)>> {
        let mut tree = std::mem::take(&mut self.tree);
        let root = self.persist_tree(&mut tree, true);
        self.tree = tree;
        root
    }

    /// Writes a tree's changed nodes; `live`: they count as live bytes (a
    /// snapshot's nodes are accounted by [`Store::snapshot_usage`]).
    pub(super) fn persist_tree(
        &mut self,
        tree: &mut Tree,
        live: bool,
    ) -> Result<Option<(NodePtr, u8)>> {
        // The nodes written below name every unit the tree reaches: none
        // may be rewritten in place from now on.
        self.name_units();
        tree.persist(&mut |node: &Arc<Node>| {
            let mut bytes = encode_node(node);
            let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
            self.ctx
                .provider
                .seal(&key, &node_aad(node.level()), &mut bytes);
            let at = self.append_unit(&bytes)?;
            if live {
                self.live_bytes += bytes.len() as u64;
            }
            self.ctx
                .cache
                .borrow_mut()
                .insert(at, node.clone(), node.mem_bytes());
            Ok(NodePtr {
                addr: at,
                len: bytes.len() as u32,
                key: key_ref,
            })
        })
    }

    /// Persists every snapshot's changed nodes and seals the catalog
    /// (snapshots and shares) under a fresh key; `None` when it is empty.
    /// Written at every commit that has either, so the superblock always
    /// names a catalog that holds exactly those of its epoch.
    pub(super) fn persist_catalog(&mut self) -> Result<Option<NodePtr>> {
        if self.snapshots.is_empty() && self.shares.is_empty() {
            self.catalog_unit = None;
            return Ok(None);
        }
        self.snapshot_generation += 1;
        let mut snapshots = std::mem::take(&mut self.snapshots);
        let mut result = Ok(());
        for s in snapshots.values_mut() {
            match self.persist_tree(&mut s.tree, false) {
                Ok(root) => s.record.root = root,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.snapshots = snapshots;
        result?;
        let catalog = Catalog {
            snapshots: self.snapshots.values().map(|s| s.record.clone()).collect(),
            shares: self.shares.values().cloned().collect(),
        };
        let mut bytes = catalog.encode();
        let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
        self.ctx.provider.seal(&key, CATALOG_AAD, &mut bytes);
        let at = self.append_unit(&bytes)?;
        let ptr = NodePtr {
            addr: at,
            len: bytes.len() as u32,
            key: key_ref,
        };
        self.catalog_unit = Some(ptr.clone());
        Ok(Some(ptr))
    }

    /// Loads the catalog a superblock names.
    pub(super) fn load_catalog(&mut self, unit: &NodePtr) -> Result<()> {
        let catalog = read_catalog(&self.ctx, unit)?;
        self.snapshots = catalog
            .snapshots
            .into_iter()
            .map(|r| (r.name.clone(), Snapshot::new(r)))
            .collect();
        self.shares = catalog.shares.into_iter().map(|s| (s.id, s)).collect();
        self.catalog_unit = Some(unit.clone());
        Ok(())
    }

    /// Applies a snapshot op (from a front-end call or the intent log).
    pub(super) fn apply_snapshot_op(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::PutSnapshot { snapshot } => {
                self.snapshots
                    .insert(snapshot.name.clone(), Snapshot::new(snapshot.clone()));
            }
            Op::DropSnapshot { name } => {
                if self.snapshots.remove(name).is_some() {
                    self.stats.deletions += 1;
                }
            }
            Op::RedactSnapshots { oids } => {
                let mut snapshots = std::mem::take(&mut self.snapshots);
                let mut outcome = Ok(false);
                for s in snapshots.values_mut() {
                    match redact_tree(&mut s.tree, oids, &self.ctx) {
                        Ok(changed) => outcome = outcome.map(|any| any || changed),
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
                self.snapshots = snapshots;
                if outcome? {
                    self.stats.deletions += 1;
                }
            }
            _ => unreachable!("not a snapshot op"),
        }
        Ok(())
    }

    /// An engine that reads `tree` and writes nothing (a snapshot's view).
    pub(super) fn read_only_view(&self, tree: Tree) -> Engine {
        let ctx = Ctx {
            medium: self.ctx.medium.clone(),
            provider: self.ctx.provider.clone(),
            scheme: self.ctx.scheme.clone(),
            cache: RefCell::new(NodeCache::with_limit(self.ctx.cache.borrow().limit)),
            io_guard: self.ctx.io_guard.clone(),
        };
        let mut view = Engine::new(
            ctx,
            self.vault.clone(),
            VaultRecord {
                store_id: self.store_id,
                epoch: self.epoch,
                key: self.epoch_key.clone(),
            },
            self.active_slot,
            self.cell_size,
            tree,
        );
        view.read_only = true;
        view.shares = self.shares.clone();
        view.share_keys = RefCell::new(self.share_keys.borrow().clone());
        view.share_opener = self.share_opener.clone();
        view.next_oid = self.next_oid;
        view.committed_at = self.committed_at;
        view
    }
}

/// Reads and opens the sealed catalog.
pub(crate) fn read_catalog(ctx: &Ctx, unit: &NodePtr) -> Result<Catalog> {
    let what = || {
        format!(
            "catalog of snapshots and shares at segment {} offset {}",
            addr_segment(unit.addr),
            addr_offset(unit.addr)
        )
    };
    let key = ctx
        .scheme
        .resolve(&unit.key)
        .map_err(|e| Error::Corrupt(format!("{}: {e}", what())))?;
    let plain = crate::unit::open_unit(
        &*ctx.medium,
        &*ctx.provider,
        &key,
        unit.addr,
        unit.len as u64,
        CATALOG_AAD,
        &what,
    )?;
    Catalog::decode(&plain).map_err(|e| Error::Corrupt(format!("{} ({e})", what())))
}

/// Removes the objects `oids` (every entry of theirs) and every name that
/// points at one from `tree`; returns whether anything was removed. The
/// nodes it path-copies are shared with other roots, so nothing is
/// released: the space is accounted when the cleaner traces every root.
fn redact_tree(tree: &mut Tree, oids: &[u64], ctx: &Ctx) -> Result<bool> {
    let mut doomed = Vec::new();
    for &oid in oids {
        tree.scan(
            &object_key(oid),
            &Key::new(oid + 1, 0, 0),
            ctx,
            &mut |k, _| {
                doomed.push(*k);
                true
            },
        )?;
    }
    let mut buckets = Vec::new();
    tree.scan(
        &Key::MIN,
        &Key::new(u64::MAX, u8::MAX, u64::MAX),
        ctx,
        &mut |k, v| {
            if let Value::Names(b) = v {
                if b.entries.iter().any(|(_, t)| oids.contains(t)) {
                    let mut kept = b.clone();
                    kept.entries.retain(|(_, t)| !oids.contains(t));
                    buckets.push((*k, kept));
                }
            }
            true
        },
    )?;
    let changed = !doomed.is_empty() || !buckets.is_empty();
    let mut freed = Vec::new();
    for k in doomed {
        tree.remove(&k, ctx, &mut freed)?;
    }
    for (k, bucket) in buckets {
        if bucket.entries.is_empty() {
            tree.remove(&k, ctx, &mut freed)?;
        } else {
            tree.insert(k, Value::Names(bucket), ctx, &mut freed)?;
        }
    }
    Ok(changed)
}
