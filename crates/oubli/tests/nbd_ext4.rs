//! ext4 on `oubli serve`: nbdfuse + losetup + mkfs.ext4, deletions with `-o discard` and with fstrim erased at the next commit (checked by an adversary with the current vault), e2fsck clean, and a kill -9 mid-workload whose remount replays the journal.
//!
//! Needs root (losetup, mount), /dev/fuse and the Debian packages libnbd-bin
//! (nbdfuse), e2fsprogs, fuse3, util-linux and mount. A missing piece fails
//! the test with the package to install, unless OUBLI_SKIP_EXTERNAL=1.

use oubli::audit::recover;
use oubli::{
    CryptoProvider, DirMedium, FileVault, Medium, ParentPointerScheme, RingProvider, SecretBytes,
    Slot, Vault,
};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PASSWORD: &str = "ext4 on nbd";
const LIMIT: Duration = Duration::from_secs(120);

fn skip_external() -> bool {
    std::env::var("OUBLI_SKIP_EXTERNAL").is_ok_and(|v| v == "1")
}

/// Fails (or, with OUBLI_SKIP_EXTERNAL=1, returns false) when a prerequisite is missing.
fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if skip_external() {
        eprintln!("SKIPPED (OUBLI_SKIP_EXTERNAL=1): {what}");
        return false;
    }
    panic!("{what} (set OUBLI_SKIP_EXTERNAL=1 to skip tests that need it)");
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|d| d.join(tool).is_file())
    })
}

/// Runs a command with a time limit; returns (success, stdout + stderr).
fn run(cmd: &mut Command) -> (bool, String) {
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

fn sh(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let (ok, out) = run(cmd);
    assert!(ok, "{shown} failed:\n{out}");
    out
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `oubli serve` process, its stderr in a file.
struct Server {
    child: Child,
    log: PathBuf,
}

/// Everything the test set up, torn down in reverse order even on panic.
struct Rig {
    dir: tempfile::TempDir,
    server: Option<Server>,
    nbdfuse: Option<Child>,
    loopdev: Option<String>,
    mounted: bool,
    serves: usize,
}

impl Rig {
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn oubli(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oubli"));
        c.env("OUBLI_PASSWORD", PASSWORD)
            .arg("--store")
            .arg(self.path("store"))
            .arg("--vault")
            .arg(self.path("vault"));
        c
    }

    fn start_server(&mut self) {
        self.serves += 1;
        let log = self.path(&format!("serve{}.log", self.serves));
        let sock = self.path("nbd.sock");
        let child = self
            .oubli()
            .args(["serve", "--export", "disk", "--size", "256M", "--socket"])
            .arg(&sock)
            .args(["--epoch-interval", "0", "--epoch-deletions", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start oubli serve");
        self.server = Some(Server { child, log });
        wait_for("the server's socket", || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
    }

    fn server_log(&self) -> String {
        std::fs::read_to_string(&self.server.as_ref().unwrap().log).unwrap_or_default()
    }

    /// `oubli purge`: reaches the server through the store's control socket
    /// and returns once the epoch is committed.
    fn purge(&self) {
        sh(self.oubli().arg("purge"));
    }

    fn attach(&mut self) {
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

    fn dev(&self) -> String {
        self.loopdev.clone().unwrap()
    }

    fn mount(&mut self, options: &str) {
        let mnt = self.path("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        sh(Command::new("mount")
            .args(["-t", "ext4", "-o", options])
            .arg(self.dev())
            .arg(&mnt));
        self.mounted = true;
    }

    fn umount(&mut self) {
        if self.mounted {
            let mnt = self.path("mnt");
            if !run(Command::new("umount").arg(&mnt)).0 {
                let _ = run(Command::new("umount").arg("-l").arg(&mnt));
            }
            self.mounted = false;
        }
    }

    fn detach(&mut self) {
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
    fn stop_server(&mut self) -> bool {
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

    fn kill_server(&mut self) {
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
fn content(file: usize, len: usize) -> Vec<u8> {
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

fn needle(file: usize) -> Vec<u8> {
    format!("OUBLI-EXT4 file={file:06} rec=").into_bytes()
}

/// Which files' records the adversary finds in a copy of the store, with the given vault file.
fn recoverable(store: &Path, vault: &Path, files: &[usize]) -> BTreeMap<usize, bool> {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    let password = SecretBytes::new(PASSWORD.as_bytes().to_vec());
    let record = FileVault::open(vault, &password, provider.clone())
        .expect("open vault copy")
        .load()
        .expect("load vault copy");
    let medium: Arc<dyn Medium> = Arc::new(DirMedium::open(store).expect("open store copy"));
    let superblocks: Vec<Vec<u8>> = [Slot::A, Slot::B]
        .iter()
        .filter_map(|s| medium.read_superblock(*s).ok().flatten())
        .collect();
    let recovery = recover(
        &superblocks,
        medium,
        &[record],
        provider,
        Arc::new(ParentPointerScheme),
    );
    files
        .iter()
        .map(|&f| (f, recovery.contains(&needle(f))))
        .collect()
}

/// A copy of the store directory and the vault file as they are now (what
/// the adversary grabs: a backup, a snapshot, what an SSD keeps).
fn snapshot(rig: &Rig, name: &str) -> (PathBuf, PathBuf) {
    let store = rig.path(&format!("{name}.store"));
    let vault = rig.path(&format!("{name}.vault"));
    sh(Command::new("cp")
        .arg("-a")
        .arg(rig.path("store"))
        .arg(&store));
    std::fs::copy(rig.path("vault"), &vault).unwrap();
    (store, vault)
}

fn write_tree(mnt: &Path, files: std::ops::Range<usize>) -> BTreeMap<usize, PathBuf> {
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

fn sync() {
    sh(&mut Command::new("sync"));
}

#[test]
fn ext4_on_oubli_serve_erases_deleted_files() {
    let root = run(Command::new("id").arg("-u")).1.trim() == "0";
    if !require(root, "this test needs root (losetup, mount)") {
        return;
    }
    for (tool, package) in [
        ("nbdfuse", "libnbd-bin"),
        ("fusermount3", "fuse3"),
        ("mkfs.ext4", "e2fsprogs"),
        ("e2fsck", "e2fsprogs"),
        ("losetup", "mount"),
        ("fstrim", "util-linux"),
        ("mount", "mount"),
    ] {
        if !require(
            on_path(tool),
            &format!("`{tool}` is not installed: apt-get install -y {package} (see scripts/apt-packages)"),
        ) {
            return;
        }
    }
    if !require(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing (load the fuse module)",
    ) {
        return;
    }
    let mut rig = Rig {
        dir: tempfile::tempdir().unwrap(),
        server: None,
        nbdfuse: None,
        loopdev: None,
        mounted: false,
        serves: 0,
    };
    sh(rig
        .oubli()
        .args(["init", "--kdf-memory", "8", "--kdf-iterations", "1"]));
    rig.start_server();
    rig.attach();
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .arg(rig.dev()));
    let mnt = rig.path("mnt");

    // Phase 1: online discard (-o discard).
    rig.mount("discard,errors=remount-ro");
    let files = write_tree(&mnt, 0..40);
    sync();
    rig.purge();
    let (old_store, old_vault) = snapshot(&rig, "before-rm");
    let gone1: Vec<usize> = (0..40).filter(|f| f % 4 == 1).collect();
    sh(Command::new("rm").arg("-r").arg(mnt.join("d1")));
    sync();
    rig.purge();

    // Phase 2: batched discard (mounted without it, then fstrim).
    rig.umount();
    rig.mount("nodiscard,errors=remount-ro");
    let gone2: Vec<usize> = (0..40).filter(|f| f % 4 == 3 && f % 5 != 0).collect();
    for f in &gone2 {
        std::fs::remove_file(&files[f]).unwrap();
    }
    sync();
    // Without a discard the device cannot know: after a commit the deleted
    // files are still there for the adversary. fstrim is what erases them.
    rig.purge();
    let (untrimmed, untrimmed_vault) = snapshot(&rig, "before-fstrim");
    let before = recoverable(&untrimmed, &untrimmed_vault, &gone2);
    assert!(
        before.values().all(|found| *found),
        "control: before fstrim the deleted files are still on the device"
    );
    let trimmed = sh(Command::new("fstrim").arg("-v").arg(&mnt));
    assert!(trimmed.contains("trimmed"), "{trimmed}");
    rig.purge();
    let (now_store, now_vault) = snapshot(&rig, "after-purge");

    let kept: Vec<usize> = (0..40)
        .filter(|f| !gone1.contains(f) && !gone2.contains(f))
        .collect();
    let all: Vec<usize> = (0..40).collect();
    let found = recoverable(&now_store, &now_vault, &all);
    let leaked: Vec<_> = gone1.iter().chain(&gone2).filter(|f| found[f]).collect();
    assert!(
        leaked.is_empty(),
        "deleted files recoverable after the commit: {leaked:?}"
    );
    let missing: Vec<_> = kept.iter().filter(|f| !found[f]).collect();
    assert!(
        missing.is_empty(),
        "the adversary must read live files (it is not blind): {missing:?}"
    );
    // The old copy of the store opens nothing under the current key...
    let old_now = recoverable(&old_store, &now_vault, &all);
    assert!(old_now.values().all(|found| !found));
    // ...but with the old vault it does (so the check above can fail).
    let old_old = recoverable(&old_store, &old_vault, &gone1);
    assert!(
        old_old.values().all(|found| *found),
        "control: the old vault must open the old copy"
    );

    rig.umount();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck after the deletions:\n{out}");

    // Phase 3: kill -9 in the middle of a workload; acknowledged (synced)
    // files survive, and the remount replays ext4's journal.
    rig.mount("discard,errors=remount-ro");
    let synced = write_tree(&mnt, 100..120);
    sync();
    let workload = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "i=0; while [ $i -lt 400 ]; do head -c 65536 /dev/zero > {}/w$i || exit 0; i=$((i+1)); done",
            mnt.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    rig.kill_server();
    let mut workload = workload;
    let _ = workload.kill();
    let _ = workload.wait();
    rig.detach();

    rig.start_server();
    // The socket answers a moment before the server says where it started.
    wait_for("the restarted server's first line", || {
        rig.server_log().contains("at epoch")
    });
    rig.attach();
    rig.mount("discard,errors=remount-ro");
    for (f, path) in synced.iter().chain(kept.iter().map(|f| (f, &files[f]))) {
        let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
        assert!(
            std::fs::read(path).unwrap() == content(*f, len),
            "file {f} differs after the crash"
        );
    }
    rig.umount();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck after the crash and journal replay:\n{out}");
    rig.detach();
    assert!(rig.stop_server(), "oubli serve exits 0 on SIGTERM");
    let status = sh(rig.oubli().args(["status", "--json"]));
    assert!(
        status.contains("\"pending_deletions\": 0") || status.contains("\"pending_deletions\":0"),
        "{status}"
    );
}
