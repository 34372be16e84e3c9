//! oubli-fuse: a FUSE file system over an oubli store, in which rm, truncate and overwrite really erase.
//!
//! A thin front-end: every inode is a store object (inode number = object
//! id), its POSIX attributes are kept in the object's metadata (a compact
//! versioned encoding, docs/FORMAT.md "FUSE metadata"), and directories are
//! the store's directory objects. The engine does the erasing: removing the
//! last link deletes the object, truncate and hole punching drop the cells
//! past or inside the range, overwriting replaces cells — and the next commit
//! (epoch end) makes every old copy unrecoverable. Names, sizes and
//! timestamps live in the same key tree and go the same way.
//!
//! When an epoch ends: the store's [`EpochPolicy`](oubli_core::EpochPolicy),
//! the mount's own policy checked by a timer ([`MountOptions::policy`]), at
//! once after anything marked sensitive (the extended attribute
//! `user.oubli.sensitive`, inherited by new children) is deleted or
//! overwritten, on [`Session::purge`], and at unmount.
//!
//! Files unlinked while open keep their object until the last handle
//! closes; they sit on an orphan list in the store meanwhile, so the mount
//! after a crash erases them.
//!
//! ```no_run
//! # fn demo(store: std::sync::Arc<oubli_core::Store>) -> Result<(), oubli_fuse::Error> {
//! let mut options = oubli_fuse::MountOptions::default();
//! options.parse("fsname=secrets,epoch_interval=30").map_err(oubli_fuse::Error::Options)?;
//! let session = oubli_fuse::mount(store, "/mnt/secrets", options)?;
//! // ... the file system is in use ...
//! session.unmount()?; // commits: everything deleted is now unrecoverable
//! # Ok(()) }
//! ```

mod atime;
pub use atime::mount_flags;
pub mod bdi;
mod fs;
mod kernel;
pub mod meta;
mod options;
mod snapdir;

pub use fs::{SENSITIVE_XATTR, SHARE_XATTR};
pub use options::MountOptions;

use fs::Fs;
use fuser::{Config, MountOption, SessionACL};
use oubli_core::Store;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Why mounting (or unmounting) failed.
#[derive(Debug)]
pub enum Error {
    /// FUSE cannot work on this machine; the message says what to install or load.
    FuseUnavailable(String),
    /// A bad `-o` option.
    Options(String),
    /// The store refused (opening the root directory, the orphan list).
    Store(oubli_core::Error),
    /// The kernel or fusermount3 refused the mount, or the unmount failed.
    Mount(io::Error),
    /// The file system is unmounted, but its last commit (or the writing
    /// back of what it held) failed: deletions stay recoverable until a
    /// commit succeeds, and writes may be lost if even the flush failed.
    /// (Boxed: it holds two engine errors, and keeps `Error` small.)
    Unfinished(Box<Unfinished>),
}

/// What an unmount could not finish ([`Error::Unfinished`]).
#[derive(Debug)]
pub struct Unfinished {
    /// Why the last commit failed; `None` if it went through (and only
    /// attributes were lost).
    pub commit: Option<oubli_core::Error>,
    /// Why, after the failed commit, the writes could not be made durable
    /// either: what was written since the last flush is lost.
    pub flush: Option<oubli_core::Error>,
    /// Inodes whose pending attributes (size, times, mode) could not be written back.
    pub attributes_unwritten: usize,
    /// Deletions (unlinks, truncates, overwrites) since the last commit:
    /// still recoverable until a commit succeeds.
    pub pending_deletions: u64,
    /// Paths removed since the last commit, from the mount's root (at most
    /// a few dozen; `.../NAME` where the directory is unknown).
    pub removed: Vec<String>,
    /// Removals past those named.
    pub removed_more: usize,
}

impl Unfinished {
    /// The error that decides the outcome: the flush's (data lost) before
    /// the commit's (deletions recoverable).
    pub fn cause(&self) -> Option<&oubli_core::Error> {
        self.flush.as_ref().or(self.commit.as_ref())
    }

    /// The removed paths as a list for a message: `/a, /b and 3 more`.
    pub fn removed_list(&self) -> String {
        let mut list = self.removed.join(", ");
        if self.removed_more > 0 {
            list.push_str(&format!(" and {} more", self.removed_more));
        }
        list
    }
}

impl fmt::Display for Unfinished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.commit {
            Some(e) => write!(f, "the last commit at unmount failed: {e}")?,
            None => write!(f, "the last commit at unmount went through")?,
        }
        if let Some(e) = &self.flush {
            write!(f, "; writes since the last flush were not stored: {e}")?;
        }
        if self.attributes_unwritten > 0 {
            write!(
                f,
                "; the attributes of {} files were not written back",
                self.attributes_unwritten
            )?;
        }
        if self.commit.is_some() && self.pending_deletions > 0 {
            let n = self.pending_deletions;
            match self.flush {
                None if n == 1 => write!(f, "; 1 deletion is still recoverable")?,
                None => write!(f, "; {n} deletions are still recoverable")?,
                // Those in the intent log stay pending; the others were
                // never stored, and their names come back.
                Some(_) if n == 1 => write!(
                    f,
                    "; 1 deletion was not committed: if it was flushed before, it stays recoverable, otherwise it is undone"
                )?,
                Some(_) => write!(
                    f,
                    "; {n} deletions were not committed: those flushed before stay recoverable, the others are undone"
                )?,
            }
            if !self.removed.is_empty() {
                write!(f, " (removed: {})", self.removed_list())?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::FuseUnavailable(why) => write!(f, "FUSE is not available: {why}"),
            Error::Options(why) => write!(f, "bad mount option: {why}"),
            Error::Store(e) => write!(f, "{e}"),
            Error::Mount(e) => write!(f, "mount failed: {e}"),
            Error::Unfinished(u) => write!(f, "{u}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Store(e) => Some(e),
            Error::Mount(e) => Some(e),
            Error::Unfinished(u) => u.cause().map(|e| e as _),
            _ => None,
        }
    }
}

impl From<oubli_core::Error> for Error {
    fn from(e: oubli_core::Error) -> Self {
        Error::Store(e)
    }
}

/// Objects a mount reaches other than by a name — its orphan list (files
/// unlinked while open, erased at the next mount) — for `oubli fsck` and
/// `oubli gc`, which must not take them for lost objects.
pub fn unnamed_roots(store: &Store) -> Result<Vec<u64>, oubli_core::Error> {
    let root = store.object(oubli_core::ROOT_DIR)?;
    Ok(meta::Attr::decode(&root.meta, true, (0, 0))
        .ok()
        .and_then(|attr| attr.fs)
        .map(|fs| fs.orphans)
        .filter(|&list| list != 0)
        .into_iter()
        .collect())
}

/// Checks that this machine can mount FUSE file systems: `/dev/fuse`, and
/// `fusermount3` (Debian package `fuse3`) unless running as root.
pub fn check_fuse() -> Result<(), Error> {
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::FuseUnavailable(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse) or, in a container, pass the device through (--device /dev/fuse)".into(),
        ));
    }
    // SAFETY: FFI call without arguments that cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && find_in_path("fusermount3").is_none() {
        return Err(Error::FuseUnavailable(
            "fusermount3 was not found: install the Debian package fuse3 (apt-get install fuse3)"
                .into(),
        ));
    }
    Ok(())
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn config(opts: &MountOptions, root: bool) -> Config {
    let mut mount_options = vec![MountOption::FSName(opts.fsname.clone())];
    if !opts.subtype.is_empty() {
        // As a kernel option, so that mount(2) (as root) shows the type
        // `fuse.<subtype>` just as fusermount3 does.
        mount_options.push(MountOption::CUSTOM(format!("subtype={}", opts.subtype)));
    }
    // Always: the kernel enforces the stored modes (see MountOptions::default_permissions).
    mount_options.push(MountOption::DefaultPermissions);
    mount_options.push(if opts.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    if !root {
        // fusermount3 sets the access-time flags itself (its own table of
        // mount flags); as root they are set after mounting (atime.rs).
        for a in opts.atime.iter().filter(|a| !a.ends_with("lazytime")) {
            mount_options.push(MountOption::CUSTOM(a.clone()));
        }
    }
    if opts.dev {
        mount_options.push(MountOption::Dev);
    }
    if opts.suid {
        mount_options.push(MountOption::Suid);
    }
    for e in &opts.extra {
        mount_options.push(match e.as_str() {
            "noatime" => MountOption::NoAtime,
            "atime" => MountOption::Atime,
            "noexec" => MountOption::NoExec,
            "sync" => MountOption::Sync,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        });
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    // One /dev/fuse descriptor per request loop: the loops do not contend on one queue.
    config.clone_fd = true;
    config
}

/// Calls `Fs::tick` every `period` until stopped.
struct Ticker {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(fs: Arc<Fs>, period: Duration) -> io::Result<Ticker> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("oubli-epoch".into())
            .spawn(move || {
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    let (guard, _) = cv
                        .wait_timeout(stopped, period)
                        .unwrap_or_else(|p| p.into_inner());
                    stopped = guard;
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    fs.tick();
                    stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }

    fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A mounted file system served by background threads. Dropping it unmounts.
pub struct Session {
    fs: Arc<Fs>,
    writers: Arc<kernel::Writers>,
    unmounter: fuser::SessionUnmounter,
    thread: Option<JoinHandle<io::Result<()>>>,
    ticker: Ticker,
    mountpoint: PathBuf,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// What [`Handle::redact`] erased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// The path existed in the live tree (and is gone from it).
    pub live: bool,
    /// Objects erased (the file, or a directory and everything beneath it).
    pub objects: usize,
    /// Of those, files still open: their data goes at the last close.
    pub still_open: usize,
    /// The snapshots that held any of them.
    pub snapshots: Vec<String>,
}

/// The names removed through the mount since the last commit
/// ([`Handle::removals`]): what the next commit erases, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Removals {
    /// Each removal, oldest first (at most 100,000).
    pub paths: Vec<RemovedPath>,
    /// Removals past those listed.
    pub more: u64,
}

/// One name removed through the mount (unlink, rmdir, or a rename over it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemovedPath {
    /// From the mount's root, without a leading `/`; `.../NAME` where the
    /// directory's place is not known any more.
    pub path: String,
    /// The object the name named (a name re-created since names another).
    pub object_id: u64,
    /// Its size when removed (0 for a directory).
    pub bytes: u64,
    /// The object still has another name: its data stays.
    pub still_linked: bool,
    /// The object has no name but is open: its data goes at the last close.
    pub still_open: bool,
    /// Snapshots that still hold the object.
    pub snapshots: Vec<String>,
}

/// A mounted file system, for requests that come from outside the kernel
/// (the control socket): cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Handle {
    fs: Arc<Fs>,
    writers: Arc<kernel::Writers>,
    mountpoint: PathBuf,
}

impl Handle {
    /// Runs `f` on the store with no namespace operation half done and
    /// every pending attribute written. What the kernel still holds in its
    /// writeback cache is not in the store: for a purge or a snapshot asked
    /// for by a user, use [`Handle::synced`].
    pub fn quiesced<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        self.fs.quiesced(f)
    }

    /// [`Handle::quiesced`] after the kernel has written its dirty pages of
    /// the mount back (`syncfs`): a purge run this way erases what writes
    /// still in the kernel's writeback cache overwrote, and a snapshot holds
    /// them. The writeback failing (the file system refused the writes) is
    /// reported on stderr; `f` runs regardless. Not from a request loop.
    pub fn synced<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        if let Err(e) = write_back_kernel_cache(&self.fs, &self.writers, &self.mountpoint) {
            eprintln!(
                "oubli-fuse: writing back the kernel's cached writes to {}: {e}",
                self.mountpoint.display()
            );
        }
        self.fs.quiesced(f)
    }

    /// The names removed since the last commit, for a certificate of the
    /// next one. Call it inside [`Handle::quiesced`] or [`Handle::synced`],
    /// with the measure it goes with: no removal then falls between them.
    pub fn removals(&self) -> Removals {
        self.fs.removals()
    }

    /// `oubli redact`: erases the file or directory at `path` (relative to
    /// the mount point; `.snapshots/SNAP/...` names the same path) from the
    /// live tree and from every snapshot that holds it. Durable when it
    /// returns; unrecoverable after the next commit.
    pub fn redact(&self, path: &Path) -> io::Result<Redacted> {
        use std::os::unix::ffi::OsStrExt;
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for c in path.components() {
            match c {
                std::path::Component::Normal(n) => parts.push(n.as_bytes().to_vec()),
                std::path::Component::CurDir => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: a path relative to the mount point, without ..",
                            path.display()
                        ),
                    ))
                }
            }
        }
        if parts.first().map(Vec::as_slice) == Some(snapdir::SNAPDIR_NAME) {
            // A snapshot's copy names the same file: .snapshots/SNAP/rest.
            parts.drain(..parts.len().min(2));
        }
        self.fs.redact(&parts)
    }
}

impl Session {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// A handle for requests from outside the kernel (snapshots, redaction).
    pub fn handle(&self) -> Handle {
        Handle {
            fs: self.fs.clone(),
            writers: self.writers.clone(),
            mountpoint: self.mountpoint.clone(),
        }
    }

    /// The store behind the mount.
    pub fn store(&self) -> &Arc<Store> {
        &self.fs.store
    }

    /// The erasure barrier: ends the epoch now, so that everything deleted
    /// through the mount so far is unrecoverable when it returns. Prefer this
    /// to `Store::purge` while mounted: it has the kernel write back what
    /// its writeback cache holds (an overwrite there is not yet in the
    /// store), waits for namespace operations in flight and writes pending
    /// timestamps first. If the kernel's writeback failed, the epoch still
    /// ends and the failure is returned.
    pub fn purge(&self) -> Result<(), oubli_core::Error> {
        let synced = write_back_kernel_cache(&self.fs, &self.writers, &self.mountpoint);
        self.fs.purge()?;
        synced.map_err(|e| writeback_failed(&self.mountpoint, e))
    }

    /// Makes every write so far durable without ending the epoch (the
    /// kernel's cached writes included).
    pub fn flush(&self) -> Result<(), oubli_core::Error> {
        let synced = write_back_kernel_cache(&self.fs, &self.writers, &self.mountpoint);
        self.fs.flush_all()?;
        synced.map_err(|e| writeback_failed(&self.mountpoint, e))
    }

    /// False once the file system was unmounted (from outside, e.g. `fusermount3 -u`).
    pub fn is_mounted(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Unmounts, waits for the request loops to end, and commits the epoch.
    /// [`Error::Unfinished`] if that commit (or the flush after it) failed.
    pub fn unmount(mut self) -> Result<(), Error> {
        self.finish(true)
    }

    /// Waits until the file system is unmounted from outside (then commits,
    /// as at any unmount; [`Error::Unfinished`] if that failed).
    pub fn wait(mut self) -> Result<(), Error> {
        self.finish(false)
    }

    fn finish(&mut self, unmount: bool) -> Result<(), Error> {
        let mut result = Ok(());
        if unmount {
            if let Err(e) = self.unmounter.unmount() {
                // Still mounted, the request loops would wait for ever, and
                // this join with them: unmount it from outside instead.
                if let Some(t) = &self.thread {
                    if let Err(again) = unmount_busy(&self.mountpoint, t) {
                        // Leave the loops rather than hang: the session ends
                        // whenever the file system is unmounted.
                        self.thread = None;
                        self.ticker.stop();
                        return Err(Error::Mount(io::Error::new(
                            e.kind(),
                            format!("unmounting {}: {e}; {again}", self.mountpoint.display()),
                        )));
                    }
                }
            }
        }
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Ok(())) => {}
                // The connection's end, like the ENODEV that fuser already
                // takes as one. On Linux 6.18 about one unmount in fifteen
                // ends one of the request loops with ECONNABORTED instead
                // (seen in the stress test). It is not a failure of the file
                // system: every request was answered or failed to its
                // caller, and the session still ends with its commit.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                Ok(Err(e)) => {
                    if result.is_ok() {
                        result = Err(Error::Mount(e));
                    }
                }
                Err(_) => {
                    if result.is_ok() {
                        result = Err(Error::Mount(io::Error::other(
                            "a FUSE request loop panicked",
                        )));
                    }
                }
            }
        }
        self.ticker.stop();
        // The request loops ended, so the unmount's commit ran: what it left
        // undone matters more than how the loops ended.
        match self.fs.take_unfinished() {
            Some(u) => Err(Error::Unfinished(Box::new(u))),
            None => result,
        }
    }
}

/// Has the kernel write back its dirty pages of the mount at `mountpoint`
/// and waits until this file system has served those writes (with the
/// writeback cache off there are none). The writes are served by the
/// request loops, so this must not run in one.
///
/// `syncfs` alone does not wait: it starts the WRITE requests, but a FUSE
/// mount is not asked to sync (no FUSE_SYNCFS: fuser does not implement
/// it), and the kernel (6.18 measured) returns while they are still queued
/// or being served — a purge right after found the store without the
/// overwrite in about one round in five. So every inode open for writing
/// (only those can hold dirty pages: a close writes back and waits) is then
/// invalidated (FUSE_NOTIFY_INVAL_INODE of the whole file): the kernel
/// locks each cached page, waits for its writeback to end — a page stays
/// under writeback until this file system replies to the WRITE holding it —
/// writes back a page still dirty and drops it. When the last notification
/// returns, every write the kernel held for those files when `syncfs`
/// returned has been served. docs/FUSE.md, "The writeback cache".
fn write_back_kernel_cache(
    fs: &Fs,
    writers: &kernel::Writers,
    mountpoint: &Path,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if !fs.writeback {
        return Ok(());
    }
    let root = std::fs::File::open(mountpoint)?;
    // SAFETY: FFI on a descriptor `root` keeps open.
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let Some(notifier) = fs.notifier.get() else {
        return Ok(());
    };
    for ino in writers.inodes() {
        match notifier.inval_inode(fuser::INodeNo(ino), 0, 0) {
            // The kernel holds no such inode, so no pages of it either.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("waiting for the kernel's writes to inode {ino}: {e}"),
                ))
            }
            Ok(()) => {}
        }
    }
    Ok(())
}

fn writeback_failed(mountpoint: &Path, e: io::Error) -> oubli_core::Error {
    oubli_core::Error::Io {
        context: format!(
            "writing back the kernel's cached writes to {}",
            mountpoint.display()
        ),
        source: e,
    }
}

/// After the session's own unmount failed (seen once in the test suite:
/// the mount stayed, and the request loops waited for requests that never
/// came): gives the loops a moment in case the unmount took effect anyway,
/// then asks `fusermount3 -u` a few times (a file closed just before is
/// released by the kernel a moment later, and keeps the mount busy until
/// then), and last unmounts lazily (`-z`: detached now, ended when the last
/// reference goes). Err if it stays mounted.
fn unmount_busy(mountpoint: &Path, loops: &JoinHandle<io::Result<()>>) -> io::Result<()> {
    let ended = |wait: Duration| {
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until {
            if loops.is_finished() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        loops.is_finished()
    };
    if ended(Duration::from_millis(500)) {
        return Ok(());
    }
    let fusermount = |args: &[&str]| {
        std::process::Command::new("fusermount3")
            .args(args)
            .arg(mountpoint)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    for _ in 0..10 {
        if fusermount(&["-u"]) || ended(Duration::from_millis(200)) {
            return Ok(());
        }
    }
    if fusermount(&["-u", "-z"]) {
        return Ok(());
    }
    Err(io::Error::other(
        "it stays mounted (fusermount3 -u -z failed too)",
    ))
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish(true);
        }
    }
}

/// Mounts `store` at `mountpoint` and serves it from background threads
/// until [`Session::unmount`] (or an unmount from outside). Returns once the
/// kernel has the file system.
pub fn mount(
    store: Arc<Store>,
    mountpoint: impl AsRef<Path>,
    options: MountOptions,
) -> Result<Session, Error> {
    check_fuse()?;
    // SAFETY: FFI call without arguments that cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if (options.dev || options.suid) && !root {
        return Err(Error::Options(
            "-o dev and -o suid need root (fusermount3 refuses them to other users): mount as root, or leave them out (the mount is nodev,nosuid)".into(),
        ));
    }
    if options.readahead_kib.is_some() && !root {
        return Err(Error::Options(
            "-o readahead needs root (the window is set through sysfs): mount as root, or leave it out".into(),
        ));
    }
    if options.dirty_share.is_some() && !root {
        return Err(Error::Options(
            "-o dirty_share needs root (the share is set through sysfs): mount as root, or leave it out".into(),
        ));
    }
    let mountpoint = mountpoint.as_ref().to_path_buf();
    let snaps = snapdir::Snapdir::new(store.clone(), &options);
    let fs = Arc::new(Fs::new(store, &options)?);
    let config = config(&options, root);
    let writers = Arc::new(kernel::Writers::default());
    let kernel = kernel::Kernel::new(fs.clone(), snaps, writers.clone());
    let mut session = fuser::Session::new(kernel, &mountpoint, &config)
        .map_err(|e| mount_error(e, &mountpoint))?;
    let _ = fs.notifier.set(session.notifier());
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("oubli-fuse".into())
        .spawn(move || session.run())
        .map_err(Error::Mount)?;
    let ticker = Ticker::start(fs.clone(), options.tick).map_err(Error::Mount)?;
    let session = Session {
        fs,
        writers,
        unmounter,
        thread: Some(thread),
        ticker,
        mountpoint,
    };
    // Once requests are served: reading the mount's flags asks the file system (statfs).
    if root && !options.atime.is_empty() {
        if let Err(e) = atime::apply(&session.mountpoint, &options.atime) {
            let _ = session.unmount();
            return Err(Error::Mount(e));
        }
    }
    // The kernel's readahead window and dirty-page share for a FUSE mount
    // are too small (bdi.rs); unasked, raising them is best effort.
    let readahead = options
        .readahead_kib
        .or(root.then_some(kernel::MAX_IO / 1024));
    let dirty_share = options
        .dirty_share
        .or(root.then_some(bdi::DEFAULT_DIRTY_SHARE));
    let set_up =
        |name: &str, asked: bool, value: Option<u32>, set: fn(&Path, u32) -> io::Result<()>| {
            let Some(value) = value.filter(|&v| v > 0) else {
                return Ok(());
            };
            match set(&session.mountpoint, value) {
                Err(e) if asked => {
                    let why = format!("-o {name}={value}: {e}");
                    Err(Error::Mount(io::Error::new(e.kind(), why)))
                }
                _ => Ok(()),
            }
        };
    let asked_readahead = options.readahead_kib.is_some();
    let asked_share = options.dirty_share.is_some();
    let set = set_up("readahead", asked_readahead, readahead, bdi::set_readahead).and_then(|()| {
        set_up(
            "dirty_share",
            asked_share,
            dirty_share,
            bdi::set_dirty_share,
        )
    });
    if let Err(e) = set {
        let _ = session.unmount();
        return Err(e);
    }
    Ok(session)
}

/// Mounts and serves until the file system is unmounted from outside, or
/// until `stop` becomes true (set it from a signal handler), then unmounts
/// and commits.
pub fn mount_foreground(
    store: Arc<Store>,
    mountpoint: impl AsRef<Path>,
    options: MountOptions,
    stop: &AtomicBool,
) -> Result<(), Error> {
    let session = mount(store, mountpoint, options)?;
    while session.is_mounted() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if session.is_mounted() {
        session.unmount()
    } else {
        session.wait()
    }
}

fn mount_error(e: io::Error, mountpoint: &Path) -> Error {
    if e.kind() == io::ErrorKind::NotFound && find_in_path("fusermount3").is_none() {
        return Error::FuseUnavailable(format!(
            "mounting {} needs fusermount3: install the Debian package fuse3 ({e})",
            mountpoint.display()
        ));
    }
    Error::Mount(io::Error::new(
        e.kind(),
        format!("{}: {e}", mountpoint.display()),
    ))
}
