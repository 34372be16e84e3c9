//! Crash: the process serving the mount is killed mid-workload; after a remount every fsync'd file is intact and files unlinked while open are erased — on a directory store, and on S3 (20 kill points, the S3 server killed too).
//!
//! The file system runs in a child process: this test binary re-executed
//! with `OUBLI_FUSE_CRASH_CHILD` set runs `serve_until_killed`, which mounts
//! the store (a directory, or the bucket named by `OUBLI_FUSE_CRASH_S3`,
//! reached through the AWS_* variables; file vault) and serves until SIGKILL.

mod common;
use common::*;
use oubli_core::{Options, Store};
use oubli_crypto::{RingProvider, SecretBytes};
use oubli_media::{DirMedium, SplitMix64};
use oubli_vault::{FileVault, KdfParams};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OUBLI_FUSE_CRASH_CHILD";
const S3_ENV: &str = "OUBLI_FUSE_CRASH_S3";

fn password() -> SecretBytes {
    SecretBytes::new(b"crash test".to_vec())
}

/// Where the store under test is: `dir/store`, or a bucket.
type S3 = Option<(oubli_s3::S3Location, oubli_s3::S3Config)>;

/// The child's: the bucket in `$OUBLI_FUSE_CRASH_S3`, reached through AWS_*.
fn s3_from_env() -> S3 {
    let url = std::env::var(S3_ENV).ok()?;
    let at = oubli_s3::S3Location::parse(&url).unwrap().unwrap();
    Some((at, oubli_s3::S3Config::from_env().unwrap()))
}

fn open_medium(dir: &Path, s3: &S3) -> Arc<dyn oubli_core::Medium> {
    match s3 {
        // A killed holder's lock (this machine, its pid gone) is taken over at once.
        Some((at, config)) => Arc::new(
            oubli_s3::S3Medium::open_writer_with(at, config, oubli_s3::LEASE)
                .expect("open the S3 store"),
        ),
        None => Arc::new(DirMedium::open(dir.join("store")).expect("open store dir")),
    }
}

fn open_store(dir: &Path, s3: &S3) -> Arc<Store> {
    let provider = Arc::new(RingProvider::new());
    let medium = open_medium(dir, s3);
    let vault =
        FileVault::open(dir.join("vault"), &password(), provider.clone()).expect("open vault");
    let options = Options {
        provider,
        ..store_options()
    };
    Arc::new(Store::open(medium, Arc::new(vault), options).expect("open store"))
}

/// The child: mounts the store in `$OUBLI_FUSE_CRASH_CHILD` and serves until killed.
#[test]
fn serve_until_killed() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return; // an ordinary test run: nothing to do
    };
    let dir = PathBuf::from(dir);
    let store = open_store(&dir, &s3_from_env());
    let _session =
        oubli_fuse::mount(store, dir.join("mnt"), default_options()).expect("child mount");
    File::create(dir.join("ready")).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The serving child; killed (and its mount detached) when dropped, so a failing test leaves nothing behind.
struct Server {
    child: Child,
    mnt: PathBuf,
}

impl Server {
    /// kill -9 of the serving process; its mount stays attached (dead:
    /// every call on it fails) until [`detach`].
    fn kill_process(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn kill(&mut self) {
        self.kill_process();
        detach(&self.mnt);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_child(dir: &Path, env: &[(&'static str, String)]) -> Server {
    let _ = fs::remove_file(dir.join("ready"));
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "serve_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .spawn()
        .expect("spawn the serving child");
    let mut server = Server {
        child,
        mnt: dir.join("mnt"),
    };
    let start = Instant::now();
    while !dir.join("ready").exists() {
        if start.elapsed() > Duration::from_secs(60) || server.child.try_wait().unwrap().is_some() {
            server.kill();
            panic!("the child did not mount");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

fn detach(mnt: &Path) {
    let c = cpath(mnt);
    // SAFETY: FFI; lazily detaches the dead FUSE mount so that the directory can be mounted again.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the workload knows to be durable: fsync'd files (never changed after) and fsync'd removals.
#[derive(Default)]
struct Durable {
    files: BTreeMap<String, Vec<u8>>,
    gone: Vec<String>,
    orphans: Vec<u64>,
    /// A rename (to `Some`) or removal (`None`) of a durable file that the kill may have cut off
    /// before its directory fsync returned: either outcome is correct after the crash.
    in_flight: Option<(String, Option<String>)>,
}

/// Creates the store under test (empty) with its file vault in `dir`.
fn create_store(dir: &Path, s3: &S3) {
    let provider = Arc::new(RingProvider::new());
    let medium: Arc<dyn oubli_core::Medium> = match s3 {
        Some(_) => open_medium(dir, s3),
        None => Arc::new(DirMedium::create(dir.join("store")).unwrap()),
    };
    Store::create(
        medium,
        |r| {
            FileVault::create(
                dir.join("vault"),
                &password(),
                KdfParams::testing(),
                r,
                provider.clone(),
            )
            .map_err(Into::into)
        },
        oubli_testkit::harness::front_end_create_options(),
        Options {
            provider: provider.clone(),
            ..store_options()
        },
    )
    .unwrap();
}

/// What kills the serving side in a round.
enum Kill<'a> {
    /// kill -9 of the process serving the mount.
    Mount,
    /// kill -9 of the S3 server (then of the mount, whose writes fail), and a restart.
    S3Server(&'a mut oubli_s3::test_server::TestServer),
}

/// One crash: the child mounts the store, a workload writes, renames and
/// removes files (fsync'ing half of them) until `durable_target` files are
/// durable, the serving side is killed, and a remount must show every
/// fsync'd file, none that was durably removed, and no file that was
/// unlinked while open.
fn crash_round(
    dir: &Path,
    s3: &S3,
    env: &[(&'static str, String)],
    round: u64,
    durable_target: usize,
    kill: Kill,
) {
    let mut server = spawn_child(dir, env);
    let mnt = dir.join("mnt");
    let durable = Arc::new(Mutex::new(Durable::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (mnt, durable, stop) = (mnt.clone(), durable.clone(), stop.clone());
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut rng = SplitMix64::new(77 + round);
            let mut held = Vec::new();
            let n = |i: u64| format!("r{round}f{i}");
            for i in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = n(i);
                let len = rng.below(200_000) as usize + 1;
                let data: Vec<u8> = (0..len).map(|j| (i as u8).wrapping_add(j as u8)).collect();
                let mut f = File::create(mnt.join(&name))?;
                f.write_all(&data)?;
                if i % 2 == 0 {
                    f.sync_all()?;
                    lock(&durable).files.insert(name.clone(), data);
                } else {
                    // Not fsync'd: may or may not survive, never corrupts the rest.
                    fs::write(mnt.join(format!("r{round}loose{i}")), &data[..len / 2])?;
                }
                // Durable files that move or go: after the directory's fsync, that is durable too.
                if i % 5 == 4 && lock(&durable).files.contains_key(&n(i - 4)) {
                    let (from, to) = (n(i - 4), format!("r{round}moved{}", i - 4));
                    lock(&durable).in_flight = Some((from.clone(), Some(to.clone())));
                    fs::rename(mnt.join(&from), mnt.join(&to))?;
                    File::open(&mnt)?.sync_all()?;
                    let mut d = lock(&durable);
                    d.in_flight = None;
                    let data = d.files.remove(&from).unwrap();
                    d.files.insert(to, data);
                    d.gone.push(from);
                }
                if i % 7 == 6 && lock(&durable).files.contains_key(&n(i - 2)) {
                    let victim = n(i - 2);
                    lock(&durable).in_flight = Some((victim.clone(), None));
                    fs::remove_file(mnt.join(&victim))?;
                    File::open(&mnt)?.sync_all()?;
                    let mut d = lock(&durable);
                    d.in_flight = None;
                    d.files.remove(&victim);
                    d.gone.push(victim);
                }
                if i % 11 == 10 {
                    // Unlinked while open, and still open at the crash.
                    let p = mnt.join(format!("r{round}open{i}"));
                    let f = File::create(&p)?;
                    (&f).write_all(b"unlinked but open")?;
                    let ino = f.metadata()?.ino();
                    fs::remove_file(&p)?;
                    f.sync_all()?;
                    held.push(f);
                    lock(&durable).orphans.push(ino);
                }
            }
            Ok(())
        })
    };
    // Let the workload run, then kill in the middle of it.
    let start = Instant::now();
    while lock(&durable).files.len() < durable_target && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The dead mount stays attached until the workload has failed on it: a
    // mount detached at once would let a worker between two calls go on
    // in the directory underneath.
    match kill {
        Kill::Mount => server.kill_process(),
        Kill::S3Server(s3_server) => {
            s3_server.kill();
            // The mount cannot write any more: what it acknowledged is all
            // that counts. Give it a moment to fail, then kill it too.
            std::thread::sleep(Duration::from_millis(200));
            server.kill_process();
            s3_server.restart();
        }
    }
    // Its next call fails; `stop` only bounds a hung one.
    let killed = Instant::now();
    while !worker.is_finished() && killed.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let outcome = worker.join().expect("workload thread");
    detach(&mnt);
    assert!(
        outcome.is_err(),
        "the workload should have been cut off by the kill"
    );

    let durable = lock(&durable);
    assert!(durable.files.len() >= durable_target.min(1));
    let store = open_store(dir, s3);
    let session = oubli_fuse::mount(store.clone(), &mnt, default_options()).expect("remount");
    for (name, data) in &durable.files {
        let found = match &durable.in_flight {
            // The cut-off rename or removal may have reached the medium: the file is then at its
            // new name, or gone, and never at both names.
            Some((from, to)) if from == name => {
                let old = fs::read(mnt.join(name)).ok();
                let new = to.as_ref().and_then(|to| fs::read(mnt.join(to)).ok());
                assert!(
                    old.is_none() || new.is_none(),
                    "{name} is at both names after a cut-off rename"
                );
                match (old, to) {
                    (Some(got), _) => Some(got),
                    (None, Some(_)) => Some(
                        new.unwrap_or_else(|| panic!("fsync'd {name} lost in a cut-off rename")),
                    ),
                    (None, None) => None,
                }
            }
            _ => Some(
                fs::read(mnt.join(name))
                    .unwrap_or_else(|e| panic!("round {round}: fsync'd {name} lost: {e}")),
            ),
        };
        if let Some(got) = found {
            assert!(got == *data, "fsync'd {name} differs after the crash");
        }
    }
    for name in &durable.gone {
        assert_eq!(
            errno(fs::metadata(mnt.join(name))),
            libc::ENOENT,
            "{name} came back"
        );
    }
    for ino in &durable.orphans {
        assert!(
            !store.exists(*ino).unwrap(),
            "file unlinked while open (object {ino}) not erased"
        );
    }
    // Every name left opens (no name points at a missing or damaged object).
    for e in fs::read_dir(&mnt).unwrap() {
        let e = e.unwrap();
        fs::read(e.path()).unwrap_or_else(|err| panic!("{:?}: {err}", e.file_name()));
    }
    session.unmount().expect("unmount");
    drop(store);
}

#[test]
fn kill_mid_workload_then_remount() {
    if std::env::var(CHILD_ENV).is_ok() || !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::create_dir(dir.join("mnt")).unwrap();
    create_store(dir, &None);
    crash_round(dir, &None, &[], 0, 60, Kill::Mount);
}

/// Issue 13: the store on S3 (versitygw on loopback). Twenty kill points at
/// random moments of the workload — mid-upload and mid-commit among them —
/// with every fifth one a kill -9 of the S3 server instead: after each,
/// every fsync'd file is there, durably removed ones are not, files
/// unlinked while open are erased, and the killed holder's lock is taken
/// over at once (same machine, its process gone).
#[test]
fn kill_mid_workload_then_remount_on_s3() {
    if std::env::var(CHILD_ENV).is_ok() || !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let Some(mut s3_server) = oubli_s3::test_server::TestServer::start_or_skip(dir) else {
        return;
    };
    fs::create_dir(dir.join("mnt")).unwrap();
    let at = s3_server.bucket("crash", true, "store");
    let mut env = s3_server.env();
    env.push((S3_ENV, at.to_string()));
    let s3: S3 = Some((at, s3_server.config()));
    create_store(dir, &s3);
    let mut rng = SplitMix64::new(2026);
    for round in 0..20 {
        let target = 2 + rng.below(25) as usize;
        let kill = if round % 5 == 4 {
            Kill::S3Server(&mut s3_server)
        } else {
            Kill::Mount
        };
        crash_round(dir, &s3, &env, round, target, kill);
    }
}
