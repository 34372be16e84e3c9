//! Test fixtures for the hardware vaults: a private swtpm on a free loopback port, a private SoftHSM2 token.
//!
//! Each fixture starts its own device and tears it down on drop, so tests
//! run in parallel without sharing state. When the device's program is not
//! installed the fixture *fails* the test with the install command: a
//! silently skipped test would hide a missing dependency on CI. Setting
//! `OUBLI_SKIP_HW=1` is the explicit opt-out.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const INSTALL_HINT: &str = "install the test dependencies: run `scripts/test` as root \
     (it installs the Debian packages listed in scripts/apt-packages, among them swtpm, \
     swtpm-tools, softhsm2, libtss2-dev and pkg-config); set OUBLI_SKIP_HW=1 to skip \
     the hardware-vault tests explicitly";

/// True if the hardware tests were explicitly switched off.
pub fn skip_hw() -> bool {
    std::env::var("OUBLI_SKIP_HW").is_ok_and(|v| v == "1")
}

/// Returns from the test when the hardware tests are switched off, saying
/// so. The caller has `skip_hw` in scope (`use common::skip_hw`): a macro's
/// paths resolve where it is used, and this module is `common` in some test
/// crates and `hw` in others.
#[allow(unused_macros)]
macro_rules! hw {
    () => {
        if skip_hw() {
            eprintln!("OUBLI_SKIP_HW=1: skipped");
            return;
        }
    };
}

/// A vault record for `epoch`: its key is `fill` bytes with the epoch in
/// front (so each epoch's key differs), its store id `store_id` bytes.
pub fn record(fill: u8, store_id: u8, epoch: u64) -> oubli_vault::VaultRecord {
    let mut key = [fill; 32];
    key[..8].copy_from_slice(&epoch.to_le_bytes());
    oubli_vault::VaultRecord {
        store_id: [store_id; 16],
        epoch,
        key: oubli_crypto::SecretKey::from_bytes(key),
    }
}

/// Finds `program` on PATH or panics with the install hint.
pub fn require(program: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("`{program}` (Debian package {package}) is not installed: {INSTALL_HINT}");
}

/// Generous: swtpm syncs its state file on every NV write, which can take
/// seconds on a busy disk. A hang test sets a short deadline of its own.
#[cfg(feature = "tpm")]
pub fn tpm_options() -> oubli_vault::TpmOptions {
    oubli_vault::TpmOptions {
        timeout: Duration::from_secs(30),
        owner_auth: None,
    }
}

/// A swtpm process serving TPM 2.0 commands on 127.0.0.1.
pub struct Swtpm {
    child: Option<Child>,
    pub state_dir: tempfile::TempDir,
    pub port: u16,
}

/// Ports handed to this process's simulators: the OS may hand the same free
/// port to two tests between "probe" and "swtpm binds it", and a test that
/// talks to another test's TPM fails in baffling ways.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Two consecutive free loopback ports (server, control), reserved until
/// [`release_ports`].
fn free_port_pair() -> u16 {
    let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..200 {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port == u16::MAX || reserved.contains(&port) || reserved.contains(&(port + 1)) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            reserved.insert(port);
            reserved.insert(port + 1);
            return port;
        }
    }
    panic!("no two consecutive free loopback ports");
}

fn release_ports(port: u16) {
    let mut reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    reserved.remove(&port);
    reserved.remove(&(port + 1));
}

impl Swtpm {
    /// Starts a fresh TPM (empty state) on a free port.
    pub fn start() -> Swtpm {
        require("swtpm", "swtpm");
        let mut tpm = Swtpm {
            child: None,
            state_dir: tempfile::tempdir().unwrap(),
            port: 0,
        };
        tpm.launch(free_port_pair());
        tpm
    }

    fn launch(&mut self, port: u16) {
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2"])
            .arg("--server")
            .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
            .arg("--ctrl")
            .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
            .arg("--tpmstate")
            .arg(format!("dir={}", self.state_dir.path().display()))
            .args(["--flags", "not-need-init,startup-clear"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start swtpm: {e}; {INSTALL_HINT}"));
        self.child = Some(child);
        self.port = port;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("swtpm exited at start: {status}");
            }
            assert!(Instant::now() < deadline, "swtpm did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Something listens; make sure it is our swtpm and not another
        // program that took the port first (swtpm would then exit).
        std::thread::sleep(Duration::from_millis(50));
        if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
            panic!("swtpm exited at start (port {port} taken?): {status}");
        }
    }

    /// The location string of a vault on this TPM.
    pub fn location(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// [`location`](Self::location), parsed.
    #[cfg(feature = "tpm")]
    pub fn tpm_location(&self) -> oubli_vault::TpmLocation {
        oubli_vault::TpmLocation::parse(&self.location()).unwrap()
    }

    /// Kills the simulator at once (SIGKILL): as a power cut of the TPM.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same state (NV memory survives) and port.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        // The old listener is gone with the process; the port may take a
        // moment to be reusable.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpListener::bind(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "port {port} stayed busy");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.launch(port);
    }

    /// Freezes the simulator (SIGSTOP): commands hang instead of failing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// The simulator's persistent state (its NV memory), file by file, to
    /// put back with [`roll_back`](Self::roll_back).
    pub fn nv_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        std::fs::read_dir(self.state_dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// Kills the simulator, puts back the NV state [`nv_files`](Self::nv_files)
    /// took, and starts it again: a TPM rolled back, the attack a real TPM's
    /// NV memory rules out and a simulator's host file allows.
    pub fn roll_back(&mut self, saved: &[(PathBuf, Vec<u8>)]) {
        self.kill();
        for (path, bytes) in saved {
            std::fs::write(path, bytes).unwrap();
        }
        self.restart();
    }

    /// Every byte of the simulator's persistent state (its NV memory).
    pub fn state_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(self.state_dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                out.extend(std::fs::read(&path).unwrap());
            }
        }
        out
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        // Resume first: a stopped process does not die of SIGKILL until continued on some kernels.
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
        release_ports(self.port);
    }
}

/// Path of the SoftHSM2 PKCS#11 module.
pub const SOFTHSM_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";

/// A SoftHSM2 configuration in a temp dir, with tokens made by softhsm2-util.
pub struct SoftHsm {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub tokens: PathBuf,
}

impl SoftHsm {
    pub fn new() -> SoftHsm {
        require("softhsm2-util", "softhsm2");
        assert!(
            Path::new(SOFTHSM_MODULE).is_file(),
            "{SOFTHSM_MODULE} missing: {INSTALL_HINT}"
        );
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        let conf = dir.path().join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                tokens.display()
            ),
        )
        .unwrap();
        SoftHsm { dir, conf, tokens }
    }

    /// `softhsm2-util --init-token --free --label LABEL --pin PIN --so-pin 5678`.
    pub fn init_token(&self, label: &str, pin: &str) {
        let out = Command::new("softhsm2-util")
            .env("SOFTHSM2_CONF", &self.conf)
            .args(["--init-token", "--free", "--label", label, "--pin", pin])
            .args(["--so-pin", "5678"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "softhsm2-util failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
