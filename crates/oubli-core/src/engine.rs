//! The store: objects and names on the key tree, the write buffer, flush (intent log), commit (epochs), recovery and the cleaner.

use crate::audit::{AuditReport, Source};
use crate::error::{read_error, Error, Result};
use crate::log::{self, Op};
use crate::medium::{Medium, SegmentId, Slot};
use crate::superblock::{self, Body, Header, FORMAT_VERSION};
use crate::tree::{
    addr, addr_offset, addr_segment, encode_node, CellRef, Child, Key, NameBucket, Node, NodePtr,
    NodeSource, ObjectRecord, Tree, Value, KIND_CELL, KIND_NAMES, KIND_OBJECT,
};
use crate::vault::{StoreId, Vault, VaultInfo, VaultRecord};
use oubli_crypto::{
    wipe, CryptoProvider, KeyRef, KeyScheme, ParentPointerScheme, PlainBuf, RingProvider,
    SecretKey, TAG_LEN,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeroize::Zeroizing;

/// Object id of the root directory every store has.
pub const ROOT_DIR: u64 = 1;
/// Default cell size: the unit of encryption and erasure for object data.
pub const DEFAULT_CELL_SIZE: u32 = 32 * 1024;
/// Data segments are closed at this size (or the medium's capacity, if smaller).
const DATA_SEGMENT_TARGET: u64 = 64 << 20;
/// Buffered (not yet sealed) data above which the buffer is written out.
const WRITE_BUFFER_MAX: usize = 32 << 20;

/// When an epoch ends on its own. `None` disables a trigger; `purge`/`commit` always work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochPolicy {
    pub interval: Option<Duration>,
    pub bytes: Option<u64>,
    pub deletions: Option<u64>,
}

impl Default for EpochPolicy {
    fn default() -> Self {
        EpochPolicy {
            interval: Some(Duration::from_secs(60)),
            bytes: Some(1 << 30),
            deletions: Some(1000),
        }
    }
}

impl EpochPolicy {
    /// Commit only when asked.
    pub fn manual() -> Self {
        EpochPolicy {
            interval: None,
            bytes: None,
            deletions: None,
        }
    }
}

/// How a store is opened.
#[derive(Clone)]
pub struct Options {
    pub provider: Arc<dyn CryptoProvider>,
    pub key_scheme: Arc<dyn KeyScheme>,
    pub policy: EpochPolicy,
    /// Open without writing anything: no recovery commit, mutations refused.
    pub read_only: bool,
    /// Bytes of decrypted tree nodes kept in memory.
    pub node_cache_bytes: usize,
    /// What to do when the vault cannot take a commit.
    pub vault_failure: VaultFailurePolicy,
    /// When the store reclaims space by itself.
    pub cleaner: CleanerPolicy,
}

/// When the store runs the cleaner by itself: right after a commit its
/// epoch policy triggered (never in a store committed only by hand), when
/// dead bytes are both a large share and a large amount. A run holds the
/// engine lock, so it copies a bounded amount of live data and costs two
/// more commits (two vault writes: mind a TPM's endurance).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanerPolicy {
    /// Clean once dead bytes exceed this share of the medium's bytes...
    pub dead_share: f64,
    /// ...and this many bytes. `u64::MAX` turns the cleaner off.
    pub min_dead_bytes: u64,
    /// Segments whose live share is under this are emptied (their live units copied).
    pub threshold: f64,
    /// At most this many live bytes are copied per run; emptiest segments first.
    pub max_move_bytes: u64,
}

impl Default for CleanerPolicy {
    fn default() -> Self {
        CleanerPolicy {
            dead_share: 0.5,
            min_dead_bytes: 256 << 20,
            threshold: 0.5,
            max_move_bytes: 128 << 20,
        }
    }
}

impl CleanerPolicy {
    /// Never clean automatically (`oubli gc` still does).
    pub fn off() -> Self {
        CleanerPolicy {
            min_dead_bytes: u64::MAX,
            ..Self::default()
        }
    }
}

/// What the store does when the vault is unreachable at commit time
/// (token unplugged, TPM error). Nothing is lost either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VaultFailurePolicy {
    /// Keep the epoch open and retry at the next trigger: writes go on and
    /// are durable; deletions stay recoverable until a commit succeeds
    /// (`status` says so).
    #[default]
    KeepEpochOpen,
    /// Refuse new changes (`Error::WritesRefused`) until a commit succeeds:
    /// nothing more is deleted — or written — while erasure cannot happen.
    RefuseWrites,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            provider: Arc::new(RingProvider::new()),
            key_scheme: Arc::new(ParentPointerScheme),
            policy: EpochPolicy::default(),
            read_only: false,
            node_cache_bytes: 64 << 20,
            vault_failure: VaultFailurePolicy::default(),
            cleaner: CleanerPolicy::default(),
        }
    }
}

/// Parameters fixed when a store is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    pub cell_size: u32,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            cell_size: DEFAULT_CELL_SIZE,
        }
    }
}

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
    pub policy: EpochPolicy,
    /// Seconds until the interval policy commits, if it is set.
    pub next_commit_in: Option<u64>,
    /// Why the last automatic commit failed (the epoch stays open and is retried).
    pub last_commit_error: Option<String>,
    pub medium: String,
}

/// What a cleaner run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: usize,
    pub bytes_reclaimed: u64,
    pub bytes_moved: u64,
}

/// The store. All methods take `&self`. One lock serialises changes to the
/// tree; sealing of whole cells and the reading and opening of units happen
/// outside it, so several threads encrypt and decrypt in parallel.
pub struct Store {
    engine: Mutex<Engine>,
    shared: Shared,
}

/// What never changes while a store is open, usable without the engine lock.
struct Shared {
    medium: Arc<dyn Medium>,
    provider: Arc<dyn CryptoProvider>,
    scheme: Arc<dyn KeyScheme>,
    cell_size: u32,
    /// Readers outside the engine lock hold it shared; deleting a segment
    /// takes it exclusively, so a unit never vanishes under a reader.
    io_guard: Arc<RwLock<()>>,
}

/// A whole cell sealed before taking the engine lock.
/// The whole cells of one write, sealed before the engine lock is taken and
/// laid out back to back (ciphertext ‖ tag per cell) so they are appended to
/// the medium in one piece.
struct SealedRun {
    first_cell: u64,
    /// `key_refs.len()` units of `cell_size + TAG_LEN` bytes each.
    bytes: Vec<u8>,
    key_refs: Vec<KeyRef>,
}

/// Below this many units, a read or write does its crypto on the calling thread.
const PARALLEL_MIN_UNITS: usize = 8;

fn crypto_threads(units: usize) -> usize {
    if units < PARALLEL_MIN_UNITS {
        return 1;
    }
    // Asked once: each call reads the cgroup files again.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    cores.min(4).min(units / (PARALLEL_MIN_UNITS / 2)).max(1)
}

/// A unit a read must open after the engine lock is released.
struct PendingRead {
    oid: u64,
    cell: u64,
    cref: CellRef,
    /// Where in the output the first byte of the cell unit would go (may be negative).
    out_at: i64,
}

/// Everything the tree needs to load a node: the read-only context of the engine.
pub(crate) struct Ctx {
    pub(crate) medium: Arc<dyn Medium>,
    pub(crate) provider: Arc<dyn CryptoProvider>,
    pub(crate) scheme: Arc<dyn KeyScheme>,
    pub(crate) cache: RefCell<NodeCache>,
    pub(crate) io_guard: Arc<RwLock<()>>,
}

#[derive(Default)]
pub(crate) struct NodeCache {
    map: HashMap<u64, (Arc<Node>, usize)>,
    order: VecDeque<u64>,
    bytes: usize,
    pub(crate) limit: usize,
}

impl NodeCache {
    fn get(&self, addr: u64) -> Option<Arc<Node>> {
        self.map.get(&addr).map(|(n, _)| n.clone())
    }
    fn insert(&mut self, addr: u64, node: Arc<Node>, size: usize) {
        if self.map.insert(addr, (node, size)).is_none() {
            self.order.push_back(addr);
            self.bytes += size;
        }
        while self.bytes > self.limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, s)) = self.map.remove(&old) {
                self.bytes -= s;
            }
        }
    }
}

pub(crate) fn node_aad(level: u8) -> Vec<u8> {
    let mut aad = b"oubli/node/v1".to_vec();
    aad.push(level);
    aad
}

pub(crate) fn cell_aad(oid: u64, cell: u64, start: u32, len: u32) -> Vec<u8> {
    let mut aad = b"oubli/cell/v1".to_vec();
    aad.extend_from_slice(&oid.to_le_bytes());
    aad.extend_from_slice(&cell.to_le_bytes());
    aad.extend_from_slice(&start.to_le_bytes());
    aad.extend_from_slice(&len.to_le_bytes());
    aad
}

/// Names a cell unit in an error message.
fn cell_what(p: &PendingRead, cell_size: u32) -> String {
    describe_cell(p.oid, p.cell, &p.cref, cell_size)
}

fn describe_cell(oid: u64, cell: u64, c: &CellRef, cell_size: u32) -> String {
    format!(
        "data of object {oid} at byte {} (segment {} offset {})",
        cell * cell_size as u64 + c.start as u64,
        addr_segment(c.addr),
        addr_offset(c.addr)
    )
}

/// Reads, authenticates and decrypts one data cell.
fn open_cell_unit(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    scheme: &dyn KeyScheme,
    cell_size: u32,
    oid: u64,
    cell: u64,
    c: &CellRef,
) -> Result<PlainBuf> {
    let key = scheme.resolve(&c.key);
    open_unit(
        medium,
        provider,
        &key,
        c.addr,
        c.sealed_len(),
        &cell_aad(oid, cell, c.start, c.len),
        &|| describe_cell(oid, cell, c, cell_size),
    )
}

/// Reads and authenticates one sealed unit.
pub(crate) fn open_unit(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    key: &SecretKey,
    at: u64,
    sealed_len: u64,
    aad: &[u8],
    what: &dyn Fn() -> String,
) -> Result<PlainBuf> {
    let mut buf = PlainBuf::zeroed(sealed_len as usize);
    medium
        .read(addr_segment(at), addr_offset(at) as u64, &mut buf)
        .map_err(|e| read_error(&what(), e))?;
    let len = provider
        .open_in_place(key, aad, &mut buf)
        .map_err(|_| Error::Corrupt(what()))?;
    buf.truncate(len);
    Ok(buf)
}

impl NodeSource for Ctx {
    fn load(&self, ptr: &NodePtr, level: u8) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.borrow().get(ptr.addr) {
            return Ok(node);
        }
        let key = self.scheme.resolve(&ptr.key);
        let what = || {
            format!(
                "tree node (level {level}) at segment {} offset {}",
                addr_segment(ptr.addr),
                addr_offset(ptr.addr)
            )
        };
        let plain = open_unit(
            &*self.medium,
            &*self.provider,
            &key,
            ptr.addr,
            ptr.len as u64,
            &node_aad(level),
            &what,
        )?;
        let node = crate::tree::decode_node(&plain)
            .map_err(|e| Error::Corrupt(format!("{} ({e})", what())))?;
        if node.level() != level {
            return Err(Error::Corrupt(what()));
        }
        let node = Arc::new(node);
        self.cache
            .borrow_mut()
            .insert(ptr.addr, node.clone(), ptr.len as usize);
        Ok(node)
    }
}

/// The opened old content of a cell a write merges into, read before the
/// engine lock was taken; used only if the tree still points at `addr`.
struct Prefetched {
    cell: u64,
    addr: u64,
    plain: PlainBuf,
}

/// Plaintext of one cell waiting to be sealed: bytes `[start, start+data.len())` of the cell.
struct DirtyCell {
    start: u32,
    data: PlainBuf,
}

#[derive(Default)]
struct EpochStats {
    bytes_written: u64,
    deletions: u64,
    freed_bytes: u64,
}

struct Engine {
    ctx: Ctx,
    vault: Arc<dyn Vault>,
    store_id: StoreId,
    epoch: u64,
    epoch_key: SecretKey,
    active_slot: Slot,
    cell_size: u32,
    tree: Tree,
    next_oid: u64,
    next_segment: SegmentId,
    /// Current data segment and its write position.
    data_segment: Option<(SegmentId, u64)>,
    segment_target: u64,
    log_segment: SegmentId,
    log_offset: u64,
    log_seq: u64,
    /// Ops applied to the tree but not yet in the log.
    pending: Vec<Op>,
    /// Units appended since the last sync.
    unsynced: bool,
    dirty: BTreeMap<(u64, u64), DirtyCell>,
    dirty_bytes: usize,
    /// Objects whose size grew by writes; their record is logged at the next flush.
    size_dirty: BTreeSet<u64>,
    live_bytes: u64,
    stats: EpochStats,
    policy: EpochPolicy,
    committed_at: u64,
    read_only: bool,
    /// Set when a medium write failed: the in-memory state may be ahead of
    /// the medium, so mutations are refused until the store is reopened.
    poisoned: Option<String>,
    /// A commit whose vault write may or may not have happened.
    vault_unknown: Option<(VaultRecord, Slot, SegmentId, String)>,
    last_commit_error: Option<String>,
    /// Segments to delete once the next commit has made them unreachable.
    doomed_segments: Vec<SegmentId>,
    vault_failure: VaultFailurePolicy,
    cleaner: CleanerPolicy,
    /// Under [`VaultFailurePolicy::RefuseWrites`]: why and since when the
    /// vault could not take a commit.
    vault_down: Option<(String, std::time::Instant)>,
}

/// How often a refused write retries the commit the vault failed.
const VAULT_RETRY: Duration = Duration::from_secs(5);

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// FNV-1a: the name hash that orders directory entries inside the (encrypted) tree.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn object_key(oid: u64) -> Key {
    Key::new(oid, KIND_OBJECT, 0)
}
fn cell_key(oid: u64, cell: u64) -> Key {
    Key::new(oid, KIND_CELL, cell)
}

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
                cache: RefCell::new(NodeCache {
                    limit: options.node_cache_bytes,
                    ..Default::default()
                }),
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

    fn lock(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock leaves the engine in an unknown state;
        // refuse further use rather than continue on it.
        match self.engine.lock() {
            Ok(g) => g,
            Err(poison) => {
                let mut g = poison.into_inner();
                g.poisoned
                    .get_or_insert_with(|| "a previous operation panicked".into());
                g
            }
        }
    }

    /// Creates an empty object with front-end metadata; returns its id.
    pub fn create_object(&self, meta: &[u8]) -> Result<u64> {
        let mut e = self.lock();
        e.mutable()?;
        let oid = e.next_oid;
        e.apply(
            Op::SetObject {
                oid,
                record: ObjectRecord {
                    size: 0,
                    meta: meta.to_vec(),
                },
            },
            true,
        )?;
        Ok(oid)
    }

    /// The object's record (size and metadata).
    pub fn object(&self, oid: u64) -> Result<ObjectRecord> {
        self.lock().record(oid)
    }

    pub fn exists(&self, oid: u64) -> Result<bool> {
        let e = self.lock();
        Ok(e.tree.get(&object_key(oid), &e.ctx)?.is_some())
    }

    pub fn size(&self, oid: u64) -> Result<u64> {
        Ok(self.lock().record(oid)?.size)
    }

    /// Replaces the object's front-end metadata.
    pub fn set_meta(&self, oid: u64, meta: &[u8]) -> Result<()> {
        let mut e = self.lock();
        e.mutable()?;
        let mut record = e.record(oid)?;
        record.meta = meta.to_vec();
        e.size_dirty.remove(&oid);
        e.apply(Op::SetObject { oid, record }, true)
    }

    /// Writes `data` at `offset`, extending the object if needed. The old
    /// bytes of an overwritten range are erased at the next commit.
    pub fn write(&self, oid: u64, offset: u64, data: &[u8]) -> Result<()> {
        let sealed = self.seal_whole_cells(oid, offset, data);
        let mut prefetched = Vec::new();
        let mut e = self.lock();
        // The old content of a partly overwritten cell (at most the first and
        // the last of the write) is read and opened without the lock, so
        // writers to other cells and readers go on meanwhile. A writer that
        // replaces the cell in between makes the merge read it again, under
        // the lock; one retry here keeps that rare.
        for _ in 0..2 {
            let wanted = e.cells_to_merge(oid, offset, data.len() as u64, &prefetched)?;
            if wanted.is_empty() {
                break;
            }
            let guard = self
                .shared
                .io_guard
                .read()
                .unwrap_or_else(|p| p.into_inner());
            drop(e);
            let sh = &self.shared;
            for (cell, c) in wanted {
                let plain = open_cell_unit(
                    &*sh.medium,
                    &*sh.provider,
                    &*sh.scheme,
                    sh.cell_size,
                    oid,
                    cell,
                    &c,
                )?;
                prefetched.retain(|p: &Prefetched| p.cell != cell);
                prefetched.push(Prefetched {
                    cell,
                    addr: c.addr,
                    plain,
                });
            }
            drop(guard);
            e = self.lock();
        }
        e.write(oid, offset, data, sealed, &mut prefetched)?;
        e.maybe_commit();
        Ok(())
    }

    /// Seals every whole, aligned cell of a write under a fresh key, before
    /// the engine lock is taken, on several threads for large writes.
    fn seal_whole_cells(&self, oid: u64, offset: u64, data: &[u8]) -> Option<SealedRun> {
        let cs = self.shared.cell_size as usize;
        let first = offset.div_ceil(cs as u64);
        let end = offset.checked_add(data.len() as u64)?;
        let count = (end / cs as u64).checked_sub(first).filter(|&n| n > 0)? as usize;
        let unit = cs + TAG_LEN;
        let mut keys = Vec::with_capacity(count);
        let mut key_refs = Vec::with_capacity(count);
        for _ in 0..count {
            let (key, key_ref) = self.shared.scheme.allocate(&*self.shared.provider);
            keys.push(key);
            key_refs.push(key_ref);
        }
        let mut bytes = vec![0u8; count * unit];
        let skip = (first * cs as u64 - offset) as usize;
        let seal = |units: &mut [u8], index: usize| {
            for (k, sealed) in units.chunks_mut(unit).enumerate() {
                let i = index + k;
                let (body, tag) = sealed.split_at_mut(cs);
                body.copy_from_slice(&data[skip + i * cs..skip + (i + 1) * cs]);
                let cell = first + i as u64;
                tag.copy_from_slice(&self.shared.provider.seal_detached(
                    &keys[i],
                    &cell_aad(oid, cell, 0, cs as u32),
                    body,
                ));
            }
        };
        let threads = crypto_threads(count);
        if threads == 1 {
            seal(&mut bytes, 0);
        } else {
            let per = count.div_ceil(threads);
            std::thread::scope(|scope| {
                for (t, part) in bytes.chunks_mut(per * unit).enumerate() {
                    let seal = &seal;
                    scope.spawn(move || seal(part, t * per));
                }
            });
        }
        Some(SealedRun {
            first_cell: first,
            bytes,
            key_refs,
        })
    }

    /// Opens `units` (ascending cells of one read) into `out`, whose first
    /// byte is byte `base` of the whole read. Units contiguous on the medium
    /// are read with one call and opened in place.
    fn open_units(&self, out: &mut [u8], base: i64, units: &[PendingRead]) -> Result<()> {
        const MAX_RUN: u64 = 8 << 20;
        let sh = &self.shared;
        let mut i = 0;
        while i < units.len() {
            let start = units[i].cref.addr;
            let mut end = start + units[i].cref.sealed_len();
            let mut j = i + 1;
            while j < units.len()
                && units[j].cref.addr == end
                && addr_segment(end) == addr_segment(start)
                && end - start < MAX_RUN
            {
                end += units[j].cref.sealed_len();
                j += 1;
            }
            // Ciphertext only: units that lie wholly inside the output are
            // decrypted there, so no plaintext is left in this buffer.
            let mut buf = vec![0u8; (end - start) as usize];
            sh.medium
                .read(addr_segment(start), addr_offset(start) as u64, &mut buf)
                .map_err(|e| read_error(&cell_what(&units[i], sh.cell_size), e))?;
            let mut at = 0;
            for p in &units[i..j] {
                let sealed = &mut buf[at..at + p.cref.sealed_len() as usize];
                at += sealed.len();
                let key = sh.scheme.resolve(&p.cref.key);
                let aad = cell_aad(p.oid, p.cell, p.cref.start, p.cref.len);
                let corrupt = || Error::Corrupt(cell_what(p, sh.cell_size));
                let dst = p.out_at - base;
                let len = p.cref.len as usize;
                if dst >= 0 && dst as usize + len <= out.len() {
                    let (ct, tag) = sealed.split_at(len);
                    let target = &mut out[dst as usize..dst as usize + len];
                    target.copy_from_slice(ct);
                    let tag: &[u8; TAG_LEN] = tag.try_into().expect("tag length");
                    sh.provider
                        .open_detached(&key, &aad, target, tag)
                        .map_err(|_| corrupt())?;
                    continue;
                }
                // A unit cut by the ends of the read: opened where it lies
                // in the read buffer, copied out, and wiped there.
                let opened = sh.provider.open_in_place(&key, &aad, sealed);
                let Ok(len) = opened else {
                    wipe(sealed);
                    return Err(corrupt());
                };
                let lo = dst.max(0);
                let hi = (dst + len as i64).min(out.len() as i64);
                if lo < hi {
                    let src = (lo - dst) as usize;
                    out[lo as usize..hi as usize]
                        .copy_from_slice(&sealed[src..src + (hi - lo) as usize]);
                }
                wipe(sealed);
            }
            i = j;
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` (short at the end of the object).
    pub fn read(&self, oid: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        let (mut out, pending, _guard) = {
            let e = self.lock();
            let (out, pending) = e.plan_read(oid, offset, len)?;
            // Taken before the engine lock is released: no segment this read
            // needs can be deleted until it is done.
            let guard = self
                .shared
                .io_guard
                .read()
                .unwrap_or_else(|p| p.into_inner());
            (out, pending, guard)
        };
        let threads = crypto_threads(pending.len());
        if threads == 1 {
            self.open_units(&mut out, 0, &pending)?;
        } else {
            // Each thread opens a run of cells into its own part of the output.
            let per = pending.len().div_ceil(threads);
            let parts: Vec<&[PendingRead]> = pending.chunks(per).collect();
            std::thread::scope(|scope| -> Result<()> {
                let mut rest: &mut [u8] = &mut out;
                let mut base = 0i64;
                let mut handles = Vec::new();
                for (k, part) in parts.iter().enumerate() {
                    let end = match parts.get(k + 1) {
                        Some(next) => next[0].out_at.clamp(base, base + rest.len() as i64),
                        None => base + rest.len() as i64,
                    };
                    let (mine, tail) =
                        std::mem::take(&mut rest).split_at_mut((end - base) as usize);
                    let b = base;
                    handles.push(scope.spawn(move || self.open_units(mine, b, part)));
                    rest = tail;
                    base = end;
                }
                handles
                    .into_iter()
                    .try_for_each(|h| h.join().expect("crypto thread panicked"))
            })?;
        }
        Ok(out)
    }

    /// Sets the size; bytes past a smaller size are erased at the next commit.
    pub fn truncate(&self, oid: u64, size: u64) -> Result<()> {
        let mut e = self.lock();
        e.truncate(oid, size)?;
        e.maybe_commit();
        Ok(())
    }

    /// Zeroes `[offset, offset+len)` (deallocating whole cells); the old bytes are erased at the next commit.
    pub fn punch_hole(&self, oid: u64, offset: u64, len: u64) -> Result<()> {
        let mut e = self.lock();
        e.punch(oid, offset, len)?;
        e.maybe_commit();
        Ok(())
    }

    /// Deletes the object and all its data; erased at the next commit.
    pub fn delete(&self, oid: u64) -> Result<()> {
        let mut e = self.lock();
        e.delete(oid)?;
        e.maybe_commit();
        Ok(())
    }

    /// Adds `name` in directory object `dir` pointing at `target`.
    pub fn link(&self, dir: u64, name: &[u8], target: u64) -> Result<()> {
        let mut e = self.lock();
        e.mutable()?;
        e.record(dir)?;
        let hash = name_hash(name);
        let mut bucket = e.bucket(dir, hash)?;
        if bucket.entries.iter().any(|(n, _)| n == name) {
            return Err(Error::Exists(String::from_utf8_lossy(name).into_owned()));
        }
        bucket.entries.push((name.to_vec(), target));
        e.apply(Op::PutNames { dir, hash, bucket }, true)
    }

    /// Removes `name` from `dir`; returns the object it named (which is not deleted).
    pub fn unlink(&self, dir: u64, name: &[u8]) -> Result<u64> {
        let mut e = self.lock();
        e.mutable()?;
        let hash = name_hash(name);
        let mut bucket = e.bucket(dir, hash)?;
        let i = bucket
            .entries
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Error::NoName(String::from_utf8_lossy(name).into_owned()))?;
        let (_, target) = bucket.entries.remove(i);
        e.apply(Op::PutNames { dir, hash, bucket }, true)?;
        e.maybe_commit();
        Ok(target)
    }

    /// Moves `src_name` in `src_dir` to `dst_name` in `dst_dir` in one step
    /// (both changes land in the same intent-log batch). An existing
    /// `dst_name` is replaced only when `replace` is set; its target is
    /// returned (and not deleted: a front-end decides about links).
    pub fn rename(
        &self,
        src_dir: u64,
        src_name: &[u8],
        dst_dir: u64,
        dst_name: &[u8],
        replace: bool,
    ) -> Result<Option<u64>> {
        let mut e = self.lock();
        e.mutable()?;
        e.record(dst_dir)?;
        let src_hash = name_hash(src_name);
        let mut src_bucket = e.bucket(src_dir, src_hash)?;
        let i = src_bucket
            .entries
            .iter()
            .position(|(n, _)| n == src_name)
            .ok_or_else(|| Error::NoName(String::from_utf8_lossy(src_name).into_owned()))?;
        if src_dir == dst_dir && src_name == dst_name {
            return Ok(None);
        }
        let target = src_bucket.entries[i].1;
        let dst_hash = name_hash(dst_name);
        let mut dst_bucket = e.bucket(dst_dir, dst_hash)?;
        let replaced = match dst_bucket.entries.iter().position(|(n, _)| n == dst_name) {
            Some(_) if !replace => {
                return Err(Error::Exists(
                    String::from_utf8_lossy(dst_name).into_owned(),
                ))
            }
            Some(j) => Some(std::mem::replace(&mut dst_bucket.entries[j].1, target)),
            None => {
                dst_bucket.entries.push((dst_name.to_vec(), target));
                None
            }
        };
        if (src_dir, src_hash) == (dst_dir, dst_hash) {
            // Same bucket: apply both changes to one copy.
            let bucket = &mut dst_bucket;
            let k = bucket
                .entries
                .iter()
                .position(|(n, _)| n == src_name)
                .expect("source still present");
            bucket.entries.remove(k);
        } else {
            src_bucket.entries.remove(i);
            e.apply(
                Op::PutNames {
                    dir: src_dir,
                    hash: src_hash,
                    bucket: src_bucket,
                },
                true,
            )?;
        }
        e.apply(
            Op::PutNames {
                dir: dst_dir,
                hash: dst_hash,
                bucket: dst_bucket,
            },
            true,
        )?;
        e.maybe_commit();
        Ok(replaced)
    }

    pub fn lookup(&self, dir: u64, name: &[u8]) -> Result<Option<u64>> {
        let e = self.lock();
        let bucket = e.bucket(dir, name_hash(name))?;
        Ok(bucket
            .entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t))
    }

    /// Every (name, target) in `dir`, in hash order.
    pub fn list(&self, dir: u64) -> Result<Vec<(Vec<u8>, u64)>> {
        let e = self.lock();
        let mut out = Vec::new();
        e.tree.scan(
            &Key::new(dir, KIND_NAMES, 0),
            &Key::new(dir, KIND_NAMES + 1, 0),
            &e.ctx,
            &mut |_, v| {
                if let Value::Names(b) = v {
                    out.extend(b.entries.iter().cloned());
                }
                true
            },
        )?;
        Ok(out)
    }

    /// Replaces the epoch policy of an open store.
    pub fn set_policy(&self, policy: EpochPolicy) {
        self.lock().policy = policy;
    }

    /// The allocated ranges of `[offset, offset+len)` as `(start, length)`,
    /// ascending and merged; everything else reads as zeros (a hole).
    pub fn extents(&self, oid: u64, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let e = self.lock();
        let size = e.record(oid)?.size;
        let end = offset.saturating_add(len).min(size);
        let mut out: Vec<(u64, u64)> = Vec::new();
        if offset >= end {
            return Ok(out);
        }
        let cs = e.cell_size as u64;
        let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
        e.tree.scan(
            &cell_key(oid, offset / cs),
            &cell_key(oid, end.div_ceil(cs)),
            &e.ctx,
            &mut |k, v| {
                if let Value::Cell(c) = v {
                    ranges.insert(k.off * cs + c.start as u64, c.len as u64);
                }
                true
            },
        )?;
        for (&(_, cell), d) in e.dirty.range((oid, offset / cs)..(oid, end.div_ceil(cs))) {
            // A buffered cell replaces whatever the tree holds for it.
            ranges.retain(|&s, _| s / cs != cell);
            ranges.insert(cell * cs + d.start as u64, d.data.len() as u64);
        }
        for (s, l) in ranges {
            let (s, t) = (s.max(offset), (s + l).min(end));
            if s >= t {
                continue;
            }
            match out.last_mut() {
                Some((ps, pl)) if *ps + *pl == s => *pl += t - s,
                _ => out.push((s, t - s)),
            }
        }
        Ok(out)
    }

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

    pub fn status(&self) -> Result<Status> {
        self.lock().status()
    }

    /// Reclaims segments whose live share is below `threshold` (0..=1), copying their live units.
    pub fn gc(&self, threshold: f64) -> Result<GcReport> {
        self.lock().gc(threshold, u64::MAX)
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    pub fn store_id(&self) -> StoreId {
        self.lock().store_id
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
        let mut live: Vec<[u8; 32]> = Vec::new();
        e.tree.walk(&e.ctx, &mut |_, node| {
            if let Node::Leaf(entries) = node {
                for (_, v) in entries {
                    if let Value::Cell(c) = v {
                        live.push(*c.key.expose());
                    }
                }
            }
            Ok(())
        })?;
        let mut live = Zeroizing::new(live);
        live.sort_unstable();
        let mut keys = vec![e.vault.load()?];
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
            let recovery = crate::audit::recover(
                &superblocks,
                medium,
                &keys,
                e.ctx.provider.clone(),
                e.ctx.scheme.clone(),
            );
            epochs.extend(recovery.epochs_opened.iter().copied());
            report.unreadable_units += recovery.failures;
            for u in &recovery.units {
                let (Source::Tree(epoch) | Source::Log(epoch)) = u.source;
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
        Ok(report)
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

impl Drop for Store {
    /// Flushes buffered writes, like closing a file: dropping a store loses
    /// nothing that was written through it. Errors cannot be reported here;
    /// call [`Store::flush`] or [`Store::commit`] to see them.
    fn drop(&mut self) {
        let e = self.engine.get_mut().unwrap_or_else(|p| p.into_inner());
        if !e.read_only && e.poisoned.is_none() {
            let _ = e.flush();
        }
    }
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

impl Engine {
    fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if let Some(why) = &self.poisoned {
            return Err(Error::Io {
                context: format!(
                    "an earlier write to the medium failed ({why}); reopen the store to recover"
                ),
                source: std::io::Error::other("store poisoned"),
            });
        }
        Ok(())
    }

    /// [`writable`](Self::writable), and under the refuse-writes policy, no
    /// new change while the vault could not take the last commit: retries
    /// the commit (at most every few seconds) and accepts again once it lands.
    fn mutable(&mut self) -> Result<()> {
        self.writable()?;
        let Some((why, since)) = &self.vault_down else {
            return Ok(());
        };
        if since.elapsed() < VAULT_RETRY {
            return Err(Error::WritesRefused(why.clone()));
        }
        match self.commit() {
            Ok(()) => Ok(()),
            Err(e) => Err(Error::WritesRefused(e.to_string())),
        }
    }

    fn poison<T>(&mut self, context: &str, e: std::io::Error) -> Result<T> {
        self.poisoned = Some(format!("{context}: {e}"));
        Err(Error::io(context, e))
    }

    fn record(&self, oid: u64) -> Result<ObjectRecord> {
        match self.tree.get(&object_key(oid), &self.ctx)? {
            Some(Value::Object(r)) => Ok(r),
            _ => Err(Error::NoObject(oid)),
        }
    }

    fn bucket(&self, dir: u64, hash: u64) -> Result<NameBucket> {
        match self.tree.get(&Key::new(dir, KIND_NAMES, hash), &self.ctx)? {
            Some(Value::Names(b)) => Ok(b),
            _ => Ok(NameBucket::default()),
        }
    }

    /// Accounts for units that left the tree: their space is dead and the key scheme is told.
    fn release_nodes(&mut self, freed: Vec<NodePtr>) {
        for p in freed {
            self.live_bytes = self.live_bytes.saturating_sub(p.len as u64);
            self.ctx.scheme.release(&p.key);
        }
    }

    fn release_cell(&mut self, c: &CellRef) {
        self.live_bytes = self.live_bytes.saturating_sub(c.sealed_len());
        self.stats.freed_bytes += c.sealed_len();
        self.ctx.scheme.release(&c.key);
    }

    fn tree_insert(&mut self, key: Key, value: Value) -> Result<Option<Value>> {
        let mut freed = Vec::new();
        let old = self.tree.insert(key, value, &self.ctx, &mut freed)?;
        self.release_nodes(freed);
        Ok(old)
    }

    fn tree_remove(&mut self, key: &Key) -> Result<Option<Value>> {
        let mut freed = Vec::new();
        let old = self.tree.remove(key, &self.ctx, &mut freed)?;
        self.release_nodes(freed);
        Ok(old)
    }

    fn keys_in(&self, from: Key, to: Key) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        self.tree.scan(&from, &to, &self.ctx, &mut |k, _| {
            keys.push(*k);
            true
        })?;
        Ok(keys)
    }

    /// Applies one op to the tree (and queues it for the log when `log`).
    fn apply(&mut self, op: Op, log: bool) -> Result<()> {
        match &op {
            Op::PutCell { oid, cell, cref } => {
                // Counted here, not where it is appended, so replay counts it too.
                self.live_bytes += cref.sealed_len();
                if let Some(Value::Cell(old)) =
                    self.tree_insert(cell_key(*oid, *cell), Value::Cell(cref.clone()))?
                {
                    self.release_cell(&old);
                }
            }
            Op::DropCell { oid, cell } => {
                if let Some(Value::Cell(old)) = self.tree_remove(&cell_key(*oid, *cell))? {
                    self.release_cell(&old);
                    self.stats.deletions += 1;
                }
            }
            Op::DropCells { oid, from, to } => {
                // Only the cells that exist are visited: a discard of a huge,
                // mostly empty range costs what it removes.
                let doomed = self.keys_in(cell_key(*oid, *from), cell_key(*oid, *to))?;
                if !doomed.is_empty() {
                    self.stats.deletions += 1;
                }
                for k in doomed {
                    if let Some(Value::Cell(old)) = self.tree_remove(&k)? {
                        self.release_cell(&old);
                    }
                }
            }
            Op::SetObject { oid, record } => {
                self.next_oid = self.next_oid.max(oid + 1);
                self.tree_insert(object_key(*oid), Value::Object(record.clone()))?;
            }
            Op::DeleteObject { oid } => {
                self.stats.deletions += 1;
                for k in self.keys_in(object_key(*oid), Key::new(oid + 1, 0, 0))? {
                    if let Some(Value::Cell(old)) = self.tree_remove(&k)? {
                        self.release_cell(&old);
                    }
                }
            }
            Op::PutNames { dir, hash, bucket } => {
                let key = Key::new(*dir, KIND_NAMES, *hash);
                let old = if bucket.entries.is_empty() {
                    self.tree_remove(&key)?
                } else {
                    self.tree_insert(key, Value::Names(bucket.clone()))?
                };
                // A name that disappeared (unlink, rename over it) is a deletion.
                if let Some(Value::Names(old)) = old {
                    if old.entries.iter().any(|e| !bucket.entries.contains(e)) {
                        self.stats.deletions += 1;
                    }
                }
            }
        }
        if log {
            self.pending.push(op);
        }
        Ok(())
    }

    // --- segments ---------------------------------------------------------

    fn alloc_segment(&mut self) -> SegmentId {
        let id = self.next_segment;
        self.next_segment += 1;
        id
    }

    /// Appends a sealed unit to the current data segment; returns its address.
    fn append_unit(&mut self, sealed: &[u8]) -> Result<u64> {
        let need = sealed.len() as u64;
        let (seg, off) = match self.data_segment {
            Some((seg, off)) if off + need <= self.segment_target => (seg, off),
            _ => (self.alloc_segment(), 0),
        };
        if let Err(e) = self.ctx.medium.append(seg, off, sealed) {
            return self.poison("appending to a data segment", e);
        }
        self.data_segment = Some((seg, off + need));
        self.unsynced = true;
        Ok(addr(seg, off as u32))
    }

    fn sync(&mut self, context: &str) -> Result<()> {
        if let Err(e) = self.ctx.medium.sync() {
            return self.poison(context, e);
        }
        self.unsynced = false;
        Ok(())
    }

    // --- data path -------------------------------------------------------

    fn read_cell(&self, oid: u64, cell: u64, c: &CellRef) -> Result<PlainBuf> {
        open_cell_unit(
            &*self.ctx.medium,
            &*self.ctx.provider,
            &*self.ctx.scheme,
            self.cell_size,
            oid,
            cell,
            c,
        )
    }

    /// The current content of a cell as (start, bytes): buffered, or read from the tree.
    fn cell_content(&self, oid: u64, cell: u64) -> Result<Option<(u32, PlainBuf)>> {
        if let Some(d) = self.dirty.get(&(oid, cell)) {
            return Ok(Some((d.start, PlainBuf::copy_of(&d.data))));
        }
        match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
            Some(Value::Cell(c)) => Ok(Some((c.start, self.read_cell(oid, cell, &c)?))),
            _ => Ok(None),
        }
    }

    fn set_dirty(&mut self, oid: u64, cell: u64, start: u32, data: PlainBuf) {
        self.dirty_bytes += data.len();
        if let Some(old) = self.dirty.insert((oid, cell), DirtyCell { start, data }) {
            self.dirty_bytes -= old.data.len();
        }
    }

    fn take_dirty(&mut self, oid: u64, cell: u64) -> Option<DirtyCell> {
        let d = self.dirty.remove(&(oid, cell))?;
        self.dirty_bytes -= d.data.len();
        Some(d)
    }

    /// Seals a buffered cell into a new unit under a fresh key and puts it in the tree.
    fn write_out(&mut self, oid: u64, cell: u64) -> Result<()> {
        let Some(d) = self.take_dirty(oid, cell) else {
            return Ok(());
        };
        self.seal_cell(oid, cell, d.start, &d.data)
    }

    /// Seals `bytes` as the new content of a cell (from `start`) and puts it in the tree.
    fn seal_cell(&mut self, oid: u64, cell: u64, start: u32, bytes: &[u8]) -> Result<()> {
        let len = bytes.len() as u32;
        let (key, key_ref) = self.ctx.scheme.allocate(&*self.ctx.provider);
        let mut sealed = Vec::with_capacity(bytes.len() + TAG_LEN);
        sealed.extend_from_slice(bytes);
        self.ctx
            .provider
            .seal(&key, &cell_aad(oid, cell, start, len), &mut sealed);
        self.put_sealed(oid, cell, start, len, &sealed, key_ref)
    }

    /// Appends a run of sealed whole cells (in as few pieces as segment
    /// boundaries allow) and points the tree at them.
    fn put_run(&mut self, oid: u64, run: SealedRun) -> Result<()> {
        let unit = self.cell_size as usize + TAG_LEN;
        let mut cell = run.first_cell;
        let mut key_refs = run.key_refs.into_iter();
        for piece in self.split_for_segments(&run.bytes, unit) {
            let base = self.append_unit(piece)?;
            for k in 0..piece.len() / unit {
                let key = key_refs.next().expect("one key per unit");
                self.take_dirty(oid, cell);
                let cref = CellRef {
                    start: 0,
                    len: self.cell_size,
                    addr: base + (k * unit) as u64,
                    key,
                };
                self.apply(Op::PutCell { oid, cell, cref }, true)?;
                cell += 1;
            }
        }
        Ok(())
    }

    /// Cuts `bytes` (units of `unit` bytes) into pieces that each fit the
    /// current data segment or a fresh one.
    fn split_for_segments<'b>(&self, bytes: &'b [u8], unit: usize) -> Vec<&'b [u8]> {
        let mut pieces = Vec::new();
        let mut room = match self.data_segment {
            Some((_, off)) => self.segment_target.saturating_sub(off),
            None => 0,
        };
        let mut rest = bytes;
        while !rest.is_empty() {
            let mut fit = (room as usize / unit) * unit;
            if fit == 0 {
                room = self.segment_target;
                fit = ((room as usize / unit) * unit).max(unit);
            }
            let (piece, tail) = rest.split_at(fit.min(rest.len()));
            pieces.push(piece);
            room = room.saturating_sub(piece.len() as u64);
            rest = tail;
        }
        pieces
    }

    /// Appends a sealed cell unit and points the tree at it.
    fn put_sealed(
        &mut self,
        oid: u64,
        cell: u64,
        start: u32,
        len: u32,
        sealed: &[u8],
        key: KeyRef,
    ) -> Result<()> {
        let addr = self.append_unit(sealed)?;
        let cref = CellRef {
            start,
            len,
            addr,
            key,
        };
        self.apply(Op::PutCell { oid, cell, cref }, true)
    }

    fn write_out_all(&mut self) -> Result<()> {
        let cells: Vec<(u64, u64)> = self.dirty.keys().copied().collect();
        for (oid, cell) in cells {
            self.write_out(oid, cell)?;
        }
        Ok(())
    }

    fn write(
        &mut self,
        oid: u64,
        offset: u64,
        data: &[u8],
        sealed: Option<SealedRun>,
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<()> {
        self.mutable()?;
        let mut record = self.record(oid)?;
        if data.is_empty() {
            // POSIX: a zero-length write does not extend the object.
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::Invalid("write past 2^64".into()))?;
        let cs = self.cell_size as u64;
        let mut sealed = sealed;
        let mut pos = offset;
        while pos < end {
            let cell = pos / cs;
            let from = (pos % cs) as u32;
            let n = (cs - from as u64).min(end - pos) as u32;
            let chunk = &data[(pos - offset) as usize..(pos - offset) as usize + n as usize];
            if from == 0 && n as u64 == cs {
                // The run of whole cells, sealed before the lock was taken.
                let run = sealed.take().filter(|r| r.first_cell == cell);
                let run = run.expect("seal_whole_cells covers every whole cell");
                pos += run.key_refs.len() as u64 * cs;
                self.put_run(oid, run)?;
                continue;
            }
            self.merge_into_cell(oid, cell, from, chunk, prefetched)?;
            pos += n as u64;
        }
        if end > record.size {
            record.size = end;
            self.tree_insert(object_key(oid), Value::Object(record))?;
            self.size_dirty.insert(oid);
        }
        self.stats.bytes_written += data.len() as u64;
        if self.dirty_bytes > WRITE_BUFFER_MAX {
            self.write_out_all()?;
        }
        Ok(())
    }

    /// The cells a write of `len` bytes at `offset` only partly covers whose
    /// old content the merge needs: in the tree, not buffered, not wholly
    /// inside the write, and not among `prefetched` already.
    fn cells_to_merge(
        &self,
        oid: u64,
        offset: u64,
        len: u64,
        prefetched: &[Prefetched],
    ) -> Result<Vec<(u64, CellRef)>> {
        let cs = self.cell_size as u64;
        let end = offset.saturating_add(len);
        // A missing object has no cells: the write itself reports it.
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut edges = vec![offset / cs];
        if (end - 1) / cs != offset / cs {
            edges.push((end - 1) / cs);
        }
        let mut wanted = Vec::new();
        for cell in edges {
            let from = offset.max(cell * cs) - cell * cs;
            let to = end.min((cell + 1) * cs) - cell * cs;
            if (from == 0 && to == cs) || self.dirty.contains_key(&(oid, cell)) {
                continue;
            }
            if let Some(Value::Cell(c)) = self.tree.get(&cell_key(oid, cell), &self.ctx)? {
                let covered = from <= c.start as u64 && c.start as u64 + c.len as u64 <= to;
                let have = prefetched
                    .iter()
                    .any(|p| p.cell == cell && p.addr == c.addr);
                if !covered && !have {
                    wanted.push((cell, c));
                }
            }
        }
        Ok(wanted)
    }

    /// Writes `chunk` at byte `from` of a cell: into its buffered content in
    /// place when it fits there, else merged with the cell's old content (the
    /// new content spans both ranges; gaps are zeros) and buffered. A cell
    /// that becomes whole is sealed at once.
    fn merge_into_cell(
        &mut self,
        oid: u64,
        cell: u64,
        from: u32,
        chunk: &[u8],
        prefetched: &mut Vec<Prefetched>,
    ) -> Result<()> {
        let to = from + chunk.len() as u32;
        if let Some(d) = self.dirty.get_mut(&(oid, cell)) {
            if d.start <= from && to as usize <= d.start as usize + d.data.len() {
                let at = (from - d.start) as usize;
                d.data[at..at + chunk.len()].copy_from_slice(chunk);
                return Ok(());
            }
        }
        let old = match self.take_dirty(oid, cell) {
            Some(d) => Some((d.start, d.data)),
            None => match self.tree.get(&cell_key(oid, cell), &self.ctx)? {
                // Wholly overwritten: the old bytes are not needed.
                Some(Value::Cell(c)) if from <= c.start && c.start + c.len <= to => None,
                Some(Value::Cell(c)) => {
                    let at = prefetched
                        .iter()
                        .position(|p| p.cell == cell && p.addr == c.addr);
                    let plain = match at {
                        Some(i) => prefetched.swap_remove(i).plain,
                        None => self.read_cell(oid, cell, &c)?,
                    };
                    Some((c.start, plain))
                }
                _ => None,
            },
        };
        let (start, bytes) = match old {
            Some((old_start, mut old)) if !old.is_empty() => {
                let old_end = old_start + old.len() as u32;
                if old_start <= from && to <= old_end {
                    old[(from - old_start) as usize..][..chunk.len()].copy_from_slice(chunk);
                    (old_start, old)
                } else {
                    let (s, e) = (old_start.min(from), old_end.max(to));
                    let mut merged = PlainBuf::zeroed((e - s) as usize);
                    merged[(old_start - s) as usize..][..old.len()].copy_from_slice(&old);
                    merged[(from - s) as usize..][..chunk.len()].copy_from_slice(chunk);
                    (s, merged)
                }
            }
            _ => (from, PlainBuf::copy_of(chunk)),
        };
        let full = start == 0 && bytes.len() as u64 == self.cell_size as u64;
        self.set_dirty(oid, cell, start, bytes);
        if full {
            self.write_out(oid, cell)?;
        }
        Ok(())
    }

    /// Copies buffered bytes of a read into the output and lists the units
    /// still to open (outside the lock).
    fn plan_read(&self, oid: u64, offset: u64, len: usize) -> Result<(Vec<u8>, Vec<PendingRead>)> {
        let record = self.record(oid)?;
        let end = offset.saturating_add(len as u64).min(record.size);
        if offset >= end {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pending = Vec::new();
        let cs = self.cell_size as u64;
        let mut pos = offset;
        while pos < end {
            let cell = pos / cs;
            let cell_base = cell * cs;
            let stop = (cell_base + cs).min(end);
            if let Some(d) = self.dirty.get(&(oid, cell)) {
                let lo = (cell_base + d.start as u64).max(pos);
                let hi = (cell_base + d.start as u64 + d.data.len() as u64).min(stop);
                if lo < hi {
                    let src =
                        &d.data[(lo - cell_base - d.start as u64) as usize..][..(hi - lo) as usize];
                    out[(lo - offset) as usize..][..(hi - lo) as usize].copy_from_slice(src);
                }
            } else if let Some(Value::Cell(c)) = self.tree.get(&cell_key(oid, cell), &self.ctx)? {
                pending.push(PendingRead {
                    oid,
                    cell,
                    out_at: (cell_base + c.start as u64) as i64 - offset as i64,
                    cref: c,
                });
            }
            pos = stop;
        }
        Ok((out, pending))
    }

    /// Keeps only the bytes of a cell inside `[keep_from, keep_to)` (cell-relative), zeroing `[zero_from, zero_to)`.
    fn rewrite_cell(&mut self, oid: u64, cell: u64, zero_from: u32, zero_to: u32) -> Result<()> {
        let Some((start, mut bytes)) = self.cell_content(oid, cell)? else {
            return Ok(());
        };
        let end = start + bytes.len() as u32;
        if zero_to <= start || zero_from >= end {
            return Ok(());
        }
        let (mut s, mut e) = (start, end);
        if zero_from <= start {
            s = zero_to.min(end);
        }
        if zero_to >= end {
            e = zero_from.max(s);
        }
        if s >= e {
            self.take_dirty(oid, cell);
            return self.apply(Op::DropCell { oid, cell }, true);
        }
        for i in zero_from.max(s)..zero_to.min(e) {
            bytes[(i - start) as usize] = 0;
        }
        let kept = PlainBuf::copy_of(&bytes[(s - start) as usize..(e - start) as usize]);
        self.set_dirty(oid, cell, s, kept);
        // Seal now: the old unit (with the removed bytes) must leave the tree
        // before the next commit, and an unflushed buffer is not in the tree.
        self.write_out(oid, cell)
    }

    fn truncate(&mut self, oid: u64, size: u64) -> Result<()> {
        self.mutable()?;
        let mut record = self.record(oid)?;
        if size < record.size {
            let cs = self.cell_size as u64;
            let boundary = size / cs;
            let cut = (size % cs) as u32;
            let first_dropped = if cut == 0 { boundary } else { boundary + 1 };
            let doomed: Vec<(u64, u64)> = self
                .dirty
                .range((oid, first_dropped)..(oid, u64::MAX))
                .map(|(k, _)| *k)
                .collect();
            for (o, c) in doomed {
                self.take_dirty(o, c);
            }
            self.apply(
                Op::DropCells {
                    oid,
                    from: first_dropped,
                    to: u64::MAX,
                },
                true,
            )?;
            if cut > 0 {
                self.rewrite_cell(oid, boundary, cut, self.cell_size)?;
            }
        }
        record.size = size;
        self.size_dirty.remove(&oid);
        self.apply(Op::SetObject { oid, record }, true)
    }

    fn punch(&mut self, oid: u64, offset: u64, len: u64) -> Result<()> {
        self.mutable()?;
        let record = self.record(oid)?;
        let end = offset.saturating_add(len).min(record.size);
        if offset >= end {
            return Ok(());
        }
        let cs = self.cell_size as u64;
        let (first_whole, end_whole) = (offset.div_ceil(cs), end / cs);
        if first_whole > end_whole {
            // Inside one cell.
            let cell = offset / cs;
            return self.rewrite_cell(oid, cell, (offset % cs) as u32, (end - cell * cs) as u32);
        }
        if !offset.is_multiple_of(cs) {
            self.rewrite_cell(oid, offset / cs, (offset % cs) as u32, cs as u32)?;
        }
        if first_whole < end_whole {
            let doomed: Vec<(u64, u64)> = self
                .dirty
                .range((oid, first_whole)..(oid, end_whole))
                .map(|(k, _)| *k)
                .collect();
            for (o, c) in doomed {
                self.take_dirty(o, c);
            }
            self.apply(
                Op::DropCells {
                    oid,
                    from: first_whole,
                    to: end_whole,
                },
                true,
            )?;
        }
        if !end.is_multiple_of(cs) {
            self.rewrite_cell(oid, end_whole, 0, (end % cs) as u32)?;
        }
        Ok(())
    }

    fn delete(&mut self, oid: u64) -> Result<()> {
        self.mutable()?;
        self.record(oid)?;
        if oid == ROOT_DIR {
            return Err(Error::Invalid(
                "the root directory cannot be deleted".into(),
            ));
        }
        let doomed: Vec<(u64, u64)> = self
            .dirty
            .range((oid, 0)..=(oid, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for (o, c) in doomed {
            self.take_dirty(o, c);
        }
        self.size_dirty.remove(&oid);
        self.apply(Op::DeleteObject { oid }, true)
    }

    // --- durability ------------------------------------------------------

    fn resolve_vault_unknown(&mut self) -> Result<()> {
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

    fn ctx_vault_load(&self) -> Result<VaultRecord, crate::vault::VaultError> {
        self.vault.load()
    }

    fn flush(&mut self) -> Result<()> {
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

    /// Replays this epoch's intent log; returns the number of batches applied.
    fn replay_log(&mut self) -> Result<u64> {
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

    fn next_frame_opens(&self, offset: u64, seq: u64) -> bool {
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

    fn maybe_commit(&mut self) {
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

    /// Runs the cleaner if the [`CleanerPolicy`] says so.
    fn maybe_clean(&mut self) {
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
    fn medium_bytes(&self) -> Result<u64> {
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

    fn commit(&mut self) -> Result<()> {
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

    fn commit_inner(&mut self) -> Result<()> {
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

    fn finish_commit(&mut self, next: VaultRecord, slot: Slot, new_log: SegmentId) {
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

    // --- reporting and maintenance --------------------------------------

    fn status(&self) -> Result<Status> {
        let medium = &self.ctx.medium;
        let segments = medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?;
        let medium_bytes = self.medium_bytes()?;
        let since = now_secs().saturating_sub(self.committed_at);
        Ok(Status {
            epoch: self.epoch,
            committed_at: self.committed_at,
            seconds_since_commit: since,
            pending_deletions: self.stats.deletions,
            pending_erasure_bytes: self.stats.freed_bytes,
            bytes_written_this_epoch: self.stats.bytes_written,
            live_bytes: self.live_bytes,
            medium_bytes,
            dead_bytes: medium_bytes.saturating_sub(self.live_bytes),
            segments: segments.len(),
            unflushed_bytes: self.dirty_bytes as u64,
            vault: self.vault.info(),
            vault_writes: self.vault.write_count().ok(),
            cell_size: self.cell_size,
            provider: self.ctx.provider.name(),
            key_scheme: self.ctx.scheme.name(),
            policy: self.policy.clone(),
            next_commit_in: self
                .policy
                .interval
                .map(|i| i.as_secs().saturating_sub(since)),
            last_commit_error: self.last_commit_error.clone(),
            medium: medium.describe(),
        })
    }

    fn fsck(&self, progress: &mut dyn FnMut(u64)) -> Result<FsckReport> {
        let mut report = FsckReport::default();
        let mut cells = Vec::new();
        let mut sizes = HashMap::new();
        self.tree.walk(&self.ctx, &mut |ptr, node| {
            report.nodes += 1;
            if let Some(p) = ptr {
                report.bytes_checked += p.len as u64;
            }
            if let Node::Leaf(entries) = node {
                for (k, v) in entries {
                    match v {
                        Value::Object(r) => {
                            report.objects += 1;
                            sizes.insert(k.oid, r.size);
                        }
                        Value::Cell(c) => cells.push((k.oid, k.off, c.clone())),
                        Value::Names(_) => {}
                    }
                }
            }
            Ok(())
        })?;
        for (oid, cell, c) in cells {
            report.cells += 1;
            match sizes.get(&oid) {
                None => report
                    .problems
                    .push(format!("cell {cell} belongs to missing object {oid}")),
                Some(size) if cell * self.cell_size as u64 + c.start as u64 >= *size => {
                    report.problems.push(format!(
                        "cell {cell} of object {oid} lies beyond its size {size}"
                    ))
                }
                _ => {}
            }
            if let Err(e) = self.read_cell(oid, cell, &c) {
                report.problems.push(e.to_string());
            }
            report.bytes_checked += c.sealed_len();
            progress(c.sealed_len());
        }
        Ok(report)
    }

    /// Cleans segments whose live share is under `threshold`, emptiest first,
    /// copying at most about `max_move` live bytes.
    fn gc(&mut self, threshold: f64, max_move: u64) -> Result<GcReport> {
        self.writable()?;
        // The in-memory tree must equal the committed one before segments
        // that only it leaves unreferenced may go.
        self.commit()?;
        let mut live: HashMap<SegmentId, u64> = HashMap::new();
        self.tree.walk(&self.ctx, &mut |ptr, node| {
            if let Some(p) = ptr {
                *live.entry(addr_segment(p.addr)).or_default() += p.len as u64;
            }
            if let Node::Leaf(entries) = node {
                for (_, v) in entries {
                    if let Value::Cell(c) = v {
                        *live.entry(addr_segment(c.addr)).or_default() += c.sealed_len();
                    }
                }
            }
            Ok(())
        })?;
        let current = self.data_segment.map(|(s, _)| s);
        let mut report = GcReport::default();
        let mut candidates = Vec::new();
        let segments = self
            .ctx
            .medium
            .list_segments()
            .map_err(|e| Error::io("listing segments", e))?;
        for seg in segments {
            if Some(seg) == current || seg == self.log_segment {
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
        // Move live cells as they are (same key, same sealed bytes); nodes in
        // victims are rewritten by the commit under fresh keys.
        let mut tree = std::mem::take(&mut self.tree);
        let mut freed = Vec::new();
        let mut moved = 0u64;
        let result = {
            let ctx = &self.ctx;
            let mut data_segment = self.data_segment;
            let mut next_segment = self.next_segment;
            let target = self.segment_target;
            let res = tree.rewrite(
                ctx,
                &mut freed,
                &|p: &NodePtr| victims.contains(&addr_segment(p.addr)),
                &mut |_, v| {
                    let Value::Cell(c) = v else { return Ok(false) };
                    if !victims.contains(&addr_segment(c.addr)) {
                        return Ok(false);
                    }
                    let mut buf = vec![0u8; c.sealed_len() as usize];
                    ctx.medium
                        .read(addr_segment(c.addr), addr_offset(c.addr) as u64, &mut buf)
                        .map_err(|e| read_error("a live cell during cleaning", e))?;
                    let need = buf.len() as u64;
                    let (seg, off) = match data_segment {
                        Some((s, o)) if o + need <= target => (s, o),
                        _ => {
                            next_segment += 1;
                            (next_segment - 1, 0)
                        }
                    };
                    ctx.medium
                        .append(seg, off, &buf)
                        .map_err(|e| Error::io("copying a live cell", e))?;
                    data_segment = Some((seg, off + need));
                    c.addr = addr(seg, off as u32);
                    moved += need;
                    Ok(true)
                },
            );
            self.data_segment = data_segment;
            self.next_segment = next_segment;
            res
        };
        self.tree = tree;
        self.unsynced = true;
        self.release_nodes(freed);
        if let Err(e) = result {
            self.poisoned = Some(format!("cleaner: {e}"));
            return Err(e);
        }
        report.bytes_moved = moved;
        self.doomed_segments.extend(victims.iter().copied());
        report.segments_deleted += victims.len();
        self.commit()?;
        Ok(report)
    }
}
