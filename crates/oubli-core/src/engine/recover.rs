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
            next_segment: 1,
            log_segment: 0,
            live_bytes: 0,
            committed_at: now_secs(),
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
        Ok(store)
    }

    /// Opens a store: loads the vault, picks the superblock of the vault's
    /// epoch, replays the intent log, and (unless read-only) commits what it
    /// replayed so that a fresh log starts.
    pub fn open(medium: Arc<dyn Medium>, vault: Arc<dyn Vault>, options: Options) -> Result<Store> {
        let record = vault.load()?;
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
                chosen = Some((slot, body));
            }
        }
        let (slot, body) = match chosen {
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
        let segment_target = DATA_SEGMENT_TARGET.min(medium.segment_capacity());
        let mut engine = Engine {
            ctx: Ctx {
                medium,
                provider,
                scheme: options.key_scheme.clone(),
                cache: RefCell::new(NodeCache::with_limit(options.node_cache_bytes)),
                io_guard: Arc::new(RwLock::new(())),
            },
            vault,
            store_id: record.store_id,
            epoch: record.epoch,
            epoch_key: record.key.clone(),
            active_slot: slot,
            cell_size: body.cell_size,
            tree: Tree {
                root: body.root.map(|(ptr, level)| (Child::Disk(ptr), level)),
            },
            next_oid: body.next_oid,
            next_segment,
            data_segment: None,
            segment_target,
            log_segment: body.log_segment,
            log_offset: 0,
            log_seq: 0,
            pending: Vec::new(),
            unsynced: false,
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
            size_dirty: BTreeSet::new(),
            live_bytes: body.live_bytes,
            stats: EpochStats::default(),
            policy: options.policy.clone(),
            committed_at: body.committed_at,
            read_only: options.read_only,
            poisoned: None,
            vault_unknown: None,
            last_commit_error: None,
            doomed_segments: Vec::new(),
            vault_failure: options.vault_failure,
            cleaner: options.cleaner,
            vault_down: None,
        };
        let replayed = engine.replay_log()?;
        if replayed > 0 && !engine.read_only {
            engine.commit()?;
        }
        let shared = Shared {
            medium: engine.ctx.medium.clone(),
            provider: engine.ctx.provider.clone(),
            scheme: engine.ctx.scheme.clone(),
            cell_size: engine.cell_size,
            io_guard: engine.ctx.io_guard.clone(),
        };
        Ok(Store {
            engine: Mutex::new(engine),
            shared,
        })
    }
}

impl Engine {
    /// Replays this epoch's intent log; returns the number of batches applied.
    pub(super) fn replay_log(&mut self) -> Result<u64> {
        let medium = self.ctx.medium.clone();
        let mut applied = 0;
        loop {
            let mut len = [0u8; 4];
            if medium
                .read(self.log_segment, self.log_offset, &mut len)
                .is_err()
            {
                break;
            }
            let len = u32::from_le_bytes(len) as u64;
            if len < TAG_LEN as u64 || len > medium.segment_capacity() {
                break;
            }
            let mut sealed = vec![0u8; len as usize];
            if medium
                .read(self.log_segment, self.log_offset + 4, &mut sealed)
                .is_err()
            {
                break;
            }
            let Some(ops) = log::open_frame(
                &*self.ctx.provider,
                &self.epoch_key,
                &self.store_id,
                self.epoch,
                self.log_seq,
                sealed,
            ) else {
                // A frame that does not authenticate is normally the torn tail
                // of the last, unacknowledged flush, and the log ends there.
                // If the frame after it opens, it was not the tail: an
                // acknowledged batch was damaged, and that must be reported.
                if self.next_frame_opens(self.log_offset + 4 + len, self.log_seq + 1) {
                    return Err(Error::Corrupt(format!(
                        "intent log batch {} of epoch {} (segment {} offset {})",
                        self.log_seq, self.epoch, self.log_segment, self.log_offset
                    )));
                }
                break;
            };
            for op in ops {
                self.apply(op, false)?;
            }
            self.log_offset += 4 + len;
            self.log_seq += 1;
            applied += 1;
        }
        Ok(applied)
    }

    pub(super) fn next_frame_opens(&self, offset: u64, seq: u64) -> bool {
        let medium = &self.ctx.medium;
        let mut len = [0u8; 4];
        if medium.read(self.log_segment, offset, &mut len).is_err() {
            return false;
        }
        let len = u32::from_le_bytes(len) as u64;
        if len < TAG_LEN as u64 || len > medium.segment_capacity() {
            return false;
        }
        let mut sealed = vec![0u8; len as usize];
        medium
            .read(self.log_segment, offset + 4, &mut sealed)
            .is_ok()
            && log::open_frame(
                &*self.ctx.provider,
                &self.epoch_key,
                &self.store_id,
                self.epoch,
                seq,
                sealed,
            )
            .is_some()
    }
}
