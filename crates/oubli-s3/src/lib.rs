//! oubli-s3: the `Medium` seam on S3-compatible object storage — segments as immutable run objects, superblock slots fenced by conditional writes, one writer fenced by a lease and its generation.
//!
//! S3 has no append and no rename, and a bucket may keep every version of
//! every object forever. The mapping (docs/FORMAT-media.md, "S3"):
//!
//! * A segment is a sequence of **runs**: the bytes appended to it between
//!   two syncs, uploaded once with `If-None-Match: *` and never written
//!   again — as the object `PREFIX/seg/{id:08x}/{offset:016x}-g{gen:x}` when
//!   the sync carries one segment, as a piece of one **pack** object when it
//!   carries several (its name lists the pieces: [`layout`]). Reads are
//!   ranged GETs (`reads`). Appends wait in memory until `sync` (or until
//!   [`RUN_MAX`] bytes wait in all, which are then uploaded as a sync
//!   would), so at most `RUN_MAX` bytes wait at any time (`sync`).
//! * **Appends land in order** ([`Medium::keeps_append_order`]): a sync
//!   uploads what waits in the order it was appended, as few PUTs as
//!   possible (one per [`layout::PACK_PIECES`] segments), one after the
//!   other, and each PUT is atomic; so a crash leaves every append up to
//!   some point and nothing later. The engine then flushes with one sync:
//!   data, intent-log frame and tally in one PUT.
//! * A segment deleted while a pack still holds a live piece of another
//!   segment is listed in `PREFIX/gone` (a listing would otherwise bring
//!   it back) until the last such pack is deleted.
//! * Both superblock slots live in one object, `PREFIX/superblocks` (a PUT
//!   is atomic, so writing one slot cannot tear the other), written with
//!   `If-Match` on the ETag this process first read or last wrote (or
//!   `If-None-Match: *` when there was none). Two processes writing the
//!   same store are therefore fenced: whichever writes second gets a
//!   precondition failure, a `WouldBlock` error ("store in use"), whichever
//!   slot each writes.
//! * A writer holds `PREFIX/lock` under a lease, with a **generation** one
//!   above the last (`lease`): it is taken over only on evidence that its
//!   holder is gone (the lock released; its process missing from the same
//!   pid namespace of the same host and boot; or the lock object not
//!   rewritten for a whole lease by the server's clock). Each sync and
//!   superblock write is acknowledged only after a conditional request
//!   shows the lock still the writer's, so a taken-over writer acknowledges
//!   nothing more. A new holder seals what it found (`PREFIX/seal/GEN`),
//!   names what it writes with its generation and stamps the superblocks
//!   with it: objects of an older generation beyond the seal (a paused
//!   holder's late uploads) are ignored, and its late superblock writes fail.
//! * A PUT whose answer was lost (a timeout after the server stored it) is
//!   retried by the client and then meets its own object: a precondition
//!   failure whose object holds exactly the bytes written is a success, and
//!   a run retried with more bytes keeps the shorter object and uploads the
//!   rest after it.
//! * Deleting a segment deletes its runs. On a versioned bucket the old
//!   versions stay: ciphertext under keys the vault no longer has.

mod admin;
mod config;
pub mod layout;
mod lease;
mod readahead;
mod reads;
mod sync;
pub mod test_server;

pub use admin::{Admin, Dated, History, ObjectVersion};
pub use config::{S3Config, S3Location};
pub use lease::{Here, Holder, LeaseWorld, RealWorld, LEASE};
use readahead::ReadAhead;
pub use readahead::{PREFETCH_DEPTH, READ_AHEAD, READ_AHEAD_WINDOWS};

use bytes::Bytes;
use layout::Piece;
use lease::WriterLock;
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use oubli_core::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Bytes waiting (all segments together) before they are uploaded without
/// waiting for a sync.
pub const RUN_MAX: usize = 16 << 20;

/// Largest segment the engine may write (the engine cleans whole segments:
/// smaller ones free space sooner; runs keep PUTs large regardless).
pub const SEGMENT_CAPACITY: u64 = 64 << 20;

/// A store's medium in a bucket.
pub struct S3Medium {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    location: S3Location,
    config: S3Config,
    state: Mutex<State>,
    /// One sync at a time (appends go on meanwhile).
    syncing: Mutex<()>,
    capacity: u64,
    /// Recently fetched read-ahead windows.
    readahead: Arc<ReadAhead>,
    /// PUTs this medium sent (runs and superblocks, not lock renewals) and syncs it served.
    puts: std::sync::atomic::AtomicU64,
    syncs: std::sync::atomic::AtomicU64,
    /// GETs of exactly what a random read needs.
    gets: std::sync::atomic::AtomicU64,
    /// The writer's lock, when opened with [`S3Medium::open_writer`].
    lock: Option<WriterLock>,
    /// Identity, liveness, the server's clock and the renewals' schedule
    /// as the lease sees them ([`RealWorld`] but under a simulator).
    world: Arc<dyn LeaseWorld>,
}

#[derive(Default)]
struct State {
    segments: BTreeMap<SegmentId, Segment>,
    /// The superblocks object as this process first read or last wrote it;
    /// `None` until looked at.
    head: Option<Head>,
    /// The generation this process names its objects with: its lock's,
    /// or (a medium opened without the lock) the superblocks' at open.
    generation: u64,
    /// Appends not yet uploaded, in the order they were made: (segment,
    /// its end after the append), consecutive appends to one segment merged.
    order: Vec<(SegmentId, u64)>,
    /// Bytes waiting in all segments.
    waiting_bytes: usize,
    /// Every pack object (name relative to the prefix) and its pieces.
    packs: HashMap<Arc<str>, Vec<Piece>>,
    /// The packs holding a piece of each segment, live or gone.
    pack_refs: HashMap<SegmentId, BTreeSet<Arc<str>>>,
    /// Deleted segments a pack still holds a piece of: the gone list.
    gone: BTreeSet<SegmentId>,
    /// The gone list object's ETag as this process last read or wrote it
    /// (`None`: none, or unknown): its next write is conditional on it.
    gone_etag: Option<String>,
    /// The superblocks object is known to announce layout 2 or later (or
    /// not to exist yet): packs may be written.
    layout_2: bool,
    /// Objects to delete at a writer's open: runs of gone segments (a
    /// deletion cut short), objects of an older generation its seal leaves
    /// out (a taken-over holder's late uploads), older seals.
    stale: Vec<ObjectPath>,
}

impl State {
    /// Records a pack on the server and which segments it holds pieces of.
    fn add_pack(&mut self, name: Arc<str>, pieces: Vec<Piece>) {
        for p in &pieces {
            let refs = self.pack_refs.entry(p.id).or_default();
            refs.insert(name.clone());
        }
        self.packs.insert(name, pieces);
    }
}

/// The superblocks object: its ETag (`None`: it does not exist), the
/// layout it announces, the generation of the writer that last stamped it,
/// and the slots.
#[derive(Clone, Default)]
struct Head {
    etag: Option<String>,
    layout: u8,
    generation: u64,
    slots: Slots,
}

/// Both superblock slots (`None`: never written).
pub type Slots = [Option<Vec<u8>>; 2];

/// The superblocks object starts with this, then one byte: the layout of
/// the store's objects.
const HEAD_MAGIC: &[u8; 7] = b"OUBLIS3";
/// Layout 1: runs only (written as byte 0 by the first versions).
const LAYOUT_1: u8 = 0;
/// Layout 2: runs, packs and the gone list. Older versions refuse it (they
/// would not see the packs): they find the superblocks malformed.
const LAYOUT_2: u8 = 2;
/// Layout 3: layout 2 with a writer generation (u64 after the layout byte),
/// objects named with theirs, and seals. Versions that know layout 2 only
/// refuse it (they would honour a taken-over holder's late uploads).
const LAYOUT_3: u8 = 3;

/// The two slots held by one version of the superblocks object (`None`:
/// not an oubli superblocks object): what an adversary holding old
/// versions gets from each.
pub fn decode_superblocks(bytes: &[u8]) -> Option<Slots> {
    Head::decode(bytes).map(|(_, _, slots)| slots)
}

impl Head {
    /// `magic, layout byte, [layout 3: u64 generation], then per slot: u32
    /// length (u32::MAX: never written), bytes`. Written as layout 2 while
    /// no writer has stamped a generation, as layout 3 after.
    fn encode(&self) -> Vec<u8> {
        let mut out = HEAD_MAGIC.to_vec();
        if self.generation == 0 {
            out.push(LAYOUT_2);
        } else {
            out.push(LAYOUT_3);
            out.extend_from_slice(&self.generation.to_le_bytes());
        }
        for slot in &self.slots {
            match slot {
                Some(b) => {
                    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                    out.extend_from_slice(b);
                }
                None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
            }
        }
        out
    }

    /// The layout byte, the generation (0 before layout 3) and the slots.
    fn decode(bytes: &[u8]) -> Option<(u8, u64, Slots)> {
        let (&layout, mut rest) = bytes.strip_prefix(HEAD_MAGIC)?.split_first()?;
        let mut generation = 0;
        if layout == LAYOUT_3 {
            let (g, tail) = rest.split_first_chunk::<8>()?;
            generation = u64::from_le_bytes(*g);
            rest = tail;
        }
        let mut slots: Slots = [None, None];
        for slot in &mut slots {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let len = u32::from_le_bytes(*len);
            rest = tail;
            if len != u32::MAX {
                let len = len as usize;
                if len > SUPERBLOCK_MAX || rest.len() < len {
                    return None;
                }
                *slot = Some(rest[..len].to_vec());
                rest = &rest[len..];
            }
        }
        rest.is_empty().then_some((layout, generation, slots))
    }
}

/// Where an uploaded run's bytes are: `len` bytes of `object` from `base`.
struct Run {
    len: u64,
    object: ObjectPath,
    base: u64,
}

#[derive(Default)]
struct Segment {
    /// Uploaded runs by segment offset, contiguous from 0.
    runs: BTreeMap<u64, Run>,
    /// This segment's own run objects on the server (all of them, even any
    /// past a gap): what deleting it deletes.
    own: BTreeSet<ObjectPath>,
    /// A run being uploaded: its offset and bytes (readable meanwhile).
    uploading: Option<(u64, Bytes)>,
    /// Appended, not yet uploaded: starts at `waiting_at`.
    waiting: Vec<u8>,
    waiting_at: u64,
}

impl Segment {
    fn len(&self) -> u64 {
        self.waiting_at + self.waiting.len() as u64
    }
}

impl S3Medium {
    /// Opens (or, for a new store, starts) the store at `location` with
    /// the configuration of this process's environment.
    pub fn open(location: &S3Location) -> io::Result<S3Medium> {
        Self::open_with(location, &S3Config::from_env()?)
    }

    /// Opens with an explicit configuration: lists the segments already there.
    pub fn open_with(location: &S3Location, config: &S3Config) -> io::Result<S3Medium> {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_conditional_put(S3ConditionalPut::ETagMatch);
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"));
        }
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        if let Some(token) = &config.session_token {
            builder = builder.with_token(token);
        }
        let store: AmazonS3 = builder
            .build()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{location}: {e}")))?;
        Self::open_on(Arc::new(store), location, config, Arc::new(RealWorld))
    }

    /// Opens on any `ObjectStore` (a simulator's in-memory one behind its
    /// faults), the lease seeing the world through `world`.
    fn open_on(
        store: Arc<dyn ObjectStore>,
        location: &S3Location,
        config: &S3Config,
        world: Arc<dyn LeaseWorld>,
    ) -> io::Result<S3Medium> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("oubli-s3")
            .enable_all()
            .build()?;
        let medium = S3Medium {
            runtime,
            store,
            world,
            location: location.clone(),
            config: config.clone(),
            state: Mutex::new(State::default()),
            syncing: Mutex::new(()),
            capacity: SEGMENT_CAPACITY,
            lock: None,
            puts: Default::default(),
            syncs: Default::default(),
            gets: Default::default(),
            readahead: Default::default(),
        };
        // A writer taking over between our reading the superblocks and
        // their generation's seal deletes that seal: read both again.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let head = medium.fetch_head()?;
            match medium.load_segments(&head) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 3 => {
                    *medium.lock() = State::default();
                }
                Err(e) => return Err(e),
                Ok(()) => {
                    medium.lock().generation = head.generation;
                    return Ok(medium);
                }
            }
        }
    }

    /// [`open`](Self::open) for writing: takes the store's lock first,
    /// under a lease of [`LEASE`] or `$OUBLI_S3_LEASE_SECS` seconds.
    pub fn open_writer(location: &S3Location) -> io::Result<S3Medium> {
        Self::open_writer_with(location, &S3Config::from_env()?, lease::lease_from_env()?)
    }

    /// Opens for writing with an explicit configuration and lease: takes
    /// the lock with the next generation, lists the store under it, seals
    /// what it found and stamps the superblocks with its generation
    /// (see `lease.rs`); then tidies what crashes and earlier holders left.
    pub fn open_writer_with(
        location: &S3Location,
        config: &S3Config,
        lease: Duration,
    ) -> io::Result<S3Medium> {
        let medium = Self::open_with(location, config)?;
        medium.become_writer(lease)
    }

    /// [`open_writer_with`](Self::open_writer_with) on any `ObjectStore`,
    /// with the lease seeing the world through `world` instead of the real
    /// one: the simulator's seam (crates/oubli-testkit/src/sim/s3.rs), for
    /// simulated time, renewals and processes of other containers. The
    /// store's `last_modified` must follow `world`'s server clock.
    pub fn open_writer_on(
        store: Arc<dyn ObjectStore>,
        location: &S3Location,
        lease: Duration,
        world: Arc<dyn LeaseWorld>,
    ) -> io::Result<S3Medium> {
        let medium = Self::open_on(store, location, &S3Config::default(), world)?;
        medium.become_writer(lease)
    }

    fn become_writer(mut self, lease: Duration) -> io::Result<S3Medium> {
        self.take_lock(lease)?;
        self.start_generation()?;
        self.tidy();
        Ok(self)
    }

    /// `(PUTs sent, syncs served)` so far: what a flush costs in requests.
    pub fn requests(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.puts.load(Relaxed), self.syncs.load(Relaxed))
    }

    /// GETs of segment bytes sent so far (read-ahead windows included).
    pub fn gets(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.gets.load(Relaxed) + self.readahead.gets.load(Relaxed)
    }

    /// Caps segments at `capacity` bytes instead of [`SEGMENT_CAPACITY`].
    pub fn with_segment_capacity(mut self, capacity: u64) -> S3Medium {
        self.capacity = capacity;
        self
    }

    /// The generation this medium names its objects with.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    fn key(&self, rest: &str) -> ObjectPath {
        ObjectPath::from(format!("{}{rest}", self.location.prefix))
    }

    /// An object's name relative to the store's prefix (`None`: not under it).
    fn relative<'a>(&self, location: &'a ObjectPath) -> Option<&'a str> {
        let prefix = self.key("");
        let rest = location.as_ref().strip_prefix(prefix.as_ref())?;
        Some(if prefix.as_ref().is_empty() {
            rest
        } else {
            rest.strip_prefix('/')?
        })
    }

    /// The generation a run or pack object was written under, by its name
    /// (0: unnamed, as layouts before 3 wrote them).
    fn generation_of(&self, object: &ObjectPath) -> u64 {
        match self.relative(object).map(layout::parse) {
            Some(layout::Object::Run { generation, .. } | layout::Object::Pack(_, generation)) => {
                generation
            }
            _ => 0,
        }
    }

    fn head_key(&self) -> ObjectPath {
        self.key("superblocks")
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn error(&self, what: &str, e: object_store::Error) -> io::Error {
        let kind = match &e {
            object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
            object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. } => io::ErrorKind::WouldBlock,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, format!("{} ({what}): {e}", self.location))
    }

    /// PUTs `data` at `key` under `mode`. A precondition failure whose
    /// object already holds exactly `data` is our own earlier attempt whose
    /// answer was lost: a success. Returns the object's ETag.
    async fn put(
        &self,
        key: &ObjectPath,
        data: Bytes,
        mode: PutMode,
    ) -> Result<Option<String>, object_store::Error> {
        self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        put_or_own(&*self.store, key, data, mode).await
    }
}

/// A PUT under `mode`; a precondition failure whose object holds exactly
/// `data` (our own attempt whose answer was lost, retried) is a success.
async fn put_or_own(
    store: &dyn ObjectStore,
    key: &ObjectPath,
    data: Bytes,
    mode: PutMode,
) -> Result<Option<String>, object_store::Error> {
    let options = PutOptions {
        mode,
        ..PutOptions::default()
    };
    match store
        .put_opts(key, PutPayload::from(data.clone()), options)
        .await
    {
        Ok(r) => Ok(r.e_tag),
        Err(
            e @ (object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }),
        ) => match store.get(key).await {
            Ok(got) => {
                let etag = got.meta.e_tag.clone();
                if got.bytes().await? == data {
                    Ok(etag)
                } else {
                    Err(e)
                }
            }
            Err(_) => Err(e),
        },
        Err(e) => Err(e),
    }
}

impl Medium for S3Medium {
    fn describe(&self) -> String {
        self.location.to_string()
    }

    fn segment_capacity(&self) -> u64 {
        self.capacity
    }

    fn keeps_append_order(&self) -> bool {
        true
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.append_waiting(id, offset, data)
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_at(id, offset, buf)
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        Ok(self.lock().segments.get(&id).map(Segment::len))
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        Ok(self.lock().segments.keys().copied().collect())
    }

    /// Only once the lock is shown still ours: a holder taken over
    /// deletes nothing. (The engine deletes after a commit reached the
    /// vault, which the lease does not fence: a holder paused between its
    /// acknowledged superblock write and the vault's rotation may resume
    /// after a taker opened at the vault's older epoch, whose tree still
    /// names the segments that commit dooms. A pause between this check
    /// and the deletion itself remains: S3 has no delete conditional on
    /// another object.)
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.check_lock()?;
        self.confirm_lock()?;
        self.delete_segment_objects(id)
    }

    /// Acknowledged only once the lock is shown still ours after the
    /// uploads: a holder taken over meanwhile fails (its uploads are of
    /// a generation the new holder's seal leaves out).
    fn sync(&self) -> io::Result<()> {
        self.check_lock()?;
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        self.upload_waiting()?;
        self.confirm_lock()
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        let now = self.fetch_head()?;
        let mut state = self.lock();
        // The first read sets the version later writes are conditional on;
        // later reads do not move it, so a write by another process since
        // stays detected.
        if state.head.is_none() {
            state.head = Some(now.clone());
        }
        Ok(now.slots[slot.index()].clone())
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.check_lock()?;
        if data.len() > SUPERBLOCK_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "superblock too large",
            ));
        }
        if self.lock().head.is_none() {
            self.read_superblock(slot)?;
        }
        let mut next = self.lock().head.clone().expect("just read");
        next.slots[slot.index()] = Some(data.to_vec());
        self.put_head(next)?;
        self.confirm_lock()
    }
}

impl Drop for S3Medium {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            self.release(lock);
        }
    }
}
