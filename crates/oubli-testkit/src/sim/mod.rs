//! The seeded simulator (issue 41): one `u64` seed drives the workload, the faults and the interleavings, and an oracle checks every promise after every step.
//!
//! A run builds a store over [`SimMedium`] (cuts, tears, EIO, a capacity
//! that fills) with a [`SimVault`] as its vault and as every share vault,
//! and a [`SimProvider`] that records every seal. The workload is the
//! marked workload of [`Workload::with_shares`] run by the shared
//! [`Runner`] and [`Model`](crate::Model), plus the simulator's own steps
//! (large writes with a seeded operation interleaved while they seal
//! outside the engine lock, reopens, key consolidation). Before a step the
//! seed may arm one fault; after it the oracle checks:
//!
//! * the store equals the model (after a crash: the acknowledged state or
//!   the in-flight one);
//! * after every commit or share destruction reported successful, the
//!   adversary holding every byte ever written, every record the vaults
//!   still hold and every share vault's content opens nothing deleted
//!   before it, and opens everything live (it is not blind);
//! * no key sealed two different messages (the nonce is fixed per key);
//! * a fault is followed by what a user would do (retry the commit or the
//!   share destruction, delete to make room, reopen) and that must work;
//! * no panic, and no step past its deadline (a watchdog, see [`run`]).
//!
//! Threads: the engine's sealing outside its lock is reached through the
//! crypto provider seam ([`SimProvider::interleave_at_next_seal`]), and
//! the scheduled steps of [`sched`] run engine calls (commits, the timer's
//! policy commit, the cleaner, placements) beside a large write under a
//! seeded schedule that switches at the seams; not `shuttle`, which cannot
//! schedule the engine's std locks and threads (see [`sched`]).

pub mod crypto;
mod full;
pub mod media;
pub mod medium;
pub mod s3;
pub mod sched;
pub mod vault;

use crate::adversary::{check_no_rederivation, Adversary};
use crate::harness;
use crate::marker::{self, BLOCK};
use crate::workload::{Runner, Step, Workload};
pub use crypto::SimProvider;
pub use media::{MediumKind, SimClock, SIM_STEP_DEADLINE};
pub use medium::SimMedium;
use oubli_core::{CreateOptions, Error, Medium, Options, Store, Vault, ROOT_DIR};
use oubli_crypto::{CryptoProvider, SecretKey};
use oubli_media::{Fault, SplitMix64, TearMode};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use vault::{SimVault, VaultFault};

/// A deliberate defect in the simulator's own wrappers, to show that each
/// part of the oracle can fail (the mutation check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Every vault keeps every record it was given: a commit's wipe of the
    /// old key is dropped.
    DropVaultWipe,
    /// The random source repeats itself: keys (and with them the fixed
    /// nonce) are reused.
    StuckRandom,
    /// `sync` reports success without making anything durable.
    SkipSync,
    /// A vault hang outlasts the step's simulated deadline.
    UnboundedHang,
}

impl Mutation {
    pub const ALL: [Mutation; 4] = [
        Mutation::DropVaultWipe,
        Mutation::StuckRandom,
        Mutation::SkipSync,
        Mutation::UnboundedHang,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Mutation::DropVaultWipe => "drop-vault-wipe",
            Mutation::StuckRandom => "stuck-random",
            Mutation::SkipSync => "skip-sync",
            Mutation::UnboundedHang => "unbounded-hang",
        }
    }
    pub fn parse(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// What a run does besides its seed.
#[derive(Clone, Debug)]
pub struct Config {
    /// Workload steps per seed.
    pub steps: usize,
    /// A fault is armed before about one step in this many.
    pub fault_rate: u64,
    pub mutation: Option<Mutation>,
    /// Whether the medium may fill (`--no-full` leaves that fault out).
    pub full: bool,
    /// Whether large writes run with an operation interleaved
    /// (`--no-race` leaves them out, to look past a race one has found).
    pub race: bool,
    /// Whether scheduled steps run (sched.rs: engine calls beside a large
    /// write under a seeded schedule; `--no-sched` leaves them out, and
    /// the run's stream is then what it was before they existed).
    pub sched: bool,
    /// The medium every seed runs on (`--medium`); `None`: picked per seed.
    pub medium: Option<MediumKind>,
    /// Whether slow medium and vault calls and vault hangs are simulated
    /// (`--no-slow` leaves them out).
    pub slow: bool,
    /// Whether one seed in several runs on S3 ([`s3::on_s3`]; `--no-s3`
    /// runs those as the others).
    pub s3: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            steps: 150,
            fault_rate: 5,
            mutation: None,
            full: true,
            race: true,
            sched: true,
            medium: None,
            slow: true,
            s3: true,
        }
    }
}

impl Config {
    /// The command that replays `seed` under this configuration.
    pub fn replay(&self, seed: u64) -> String {
        let mut cmd = format!("scripts/simulate --seed {seed}");
        if self.steps != Config::default().steps {
            cmd += &format!(" --steps {}", self.steps);
        }
        if !self.full {
            cmd += " --no-full";
        }
        if !self.race {
            cmd += " --no-race";
        }
        if !self.sched {
            cmd += " --no-sched";
        }
        if let Some(m) = self.medium {
            cmd += &format!(" --medium {}", m.name());
        }
        if !self.slow {
            cmd += " --no-slow";
        }
        if !self.s3 {
            cmd += " --no-s3";
        }
        if let Some(m) = self.mutation {
            cmd += &format!(" --mutation {}", m.name());
        }
        cmd
    }
}

/// What a clean seed did.
#[derive(Debug, Default)]
pub struct Report {
    pub steps: usize,
    /// Faults injected (and fired or not), by kind.
    pub faults: BTreeMap<&'static str, u64>,
}

/// A seed that broke a promise.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub message: String,
    /// The steps that matter: every fault, and the last steps before the failure.
    pub trace: Vec<String>,
    pub replay: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} failed: {}", self.seed, self.message)?;
        writeln!(f, "replay: {}", self.replay)?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// A step that takes longer than this fails the seed (the watchdog aborts
/// the process after printing the replay command: a hung engine thread
/// cannot be unwound).
pub const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Runs one seed. A panic anywhere (the engine's or an oracle's) is a failure.
pub fn run(seed: u64, config: &Config) -> Result<Report, Failure> {
    let trace = Arc::new(Mutex::new(Trace::default()));
    let progress = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (trace, progress, done) = (trace.clone(), progress.clone(), done.clone());
        let replay = config.replay(seed);
        std::thread::spawn(move || watch(seed, replay, trace, progress, done))
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        // Mutations plant defects in the other media's wrappers, and
        // `--medium` names one of those: such seeds stay there.
        if config.s3 && config.mutation.is_none() && config.medium.is_none() && s3::on_s3(seed) {
            return s3::run(seed, config, trace.clone(), progress.clone());
        }
        let mut sim = Sim::new(seed, config.clone(), trace.clone(), progress);
        sim.go().map(|()| sim.report())
    }));
    done.store(true, Ordering::SeqCst);
    let _ = watchdog.join();
    let message = match result {
        Ok(Ok(report)) => return Ok(report),
        Ok(Err(message)) => message,
        Err(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .map(|s| format!("panic: {s}"))
            .unwrap_or_else(|| "panic".into()),
    };
    Err(Failure {
        seed,
        message,
        trace: shortened(&trace),
        replay: config.replay(seed),
    })
}

fn watch(
    seed: u64,
    replay: String,
    trace: Arc<Mutex<Trace>>,
    progress: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) {
    let mut last = (progress.load(Ordering::SeqCst), Instant::now());
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let now = progress.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > STEP_DEADLINE {
            let trace = trace.lock().unwrap_or_else(|p| p.into_inner()).shortened();
            eprintln!(
                "seed {seed} failed: step {now} passed its deadline of {STEP_DEADLINE:?} (a hang)\nreplay: {replay}\n  {}",
                trace.join("\n  ")
            );
            std::process::abort();
        }
    }
}

fn shortened(trace: &Mutex<Trace>) -> Vec<String> {
    trace.lock().unwrap_or_else(|p| p.into_inner()).shortened()
}

/// The steps of a run: faults are kept in full, other steps as the last few.
#[derive(Default)]
struct Trace {
    faults: Vec<String>,
    recent: VecDeque<String>,
}

const RECENT: usize = 12;

impl Trace {
    fn step(&mut self, line: String) {
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(line);
    }
    fn fault(&mut self, line: String) {
        self.faults.push(line.clone());
        self.step(line);
    }
    fn shortened(&self) -> Vec<String> {
        let earlier: Vec<&String> = self
            .faults
            .iter()
            .filter(|f| !self.recent.contains(f))
            .collect();
        let mut out: Vec<String> = earlier[earlier.len().saturating_sub(20)..]
            .iter()
            .map(|s| s.to_string())
            .collect();
        out.push("...".into());
        out.extend(self.recent.iter().cloned());
        out
    }
}

/// One share of the run: its name, vault and whether it was destroyed.
struct SimShare {
    name: String,
    vault: Arc<SimVault>,
    destroyed: bool,
}

type Reachable = Arc<Mutex<Vec<(String, Arc<SimVault>)>>>;

/// The fault armed for the current step.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Armed {
    None,
    Medium(Fault, TearMode),
    MainVault(VaultFault),
    ShareVault(usize, VaultFault),
    Full,
}

/// The simulator's own steps, besides the workload's.
#[derive(Clone, Debug)]
enum Extra {
    /// A write of whole cells to a new object, with another operation run
    /// while it seals outside the engine lock.
    RaceWrite {
        pick: u32,
        with_share: bool,
    },
    Reopen {
        garbage: bool,
    },
    Consolidate,
    /// Engine calls beside a large write under a seeded schedule (sched.rs).
    Sched,
}

/// Marker ids of the simulator's own writes, apart from the runner's.
const OWN_WRITES: u64 = 1 << 40;

struct Sim {
    seed: u64,
    config: Config,
    rng: SplitMix64,
    scheme: u8,
    options: Options,
    provider: Arc<SimProvider>,
    medium: Arc<SimMedium>,
    /// Every medium the run used before a crash: the adversary holds them too.
    past: Vec<Arc<SimMedium>>,
    vault: Arc<SimVault>,
    store: Option<Arc<Store>>,
    runner: Runner,
    shares: Vec<SimShare>,
    reachable: Reachable,
    next_own_write: u64,
    next_share: u64,
    /// The model after each step since the last acknowledgement: the
    /// engine may make any of them durable by itself (a buffer that fills,
    /// a large write), so a crash may land on any.
    since_ack: Vec<crate::Model>,
    /// The acknowledged state `remember` last saw.
    acked_seen: crate::Model,
    trace: Arc<Mutex<Trace>>,
    progress: Arc<AtomicU64>,
    faults: BTreeMap<&'static str, u64>,
    steps: usize,
    /// An EIO was armed since the store was last opened: it may have fired
    /// in the engine's own work (a cleaner slice during a step that
    /// succeeded) and poisoned the store, which a later step then reports.
    eio_since_open: bool,
    /// Who filled the medium, while its capacity is set (sim/full.rs).
    filled_by: Option<full::FilledBy>,
    /// The medium kind, the clock and the slow faults (sim/media.rs).
    media: media::SimMedia,
}

/// Tear modes a power cut picks from. An in-order medium (as S3's is)
/// only ever keeps a prefix of its pending writes.
fn tear_mode(rng: &mut SplitMix64, in_order: bool) -> TearMode {
    match (rng.below(6), in_order) {
        (0, _) => TearMode::DropUnsynced,
        (1, _) => TearMode::KeepAll,
        (2, _) | (3, true) => TearMode::KeepPrefix(rng.below(4) as usize),
        (3, false) => TearMode::RandomSubset,
        (4, _) | (5, true) => TearMode::Torn,
        _ => TearMode::Chaos,
    }
}

/// Whether `seed` runs on a medium that keeps its appends in order (one
/// seed in three; decided apart from the run's random stream).
fn in_order(seed: u64) -> bool {
    (seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 32).is_multiple_of(3)
}

fn memory(seed: u64, mem: oubli_media::MemMedium) -> oubli_media::MemMedium {
    if in_order(seed) {
        mem.in_order()
    } else {
        mem
    }
}

impl Sim {
    fn new(seed: u64, config: Config, trace: Arc<Mutex<Trace>>, progress: Arc<AtomicU64>) -> Sim {
        let mut rng = SplitMix64::new(seed ^ 0x51b0_1a7e);
        let scheme = harness::SCHEMES[rng.below(harness::SCHEMES.len() as u64) as usize];
        let mut options = harness::options(seed);
        let provider = Arc::new(SimProvider::new(options.provider.clone()));
        options.provider = provider.clone();
        let mut media = media::SimMedia::new(seed, &config);
        let medium = media
            .medium(memory(
                seed,
                oubli_media::MemMedium::with_segment_capacity(harness::TEST_SEGMENT),
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let vault = Arc::new(media.vault());
        if config.mutation == Some(Mutation::DropVaultWipe) {
            vault.keep_records.store(true, Ordering::SeqCst);
        }
        let v = vault.clone();
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
            options.clone(),
        )
        .expect("create the store");
        match config.mutation {
            Some(Mutation::StuckRandom) => provider.stuck_random.store(true, Ordering::SeqCst),
            Some(Mutation::SkipSync) => medium.skip_sync.store(true, Ordering::SeqCst),
            _ => {}
        }
        let mut sim = Sim {
            seed,
            config,
            rng,
            scheme,
            options,
            provider,
            medium,
            past: Vec::new(),
            vault,
            store: Some(Arc::new(store)),
            runner: Runner::default(),
            shares: Vec::new(),
            reachable: Arc::default(),
            next_own_write: OWN_WRITES,
            next_share: 0,
            since_ack: Vec::new(),
            acked_seen: crate::Model::default(),
            trace,
            progress,
            faults: BTreeMap::new(),
            steps: 0,
            eio_since_open: false,
            filled_by: None,
            media,
        };
        sim.faults.insert(sim.media.kind.report_key(seed), 1);
        sim.note(format!(
            "seed {seed}: scheme {}, {} medium, {} steps, {}",
            harness::scheme_name(scheme),
            sim.media.kind.label(seed),
            sim.config.steps,
            sim.config
                .mutation
                .map_or("no mutation".to_string(), |m| format!(
                    "mutation {}",
                    m.name()
                ))
        ));
        sim
    }

    fn report(&self) -> Report {
        Report {
            steps: self.steps,
            faults: self.faults.clone(),
        }
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

    fn store(&self) -> Arc<Store> {
        self.store.clone().expect("an open store")
    }

    fn go(&mut self) -> Result<(), String> {
        let workload = Workload::with_shares(
            self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            self.config.steps,
            6 * harness::TEST_CELL as u64,
            10,
        );
        for (i, step) in workload.steps.iter().enumerate() {
            self.steps = i + 1;
            self.progress.store(i as u64 + 1, Ordering::SeqCst);
            self.arm_slow(i);
            if let Some(extra) = self.extra() {
                self.extra_step(i, extra)?;
                self.remember();
            }
            self.workload_step(i, step)?;
            self.remember();
            self.media.check_deadline(i)?;
            if let Some(reuse) = self.provider.reuse() {
                return Err(format!("a (key, nonce) pair sealed two messages: {reuse}"));
            }
        }
        // The end: a clean close and reopen, and every promise once more.
        self.reopen(false)?;
        self.check_model("after the final reopen")?;
        self.check_adversary("at the end")
    }

    /// Maybe one of the simulator's own steps before the next workload step.
    fn extra(&mut self) -> Option<Extra> {
        match self.rng.below(40) {
            0..=2 if self.config.race => Some(Extra::RaceWrite {
                pick: self.rng.next_u64() as u32,
                with_share: self.rng.coin(),
            }),
            3 => Some(Extra::Reopen {
                garbage: self.rng.below(3) == 0,
            }),
            4 => Some(Extra::Consolidate),
            5..=6 if self.config.sched => Some(Extra::Sched),
            _ => None,
        }
    }

    fn live_share(&self, pick: u32) -> Option<usize> {
        let live: Vec<usize> = (0..self.shares.len())
            .filter(|&i| !self.shares[i].destroyed)
            .collect();
        (!live.is_empty()).then(|| live[pick as usize % live.len()])
    }

    /// Chooses the fault for a step, if any, and arms it.
    fn arm(&mut self, i: usize, step: &Step) -> Armed {
        if self.medium.capacity() != u64::MAX || self.rng.below(self.config.fault_rate) != 0 {
            return Armed::None;
        }
        let commits = matches!(step, Step::Commit | Step::Gc);
        let armed = match self.rng.below(10) {
            0..=2 => {
                let fault = if self.rng.coin() {
                    Fault::PowerCut
                } else {
                    Fault::TearThenCut
                };
                Armed::Medium(fault, tear_mode(&mut self.rng, in_order(self.seed)))
            }
            3 => {
                self.eio_since_open = true;
                Armed::Medium(Fault::FailOnce, TearMode::KeepAll)
            }
            4..=5 if commits => Armed::MainVault(self.vault_fault()),
            4..=6 => match step {
                Step::ShareDestroy { pick } => match self.live_share(*pick) {
                    Some(s) => Armed::ShareVault(s, self.vault_fault()),
                    None => Armed::None,
                },
                _ => Armed::Full,
            },
            _ => Armed::Full,
        };
        let armed = match armed {
            Armed::Full if !self.config.full => Armed::None,
            other => other,
        };
        match armed {
            Armed::None => {}
            Armed::Medium(fault, tear) => {
                let at = self.medium.fault.points() + self.rng.below(16);
                self.medium.fault.arm(at, fault);
                let kind = match fault {
                    Fault::FailOnce => "medium eio",
                    Fault::PowerCut => "medium power cut",
                    Fault::TearThenCut => "medium torn write and cut",
                };
                self.note_fault(
                    kind,
                    format!("#{i} arm {kind} at I/O point {at} ({tear:?})"),
                );
            }
            Armed::MainVault(f) => {
                self.vault.arm(f);
                self.note_fault(vault_kind(f, false), format!("#{i} arm main vault {f:?}"));
                self.hang_before(i, None);
            }
            Armed::ShareVault(s, f) => {
                self.shares[s].vault.arm(f);
                self.hang_before(i, Some(s));
                let name = self.shares[s].name.clone();
                self.note_fault(
                    vault_kind(f, true),
                    format!("#{i} arm share vault {name} {f:?}"),
                );
            }
            Armed::Full => self.fill_medium(i),
        }
        armed
    }

    fn vault_fault(&mut self) -> VaultFault {
        match self.rng.below(4) {
            0 => VaultFault::FailStore,
            1 => VaultFault::FailAfterWrite,
            2 => VaultFault::CutBetweenSteps,
            _ => VaultFault::CutAndEraseFails,
        }
    }

    fn heal_vaults(&self) {
        self.vault.heal();
        for s in &self.shares {
            s.vault.heal();
        }
    }

    fn workload_step(&mut self, i: usize, step: &Step) -> Result<(), String> {
        let armed = self.arm(i, step);
        // These put their change in the model first (for a cut); a call
        // that answers NoSpace changed nothing.
        let snapshots = matches!(
            step,
            Step::SnapshotCreate | Step::SnapshotRemove { .. } | Step::Redact { .. }
        )
        .then(|| self.runner.model.snapshots.clone());
        let redacting = matches!(step, Step::Redact { .. }).then(|| self.runner.model.clone());
        let commits = self.runner.commits;
        let store = self.store();
        let result = match step {
            Step::ShareCreate => self.share_create(&store),
            Step::CreateShared { pick } => self.create_shared(&store, *pick),
            Step::ShareDestroy { pick } => self.share_destroy(&store, *pick),
            _ => self.runner.step(&store, step),
        };
        drop(store);
        if let Some(mut between) = redacting {
            // A redaction deletes the object, then redacts the snapshots,
            // whose call flushes what was accepted before its own change:
            // a cut may land between the two.
            between.objects = self.runner.model.objects.clone();
            self.since_ack.push(between);
        }
        self.note(format!("#{i} {step:?} -> {}", outcome(&result)));
        self.medium.fault.disarm();
        if self.medium.fault.is_cut() {
            // The cut may have hit the engine's own threads (the reclaimer
            // deleting segments after a commit) while the step succeeded.
            let tear = match armed {
                Armed::Medium(_, tear) => tear,
                _ => TearMode::DropUnsynced,
            };
            return self.crash(i, tear);
        }
        match result {
            Ok(()) => {
                self.heal_vaults();
                self.check_model(&format!("after step #{i} {step:?}"))?;
                if self.runner.commits > commits {
                    self.check_adversary(&format!("after step #{i} {step:?}"))?;
                }
                Ok(())
            }
            Err(e) => {
                if let (Some(snapshots), true) = (snapshots, is_full(&e)) {
                    self.runner.model.snapshots = snapshots;
                }
                self.recover(i, step, armed, e)
            }
        }
    }

    /// What a user does after a failed step, and what must then hold.
    fn recover(&mut self, i: usize, step: &Step, armed: Armed, e: Error) -> Result<(), String> {
        if self.medium.fault.is_cut() {
            let tear = match armed {
                Armed::Medium(_, tear) => tear,
                _ => TearMode::DropUnsynced,
            };
            return self.crash(i, tear);
        }
        match armed {
            Armed::Medium(Fault::FailOnce, _) => {
                // The store may have stopped taking writes: reopen, as the
                // error says, without a power loss.
                self.reopen_after(i, &e)
            }
            _ if self.medium.capacity() != u64::MAX && is_full(&e) => self.make_room(i, &e),
            // An EIO armed at an earlier step fired in the engine's own
            // work after that step had answered (seed 9182: a cleaner
            // slice); the store says it is poisoned, and the user reopens.
            _ if self.eio_since_open && is_poisoned(&e) => self.reopen_after(i, &e),
            Armed::MainVault(_) => {
                self.heal_vaults();
                // The commit is retried; it must work now.
                self.store()
                    .commit()
                    .map_err(|e2| format!("step #{i} {step:?} failed on a vault fault ({e}); the retried commit failed too: {e2}"))?;
                self.acknowledge_commit();
                self.check_model(&format!("after the retried commit of #{i}"))?;
                self.check_adversary(&format!("after the retried commit of #{i}"))
            }
            Armed::ShareVault(s, _) => {
                self.heal_vaults();
                let store = self.store();
                let (name, vault) = (self.shares[s].name.clone(), self.shares[s].vault.clone());
                store.share_destroy(&name, &*vault).map_err(|e2| {
                    format!("destroying share {name} failed on a share-vault fault ({e}); destroying it again failed too: {e2}")
                })?;
                self.destroyed(s);
                self.check_model(&format!("after share {name} was destroyed again"))?;
                self.check_adversary(&format!("after share {name} was destroyed again"))
            }
            _ => Err(format!(
                "step #{i} {step:?} failed with no fault to explain it ({armed:?}): {e}"
            )),
        }
    }

    fn acknowledge_commit(&mut self) {
        self.runner.acked = self.runner.model.clone();
        self.runner.note_commit();
    }

    fn own_data(&mut self, len: usize) -> Vec<u8> {
        let id = self.next_own_write;
        self.next_own_write += 1;
        for b in 0..(len / BLOCK) as u32 {
            self.runner.written.insert((id, b));
        }
        marker::data(id, len)
    }

    fn share_opener(&self) -> Arc<oubli_core::ShareOpener> {
        let reachable = self.reachable.clone();
        Arc::new(move |share: &oubli_core::ShareRecord| {
            let vaults = reachable.lock().unwrap_or_else(|p| p.into_inner());
            let (_, vault) = vaults
                .iter()
                .find(|(address, _)| *address == share.vault)
                .ok_or_else(|| format!("no vault at {}", share.vault))?;
            // sim-opener-begin
            Ok(Box::new(vault.clone()) as Box<dyn Vault>)
            // sim-opener-end
        })
    }

    fn share_create(&mut self, store: &Store) -> Result<(), Error> {
        // Never a name used before: a share a crash cut mid-creation may
        // be recorded in the store and not here.
        self.next_share += 1;
        let name = format!("t{}", self.next_share);
        let address = format!("mem:{name}");
        let vault = Arc::new(self.media.vault());
        if self.config.mutation == Some(Mutation::DropVaultWipe) {
            vault.keep_records.store(true, Ordering::SeqCst);
        }
        self.reachable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((address.clone(), vault.clone()));
        store.set_share_opener(self.share_opener());
        let v = vault.clone();
        store.share_create(&name, &address, move |record| {
            v.store(record)?;
            Ok(v)
        })?;
        self.shares.push(SimShare {
            name,
            vault,
            destroyed: false,
        });
        self.runner.acked = self.runner.model.clone();
        Ok(())
    }

    fn create_shared(&mut self, store: &Store, pick: u32) -> Result<(), Error> {
        let Some(share) = self.live_share(pick) else {
            return Ok(());
        };
        let oid = store.create_object(b"")?;
        self.runner.model.objects.insert(oid, Vec::new());
        store.set_share(oid, &self.shares[share].name)?;
        self.runner.model.share_of.insert(oid, share);
        Ok(())
    }

    fn doomed(&self, share: usize) -> Vec<u64> {
        self.runner
            .model
            .share_of
            .iter()
            .filter(|(_, s)| **s == share)
            .map(|(oid, _)| *oid)
            .collect()
    }

    fn share_destroy(&mut self, store: &Store, pick: u32) -> Result<(), Error> {
        let Some(share) = self.live_share(pick) else {
            return Ok(());
        };
        // Counted gone once the store says so; after a crash, once the
        // share vault was wiped, whatever the commit did (see `settle`).
        let (name, vault) = (
            self.shares[share].name.clone(),
            self.shares[share].vault.clone(),
        );
        if let Err(e) = store.share_destroy(&name, &*vault) {
            // A full medium may stop the commit that ends a destruction
            // after the share's vault was wiped (seeds 1000920, 50000878):
            // its key is gone, so its data is, and the store says so; the
            // destruction is not reported successful (no adversary check).
            let gone = store
                .shares()
                .iter()
                .any(|s| s.name == name && s.destroyed_at.is_some());
            if gone && is_full(&e) {
                let doomed = self.doomed(share);
                self.runner.model.destroyed.extend(&doomed);
                self.runner.acked.destroyed.extend(&doomed);
                self.shares[share].destroyed = true;
            }
            return Err(e);
        }
        self.destroyed(share);
        Ok(())
    }

    fn destroyed(&mut self, share: usize) {
        let doomed = self.doomed(share);
        self.runner.model.destroyed.extend(&doomed);
        self.shares[share].destroyed = true;
        self.acknowledge_commit();
    }

    fn extra_step(&mut self, i: usize, extra: Extra) -> Result<(), String> {
        match extra {
            Extra::RaceWrite { pick, with_share } => self.race_write(i, pick, with_share),
            Extra::Sched => self.sched_step(i),
            Extra::Reopen { garbage } => {
                self.note(format!(
                    "#{i} reopen{}",
                    if garbage {
                        " (garbage vault record first)"
                    } else {
                        ""
                    }
                ));
                self.reopen(garbage)?;
                self.check_model(&format!("after the reopen before #{i}"))
            }
            Extra::Consolidate => {
                let result = self.store().consolidate_keys();
                self.note(format!(
                    "#{i} consolidate keys -> {}",
                    match &result {
                        Ok(_) => "ok".to_string(),
                        Err(e) => format!("error: {e}"),
                    }
                ));
                if let Err(e) = result {
                    return self.extra_failed(i, "key consolidation", e);
                }
                // Not an acknowledgement: consolidation need not flush.
                self.check_model(&format!("after consolidating keys before #{i}"))
            }
        }
    }

    /// A step of the simulator's own failed: only a full medium, or an EIO
    /// an earlier step armed that poisoned the store, explains it.
    fn extra_failed(&mut self, i: usize, what: &str, e: Error) -> Result<(), String> {
        if self.medium.capacity() != u64::MAX && is_full(&e) {
            return self.make_room(i, &e);
        }
        if self.eio_since_open && is_poisoned(&e) {
            return self.reopen_after(i, &e);
        }
        Err(format!(
            "#{i} {what} failed with no fault to explain it: {e}"
        ))
    }

    /// A large write to a new object while the seed's operation runs as it
    /// seals: placing the object under a share, or writing another object.
    fn race_write(&mut self, i: usize, pick: u32, with_share: bool) -> Result<(), String> {
        let store = self.store();
        let oid = match store.create_object(b"") {
            Ok(oid) => oid,
            Err(e) => return self.extra_failed(i, "creating an object", e),
        };
        self.runner.model.objects.insert(oid, Vec::new());
        let cells = 4 + (pick % 8) as usize;
        let data = self.own_data(cells * harness::TEST_CELL as usize);
        let share = if with_share {
            self.live_share(pick)
        } else {
            None
        };
        let other: Vec<u64> = self
            .runner
            .model
            .objects
            .keys()
            .copied()
            .filter(|&o| o != ROOT_DIR && o != oid && !self.runner.model.destroyed.contains(&o))
            .collect();
        let small = self.own_data(3 * BLOCK);
        let (what, rx) = match (share, other.is_empty()) {
            (Some(s), _) => {
                let (store, name) = (store.clone(), self.shares[s].name.clone());
                let rx = self.provider.interleave_at_next_seal(Box::new(move || {
                    outcome(&store.set_share(oid, &name))
                }));
                (Interleaving::SetShare(s), rx)
            }
            (None, false) => {
                let target = other[pick as usize % other.len()];
                let (store, bytes) = (store.clone(), small.clone());
                let rx = self.provider.interleave_at_next_seal(Box::new(move || {
                    outcome(&store.write(target, 0, &bytes))
                }));
                (Interleaving::Write(target), rx)
            }
            (None, true) => {
                self.provider.disarm();
                return Ok(());
            }
        };
        let kind = match what {
            Interleaving::SetShare(_) => "interleaved set-share",
            Interleaving::Write(_) => "interleaved write",
        };
        self.note_fault(
            kind,
            format!("#{i} write {cells} cells to new object {oid}, {what:?} as it seals"),
        );
        let result = store.write(oid, 0, &data);
        self.provider.disarm();
        let report = rx
            .recv_timeout(STEP_DEADLINE / 2)
            .unwrap_or_else(|_| "did not run".into());
        self.note(format!(
            "#{i} large write -> {}; {what:?} -> {report}",
            outcome(&result)
        ));
        if report == "ok" {
            match what {
                Interleaving::SetShare(s) => {
                    self.runner.model.share_of.insert(oid, s);
                }
                Interleaving::Write(target) => self.runner.model.write(target, 0, &small),
            }
        }
        match result {
            Ok(()) => self.runner.model.write(oid, 0, &data),
            Err(e) => return self.extra_failed(i, "a large write", e),
        }
        self.check_model(&format!(
            "after the large write of #{i} ({what:?} as it sealed)"
        ))
    }

    /// The power went: crash the medium as `tear` says, reopen on what
    /// survived, and find the acknowledged state or the in-flight one.
    fn crash(&mut self, i: usize, tear: TearMode) -> Result<(), String> {
        self.store = None;
        self.heal_vaults();
        let survived = self
            .medium
            .recording()
            .inner()
            .crash(tear, self.seed ^ i as u64);
        let medium = self.media.medium(memory(self.seed, survived))?;
        medium.skip_sync.store(
            self.medium.skip_sync.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
        self.past.push(std::mem::replace(&mut self.medium, medium));
        self.note(format!(
            "#{i} power cut ({tear:?}); reopening what survived"
        ));
        let store = self.open()?;
        self.settle(&store, &format!("after a power cut at #{i} ({tear:?})"))?;
        self.store = Some(Arc::new(store));
        self.finish_cut_destructions(i)?;
        self.check_adversary(&format!("after the power cut at #{i}"))
    }

    fn remember(&mut self) {
        remember_state(&self.runner, &mut self.since_ack, &mut self.acked_seen);
    }

    /// After a crash or a reopen: the store must hold the acknowledged
    /// state or one reached since (in the order the steps ran); that one
    /// becomes the model.
    fn settle(&mut self, store: &Store, what: &str) -> Result<(), String> {
        // A share whose vault was wiped is gone in every candidate state,
        // whether or not the crash let the store record it.
        let wiped: Vec<usize> = (0..self.shares.len())
            .filter(|&s| {
                !self.shares[s].destroyed
                    && self.shares[s]
                        .vault
                        .load()
                        .is_ok_and(|r| r.epoch == oubli_core::SHARE_DESTROYED)
            })
            .collect();
        let r = &mut self.runner;
        for model in self
            .since_ack
            .iter_mut()
            .chain([&mut r.acked, &mut r.model])
        {
            let doomed: Vec<u64> = model
                .share_of
                .iter()
                .filter(|(_, s)| wiped.contains(s))
                .map(|(oid, _)| *oid)
                .collect();
            model.destroyed.extend(doomed);
        }
        settle_on(r, &mut self.since_ack, store, what)
    }

    /// A share destruction the crash cut after its vault was wiped: the
    /// user destroys the share again, which must work.
    fn finish_cut_destructions(&mut self, i: usize) -> Result<(), String> {
        for s in 0..self.shares.len() {
            let (name, vault) = (self.shares[s].name.clone(), self.shares[s].vault.clone());
            let wiped = vault
                .load()
                .is_ok_and(|r| r.epoch == oubli_core::SHARE_DESTROYED);
            if self.shares[s].destroyed || !wiped {
                continue;
            }
            self.note(format!(
                "#{i} share {name}'s vault was wiped before the cut: destroying it again"
            ));
            self.store().share_destroy(&name, &*vault).map_err(|e| {
                format!("share {name}'s destruction was cut at #{i} after its vault was wiped; destroying it again failed: {e}")
            })?;
            self.destroyed(s);
            self.check_model(&format!("after share {name} was destroyed again"))?;
        }
        Ok(())
    }

    /// Reopens after a failed step without a power loss.
    fn reopen_after(&mut self, i: usize, e: &Error) -> Result<(), String> {
        self.note(format!("#{i} failed on EIO ({e}); reopening"));
        self.store = None;
        self.heal_vaults();
        let store = self.open()?;
        self.settle(&store, &format!("after EIO at #{i} and a reopen"))?;
        self.store = Some(Arc::new(store));
        self.finish_cut_destructions(i)?;
        self.check_adversary(&format!("after EIO at #{i} and a reopen"))
    }

    /// A clean close and open; with `garbage`, the vault first hands out a
    /// damaged record, which must be an error, never data.
    fn reopen(&mut self, garbage: bool) -> Result<(), String> {
        if let Some(store) = self.store.take() {
            let store =
                Arc::try_unwrap(store).map_err(|_| "the store is still shared".to_string())?;
            if let Err(e) = store.flush() {
                self.flush_when_full(&store, e)?;
            }
            self.runner.acked = self.runner.model.clone();
        }
        if garbage {
            self.vault.arm(VaultFault::Garbage);
            self.note_fault(
                "main vault garbage at open",
                "garbage vault record at open".into(),
            );
            if Store::open(
                self.medium.clone() as Arc<dyn Medium>,
                self.vault.clone(),
                self.options.clone(),
            )
            .is_ok()
            {
                return Err("the store opened with a damaged vault record".into());
            }
        }
        let store = self.open()?;
        self.store = Some(Arc::new(store));
        Ok(())
    }

    fn open(&mut self) -> Result<Store, String> {
        *self.faults.entry("reopen").or_default() += 1;
        self.medium
            .reopen_backend()
            .map_err(|e| format!("the real medium does not open again: {e}"))?;
        let store = Store::open(
            self.medium.clone() as Arc<dyn Medium>,
            self.vault.clone(),
            self.options.clone(),
        )
        .or_else(|e| self.open_when_full(e))?;
        self.eio_since_open = false;
        store.set_share_opener(self.share_opener());
        // A destruction a crash cut after the store recorded it counts.
        for info in store.shares() {
            if info.destroyed_at.is_some() {
                if let Some(s) = self.shares.iter_mut().find(|s| s.name == info.name) {
                    s.destroyed = true;
                }
            }
        }
        Ok(store)
    }

    fn check_model(&self, when: &str) -> Result<(), String> {
        match self.runner.model.diff(&self.store()) {
            None => Ok(()),
            Some(d) => Err(format!("{when}: the store and the model differ: {d}")),
        }
    }

    /// Every share vault's content, as `(share id, key)`.
    fn share_keys(&self) -> Vec<(u32, SecretKey)> {
        let ids: BTreeMap<String, u32> = self
            .store()
            .shares()
            .into_iter()
            .map(|s| (s.name, s.id))
            .collect();
        let mut out = Vec::new();
        for s in &self.shares {
            let Some(&id) = ids.get(&s.name) else {
                continue;
            };
            for record in s.vault.readable_records().unwrap_or_default() {
                out.push((id, record.key));
            }
        }
        out
    }

    /// Both halves of the promise against every byte every medium of the
    /// run ever held, everything the vaults hold and every share vault.
    fn check_adversary(&self, when: &str) -> Result<(), String> {
        let provider: Arc<dyn CryptoProvider> = self.options.provider.clone();
        let held = self
            .vault
            .readable_records()
            .map_err(|e| format!("{when}: vault: {e}"))?;
        let shares = self.share_keys();
        // A recording over what a crash left holds what was written after
        // it: every recording is read with every superblock version any of
        // them saw, and the current medium whole for what is live.
        let media: Vec<&Arc<SimMedium>> = self.past.iter().chain([&self.medium]).collect();
        let superblocks: Vec<Vec<u8>> = media
            .iter()
            .flat_map(|m| m.recording().every_superblock())
            .map(|(_, b)| b)
            .collect();
        let mut recovered = BTreeSet::new();
        for medium in &media {
            let mut adversary = Adversary::seize(medium.recording());
            adversary.superblocks = superblocks.clone();
            if !adversary.plaintext_markers().is_empty() {
                return Err(format!("{when}: plaintext on the medium"));
            }
            recovered.extend(adversary.recovered_markers_with_shares(
                &held,
                &shares,
                provider.clone(),
            ));
            check_no_rederivation(
                &adversary,
                self.scheme,
                &self.vault.history(),
                &*self.vault,
                &self.runner,
                provider.clone(),
            );
        }
        let now = Adversary {
            superblocks,
            medium: Arc::new(self.medium.recording().inner().clone_state()),
            as_appended: None,
        };
        recovered.extend(now.recovered_markers_with_shares(&held, &shares, provider.clone()));
        let leaked: Vec<_> = recovered
            .intersection(&self.runner.erased)
            .take(5)
            .collect();
        if !leaked.is_empty() {
            return Err(format!(
                "{when}: data deleted before the last successful commit or share destruction opens: {leaked:?}"
            ));
        }
        let live = self.runner.live_markers();
        let missing: Vec<_> = live.difference(&recovered).take(5).collect();
        if !missing.is_empty() {
            return Err(format!(
                "{when}: the adversary cannot open live data (it is blind): {missing:?}"
            ));
        }
        Ok(())
    }
}

// sim-media-begin (slow calls and hangs: sim/media.rs)
impl Sim {
    /// Before a step: clears what the last step's slow fault left, and
    /// maybe arms a slow one (from its own stream, see [`media::SimMedia`]).
    fn arm_slow(&mut self, i: usize) {
        let shares: Vec<(String, Arc<SimVault>)> = self
            .shares
            .iter()
            .filter(|s| !s.destroyed)
            .map(|s| (s.name.clone(), s.vault.clone()))
            .collect();
        let mut vaults: Vec<(&str, &SimVault)> = vec![("main", &*self.vault)];
        vaults.extend(shares.iter().map(|(n, v)| (n.as_str(), &**v)));
        let all: Vec<&SimVault> = vaults.iter().map(|(_, v)| *v).collect();
        self.media.start_step(&self.medium, &all);
        if let Some((kind, line)) = self.media.arm_slow(i, &self.medium, &vaults) {
            self.note_fault(kind, line);
        }
    }

    /// A vault fault was armed: the vault may first hang (bounded).
    fn hang_before(&mut self, i: usize, share: Option<usize>) {
        let vault = match share {
            Some(s) => self.shares[s].vault.clone(),
            None => self.vault.clone(),
        };
        if let Some(took) = self.media.hang_before(&vault) {
            let (kind, name) = match share {
                Some(s) => ("share vault hang", self.shares[s].name.clone()),
                None => ("main vault hang", "main".into()),
            };
            self.note_fault(
                kind,
                format!("#{i} {name} vault hangs {took:?} before its fault"),
            );
        }
    }
}
// sim-media-end

#[derive(Clone, Copy, Debug)]
enum Interleaving {
    SetShare(usize),
    Write(u64),
}

fn vault_kind(f: VaultFault, share: bool) -> &'static str {
    match (f, share) {
        (VaultFault::FailStore, false) => "main vault store fails",
        (VaultFault::FailAfterWrite, false) => "main vault answer lost",
        (VaultFault::CutBetweenSteps, false) => "main vault cut between steps",
        (VaultFault::CutAndEraseFails, false) => "main vault cut, erase fails",
        (VaultFault::Garbage, false) => "main vault garbage",
        (VaultFault::FailStore, true) => "share vault store fails",
        (VaultFault::FailAfterWrite, true) => "share vault answer lost",
        (VaultFault::CutBetweenSteps, true) => "share vault cut between steps",
        (VaultFault::CutAndEraseFails, true) => "share vault cut, erase fails",
        (VaultFault::Garbage, true) => "share vault garbage",
    }
}

/// A medium that filled, as the engine reports it.
/// Records the model after a step among the states a crash may land on
/// (`since_ack`). Only an acknowledgement (the acked state changed) ends
/// them: a model that merely equals a stale acknowledged state (an object a
/// scheduled flush made durable, then deleted) still has the states before
/// it behind it (seed 70001794).
fn remember_state(
    runner: &Runner,
    since_ack: &mut Vec<crate::Model>,
    acked_seen: &mut crate::Model,
) {
    if runner.acked != *acked_seen {
        *acked_seen = runner.acked.clone();
        since_ack.clear();
    }
    if runner.acked != runner.model && since_ack.last() != Some(&runner.model) {
        since_ack.push(runner.model.clone());
    }
}

/// After a crash or a reopen: the store must hold the acknowledged state or
/// one reached since (in the order the steps ran); that one becomes the
/// model and the acknowledged state.
fn settle_on(
    runner: &mut Runner,
    since_ack: &mut Vec<crate::Model>,
    store: &Store,
    what: &str,
) -> Result<(), String> {
    let acked = match runner.acked.diff(store) {
        None => {
            runner.model = runner.acked.clone();
            since_ack.clear();
            return Ok(());
        }
        Some(d) => d,
    };
    let found = since_ack
        .iter()
        .chain([&runner.model])
        .find(|later| later.diff(store).is_none())
        .cloned();
    if let Some(later) = found {
        runner.acked = later.clone();
        runner.model = later;
        since_ack.clear();
        return Ok(());
    }
    let in_flight = runner.model.diff(store).unwrap_or_default();
    Err(format!("{what} the store matches neither the acknowledged state ({acked}) nor any state since, up to the in-flight one ({in_flight})"))
}

/// The engine's answer once an earlier write failed: reopen to recover.
fn is_poisoned(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.to_string() == "store poisoned")
}

fn is_full(e: &Error) -> bool {
    match e {
        Error::NoSpace(_) => true,
        Error::Io { source, .. } => source.kind() == std::io::ErrorKind::StorageFull,
        _ => false,
    }
}

fn outcome<T>(r: &Result<T, Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}
