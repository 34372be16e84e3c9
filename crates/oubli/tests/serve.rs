//! `oubli serve` as a process: argument checks, the epoch policy timer, SIGUSR1 and SIGTERM commits, export growth (needs qemu-io and nbdinfo from qemu-utils and libnbd-bin).

mod common;

use std::io::{BufRead, Read, Write};
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
    fn stop(self) -> (bool, String) {
        let (code, out) = self.stop_code();
        (code == Some(0), out)
    }

    /// SIGTERM; returns (exit code, stdout).
    fn stop_code(mut self) -> (Option<i32>, String) {
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
                return (st.code(), out);
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

/// A temporary directory with a store (and its vault) made by `oubli init`.
fn init() -> tempfile::TempDir {
    init_with("parent-pointer")
}

/// [`init`] with the given key scheme.
fn init_with(key_scheme: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let o = output(
        oubli(d.path())
            .args(["init", "--kdf-memory", "8", "--kdf-iterations", "1"])
            .args(["--key-scheme", key_scheme]),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    d
}

/// The block device on every key scheme: writes, a discard, a commit
/// through the control socket, and after a restart the bytes read back and
/// the audit finds nothing deleted.
#[test]
fn serve_works_on_every_key_scheme() {
    if !tool("qemu-io", "qemu-utils") {
        return;
    }
    for scheme in ["parent-pointer", "keyed-hash-forest", "key-storage-area"] {
        let d = init_with(scheme);
        let dir = d.path();
        let s = Serving::start(dir, &["--export", "disk", "--size", "1M"]);
        let io = |cmds: &[&str]| {
            let mut c = Command::new("qemu-io");
            c.args(["-f", "raw"]).arg(uri(dir));
            for cmd in cmds {
                c.args(["-c", cmd]);
            }
            let o = output(&mut c);
            assert!(
                o.status.success(),
                "{scheme}: {}",
                String::from_utf8_lossy(&o.stdout)
            );
        };
        io(&[
            "write -P 0x5a 0 256k",
            "discard 0 64k",
            "write -P 0x33 512k 64k",
        ]);
        let o = output(oubli(dir).arg("commit"));
        assert!(
            o.status.success(),
            "{scheme}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let (ok, _) = s.stop();
        assert!(ok, "{scheme}");
        let s = Serving::start(dir, &["--export", "disk"]);
        io(&[
            "read -P 0 0 64k",
            "read -P 0x5a 64k 192k",
            "read -P 0x33 512k 64k",
        ]);
        let (ok, _) = s.stop();
        assert!(ok, "{scheme}");
        let o = output(oubli(dir).args(["status", "--json"]));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("\"key_scheme\": \"{scheme}\"")),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        let o = output(oubli(dir).arg("audit"));
        assert!(
            o.status.success(),
            "{scheme}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

/// Writes are acknowledged once queued (oubli_nbd::WriteBehind), so `oubli
/// commit` must wait for them: an overwrite acknowledged before the commit
/// is erased by it, even while the clients that wrote it are still
/// connected and their writes are still being carried out. Checked by the
/// count of deletions pending after the commit: an overwrite carried out
/// after the commit began would be one. Two clients fill the write-behind
/// queue, and the commit is asked for on a control connection opened
/// beforehand (so that the control thread is already reading it) the
/// moment both clients have their replies.
#[test]
fn a_commit_covers_the_writes_acknowledged_before_it() {
    if !tool("qemu-io", "qemu-utils") {
        return;
    }
    let d = init();
    let dir = d.path();
    let s = Serving::start(dir, &["--export", "disk", "--size", "128M"]);
    let o = output(
        Command::new("qemu-io")
            .args(["-f", "raw"])
            .arg(uri(dir))
            .args(["-c", "write -P 0x11 0 128M"]),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let o = output(oubli(dir).arg("commit"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The control thread polls for connections: it must be waiting on this
    // one's request line before the writes, not find it up to 50 ms later.
    let mut control =
        std::os::unix::net::UnixStream::connect(oubli::control::socket_path(&dir.join("store")))
            .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Clients that stay connected (qemu-io reading commands from a pipe)
    // overwrite all of it.
    let clients: Vec<_> = ["0", "64M"]
        .into_iter()
        .map(|at| {
            // `-t writeback`: qemu-io's default, writethrough, flushes every write.
            let mut io = Command::new("qemu-io")
                .args(["-f", "raw", "-t", "writeback"])
                .arg(uri(dir))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            writeln!(io.stdin.as_mut().unwrap(), "write -P 0x22 {at} 64M").unwrap();
            io
        })
        .collect();
    let mut clients: Vec<_> = clients
        .into_iter()
        .map(|mut io| {
            let mut from_io = std::io::BufReader::new(io.stdout.take().unwrap());
            let mut line = String::new();
            while !line.contains("wrote") {
                line.clear();
                assert!(from_io.read_line(&mut line).unwrap() > 0, "qemu-io ended");
            }
            io
        })
        .collect();
    control.write_all(b"commit\n").unwrap();
    let mut reply = String::new();
    std::io::BufReader::new(control)
        .read_line(&mut reply)
        .unwrap();
    assert!(reply.starts_with("ok "), "{reply}");
    let o = output(oubli(dir).args(["status", "--json"]));
    let status = String::from_utf8_lossy(&o.stdout);
    assert!(
        status.contains("\"pending_deletions\": 0,"),
        "an overwrite acknowledged before the commit was left out of it: {status}"
    );
    for io in &mut clients {
        writeln!(io.stdin.take().unwrap(), "quit").unwrap();
        assert!(io.wait().unwrap().success());
    }
    let (ok, out) = s.stop();
    assert!(ok, "{out}");
}

fn uri(dir: &Path) -> String {
    format!("nbd+unix:///disk?socket={}", dir.join("nbd.sock").display())
}

#[test]
fn serve_commits_on_policy_signal_and_exit() {
    if !tool("qemu-io", "qemu-utils") || !tool("nbdinfo", "libnbd-bin") {
        return;
    }
    let d = init();
    let dir = d.path();

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
    wait_for("a policy commit", || s.log().contains("(policy"));
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

/// Issue 39 item 2: `oubli serve` stopped by SIGTERM when its last commit
/// fails (the vault file made immutable; replaced by a directory) exits 6,
/// naming the deletions still recoverable and `oubli commit`, instead of
/// "stopped; epoch N committed" and 0; `oubli commit` finishes them once
/// the vault works.
#[test]
fn serve_exits_6_when_its_last_commit_fails() {
    if !tool("qemu-io", "qemu-utils") {
        return;
    }
    for directory in [false, true] {
        let d = init();
        let dir = d.path();
        let vault = dir.join("vault");
        let aside = dir.join("vault.aside");
        let s = Serving::start(
            dir,
            &["--export", "disk", "--size", "1M", "--epoch-interval", "0"],
        );
        let io = |cmd: &str| {
            let o = output(
                Command::new("qemu-io")
                    .args(["-f", "raw"])
                    .arg(uri(dir))
                    .args(["-c", cmd]),
            );
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        };
        io("write -P 0x5a 0 64k");
        assert!(output(oubli(dir).arg("commit")).status.success());
        io("discard 0 32k");
        let guard = if directory {
            std::fs::rename(&vault, &aside).unwrap();
            std::fs::create_dir(&vault).unwrap();
            None
        } else {
            Some(common::Immutable::set(&vault))
        };
        let (code, out) = s.stop_code();
        let log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
        assert_eq!(code, Some(6), "{out}{log}");
        assert!(
            log.contains("stopped, but the last commit failed")
                && log.contains(" deletion")
                && log.contains("(TRIM")
                && (directory || log.contains("still recoverable"))
                && log.contains("oubli commit")
                && !out.contains("committed"),
            "{out}{log}"
        );
        drop(guard);
        if directory {
            std::fs::remove_dir(&vault).unwrap();
            std::fs::rename(&aside, &vault).unwrap();
        }
        let o = output(oubli(dir).arg("commit"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = output(oubli(dir).args(["status", "--json"]));
        assert!(String::from_utf8_lossy(&o.stdout).contains("\"pending_deletions\": 0"));
    }
}

/// The TCP address `oubli serve` logged it listens on.
fn tcp_port(s: &Serving) -> u16 {
    let mut port = None;
    wait_for("the TCP listener in the log", || {
        port = s.log().lines().find_map(|l| {
            let rest = l.split("listening on tcp:").nth(1)?;
            let addr = rest.split_whitespace().next()?;
            addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
        });
        port.is_some()
    });
    port.unwrap()
}

/// A CA, a server and a client certificate made by `scripts/nbd-certs` (the
/// recipe docs/NBD.md gives users) under `dir/certs`; returns the server's
/// directory and the client's, as `--tls-certificates` and libnbd take them.
fn make_certs(dir: &Path) -> (String, String) {
    let certs = dir.join("certs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nbd-certs");
    assert!(output(Command::new(script).arg(&certs)).status.success());
    let of = |who: &str| certs.join(who).display().to_string();
    (of("server"), of("client"))
}

/// `--listen` needs TLS with client certificates, or an explicit `--tls=off`
/// on a loopback address; a client reaches only the export served.
#[test]
fn serve_on_tcp_needs_tls_or_loopback() {
    if !tool("nbdinfo", "libnbd-bin") || !tool("certtool", "gnutls-bin") {
        return;
    }
    let d = init();
    let dir = d.path();
    let (server_certs, client_certs) = make_certs(dir);

    // Refused, exit 2, before any password is asked for.
    for (args, says) in [
        (&["--listen", "127.0.0.1:0"][..], "certtool"),
        (&["--listen", "0.0.0.0:0", "--tls=off"][..], "loopback"),
        (
            &[
                "--listen",
                "0.0.0.0:0",
                "--tls=on",
                "--tls-certificates",
                &server_certs,
            ][..],
            "127.0.0.1",
        ),
        (
            &["--socket", "/nonexistent/x.sock", "--tls=require"][..],
            "--tls-certificates",
        ),
        (
            &[
                "--listen",
                "127.0.0.1:0",
                "--tls-certificates",
                "/nonexistent",
            ][..],
            "ca-cert.pem",
        ),
    ] {
        let o = output(
            oubli(dir)
                .args(["serve", "--export", "disk", "--size", "1M"])
                .args(args)
                .env_remove("OUBLI_PASSWORD"),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }

    // Another export in the store, not to be reached through the next server.
    let s = Serving::start(dir, &["--export", "other", "--size", "1M"]);
    assert!(s.stop().0);

    // Plain TCP on loopback when asked.
    let s = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--size",
            "1M",
            "--listen",
            "127.0.0.1:0",
            "--tls=off",
        ],
    );
    let port = tcp_port(&s);
    let o = output(
        Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("nbd://127.0.0.1:{port}/disk")),
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1048576");
    let o = output(
        Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("nbd://127.0.0.1:{port}/other")),
    );
    assert!(!o.status.success(), "the other export was reachable");
    assert!(s.stop().0);

    // TLS with client certificates (required by default with --tls-certificates).
    let s = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--listen",
            "localhost:0",
            "--tls-certificates",
            &server_certs,
        ],
    );
    let port = tcp_port(&s);
    let o = output(Command::new("nbdinfo").arg("--size").arg(format!(
        "nbds://localhost:{port}/disk?tls-certificates={client_certs}"
    )));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "1048576",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = output(
        Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("nbd://localhost:{port}/disk")),
    );
    assert!(!o.status.success(), "a plain client got in");
    // The Unix socket stays plain (file permissions guard it) unless --tls is given.
    let o = output(Command::new("nbdinfo").arg("--size").arg(uri(dir)));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = output(Command::new("nbdinfo").arg("--list").arg(uri(dir)));
    let list = String::from_utf8_lossy(&o.stdout);
    assert!(list.contains("disk") && !list.contains("other"), "{list}");
    assert!(s.stop().0);
}

/// Issue 10: `--export NAME@SNAP` serves the export as it was in a
/// snapshot, read-only, while the live export has changed; automatic
/// snapshots (`--snapshot-every`, `--snapshot-keep`) are taken and the
/// oldest dropped by the running server.
#[test]
fn serve_a_snapshot_read_only_and_take_automatic_snapshots() {
    if !tool("qemu-io", "qemu-utils") {
        return;
    }
    let d = init();
    let dir = d.path();
    let qemu_io = |commands: &[&str]| {
        let mut cmd = Command::new("qemu-io");
        // A read-only export is opened read-only (a read-write open is refused).
        if commands.iter().all(|c| c.starts_with("read")) {
            cmd.arg("-r");
        }
        cmd.args(["-f", "raw"]).arg(uri(dir));
        for c in commands {
            cmd.args(["-c", c]);
        }
        output(&mut cmd)
    };
    let s = Serving::start(dir, &["--export", "disk", "--size", "1M"]);
    assert!(qemu_io(&["write -P 0x11 0 256k"]).status.success());
    // A snapshot through the control socket of the running server.
    let o = output(oubli(dir).args(["snapshot", "create", "before"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(qemu_io(&["write -P 0x22 0 256k"]).status.success());
    assert!(s.stop().0);

    // `--size` cannot go with a snapshot.
    let o = output(
        oubli(dir)
            .args([
                "serve",
                "--export",
                "disk@before",
                "--size",
                "2M",
                "--socket",
            ])
            .arg(dir.join("x.sock")),
    );
    assert_eq!(o.status.code(), Some(2));
    let s = Serving::start(dir, &["--export", "disk@before"]);
    wait_for("the serving line", || {
        s.log().contains("as of snapshot before, read-only")
    });
    let o = qemu_io(&["read -P 0x11 0 256k"]);
    assert!(
        o.status.success(),
        "{}{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        s.log()
    );
    let o = qemu_io(&["write -P 0x33 0 4k"]);
    let said = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() || said.contains("failed"),
        "a write to a snapshot export went through: {said}"
    );
    // The served snapshot cannot be removed under its clients (their view holds its keys).
    let o = output(oubli(dir).args(["snapshot", "rm", "--purge", "before"]));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("being served by this process"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(qemu_io(&["read -P 0x11 0 256k"]).status.success());
    assert!(s.stop().0);
    // The live export kept the newer data; the snapshot the older.
    let s = Serving::start(dir, &["--export", "disk"]);
    assert!(qemu_io(&["read -P 0x22 0 256k"]).status.success());
    assert!(s.stop().0);

    // Automatic snapshots every second, at most two kept.
    let s = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--snapshot-every",
            "1s",
            "--snapshot-keep",
            "2",
        ],
    );
    wait_for("automatic snapshots dropped", || {
        s.log().contains("beyond --snapshot-keep")
    });
    assert!(s.stop().0);
    let o = output(oubli(dir).args(["snapshot", "ls", "--json"]));
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let auto = names.iter().filter(|n| n.starts_with("auto-")).count();
    assert!(names.contains(&"before"), "{names:?}");
    assert!((1..=2).contains(&auto), "{names:?}");
}

/// Socket activation as systemd does it (`systemd-socket-activate`, from
/// the systemd package, holds the socket and starts `oubli serve` with it
/// at the first connection, `LISTEN_FDS=1`): nbdinfo reads the export
/// through the passed socket; the socket stays in place after the server
/// stops (it is the service manager's). Without any socket, serve refuses.
#[test]
fn serve_takes_its_socket_from_systemd() {
    if !tool("nbdinfo", "libnbd-bin") || !tool("systemd-socket-activate", "systemd") {
        return;
    }
    let d = init();
    let dir = d.path();
    let o = output(oubli(dir).args(["serve", "--export", "disk", "--size", "1M"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nowhere to listen"));

    let sock = dir.join("activated.sock");
    let log = dir.join("activated.log");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&sock)
        .args(["-E", "OUBLI_PASSWORD=serve test", "--"])
        .arg(env!("CARGO_BIN_EXE_oubli"))
        .arg("--store")
        .arg(dir.join("store"))
        .arg("--vault")
        .arg(dir.join("vault"))
        .args(["serve", "--export", "disk", "--size", "1M"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Reap<'a>(&'a mut Child);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let activator = Reap(&mut activator);
    wait_for("the activation socket", || sock.exists());
    let uri = format!("nbd+unix:///disk?socket={}", sock.display());
    let o = output(Command::new("nbdinfo").arg(&uri));
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("1048576"),
        "{}{}{logged}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        logged.contains("listening on the socket passed as descriptor 3"),
        "{logged}"
    );
    // The same server answers the next client (the socket was handed over once).
    let o = output(Command::new("nbdinfo").args(["--size", &uri]));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1048576");
    // SIGTERM to the server (systemd-socket-activate exec'd it: same process).
    let ok = output(
        Command::new("kill")
            .arg("-TERM")
            .arg(activator.0.id().to_string()),
    )
    .status
    .success();
    assert!(ok);
    wait_for("the server to stop", || {
        activator.0.try_wait().unwrap().is_some()
    });
    assert!(std::fs::read_to_string(&log).unwrap().contains("committed"));
    assert!(sock.exists(), "the service manager's socket was removed");
}

/// Issue 40 item 2: 200 TCP connections that trickle a byte every two
/// seconds — some inside the TLS handshake (a ClientHello that never
/// completes), some in the plain NBD option haggling — keep neither a
/// client with a certificate nor a Unix-socket client out: each connects
/// and reads the export within 2 s. Every trickler is cut at the handshake
/// deadline (10 s) although each of its reads makes progress, and so is
/// one that trickles a request to the control socket (which serves one
/// client at a time): `oubli status` answers afterwards.
#[test]
fn trickling_handshakes_keep_no_client_out() {
    use std::net::TcpStream;
    trait Wire: Read + Write + Send {}
    impl<T: Read + Write + Send> Wire for T {}
    /// A connection (`None` once closed) and the bytes it trickles.
    type Trickler = (Option<Box<dyn Wire>>, Vec<u8>);
    if !tool("nbdcopy", "libnbd-bin") || !tool("certtool", "gnutls-bin") {
        return;
    }
    let d = init();
    let dir = d.path();
    let (server_certs, client_certs) = make_certs(dir);
    let s = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--size",
            "1M",
            "--listen",
            "127.0.0.1:0",
            "--tls-certificates",
            &server_certs,
        ],
    );
    let port = tcp_port(&s);

    // NBD client flags (fixed newstyle, no zeroes) and an option header.
    let option = |opt: u32| {
        let mut v = 3u32.to_be_bytes().to_vec();
        v.extend_from_slice(b"IHAVEOPT");
        v.extend_from_slice(&opt.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes());
        v
    };
    // A TLS record header announcing 512 bytes, then a ClientHello's start:
    // nothing the server can act on before the record is whole.
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    hello.resize(64, 0);
    // One trickler in four haggles in plain NBD (GO, one byte at a time);
    // the others start TLS and trickle the ClientHello.
    let mut tricklers: Vec<Trickler> = Vec::new();
    for i in 0..200 {
        let setup = || -> std::io::Result<(TcpStream, Vec<u8>)> {
            let mut c = TcpStream::connect(("127.0.0.1", port))?;
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            let mut greeting = [0u8; 18];
            c.read_exact(&mut greeting)?;
            if i % 4 == 0 {
                return Ok((c, option(7)));
            }
            c.write_all(&option(5))?; // NBD_OPT_STARTTLS
            let mut ack = [0u8; 20];
            c.read_exact(&mut ack)?;
            Ok((c, hello.clone()))
        };
        // A connection the server refused or closed at once counts as closed.
        match setup() {
            Ok((c, bytes)) => {
                c.set_nonblocking(true).unwrap();
                tricklers.push((Some(Box::new(c)), bytes));
            }
            Err(_) => tricklers.push((None, Vec::new())),
        }
    }
    // A request to the control socket that never ends its line.
    let control = std::os::unix::net::UnixStream::connect(dir.join("store/control.sock")).unwrap();
    control.set_nonblocking(true).unwrap();
    tricklers.push((Some(Box::new(control)), b"status".repeat(10)));
    // One byte every two seconds on each, for at most 40 s; a connection
    // the server closed is noticed by a read that returns end of input.
    let trickle = std::thread::spawn(move || {
        let start = Instant::now();
        let mut sent = 0usize;
        let mut round = 0usize;
        loop {
            let mut open = 0;
            for (conn, bytes) in tricklers.iter_mut() {
                let Some(c) = conn else { continue };
                let mut buf = [0u8; 4096];
                let closed = match c.read(&mut buf) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
                let byte = bytes.get(round).copied().unwrap_or(0);
                if closed || c.write_all(&[byte]).is_err() {
                    *conn = None;
                    continue;
                }
                sent += 1;
                open += 1;
            }
            if open == 0 || start.elapsed() > Duration::from_secs(40) {
                return (open, sent, start.elapsed());
            }
            round += 1;
            std::thread::sleep(Duration::from_secs(2));
        }
    });

    // Connects and reads the whole export within 2 s, or fails.
    let read_within_2s = |uri: &str| {
        let mut child = Command::new("nbdcopy")
            .args(["--no-extents", "-C", "1", uri, "null:"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let finished = child.try_wait().unwrap();
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        eprintln!("{uri}: {:?}", start.elapsed());
        (finished.is_some_and(|st| st.success()), err)
    };
    let (tls_ok, tls_err) = read_within_2s(&format!(
        "nbds://localhost:{port}/disk?tls-certificates={client_certs}"
    ));
    let (unix_ok, unix_err) = read_within_2s(&uri(dir));
    let (open, sent, took) = trickle.join().unwrap();
    let log = s.log();
    assert!(
        tls_ok,
        "the client with a certificate did not read within 2 s: {tls_err}\n{log}"
    );
    assert!(
        unix_ok,
        "the Unix-socket client did not read within 2 s: {unix_err}\n{log}"
    );
    assert_eq!(
        open, 0,
        "{open} trickling connections still open after {took:?} ({sent} bytes sent)"
    );
    // The control socket serves again.
    let o = output(oubli(dir).args(["status", "--json"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cut = log.matches("no handshake within").count();
    let evicted = log.matches("have not authenticated yet").count();
    eprintln!("tricklers: {sent} bytes sent, {cut} cut at the deadline, {evicted} closed to make room, all closed after {took:?}");
    assert!(cut > 0, "{log}");
    assert!(s.stop().0);
}

/// Issue 40 item 4: `--metrics-file PATH` writes its new content beside
/// PATH under a fresh name, created exclusively and never through a
/// symlink, then renames it into place. A symlink planted at `PATH.tmp`
/// (the fixed name written before, through the link) is left alone with
/// the file it points at; the metrics file is created 0600, and a mode its
/// owner gives it (to let a scraper read it) survives the rewrites.
#[test]
fn metrics_file_is_not_written_through_a_planted_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let d = init();
    let dir = d.path();
    let metrics = dir.join("oubli.prom");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = dir.join("oubli.prom.tmp");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let metrics_arg = metrics.to_str().unwrap();
    let s = Serving::start(
        dir,
        &[
            "--export",
            "disk",
            "--size",
            "1M",
            "--metrics-file",
            metrics_arg,
        ],
    );
    wait_for("the metrics file", || {
        std::fs::read_to_string(&metrics).is_ok_and(|t| t.contains("oubli_epoch{store="))
    });
    let untouched = |when: &str| {
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious\n",
            "{when}: written through the symlink"
        );
        assert!(
            std::fs::symlink_metadata(&planted).unwrap().is_symlink(),
            "{when}"
        );
        let meta = std::fs::symlink_metadata(&metrics).unwrap();
        assert!(meta.is_file(), "{when}: the metrics file is {meta:?}");
    };
    untouched("at start");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&metrics), 0o600);

    std::fs::set_permissions(&metrics, std::fs::Permissions::from_mode(0o644)).unwrap();
    let first = std::fs::read_to_string(&metrics).unwrap();
    let o = output(oubli(dir).arg("commit"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for("the metrics rewritten after the commit", || {
        std::fs::read_to_string(&metrics).is_ok_and(|t| t != first)
    });
    untouched("after a commit");
    assert_eq!(mode(&metrics), 0o644);
    let (ok, _) = s.stop();
    assert!(ok);
    // Nothing left beside it but the planted link.
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("oubli.prom"))
        .collect();
    names.sort();
    assert_eq!(names, ["oubli.prom", "oubli.prom.tmp"]);
}

/// Issue 40 item 4, the same fault as a password file's: a TLS private key
/// other users can read draws a warning when `serve` loads it, as ssh
/// gives for a private key; a 0600 key (what scripts/nbd-certs makes) none.
#[test]
fn serve_warns_about_a_tls_key_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    if !tool("certtool", "gnutls-bin") {
        return;
    }
    let d = init();
    let dir = d.path();
    let (server, _) = make_certs(dir);
    let server = Path::new(&server);
    let key = server.join("server-key.pem");
    let args = [
        "--export",
        "disk",
        "--size",
        "1M",
        "--tls-certificates",
        server.to_str().unwrap(),
    ];
    let log_of_a_run = || {
        let s = Serving::start(dir, &args);
        let log = s.log();
        let (ok, _) = s.stop();
        assert!(ok, "{log}");
        log
    };
    let log = log_of_a_run();
    assert!(!log.contains("warning"), "{log}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let log = log_of_a_run();
    let warning = format!(
        "warning: TLS private key {} is open to other users (mode 640): run `chmod 600 {}`",
        key.display(),
        key.display()
    );
    assert!(log.contains(&warning), "{log}");
}
