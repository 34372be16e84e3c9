//! oubli-s3: the `Medium` seam on S3-compatible object storage — segments as immutable run objects, superblock slots fenced by conditional writes.
//!
//! S3 has no append and no rename, and a bucket may keep every version of
//! every object forever. The mapping (docs/FORMAT-media.md, "S3"):
//!
//! * A segment is a sequence of **runs**: the bytes appended to it between
//!   two syncs, uploaded once with `If-None-Match: *` and never written
//!   again — as the object `PREFIX/seg/{id:08x}/{offset:016x}` when the
//!   sync carries one segment, as a piece of one **pack** object when it
//!   carries several (its name lists the pieces: [`layout`]). Reads are
//!   ranged GETs. Appends wait in memory until `sync` (or until
//!   [`RUN_MAX`] bytes wait in all, which are then uploaded as a sync
//!   would), so at most `RUN_MAX` bytes wait at any time.
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
//! * A writer holds `PREFIX/lock` ([`S3Medium::open_writer`]): created with
//!   `If-None-Match: *`, renewed every [`LEASE`]/3 with `If-Match`, marked
//!   released (not deleted) when the medium is dropped. A second writer is refused at open with
//!   the holder's host and pid. A lock left by a process that died (on this
//!   host: its pid is gone; elsewhere: not renewed for a whole lease) is
//!   taken over with `If-Match` on the stale lock, so only one opener wins.
//!   A holder that lost its lock (it was paused past its lease and taken
//!   over) refuses every further write.
//! * A PUT whose answer was lost (a timeout after the server stored it) is
//!   retried by the client and then meets its own object: a precondition
//!   failure whose object holds exactly the bytes written is a success.
//! * Deleting a segment deletes its runs. On a versioned bucket the old
//!   versions stay: ciphertext under keys the vault no longer has.

mod admin;
mod config;
pub mod layout;
mod readahead;
pub mod test_server;

pub use admin::{Admin, History, ObjectVersion};
pub use config::{S3Config, S3Location};
use readahead::{ReadAhead, RunRef};
pub use readahead::{PREFETCH_DEPTH, READ_AHEAD, READ_AHEAD_WINDOWS};

use bytes::Bytes;
use layout::{Object, Piece, PACK_PIECES};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use oubli_core::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes waiting (all segments together) before they are uploaded without
/// waiting for a sync.
pub const RUN_MAX: usize = 16 << 20;

/// Largest segment the engine may write (the engine cleans whole segments:
/// smaller ones free space sooner; runs keep PUTs large regardless).
pub const SEGMENT_CAPACITY: u64 = 64 << 20;

/// How long a writer's lock lasts without renewal before another
/// process may take the store over.
pub const LEASE: Duration = Duration::from_secs(30);

/// A store's medium in a bucket.
pub struct S3Medium {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    location: S3Location,
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
}

/// The lock object a writer holds, and the thread renewing it.
struct WriterLock {
    state: Arc<LockState>,
    renewer: Option<std::thread::JoinHandle<()>>,
}

struct LockState {
    key: ObjectPath,
    token: u128,
    /// The lock's current ETag; `None` once lost or released.
    etag: Mutex<Option<String>>,
    /// Set to stop the renewing thread.
    stop: Mutex<bool>,
    wake: std::sync::Condvar,
}

#[derive(Default)]
struct State {
    segments: BTreeMap<SegmentId, Segment>,
    /// The superblocks object as this process first read or last wrote it;
    /// `None` until looked at.
    head: Option<Head>,
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
    /// The superblocks object is known to announce layout 2 (or not to
    /// exist yet): packs may be written.
    layout_2: bool,
    /// Run objects of gone segments found at open (a deletion cut short).
    stale_runs: Vec<ObjectPath>,
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
/// layout it announces, and the slots.
#[derive(Clone, Default)]
struct Head {
    etag: Option<String>,
    layout: u8,
    slots: [Option<Vec<u8>>; 2],
}

/// The superblocks object starts with this, then one byte: the layout of
/// the store's objects.
const HEAD_MAGIC: &[u8; 7] = b"OUBLIS3";
/// Layout 1: runs only (written as byte 0 by the first versions).
const LAYOUT_1: u8 = 0;
/// Layout 2: runs, packs and the gone list. Older versions refuse it (they
/// would not see the packs): they find the superblocks malformed.
const LAYOUT_2: u8 = 2;

/// The two slots held by one version of the superblocks object (`None`:
/// not an oubli superblocks object): what an adversary holding old
/// versions gets from each.
pub fn decode_superblocks(bytes: &[u8]) -> Option<[Option<Vec<u8>>; 2]> {
    Head::decode(bytes).map(|(_, slots)| slots)
}

impl Head {
    /// `magic, layout byte, then per slot: u32 length (u32::MAX: never
    /// written), bytes`. Always written as layout 2.
    fn encode(&self) -> Vec<u8> {
        let mut out = HEAD_MAGIC.to_vec();
        out.push(LAYOUT_2);
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

    /// The layout byte and the slots.
    fn decode(bytes: &[u8]) -> Option<(u8, [Option<Vec<u8>>; 2])> {
        let (&layout, mut rest) = bytes.strip_prefix(HEAD_MAGIC)?.split_first()?;
        let mut slots: [Option<Vec<u8>>; 2] = [None, None];
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
        rest.is_empty().then_some((layout, slots))
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
    /// Offsets of this segment's own run objects on the server (all of
    /// them, even any past a gap): what deleting it deletes.
    own: BTreeSet<u64>,
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
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("oubli-s3")
            .enable_all()
            .build()?;
        let medium = S3Medium {
            runtime,
            store: Arc::new(store),
            location: location.clone(),
            state: Mutex::new(State::default()),
            syncing: Mutex::new(()),
            capacity: SEGMENT_CAPACITY,
            lock: None,
            puts: Default::default(),
            syncs: Default::default(),
            gets: Default::default(),
            readahead: Default::default(),
        };
        medium.load_segments()?;
        Ok(medium)
    }

    /// [`open`](Self::open) for writing: takes the store's lock first.
    pub fn open_writer(location: &S3Location) -> io::Result<S3Medium> {
        Self::open_writer_with(location, &S3Config::from_env()?, LEASE)
    }

    /// Opens for writing with an explicit configuration and lease.
    pub fn open_writer_with(
        location: &S3Location,
        config: &S3Config,
        lease: Duration,
    ) -> io::Result<S3Medium> {
        let mut medium = Self::open_with(location, config)?;
        medium.take_lock(lease)?;
        // Listed again under the lock: a previous holder may have written since.
        *medium.lock() = State::default();
        medium.load_segments()?;
        medium.tidy();
        Ok(medium)
    }

    fn take_lock(&mut self, lease: Duration) -> io::Result<()> {
        let key = self.key("lock");
        // Unique to this opening: two openings never write the same lock
        // bytes (which would pass for a retried PUT of our own).
        let token = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            ^ (u128::from(std::process::id()) << 64)
            ^ (self as *const S3Medium as u128);
        let mine = Bytes::from(lock_text(token));
        let mut attempts = 0;
        let etag = loop {
            attempts += 1;
            let created = self
                .runtime
                .block_on(self.put(&key, mine.clone(), PutMode::Create));
            match created {
                Ok(etag) => break etag,
                Err(
                    object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. },
                ) => {}
                Err(e) => return Err(self.error("taking the store's lock", e)),
            }
            let held = self.runtime.block_on(async {
                let r = self.store.get(&key).await?;
                let etag = r.meta.e_tag.clone();
                Ok::<_, object_store::Error>((r.bytes().await?, etag))
            });
            let (text, etag) = match held {
                Ok(h) => h,
                // Gone between our PUT and our GET: try again.
                Err(object_store::Error::NotFound { .. }) if attempts < 5 => continue,
                Err(e) => return Err(self.error("reading the store's lock", e)),
            };
            let holder = Holder::parse(&String::from_utf8_lossy(&text));
            if !holder.is_gone(lease) {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: the store is in use by {} (its lock was renewed {}s ago; a lock not renewed for {}s may be taken over)",
                        self.location,
                        holder.who,
                        holder.age().as_secs(),
                        lease.as_secs()
                    ),
                ));
            }
            let mode = PutMode::Update(UpdateVersion {
                e_tag: etag,
                version: None,
            });
            break self
                .runtime
                .block_on(self.put(&key, mine.clone(), mode))
                .map_err(|e| self.error("taking over the lock of a process that is gone", e))?;
        };
        let state = Arc::new(LockState {
            key,
            token,
            etag: Mutex::new(etag),
            stop: Mutex::new(false),
            wake: std::sync::Condvar::new(),
        });
        let (store, handle, st) = (
            self.store.clone(),
            self.runtime.handle().clone(),
            state.clone(),
        );
        let renewer = std::thread::Builder::new()
            .name("oubli-s3-lock".into())
            .spawn(move || renew(&*store, &handle, &st, lease / 3))?;
        self.lock = Some(WriterLock {
            state,
            renewer: Some(renewer),
        });
        Ok(())
    }

    /// Refuses writes once the lock is lost (another process took over).
    fn check_lock(&self) -> io::Result<()> {
        match &self.lock {
            Some(l) if l.state.etag.lock().unwrap_or_else(|p| p.into_inner()).is_none() => {
                Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: this process lost the store's lock (another took it over): writes are refused",
                        self.location
                    ),
                ))
            }
            _ => Ok(()),
        }
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

    fn head_key(&self) -> ObjectPath {
        self.key("superblocks")
    }

    /// Reads the superblocks object as it is on the server now.
    fn fetch_head(&self) -> io::Result<Head> {
        let key = self.head_key();
        let got = self.runtime.block_on(async {
            match self.store.get(&key).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    Ok(Some((r.bytes().await?, etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match got.map_err(|e| self.error("reading the superblocks", e))? {
            None => Ok(Head::default()),
            Some((_, None)) => Err(io::Error::other(format!(
                "{}: the server gave no ETag for the superblocks (conditional writes are needed)",
                self.location
            ))),
            Some((bytes, Some(etag))) => {
                let (layout, slots) = Head::decode(&bytes).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: the superblocks object is malformed", self.location),
                    )
                })?;
                if layout != LAYOUT_1 && layout != LAYOUT_2 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: the store was written by a newer oubli (S3 layout {layout}; this one reads layouts 1 and 2)",
                            self.location
                        ),
                    ));
                }
                Ok(Head {
                    etag: Some(etag),
                    layout,
                    slots,
                })
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists the run and pack objects, reads the gone list, and rebuilds each
    /// segment's runs: from byte 0, each next run is the listed piece that
    /// reaches furthest among those covering the segment's end so far (a
    /// PUT whose answer was lost and that was retried with more bytes left
    /// two objects starting at the same offset: the longer one wins; their
    /// common bytes are equal). Bytes after a gap (impossible unless the
    /// bucket was tampered with) are ignored.
    fn load_segments(&self) -> io::Result<()> {
        let list = |dir: &'static str| {
            let prefix = self.key(dir);
            async move {
                use futures::TryStreamExt;
                self.store
                    .list(Some(&prefix))
                    .try_collect::<Vec<object_store::ObjectMeta>>()
                    .await
            }
        };
        let gone_key = self.key(layout::GONE);
        let gone = async {
            match self.store.get(&gone_key).await {
                Ok(r) => Ok(Some(r.bytes().await?)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let (runs, packs, gone) = self
            .runtime
            .block_on(async { futures::try_join!(list("seg/"), list("pack/"), gone) })
            .map_err(|e| self.error("listing the segments", e))?;
        let gone = match gone {
            None => Vec::new(),
            Some(body) => layout::decode_gone(&body).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: the list of deleted segments is malformed",
                        self.location
                    ),
                )
            })?,
        };
        // Per segment: (offset, length, object, base) of every piece listed.
        let mut pieces: BTreeMap<SegmentId, Vec<(u64, u64, ObjectPath, u64)>> = BTreeMap::new();
        let mut own: BTreeMap<SegmentId, BTreeSet<u64>> = BTreeMap::new();
        let mut state = self.lock();
        let state = &mut *state;
        state.gone = gone.into_iter().collect();
        for meta in runs.iter().chain(&packs) {
            let Some(name) = self.relative(&meta.location) else {
                continue;
            };
            match layout::parse(name) {
                Object::Run { id, offset } => {
                    own.entry(id).or_default().insert(offset);
                    pieces.entry(id).or_default().push((
                        offset,
                        meta.size,
                        meta.location.clone(),
                        0,
                    ));
                }
                Object::Pack(listed) => {
                    if listed.iter().map(|p| p.len).sum::<u64>() != meta.size {
                        // Not what this layout writes: ignored.
                        continue;
                    }
                    let mut base = 0;
                    for p in &listed {
                        let at = (p.offset, p.len, meta.location.clone(), base);
                        pieces.entry(p.id).or_default().push(at);
                        base += p.len;
                    }
                    state.add_pack(name.into(), listed);
                }
                Object::Other => {}
            }
        }
        for (id, offsets) in &own {
            if state.gone.contains(id) {
                let runs = offsets
                    .iter()
                    .map(|&at| self.key(&layout::run_name(*id, at)));
                state.stale_runs.extend(runs);
            }
        }
        for (id, mut listed) in pieces {
            if state.gone.contains(&id) {
                continue;
            }
            listed.sort_by_key(|&(offset, ..)| offset);
            let mut seg = Segment {
                own: own.remove(&id).unwrap_or_default(),
                ..Segment::default()
            };
            let mut end = 0;
            let mut next = 0;
            loop {
                let mut best: Option<&(u64, u64, ObjectPath, u64)> = None;
                while next < listed.len() && listed[next].0 <= end {
                    let candidate = &listed[next];
                    let reach = candidate.0 + candidate.1;
                    if reach > end && best.is_none_or(|b| reach > b.0 + b.1) {
                        best = Some(candidate);
                    }
                    next += 1;
                }
                let Some((offset, len, object, base)) = best else {
                    break;
                };
                seg.runs.insert(
                    end,
                    Run {
                        len: offset + len - end,
                        object: object.clone(),
                        base: base + (end - offset),
                    },
                );
                end = offset + len;
            }
            seg.waiting_at = end;
            state.segments.insert(id, seg);
        }
        Ok(())
    }

    /// A writer's tidying at open: deletes what a crash in the middle of a
    /// segment deletion left (packs whose every segment is gone, run
    /// objects of gone segments), then shortens the gone list.
    /// Best effort: what fails stays for the next opening.
    fn tidy(&self) {
        let (packs, mut doomed) = {
            let mut state = self.lock();
            let packs: Vec<Arc<str>> = state
                .packs
                .iter()
                .filter(|(_, pieces)| pieces.iter().all(|p| !state.segments.contains_key(&p.id)))
                .map(|(name, _)| name.clone())
                .collect();
            (packs, std::mem::take(&mut state.stale_runs))
        };
        doomed.extend(packs.iter().map(|n| self.key(n)));
        if self.delete_objects(doomed).is_ok() {
            self.forget_packs(&packs);
            let _ = self.prune_gone();
        }
    }
    /// Deletes objects, many at once; one already gone is no error.
    fn delete_objects(&self, keys: Vec<ObjectPath>) -> Result<(), object_store::Error> {
        self.runtime
            .block_on(futures::future::try_join_all(keys.iter().map(
                |k| async move {
                    match self.store.delete(k).await {
                        Err(object_store::Error::NotFound { .. }) => Ok(()),
                        other => other,
                    }
                },
            )))
            .map(|_| ())
    }

    /// Forgets deleted packs.
    fn forget_packs(&self, deleted: &[Arc<str>]) {
        let mut state = self.lock();
        let state = &mut *state;
        for name in deleted {
            for p in state.packs.remove(name).unwrap_or_default() {
                if let Some(refs) = state.pack_refs.get_mut(&p.id) {
                    refs.remove(name);
                    if refs.is_empty() {
                        state.pack_refs.remove(&p.id);
                    }
                }
            }
        }
    }

    /// Replaces the gone list (one PUT; the writer alone writes it).
    fn write_gone(&self, ids: BTreeSet<SegmentId>) -> io::Result<()> {
        let key = self.key(layout::GONE);
        let body = Bytes::from(layout::encode_gone(ids.iter().copied()));
        self.runtime
            .block_on(self.put(&key, body, PutMode::Overwrite))
            .map_err(|e| self.error("writing the list of deleted segments", e))?;
        self.lock().gone = ids;
        Ok(())
    }

    /// Drops from the gone list the segments no pack holds a piece of any
    /// more: after those packs were deleted, never before (the list
    /// shortened first would let a listing bring a segment back).
    fn prune_gone(&self) -> io::Result<()> {
        let kept: BTreeSet<SegmentId> = {
            let state = self.lock();
            state
                .gone
                .iter()
                .copied()
                .filter(|id| state.pack_refs.contains_key(id))
                .collect()
        };
        if kept.len() == self.lock().gone.len() {
            return Ok(());
        }
        self.write_gone(kept)
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
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(key, PutPayload::from(data.clone()), options)
            .await
        {
            Ok(r) => Ok(r.e_tag),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => match self.store.get(key).await {
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

    /// Uploads everything waiting, in the order it was appended: as few
    /// PUTs as the pack width allows, one after the other, so that what a
    /// crash leaves is every append up to some point. On failure what was
    /// not uploaded waits again, in front of anything appended since.
    /// Callers hold `syncing`.
    fn upload_waiting(&self) -> io::Result<()> {
        let (order, taken) = {
            let mut state = self.lock();
            let state = &mut *state;
            let order = std::mem::take(&mut state.order);
            state.waiting_bytes = 0;
            let mut taken = BTreeMap::new();
            for (&id, seg) in state.segments.iter_mut() {
                if seg.waiting.is_empty() {
                    continue;
                }
                let bytes = Bytes::from(std::mem::take(&mut seg.waiting));
                let at = seg.waiting_at;
                seg.waiting_at += bytes.len() as u64;
                seg.uploading = Some((at, bytes.clone()));
                taken.insert(id, (at, bytes));
            }
            (order, taken)
        };
        if taken.is_empty() {
            return Ok(());
        }
        let uploads = plan_uploads(&order, &taken);
        let mut sent = 0;
        let mut result = Ok(());
        for pieces in &uploads {
            if let Err(e) = self.upload(pieces, &taken) {
                result = Err(e);
                break;
            }
            sent += 1;
        }
        let mut state = self.lock();
        let state = &mut *state;
        for id in taken.keys() {
            if let Some(seg) = state.segments.get_mut(id) {
                seg.uploading = None;
            }
        }
        if result.is_err() {
            let mut unsent: BTreeMap<SegmentId, u64> = BTreeMap::new();
            let mut order_again = Vec::new();
            for p in uploads[sent..].iter().flatten() {
                unsent.entry(p.id).or_insert(p.offset);
                order_again.push((p.id, p.offset + p.len));
            }
            for (id, from) in unsent {
                let Some(seg) = state.segments.get_mut(&id) else {
                    continue;
                };
                let (at, bytes) = &taken[&id];
                let mut again = bytes[(from - at) as usize..].to_vec();
                state.waiting_bytes += again.len();
                again.extend_from_slice(&seg.waiting);
                seg.waiting = again;
                seg.waiting_at = from;
            }
            order_again.append(&mut state.order);
            state.order = order_again;
        }
        result
    }

    /// One PUT: a run when it carries one segment, a pack otherwise.
    fn upload(
        &self,
        pieces: &[Piece],
        taken: &BTreeMap<SegmentId, (u64, Bytes)>,
    ) -> io::Result<()> {
        let bytes_of = |p: &Piece| {
            let (at, bytes) = &taken[&p.id];
            let from = (p.offset - at) as usize;
            bytes.slice(from..from + p.len as usize)
        };
        let what = || {
            let listed: Vec<String> = pieces
                .iter()
                .map(|p| format!("segment {} at {}", p.id, p.offset))
                .collect();
            format!("writing {}", listed.join(", "))
        };
        if let [p] = pieces {
            let object = self.key(&layout::run_name(p.id, p.offset));
            self.runtime
                .block_on(self.put(&object, bytes_of(p), PutMode::Create))
                .map_err(|e| self.error(&what(), e))?;
            if let Some(seg) = self.lock().segments.get_mut(&p.id) {
                seg.own.insert(p.offset);
                seg.runs.insert(
                    p.offset,
                    Run {
                        len: p.len,
                        object,
                        base: 0,
                    },
                );
            }
            return Ok(());
        }
        self.announce_layout_2()?;
        let name: Arc<str> = layout::pack_name(pieces).into();
        let object = self.key(&name);
        let mut body = Vec::with_capacity(pieces.iter().map(|p| p.len as usize).sum());
        for p in pieces {
            body.extend_from_slice(&bytes_of(p));
        }
        self.runtime
            .block_on(self.put(&object, Bytes::from(body), PutMode::Create))
            .map_err(|e| self.error(&what(), e))?;
        let mut state = self.lock();
        let state = &mut *state;
        let mut base = 0;
        for p in pieces {
            if let Some(seg) = state.segments.get_mut(&p.id) {
                let run = Run {
                    len: p.len,
                    object: object.clone(),
                    base,
                };
                seg.runs.insert(p.offset, run);
            }
            base += p.len;
        }
        state.add_pack(name, pieces.to_vec());
        Ok(())
    }

    /// Makes sure the superblocks object announces layout 2 before the
    /// first pack is written, so that a version that knows only runs
    /// refuses the store instead of missing the packed bytes.
    fn announce_layout_2(&self) -> io::Result<()> {
        if self.lock().layout_2 {
            return Ok(());
        }
        if self.lock().head.is_none() {
            self.read_superblock(Slot::A)?;
        }
        let head = self.lock().head.clone().expect("just read");
        if head.etag.is_some() && head.layout != LAYOUT_2 {
            self.put_head(head)?;
        }
        self.lock().layout_2 = true;
        Ok(())
    }

    /// Writes `next` (slots as they should be) over the superblocks object
    /// this process last saw, conditionally: fenced against any other writer.
    fn put_head(&self, mut next: Head) -> io::Result<()> {
        let mode = match next.etag.take() {
            None => PutMode::Create,
            Some(e_tag) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let key = self.head_key();
        let result = self
            .runtime
            .block_on(self.put(&key, Bytes::from(next.encode()), mode));
        match result {
            Ok(etag) => {
                next.etag = match etag {
                    Some(e) => Some(e),
                    None => self.fetch_head()?.etag,
                };
                next.layout = LAYOUT_2;
                self.lock().head = Some(next);
                Ok(())
            }
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{}: the superblocks were written by another process since this one read them: the store is in use elsewhere ({e})",
                    self.location
                ),
            )),
            Err(e) => Err(self.error("writing the superblocks", e)),
        }
    }
}

/// Splits the appends waiting (in `order`) into uploads, in order: each
/// carries at most [`PACK_PIECES`] segments, and one segment's bytes in one
/// upload are contiguous. Within one upload order does not matter (a PUT
/// is atomic); between uploads it is kept (they are sent one after the
/// other).
fn plan_uploads(
    order: &[(SegmentId, u64)],
    taken: &BTreeMap<SegmentId, (u64, Bytes)>,
) -> Vec<Vec<Piece>> {
    let mut cursor: BTreeMap<SegmentId, u64> =
        taken.iter().map(|(&id, (at, _))| (id, *at)).collect();
    let mut uploads = Vec::new();
    let mut current: BTreeMap<SegmentId, u64> = BTreeMap::new();
    let close = |current: &mut BTreeMap<SegmentId, u64>,
                 cursor: &mut BTreeMap<SegmentId, u64>,
                 uploads: &mut Vec<Vec<Piece>>| {
        let pieces: Vec<Piece> = current
            .iter()
            .filter_map(|(&id, &end)| {
                let from = cursor.insert(id, end)?;
                (end > from).then_some(Piece {
                    id,
                    offset: from,
                    len: end - from,
                })
            })
            .collect();
        if !pieces.is_empty() {
            uploads.push(pieces);
        }
        current.clear();
    };
    // Every segment's whole waiting range comes last, in case the order
    // missed an append (it cannot; a no-op then).
    let ends = taken
        .iter()
        .map(|(&id, (at, bytes))| (id, at + bytes.len() as u64));
    for (id, end) in order.iter().copied().chain(ends) {
        let Some(&from) = cursor.get(&id) else {
            continue;
        };
        if end <= from && !current.contains_key(&id) {
            continue;
        }
        if !current.contains_key(&id) && current.len() == PACK_PIECES {
            close(&mut current, &mut cursor, &mut uploads);
        }
        let e = current.entry(id).or_insert(end);
        *e = (*e).max(end);
    }
    close(&mut current, &mut cursor, &mut uploads);
    uploads
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
        self.check_lock()?;
        let full = {
            let mut state = self.lock();
            let state = &mut *state;
            if offset != 0 && !state.segments.contains_key(&id) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no segment {id} to append to at {offset}"),
                ));
            }
            let seg = state.segments.entry(id).or_default();
            if offset != seg.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "append to segment {id} at {offset}, but it ends at {}",
                        seg.len()
                    ),
                ));
            }
            if offset + data.len() as u64 > self.capacity {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("segment {id} would exceed {} bytes", self.capacity),
                ));
            }
            seg.waiting.extend_from_slice(data);
            let end = offset + data.len() as u64;
            match state.order.last_mut() {
                Some((last, last_end)) if *last == id => *last_end = end,
                _ => state.order.push((id, end)),
            }
            state.waiting_bytes += data.len();
            state.waiting_bytes >= RUN_MAX
        };
        if full {
            // Uploaded as a sync would, everything in order: an early
            // upload of one segment alone could land before earlier
            // appends to another.
            let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
            self.upload_waiting()?;
        }
        Ok(())
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        // What to fetch from uploaded runs: (run, from within it, length,
        // position in buf); and the runs a sequential reader goes on into.
        let mut fetches: Vec<(RunRef, u64, usize, usize)> = Vec::new();
        let mut ahead: Vec<RunRef> = Vec::new();
        {
            let state = self.lock();
            let Some(seg) = state.segments.get(&id) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no segment {id}"),
                ));
            };
            if end > seg.len() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("read of segment {id} past its end"),
                ));
            }
            let mut at = offset;
            while at < end {
                if at >= seg.waiting_at {
                    let from = (at - seg.waiting_at) as usize;
                    let n = (end - at) as usize;
                    buf[(at - offset) as usize..].copy_from_slice(&seg.waiting[from..from + n]);
                    break;
                }
                if let Some((u_at, bytes)) = &seg.uploading {
                    let u_end = u_at + bytes.len() as u64;
                    if (*u_at..u_end).contains(&at) {
                        let n = (end.min(u_end) - at) as usize;
                        let from = (at - u_at) as usize;
                        buf[(at - offset) as usize..][..n].copy_from_slice(&bytes[from..from + n]);
                        at += n as u64;
                        continue;
                    }
                }
                let Some((&run_at, run)) = seg.runs.range(..=at).next_back() else {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no run"));
                };
                let n = (end.min(run_at + run.len) - at) as usize;
                let run = RunRef {
                    run_at,
                    run_len: run.len,
                    object: run.object.clone(),
                    base: run.base,
                };
                fetches.push((run, at - run_at, n, (at - offset) as usize));
                at += n as u64;
            }
            if let Some((last, ..)) = fetches.last() {
                ahead.push(last.clone());
                let next = seg.runs.range(last.run_at + 1..).take(2);
                ahead.extend(next.map(|(&run_at, r)| RunRef {
                    run_at,
                    run_len: r.len,
                    object: r.object.clone(),
                    base: r.base,
                }));
            }
        }
        let ra = &self.readahead;
        let handle = self.runtime.handle();
        let failed = |e| self.error(&format!("reading segment {id}"), e);
        let streak = ra.streak(id, offset, end);
        if streak > 0 {
            // A stream: through the windows, the next ones fetched behind it.
            for (run, from, n, into) in &fetches {
                ra.read_through(handle, &self.store, id, run, *from, &mut buf[*into..][..*n])
                    .map_err(failed)?;
            }
            if let (true, Some((_, from, n, _))) = (streak > 1, fetches.last()) {
                ra.prefetch(handle, &self.store, id, &ahead, from + *n as u64 - 1);
            }
            return Ok(());
        }
        // A random read: from a window if one holds it, else exactly its bytes.
        let mut gets = Vec::new();
        for (run, from, n, into) in fetches {
            if !ra.copy_if_ready(id, &run, from, &mut buf[into..into + n]) {
                gets.push((run, from, n, into));
            }
        }
        self.gets
            .fetch_add(gets.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let got = self
            .runtime
            .block_on(futures::future::try_join_all(gets.iter().map(
                |(run, from, n, _)| {
                    let range = run.base + from..run.base + from + *n as u64;
                    async move { self.store.get_range(&run.object, range).await }
                },
            )))
            .map_err(failed)?;
        for (bytes, (_, _, n, into)) in got.into_iter().zip(&gets) {
            if bytes.len() != *n {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: short read of segment {id}", self.location),
                ));
            }
            buf[*into..into + n].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        Ok(self.lock().segments.get(&id).map(Segment::len))
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        Ok(self.lock().segments.keys().copied().collect())
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        self.readahead.forget(id);
        // Its own runs go; a pack goes with its last live segment. A pack
        // that stays would list this segment again at the next opening:
        // the gone list, written first, keeps it deleted.
        let (runs, dying, listed_gone) = {
            let state = self.lock();
            let Some(seg) = state.segments.get(&id) else {
                return Ok(());
            };
            let runs: Vec<ObjectPath> = seg
                .own
                .iter()
                .map(|&at| self.key(&layout::run_name(id, at)))
                .collect();
            let (mut dying, mut staying) = (Vec::new(), false);
            for name in state.pack_refs.get(&id).into_iter().flatten() {
                let others_live = state.packs.get(name).is_some_and(|pieces| {
                    pieces
                        .iter()
                        .any(|p| p.id != id && state.segments.contains_key(&p.id))
                });
                if others_live {
                    staying = true;
                } else {
                    dying.push(name.clone());
                }
            }
            (runs, dying, staying)
        };
        if listed_gone {
            let mut gone = self.lock().gone.clone();
            gone.insert(id);
            self.write_gone(gone)?;
        }
        let mut doomed = runs;
        doomed.extend(dying.iter().map(|n| self.key(n)));
        self.delete_objects(doomed)
            .map_err(|e| self.error(&format!("deleting segment {id}"), e))?;
        {
            let mut state = self.lock();
            if let Some(seg) = state.segments.remove(&id) {
                // Its appends not uploaded yet are dropped with it.
                state.waiting_bytes -= seg.waiting.len();
                state.order.retain(|&(s, _)| s != id);
            }
        }
        self.forget_packs(&dying);
        self.prune_gone()
    }

    fn sync(&self) -> io::Result<()> {
        self.check_lock()?;
        self.syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _one = self.syncing.lock().unwrap_or_else(|p| p.into_inner());
        self.upload_waiting()
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
        self.put_head(next)
    }
}

impl Drop for S3Medium {
    fn drop(&mut self) {
        let Some(mut lock) = self.lock.take() else {
            return;
        };
        *lock.state.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        lock.state.wake.notify_all();
        if let Some(t) = lock.renewer.take() {
            let _ = t.join();
        }
        // Released only if still ours (not taken over meanwhile): marked
        // released rather than deleted, because some servers refuse
        // `If-None-Match: *` over a delete marker of a versioned bucket.
        let etag = lock
            .state
            .etag
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(etag) = etag {
            let options = PutOptions {
                mode: PutMode::Update(UpdateVersion {
                    e_tag: Some(etag),
                    version: None,
                }),
                ..PutOptions::default()
            };
            let released = PutPayload::from_static(b"oubli-s3-lock v1\nreleased\n");
            let _ = self
                .runtime
                .block_on(self.store.put_opts(&lock.state.key, released, options));
        }
    }
}

/// Renews the lock every `every` until told to stop or until the lock is
/// found taken over (then its ETag becomes `None`: writes are refused).
fn renew(
    store: &dyn ObjectStore,
    handle: &tokio::runtime::Handle,
    st: &LockState,
    every: Duration,
) {
    loop {
        {
            let stop = st.stop.lock().unwrap_or_else(|p| p.into_inner());
            let (stop, _) = st
                .wake
                .wait_timeout(stop, every)
                .unwrap_or_else(|p| p.into_inner());
            if *stop {
                return;
            }
        }
        let current = st.etag.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(etag) = current else { return };
        let options = PutOptions {
            mode: PutMode::Update(UpdateVersion {
                e_tag: Some(etag),
                version: None,
            }),
            ..PutOptions::default()
        };
        let put = handle.block_on(store.put_opts(
            &st.key,
            PutPayload::from(lock_text(st.token)),
            options,
        ));
        let mut slot = st.etag.lock().unwrap_or_else(|p| p.into_inner());
        match put {
            Ok(r) => *slot = r.e_tag,
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => {
                *slot = None;
                return;
            }
            // A network error: try again next round (the lease has room for two misses).
            Err(_) => {}
        }
    }
}

/// What a lock object says: `oubli-s3-lock v1`, `host`, `boot`, `pid`,
/// `token` (unique to the opening) and `renewed` lines.
fn lock_text(token: u128) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!(
        "oubli-s3-lock v1\nhost {}\nboot {}\npid {}\ntoken {token:032x}\nrenewed {now}\n",
        this_host(),
        boot_id(),
        std::process::id()
    )
    .into_bytes()
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The holder a lock object names.
struct Holder {
    released: bool,
    who: String,
    boot: String,
    pid: u32,
    renewed: u64,
}

impl Holder {
    fn parse(text: &str) -> Holder {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                .unwrap_or_default()
        };
        Holder {
            released: text.lines().any(|l| l.trim() == "released"),
            who: format!("pid {} on {}", field("pid "), field("host ")),
            boot: field("boot "),
            pid: field("pid ").parse().unwrap_or(0),
            renewed: field("renewed ").parse().unwrap_or(0),
        }
    }

    fn age(&self) -> Duration {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        Duration::from_secs(now.saturating_sub(self.renewed))
    }

    /// Whether the holder is certainly gone: on this machine (same boot)
    /// its process no longer exists; anywhere, its lease ran out.
    fn is_gone(&self, lease: Duration) -> bool {
        if self.released {
            return true;
        }
        let here = !self.boot.is_empty() && self.boot == boot_id();
        if here && self.pid != 0 && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            return true;
        }
        self.age() > lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After each upload of a plan, what is durable must be exactly what
    /// some prefix of the appends made: the promise of `keeps_append_order`.
    #[test]
    fn uploads_keep_append_order_whatever_the_interleaving() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let segments = 1 + rand(20) as u32;
            let mut ends: BTreeMap<SegmentId, u64> = BTreeMap::new();
            let mut appends = Vec::new();
            for _ in 0..1 + rand(60) {
                let id = rand(u64::from(segments)) as u32;
                let end = ends.entry(id).or_insert(0);
                *end += 1 + rand(5);
                appends.push((id, *end));
            }
            let mut order: Vec<(SegmentId, u64)> = Vec::new();
            for &(id, end) in &appends {
                match order.last_mut() {
                    Some((last, e)) if *last == id => *e = end,
                    _ => order.push((id, end)),
                }
            }
            let taken: BTreeMap<SegmentId, (u64, Bytes)> = ends
                .iter()
                .map(|(&id, &end)| (id, (0, Bytes::from(vec![0u8; end as usize]))))
                .collect();
            let uploads = plan_uploads(&order, &taken);
            let mut durable: BTreeMap<SegmentId, u64> = BTreeMap::new();
            for pieces in &uploads {
                assert!(pieces.len() <= PACK_PIECES);
                for p in pieces {
                    let at = durable.entry(p.id).or_insert(0);
                    assert_eq!(*at, p.offset, "pieces of a segment are contiguous");
                    *at += p.len;
                }
                // Some prefix of the appends gives exactly `durable`.
                let is_prefix = (0..=appends.len()).any(|n| {
                    let mut state: BTreeMap<SegmentId, u64> = BTreeMap::new();
                    for &(id, end) in &appends[..n] {
                        state.insert(id, end);
                    }
                    state == durable
                });
                assert!(
                    is_prefix,
                    "after an upload: {durable:?} is no prefix of {appends:?}"
                );
            }
            assert_eq!(durable, ends, "everything uploaded");
        }
    }
}
