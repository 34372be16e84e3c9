//! The ext4-on-`oubli serve` rig shared by nbd_ext4.rs and nbd_ext4_infer.rs: an `oubli serve` process, nbdfuse, a loop device and a mounted ext4, torn down in reverse order even on panic; the adversary's view of deleted files; an immutable-flag guard for the vault-failure tests.
#![allow(dead_code)] // each test file uses part of it

use oubli::audit::recover;
use oubli::{CryptoProvider, DirMedium, FileVault, Medium, RingProvider, SecretBytes, Slot, Vault};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const PASSWORD: &str = "ext4 on nbd";
pub const LIMIT: Duration = Duration::from_secs(120);

pub fn skip_external() -> bool {
    std::env::var("OUBLI_SKIP_EXTERNAL").is_ok_and(|v| v == "1")
}

/// `oubli put NAME -` through `cmd` (an `oubli` command with its store and
/// vault set), `data` on stdin; fails the test unless it succeeds.
pub fn put(mut cmd: assert_cmd::Command, name: &str, data: &[u8]) {
    cmd.args(["put", name, "-"])
        .write_stdin(data.to_vec())
        .assert()
        .success();
}

/// Fails (or, with OUBLI_SKIP_EXTERNAL=1, returns false) when a prerequisite is missing.
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if skip_external() {
        eprintln!("SKIPPED (OUBLI_SKIP_EXTERNAL=1): {what}");
        return false;
    }
    panic!("{what} (set OUBLI_SKIP_EXTERNAL=1 to skip tests that need it)");
}

/// Whether FUSE mounts can run here (/dev/fuse, fuse3): fails naming what
/// is missing, or with OUBLI_SKIP_EXTERNAL=1 returns false.
pub fn fuse_available() -> bool {
    let missing = oubli_fuse::check_fuse().err();
    require(
        missing.is_none(),
        &format!(
            "the mount tests need /dev/fuse and the Debian package fuse3: {}",
            missing.map(|e| e.to_string()).unwrap_or_default()
        ),
    )
}

pub fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|d| d.join(tool).is_file())
    })
}

/// Runs a command with a time limit; returns (success, stdout + stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t2 = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = t1.join().unwrap() + &t2.join().unwrap();
    (status.success(), text)
}

pub fn sh(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let (ok, out) = run(cmd);
    assert!(ok, "{shown} failed:\n{out}");
    out
}

pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `oubli serve` process, its stderr in a file.
pub struct Server {
    pub child: Child,
    pub log: PathBuf,
}

/// Everything the test set up, torn down in reverse order even on panic.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub server: Option<Server>,
    pub nbdfuse: Option<Child>,
    pub loopdev: Option<String>,
    pub mounted: bool,
    pub serves: usize,
}

impl Rig {
    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn oubli(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oubli"));
        c.env("OUBLI_PASSWORD", PASSWORD)
            .arg("--store")
            .arg(self.path("store"))
            .arg("--vault")
            .arg(self.path("vault"));
        c
    }

    pub fn start_server(&mut self) {
        self.start_server_with(&[]);
    }

    pub fn start_server_with(&mut self, extra: &[&str]) {
        self.serves += 1;
        let log = self.path(&format!("serve{}.log", self.serves));
        let sock = self.path("nbd.sock");
        let child = self
            .oubli()
            .args(["serve", "--export", "disk", "--size", "256M", "--socket"])
            .arg(&sock)
            .args(["--epoch-interval", "0", "--epoch-deletions", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start oubli serve");
        self.server = Some(Server { child, log });
        wait_for("the server's socket", || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        // The socket listens before the start-up lines are logged: a test
        // that reads the log at once could miss them (it did, under load).
        wait_for("the server's start-up log", || {
            self.server_log().contains("serving export")
        });
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(&self.server.as_ref().unwrap().log).unwrap_or_default()
    }

    /// `oubli purge`: reaches the server through the store's control socket
    /// and returns once the epoch is committed.
    pub fn purge(&self) {
        sh(self.oubli().arg("purge"));
    }

    pub fn attach(&mut self) {
        let fuse = self.path("fuse");
        std::fs::create_dir_all(&fuse).unwrap();
        let pidfile = self.path("nbdfuse.pid");
        let _ = std::fs::remove_file(&pidfile);
        let child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(&fuse)
            .arg("--unix")
            .arg(self.path("nbd.sock"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        self.nbdfuse = Some(child);
        wait_for("nbdfuse", || pidfile.exists());
        let dev = sh(Command::new("losetup")
            .args(["-f", "--show"])
            .arg(fuse.join("nbd")));
        self.loopdev = Some(dev.trim().to_string());
    }

    pub fn dev(&self) -> String {
        self.loopdev.clone().unwrap()
    }

    pub fn mount(&mut self, options: &str) {
        let mnt = self.path("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        sh(Command::new("mount")
            .args(["-t", "ext4", "-o", options])
            .arg(self.dev())
            .arg(&mnt));
        self.mounted = true;
    }

    pub fn umount(&mut self) {
        if self.mounted {
            let mnt = self.path("mnt");
            if !run(Command::new("umount").arg(&mnt)).0 {
                let _ = run(Command::new("umount").arg("-l").arg(&mnt));
            }
            self.mounted = false;
        }
    }

    pub fn detach(&mut self) {
        self.umount();
        if let Some(dev) = self.loopdev.take() {
            let _ = run(Command::new("losetup").arg("-d").arg(dev));
        }
        if let Some(mut child) = self.nbdfuse.take() {
            let _ = run(Command::new("fusermount3").arg("-u").arg(self.path("fuse")));
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() && start.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server with SIGTERM (it commits); returns its stdout line.
    pub fn stop_server(&mut self) -> bool {
        let Some(mut s) = self.server.take() else {
            return true;
        };
        let _ = run(Command::new("kill").args(["-TERM", &s.child.id().to_string()]));
        let start = Instant::now();
        loop {
            if let Some(st) = s.child.try_wait().unwrap() {
                return st.success();
            }
            if start.elapsed() > LIMIT {
                let _ = s.child.kill();
                let _ = s.child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill_server(&mut self) {
        let mut s = self.server.take().unwrap();
        s.child.kill().unwrap(); // SIGKILL
        s.child.wait().unwrap();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.detach();
        let _ = self.stop_server();
    }
}

/// File content made of 64-byte records naming the file, so that any
/// recovered plaintext can be traced back to it.
pub fn content(file: usize, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 64);
    let mut rec = 0;
    while v.len() < len {
        let mut r = format!("OUBLI-EXT4 file={file:06} rec={rec:08} ").into_bytes();
        r.resize(63, b'.');
        r.push(b'\n');
        v.extend_from_slice(&r);
        rec += 1;
    }
    v.truncate(len);
    v
}

pub fn needle(file: usize) -> Vec<u8> {
    format!("OUBLI-EXT4 file={file:06} rec=").into_bytes()
}

/// Which files' records the adversary finds in a copy of the store, with the given vault file.
pub fn recoverable(store: &Path, vault: &Path, files: &[usize]) -> BTreeMap<usize, bool> {
    recoverable_with(store, vault, PASSWORD, files)
}

/// [`recoverable`] with a vault file whose password is `password`.
pub fn recoverable_with(
    store: &Path,
    vault: &Path,
    password: &str,
    files: &[usize],
) -> BTreeMap<usize, bool> {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    let password = SecretBytes::new(password.as_bytes().to_vec());
    let record = FileVault::open(vault, &password, provider.clone())
        .expect("open vault copy")
        .load()
        .expect("load vault copy");
    let medium: Arc<dyn Medium> = Arc::new(DirMedium::open(store).expect("open store copy"));
    let superblocks: Vec<Vec<u8>> = [Slot::A, Slot::B]
        .iter()
        .filter_map(|s| medium.read_superblock(*s).ok().flatten())
        .collect();
    let recovery = recover(&superblocks, medium, &[record], provider);
    files
        .iter()
        .map(|&f| (f, recovery.contains(&needle(f))))
        .collect()
}

/// A copy of the store directory and the vault file as they are now (what
/// the adversary grabs: a backup, a snapshot, what an SSD keeps).
pub fn snapshot(rig: &Rig, name: &str) -> (PathBuf, PathBuf) {
    let store = rig.path(&format!("{name}.store"));
    let vault = rig.path(&format!("{name}.vault"));
    sh(Command::new("cp")
        .arg("-a")
        .arg(rig.path("store"))
        .arg(&store));
    std::fs::copy(rig.path("vault"), &vault).unwrap();
    (store, vault)
}

pub fn write_tree(mnt: &Path, files: std::ops::Range<usize>) -> BTreeMap<usize, PathBuf> {
    let mut out = BTreeMap::new();
    for f in files {
        let dir = mnt.join(format!("d{}", f % 4));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("f{f}"));
        let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
        std::fs::write(&path, content(f, len)).unwrap();
        out.insert(f, path);
    }
    out
}

pub fn sync() {
    sh(&mut Command::new("sync"));
}

/// `chattr -R +i PATH` (as root on ext4), undone when dropped, also when the test fails.
pub struct Immutable(PathBuf);

impl Immutable {
    pub fn set(path: &Path) -> Immutable {
        if let Err(e) = chattr("+i", path) {
            panic!("{e} (the test needs root on a file system with the immutable flag, as ext4)");
        }
        Immutable(path.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        // No panic here: the guard also runs while a failed test unwinds.
        if let Err(e) = chattr("-i", &self.0) {
            eprintln!("{e}");
        }
    }
}

fn chattr(flag: &str, path: &Path) -> Result<(), String> {
    let out = Command::new("chattr")
        .args(["-R", flag])
        .arg(path)
        .output()
        .map_err(|e| format!("chattr: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "chattr -R {flag} {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
