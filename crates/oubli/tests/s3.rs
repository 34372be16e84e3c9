//! The `oubli` command on a store in an S3 bucket (versitygw on loopback, versioning on): init, put, get, rm, commit, a second writer refused, the audit's verdict, gc --purge-versions.

use assert_cmd::Command;
use oubli_s3::test_server::TestServer;
use predicates::prelude::*;
use std::path::Path;
use std::process::Command as StdCommand;

const PASSWORD: &str = "s3 test password";

/// Gives `cmd` the environment of `oubli` on `store` run by one machine,
/// whose state directory (lock, control socket) is `state` under `dir`.
fn as_machine<'c>(
    cmd: &'c mut StdCommand,
    dir: &Path,
    server: &TestServer,
    store: &str,
    state: &str,
) -> &'c mut StdCommand {
    cmd.env_clear()
        .env("HOME", dir)
        .env("XDG_STATE_HOME", dir.join(state))
        .env("OUBLI_STORE", store)
        .env("OUBLI_VAULT", dir.join("vault"))
        .env("OUBLI_PASSWORD", PASSWORD)
        .envs(server.env())
}

/// `oubli` as machine `state`, a process to spawn and hold (a writer kept
/// mid-put, a server).
fn oubli_process(dir: &Path, server: &TestServer, store: &str, state: &str) -> StdCommand {
    let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("oubli"));
    as_machine(&mut cmd, dir, server, store, state);
    cmd
}

fn oubli(dir: &Path, server: &TestServer, store: &str, state: &str) -> Command {
    Command::from_std(oubli_process(dir, server, store, state))
}

#[test]
fn a_store_in_a_versioned_bucket_from_init_to_purged_versions() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let at = server.bucket("cli", true, "team/store");
    let url = at.to_string();
    let cmd = |state: &str| oubli(dir.path(), &server, &url, state);
    cmd("here")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "created store s3://cli/team/store/",
        ));
    // A second init finds the store there: "already initialized" (exit 4).
    cmd("here")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .env("OUBLI_VAULT", dir.path().join("vault2"))
        .assert()
        .code(4);
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "MARKER-the-deleted-secret").unwrap();
    cmd("here")
        .args(["put", "secret"])
        .arg(&secret)
        .assert()
        .success();
    cmd("here")
        .args(["put", "kept"])
        .arg(&secret)
        .assert()
        .success();
    cmd("here")
        .args(["get", "secret", "-"])
        .assert()
        .success()
        .stdout("MARKER-the-deleted-secret");
    // The vault as it was while the secret lived: the control below.
    let old_vault = dir.path().join("vault.old");
    std::fs::copy(dir.path().join("vault"), &old_vault).unwrap();
    cmd("here")
        .args(["rm", "secret", "--purge"])
        .assert()
        .success();
    cmd("here").args(["ls"]).assert().success().stdout("kept\n");
    // The adversary's view (every object the bucket holds now + the vault):
    // nothing deleted opens.
    cmd("here")
        .args(["audit"])
        .assert()
        .success()
        .stdout(predicate::str::contains("nothing deleted can be recovered"));
    cmd("here").args(["fsck"]).assert().success();
    // The provider's view: every version the bucket kept + the vault.
    cmd("here")
        .args(["audit", "--with-versions"])
        .assert()
        .success()
        .stdout(predicate::str::contains("every version:"))
        .stdout(predicate::str::contains("nothing deleted can be recovered"));
    // Control: with the old vault too, the kept versions give the secret up.
    cmd("here")
        .args(["audit", "--with-versions", "--with-vault-copy"])
        .arg(&old_vault)
        .assert()
        .code(10)
        .stdout(predicate::str::contains("ERASURE FAILURE"));

    // The bucket kept old versions; gc --purge-versions removes them.
    let admin = server.admin();
    let old = |admin: &oubli_s3::Admin| {
        admin
            .versions("cli", "team/store/")
            .unwrap()
            .into_iter()
            // Current delete markers stay, and so does the lock's version
            // held during the purge.
            .filter(|v| !v.is_latest && v.key != "team/store/lock")
            .count()
    };
    assert!(old(&admin) > 0, "a versioned bucket keeps old versions");
    cmd("here")
        .args(["gc", "--purge-versions"])
        .assert()
        .success()
        .stdout(predicate::str::contains("old version(s)"));
    assert_eq!(old(&admin), 0);
    cmd("here").args(["get", "kept", "-"]).assert().success();
    // --purge-versions and --with-versions on a directory store are usage errors.
    for args in [
        &["gc", "--purge-versions"][..],
        &["audit", "--with-versions"],
    ] {
        let mut local = Command::cargo_bin("oubli").unwrap();
        local
            .env_clear()
            .env("HOME", dir.path())
            .env("OUBLI_STORE", dir.path().join("no-store"))
            .env("OUBLI_PASSWORD", PASSWORD)
            .args(args)
            .assert()
            .code(2);
    }
}

#[test]
fn a_second_writer_elsewhere_is_refused_while_a_mount_holds_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let url = server.bucket("busy", false, "").to_string();
    let cmd = |state: &str| oubli(dir.path(), &server, &url, state);
    cmd("a")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    // A writer on "another machine" (its own state directory) holds the store...
    let mut holder = oubli_process(dir.path(), &server, &url, "a");
    holder
        .args(["put", "big", "-"])
        .stdin(std::process::Stdio::piped());
    let mut holder = holder.spawn().unwrap();
    // ... (its stdin still open: it is mid-put) ...
    std::thread::sleep(std::time::Duration::from_millis(800));
    cmd("b")
        .args(["put", "other", "-"])
        .write_stdin("x")
        .assert()
        .code(11)
        .stderr(predicate::str::contains("in use by pid"));
    // Readers need no lock.
    cmd("b").args(["ls"]).assert().success();
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    cmd("b").args(["ls"]).assert().success().stdout("big\n");
}

/// Issue 40: two containers of one machine share the boot id but not their
/// pids. A writer started in a pid namespace of its own (`unshare -pf
/// --mount-proc`, its own state directory) must not take the lock of a
/// live holder whose pid it cannot see; the holder's write survives.
#[test]
fn a_writer_in_another_pid_namespace_does_not_take_a_live_holders_lock() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let ok = std::process::Command::new("unshare")
        .args(["-pf", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "unshare -pf --mount-proc needs root (the tests run as root)"
    );
    let url = server.bucket("containers", false, "").to_string();
    let cmd = |state: &str| oubli(dir.path(), &server, &url, state);
    cmd("a")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    let mut holder = oubli_process(dir.path(), &server, &url, "a");
    holder
        .args(["put", "held", "-"])
        .stdin(std::process::Stdio::piped());
    let mut holder = holder.spawn().unwrap();
    std::io::Write::write_all(holder.stdin.as_mut().unwrap(), b"the holder's bytes").unwrap();
    // The holder has its lock (a writer elsewhere is refused)...
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let lock = server.data.join("containers/lock");
    while !std::fs::read_to_string(&lock)
        .is_ok_and(|t| t.contains("pid ") && !t.contains("released"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never took the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // ... and "another container" starts a writer: pid 1 of its own namespace.
    let mut other = StdCommand::new("unshare");
    other
        .args(["-pf", "--mount-proc"])
        .arg(assert_cmd::cargo::cargo_bin("oubli"));
    as_machine(&mut other, dir.path(), &server, &url, "b").args(["put", "intruder", "-"]);
    Command::from_std(other)
        .write_stdin("x")
        .assert()
        .code(11)
        .stderr(predicate::str::contains("in use by pid"));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success(), "the holder's write");
    cmd("b")
        .args(["get", "held", "-"])
        .assert()
        .success()
        .stdout("the holder's bytes");
    cmd("b").args(["ls"]).assert().success().stdout("held\n");
}

/// Issue 40 item 3: the local state directory of a store on S3 (its lock
/// and control socket), and the parents made for it under
/// `$XDG_STATE_HOME`, are the owner's only from the start, whether `init`
/// or a later command on another machine makes them: directories 0700,
/// files 0600, so no other user can hold the store's lock.
#[test]
fn the_state_directory_of_a_store_on_s3_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let url = server.bucket("private", false, "team/store").to_string();
    let cmd = |state: &str| oubli(dir.path(), &server, &url, state);
    cmd("state")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    cmd("state")
        .args(["put", "doc", "-"])
        .write_stdin("x")
        .assert()
        .success();
    // Another machine's first command makes its own state directory.
    cmd("elsewhere")
        .args(["put", "other", "-"])
        .write_stdin("y")
        .assert()
        .success();
    let mut open = Vec::new();
    let mut todo = vec![dir.path().join("state"), dir.path().join("elsewhere")];
    let mut locks = 0;
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        locks += usize::from(p.file_name().is_some_and(|n| n == "lock"));
        if mode != if meta.is_dir() { 0o700 } else { 0o600 } {
            open.push(format!("{} {mode:o}", p.display()));
        }
    }
    assert_eq!(locks, 2, "a lock file in each state directory");
    assert!(open.is_empty(), "not private: {open:#?}");
}

/// Issue 40: `gc --purge-versions` purges under the store's lock (the
/// lock's release is the one thing written after it) and never deletes a
/// current delete marker (which would make the version under it current
/// again: a deleted run or pack back in every listing).
#[test]
fn gc_purge_versions_keeps_current_delete_markers_and_runs_under_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let at = server.bucket("markers", true, "s");
    let url = at.to_string();
    let cmd = |state: &str| oubli(dir.path(), &server, &url, state);
    cmd("here")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    let file = dir.path().join("f");
    std::fs::write(&file, "MARKER-deleted").unwrap();
    cmd("here")
        .args(["put", "doomed"])
        .arg(&file)
        .assert()
        .success();
    cmd("here")
        .args(["put", "kept"])
        .arg(&file)
        .assert()
        .success();
    cmd("here")
        .args(["rm", "doomed", "--purge"])
        .assert()
        .success();
    // Cleaning deletes whole objects (runs, packs): delete markers.
    cmd("here")
        .args(["gc", "--threshold", "1"])
        .assert()
        .success();
    let admin = server.admin();
    let deleted: Vec<String> = admin
        .versions("markers", "s/")
        .unwrap()
        .into_iter()
        .filter(|v| v.delete_marker && v.is_latest)
        .map(|v| v.key)
        .collect();
    assert!(!deleted.is_empty(), "rm --purge deleted objects");
    cmd("here")
        .args(["gc", "--purge-versions"])
        .assert()
        .success();
    let after = admin.versions("markers", "s/").unwrap();
    for key in &deleted {
        let of_key: Vec<_> = after.iter().filter(|v| &v.key == key).collect();
        assert!(
            of_key.iter().all(|v| v.delete_marker && v.is_latest) && !of_key.is_empty(),
            "{key}: its current delete marker must stay, alone: {of_key:?}"
        );
    }
    // Old versions of everything else are gone, but for the lock's own
    // last held version: the lock was released after the purge.
    let lock: Vec<_> = after.iter().filter(|v| v.key == "s/lock").collect();
    assert_eq!(
        lock.len(),
        2,
        "held during the purge, released after: {lock:?}"
    );
    let old: Vec<_> = after
        .iter()
        .filter(|v| !v.is_latest && v.key != "s/lock")
        .collect();
    assert!(old.is_empty(), "{old:?}");
    cmd("here").args(["ls"]).assert().success().stdout("kept\n");
    cmd("here").args(["get", "kept", "-"]).assert().success();
}

/// Issue 40: a real `oubli serve` on S3 (lease 2 s), stopped (SIGSTOP) past
/// its lease, is taken over by another `serve` (its own state directory, as
/// on another machine); run again (SIGCONT), its next flush fails. Every
/// flush either acknowledged reads back from a third.
#[test]
fn a_serve_stopped_past_its_lease_fails_its_next_flush_and_loses_no_acknowledged_one() {
    use std::process::{Command as Std, Stdio};
    use std::time::{Duration, Instant};
    if !Std::new("qemu-io")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        panic!("qemu-io (qemu-utils) is needed");
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let url = server.bucket("served", false, "disk").to_string();
    oubli(dir.path(), &server, &url, "a")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    struct Serve(std::process::Child);
    impl Drop for Serve {
        fn drop(&mut self) {
            let pid = self.0.id().to_string();
            let _ = Std::new("kill")
                .args(["-CONT", &pid])
                .stderr(Stdio::null())
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // `oubli serve` as "machine" `state`: retried while the store is in
    // use (exit 11) until its socket answers.
    let serve = |state: &str| -> Serve {
        let sock = dir.path().join(format!("{state}.sock"));
        let start = Instant::now();
        loop {
            let mut cmd = oubli_process(dir.path(), &server, &url, state);
            cmd.env("OUBLI_S3_LEASE_SECS", "2")
                .args(["serve", "--export", "disk", "--size", "1M", "--socket"])
                .arg(&sock)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join(format!("{state}.log"))).unwrap());
            let mut child = Serve(cmd.spawn().unwrap());
            loop {
                if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                    return child;
                }
                if let Some(status) = child.0.try_wait().unwrap() {
                    let log = std::fs::read_to_string(dir.path().join(format!("{state}.log")))
                        .unwrap_or_default();
                    assert_eq!(status.code(), Some(11), "{log}");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(start.elapsed() < Duration::from_secs(60), "never served");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    // qemu-io's default cache mode (writethrough) flushes after each write.
    let io = |state: &str, command: &str| {
        let uri = format!(
            "nbd+unix:///disk?socket={}",
            dir.path().join(format!("{state}.sock")).display()
        );
        let o = Std::new("qemu-io")
            .args(["-f", "raw", &uri, "-c", command])
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        (o.status.success() && !text.contains("failed"), text)
    };
    let a = serve("a");
    let (ok, out) = io("a", "write -P 0xaa 0 64k");
    assert!(ok, "{out}");
    assert!(Std::new("kill")
        .args(["-STOP", &a.0.id().to_string()])
        .status()
        .unwrap()
        .success());
    let b = serve("b");
    let (ok, out) = io("b", "write -P 0xbb 64k 64k");
    assert!(ok, "{out}");
    assert!(Std::new("kill")
        .args(["-CONT", &a.0.id().to_string()])
        .status()
        .unwrap()
        .success());
    // It still serves (the connection is made), but the write's flush fails.
    let (ok, out) = io("a", "write -P 0xcc 128k 64k");
    assert!(
        !ok && out.contains("write failed"),
        "the old holder acknowledged a flush after the takeover: {out}"
    );
    let (ok, out) = io("a", "write -P 0xcc 192k 64k");
    assert!(
        !ok && out.contains("write failed"),
        "a later flush of the old holder: {out}"
    );
    drop(a);
    drop(b);
    let _c = serve("c");
    let (ok, out) = io("c", "read -P 0xaa 0 64k");
    assert!(ok, "the old holder's acknowledged flush: {out}");
    let (ok, out) = io("c", "read -P 0xbb 64k 64k");
    assert!(ok, "the new holder's acknowledged flush: {out}");
}
