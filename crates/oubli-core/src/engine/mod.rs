//! The store: objects and names on the key tree; the engine's state, its policies and the one mutation every change goes through (`apply`).
//!
//! Each guarantee of docs/DESIGN.md has one file that owns it:
//! [`write`] (every way a unit leaves the tree), [`read`], [`names`],
//! [`commit`] (flush to the intent log, commit and vault rotation: durability
//! and erasure), [`recover`] (create, open, replay), [`clean`] (the
//! cleaner), [`reclaim`] (deleting unreachable segments) and [`check`]
//! (status, fsck, audit).

mod cells;
mod check;
mod clean;
mod commit;
mod consolidate;
mod names;
mod read;
mod reclaim;
mod recover;
mod rewrite;
mod share;
mod snapshot;
mod space;
mod split;
mod write;

pub use check::{CleanerProgress, FsckReport, Overhead, Status};
pub use clean::GcReport;
use commit::{UnknownRotation, PENDING_OPS_MAX};
pub use consolidate::ConsolidateReport;
pub use share::{ShareInfo, ShareLeftover, ShareOpener, SHARE_DESTROYED};
pub(crate) use snapshot::read_catalog;
use snapshot::Snapshot;
pub use snapshot::{SnapshotInfo, SnapshotUsage};
pub use space::{reserve_for, SpaceInfo};
use write::DirtyCell;

use crate::error::{read_error, Error, Result};
use crate::log::{self, LogFormat, LogKeys, LogPlace, Op, TallyCadence};
use crate::medium::{Medium, SegmentId, Slot};
use crate::superblock::{self, Body, Header, FORMAT_VERSION};
use crate::tree::{
    addr, addr_offset, addr_segment, encode_node, CellRef, Key, NameBucket, Node, NodePtr,
    NodeSource, ObjectRecord, Tree, Value, Visit, KIND_CELL, KIND_CELLS, KIND_NAMES, KIND_OBJECT,
};
use crate::unit::{cell_aad, describe_cell, node_aad, open_cell_unit, Ctx, NodeCache};
use crate::vault::{StoreId, Vault, VaultInfo, VaultRecord};
use oubli_crypto::{
    wipe, CryptoProvider, KeyRef, KeyScheme, PlainBuf, RingProvider, SecretKey, TAG_LEN,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use zeroize::Zeroizing;

/// Object id of the root directory every store has.
pub const ROOT_DIR: u64 = 1;
/// Default cell size: the unit of encryption and erasure for object data.
pub const DEFAULT_CELL_SIZE: u32 = 32 * 1024;
/// The cells of objects written in place at random (DESIGN §3, "One cell
/// size per object"): a block device's export, a preallocated file, a file
/// whose first write lands past its start. The store's own cell size is
/// for everything else.
pub const SMALL_CELL_SIZE: u32 = 4096;
/// Data segments are closed at this size (or the medium's capacity, if smaller).
const DATA_SEGMENT_TARGET: u64 = 64 << 20;
/// Buffered (not yet sealed) data above which the buffer is written out.
const WRITE_BUFFER_MAX: usize = 32 << 20;
/// Writes up to this size are buffered even where they cover whole cells,
/// and a cell a write completes stays buffered while the buffer holds less
/// than [`SMALL_WRITES_BUFFERED`]: the next flush seals them into its
/// intent-log frame, which one sync makes durable (format 6, DESIGN §5),
/// where a sealed cell in a data segment costs that segment a sync of its
/// own. A database's page write followed by `fsync` is one sync.
const SMALL_WRITE: usize = 16 << 10;
/// See [`SMALL_WRITE`]: past this much buffered, whole cells are sealed
/// into a data segment as they complete (a stream has no use for them in
/// memory). The default of [`Options::small_writes_buffered`].
const SMALL_WRITES_BUFFERED: usize = 1 << 20;
/// How far ahead of a frame the log segment is prepared for appends
/// ([`Medium::reserve`]): zeros the file system writes once per this many
/// bytes of frames, instead of new metadata with every flush.
const LOG_RESERVE: u64 = 1 << 20;
/// Memory a buffered cell takes beyond its bytes (its map entry, its
/// allocations): counted against [`WRITE_BUFFER_MAX`], so that a buffer of
/// many tiny files is bounded too.
const DIRTY_CELL_OVERHEAD: usize = 256;

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
    pub policy: EpochPolicy,
    /// Open without writing anything: no recovery commit, mutations refused.
    pub read_only: bool,
    /// Memory for clean decrypted tree nodes (as `Node::mem_bytes` counts it).
    pub node_cache_bytes: usize,
    /// Memory that the tree nodes changed since the last commit may hold
    /// before the store commits by itself, whatever the epoch policy (a
    /// commit writes them out; erasing earlier is never a loss). With the
    /// node cache and the write buffer, it bounds the engine's memory
    /// (DESIGN §10, "Memory").
    pub dirty_tree_bytes: usize,
    /// What to do when the vault cannot take a commit.
    pub vault_failure: VaultFailurePolicy,
    /// When the store reclaims space by itself.
    pub cleaner: CleanerPolicy,
    /// Run the epoch policy's commits on a thread of the store's own: the
    /// change that makes one due returns at once instead of waiting for its
    /// syncs and vault rotation (DESIGN §10). Off, the changing caller runs
    /// the commit (a library caller then knows a change that crossed the
    /// policy has committed when it returns); the long-running front-ends
    /// (mount, serve) turn it on. The commits the dirty-tree cap forces go
    /// to that thread too when none is in flight. A change that reaches the
    /// cap, or the policy's bytes or deletions trigger, again while the
    /// commit asked for is still in flight waits for that one to land, so
    /// that both bounds hold.
    pub background_commits: bool,
    /// How often the intent log's tally is brought up to date (format 6;
    /// a format-2 log keeps one record per flush). A record with every
    /// flush costs each flush a second sync; the default, at most one a
    /// second, leaves the other flushes one sync, and the tally's check
    /// against a truncated or damaged log then covers the frames older
    /// than a second (DESIGN §5).
    pub tally: TallyCadence,
    /// Buffered bytes past which a cell a small write completes is sealed
    /// into a data segment at once, instead of waiting for the next flush's
    /// frame (default 1 MiB). The proof tests lower it so that their small
    /// stores take both paths, and the cells sealed at once are the ones a
    /// later overwrite may rewrite in place (`rewrite.rs`).
    pub small_writes_buffered: usize,
    /// Changes queued for the intent log past which a change flushes by
    /// itself (default 2^17), bounding their memory. The front-end tests
    /// lower it to make a large `put` flush part-way with a small input.
    pub pending_ops_max: usize,
}

/// When the store runs the cleaner by itself: a run starts right after a
/// commit its epoch policy triggered (never in a store committed only by
/// hand), when dead bytes are both a large share and a large amount. The
/// changes that follow carry it out a slice at a time, and the timer
/// ([`Store::tick`]) finishes it; it copies a bounded amount of live data
/// and costs at most one more commit (a vault write: mind a TPM's
/// endurance), made by the timer (DESIGN §7).
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
            policy: EpochPolicy::default(),
            read_only: false,
            node_cache_bytes: 64 << 20,
            dirty_tree_bytes: 64 << 20,
            vault_failure: VaultFailurePolicy::default(),
            cleaner: CleanerPolicy::default(),
            background_commits: false,
            tally: TallyCadence::default(),
            small_writes_buffered: SMALL_WRITES_BUFFERED,
            pending_ops_max: PENDING_OPS_MAX,
        }
    }
}

/// Parameters fixed when a store is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    pub cell_size: u32,
    /// Where unit keys come from (`oubli_crypto::SCHEME_*`); the store
    /// keeps it for life (recorded in the superblock).
    pub key_scheme: u8,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            cell_size: DEFAULT_CELL_SIZE,
            key_scheme: oubli_crypto::SCHEME_PARENT_POINTER,
        }
    }
}

/// The store. All methods take `&self`. One lock serialises changes to the
/// tree; sealing of whole cells and the reading and opening of units happen
/// outside it, so several threads encrypt and decrypt in parallel.
pub struct Store {
    /// The engine, shared with the committer thread.
    core: Arc<Core>,
    shared: Shared,
    /// Truncations and deletions of objects, ever ([`Store::shrink_generation`]).
    shrinks: AtomicU64,
    /// Runs the epoch policy's commits under [`Options::background_commits`]
    /// (spawned at the first).
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The engine and the signals around it: what the committer thread needs.
struct Core {
    engine: Mutex<Engine>,
    /// Signalled when a commit or flush that released the lock for its I/O
    /// lands, and when the committer thread takes a request (a writer held at the
    /// memory cap waits for that: the commit then captures what it changed).
    commit_landed: Condvar,
    /// Signalled when a change asks the committer thread for a commit, and
    /// when the store closes.
    commit_wanted: Condvar,
}

impl Core {
    fn new(engine: Engine) -> Arc<Core> {
        Arc::new(Core {
            engine: Mutex::new(engine),
            commit_landed: Condvar::new(),
            commit_wanted: Condvar::new(),
        })
    }
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
    /// The engine's, for waiting on its deletions without the lock.
    reclaimer: Arc<reclaim::Reclaimer>,
    /// Counts units rewritten in place (`rewrite.rs`), bumped before their
    /// bytes change: a reader outside the lock whose unit fails to open
    /// retries if it moved since the read was planned.
    rewrites: Arc<AtomicU64>,
}

/// What happened in the current epoch, for the epoch policy and `status`.
#[derive(Default, Clone)]
pub(super) struct EpochStats {
    bytes_written: u64,
    /// Deletion events: unlinks, deleted objects, truncates and punches.
    deletions: u64,
    /// Writes that replaced sealed bytes: deletions too (`pending_deletions`
    /// counts them), but the epoch policy's deletion trigger does not — in
    /// a database or a VM image they are the steady state, and a commit
    /// every N of them would tie the commit rate (and a TPM's or a token's
    /// writes) to the write rate. Their bytes count against the byte
    /// trigger; the interval bounds how long they stay recoverable.
    overwrites: u64,
    freed_bytes: u64,
    /// Sealed units that left the tree (replaced or dropped).
    units_freed: u64,
}

impl EpochStats {
    /// What was counted after `earlier` (a copy of these counters).
    fn since(&self, earlier: &EpochStats) -> EpochStats {
        EpochStats {
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            deletions: self.deletions.saturating_sub(earlier.deletions),
            overwrites: self.overwrites.saturating_sub(earlier.overwrites),
            freed_bytes: self.freed_bytes.saturating_sub(earlier.freed_bytes),
            units_freed: self.units_freed.saturating_sub(earlier.units_freed),
        }
    }
}

/// Older keys the vault still holds because a rotation's second step (or
/// the erasure on open) failed: the epochs they open are not erased yet.
pub(super) struct VaultLeftover {
    epochs: Vec<u64>,
    why: String,
    since: std::time::Instant,
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
    /// This epoch's intent log: where the next frame and tally record go.
    log: LogPlace,
    log_offset: u64,
    tally_offset: u64,
    log_seq: u64,
    /// Whether this epoch's log carries cells (format 6): then the commit
    /// leaves it to the cleaner instead of deleting it.
    log_holds_cells: bool,
    /// How far the medium was asked to prepare the log segment for
    /// appends ([`Medium::reserve`]).
    log_reserved: u64,
    /// While a flush seals the buffered cells into its frame (format 6):
    /// where they go instead of the data segment.
    frame_cells: Option<FrameCells>,
    /// A flush whose I/O stopped for want of room: its frame took its
    /// place in the log and its ops left `pending`, so it is finished
    /// (the same bytes at the same places) before any later frame, or
    /// made moot by a commit (DESIGN §7, "A full medium").
    owed_flush: Option<commit::FlushPlan>,
    /// How often the tally is brought up to date, the batches its last
    /// record counts, and when that record was made.
    tally_cadence: TallyCadence,
    tally_counts: u64,
    tally_written_at: std::time::Instant,
    /// Ops applied to the tree but not yet in the log.
    pending: Vec<Op>,
    /// Units appended since the last sync.
    unsynced: bool,
    /// Counts the times `unsynced` was set: a flush whose syncs ran without
    /// the lock leaves it set when units were appended meanwhile.
    appends: u64,
    /// Flushes begun (made a plan) in this store's life: each plan takes
    /// the next number.
    flushes_begun: u64,
    /// The highest number of a flush that landed: a caller that asked for
    /// a flush when `flushes_begun` was lower has its writes durable.
    flushed_through: u64,
    dirty: BTreeMap<(u64, u64), DirtyCell>,
    dirty_bytes: usize,
    /// Where each recently written object's last write ended: a write
    /// that starts there continues a stream (`split.rs`).
    write_ends: HashMap<u64, u64>,
    /// Objects whose size grew by writes, with the stamp of their last
    /// growth; their record is logged at the next flush.
    size_dirty: BTreeMap<u64, u64>,
    /// Counts growths, to tell those a commit captured from later ones.
    size_stamp: u64,
    live_bytes: u64,
    stats: EpochStats,
    policy: EpochPolicy,
    committed_at: u64,
    read_only: bool,
    /// Set when a medium write failed: the in-memory state may be ahead of
    /// the medium, so mutations are refused until the store is reopened.
    poisoned: Option<String>,
    /// Opened on a medium with no room for the commit that puts the
    /// replayed intent log in the tree (another program filled it): reads
    /// work, changes answer `NoSpace` until a commit lands (DESIGN §7).
    full_at_open: Option<String>,
    /// A commit whose vault write may or may not have happened.
    vault_unknown: Option<UnknownRotation>,
    /// Set while the vault holds a key older than the current one.
    vault_leftover: Option<VaultLeftover>,
    last_commit_error: Option<String>,
    /// Segments to delete once the next commit has made them unreachable.
    doomed_segments: Vec<SegmentId>,
    /// The cleaner run the changes are carrying out, a slice each.
    cleaning: Option<clean::CleanRun>,
    /// Deletes segments once a commit made them unreachable, outside the lock.
    reclaimer: Arc<reclaim::Reclaimer>,
    vault_failure: VaultFailurePolicy,
    cleaner: CleanerPolicy,
    /// [`Options::dirty_tree_bytes`].
    dirty_tree_cap: usize,
    /// [`Tree::dirty_nodes`] when the changed nodes' memory was last measured.
    dirty_nodes_measured: usize,
    /// Under [`VaultFailurePolicy::RefuseWrites`]: why and since when the
    /// vault could not take a commit.
    vault_down: Option<(String, std::time::Instant)>,
    /// Snapshots by name, each keeping a tree root.
    snapshots: BTreeMap<String, Snapshot>,
    /// Where the committed catalog lies (for the cleaner).
    catalog_unit: Option<NodePtr>,
    /// The units of the key scheme's committed state (for the cleaner).
    scheme_state_units: Vec<NodePtr>,
    /// Key shares by id (destroyed ones included: ids are never reused).
    shares: BTreeMap<u32, crate::share::ShareRecord>,
    /// The keys of the shares whose vaults were opened (lazily, by reads).
    share_keys: RefCell<HashMap<u32, SecretKey>>,
    /// How to open a share's vault (supplied by the front-end).
    share_opener: Option<Arc<ShareOpener>>,
    /// Share vaults seen holding an older record they could not destroy
    /// (share id → why), until an open of the vault erases it.
    share_leftovers: RefCell<BTreeMap<u32, String>>,
    /// Changes whenever a snapshot view made earlier may show too much or
    /// point at moved units: a snapshot taken, removed or redacted, a share
    /// created or destroyed, the cleaner run, a commit (see
    /// [`Store::snapshot_generation`]).
    snapshot_generation: u64,
    /// Set while [`Store::commit`] writes and rotates without the lock:
    /// only the operations that take [`Store::lock_beside_commit`] run then.
    committing: bool,
    /// Set while [`Store::flush`] syncs and appends the intent log without
    /// the lock; the same operations wait for it as for a commit.
    flushing: bool,
    /// The epoch's counters when the commit in flight captured its tree:
    /// what was counted since belongs to the next epoch.
    in_flight_covers: Option<EpochStats>,
    /// [`Options::background_commits`].
    background_commits: bool,
    /// A change asked the committer thread for a commit it has not begun.
    commit_requested: Option<commit::CommitRequest>,
    /// The store is being dropped: the committer thread stops.
    closing: bool,
    /// Units from this address on in `unnamed_segments` are named by
    /// nothing but the live tree in memory (no intent-log frame, no tree
    /// persisted): one replaced by a unit of the same length is written
    /// over in place (`rewrite.rs`, DESIGN §7).
    unnamed_from: u64,
    /// The data segments appended to since the last naming.
    unnamed_segments: Vec<SegmentId>,
    /// Address ranges (start → end) where the cleaner copied units since
    /// the last naming: never rewritten in place (`rewrite.rs`).
    copied: BTreeMap<u64, u64>,
    /// Where in `pending` the `PutCell` of each unit that may be rewritten
    /// in place is, by address: a rewrite replaces that op instead of
    /// queueing another (`rewrite.rs`).
    pending_puts: HashMap<u64, usize>,
    /// The medium rewrites ([`Medium::can_rewrite`]) and the store is writable.
    can_rewrite: bool,
    /// [`Shared::rewrites`].
    rewrites: Arc<AtomicU64>,
    /// Units rewritten in place since the store was opened.
    units_rewritten: u64,
    /// Cells split and put back whole since the store was opened (`split.rs`).
    cells_split: u64,
    cells_rejoined: u64,
    /// [`Options::small_writes_buffered`].
    small_writes_buffered: usize,
    /// [`Options::pending_ops_max`].
    pending_ops_max: usize,
    /// The medium's room, against which writes are admitted (`space.rs`).
    space: space::SpaceGauge,
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

impl Core {
    /// The engine, with no commit or flush in flight: what may commit,
    /// flush, clean or change snapshots, shares and the catalog takes this.
    fn lock(&self) -> MutexGuard<'_, Engine> {
        let mut e = self.lock_beside_commit();
        while e.io_in_flight() {
            e = Self::unpoisoned(self.commit_landed.wait(e));
        }
        e
    }

    /// The engine, possibly while a commit writes and rotates, or a flush
    /// syncs, without the lock: for reads and for changes that only queue
    /// ops and append units (writes, truncates, punches, deletes, names).
    /// What such a change does is not in the commit's tree (it stays queued
    /// for the next epoch's log, `Carry::AcceptedMeanwhile`), nor in the
    /// flush's frame (it waits for the next flush).
    fn lock_beside_commit(&self) -> MutexGuard<'_, Engine> {
        Self::unpoisoned(self.engine.lock())
    }

    /// A panic while holding the lock leaves the engine in an unknown state;
    /// refuse further use rather than continue on it.
    fn unpoisoned<'a>(
        locked: std::sync::LockResult<MutexGuard<'a, Engine>>,
    ) -> MutexGuard<'a, Engine> {
        locked.unwrap_or_else(|poison| {
            let mut g = poison.into_inner();
            g.poisoned
                .get_or_insert_with(|| "a previous operation panicked".into());
            g
        })
    }

    /// Marks a commit in flight and releases the lock for its I/O.
    fn commit_in_flight(&self, mut e: MutexGuard<'_, Engine>) -> InFlight<'_> {
        e.in_flight_covers = Some(e.stats.clone());
        self.in_flight(e, Io::Commit)
    }

    /// Marks a flush in flight and releases the lock for its I/O.
    fn flush_in_flight(&self, e: MutexGuard<'_, Engine>) -> InFlight<'_> {
        self.in_flight(e, Io::Flush)
    }

    fn in_flight(&self, mut e: MutexGuard<'_, Engine>, io: Io) -> InFlight<'_> {
        e.set_in_flight(io, true);
        drop(e);
        InFlight {
            core: self,
            io,
            landed: false,
        }
    }
}

impl Store {
    /// See [`Core::lock`].
    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.core.lock()
    }

    /// See [`Core::lock_beside_commit`].
    fn lock_beside_commit(&self) -> MutexGuard<'_, Engine> {
        self.core.lock_beside_commit()
    }

    /// A store around an engine (opened, created, or a snapshot's view).
    fn around(engine: Engine, shared: Shared) -> Store {
        Store {
            core: Core::new(engine),
            shared,
            shrinks: AtomicU64::new(0),
            committer: Mutex::new(None),
        }
    }

    /// Creates an empty object with front-end metadata; returns its id.
    pub fn create_object(&self, meta: &[u8]) -> Result<u64> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        // A new object is new data too: the reserve is not for it.
        e.admit(meta.len() as u64)?;
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
        self.settle(e);
        Ok(oid)
    }

    /// The object's record (size and metadata).
    pub fn object(&self, oid: u64) -> Result<ObjectRecord> {
        self.lock_beside_commit().record(oid)
    }

    pub fn exists(&self, oid: u64) -> Result<bool> {
        let e = self.lock_beside_commit();
        Ok(e.tree.get(&object_key(oid), &e.ctx)?.is_some())
    }

    pub fn size(&self, oid: u64) -> Result<u64> {
        Ok(self.lock_beside_commit().record(oid)?.size)
    }

    /// A number that changes whenever an object may have become smaller or
    /// gone (a truncate, a delete), read without the engine lock. A
    /// front-end that checks requests against an object's size on every
    /// request (the NBD server) keeps the size and asks [`size`](Self::size)
    /// again only when this changes: `size` waits for the engine lock, which
    /// a writer holds through each write.
    pub fn shrink_generation(&self) -> u64 {
        self.shrinks.load(Ordering::SeqCst)
    }

    /// Replaces the object's front-end metadata.
    pub fn set_meta(&self, oid: u64, meta: &[u8]) -> Result<()> {
        let mut e = self.lock_beside_commit();
        e.mutable()?;
        let mut record = e.record(oid)?;
        record.meta = meta.to_vec();
        e.size_dirty.remove(&oid);
        e.apply(Op::SetObject { oid, record }, true)?;
        self.settle(e);
        Ok(())
    }

    /// Replaces the epoch policy of an open store.
    pub fn set_policy(&self, policy: EpochPolicy) {
        self.lock().policy = policy;
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    pub fn store_id(&self) -> StoreId {
        self.lock().store_id
    }
}

/// What does its I/O without the engine lock: at most one at a time.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Io {
    Commit,
    Flush,
}

impl Engine {
    /// A commit or a flush is doing its I/O without the lock.
    fn io_in_flight(&self) -> bool {
        self.committing || self.flushing
    }

    fn set_in_flight(&mut self, io: Io, on: bool) {
        match io {
            Io::Commit => {
                self.committing = on;
                if !on {
                    self.in_flight_covers = None;
                }
            }
            Io::Flush => self.flushing = on,
        }
    }
}

/// A commit or flush doing its I/O without the lock. Landing it (or
/// unwinding past it) clears the mark and wakes whoever waits in
/// [`Store::lock`].
struct InFlight<'a> {
    core: &'a Core,
    io: Io,
    landed: bool,
}

impl<'a> InFlight<'a> {
    /// Takes the lock back to finish the commit or flush.
    fn land(mut self) -> MutexGuard<'a, Engine> {
        self.landed = true;
        let mut e = self.core.lock_beside_commit();
        e.set_in_flight(self.io, false);
        self.core.commit_landed.notify_all();
        e
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.landed {
            // A panic during the I/O: its outcome is unknown.
            let mut e = self.core.lock_beside_commit();
            e.set_in_flight(self.io, false);
            e.poisoned.get_or_insert_with(|| match self.io {
                Io::Commit => "a commit panicked during its I/O".into(),
                Io::Flush => "a flush panicked during its I/O".into(),
            });
            self.core.commit_landed.notify_all();
        }
    }
}

impl Drop for Store {
    /// Flushes buffered writes, like closing a file: dropping a store loses
    /// nothing that was written through it. Errors cannot be reported here;
    /// call [`Store::flush`] or [`Store::commit`] to see them.
    fn drop(&mut self) {
        // A commit the committer thread has in flight lands first.
        self.stop_committer();
        let mut e = self.lock();
        if !e.read_only && e.poisoned.is_none() {
            let _ = e.flush();
        }
    }
}

impl Engine {
    fn writable(&self) -> Result<()> {
        self.committable()?;
        if let Some(why) = &self.full_at_open {
            return Err(Error::NoSpace(why.clone()));
        }
        Ok(())
    }

    /// Tries again the commit an open on a full medium could not make (the
    /// space may be back): `NoSpace` while it is not.
    fn commit_owed_at_open(&mut self) -> Result<()> {
        if self.full_at_open.is_none() || self.committable().is_err() {
            return Ok(());
        }
        match self.commit() {
            Ok(()) | Err(Error::ErasureIncomplete { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// What [`writable`](Self::writable) checks but a store opened on a
    /// full medium: a commit is what ends that state.
    fn committable(&self) -> Result<()> {
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
        self.commit_owed_at_open()?;
        self.writable()?;
        let Some((why, since)) = &self.vault_down else {
            return Ok(());
        };
        if since.elapsed() < VAULT_RETRY || self.io_in_flight() {
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

    /// A medium write that failed: out of room (the medium promises the
    /// failed call left nothing, see [`Medium`]) is `NoSpace` and leaves
    /// the store usable — the caller has undone, or kept for a retry,
    /// what it changed in memory (DESIGN §7, "A full medium"); any other
    /// error poisons the store.
    fn medium_failed<T>(&mut self, context: &str, e: std::io::Error) -> Result<T> {
        if !no_room(&e) {
            return self.poison(context, e);
        }
        // Whatever took the room (another program on the same disk) is
        // not in the gauge: writes ask the medium again.
        self.space.stale();
        // (The error's text goes on with what to do: free space, `oubli gc`.)
        Err(Error::NoSpace(format!(
            "{}: {context}: {e}; nothing accepted was lost, and it goes to the medium \
             once there is room",
            self.ctx.medium.describe()
        )))
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

    /// Accounts for units that left the tree: their space is dead. (A key
    /// scheme with keys outside the tree learns it at the commit's trace of
    /// every root, since a snapshot may still reach the unit.)
    fn release_nodes(&mut self, freed: Vec<NodePtr>) {
        for p in freed {
            self.live_bytes = self.live_bytes.saturating_sub(p.len as u64);
        }
    }

    fn release_cell(&mut self, c: &CellRef) {
        self.live_bytes = self.live_bytes.saturating_sub(c.sealed_len());
        self.stats.freed_bytes += c.sealed_len();
        self.stats.units_freed += 1;
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

    /// Calls `f(address, sealed length)` for every unit (node on the medium
    /// or data cell) that `tree` reaches.
    fn each_unit(&self, tree: &Tree, f: &mut dyn FnMut(u64, u64)) -> Result<()> {
        each_unit(tree, &self.ctx, f)
    }

    /// The live tree, then every snapshot's tree.
    fn roots(&self) -> impl Iterator<Item = &Tree> {
        std::iter::once(&self.tree).chain(self.snapshots.values().map(|s| &s.tree))
    }

    fn keys_in(&self, from: Key, to: Key) -> Result<Vec<Key>> {
        let mut keys = Vec::new();
        self.tree.scan(&from, &to, &self.ctx, &mut |k, _| {
            keys.push(*k);
            true
        })?;
        Ok(keys)
    }

    /// Whether the tree holds any key in `[from, to)`.
    fn any_key_in(&self, from: Key, to: Key) -> Result<bool> {
        let mut found = false;
        self.tree.scan(&from, &to, &self.ctx, &mut |_, _| {
            found = true;
            false
        })?;
        Ok(found)
    }

    /// Applies one op to the tree (and queues it for the log when `log`).
    fn apply(&mut self, op: Op, mut log: bool) -> Result<()> {
        match &op {
            Op::PutCell { oid, cell, cref } => {
                // Counted here, not where it is appended, so replay counts it too.
                self.live_bytes += cref.sealed_len();
                self.ctx.scheme.placed(&cref.key);
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
                } else {
                    // Nothing to drop (a discard of what is already gone,
                    // say one that ext4 sends after the server inferred
                    // it): replayed, it would change nothing, so it is not
                    // logged either.
                    log = false;
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
            Op::PutSnapshot { .. } | Op::DropSnapshot { .. } | Op::RedactSnapshots { .. } => {
                self.snapshot_generation += 1;
                self.apply_snapshot_op(&op)?;
            }
            Op::PutShare { .. } => {
                self.snapshot_generation += 1;
                self.apply_share_op(&op)?;
            }
            Op::SetShare { .. } => self.apply_share_op(&op)?,
            Op::SetCellSize { oid, cell_size } => {
                self.tree_insert(Key::new(*oid, KIND_CELLS, 0), Value::CellSize(*cell_size))?;
            }
            // Only replay meets these (a flush logs them straight from the scheme).
            Op::Scheme(record) => {
                self.ctx
                    .scheme
                    .replay(record)
                    .map_err(|e| Error::Corrupt(format!("intent log: {e}")))?;
                log = false;
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
            self.queue_for_log(op);
        }
        Ok(())
    }

    fn alloc_segment(&mut self) -> SegmentId {
        let id = self.next_segment;
        self.next_segment += 1;
        id
    }

    /// Appends a sealed unit to the current data segment; returns its address.
    fn append_unit(&mut self, sealed: &[u8]) -> Result<u64> {
        if let Some(cells) = &mut self.frame_cells {
            // Into the frame being sealed: its sync covers them (format 6).
            let at = cells.at + cells.bytes.len() as u64;
            cells.bytes.extend_from_slice(sealed);
            return Ok(addr(cells.segment, at as u32));
        }
        let need = sealed.len() as u64;
        let (seg, off) = match self.data_segment {
            Some((seg, off)) if off + need <= self.segment_target => (seg, off),
            _ => {
                let seg = self.alloc_segment();
                self.data_segment_started(seg);
                (seg, 0)
            }
        };
        if let Err(e) = self.ctx.medium.append(seg, off, sealed) {
            // Out of room, nothing was appended: the segment keeps its
            // length (a fresh one is simply never used — ids are not
            // reused) and the caller puts nothing in the tree.
            return self.medium_failed("appending to a data segment", e);
        }
        self.data_segment = Some((seg, off + need));
        self.mark_unsynced();
        Ok(addr(seg, off as u32))
    }

    /// Units were appended: the next flush syncs.
    fn mark_unsynced(&mut self) {
        self.unsynced = true;
        self.appends += 1;
    }

    fn sync(&mut self, context: &str) -> Result<()> {
        if let Err(e) = self.ctx.medium.sync() {
            // Out of room, a sync lost nothing (the `Medium` contract):
            // what it was to make durable stays unsynced for the next.
            return self.medium_failed(context, e);
        }
        self.unsynced = false;
        Ok(())
    }
}

/// Whether a medium error means out of room ([`Medium`]'s contract: the
/// call that failed so left nothing behind).
pub(super) fn no_room(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Calls `f(address, sealed length)` for every unit (node on the medium or
/// data cell) that `tree` reaches, loading nodes through `src`.
fn each_unit(tree: &Tree, src: &dyn NodeSource, f: &mut dyn FnMut(u64, u64)) -> Result<()> {
    tree.walk(src, &mut |ptr, node| {
        if let Some(p) = ptr {
            f(p.addr, p.len as u64);
        }
        if let Node::Leaf(entries) = node {
            for (_, v) in entries {
                if let Value::Cell(c) = v {
                    f(c.addr, c.sealed_len());
                }
            }
        }
        Ok(())
    })
}

/// The cells a format-6 flush seals into its frame: they are laid out from
/// `at` in the log segment `segment`.
pub(super) struct FrameCells {
    segment: SegmentId,
    at: u64,
    bytes: Vec<u8>,
    /// The buffered cells sealed into `bytes`, kept until the frame's
    /// head is on the medium (put back if it finds no room).
    taken: Vec<((u64, u64), DirtyCell)>,
}
