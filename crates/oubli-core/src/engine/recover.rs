//! Creating and opening a store: the vault's epoch picks the superblock, the intent log is replayed (DESIGN §6).

use super::*;

impl Store {
    /// Creates a new store on an empty medium. `make_vault` receives the
    /// first vault record and must create the vault holding it (for
    /// instance `FileVault::create`). The superblock is written first, the
    /// vault second: a crash in between leaves a store that reports its vault
    /// missing, never a vault without a store.
    pub fn create<V, F>(
        medium: Arc<dyn Medium>,
        make_vault: F,
        create: CreateOptions,
        options: Options,
    ) -> Result<Store>
    where
        V: Vault + 'static,
        F: FnOnce(&VaultRecord) -> Result<V>,
    {
        if !oubli_crypto::SCHEME_NAMES
            .iter()
            .any(|(_, id)| *id == create.key_scheme)
        {
            return Err(Error::UnknownKeyScheme(create.key_scheme));
        }
        if !create.cell_size.is_power_of_two() || !(4096..=1 << 20).contains(&create.cell_size) {
            return Err(Error::Invalid(format!(
                "cell size {} must be a power of two between 4 KiB and 1 MiB",
                create.cell_size
            )));
        }
        for slot in [Slot::A, Slot::B] {
            let existing = medium
                .read_superblock(slot)
                .map_err(|e| Error::io("reading superblock", e))?;
            if existing.is_some_and(|b| superblock::parse_header(&b).ok().flatten().is_some()) {
                return Err(Error::AlreadyInitialized(medium.describe()));
            }
        }
        let provider = options.provider.clone();
        let mut store_id = [0u8; 16];
        provider.fill_random(&mut store_id);
        let record = VaultRecord {
            store_id,
            epoch: 0,
            key: provider.random_key(),
        };
        let header = Header {
            version: FORMAT_VERSION,
            store_id,
            epoch: 0,
        };
        let body = Body {
            cell_size: create.cell_size,
            root: None,
            next_oid: ROOT_DIR + 1,
            // The first commit (below, in this function) replaces this log
            // before anything is written to it.
            next_segment: 2,
            log_segment: 0,
            log_tally: Some(1),
            live_bytes: 0,
            committed_at: now_secs(),
            catalog: None,
            key_scheme: create.key_scheme,
            scheme_state: None,
        };
        let sealed = superblock::seal(&*provider, &record.key, &header, &body);
        medium
            .write_superblock(Slot::A, &sealed)
            .and_then(|_| medium.sync())
            .map_err(|e| Error::io("writing the first superblock", e))?;
        let vault: Arc<dyn Vault> = Arc::new(make_vault(&record)?);
        let store = Store::open(medium, vault, options)?;
        {
            let mut e = store.lock();
            e.apply(
                Op::SetObject {
                    oid: ROOT_DIR,
                    record: ObjectRecord::default(),
                },
                true,
            )?;
            e.commit()?;
        }
        store.shared.reclaimer.wait_idle();
        Ok(store)
    }

    /// Opens a store: loads the vault, picks the superblock of the vault's
    /// epoch, replays the intent log, and (unless read-only) commits what it
    /// replayed so that a fresh log starts.
    pub fn open(medium: Arc<dyn Medium>, vault: Arc<dyn Vault>, options: Options) -> Result<Store> {
        let record = vault.load()?;
        // A rotation cut between its two steps left an older key readable:
        // destroy it before anything else, whatever this open is for.
        let leftover_error = vault.erase_leftovers().err();
        let provider = options.provider.clone();
        let mut found = Vec::new();
        let mut chosen = None;
        let mut any_ours = false;
        for slot in [Slot::A, Slot::B] {
            let Some(bytes) = medium
                .read_superblock(slot)
                .map_err(|e| Error::io("reading superblock", e))?
            else {
                continue;
            };
            let Some((header, _)) = superblock::parse_header(&bytes)? else {
                continue;
            };
            if header.store_id != record.store_id {
                continue;
            }
            any_ours = true;
            found.push(header.epoch);
            if header.epoch == record.epoch {
                let (_, body) = superblock::open(&*provider, &record.key, &bytes)?;
                chosen = Some((slot, (header.version, body)));
            }
        }
        let (slot, (header_version, body)) = match chosen {
            Some(c) => c,
            None if found.is_empty() && !any_ours => {
                let any = [Slot::A, Slot::B].iter().any(|s| {
                    medium
                        .read_superblock(*s)
                        .ok()
                        .flatten()
                        .is_some_and(|b| superblock::parse_header(&b).ok().flatten().is_some())
                });
                return Err(if any {
                    Error::WrongVault
                } else {
                    Error::NotInitialized(medium.describe())
                });
            }
            None if found.iter().all(|&e| e < record.epoch) => {
                return Err(Error::Rollback {
                    found,
                    vault: record.epoch,
                })
            }
            None => {
                return Err(Error::VaultBehind {
                    found,
                    vault: record.epoch,
                })
            }
        };
        let existing = medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?;
        let next_segment = existing
            .last()
            .map(|s| s + 1)
            .unwrap_or(0)
            .max(body.next_segment);
        let segment_target = space::segment_target(&*medium);
        // The store's own scheme (the options' one only picks it at create).
        let (scheme, scheme_state_units) = crate::scheme_state::load(
            &*medium,
            provider.clone(),
            &record.key,
            &record.store_id,
            record.epoch,
            &body,
        )?;
        let ctx = Ctx {
            medium,
            provider,
            scheme,
            cache: RefCell::new(NodeCache::with_limit(options.node_cache_bytes)),
            io_guard: Arc::new(RwLock::new(())),
        };
        let tree = Tree::on_medium(body.root.clone());
        let mut engine = Engine::new(ctx, vault, record, slot, body.cell_size, tree);
        engine.next_oid = body.next_oid;
        engine.next_segment = next_segment;
        engine.segment_target = segment_target;
        engine.log = body.log_place(header_version);
        engine.tally_cadence = options.tally;
        engine.small_writes_buffered = options.small_writes_buffered;
        engine.pending_ops_max = options.pending_ops_max;
        engine.live_bytes = body.live_bytes;
        engine.scheme_state_units = scheme_state_units;
        engine.policy = options.policy.clone();
        engine.committed_at = body.committed_at;
        engine.read_only = options.read_only;
        engine.can_rewrite = !options.read_only && engine.ctx.medium.can_rewrite();
        engine.vault_failure = options.vault_failure;
        engine.cleaner = options.cleaner;
        engine.dirty_tree_cap = options.dirty_tree_bytes;
        engine.background_commits = options.background_commits;
        if let Some(catalog) = &body.catalog {
            engine.load_catalog(catalog)?;
        }
        if let Some(e) = leftover_error {
            // Not fatal: the store opens, `status` and `audit` say that the
            // previous epoch is not erased yet, and every commit retries.
            engine.vault_leftover = Some(VaultLeftover {
                epochs: engine.leftover_epochs().unwrap_or_default(),
                why: e.to_string(),
                since: std::time::Instant::now(),
            });
        }
        let log_exists = engine.replay_log()?;
        // A commit at once puts what was replayed in the tree and starts a
        // fresh log: the old one may end in a torn frame that nothing can be
        // appended after. A format-1 epoch is upgraded the same way.
        if !engine.read_only && (log_exists || engine.log.format == LogFormat::V1) {
            match engine.commit() {
                // Committed, but an older vault record could not be
                // destroyed: not fatal to the open (step 1's rule), the
                // leftover is recorded for `status`, `audit` and retries.
                Err(Error::ErasureIncomplete { .. }) => {}
                // Another program filled the medium: the store opens with
                // the replayed log in memory (and still on the medium),
                // reads work, and changes answer `NoSpace` until a commit
                // lands once there is room (DESIGN §7, "A full medium").
                Err(Error::NoSpace(why)) => engine.full_at_open = Some(why),
                other => other?,
            }
        }
        // The recovery commit's deletions are done before the store is
        // handed out: opening is one step, whose I/O ends when it returns.
        engine.reclaimer.wait_idle();
        let shared = Shared {
            medium: engine.ctx.medium.clone(),
            provider: engine.ctx.provider.clone(),
            scheme: engine.ctx.scheme.clone(),
            cell_size: engine.cell_size,
            io_guard: engine.ctx.io_guard.clone(),
            reclaimer: engine.reclaimer.clone(),
            rewrites: engine.rewrites.clone(),
        };
        Ok(Store::around(engine, shared))
    }
}

impl Engine {
    /// An engine on `tree` at the vault's epoch, with nothing pending and
    /// default settings; [`Store::open`] sets the rest from the superblock.
    pub(super) fn new(
        ctx: Ctx,
        vault: Arc<dyn Vault>,
        record: VaultRecord,
        slot: Slot,
        cell_size: u32,
        tree: Tree,
    ) -> Engine {
        let segment_target = space::segment_target(&*ctx.medium);
        let reclaimer = Arc::new(reclaim::Reclaimer::new(
            ctx.medium.clone(),
            ctx.io_guard.clone(),
        ));
        Engine {
            ctx,
            vault,
            store_id: record.store_id,
            epoch: record.epoch,
            epoch_key: record.key,
            active_slot: slot,
            cell_size,
            tree,
            next_oid: ROOT_DIR + 1,
            next_segment: 0,
            data_segment: None,
            segment_target,
            log: LogPlace {
                segment: 0,
                tally: None,
                format: LogFormat::V3,
            },
            log_offset: 0,
            tally_offset: 0,
            log_seq: 0,
            log_holds_cells: false,
            owed_flush: None,
            log_reserved: 0,
            frame_cells: None,
            tally_cadence: TallyCadence::default(),
            tally_counts: 0,
            tally_written_at: std::time::Instant::now(),
            pending: Vec::new(),
            unsynced: false,
            appends: 0,
            flushes_begun: 0,
            flushed_through: 0,
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
            write_ends: HashMap::new(),
            size_dirty: BTreeMap::new(),
            size_stamp: 0,
            live_bytes: 0,
            stats: EpochStats::default(),
            policy: EpochPolicy::default(),
            committed_at: 0,
            read_only: false,
            poisoned: None,
            full_at_open: None,
            vault_unknown: None,
            vault_leftover: None,
            last_commit_error: None,
            doomed_segments: Vec::new(),
            cleaning: None,
            reclaimer,
            vault_failure: VaultFailurePolicy::default(),
            cleaner: CleanerPolicy::default(),
            dirty_tree_cap: Options::default().dirty_tree_bytes,
            dirty_nodes_measured: 0,
            vault_down: None,
            snapshots: BTreeMap::new(),
            catalog_unit: None,
            scheme_state_units: Vec::new(),
            shares: BTreeMap::new(),
            share_keys: RefCell::new(HashMap::new()),
            share_opener: None,
            share_leftovers: RefCell::default(),
            snapshot_generation: 0,
            committing: false,
            flushing: false,
            in_flight_covers: None,
            background_commits: false,
            commit_requested: None,
            closing: false,
            unnamed_from: 0,
            unnamed_segments: Vec::new(),
            copied: BTreeMap::new(),
            pending_puts: HashMap::new(),
            can_rewrite: false,
            rewrites: Arc::new(AtomicU64::new(0)),
            units_rewritten: 0,
            cells_split: 0,
            cells_rejoined: 0,
            small_writes_buffered: SMALL_WRITES_BUFFERED,
            pending_ops_max: PENDING_OPS_MAX,
            space: Default::default(),
        }
    }

    /// Replays this epoch's intent log onto the tree; returns whether the
    /// log segment exists (a flush was at least started in this epoch).
    /// A batch the log's tally counts as acknowledged that is missing or
    /// damaged is an integrity failure, never a shorter log.
    pub(super) fn replay_log(&mut self) -> Result<bool> {
        let keys = LogKeys {
            provider: &*self.ctx.provider,
            epoch_key: &self.epoch_key,
            store_id: &self.store_id,
            epoch: self.epoch,
        };
        let read = log::read_log(&*self.ctx.medium, &self.log, &keys);
        if let Some(damage) = read.damage {
            return Err(Error::LogDamaged(damage));
        }
        self.log_seq = read.batches.len() as u64;
        self.log_offset = read.end;
        self.tally_offset = read.tally_end;
        self.tally_counts = read.acknowledged;
        for batch in read.batches {
            for op in batch {
                // A cell a format-6 frame carried: the commit that follows
                // must keep the log segment.
                if let Op::PutCell { cref, .. } = &op {
                    self.log_holds_cells |= addr_segment(cref.addr) == self.log.segment;
                }
                self.apply(op, false)?;
            }
        }
        Ok(read.exists)
    }
}
