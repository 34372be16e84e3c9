//! Crash: the process serving the mount is killed mid-workload; after a remount every fsync'd file is intact and files unlinked while open are erased.
//!
//! The file system runs in a child process: this test binary re-executed
//! with `OUBLI_FUSE_CRASH_CHILD` set runs `serve_until_killed`, which mounts a
//! directory store (file vault) and serves until SIGKILL.

mod common;
use common::*;
use oubli_core::{CreateOptions, Options, Store};
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

fn password() -> SecretBytes {
    SecretBytes::new(b"crash test".to_vec())
}

fn open_store(dir: &Path) -> Arc<Store> {
    let provider = Arc::new(RingProvider::new());
    let medium = DirMedium::open(dir.join("store")).expect("open store dir");
    let vault =
        FileVault::open(dir.join("vault"), &password(), provider.clone()).expect("open vault");
    let options = Options {
        provider,
        ..store_options()
    };
    Arc::new(Store::open(Arc::new(medium), Arc::new(vault), options).expect("open store"))
}

/// The child: mounts the store in `$OUBLI_FUSE_CRASH_CHILD` and serves until killed.
#[test]
fn serve_until_killed() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return; // an ordinary test run: nothing to do
    };
    let dir = PathBuf::from(dir);
    let store = open_store(&dir);
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
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        detach(&self.mnt);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_child(dir: &Path) -> Server {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "serve_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir)
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

#[test]
fn kill_mid_workload_then_remount() {
    if std::env::var(CHILD_ENV).is_ok() || !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::create_dir(dir.join("mnt")).unwrap();
    {
        let provider = Arc::new(RingProvider::new());
        let medium = DirMedium::create(dir.join("store")).unwrap();
        Store::create(
            Arc::new(medium),
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
            CreateOptions::default(),
            Options {
                provider: provider.clone(),
                ..store_options()
            },
        )
        .unwrap();
    }
    let mut server = spawn_child(dir);
    let mnt = dir.join("mnt");
    let durable = Arc::new(Mutex::new(Durable::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (mnt, durable, stop) = (mnt.clone(), durable.clone(), stop.clone());
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut rng = SplitMix64::new(77);
            let mut held = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("f{i}");
                let len = rng.below(200_000) as usize + 1;
                let data: Vec<u8> = (0..len).map(|j| (i as u8).wrapping_add(j as u8)).collect();
                let mut f = File::create(mnt.join(&name))?;
                f.write_all(&data)?;
                if i % 2 == 0 {
                    f.sync_all()?;
                    lock(&durable).files.insert(name.clone(), data);
                } else {
                    // Not fsync'd: may or may not survive, never corrupts the rest.
                    fs::write(mnt.join(format!("loose{i}")), &data[..len / 2])?;
                }
                // Durable files that move or go: after the directory's fsync, that is durable too.
                let pick = |k: usize| format!("f{}", i - k);
                if i % 5 == 4 && lock(&durable).files.contains_key(&pick(4)) {
                    let (from, to) = (pick(4), format!("moved{}", i - 4));
                    lock(&durable).in_flight = Some((from.clone(), Some(to.clone())));
                    fs::rename(mnt.join(&from), mnt.join(&to))?;
                    File::open(&mnt)?.sync_all()?;
                    let mut d = lock(&durable);
                    d.in_flight = None;
                    let data = d.files.remove(&from).unwrap();
                    d.files.insert(to, data);
                    d.gone.push(from);
                }
                if i % 7 == 6 && lock(&durable).files.contains_key(&pick(2)) {
                    let victim = pick(2);
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
                    let p = mnt.join(format!("open{i}"));
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
    // Let the workload run, then kill the server in the middle of it.
    let start = Instant::now();
    while lock(&durable).files.len() < 60 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    server.kill();
    stop.store(true, Ordering::Relaxed);
    let outcome = worker.join().expect("workload thread");
    assert!(
        outcome.is_err(),
        "the workload should have been cut off by the kill"
    );

    let durable = lock(&durable);
    assert!(durable.files.len() >= 60 && !durable.orphans.is_empty());
    let store = open_store(dir);
    let m = Mounted {
        session: Some(oubli_fuse::mount(store.clone(), &mnt, default_options()).expect("remount")),
        tmp,
        mnt: mnt.clone(),
        store: store.clone(),
    };
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
                fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("fsync'd {name} lost: {e}")),
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
            !m.store.exists(*ino).unwrap(),
            "file unlinked while open (object {ino}) not erased"
        );
    }
    // Every name left opens (no name points at a missing or damaged object).
    for e in fs::read_dir(&mnt).unwrap() {
        let e = e.unwrap();
        fs::read(e.path()).unwrap_or_else(|err| panic!("{:?}: {err}", e.file_name()));
    }
    drop(m);
}
