//! The simulator's media and time: the real directory, file and NAND media behind the seed's faults, a simulated clock that slow calls advance, and each step's deadline in simulated time.
//!
//! A seed runs on memory (as before), or on the real `DirMedium`,
//! `FileMedium` or `NandMedium` (over an in-memory chip). The real medium
//! sits under [`SimMedium`]'s fault layer beside a memory *shadow*: every
//! write reaches both, every read is served by the real medium and checked
//! against the shadow. The shadow is what power cuts act on (dropped, torn
//! and reordered writes, as `MemMedium::crash` makes them) and what the
//! adversary holds; after a cut the real medium is rebuilt from what the
//! shadow kept and opened again by path (or the chip powered up again), so
//! the engine reopens on the real medium's own open path. What this does
//! not reach: a real medium's own crash recovery of half-written
//! metadata (its slot table, a renamed superblock), which the shadow
//! stands in for, and the NAND vault (see [`MediumKind::Nand`]).
//!
//! Time: every medium and vault call advances a [`SimClock`] by a nominal
//! cost; the seed's "slow" faults make some calls cost seconds and a
//! vault "hang" tens of seconds (bounded: the call then fails or
//! succeeds). A step whose simulated duration passes [`SIM_STEP_DEADLINE`]
//! fails the seed. Nothing sleeps: the engine's own timers run on real
//! time and never see the simulated clock, so a hang the engine would have
//! to time out by itself cannot be simulated here (the real-time watchdog
//! in `mod.rs` stays as the backstop for a thread blocked for real).

use super::{in_order, Config, Mutation, SimMedium, SimVault};
use oubli_core::{Medium, Slot};
use oubli_media::{DirMedium, FileMedium, MemMedium, SplitMix64};
use oubli_nand::{Geometry, NandChip, NandMedium, Ubi, UbiConfig};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A step whose calls into the media and vaults take longer than this
/// (simulated) fails the seed.
pub const SIM_STEP_DEADLINE: Duration = Duration::from_secs(60);

/// What an ordinary medium call costs on the simulated clock.
pub const MEDIUM_CALL: Duration = Duration::from_micros(20);
/// What a medium `sync` costs.
pub const MEDIUM_SYNC: Duration = Duration::from_millis(2);
/// What an ordinary vault call costs.
pub const VAULT_CALL: Duration = Duration::from_millis(5);

/// The medium a seed runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediumKind {
    /// `MemMedium` (in order on one seed in three, standing for S3).
    Memory,
    /// `DirMedium` in a scratch directory (on /dev/shm where there is one).
    Dir,
    /// `FileMedium`: one store file in a scratch directory.
    File,
    /// `NandMedium` over UBI over an in-memory raw chip. Its vault is a
    /// `SimVault` like every other seed's: the NAND vault keeps its record
    /// on the chip through its own two-step write, which chip-level cuts
    /// would have to reach; that is not simulated yet (THREAT_MODEL.md).
    Nand,
}

impl MediumKind {
    pub const ALL: [MediumKind; 4] = [
        MediumKind::Memory,
        MediumKind::Dir,
        MediumKind::File,
        MediumKind::Nand,
    ];

    /// The name `--medium` takes.
    pub fn name(self) -> &'static str {
        match self {
            MediumKind::Memory => "mem",
            MediumKind::Dir => "dir",
            MediumKind::File => "file",
            MediumKind::Nand => "nand",
        }
    }

    pub fn parse(name: &str) -> Option<MediumKind> {
        MediumKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The medium of `seed`: `forced` if given; else memory on the seeds
    /// whose medium keeps append order, and one of the four otherwise.
    /// Decided apart from the run's random stream, so that adding a
    /// medium leaves every seed's workload and faults as they were.
    pub fn for_seed(seed: u64, forced: Option<MediumKind>) -> MediumKind {
        if let Some(kind) = forced {
            return kind;
        }
        if in_order(seed) {
            return MediumKind::Memory;
        }
        MediumKind::ALL[((seed.wrapping_mul(0x9FB2_1C65_1E98_DF25) >> 40) % 4) as usize]
    }

    /// How the seed's first trace line names it ("... medium").
    pub fn label(self, seed: u64) -> &'static str {
        match self {
            MediumKind::Memory if in_order(seed) => "in-order memory",
            MediumKind::Memory => "memory",
            MediumKind::Dir => "directory",
            MediumKind::File => "file",
            MediumKind::Nand => "nand",
        }
    }

    /// How [`Report`](super::Report)`.faults` counts the seeds run on it.
    pub fn report_key(self, seed: u64) -> &'static str {
        match self {
            MediumKind::Memory if in_order(seed) => "seeds on the in-order memory medium",
            MediumKind::Memory => "seeds on the memory medium",
            MediumKind::Dir => "seeds on the directory medium",
            MediumKind::File => "seeds on the file medium",
            MediumKind::Nand => "seeds on the nand medium",
        }
    }
}

/// Simulated time: advanced by the media's and vaults' calls, never slept.
#[derive(Debug, Default)]
pub struct SimClock {
    nanos: AtomicU64,
}

impl SimClock {
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    pub fn advance(&self, by: Duration) {
        self.nanos
            .fetch_add(by.as_nanos().min(u64::MAX as u128) as u64, Ordering::SeqCst);
    }
}

/// Where a real medium lives, to open it again.
enum Place {
    Dir(PathBuf),
    File(PathBuf),
    Nand(Arc<NandChip>),
}

/// The real medium under a [`SimMedium`], and how to open it again.
pub struct Backend {
    pub medium: Box<dyn Medium>,
    place: Place,
}

impl Backend {
    /// Drops the handle and opens the medium again, as a restart does: the
    /// directory or file by its path, the chip by powering its image up.
    pub fn reopen(&mut self) -> io::Result<()> {
        // What the engine appended and did not sync stays in the shadow
        // across a restart, as a file system keeps it; the NAND medium
        // holds a page's tail in its own memory, so it syncs first to
        // keep the same (a power cut is the shadow's to model).
        self.medium.sync()?;
        // The old handle holds the store's lock: it goes first.
        self.medium = Box::new(MemMedium::new());
        let (medium, place) = open(&self.place)?;
        self.medium = medium;
        self.place = place;
        Ok(())
    }
}

fn open(place: &Place) -> io::Result<(Box<dyn Medium>, Place)> {
    Ok(match place {
        Place::Dir(path) => (
            Box::new(unlocked(|| DirMedium::open(path))?),
            Place::Dir(path.clone()),
        ),
        Place::File(path) => (
            Box::new(unlocked(|| FileMedium::open(path))?),
            Place::File(path.clone()),
        ),
        Place::Nand(chip) => {
            let chip = Arc::new(NandChip::from_image(chip.image()?)?);
            let ubi = Arc::new(Ubi::attach(chip.clone(), UbiConfig::default())?);
            (Box::new(NandMedium::new(ubi)?), Place::Nand(chip))
        }
    })
}

/// Opens a medium whose previous handle was just dropped: its `flock` can
/// outlive the drop for a moment while a test running in parallel forks a
/// child that has not yet exec'd.
fn unlocked<M>(open: impl Fn() -> io::Result<M>) -> io::Result<M> {
    for _ in 0..100 {
        match open() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => return other,
        }
    }
    open()
}

/// 2 KiB pages, 32 pages per erase block (64 KiB), 512 blocks: 32 MiB, so
/// that a NAND segment (8 LEBs) holds the simulator's 256 KiB segments.
fn nand_geometry() -> Geometry {
    Geometry {
        page_size: 2048,
        pages_per_block: 32,
        blocks: 512,
        oob_bytes: 64,
    }
}

/// A file medium's slot: the smallest allowed, which holds a 256 KiB segment.
const FILE_SLOT: u64 = oubli_media::MIN_SLOT_SIZE;

/// The per-run state of media and time: the medium kind, the scratch
/// directory, the clock and the slow faults' own random stream.
pub struct SimMedia {
    pub kind: MediumKind,
    pub clock: Arc<SimClock>,
    seed: u64,
    scratch: Option<tempfile::TempDir>,
    generation: u64,
    /// The slow faults' stream, apart from the run's: turning them off
    /// (`--no-slow`) leaves every other fault of a seed where it was.
    rng: SplitMix64,
    slow: bool,
    unbounded_hang: bool,
    step_started: Duration,
    /// The medium made last: its real medium is let go when the next is
    /// made (a crash), so that old chips do not pile up in memory.
    last: Option<Arc<SimMedium>>,
}

impl SimMedia {
    pub fn new(seed: u64, config: &Config) -> SimMedia {
        SimMedia {
            kind: MediumKind::for_seed(seed, config.medium),
            clock: Arc::default(),
            seed,
            scratch: None,
            generation: 0,
            rng: SplitMix64::new(seed ^ 0x5107_ca11),
            slow: config.slow,
            unbounded_hang: config.mutation == Some(Mutation::UnboundedHang),
            step_started: Duration::ZERO,
            last: None,
        }
    }

    /// A simulated medium over `mem` (a fresh one, or what a power cut
    /// left): on a real medium, that medium is built anew from `mem`'s
    /// content and opened again, as after a restart.
    pub fn medium(&mut self, mem: MemMedium) -> Result<Arc<SimMedium>, String> {
        if let Some(old) = self.last.take() {
            old.retire();
        }
        let backend = self.backend(&mem).map_err(|e| {
            format!(
                "building the {} medium failed: {e}",
                self.kind.label(self.seed)
            )
        })?;
        let medium = Arc::new(SimMedium::on(mem, backend, self.clock.clone()));
        self.last = Some(medium.clone());
        Ok(medium)
    }

    /// A vault on this run's clock.
    pub fn vault(&self) -> SimVault {
        SimVault::on(self.clock.clone())
    }

    fn scratch(&mut self) -> io::Result<PathBuf> {
        if self.scratch.is_none() {
            // tmpfs where there is one: fsync there costs nothing.
            let shm = std::path::Path::new("/dev/shm");
            let mut builder = tempfile::Builder::new();
            builder.prefix("oubli-sim-");
            self.scratch = Some(match shm.is_dir() {
                true => builder.tempdir_in(shm).or_else(|_| builder.tempdir())?,
                false => builder.tempdir()?,
            });
        }
        Ok(self
            .scratch
            .as_ref()
            .expect("made above")
            .path()
            .to_path_buf())
    }

    fn backend(&mut self, from: &MemMedium) -> io::Result<Option<Backend>> {
        if self.kind == MediumKind::Memory {
            return Ok(None);
        }
        let scratch = self.scratch()?;
        self.generation += 1;
        let n = self.generation;
        // The medium before the cut is of no more use: its bytes are in
        // the shadow's recording, which the adversary holds.
        if n > 1 {
            let _ = std::fs::remove_dir_all(scratch.join(format!("{}", n - 1)));
            let _ = std::fs::remove_file(scratch.join(format!("{}.img", n - 1)));
        }
        let (medium, place): (Box<dyn Medium>, Place) = match self.kind {
            MediumKind::Memory => unreachable!("returned above"),
            MediumKind::Dir => {
                let path = scratch.join(format!("{n}"));
                (Box::new(DirMedium::create(&path)?), Place::Dir(path))
            }
            MediumKind::File => {
                let path = scratch.join(format!("{n}.img"));
                (
                    Box::new(FileMedium::create(&path, None, FILE_SLOT)?),
                    Place::File(path),
                )
            }
            MediumKind::Nand => {
                // Block 17 bad, as the NAND tests have it.
                let chip = Arc::new(NandChip::in_memory(nand_geometry(), &[17], None)?);
                let ubi = Arc::new(Ubi::attach(chip.clone(), UbiConfig::default())?);
                (Box::new(NandMedium::new(ubi)?), Place::Nand(chip))
            }
        };
        if medium.segment_capacity() < from.segment_capacity() {
            return Err(io::Error::other(format!(
                "its segments hold {} bytes, fewer than the simulator's {}",
                medium.segment_capacity(),
                from.segment_capacity()
            )));
        }
        let mut backend = Backend { medium, place };
        copy(from, &*backend.medium)?;
        backend.reopen()?;
        Ok(Some(backend))
    }

    /// Before each step: slow calls the previous step armed and did not
    /// spend are cleared, and the step's simulated time starts.
    pub fn start_step(&mut self, medium: &SimMedium, vaults: &[&SimVault]) {
        medium.slow_calls(0, Duration::ZERO);
        for v in vaults {
            v.delay_next(Duration::ZERO);
        }
        self.step_started = self.clock.now();
    }

    /// Maybe a slow fault for this step (about one step in eight): the
    /// next few medium calls, or one vault's next call, take seconds. The
    /// calls then succeed (or meet whatever else the step armed). Returns
    /// the fault's kind and trace line.
    pub fn arm_slow(
        &mut self,
        i: usize,
        medium: &SimMedium,
        vaults: &[(&str, &SimVault)],
    ) -> Option<(&'static str, String)> {
        if !self.slow || self.rng.below(8) != 0 {
            return None;
        }
        if self.rng.coin() || vaults.is_empty() {
            let calls = 1 + self.rng.below(4);
            let each = Duration::from_millis(100 + self.rng.below(1900));
            medium.slow_calls(calls, each);
            return Some((
                "medium slow calls",
                format!("#{i} the next {calls} medium calls take {each:?} each"),
            ));
        }
        let (name, vault) = vaults[self.rng.below(vaults.len() as u64) as usize];
        let took = Duration::from_millis(500 + self.rng.below(9500));
        vault.delay_next(took);
        let kind = if name == "main" {
            "main vault slow call"
        } else {
            "share vault slow call"
        };
        Some((
            kind,
            format!("#{i} {name} vault's next call takes {took:?}"),
        ))
    }

    /// When a vault fault is armed: maybe the vault first hangs (half the
    /// time), for 10 to 25 simulated seconds before the fault fires, so
    /// that a step survives one hang within its deadline. Returns how long.
    pub fn hang_before(&mut self, vault: &SimVault) -> Option<Duration> {
        if !self.slow || (!self.unbounded_hang && self.rng.coin()) {
            return None;
        }
        let took = if self.unbounded_hang {
            2 * SIM_STEP_DEADLINE
        } else {
            Duration::from_millis(10_000 + self.rng.below(15_000))
        };
        vault.delay_next(took);
        Some(took)
    }

    /// After each step: its simulated duration must stay under the deadline.
    pub fn check_deadline(&self, i: usize) -> Result<(), String> {
        let took = self.clock.now().saturating_sub(self.step_started);
        if took > SIM_STEP_DEADLINE {
            return Err(format!(
                "step #{i} took {took:?} of simulated time, past its simulated deadline of {SIM_STEP_DEADLINE:?}"
            ));
        }
        Ok(())
    }
}

/// Writes every segment and superblock of `from` to `to`, and syncs.
fn copy(from: &MemMedium, to: &dyn Medium) -> io::Result<()> {
    for id in from.list_segments()? {
        let len = from.segment_len(id)?.unwrap_or(0);
        let mut buf = vec![0; len as usize];
        from.read(id, 0, &mut buf)?;
        to.append(id, 0, &buf)?;
    }
    for slot in [Slot::A, Slot::B] {
        if let Some(sb) = from.read_superblock(slot)? {
            to.write_superblock(slot, &sb)?;
        }
    }
    to.sync()
}
