//! `oubli mount` / `oubli umount`: the store as a FUSE file system (oubli-fuse) in which rm, truncate and overwrite erase at the next commit.
//!
//! `mount` detaches once the file system is up (or stays in the foreground
//! with `--foreground`). The process holds the store open: it commits on the
//! epoch policy (its timer), at once on SIGUSR1 or `oubli commit` (the
//! store's control socket), after deleting anything marked sensitive, and at
//! unmount. `umount` unmounts and waits for that last commit, and fails
//! as the mount process does (exit 6, the deletions still recoverable
//! named) when it did not go through.

use crate::failure::Failure;
use crate::session::{self, Access, Global};
use oubli::control::Refusal;
use oubli::retention::{self, Retention};
use oubli::{exit, Store};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Arguments of `oubli mount`.
#[derive(clap::Args)]
pub struct MountArgs {
    /// The directory to mount the store on
    mountpoint: PathBuf,
    /// Mount options, comma-separated (repeatable): allow_other, default_permissions, ro,
    /// fsname=NAME, subtype=TYPE, epoch_interval=SECS, epoch_bytes=N, epoch_deletions=N,
    /// snapdir=visible|hidden, snapshot_every=DURATION, snapshot_keep=N,
    /// and kernel options such as noatime
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (default: detach once the file system is mounted)
    #[arg(long, short = 'f')]
    foreground: bool,
    /// Write the store's figures in Prometheus' text format to PATH at every commit
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
}

/// Arguments of `oubli umount`.
#[derive(clap::Args)]
pub struct UmountArgs {
    /// The mount point
    mountpoint: PathBuf,
    /// Seconds to wait for the mount process's final commit
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    wait: u64,
    #[command(flatten)]
    cert: crate::cert_cmd::CertArgs,
}

fn log(line: &str) {
    eprintln!("oubli mount: {line}");
}

/// The pipe a detached mount process reports through: `ok` once mounted, or the failure.
struct Ready(Option<OwnedFd>);

impl Ready {
    fn send(&mut self, message: &str) {
        if let Some(fd) = self.0.take() {
            let mut f = std::fs::File::from(fd);
            let _ = f.write_all(message.as_bytes());
        }
    }
}

/// Forks: the parent waits for the child's report and exits with it; the
/// child returns (in a new session, cwd `/`) with the pipe to report through.
/// Called before any thread exists (forking a threaded process is unsafe).
fn detach() -> Result<Ready, Failure> {
    let mut fds = [0; 2];
    // SAFETY: FFI; `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Failure::file(
            "creating a pipe",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned here only.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: FFI; the process is single-threaded here (nothing spawned a thread yet).
    match unsafe { libc::fork() } {
        -1 => Err(Failure::file(
            "forking the mount process",
            std::io::Error::last_os_error(),
        )),
        0 => {
            drop(read_end);
            // SAFETY: FFI; a new session, so the terminal's signals do not reach the daemon.
            unsafe { libc::setsid() };
            let _ = std::env::set_current_dir("/");
            Ok(Ready(Some(write_end)))
        }
        _child => {
            drop(write_end);
            let mut report = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut report);
            match report.split_once('\n') {
                Some(("ok", message)) => {
                    // As mount(8)'s helper, success is silent.
                    if !crate::fstab::called_as_mount_helper() {
                        print!("{message}");
                    }
                    std::process::exit(0)
                }
                Some((code, message)) => {
                    eprint!("{message}");
                    std::process::exit(code.parse().unwrap_or(1))
                }
                None => {
                    eprintln!("oubli mount: the mount process ended without reporting");
                    std::process::exit(1)
                }
            }
        }
    }
}

/// Points stdin, stdout and stderr of the detached process at /dev/null.
fn quiet() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: FFI; duplicates an open descriptor onto the standard ones.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Takes the snapshot retention options (`snapshot_every=DURATION`,
/// `snapshot_keep=N`) out of a `-o` list: they are the CLI's, not the file system's.
fn retention_options(list: &str, r: &mut Retention) -> Result<String, Failure> {
    let mut rest = Vec::new();
    for opt in list.split(',') {
        match opt.trim().split_once('=') {
            Some(("snapshot_every", d)) => {
                let secs = crate::ui::parse_duration(d)
                    .map_err(|e| Failure::usage(format!("-o {opt}: {e}")))?;
                r.every = Some(Duration::from_secs(secs));
            }
            Some(("snapshot_keep", n)) => {
                let n = n
                    .parse()
                    .map_err(|_| Failure::usage(format!("-o {opt}: a count expected")))?;
                r.keep = Some(n);
            }
            _ => rest.push(opt),
        }
    }
    Ok(rest.join(","))
}

/// What a mount adds to the control socket: requests run between
/// namespace operations, `redact`, and `unmount-outcome`.
#[derive(Default)]
struct MountFrontend {
    handle: OnceLock<oubli_fuse::Handle>,
    /// How the unmount ended: `None` while mounted or committing, then
    /// `Some(None)` if its last commit went through, or the failure.
    outcome: Mutex<Option<Option<FinalFailure>>>,
    /// When `oubli umount` last asked for the outcome.
    asked: Mutex<Option<Instant>>,
    /// The failure was handed to `oubli umount`.
    collected: AtomicBool,
    /// The mount point while the file system is mounted (`mounted-at`).
    mounted_at: Mutex<Option<PathBuf>>,
    /// The request being answered commits, flushes or snapshots: the
    /// kernel's cached writes go first (set by `answer`, which sees each
    /// request before `quiesced` runs it; one request at a time).
    wants_kernel_writes: AtomicBool,
}

/// `certify-measure` on a mount: the store's measure and the names removed
/// since the last commit.
fn certify_measure(handle: &oubli_fuse::Handle, store: &Store) -> Result<String, Refusal> {
    let mut m = oubli::certificate::measure::measure(store).map_err(|e| Refusal::from(&e))?;
    m.removed = Some(handle.removals());
    Ok(serde_json::to_string(&m).expect("plain data"))
}

/// A failed unmount as `oubli umount` receives it (`unmount-outcome`), to
/// fail with the same code and words as the mount process.
#[derive(serde::Serialize, serde::Deserialize, Clone)]
struct FinalFailure {
    code: i32,
    message: String,
    hint: String,
}

/// An `oubli umount` that asked for the outcome this recently is taken to
/// be waiting for it (its `--wait` is 60 s by default).
const ASKED_RECENTLY: Duration = Duration::from_secs(120);
/// How long a mount process whose last commit failed stays for such an
/// `oubli umount` to collect the failure. It polls every 100 ms, but its
/// request may queue behind another one on the control socket.
const OUTCOME_LINGER: Duration = Duration::from_secs(10);

impl MountFrontend {
    /// `unmount-outcome`: `running` while mounted or committing, then
    /// `committed`, or `failed JSON` (a [`FinalFailure`]).
    fn outcome(&self) -> String {
        *lock(&self.asked) = Some(Instant::now());
        match &*lock(&self.outcome) {
            None => "running".into(),
            Some(None) => "committed".into(),
            Some(Some(f)) => {
                self.collected.store(true, Ordering::SeqCst);
                format!("failed {}", serde_json::to_string(f).expect("plain data"))
            }
        }
    }

    /// Records how the unmount ended; after a failure, waits while an
    /// `oubli umount` is asking (bounded) until it has collected it.
    fn finish(&self, failure: Option<&Failure>) {
        let wire = failure.map(|f| FinalFailure {
            code: f.code,
            message: f.message.clone(),
            hint: f.hint.clone(),
        });
        let failed = wire.is_some();
        *lock(&self.outcome) = Some(wire);
        if !failed {
            return;
        }
        let start = Instant::now();
        let awaited = lock(&self.asked).is_some_and(|t| t.elapsed() < ASKED_RECENTLY);
        while awaited && !self.collected.load(Ordering::SeqCst) && start.elapsed() < OUTCOME_LINGER
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl oubli::control::Frontend for MountFrontend {
    fn quiesced(&self, f: &mut dyn FnMut()) {
        let wants = self.wants_kernel_writes.swap(false, Ordering::SeqCst);
        match self.handle.get() {
            // A purge, flush or snapshot includes what the kernel still
            // caches (FUSE.md, "The writeback cache"); `status` does not
            // make the kernel write back.
            Some(h) if wants => h.synced(|_| f()),
            Some(h) => h.quiesced(|_| f()),
            None => f(),
        }
    }

    fn answer(&self, line: &str) -> Option<Result<String, Refusal>> {
        let verb = line.split(' ').next().unwrap_or("");
        self.wants_kernel_writes.store(
            matches!(
                verb,
                "purge"
                    | "commit"
                    | "flush"
                    | "snapshot-create"
                    | "snapshot-rm"
                    | "certify-measure"
            ),
            Ordering::SeqCst,
        );
        if line == "unmount-outcome" {
            return Some(Ok(self.outcome()));
        }
        if line == "certify-measure" {
            // The measure a serving process gives, plus the names this
            // mount removed since its last commit, taken together (no
            // removal falls between them). Before the mount is up, the
            // common answer (no names).
            let handle = self.handle.get()?;
            return Some(handle.synced(|store| certify_measure(handle, store)));
        }
        if line == MOUNTED_AT {
            // Where another mount of this store learns it is mounted: the
            // mount table names the store only under the default fsname.
            return Some(match &*lock(&self.mounted_at) {
                Some(at) => Ok(at.display().to_string()),
                None => Err(Refusal::new(exit::BUSY, "not mounted")),
            });
        }
        let rest = line.strip_prefix("redact ")?;
        let (mode, path) = rest.split_once(' ')?;
        let Some(handle) = self.handle.get() else {
            return Some(Err(Refusal::new(exit::BUSY, "the mount is still starting")));
        };
        let done = handle
            .redact(Path::new(path))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => Refusal::new(
                    exit::NO_NAME,
                    format!("{path}: no such file in the store or any snapshot"),
                ),
                _ => Refusal::other(format!("{path}: {e}")),
            });
        Some(done.and_then(|r| {
            if mode == "purge" {
                handle
                    .synced(|store| store.purge())
                    .map_err(|e| Refusal::from(&e))?;
            }
            let reply = crate::snapshot_cmd::RedactReply {
                live: r.live,
                objects: r.objects,
                still_open: r.still_open,
                snapshots: r.snapshots,
            };
            Ok(serde_json::to_string(&reply).expect("plain data"))
        }))
    }
}

/// `oubli mount`.
pub fn mount(g: &Global, a: MountArgs) -> Result<String, Failure> {
    let mut opts = oubli_fuse::MountOptions::default();
    let mut retention = Retention::default();
    for o in &a.options {
        let rest = retention_options(o, &mut retention)?;
        opts.parse(&rest).map_err(Failure::usage)?;
    }
    // A bucket has no free space to speak of: statfs then reports none.
    opts.space_from = g.remote.is_none().then(|| g.store.clone());
    if opts.fsname == oubli_fuse::MountOptions::default().fsname {
        // Names the store in /proc/mounts, so that `oubli status MOUNTPOINT`,
        // `oubli purge MOUNTPOINT` and `oubli umount` find it.
        opts.fsname = format!("{FSNAME_PREFIX}{}", g.store_shown().display());
    }
    let mountpoint = session::absolute(&a.mountpoint);
    match std::fs::metadata(&mountpoint) {
        Ok(m) if m.is_dir() => {}
        // A mount whose process died answers ENOTCONN until it is unmounted.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(Failure::new(
                exit::BUSY,
                format!(
                    "{} is still mounted by a process that ended",
                    mountpoint.display()
                ),
                format!("unmount it first: oubli umount {}", mountpoint.display()),
            ))
        }
        _ => {
            return Err(Failure::usage(format!(
                "mount point {} is not a directory",
                mountpoint.display()
            )))
        }
    }
    oubli_fuse::check_fuse().map_err(|e| {
        Failure::new(
            exit::UNEXPECTED,
            e.to_string(),
            "see docs/CLI.md, oubli mount",
        )
    })?;
    g.require_store()?;
    // Asked before detaching: the terminal is still ours.
    let password = g.password()?;
    let mut ready = if a.foreground { Ready(None) } else { detach()? };
    let metrics = a
        .metrics_file
        .as_deref()
        .map(|p| oubli::metrics::MetricsFile::new(&session::absolute(p), &g.store));
    let result = serve(
        g,
        a.foreground,
        mountpoint,
        (opts, retention, metrics),
        password,
        &mut ready,
    );
    if let Err(f) = &result {
        ready.send(&format!("{}\n{f}\n", f.code));
    }
    result
}

fn serve(
    g: &Global,
    foreground: bool,
    mountpoint: PathBuf,
    (opts, retention, mut metrics): (
        oubli_fuse::MountOptions,
        Retention,
        Option<oubli::metrics::MetricsFile>,
    ),
    password: oubli::SecretBytes,
    ready: &mut Ready,
) -> Result<String, Failure> {
    let _lock = lock_after_previous_holder(g)?;
    let provider = session::provider();
    let vault = Arc::new(g.open_vault_at(&g.vault, &password, &provider)?);
    let shares = g.share_opener(&password, &provider);
    drop(password);
    let medium = g
        .open_medium(session::Access::Write)
        .map_err(|e| g.fail(e))?;
    let options = g.long_running_options(&provider, opts.store_policy());
    let store = Arc::new(Store::open(medium, vault, options).map_err(|e| g.fail(e))?);
    store.set_share_opener(shares);
    if !opts.read_only {
        g.collect_orphans(&store);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let purge = Arc::new(AtomicBool::new(false));
    let register = || -> std::io::Result<()> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, stop.clone())?;
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        signal_hook::flag::register(SIGUSR1, purge.clone())?;
        Ok(())
    };
    register().map_err(|e| Failure::file("installing signal handlers", e))?;
    let control_path = oubli::control::socket_path(&g.store);
    let frontend = Arc::new(MountFrontend::default());
    let control = oubli::control::ControlServer::start(
        &control_path,
        store.clone(),
        oubli::report::control_status(g.store.clone()),
        Some(frontend.clone()),
    )
    .map_err(|e| Failure::file(format!("control socket {}", control_path.display()), e))?;

    let read_only = opts.read_only;
    let session = oubli_fuse::mount(store.clone(), &mountpoint, opts).map_err(|e| match e {
        oubli_fuse::Error::Store(e) => g.fail(e),
        // An option the mount refuses (one that needs root, for another user).
        e @ oubli_fuse::Error::Options(_) => Failure::usage(e.to_string()),
        other => Failure::new(
            exit::UNEXPECTED,
            other.to_string(),
            "is the mount point in use? (oubli umount it)",
        ),
    })?;
    let handle = session.handle();
    let _ = frontend.handle.set(handle.clone());
    *lock(&frontend.mounted_at) = Some(mountpoint.clone());
    let message = format!(
        "mounted store {} on {} at epoch {}; `oubli umount {}` commits and unmounts\n",
        g.store.display(),
        mountpoint.display(),
        store.epoch(),
        mountpoint.display()
    );
    if foreground {
        log(message.trim_end());
    } else {
        ready.send(&format!("ok\n{message}"));
        quiet();
    }

    let mut by_signal = false;
    let mut last_tick = Instant::now();
    while session.is_mounted() {
        if stop.load(Ordering::SeqCst) {
            by_signal = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if last_tick.elapsed() >= Duration::from_secs(1) && !read_only {
            // Expired snapshots go, automatic ones are taken between namespace operations.
            last_tick = Instant::now();
            match handle.quiesced(|store| retention::tick(store, &retention, crate::ui::now())) {
                Ok(events) => events.iter().for_each(|e| log(&e.to_string())),
                Err(e) => log(&format!("snapshot retention failed: {e}")),
            }
        }
        if let Some(Err(e)) = metrics.as_mut().map(|m| m.tick(&store)) {
            log(&e);
        }
        if purge.swap(false, Ordering::SeqCst) {
            match session.purge() {
                Ok(()) => log(&format!("committed epoch {} (SIGUSR1)", store.epoch())),
                Err(e) => log(&format!("commit failed: {e}")),
            }
        }
    }
    *lock(&frontend.mounted_at) = None;
    let done = if by_signal {
        session.unmount()
    } else {
        session.wait()
    };
    let done = done.map_err(|e| match e {
        oubli_fuse::Error::Unfinished(u) => unfinished(g, &mountpoint, &u),
        e => Failure::new(
            exit::UNEXPECTED,
            e.to_string(),
            "the file system may still be mounted: oubli umount it",
        ),
    });
    // `oubli umount` learns the outcome through the control socket, which
    // stays up until it has (after a failure) or closes at once.
    frontend.finish(done.as_ref().err());
    drop(control);
    done?;
    Ok(format!(
        "unmounted {}; epoch {} committed: everything deleted before is unrecoverable\n",
        mountpoint.display(),
        store.epoch()
    ))
}

/// The failure of an unmount whose last commit (or flush) failed: exit 6
/// when the vault refused the commit (the exit code of the cause), naming
/// the deletions still recoverable and how to finish them.
fn unfinished(g: &Global, mountpoint: &Path, u: &oubli_fuse::Unfinished) -> Failure {
    let code = u.cause().map_or(exit::MEDIUM_IO, exit::exit_code);
    let mut message = format!("unmounted {}, but {u}", mountpoint.display());
    if u.commit.is_some() && u.removed.is_empty() && u.pending_deletions > 0 {
        message.push_str(
            " (no name was removed through this mount: truncates, overwrites or earlier deletions)",
        );
    }
    let hint = finish_hint(g, u.commit.is_some(), u.flush.is_some());
    Failure::new(code, message, hint)
}

/// What to do after a mount or server ended with its last commit (or the
/// flush after it) failed.
pub fn finish_hint(g: &Global, commit_failed: bool, flush_failed: bool) -> String {
    let store = g.store_shown().display();
    let vault = session::shown(&g.vault);
    match (commit_failed, flush_failed) {
        (true, false) => format!(
            "flushed data is safe; make the vault {vault} reachable and writable, then run `oubli commit --store {store}` to erase them"
        ),
        (true, true) => format!(
            "check the disk holding the store and the vault {vault}, then run `oubli commit --store {store}`: what reached the intent log is kept, and the deletions in it are erased"
        ),
        (false, _) => format!(
            "check the disk holding the store, then mount it again (`oubli fsck --store {store}` lists damage)"
        ),
    }
}

/// How long a mount waits for the process that held the store before.
const PREVIOUS_HOLDER_WAIT: Duration = Duration::from_secs(30);

/// The store's lock for a mount. Right after a plain `umount` (or
/// `fusermount3 -u`) the previous mount process may still be committing
/// and holding the store: when the store is not mounted, wait for it
/// (bounded, saying so) instead of failing at once. A store mounted
/// elsewhere fails at once, naming where (the mount table says so under
/// the default fsname, the mount process under any other).
fn lock_after_previous_holder(g: &Global) -> Result<Option<std::fs::File>, Failure> {
    let start = Instant::now();
    let mut said = false;
    loop {
        match g.lock(Access::Write) {
            Err(f) if f.code == exit::BUSY => {
                if let Some(at) = mount_of_store(g.store_shown()).or_else(|| mounted_at(g)) {
                    return Err(Failure::new(
                        exit::BUSY,
                        format!(
                            "store {} is already mounted at {}",
                            g.store.display(),
                            at.display()
                        ),
                        format!("unmount it first: oubli umount {}", at.display()),
                    ));
                }
                if start.elapsed() >= PREVIOUS_HOLDER_WAIT {
                    return Err(f);
                }
                // Said on a terminal only: a script (or mount -a) waits silently.
                if !said && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                    log(&format!(
                        "store {} is held by another process (an unmount still committing?): waiting up to {} s",
                        g.store.display(),
                        PREVIOUS_HOLDER_WAIT.as_secs()
                    ));
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Where the store is mounted by `oubli mount` (default fsname), if anywhere.
fn mount_of_store(store: &Path) -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = format!("{FSNAME_PREFIX}{}", store.display());
    let found = mounts(&table)
        .find(|m| m.source == want)
        .map(|m| PathBuf::from(m.at));
    found
}

/// The control request a mount process answers with its mount point.
const MOUNTED_AT: &str = "mounted-at";

/// Where the process holding the store has it mounted, if it is a mount
/// (any fsname) and the kernel still has a FUSE file system there: a mount
/// process that was just unmounted is committing, not mounted.
fn mounted_at(g: &Global) -> Option<PathBuf> {
    let at = match oubli::control::request(&g.store, MOUNTED_AT) {
        Ok(Some(Ok(at))) => PathBuf::from(at),
        _ => return None,
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mounted = mounts(&table)
        .rev()
        .find(|m| Path::new(&m.at) == at)
        .is_some_and(|m| m.fstype.starts_with("fuse"));
    mounted.then_some(at)
}

/// One line of /proc/self/mountinfo: where, what type, from what source.
struct MountEntry {
    at: String,
    fstype: String,
    source: String,
}

/// The entries of a mountinfo table, in its order (later mounts last).
fn mounts(table: &str) -> impl DoubleEndedIterator<Item = MountEntry> + '_ {
    table.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        Some(MountEntry {
            at: unescape_mount_field(left.split(' ').nth(4)?),
            fstype: right.next()?.to_string(),
            source: unescape_mount_field(right.next()?),
        })
    })
}

/// The `fsname` of an `oubli mount` that did not set its own: this, then the store's path.
const FSNAME_PREFIX: &str = "oubli:";

/// The store served at `mountpoint`, read from the kernel's mount table:
/// `Ok(None)` if no file system is mounted there, an error if another kind is.
pub fn store_of_mount(mountpoint: &Path) -> Result<Option<PathBuf>, Failure> {
    let mountpoint = session::absolute(mountpoint);
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Failure::file("reading /proc/self/mountinfo", e))?;
    // The last mount on the path is the one in view.
    let Some(MountEntry { fstype, source, .. }) = mounts(&table)
        .rev()
        .find(|m| Path::new(&m.at) == mountpoint)
    else {
        return Ok(None);
    };
    match source.strip_prefix(FSNAME_PREFIX) {
        Some(store) if fstype.starts_with("fuse") => Ok(Some(PathBuf::from(store))),
        _ if fstype == "fuse.oubli" => Err(Failure::usage(format!(
            "{} is an oubli mount with its own fsname ({source}): name its store with --store",
            mountpoint.display()
        ))),
        _ => Err(Failure::usage(format!(
            "{} is not an oubli mount (it is {fstype} from {source})",
            mountpoint.display()
        ))),
    }
}

/// Undoes the kernel's octal escapes (`\040` for a space) in /proc/self/mountinfo.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `oubli umount`: unmounts, then waits until the mount process of its store has committed and let go.
pub fn umount(g: &Global, a: UmountArgs) -> Result<String, Failure> {
    let mountpoint = session::absolute(&a.mountpoint);
    // The store named in the mount table, else --store.
    let g = &g.at_mount(Some(&mountpoint)).unwrap_or_else(|_| g.clone());
    // `--certificate`: what is pending, measured by the mount process
    // before it unmounts (its final commit erases it).
    let certificate = crate::cert_cmd::prepare(&a.cert, true)?;
    let before = match certificate {
        Some(_) => Some(crate::cert_cmd::before_unmount(g)?.ok_or_else(|| {
            Failure::usage(format!(
                "no mount process answers for the store of {}: --certificate needs it (nothing was unmounted)",
                mountpoint.display()
            ))
        })?),
        None => None,
    };
    // Asking for the unmount's outcome before unmounting tells the mount
    // process that someone will collect it (a failed last commit).
    let was_served = matches!(outcome(g), Ok(Some(_)));
    // SAFETY: FFI call without arguments that cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let unmounted = if root {
        let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
            .map_err(|_| Failure::usage("mount point contains NUL"))?;
        // SAFETY: FFI with a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().to_string())
        }
    } else {
        match std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&mountpoint)
            .output()
        {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            Err(e) => Err(format!("running fusermount3 (Debian package fuse3): {e}")),
        }
    };
    unmounted.map_err(|why| {
        Failure::new(
            exit::UNEXPECTED,
            format!("cannot unmount {}: {why}", mountpoint.display()),
            "a program may still use it (lsof, fuser -m); or it is not mounted",
        )
    })?;
    let mut failed = None;
    if was_served {
        // The mount process commits after the kernel lets go, closes its
        // control socket, and releases the store lock as it exits. If the
        // commit failed, it answers with the failure first.
        let start = Instant::now();
        loop {
            let live = match outcome(g) {
                Ok(Some(Ok(reply))) => {
                    if let Some(json) = reply.strip_prefix("failed ") {
                        failed = serde_json::from_str::<FinalFailure>(json).ok();
                    }
                    true
                }
                Ok(Some(Err(_))) | Err(_) => true,
                Ok(None) => false,
            };
            if !live && g.lock(Access::Read).is_ok() {
                break;
            }
            if start.elapsed() > Duration::from_secs(a.wait) {
                return Err(Failure::new(
                    exit::UNEXPECTED,
                    format!(
                        "unmounted {}, but the mount process has not finished its commit",
                        mountpoint.display()
                    ),
                    "it may still be committing; `oubli status` shows the epoch",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if let Some(f) = failed {
        return Err(Failure::new(f.code, f.message, f.hint));
    }
    let unmounted = format!("unmounted {}\n", mountpoint.display());
    match (certificate, before) {
        (Some(certificate), Some(before)) => {
            Ok(unmounted + &crate::cert_cmd::after_unmount(certificate, g, &before)?)
        }
        _ => Ok(unmounted),
    }
}

/// The mount process's answer to `unmount-outcome` (`None`: no process).
fn outcome(g: &Global) -> std::io::Result<Option<Result<String, Refusal>>> {
    oubli::control::request(&g.store, "unmount-outcome")
}
