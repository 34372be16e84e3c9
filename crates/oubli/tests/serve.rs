//! `oubli serve` as a process: argument checks, the epoch policy timer, SIGUSR1 and SIGTERM commits, export growth (needs qemu-io and nbdinfo from qemu-utils and libnbd-bin).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn tool(name: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()));
    if !found && std::env::var("OUBLI_SKIP_EXTERNAL").is_ok_and(|v| v == "1") {
        eprintln!(
            "SKIPPED (OUBLI_SKIP_EXTERNAL=1): `{name}` is missing (Debian package {package})"
        );
        return false;
    }
    assert!(
        found,
        "`{name}` is not installed: apt-get install -y {package} (see scripts/apt-packages), \
         or set OUBLI_SKIP_EXTERNAL=1 to skip"
    );
    true
}

fn oubli(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oubli"));
    c.env("OUBLI_PASSWORD", "serve test")
        .arg("--store")
        .arg(dir.join("store"))
        .arg("--vault")
        .arg(dir.join("vault"));
    c
}

fn output(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("{cmd:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Serving {
    child: Child,
    log: PathBuf,
}

impl Serving {
    fn start(dir: &Path, args: &[&str]) -> Serving {
        let log = dir.join("serve.log");
        let sock = dir.join("nbd.sock");
        let child = oubli(dir)
            .arg("serve")
            .args(args)
            .arg("--socket")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_for("the socket", || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        Serving { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        let ok = output(
            Command::new("kill")
                .arg(sig)
                .arg(self.child.id().to_string()),
        )
        .status
        .success();
        assert!(ok);
    }

    /// SIGTERM; returns (exit status success, stdout).
    fn stop(mut self) -> (bool, String) {
        self.signal("-TERM");
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut out = String::new();
                self.child
                    .stdout
                    .take()
                    .unwrap()
                    .read_to_string(&mut out)
                    .unwrap();
                return (st.success(), out);
            }
            assert!(start.elapsed() < LIMIT, "oubli serve ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `oubli init` with a fast KDF.
fn init(dir: &Path) {
    assert!(
        output(oubli(dir).args(["init", "--kdf-memory", "8", "--kdf-iterations", "1"]))
            .status
            .success()
    );
}

fn uri(dir: &Path) -> String {
    format!("nbd+unix:///disk?socket={}", dir.join("nbd.sock").display())
}

#[test]
fn serve_commits_on_policy_signal_and_exit() {
    if !tool("qemu-io", "qemu-utils") || !tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    init(dir);

    // Usage errors: no endpoint; a new export without a size.
    let o = output(oubli(dir).args(["serve", "--export", "disk"]));
    assert_eq!(o.status.code(), Some(2));
    let o = output(
        oubli(dir)
            .args(["serve", "--export", "disk", "--socket"])
            .arg(dir.join("x.sock")),
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--size"));

    // The interval policy commits on its own once something changed.
    let s = Serving::start(
        dir,
        &["--export", "disk", "--size", "1M", "--epoch-interval", "1"],
    );
    let o = output(
        Command::new("qemu-io")
            .args(["-f", "raw"])
            .arg(uri(dir))
            .args(["-c", "write -P 0x5a 0 64k", "-c", "discard 0 32k"]),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    wait_for("a policy commit", || s.log().contains("(policy)"));
    // SIGUSR1 commits at once.
    s.signal("-USR1");
    wait_for("the SIGUSR1 commit", || s.log().contains("(SIGUSR1)"));
    // So does `oubli commit`, through the store's control socket; `status` answers too.
    let o = output(oubli(dir).arg("commit"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = output(oubli(dir).args(["status", "--json"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (ok, out) = s.stop();
    assert!(ok && out.contains("stopped; epoch"), "{out}");

    // Restarting never shrinks an export, but may grow it.
    let o = output(
        oubli(dir)
            .args(["serve", "--export", "disk", "--size", "512K", "--socket"])
            .arg(dir.join("nbd.sock")),
    );
    assert_eq!(o.status.code(), Some(2));
    let s = Serving::start(dir, &["--export", "disk", "--size", "2M"]);
    let o = output(Command::new("nbdinfo").arg("--size").arg(uri(dir)));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "2097152");
    let o = output(
        Command::new("qemu-io")
            .args(["-f", "raw"])
            .arg(uri(dir))
            .args(["-c", "read -P 0 0 32k", "-c", "read -P 0x5a 32k 32k"]),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let (ok, _) = s.stop();
    assert!(ok);
    let o = output(oubli(dir).args(["status", "--json"]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"pending_deletions\": 0"));
}

/// Issue 9 item 8: plain NBD over TCP only on a loopback address and only
/// when asked for with --tls=off (exit 2 and advice otherwise); a client
/// may open and list only the export `serve` was asked to serve.
#[test]
fn tcp_needs_loopback_and_explicit_tls_off_and_only_the_served_export_is_visible() {
    if !tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    init(dir);
    let serve = |args: &[&str]| {
        output(
            oubli(dir)
                .args(["serve", "--export", "disk", "--size", "1M"])
                .args(args),
        )
    };
    for args in [
        &["--listen", "127.0.0.1:0"][..],
        &["--listen", "0.0.0.0:0", "--tls=off"][..],
        &["--listen", "[::]:0", "--tls=off"][..],
    ] {
        let o = serve(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("--socket") && err.contains("ssh -L"), "{err}");
    }
    // A second export in the same store, made by an earlier serve.
    let other = Serving::start(dir, &["--export", "other", "--size", "1M"]);
    assert!(other.stop().0);
    // Loopback with --tls=off is served; `other` is neither listed nor opened.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let serving = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--size",
            "1M",
            "--listen",
            &listen,
            "--tls=off",
        ],
    );
    let info = output(Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/disk")));
    assert!(
        info.status.success(),
        "{}",
        String::from_utf8_lossy(&info.stderr)
    );
    let list = output(Command::new("nbdinfo").arg("--list").arg(uri(dir)));
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("disk") && !listed.contains("other"),
        "{listed}"
    );
    let hidden = output(Command::new("nbdinfo").arg(format!(
        "nbd+unix:///other?socket={}",
        dir.join("nbd.sock").display()
    )));
    assert!(
        !hidden.status.success(),
        "a client opened an export not served"
    );
    assert!(serving.stop().0);
}
