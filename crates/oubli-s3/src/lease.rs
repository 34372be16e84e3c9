//! The writer's lease on `PREFIX/lock`: taken over only on evidence that its holder is gone, renewed, confirmed before each acknowledgement, and the generation that fences a taken-over holder's late uploads.
//!
//! Rules (docs/THREAT_MODEL.md, "Local and network attack surface";
//! format in docs/FORMAT-media.md, "S3"):
//!
//! * A lock is taken over only when it is released, when its holder ran in
//!   this very pid namespace on this host and boot and its pid is gone, or
//!   when the server has not seen it rewritten for a whole lease: its age
//!   is the server's `Date` less the lock object's `Last-Modified`, both
//!   the server's clock (a holder's own clock, written into the lock, is
//!   shown but never trusted). Containers of one machine share the boot id
//!   but not their pids, hence the namespace and the host.
//! * Each opening takes the next **generation** (one above the lock's and
//!   the superblocks'), lists the store under the lock, writes the
//!   **seal** of what it found (`seal/GEN`: each segment's end and the gone
//!   list) and stamps the superblocks with its generation, with `If-Match`
//!   on the version it read. From then on a load trusts objects of an older
//!   generation only within the seal: a paused holder's uploads that land
//!   after the takeover are ignored (and deleted by the next writer), and
//!   its superblock writes fail their `If-Match`.
//! * A sync or superblock write is acknowledged only after a request shows
//!   the lock still holding this writer's ETag (a takeover changes it): the
//!   objects became visible while the lease was held, before any taker
//!   listed the store. A writer that finds its lock gone refuses every
//!   later write.

use crate::{put_or_own, S3Medium, State};
use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a writer's lock lasts without renewal (by the server's clock)
/// before another process may take the store over.
pub const LEASE: Duration = Duration::from_secs(30);

/// The lease: [`LEASE`], or `$OUBLI_S3_LEASE_SECS` whole seconds (one at
/// least) where set — shorter for tests that stop a holder past its lease,
/// longer where a holder may be paused longer. A taker judges a lock by the
/// lease its holder wrote into it, not by its own.
pub(crate) fn lease_from_env() -> io::Result<Duration> {
    match std::env::var("OUBLI_S3_LEASE_SECS") {
        Err(_) => Ok(LEASE),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(secs) if secs >= 1 => Ok(Duration::from_secs(secs)),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("OUBLI_S3_LEASE_SECS={v}: expected a whole number of seconds, at least 1"),
            )),
        },
    }
}

/// The lock object a writer holds, and the thread renewing it.
pub(crate) struct WriterLock {
    state: Arc<LockState>,
    renewer: Option<std::thread::JoinHandle<()>>,
    pub(crate) generation: u64,
}

struct LockState {
    world: Arc<dyn LeaseWorld>,
    key: ObjectPath,
    token: u128,
    generation: u64,
    lease: Duration,
    /// The lock's current ETag; `None` once lost or released. Held across
    /// each renewal and confirmation, so that one never sees the other's
    /// half-done change.
    etag: Mutex<Option<String>>,
    /// Set to stop the renewing thread.
    stop: Mutex<bool>,
    wake: std::sync::Condvar,
}

/// This process's identity, as a lock names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Here {
    pub host: String,
    pub boot: String,
    /// `pid:[INODE]`, as `/proc/self/ns/pid` reads.
    pub pid_ns: String,
}

impl Here {
    pub fn now() -> Here {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|h| h.trim().to_string())
                .unwrap_or_default()
        };
        Here {
            host: Some(read("/proc/sys/kernel/hostname"))
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "unknown-host".into()),
            boot: read("/proc/sys/kernel/random/boot_id"),
            pid_ns: std::fs::read_link("/proc/self/ns/pid")
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// What the lease asks of the world: who this process is, whether a pid
/// runs, the server's clock and when renewals happen. [`RealWorld`] is the
/// real one; the simulator (crates/oubli-testkit/src/sim/s3.rs) supplies
/// its own through [`S3Medium::open_writer_on`], so that simulated time
/// ages and renews the lock and a second writer may live in "another
/// container", without sleeping.
pub trait LeaseWorld: Send + Sync {
    /// This process's host, boot and pid namespace, as its lock names them.
    fn here(&self) -> Here;
    /// This process's pid, as its lock names it.
    fn pid(&self) -> u32;
    /// Whether `pid` runs in this process's pid namespace.
    fn alive(&self, pid: u32) -> bool;
    /// The server's clock now (its `Date`) for a store whose objects report
    /// their `Last-Modified` (`ObjectMeta::last_modified`) by that clock;
    /// `None`: a dated GET asks the server ([`crate::Admin::get_dated`]).
    fn server_now(&self) -> Option<chrono::DateTime<chrono::Utc>>;
    /// This host's clock, written into the lock as `renewed` (shown only).
    fn wall_clock(&self) -> SystemTime;
    /// Whether a thread renews the lock every third of the lease by the
    /// local clock; `false`: the world calls [`S3Medium::renew_lock`] at its
    /// own (simulated) times.
    fn renews_itself(&self) -> bool;
}

/// The real world: `/proc`, the server's dated answers, a renewing thread.
pub struct RealWorld;

impl LeaseWorld for RealWorld {
    fn here(&self) -> Here {
        Here::now()
    }
    fn pid(&self) -> u32 {
        std::process::id()
    }
    fn alive(&self, pid: u32) -> bool {
        pid_alive(pid)
    }
    fn server_now(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        None
    }
    fn wall_clock(&self) -> SystemTime {
        SystemTime::now()
    }
    fn renews_itself(&self) -> bool {
        true
    }
}

/// What a lock object says: `oubli-s3-lock v1`, then `host`, `boot`,
/// `pidns`, `pid`, `gen`, `lease_ms` (the holder's lease), `token` (unique
/// to the opening) and `renewed` (the holder's clock, shown only) lines; or
/// `released` and `gen`.
fn lock_text(world: &dyn LeaseWorld, token: u128, generation: u64, lease: Duration) -> Vec<u8> {
    let here = world.here();
    let now = world
        .wall_clock()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!(
        "oubli-s3-lock v1\nhost {}\nboot {}\npidns {}\npid {}\ngen {generation}\nlease_ms {}\ntoken {token:032x}\nrenewed {now}\n",
        here.host,
        here.boot,
        here.pid_ns,
        world.pid(),
        lease.as_millis()
    )
    .into_bytes()
}

/// The holder a lock object names.
#[derive(Debug, Default)]
pub struct Holder {
    pub released: bool,
    pub host: String,
    pub boot: String,
    pub pid_ns: String,
    pub pid: u32,
    pub generation: u64,
    /// The lease the holder renews against, when it says.
    pub lease: Option<Duration>,
}

impl Holder {
    pub fn parse(text: &str) -> Holder {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                .unwrap_or_default()
        };
        Holder {
            released: text.lines().any(|l| l.trim() == "released"),
            host: field("host "),
            boot: field("boot "),
            pid_ns: field("pidns "),
            pid: field("pid ").parse().unwrap_or(0),
            generation: field("gen ").parse().unwrap_or(0),
            lease: field("lease_ms ").parse().ok().map(Duration::from_millis),
        }
    }

    /// Whether the holder is certainly gone: it released the lock; or it
    /// ran in `here`'s very pid namespace, host and boot and `alive` says
    /// its pid no longer runs; or the server has not seen the lock
    /// rewritten for longer than `lease` (`server_age`: `None` when the
    /// server gave no dates, so never). Anything else may be a live
    /// holder: a container of this machine (same boot, its own pids), a
    /// process paused, a host whose clock is wrong.
    pub fn is_gone(
        &self,
        server_age: Option<Duration>,
        lease: Duration,
        here: &Here,
        alive: impl Fn(u32) -> bool,
    ) -> bool {
        if self.released {
            return true;
        }
        let same_namespace = !self.boot.is_empty()
            && !self.pid_ns.is_empty()
            && self.boot == here.boot
            && self.pid_ns == here.pid_ns
            && self.host == here.host;
        if same_namespace && self.pid != 0 && !alive(self.pid) {
            return true;
        }
        server_age.is_some_and(|age| age > lease)
    }

    fn who(&self) -> String {
        format!("pid {} on {}", self.pid, self.host)
    }
}

/// Whether `pid` runs in this process's pid namespace.
fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl S3Medium {
    /// Takes `PREFIX/lock` with the next generation: creates it when there
    /// is none, takes it over (with `If-Match` on what it read, so only one
    /// opener wins) when its holder is gone, refuses (`WouldBlock`, naming
    /// the holder) otherwise.
    pub(crate) fn take_lock(&mut self, lease: Duration) -> io::Result<()> {
        let key = self.key("lock");
        // Unique to this opening: two openings never write the same lock
        // bytes (which would pass for a retried PUT of our own).
        let token = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
            ^ (u128::from(std::process::id()) << 64)
            ^ (self as *const S3Medium as u128);
        let world = self.world.clone();
        let key_name = key.to_string();
        let mut attempts = 0;
        let (etag, generation) = loop {
            attempts += 1;
            let head_generation = self.fetch_head()?.generation;
            let held = self.get_dated(&key, &key_name).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("{}: reading the store's lock: {e}", self.location),
                )
            })?;
            let Some(held) = held else {
                let generation = head_generation + 1;
                let mine = Bytes::from(lock_text(&*world, token, generation, lease));
                match self.runtime.block_on(self.put(&key, mine, PutMode::Create)) {
                    Ok(etag) => break (etag, generation),
                    // Another opener created it meanwhile: judge theirs.
                    Err(
                        object_store::Error::AlreadyExists { .. }
                        | object_store::Error::Precondition { .. },
                    ) if attempts < 5 => continue,
                    Err(e) => return Err(self.error("taking the store's lock", e)),
                }
            };
            let holder = Holder::parse(&String::from_utf8_lossy(&held.body));
            let holder_lease = holder.lease.unwrap_or(lease);
            if !holder.is_gone(held.age, holder_lease, &world.here(), |pid| {
                world.alive(pid)
            }) {
                let age = match held.age {
                    Some(a) => format!("rewritten {}s ago by the server's clock", a.as_secs()),
                    None => "of unknown age: the server gives no dates".into(),
                };
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{}: the store is in use by {} (its lock was {age}; a lock not renewed for {}s may be taken over)",
                        self.location,
                        holder.who(),
                        holder_lease.as_secs()
                    ),
                ));
            }
            let generation = holder.generation.max(head_generation) + 1;
            let mine = Bytes::from(lock_text(&*world, token, generation, lease));
            let mode = PutMode::Update(UpdateVersion {
                e_tag: held.etag,
                version: None,
            });
            match self.runtime.block_on(self.put(&key, mine, mode)) {
                Ok(etag) => break (etag, generation),
                // Renewed or taken by another meanwhile: judge it again.
                Err(object_store::Error::Precondition { .. }) if attempts < 5 => continue,
                Err(e) => {
                    return Err(self.error("taking over the lock of a process that is gone", e))
                }
            }
        };
        let state = Arc::new(LockState {
            world: world.clone(),
            key,
            token,
            generation,
            lease,
            etag: Mutex::new(etag),
            stop: Mutex::new(false),
            wake: std::sync::Condvar::new(),
        });
        let (store, handle, st) = (
            self.store.clone(),
            self.runtime.handle().clone(),
            state.clone(),
        );
        let renewer = if world.renews_itself() {
            Some(
                std::thread::Builder::new()
                    .name("oubli-s3-lock".into())
                    .spawn(move || renew(&*store, &handle, &st, lease))?,
            )
        } else {
            None
        };
        self.lock = Some(WriterLock {
            state,
            renewer,
            generation,
        });
        Ok(())
    }

    /// The lock object with the server's dates: from the server's dated GET,
    /// or (a world that keeps the server's clock) from the store's own
    /// `Last-Modified` and the world's `server_now`.
    fn get_dated(&self, key: &ObjectPath, key_name: &str) -> io::Result<Option<crate::Dated>> {
        let Some(now) = self.world.server_now() else {
            let admin = crate::Admin::new(&self.config)?;
            return admin.get_dated(&self.location.bucket, key_name);
        };
        let got = self.runtime.block_on(async {
            let got = self.store.get(key).await?;
            let meta = got.meta.clone();
            Ok::<_, object_store::Error>((meta, got.bytes().await?))
        });
        match got {
            Ok((meta, body)) => Ok(Some(crate::Dated {
                body,
                etag: meta.e_tag,
                age: Some(
                    (now - meta.last_modified)
                        .to_std()
                        .unwrap_or(Duration::ZERO),
                ),
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("a dated GET", e)),
        }
    }

    /// Renews the lock once, as the renewing thread does every third of
    /// the lease: for a [`LeaseWorld`] that does not renew by itself.
    /// `false` once the lock is known lost (or there is none).
    pub fn renew_lock(&self) -> bool {
        let Some(lock) = &self.lock else {
            return false;
        };
        let st = &lock.state;
        let body = Bytes::from(lock_text(&*st.world, st.token, st.generation, st.lease));
        renew_once(&*self.store, self.runtime.handle(), st, body)
    }

    /// Starts this writer's generation: lists the store under the lock,
    /// seals what it found, stamps the superblocks with the generation
    /// (`If-Match` on the version read; a late write of the previous holder
    /// landing meanwhile makes it list again).
    pub(crate) fn start_generation(&self) -> io::Result<()> {
        let Some(generation) = self.lock.as_ref().map(|l| l.generation) else {
            return Ok(());
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let head = self.fetch_head()?;
            *self.lock() = State::default();
            self.load_segments(&head)?;
            self.write_seal(generation)?;
            let mut next = head.clone();
            next.generation = generation;
            match self.put_head(next) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && attempts < 3 => continue,
                Err(e) => return Err(e),
            }
            let mut state = self.lock();
            state.generation = generation;
            if head.generation > 0 {
                let old = self.key(&crate::layout::seal_name(head.generation));
                state.stale.push(old);
            }
            return Ok(());
        }
    }

    /// Refuses writes once the lock is known lost (another process took it over).
    pub(crate) fn check_lock(&self) -> io::Result<()> {
        match &self.lock {
            Some(l)
                if l.state
                    .etag
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none() =>
            {
                Err(self.lost())
            }
            _ => Ok(()),
        }
    }

    fn lost(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "{}: this process lost the store's lock (another took it over): writes are refused",
                self.location
            ),
        )
    }

    /// Shows, by asking the server, that the lock still holds this writer's
    /// ETag: whatever was uploaded before became visible while the lease
    /// was held. Called after the uploads of a sync and after a superblock
    /// write, before either is acknowledged. Finding the lock changed marks
    /// it lost for good.
    pub(crate) fn confirm_lock(&self) -> io::Result<()> {
        let Some(lock) = &self.lock else {
            return Ok(());
        };
        let mut slot = lock.state.etag.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mine) = slot.clone() else {
            return Err(self.lost());
        };
        match self.runtime.block_on(self.store.head(&lock.state.key)) {
            Ok(meta) if meta.e_tag.as_deref() == Some(mine.as_str()) => Ok(()),
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                *slot = None;
                Err(self.lost())
            }
            Err(e) => Err(self.error("confirming the store's lock", e)),
        }
    }

    /// Stops the renewing thread and marks the lock released, if still
    /// ours (not taken over meanwhile): marked rather than deleted, because
    /// some servers refuse `If-None-Match: *` over a delete marker of a
    /// versioned bucket; it keeps the generation for the next holder.
    pub(crate) fn release(&self, mut lock: WriterLock) {
        *lock.state.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        lock.state.wake.notify_all();
        if let Some(t) = lock.renewer.take() {
            let _ = t.join();
        }
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
            let released = format!("oubli-s3-lock v1\nreleased\ngen {}\n", lock.generation);
            let _ = self.runtime.block_on(self.store.put_opts(
                &lock.state.key,
                PutPayload::from(released.into_bytes()),
                options,
            ));
        }
    }
}

/// Renews the lock every third of `lease` until told to stop or until the lock is
/// found taken over (then its ETag becomes `None`: writes are refused). A
/// renewal whose answer was lost and that the client retried meets its
/// own first attempt: the same bytes, still ours.
fn renew(
    store: &dyn ObjectStore,
    handle: &tokio::runtime::Handle,
    st: &LockState,
    lease: Duration,
) {
    let every = lease / 3;
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
        let body = Bytes::from(lock_text(&*st.world, st.token, st.generation, st.lease));
        if !renew_once(store, handle, st, body) {
            return;
        }
    }
}

/// One renewal with `body`, conditional on the ETag held; `false` once the
/// lock is known lost (taken over or deleted). A renewal whose answer was
/// lost and that the client sent again meets its own first attempt — the
/// same bytes — and keeps the lock.
fn renew_once(
    store: &dyn ObjectStore,
    handle: &tokio::runtime::Handle,
    st: &LockState,
    body: Bytes,
) -> bool {
    let mut slot = st.etag.lock().unwrap_or_else(|p| p.into_inner());
    let Some(etag) = slot.clone() else {
        return false;
    };
    let mode = PutMode::Update(UpdateVersion {
        e_tag: Some(etag),
        version: None,
    });
    match handle.block_on(put_or_own(store, &st.key, body, mode)) {
        Ok(e_tag) => {
            *slot = e_tag;
            true
        }
        Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => {
            *slot = None;
            false
        }
        // A network error: try again next round (the lease has room for two misses).
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn here() -> Here {
        Here {
            host: "host-a".into(),
            boot: "boot-1".into(),
            pid_ns: "pid:[4026531836]".into(),
        }
    }

    fn holder(host: &str, boot: &str, ns: &str) -> Holder {
        Holder {
            host: host.into(),
            boot: boot.into(),
            pid_ns: ns.into(),
            pid: 1,
            ..Holder::default()
        }
    }

    /// The decision alone: a holder whose pid is not running here is gone
    /// only if it ran in this very namespace, host and boot; otherwise
    /// only the server's clock (the lock's age) or a release frees it.
    #[test]
    fn a_holder_is_gone_only_on_evidence() {
        let lease = Duration::from_secs(30);
        let dead = |_| false;
        let fresh = Some(Duration::from_secs(6));
        let here = here();
        assert!(holder("host-a", "boot-1", "pid:[4026531836]").is_gone(fresh, lease, &here, dead));
        // Another container: same boot, another pid namespace or hostname.
        for (host, ns) in [
            ("host-a", "pid:[4026532175]"),
            ("host-b", "pid:[4026531836]"),
        ] {
            let other = holder(host, "boot-1", ns);
            assert!(!other.is_gone(fresh, lease, &here, dead), "{other:?}");
            assert!(other.is_gone(Some(Duration::from_secs(31)), lease, &here, dead));
        }
        // A lock of an older version names no namespace: only the lease frees it.
        assert!(!holder("host-a", "boot-1", "").is_gone(fresh, lease, &here, dead));
        // Alive in this namespace; the server's age unknown: never.
        let mine = holder("host-a", "boot-1", "pid:[4026531836]");
        assert!(!mine.is_gone(fresh, lease, &here, |_| true));
        assert!(!mine.is_gone(None, lease, &here, |_| true));
        let released = Holder {
            released: true,
            ..Holder::default()
        };
        assert!(released.is_gone(None, lease, &here, |_| true));
    }

    /// A renewal whose first attempt was stored but whose answer was lost
    /// is sent again and meets its own bytes: the lock is still ours (it
    /// was lost, and every write refused, before). Other bytes there are
    /// another holder's: lost.
    #[test]
    fn a_renewal_retried_after_a_lost_answer_keeps_the_lock() {
        use object_store::memory::InMemory;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let store = InMemory::new();
        let key = ObjectPath::from("lock");
        let put = |body: &'static [u8], mode: PutMode| {
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            let r = runtime.block_on(store.put_opts(&key, PutPayload::from_static(body), options));
            r.unwrap().e_tag
        };
        let first = put(b"taken", PutMode::Create);
        let state = LockState {
            world: Arc::new(RealWorld),
            key: key.clone(),
            token: 1,
            generation: 1,
            lease: LEASE,
            etag: Mutex::new(first.clone()),
            stop: Mutex::new(false),
            wake: std::sync::Condvar::new(),
        };
        // The renewal's first attempt lands; its answer never comes back.
        let if_first = || {
            PutMode::Update(UpdateVersion {
                e_tag: first.clone(),
                version: None,
            })
        };
        let landed = put(b"renewed", if_first());
        let handle = runtime.handle();
        assert!(renew_once(
            &store,
            handle,
            &state,
            Bytes::from_static(b"renewed")
        ));
        assert_eq!(*state.etag.lock().unwrap(), landed);
        // Another holder's bytes: lost for good.
        put(b"another holder", PutMode::Overwrite);
        assert!(!renew_once(
            &store,
            handle,
            &state,
            Bytes::from_static(b"renewed")
        ));
        assert_eq!(*state.etag.lock().unwrap(), None);
    }
}
