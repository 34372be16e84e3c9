//! `oubli mount` / `oubli umount` end to end: a detached mount, files through it, the control socket while mounted, the commit at unmount (audit finds nothing deleted), and the errors.

use assert_cmd::Command;
use predicates::prelude::*;
use std::fs;
use std::path::PathBuf;
use tempfile::TempDir;

struct Env {
    dir: TempDir,
    store: PathBuf,
    mnt: PathBuf,
}

impl Env {
    fn new() -> Env {
        Env::with_key_scheme("parent-pointer")
    }

    fn with_key_scheme(key_scheme: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let env = Env {
            store: dir.path().join("store"),
            mnt: dir.path().join("mnt"),
            dir,
        };
        fs::create_dir(&env.mnt).unwrap();
        env.cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
            .args(["--key-scheme", key_scheme])
            .assert()
            .success();
        env
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::cargo_bin("oubli").unwrap();
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OUBLI_STORE", &self.store)
            .env("OUBLI_VAULT", self.dir.path().join("vault"))
            .env("OUBLI_PASSWORD", "pw");
        cmd
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed test must not leave a mount behind.
        let _ = self.cmd().arg("umount").arg(&self.mnt).output();
    }
}

fn fuse_available() -> bool {
    match oubli_fuse::check_fuse() {
        Ok(()) => true,
        Err(e) if std::env::var("OUBLI_SKIP_EXTERNAL").as_deref() == Ok("1") => {
            eprintln!("skipped (OUBLI_SKIP_EXTERNAL=1): {e}");
            false
        }
        Err(e) => panic!("{e}\nThe mount tests need /dev/fuse and the Debian package fuse3; OUBLI_SKIP_EXTERNAL=1 skips them."),
    }
}

#[test]
fn mount_write_unmount_audit() {
    if !fuse_available() {
        return;
    }
    for scheme in ["parent-pointer", "keyed-hash-forest", "key-storage-area"] {
        mount_write_unmount_audit_with(scheme);
    }
}

fn mount_write_unmount_audit_with(key_scheme: &str) {
    let env = Env::with_key_scheme(key_scheme);
    let src = env.dir.path().join("src");
    fs::write(&src, b"stored before").unwrap();
    env.cmd()
        .args(["put", "before"])
        .arg(&src)
        .assert()
        .success();
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .args(["-o", "fsname=oubli-cli-test,epoch_interval=3600"])
        .assert()
        .success()
        .stdout(predicate::str::contains("mounted store"));
    assert_eq!(fs::read(env.mnt.join("before")).unwrap(), b"stored before");
    fs::create_dir(env.mnt.join("dir")).unwrap();
    fs::write(env.mnt.join("dir/kept"), b"kept").unwrap();
    fs::write(env.mnt.join("doomed"), vec![7u8; 100_000]).unwrap();
    // The store is busy, but status reaches the mount through the control socket.
    env.cmd()
        .arg("status")
        .assert()
        .success()
        .stdout(predicate::str::contains("running mount or server"));
    env.cmd().arg("commit").assert().success();
    fs::remove_file(env.mnt.join("doomed")).unwrap();
    env.cmd().arg("umount").arg(&env.mnt).assert().success();
    assert!(!fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .contains("oubli-cli-test"));
    // The unmount committed: nothing deleted is recoverable, and the files are there.
    env.cmd().arg("audit").assert().success();
    env.cmd()
        .arg("ls")
        .assert()
        .success()
        .stdout(predicate::str::contains("dir").and(predicate::str::contains("doomed").not()));
}

#[test]
fn mount_errors() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    env.cmd()
        .arg("mount")
        .arg(env.dir.path().join("nowhere"))
        .assert()
        .code(2);
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .args(["-o", "epoch_bytes=lots"])
        .assert()
        .code(2);
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .env("OUBLI_PASSWORD", "wrong")
        .assert()
        .code(5);
    env.cmd().arg("umount").arg(&env.mnt).assert().code(1);
}

/// `oubli status MOUNTPOINT`, `oubli purge MOUNTPOINT` and `oubli umount`
/// find the store from the mount table, without `--store`; a path that is
/// not an oubli mount is a usage error.
#[test]
fn status_purge_and_umount_by_mount_point() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    let mnt = env.dir.path().join("a mount point");
    fs::create_dir(&mnt).unwrap();
    env.cmd().arg("mount").arg(&mnt).assert().success();
    fs::write(mnt.join("doomed"), b"secret").unwrap();
    fs::remove_file(mnt.join("doomed")).unwrap();
    let without_store = || {
        let mut cmd = env.cmd();
        cmd.env_remove("OUBLI_STORE");
        cmd
    };
    without_store()
        .args(["status", "--json"])
        .arg(&mnt)
        .assert()
        .success()
        .stdout(predicate::str::contains(env.store.to_str().unwrap()))
        .stdout(predicate::str::contains("\"epoch\": 1"));
    without_store()
        .arg("purge")
        .arg(&mnt)
        .assert()
        .success()
        .stdout(predicate::str::contains("epoch 2 began"));
    without_store()
        .arg("status")
        .arg(env.dir.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("nothing is mounted"));
    without_store()
        .arg("status")
        .arg("/proc")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not an oubli mount"));
    without_store().arg("umount").arg(&mnt).assert().success();
    // The unmount committed the store that was mounted, found without --store.
    env.cmd()
        .args(["status", "--json"])
        .assert()
        .success()
        .stdout(predicate::str::contains("\"epoch\": 3"));
}

#[test]
fn snapshots_and_redact_on_a_live_mount() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    let mnt = &env.mnt;
    // Automatic snapshots every second, at most two kept.
    env.cmd()
        .arg("mount")
        .arg(mnt)
        .args(["-o", "snapshot_every=1s,snapshot_keep=2"])
        .assert()
        .success();
    fs::create_dir(mnt.join("clients")).unwrap();
    fs::write(mnt.join("clients/alice"), b"alice's records").unwrap();
    fs::write(mnt.join("clients/bob"), b"bob's records").unwrap();
    env.cmd()
        .args(["snapshot", "create", "before-erasure"])
        .arg(mnt)
        .assert()
        .success()
        .stdout(predicate::str::contains("by the process holding the store"));
    assert_eq!(
        fs::read(mnt.join(".snapshots/before-erasure/clients/alice")).unwrap(),
        b"alice's records"
    );
    // Retention: automatic snapshots appear, and no more than two stay.
    let autos = || {
        fs::read_dir(mnt.join(".snapshots"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("auto-")
            })
            .count()
    };
    let start = std::time::Instant::now();
    while autos() < 2 && start.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(autos(), 2, "snapshot_keep=2");

    // The path named inside the mount, without the mount point: found from /proc/self/mountinfo.
    env.cmd()
        .arg("redact")
        .arg(mnt.join("clients/alice"))
        .arg("--purge")
        .assert()
        .success()
        .stdout(predicate::str::contains("removed from the live tree"))
        .stdout(predicate::str::contains("before-erasure"))
        .stdout(predicate::str::contains("now unrecoverable"));
    assert!(!mnt.join("clients/alice").exists());
    assert!(!mnt.join(".snapshots/before-erasure/clients/alice").exists());
    assert_eq!(
        fs::read(mnt.join(".snapshots/before-erasure/clients/bob")).unwrap(),
        b"bob's records"
    );
    for e in fs::read_dir(mnt.join(".snapshots")).unwrap() {
        let snap = e.unwrap().path();
        assert!(!snap.join("clients/alice").exists(), "{}", snap.display());
    }
    env.cmd()
        .arg("redact")
        .arg(mnt.join("clients/nobody"))
        .assert()
        .failure()
        .stderr(predicate::str::contains(
            "no such file in the store or any snapshot",
        ));
    env.cmd()
        .arg("redact")
        .arg(env.dir.path().join("elsewhere"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not inside an oubli mount"));
    env.cmd().arg("umount").arg(mnt).assert().success();
    // Nothing of alice opens for an adversary holding the store and the vault.
    env.cmd().arg("audit").assert().success();
}

/// An fstab-style mount: `mount -t fuse.oubli STORE MNT -o vault=…,password-file=…,_netdev`
/// finds `/sbin/mount.fuse.oubli` (the `oubli` binary under that name, as
/// `scripts/install` links it), and `umount MNT` unmounts after the commit.
/// Needs root (it links the helper into /sbin for the test's duration).
#[test]
fn mount_t_fuse_oubli_with_fstab_options_and_umount() {
    if !fuse_available() {
        return;
    }
    // SAFETY: FFI call without arguments that cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mount(8) helpers are installed in /sbin, which needs root");
        return;
    }
    let helper = std::path::Path::new("/sbin/mount.fuse.oubli");
    let ours = assert_cmd::cargo::cargo_bin("oubli");
    match fs::read_link(helper) {
        Ok(target) if target == ours => {}
        Ok(_) => {
            eprintln!(
                "skipped: {} belongs to an installed oubli",
                helper.display()
            );
            return;
        }
        Err(_) if helper.exists() => {
            eprintln!("skipped: {} exists", helper.display());
            return;
        }
        Err(_) => std::os::unix::fs::symlink(&ours, helper).unwrap(),
    }
    struct Unlink<'a>(&'a std::path::Path);
    impl Drop for Unlink<'_> {
        fn drop(&mut self) {
            let _ = fs::remove_file(self.0);
        }
    }
    let _unlink = Unlink(helper);

    let env = Env::new();
    let password = env.dir.path().join("password");
    fs::write(&password, "pw\n").unwrap();
    fs::set_permissions(
        &password,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let options = format!(
        "defaults,vault={},password-file={},_netdev,noatime,x-systemd.automount",
        env.dir.path().join("vault").display(),
        password.display()
    );
    // As at boot: no OUBLI_* variables, only what the fstab line says.
    let out = std::process::Command::new("mount")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["-t", "fuse.oubli", "-o", &options])
        .arg(&env.store)
        .arg(&env.mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(env.mnt.to_str().unwrap())
                && l.contains("fuse.oubli")),
        "{mounts}"
    );
    fs::write(env.mnt.join("from-fstab"), b"mounted at boot").unwrap();
    // mount -o remount,ro and back: the helper changes the kernel's flag.
    let remount = |how: &str| {
        let out = std::process::Command::new("mount")
            .args(["-o", how])
            .arg(&env.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    remount("remount,ro");
    let refused = fs::write(env.mnt.join("while-ro"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    remount("remount,rw");
    fs::write(env.mnt.join("after-rw"), b"x").unwrap();
    plain_umount(&env.mnt);
    // The mount process commits and lets go of the store.
    let start = std::time::Instant::now();
    loop {
        let got = env.cmd().args(["get", "from-fstab"]).output().unwrap();
        if got.status.success() {
            assert_eq!(got.stdout, b"mounted at boot");
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{}",
            String::from_utf8_lossy(&got.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    env.cmd()
        .args(["status", "--json"])
        .assert()
        .success()
        .stdout(predicate::str::contains("\"pending_deletions\": 0"));
}

/// `status --watch` refreshes (non-terminal: blocks appended) with the write
/// rate; `--metrics-file` is rewritten in Prometheus' format after a commit.
#[test]
fn status_watch_and_metrics_file_on_a_live_mount() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    let metrics = env.dir.path().join("oubli.prom");
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .arg("--metrics-file")
        .arg(&metrics)
        .assert()
        .success();
    let start = std::time::Instant::now();
    while !metrics.exists() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let first = fs::read_to_string(&metrics).unwrap();
    assert!(first.contains("# TYPE oubli_epoch gauge"), "{first}");
    assert!(first.contains("oubli_epoch{store=\""), "{first}");

    let mut watch = std::process::Command::new(assert_cmd::cargo::cargo_bin("oubli"))
        .args(["status", "--watch", "--interval", "1"])
        .arg(&env.mnt)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    fs::write(env.mnt.join("f"), vec![1u8; 3 << 20]).unwrap();
    fs::remove_file(env.mnt.join("f")).unwrap();
    env.cmd().arg("purge").arg(&env.mnt).assert().success();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.matches("write rate").count() >= 2, "{text}");
    assert!(text.contains("refreshed"), "{text}");

    let start = std::time::Instant::now();
    loop {
        let now = fs::read_to_string(&metrics).unwrap();
        if now != first {
            assert!(now.contains("oubli_pending_deletions{store="), "{now}");
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "metrics not rewritten after a commit"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    env.cmd().arg("umount").arg(&env.mnt).assert().success();
}

/// A mount right after a plain `umount` waits for the previous mount process
/// to commit and let go of the store, instead of failing "in use"; a store
/// still mounted elsewhere fails at once, naming where.
#[test]
fn mount_waits_for_the_previous_holder_and_refuses_a_second_mount() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    env.cmd().arg("mount").arg(&env.mnt).assert().success();
    fs::write(env.mnt.join("kept"), b"across remounts").unwrap();
    let other = env.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    env.cmd()
        .arg("mount")
        .arg(&other)
        .assert()
        .code(11)
        .stderr(predicate::str::contains("already mounted at"));
    // Plain umount(8): returns before the mount process has committed.
    plain_umount(&env.mnt);
    env.cmd().arg("mount").arg(&env.mnt).assert().success();
    assert_eq!(fs::read(env.mnt.join("kept")).unwrap(), b"across remounts");
    env.cmd().arg("umount").arg(&env.mnt).assert().success();
}

/// umount(8), which returns before the mount process has committed.
fn plain_umount(mnt: &std::path::Path) {
    let out = std::process::Command::new("umount")
        .arg(mnt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
