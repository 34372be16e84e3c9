//! S3 in the simulator: the real `S3Medium` over `object_store`'s in-memory store behind a seeded fault wrapper, on simulated time, with second writers from this and other containers and holders paused past their lease.
//!
//! One seed in several ([`on_s3`]) runs here instead of on the memory
//! medium. The bucket ([`SimBucket`]) answers from `InMemory`, keeps every
//! version every object ever had (the adversary's), reports
//! `Last-Modified` by the simulated clock, and fails one request when the
//! seed arms it: a 503 (nothing changed), a lost answer (the request took
//! effect, the client got an error), or a lost answer the client retried
//! (the retry meets the first attempt: a precondition failure for a
//! conditional PUT). The lease sees the world through [`SimWorld`]
//! (`oubli_s3::LeaseWorld`): simulated time, renewals the simulator makes
//! every third of the lease, and pids visible only inside their own pid
//! namespace.
//!
//! Besides the marked workload, the seed may
//! * start a second writer in **another container** (same host and boot,
//!   another pid namespace: the holder's pid is invisible to it) while the
//!   holder lives: it must be refused; if it gets in, the holder's next
//!   flush must fail (two writers never both acknowledge);
//! * **pause the holder past its lease**: it stops renewing, simulated time
//!   passes the lease, a second writer takes over and must find what the
//!   holder acknowledged; the holder then wakes and every write, flush and
//!   commit it tries must fail (after a lost lease, nothing is
//!   acknowledged). The taker becomes the holder.
//!
//! After each step the store equals the model; after every acknowledged
//! commit the adversary, holding every version of every object and every
//! record the vault still has, opens nothing deleted before it and
//! everything live.

use super::{Config, Report, SimProvider, SimVault, Trace};
use crate::adversary::Adversary;
use crate::harness;
use crate::workload::{Runner, Step, Workload};
use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use oubli_core::{CreateOptions, Medium, Options, Store, Vault};
use oubli_crypto::CryptoProvider;
use oubli_media::SplitMix64;
use oubli_s3::{Here, LeaseWorld, S3Location, S3Medium};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Whether `seed` runs on S3 (one seed in five, decided apart from the
/// run's random stream; no committed regression seed of the memory media
/// is one).
pub fn on_s3(seed: u64) -> bool {
    ((seed ^ 0xF1BB_CDCB_FA53_E0A8).wrapping_mul(0xA24B_AED4_963E_E407) >> 33).is_multiple_of(5)
}

/// The lease of every simulated writer.
const LEASE: Duration = oubli_s3::LEASE;

/// The simulated clock: the server's and every host's (they agree here;
/// the lease trusts only the server's anyway).
#[derive(Default)]
pub struct ServerClock {
    millis: AtomicU64,
}

/// Where simulated time starts (2026-01-01).
const EPOCH: Duration = Duration::from_secs(1_767_225_600);

impl ServerClock {
    pub fn now(&self) -> Duration {
        Duration::from_millis(self.millis.load(Ordering::SeqCst))
    }
    pub fn advance(&self, by: Duration) {
        self.millis
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
    fn system(&self) -> SystemTime {
        UNIX_EPOCH + EPOCH + self.now()
    }
    fn server(&self) -> DateTime<Utc> {
        DateTime::<Utc>::from(self.system())
    }
}

/// A fault the bucket serves to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S3Fault {
    /// 503: the request failed and changed nothing.
    Unavailable,
    /// A PUT or DELETE took effect; its answer was lost (the client gives up).
    LostAnswer,
    /// A PUT took effect, its answer was lost and the client sent it again.
    LostThenRetried,
}

impl S3Fault {
    fn kind(self) -> &'static str {
        match self {
            S3Fault::Unavailable => "s3 503",
            S3Fault::LostAnswer => "s3 answer lost",
            S3Fault::LostThenRetried => "s3 answer lost, request retried",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Request {
    Put,
    Delete,
    Get,
}

#[derive(Default)]
struct BucketState {
    /// Every body ever stored, by key, oldest first: every version.
    versions: Vec<(String, Bytes)>,
    /// Each object's `Last-Modified` by the simulated clock.
    modified: HashMap<String, DateTime<Utc>>,
    /// The fault for the `n`th next request it applies to.
    armed: Option<(u64, S3Fault)>,
    /// Faults served, and preconditions met by retried PUTs.
    fired: Vec<S3Fault>,
    retried_preconditions: u64,
}

/// The bucket: `InMemory` behind the seed's faults, keeping every version.
pub struct SimBucket {
    inner: InMemory,
    clock: Arc<ServerClock>,
    state: Mutex<BucketState>,
}

impl std::fmt::Debug for SimBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimBucket")
    }
}

impl std::fmt::Display for SimBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimBucket")
    }
}

fn simulated(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "sim-s3",
        source: Box::new(std::io::Error::other(format!("{what} (simulated)"))),
    }
}

impl SimBucket {
    pub fn new(clock: Arc<ServerClock>) -> SimBucket {
        SimBucket {
            inner: InMemory::new(),
            clock,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BucketState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arms `fault` for the `nth` next request it applies to.
    pub fn arm(&self, nth: u64, fault: S3Fault) {
        self.state().armed = Some((nth, fault));
    }

    pub fn disarm(&self) {
        self.state().armed = None;
    }

    /// Faults served so far.
    pub fn fired(&self) -> usize {
        self.state().fired.len()
    }

    /// The fault for this request, if armed for it.
    fn take(&self, request: Request) -> Option<S3Fault> {
        let mut st = self.state();
        let (n, fault) = st.armed?;
        let applies = match fault {
            S3Fault::Unavailable => true,
            S3Fault::LostAnswer => request != Request::Get,
            S3Fault::LostThenRetried => request == Request::Put,
        };
        if !applies {
            return None;
        }
        if n > 0 {
            st.armed = Some((n - 1, fault));
            return None;
        }
        st.armed = None;
        st.fired.push(fault);
        Some(fault)
    }

    fn stored(&self, location: &Path, body: Bytes) {
        let now = self.clock.server();
        let mut st = self.state();
        st.versions.push((location.to_string(), body));
        st.modified.insert(location.to_string(), now);
    }

    /// Every version of every object: `(key, body)`.
    pub fn versions(&self) -> Vec<(String, Bytes)> {
        self.state().versions.clone()
    }

    async fn put_once(
        &self,
        location: &Path,
        payload: PutPayload,
        body: &Bytes,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let r = self.inner.put_opts(location, payload, opts).await;
        if r.is_ok() {
            self.stored(location, body.clone());
        }
        r
    }

    fn dated(&self, mut meta: ObjectMeta) -> ObjectMeta {
        if let Some(at) = self.state().modified.get(meta.location.as_ref()) {
            meta.last_modified = *at;
        }
        meta
    }
}

#[async_trait]
impl ObjectStore for SimBucket {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let body: Bytes = payload
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect::<Vec<u8>>()
            .into();
        match self.take(Request::Put) {
            Some(S3Fault::Unavailable) => Err(simulated("503 Slow Down")),
            Some(S3Fault::LostAnswer) => {
                let _ = self.put_once(location, payload, &body, opts).await;
                Err(simulated("the PUT's answer was lost"))
            }
            Some(S3Fault::LostThenRetried) => {
                self.put_once(location, payload.clone(), &body, opts.clone())
                    .await?;
                let again = self.put_once(location, payload, &body, opts).await;
                if matches!(
                    again,
                    Err(object_store::Error::Precondition { .. }
                        | object_store::Error::AlreadyExists { .. })
                ) {
                    self.state().retried_preconditions += 1;
                }
                again
            }
            None => self.put_once(location, payload, &body, opts).await,
        }
    }

    async fn put_multipart_opts(
        &self,
        _location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // oubli-s3 sends single PUTs only; a multipart upload would escape
        // the recording of every version.
        Err(object_store::Error::NotImplemented)
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if self.take(Request::Get) == Some(S3Fault::Unavailable) {
            return Err(simulated("503 Slow Down"));
        }
        let mut got = self.inner.get_opts(location, options).await?;
        got.meta = self.dated(got.meta);
        Ok(got)
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        match self.take(Request::Delete) {
            Some(S3Fault::Unavailable) => Err(simulated("503 Slow Down")),
            Some(_) => {
                self.inner.delete(location).await?;
                Err(simulated("the DELETE's answer was lost"))
            }
            None => self.inner.delete(location).await,
        }
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, _from: &Path, _to: &Path) -> object_store::Result<()> {
        Err(object_store::Error::NotImplemented)
    }

    async fn copy_if_not_exists(&self, _from: &Path, _to: &Path) -> object_store::Result<()> {
        Err(object_store::Error::NotImplemented)
    }
}

/// The pids running in each pid namespace of the simulated machine.
type Running = Arc<Mutex<BTreeSet<(String, u32)>>>;

/// One simulated process as the lease sees the world.
pub struct SimWorld {
    clock: Arc<ServerClock>,
    here: Here,
    pid: u32,
    running: Running,
}

impl LeaseWorld for SimWorld {
    fn here(&self) -> Here {
        self.here.clone()
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn alive(&self, pid: u32) -> bool {
        // A pid is seen only from its own namespace.
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(self.here.pid_ns.clone(), pid))
    }
    fn server_now(&self) -> Option<DateTime<Utc>> {
        Some(self.clock.server())
    }
    fn wall_clock(&self) -> SystemTime {
        self.clock.system()
    }
    fn renews_itself(&self) -> bool {
        false
    }
}

/// The holder's container, and another one of the same machine.
const NS_HOLDER: &str = "pid:[4026531836]";
const NS_OTHER: &str = "pid:[4026532175]";

/// A writer: its store, its medium (for renewals) and its process.
struct Writer {
    store: Store,
    medium: Arc<S3Medium>,
    pid: u32,
    ns: &'static str,
    last_renewal: Duration,
}

struct S3Sim {
    seed: u64,
    config: Config,
    rng: SplitMix64,
    options: Options,
    provider: Arc<SimProvider>,
    vault: Arc<SimVault>,
    clock: Arc<ServerClock>,
    bucket: Arc<SimBucket>,
    running: Running,
    writer: Option<Writer>,
    next_pid: u32,
    runner: Runner,
    since_ack: Vec<crate::Model>,
    /// The acknowledged state `remember` last saw.
    acked_seen: crate::Model,
    /// Faults served since the last (re)open: what explains a failed step.
    unexplained_from: usize,
    trace: Arc<Mutex<Trace>>,
    progress: Arc<AtomicU64>,
    faults: BTreeMap<&'static str, u64>,
    steps: usize,
}

fn location() -> S3Location {
    S3Location {
        bucket: "sim".into(),
        prefix: "store/".into(),
    }
}

/// Runs one seed on S3.
pub(super) fn run(
    seed: u64,
    config: &Config,
    trace: Arc<Mutex<Trace>>,
    progress: Arc<AtomicU64>,
) -> Result<Report, String> {
    let mut sim = S3Sim::new(seed, config.clone(), trace, progress)?;
    sim.go()?;
    let retried = sim.bucket.state().retried_preconditions;
    if retried > 0 {
        sim.faults
            .insert("s3 precondition failed on a retried put", retried);
    }
    Ok(Report {
        steps: sim.steps,
        faults: sim.faults.clone(),
    })
}

impl S3Sim {
    fn new(
        seed: u64,
        config: Config,
        trace: Arc<Mutex<Trace>>,
        progress: Arc<AtomicU64>,
    ) -> Result<S3Sim, String> {
        let mut rng = SplitMix64::new(seed ^ 0x5333_5eed);
        let scheme = harness::SCHEMES[rng.below(harness::SCHEMES.len() as u64) as usize];
        let mut options = harness::options(seed);
        let provider = Arc::new(SimProvider::new(options.provider.clone()));
        options.provider = provider.clone();
        let clock = Arc::new(ServerClock::default());
        let mut sim = S3Sim {
            seed,
            config,
            rng,
            options,
            provider,
            vault: Arc::new(SimVault::empty()),
            bucket: Arc::new(SimBucket::new(clock.clone())),
            clock,
            running: Arc::default(),
            writer: None,
            next_pid: 100,
            runner: Runner::default(),
            since_ack: Vec::new(),
            acked_seen: crate::Model::default(),
            unexplained_from: 0,
            trace,
            progress,
            faults: BTreeMap::new(),
            steps: 0,
        };
        sim.note(format!(
            "seed {seed}: S3 medium, scheme {}, {} steps",
            harness::scheme_name(scheme),
            sim.config.steps
        ));
        let pid = sim.spawn(NS_HOLDER);
        let medium = sim
            .open_medium(pid, NS_HOLDER)
            .map_err(|e| format!("the first writer cannot open the bucket: {e}"))?;
        let v = sim.vault.clone();
        let store = Store::create(
            medium.clone() as Arc<dyn Medium>,
            move |record| {
                v.store(record)?;
                Ok(v)
            },
            CreateOptions {
                cell_size: harness::TEST_CELL,
                key_scheme: scheme,
            },
            sim.options.clone(),
        )
        .map_err(|e| format!("creating the store on S3 failed: {e}"))?;
        sim.writer = Some(Writer {
            store,
            medium,
            pid,
            ns: NS_HOLDER,
            last_renewal: sim.clock.now(),
        });
        Ok(sim)
    }

    fn note(&self, line: String) {
        if std::env::var_os("OUBLI_SIM_VERBOSE").is_some() {
            eprintln!("{line}");
        }
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .step(line);
    }

    fn note_fault(&mut self, kind: &'static str, line: String) {
        *self.faults.entry(kind).or_default() += 1;
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fault(line);
    }

    /// A new process in namespace `ns`.
    fn spawn(&mut self, ns: &str) -> u32 {
        self.next_pid += 1;
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ns.to_string(), self.next_pid));
        self.next_pid
    }

    fn exit(&self, ns: &str, pid: u32) {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ns.to_string(), pid));
    }

    fn open_medium(&self, pid: u32, ns: &str) -> std::io::Result<Arc<S3Medium>> {
        let world = SimWorld {
            clock: self.clock.clone(),
            here: Here {
                host: "sim-host".into(),
                boot: "sim-boot".into(),
                pid_ns: ns.into(),
            },
            pid,
            running: self.running.clone(),
        };
        let medium = S3Medium::open_writer_on(
            self.bucket.clone() as Arc<dyn ObjectStore>,
            &location(),
            LEASE,
            Arc::new(world),
        )?;
        Ok(Arc::new(
            medium.with_segment_capacity(harness::TEST_SEGMENT),
        ))
    }

    fn writer(&self) -> &Writer {
        self.writer.as_ref().expect("a writer")
    }

    fn go(&mut self) -> Result<(), String> {
        let workload = Workload::with_snapshots(
            self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            self.config.steps,
            6 * harness::TEST_CELL as u64,
            10,
        );
        for (i, step) in workload.steps.iter().enumerate() {
            self.steps = i + 1;
            self.progress.store(i as u64 + 1, Ordering::SeqCst);
            self.arm(i);
            self.tick(i)?;
            match self.rng.below(40) {
                0 => self.other_container(i)?,
                1 => self.paused_holder(i)?,
                2 => self.reopen(i)?,
                _ => {}
            }
            self.step(i, step)?;
            self.remember();
            if let Some(reuse) = self.provider.reuse() {
                return Err(format!("a (key, nonce) pair sealed two messages: {reuse}"));
            }
        }
        self.bucket.disarm();
        self.reopen(self.config.steps)?;
        self.check_model("after the final reopen")?;
        self.check_adversary("at the end")
    }

    /// Simulated time passes (a second or three); the holder renews every
    /// third of its lease.
    fn tick(&mut self, i: usize) -> Result<(), String> {
        self.clock
            .advance(Duration::from_millis(1000 + self.rng.below(2000)));
        let now = self.clock.now();
        let due = now - self.writer().last_renewal >= LEASE / 3;
        if due {
            let renewed = self.writer().medium.renew_lock();
            self.writer.as_mut().expect("a writer").last_renewal = now;
            if !renewed {
                self.note(format!("#{i} the renewal found the lock lost"));
            }
        }
        Ok(())
    }

    fn remember(&mut self) {
        super::remember_state(&self.runner, &mut self.since_ack, &mut self.acked_seen);
    }

    fn arm(&mut self, i: usize) {
        if self.rng.below(self.config.fault_rate) != 0 {
            return;
        }
        let fault = match self.rng.below(3) {
            0 => S3Fault::Unavailable,
            1 => S3Fault::LostAnswer,
            _ => S3Fault::LostThenRetried,
        };
        let nth = self.rng.below(8);
        self.bucket.arm(nth, fault);
        self.note_fault(
            fault.kind(),
            format!("#{i} arm {fault:?} at the {nth}th next request it fits"),
        );
    }

    fn step(&mut self, i: usize, step: &Step) -> Result<(), String> {
        let commits = self.runner.commits;
        let before = self.runner.model.clone();
        let result = self
            .runner
            .step(&self.writer.as_ref().expect("a writer").store, step);
        self.bucket.disarm();
        self.note(format!("#{i} {step:?} -> {}", super::outcome(&result)));
        match result {
            Ok(()) => {
                self.check_model(&format!("after step #{i} {step:?}"))?;
                if self.runner.commits > commits {
                    self.check_adversary(&format!("after step #{i} {step:?}"))?;
                }
                Ok(())
            }
            Err(e) if self.bucket.fired() > self.unexplained_from => {
                self.note(format!("#{i} failed on an S3 fault ({e}); reopening"));
                if let Step::Redact { .. } = step {
                    // A redaction is a delete, then the snapshots' part,
                    // then a flush: the delete alone may have landed.
                    let mut deleted = before.clone();
                    deleted
                        .objects
                        .retain(|oid, _| self.runner.model.objects.contains_key(oid));
                    self.since_ack.push(deleted);
                    self.since_ack.push(self.runner.model.clone());
                }
                self.reopen_after_fault(i)
            }
            Err(e) => Err(format!(
                "step #{i} {step:?} failed with no S3 fault to explain it: {e}"
            )),
        }
    }

    /// The writer closes (its drop flushes: the outcome is unknown) and
    /// opens again; the store must hold the acknowledged state or a later
    /// one.
    fn reopen_after_fault(&mut self, i: usize) -> Result<(), String> {
        let old = self.writer.take().expect("a writer");
        let (pid, ns) = (old.pid, old.ns);
        drop(old);
        self.open_again(i, pid, ns)?;
        self.check_adversary(&format!("after the reopen of #{i}"))
    }

    /// Opens the store again for process `pid`. Its lock may still name
    /// it (a renewal or a release whose answer was lost): a live holder in
    /// its own namespace, so simulated time passes the lease first.
    /// A user opens again after an open that failed on a fault, and waits
    /// out the lease when the lock still names this very process.
    fn open_again(&mut self, i: usize, pid: u32, ns: &'static str) -> Result<(), String> {
        *self.faults.entry("reopen").or_default() += 1;
        let mut attempt = 0;
        let (medium, store) = loop {
            attempt += 1;
            let fired = self.bucket.fired();
            let opened = self
                .open_medium(pid, ns)
                .map_err(|e| (e.kind() == std::io::ErrorKind::WouldBlock, e.to_string()))
                .and_then(|medium| {
                    Store::open(
                        medium.clone() as Arc<dyn Medium>,
                        self.vault.clone(),
                        self.options.clone(),
                    )
                    .map(|store| (medium, store))
                    .map_err(|e| (false, e.to_string()))
                });
            match opened {
                Ok(both) => break both,
                Err((_, e)) if attempt < 4 && self.bucket.fired() > fired => {
                    self.note(format!("#{i} the open failed on an S3 fault ({e}): again"));
                    self.bucket.disarm();
                }
                Err((true, e)) if attempt < 4 => {
                    self.note(format!(
                        "#{i} the lock still names this process ({e}): waiting out the lease"
                    ));
                    self.clock.advance(LEASE + Duration::from_secs(1));
                }
                Err((_, e)) => return Err(format!("#{i}: the store does not reopen on S3: {e}")),
            }
        };
        self.settle(&store, &format!("after the reopen of #{i}"))?;
        self.unexplained_from = self.bucket.fired();
        self.writer = Some(Writer {
            store,
            medium,
            pid,
            ns,
            last_renewal: self.clock.now(),
        });
        Ok(())
    }

    /// A clean close (flush, release) and open.
    fn reopen(&mut self, i: usize) -> Result<(), String> {
        let old = self.writer.take().expect("a writer");
        let (pid, ns) = (old.pid, old.ns);
        let flushed = old.store.flush();
        drop(old);
        match flushed {
            Ok(()) => {
                self.runner.acked = self.runner.model.clone();
                self.since_ack.clear();
            }
            Err(e) if self.bucket.fired() > self.unexplained_from => self.note(format!(
                "#{i} the flush before a reopen failed on an S3 fault: {e}"
            )),
            Err(e) => return Err(format!("#{i}: the flush before a reopen failed: {e}")),
        }
        self.note(format!("#{i} reopen"));
        self.open_again(i, pid, ns)?;
        self.check_model(&format!("after the reopen at #{i}"))
    }

    /// The store must hold the acknowledged state or one reached since;
    /// that one becomes the model.
    fn settle(&mut self, store: &Store, what: &str) -> Result<(), String> {
        super::settle_on(&mut self.runner, &mut self.since_ack, store, what)
    }

    /// A second writer in another container of this machine (same host
    /// and boot, its own pid namespace) while the holder lives and renews:
    /// it must be refused. If it gets in, the holder's next flush must fail.
    fn other_container(&mut self, i: usize) -> Result<(), String> {
        let pid = self.spawn(NS_OTHER);
        self.note_fault(
            "s3 writer in another container",
            format!("#{i} a second writer (pid {pid} in another pid namespace) opens the bucket"),
        );
        let fired = self.bucket.fired();
        let opened = self.open_medium(pid, NS_OTHER);
        match opened {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.note(format!("#{i} refused: {e}"));
                self.exit(NS_OTHER, pid);
                Ok(())
            }
            Err(e) if self.bucket.fired() > fired => {
                self.note(format!(
                    "#{i} the second writer's open failed on an S3 fault: {e}"
                ));
                self.exit(NS_OTHER, pid);
                Ok(())
            }
            Err(e) => {
                self.exit(NS_OTHER, pid);
                Err(format!(
                    "#{i}: a second writer's open failed other than 'in use': {e}"
                ))
            }
            Ok(medium) => {
                self.note(format!(
                    "#{i} the second writer took the lock of a live holder in another container"
                ));
                self.takeover(
                    i,
                    medium,
                    pid,
                    NS_OTHER,
                    "a live holder in another container",
                )
            }
        }
    }

    /// The holder stops (SIGSTOP, a VM paused) past its lease; a second
    /// writer takes over; the holder wakes.
    fn paused_holder(&mut self, i: usize) -> Result<(), String> {
        let ns = if self.rng.coin() { NS_HOLDER } else { NS_OTHER };
        let pause = LEASE + Duration::from_secs(1 + self.rng.below(20));
        self.note_fault(
            "s3 holder paused past its lease",
            format!(
                "#{i} the holder pauses for {}s (lease {}s); a writer in {} takes over",
                pause.as_secs(),
                LEASE.as_secs(),
                if ns == NS_HOLDER {
                    "the same container"
                } else {
                    "another container"
                }
            ),
        );
        self.clock.advance(pause);
        let pid = self.spawn(ns);
        let fired = self.bucket.fired();
        let opened = match self.open_medium(pid, ns) {
            Err(e) if self.bucket.fired() > fired => {
                // Its takeover may have landed with its answer lost: the
                // lock then names the taker, which waits out the lease.
                self.note(format!(
                    "#{i} the taker's open failed on an S3 fault ({e}); it tries again after a lease"
                ));
                self.bucket.disarm();
                self.clock.advance(LEASE + Duration::from_secs(1));
                self.open_medium(pid, ns)
            }
            other => other,
        };
        match opened {
            Ok(medium) => self.takeover(i, medium, pid, ns, "a holder paused past its lease"),
            Err(e) => {
                self.exit(ns, pid);
                Err(format!(
                    "#{i}: the holder was paused {}s, past its lease of {}s, yet a second writer could not take over: {e}",
                    pause.as_secs(),
                    LEASE.as_secs()
                ))
            }
        }
    }

    /// A second writer holds the lock: it must find what the old holder
    /// acknowledged (or a later state); the old holder must acknowledge
    /// nothing more. The second writer becomes the holder.
    fn takeover(
        &mut self,
        i: usize,
        medium: Arc<S3Medium>,
        pid: u32,
        ns: &'static str,
        whom: &str,
    ) -> Result<(), String> {
        let old = self.writer.take().expect("a writer");
        let fired = self.bucket.fired();
        let open = |medium: &Arc<S3Medium>| {
            Store::open(
                medium.clone() as Arc<dyn Medium>,
                self.vault.clone(),
                self.options.clone(),
            )
        };
        let failed = |e| {
            format!("#{i}: the second writer cannot open the store after taking over {whom}: {e}")
        };
        let mut medium = medium;
        let store = match open(&medium) {
            Ok(store) => store,
            Err(e) if self.bucket.fired() > fired => {
                // The user runs the open again: a new medium (this one
                // releases the lock it took).
                self.note(format!(
                    "#{i} the taker's store open failed on an S3 fault ({e}): again"
                ));
                self.bucket.disarm();
                drop(medium);
                medium = self
                    .open_medium(pid, ns)
                    .map_err(|e| failed(e.to_string()))?;
                open(&medium).map_err(|e| failed(e.to_string()))?
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        self.settle(&store, &format!("#{i}: the writer that took over {whom}:"))?;
        // The old holder wakes (or, alive all along, goes on) and writes,
        // flushes and commits: none may be acknowledged.
        if let Some(acked) = self.late_writes(i, &old.store) {
            return Err(format!(
                "#{i}: two writers both acknowledged: after a second writer took over {whom}, the old holder's {acked} succeeded"
            ));
        }
        let (old_pid, old_ns) = (old.pid, old.ns);
        drop(old);
        self.exit(old_ns, old_pid);
        self.unexplained_from = self.bucket.fired();
        self.writer = Some(Writer {
            store,
            medium,
            pid,
            ns,
            last_renewal: self.clock.now(),
        });
        self.check_model(&format!("after the takeover of #{i}"))?;
        self.check_adversary(&format!("after the takeover of #{i}"))
    }

    /// What the old holder tries after the takeover: a write, then a
    /// flush and a commit, which must fail; the first that was
    /// acknowledged, if any. (A write only buffers: a flush with nothing
    /// written would acknowledge nothing.)
    fn late_writes(&mut self, i: usize, store: &Store) -> Option<String> {
        let data = self.own_data(2 * crate::marker::BLOCK);
        let live = self
            .runner
            .model
            .objects
            .keys()
            .copied()
            .find(|&o| o != oubli_core::ROOT_DIR && !self.runner.model.destroyed.contains(&o));
        let wrote = match live {
            Some(oid) => store.write(oid, 0, &data),
            None => store
                .create_object(b"")
                .and_then(|oid| store.write(oid, 0, &data)),
        };
        self.note(format!(
            "#{i} the old holder writes -> {}",
            super::outcome(&wrote)
        ));
        if wrote.is_err() {
            return None;
        }
        let flushed = store.flush();
        self.note(format!(
            "#{i} the old holder flushes -> {}",
            super::outcome(&flushed)
        ));
        if flushed.is_ok() {
            return Some("flush".into());
        }
        let committed = store.commit();
        self.note(format!(
            "#{i} the old holder commits -> {}",
            super::outcome(&committed)
        ));
        committed.is_ok().then(|| "commit".into())
    }

    fn own_data(&mut self, len: usize) -> Vec<u8> {
        // Marker ids apart from the runner's and the memory simulator's.
        let id = (1 << 41) + self.rng.below(1 << 20);
        crate::marker::data(id, len)
    }

    fn check_model(&self, when: &str) -> Result<(), String> {
        match self.runner.model.diff(&self.writer().store) {
            None => Ok(()),
            Some(d) => Err(format!("{when}: the store and the model differ: {d}")),
        }
    }

    /// Both halves of the promise against every version of every object
    /// the bucket ever held and every record the vault still holds.
    fn check_adversary(&self, when: &str) -> Result<(), String> {
        let provider: Arc<dyn CryptoProvider> = self.options.provider.clone();
        let held = self
            .vault
            .readable_records()
            .map_err(|e| format!("{when}: vault: {e}"))?;
        let prefix = location().prefix;
        // Pieces by the generation of the writer that uploaded them: a
        // taken-over holder's late uploads may lie where its taker wrote
        // too, so the adversary reads the bucket once as each generation's
        // loader would (its own pieces over every older one's).
        let mut pieces: BTreeMap<u64, Vec<_>> = BTreeMap::new();
        let mut superblocks = Vec::new();
        for (key, body) in self.bucket.versions() {
            let Some(name) = key.strip_prefix(prefix.as_str()) else {
                continue;
            };
            if name == "superblocks" {
                let slots = oubli_s3::decode_superblocks(&body)
                    .ok_or_else(|| format!("{when}: a version of the superblocks is malformed"))?;
                superblocks.extend(slots.into_iter().flatten());
                continue;
            }
            let generation = match oubli_s3::layout::parse(name) {
                oubli_s3::layout::Object::Run { generation, .. }
                | oubli_s3::layout::Object::Pack(_, generation) => generation,
                oubli_s3::layout::Object::Other => continue,
            };
            for (id, offset, piece) in oubli_s3::layout::pieces_of(name, &body) {
                pieces
                    .entry(generation)
                    .or_default()
                    .push((id, offset, piece.to_vec()));
            }
        }
        superblocks.sort();
        superblocks.dedup();
        let mut recovered = BTreeSet::new();
        for &generation in pieces.keys() {
            let view: Vec<_> = pieces
                .range(..=generation)
                .flat_map(|(_, p)| p.iter().cloned())
                .collect();
            let adversary = Adversary::from_parts(view, superblocks.clone());
            if !adversary.plaintext_markers().is_empty() {
                return Err(format!("{when}: plaintext in the bucket"));
            }
            recovered.extend(adversary.recovered_markers(&held, provider.clone()));
        }
        let leaked: Vec<_> = recovered
            .intersection(&self.runner.erased)
            .take(5)
            .collect();
        if !leaked.is_empty() {
            return Err(format!(
                "{when}: data deleted before the last successful commit opens from the bucket's versions: {leaked:?}"
            ));
        }
        let live = self.runner.live_markers();
        let missing: Vec<_> = live.difference(&recovered).take(5).collect();
        if !missing.is_empty() {
            return Err(format!(
                "{when}: the adversary cannot open live data in the bucket (it is blind): {missing:?}"
            ));
        }
        Ok(())
    }
}
