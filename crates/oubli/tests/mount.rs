//! `oubli mount` / `oubli umount` end to end: a detached mount, files through it, the control socket while mounted, the commit at unmount (audit finds nothing deleted), and the errors.

mod common;
#[path = "../../oubli-vault/tests/common/mod.rs"]
mod hw;

use assert_cmd::Command;
use common::{fuse_available, Immutable};
use predicates::prelude::*;
use std::fs;
use std::path::PathBuf;
use tempfile::TempDir;

struct Env {
    dir: TempDir,
    store: PathBuf,
    mnt: PathBuf,
    /// The vault's address (default: the file `vault` in the directory).
    vault: String,
    /// More environment for every command (SOFTHSM2_CONF).
    envs: Vec<(String, String)>,
}

impl Env {
    /// `oubli status --json` of the mount at `mnt` (the live process's figures).
    fn live_status(&self) -> serde_json::Value {
        let out = self
            .cmd()
            .args(["status", "--json"])
            .arg(&self.mnt)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A copy of the store directory and the vault file as they are now,
    /// in `name` under the test's directory (what the adversary grabs).
    fn copy_store_and_vault(&self, name: &str) -> PathBuf {
        let copy = self.dir.path().join(name);
        fs::create_dir(&copy).unwrap();
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&self.store)
            .arg(&self.vault)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(copied.success());
        copy
    }

    fn new() -> Env {
        Env::with_key_scheme("parent-pointer")
    }

    fn with_key_scheme(key_scheme: &str) -> Env {
        Env::with_vault(key_scheme, None, Vec::new())
    }

    /// A store on `key_scheme` whose vault is at `vault` (a file in the
    /// directory if `None`), made with `envs` in the environment.
    fn with_vault(key_scheme: &str, vault: Option<String>, envs: Vec<(String, String)>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let env = Env {
            store: dir.path().join("store"),
            mnt: dir.path().join("mnt"),
            vault: vault.unwrap_or_else(|| dir.path().join("vault").display().to_string()),
            envs,
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
        Command::from_std(self.std_cmd())
    }

    /// The same command as a std one (to spawn a mount that stays in the foreground).
    fn std_cmd(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("oubli"));
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OUBLI_STORE", &self.store)
            .env("OUBLI_VAULT", &self.vault)
            .env("OUBLI_PASSWORD", "pw");
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        cmd
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed test must not leave a mount behind.
        let _ = self.cmd().arg("umount").arg(&self.mnt).output();
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

/// The kernel's writeback cache holds an overwrite until writeback: `oubli
/// commit` (the control socket) and SIGUSR1 have it written back first, and
/// wait until the mount has served those writes, so the overwritten bytes
/// are unrecoverable after the commit — checked by the adversary on a copy
/// of the store and vault taken right after it, with the file still open
/// and never synced. Many overwrites per way: one commit racing the
/// kernel's WRITE requests lost in about one in five (FUSE.md, "The
/// writeback cache").
#[test]
fn commit_and_sigusr1_erase_what_the_kernel_still_caches() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    // (files, bytes each): a few pages, which the kernel holds until the
    // commit's writeback, and 4 MiB over several files, whose WRITEs are
    // still queued or being served when the commit begins.
    let shapes = [(1, 8 << 10), (8, 512 << 10)];
    let epoch = |env: &Env| env.live_status()["epoch"].as_u64().unwrap();
    for (round, signal) in [(0usize, false), (1, true)] {
        // Detached for `oubli commit`; in the foreground for SIGUSR1 (its pid).
        let mut foreground = None;
        if signal {
            let child = env
                .std_cmd()
                .args(["mount", "--foreground"])
                .arg(&env.mnt)
                .spawn()
                .unwrap();
            foreground = Some(child);
            common::wait_for("the mount", || {
                env.cmd()
                    .arg("status")
                    .arg(&env.mnt)
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
        } else {
            env.cmd().arg("mount").arg(&env.mnt).assert().success();
        }
        for k in 0..8 {
            let (files, len) = shapes[k % shapes.len()];
            let old = 10 + 2 * (round * 8 + k);
            let new = old + 1;
            let paths: Vec<_> = (0..files)
                .map(|i| env.mnt.join(format!("overwritten-{round}-{k}-{i}")))
                .collect();
            for file in &paths {
                fs::write(file, common::content(old, len)).unwrap();
            }
            env.cmd().arg("commit").arg(&env.mnt).assert().success();
            let held: Vec<_> = paths
                .iter()
                .map(|file| fs::OpenOptions::new().write(true).open(file).unwrap())
                .collect();
            let overwrite = common::content(new, len);
            for h in &held {
                std::os::unix::fs::FileExt::write_all_at(h, &overwrite, 0).unwrap();
            }
            match &foreground {
                Some(child) => {
                    let was = epoch(&env);
                    let killed = std::process::Command::new("kill")
                        .args(["-USR1", &child.id().to_string()])
                        .status()
                        .unwrap();
                    assert!(killed.success());
                    common::wait_for("the SIGUSR1 commit", || epoch(&env) > was);
                }
                None => {
                    env.cmd().arg("commit").arg(&env.mnt).assert().success();
                }
            }
            let copy = env.copy_store_and_vault(&format!("copy-{round}-{k}"));
            let found = common::recoverable_with(
                &copy.join("store"),
                &copy.join("vault"),
                "pw",
                &[old, new],
            );
            assert!(
                !found[&old],
                "round {round}, overwrite {k} ({files} x {len} bytes): the overwritten bytes are recoverable after the commit"
            );
            assert!(
                found[&new],
                "round {round}, overwrite {k} ({files} x {len} bytes): the overwrite is not in the store"
            );
            drop(held);
            fs::remove_dir_all(&copy).unwrap();
        }
        env.cmd().arg("umount").arg(&env.mnt).assert().success();
        if let Some(mut child) = foreground {
            child.wait().unwrap();
        }
    }
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
/// A file copied in as a stream, then updated in place through the mount
/// (issue 43 part 1, DESIGN §3 "Split cells"): each 4 KiB write at random
/// splits the 32 KiB cell it lands in, as `oubli status` reports; after
/// `oubli commit` the adversary, with a copy of the store and the vault,
/// finds none of the replaced blocks but every new one and the old blocks
/// beside them in the split cells. Rewritten whole in place, the file's
/// cells are put back whole.
#[test]
fn a_file_updated_in_place_splits_its_cells_and_erases_what_it_replaced() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    env.cmd().arg("mount").arg(&env.mnt).assert().success();
    // 256 blocks of 4 KiB, block i holding records of "file" 100 + i.
    let block = |id: usize| common::content(id, 4096);
    let mut model: Vec<u8> = (0..256).flat_map(|i| block(100 + i)).collect();
    let path = env.mnt.join("image");
    fs::write(&path, &model).unwrap();
    env.cmd().arg("commit").arg(&env.mnt).assert().success();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Cells 1, 9, 18 (two blocks) and 25.
    let replaced = [10, 77, 150, 151, 200];
    for &i in &replaced {
        std::os::unix::fs::FileExt::write_all_at(&file, &block(500 + i), i as u64 * 4096).unwrap();
        model[i * 4096..(i + 1) * 4096].copy_from_slice(&block(500 + i));
    }
    file.sync_all().unwrap();
    assert_eq!(env.live_status()["cells_split"], 4);
    assert_eq!(fs::read(&path).unwrap(), model);
    env.cmd().arg("commit").arg(&env.mnt).assert().success();
    let copy = env.copy_store_and_vault("copy");
    let old: Vec<usize> = replaced.iter().map(|i| 100 + i).collect();
    let new: Vec<usize> = replaced.iter().map(|i| 500 + i).collect();
    // Beside the replaced blocks, in the same split cells.
    let kept = [111, 176, 149, 152, 201];
    let ids: Vec<usize> = old.iter().chain(&new).chain(&kept).copied().collect();
    let found = common::recoverable_with(&copy.join("store"), &copy.join("vault"), "pw", &ids);
    for id in old {
        assert!(
            !found[&id],
            "replaced block {id} is recoverable after the commit"
        );
    }
    for id in new.iter().chain(&kept) {
        assert!(found[id], "live block {id} is not in the store");
    }
    // Rewritten whole in place (no truncate): the cells go back whole.
    let model: Vec<u8> = (0..256).flat_map(|i| block(700 + i)).collect();
    std::os::unix::fs::FileExt::write_all_at(&file, &model, 0).unwrap();
    file.sync_all().unwrap();
    assert_eq!(env.live_status()["cells_rejoined"], 4);
    assert_eq!(fs::read(&path).unwrap(), model);
    drop(file);
    env.cmd().arg("umount").arg(&env.mnt).assert().success();
}

#[test]
fn mount_t_fuse_oubli_with_fstab_options_and_umount() {
    let Some(_helper) = MountHelper::install() else {
        return;
    };
    let env = Env::new();
    let options = format!(
        "defaults,{},_netdev,noatime,x-systemd.automount",
        env.fstab_secrets()
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

/// `/sbin/mount.fuse.oubli` linked to the `oubli` under test for a test's
/// duration (unlinked on drop): what mount(8) runs for `-t fuse.oubli`.
/// One test at a time holds it (the tests of a file run in parallel).
struct MountHelper {
    path: &'static std::path::Path,
    _held: std::sync::MutexGuard<'static, ()>,
}

/// Taken by whichever test has the helper installed.
static MOUNT_HELPER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl MountHelper {
    /// `None` (the test skips, saying why) without FUSE, without root, or
    /// when an installed oubli owns the helper's name.
    fn install() -> Option<MountHelper> {
        if !fuse_available() {
            return None;
        }
        // SAFETY: FFI call without arguments that cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mount(8) helpers are installed in /sbin, which needs root");
            return None;
        }
        let held = MOUNT_HELPER.lock().unwrap_or_else(|p| p.into_inner());
        let helper = std::path::Path::new("/sbin/mount.fuse.oubli");
        let ours = assert_cmd::cargo::cargo_bin("oubli");
        match fs::read_link(helper) {
            Ok(target) if target == ours => {}
            Ok(_) => {
                eprintln!(
                    "skipped: {} belongs to an installed oubli",
                    helper.display()
                );
                return None;
            }
            Err(_) if helper.exists() => {
                eprintln!("skipped: {} exists", helper.display());
                return None;
            }
            Err(_) => std::os::unix::fs::symlink(&ours, helper).unwrap(),
        }
        Some(MountHelper {
            path: helper,
            _held: held,
        })
    }
}

impl Drop for MountHelper {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.path);
    }
}

impl Env {
    /// The fstab options that open this store without the environment:
    /// `vault=…,password-file=…` (the password written to a 0600 file).
    fn fstab_secrets(&self) -> String {
        let password = self.dir.path().join("password");
        fs::write(&password, "pw\n").unwrap();
        fs::set_permissions(
            &password,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        format!("vault={},password-file={}", self.vault, password.display())
    }
}

/// A root mount by mount(8) from an fstab line is treated as a local file
/// system's (issue 43 part 4; xfstests generic/184, 306, 434, 633): device
/// nodes and set-user-ID programs work unless the line says `nodev` /
/// `nosuid`, which then still hold. mount(8) never passes `dev` or `suid`
/// on (they are its defaults), so the helper cannot wait for them.
#[test]
fn fstab_mount_by_root_allows_devices_and_setuid_unless_nodev_nosuid() {
    let Some(_helper) = MountHelper::install() else {
        return;
    };
    let env = Env::new();
    // The set-user-ID program runs as nobody, who must reach it.
    fs::set_permissions(
        env.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let fstab = env.dir.path().join("fstab");
    for (extra, honoured) in [("", true), (",nodev,nosuid", false)] {
        fs::write(
            &fstab,
            format!(
                "{} {} fuse.oubli {},allow_other{extra} 0 0\n",
                env.store.display(),
                env.mnt.display(),
                env.fstab_secrets()
            ),
        )
        .unwrap();
        // As at boot: no OUBLI_* variables, only what the fstab line says.
        let out = std::process::Command::new("mount")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .arg("-T")
            .arg(&fstab)
            .arg(&env.mnt)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount -T fstab: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A device node (/dev/null's numbers) opens and takes writes.
        let null = env.mnt.join(format!("null{extra}"));
        let made = std::process::Command::new("mknod")
            .arg(&null)
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        assert!(made.success());
        let opened = fs::OpenOptions::new().write(true).open(&null);
        match (&opened, honoured) {
            (Ok(_), true) => {}
            (Err(e), false) => assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}"),
            _ => panic!("line with {extra:?}: opening a device node gave {opened:?}"),
        }
        if let Ok(mut f) = opened {
            std::io::Write::write_all(&mut f, b"into /dev/null").unwrap();
        }
        // A set-user-ID root copy of id(1), run by nobody, runs as root.
        let id = env.mnt.join(format!("id{extra}"));
        fs::copy("/usr/bin/id", &id).unwrap();
        fs::set_permissions(&id, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&id)
            .arg("-u")
            .output()
            .unwrap();
        let euid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let want = if honoured { "0" } else { "65534" };
        assert_eq!(
            euid,
            want,
            "line with {extra:?}: the set-user-ID program ran as {euid} ({})",
            String::from_utf8_lossy(&out.stderr)
        );
        plain_umount(&env.mnt);
        wait_until_released(&env);
    }
}

/// Waits (bounded) until the mount process of `env`'s store has committed
/// and let go of the store after a plain umount(8).
fn wait_until_released(env: &Env) {
    let start = std::time::Instant::now();
    while !env.cmd().arg("ls").output().unwrap().status.success() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the mount process still holds the store"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A second mount of a store mounted under its own `fsname` (xfstests
/// generic/732): the mount table does not name the store then, yet the
/// second mount is refused at once, naming where the store is mounted,
/// instead of waiting as it does for a previous holder still committing.
#[test]
fn second_mount_of_a_store_under_its_own_fsname_is_refused_at_once() {
    if !fuse_available() {
        return;
    }
    let env = Env::new();
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .args(["-o", "fsname=my-secrets"])
        .assert()
        .success();
    let other = env.dir.path().join("other");
    fs::create_dir(&other).unwrap();
    // Generous for "at once", and short of the 30 s wait for a previous holder.
    env.cmd()
        .arg("mount")
        .arg(&other)
        .timeout(std::time::Duration::from_secs(20))
        .assert()
        .code(11)
        .stderr(predicate::str::contains(format!(
            "already mounted at {}",
            env.mnt.display()
        )));
    fs::write(env.mnt.join("still"), b"served").unwrap();
    env.cmd().arg("umount").arg(&env.mnt).assert().success();
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

/// How a test makes the file vault fail, as a user would meet it.
#[derive(Clone, Copy, Debug)]
enum Break {
    /// `chattr -R +i` on the vault's directory (the vault file in it too).
    Immutable,
    /// The vault file moved aside and a directory put in its place.
    Directory,
}

/// A file vault in a directory of its own, broken and mended on demand.
struct FileVault {
    dir: PathBuf,
    file: PathBuf,
    guard: Option<Immutable>,
}

impl FileVault {
    fn new(env_dir: &std::path::Path) -> FileVault {
        let dir = env_dir.join("vault-dir");
        fs::create_dir(&dir).unwrap();
        FileVault {
            file: dir.join("vault"),
            dir,
            guard: None,
        }
    }

    fn address(&self) -> String {
        self.file.display().to_string()
    }

    fn break_it(&mut self, how: Break) {
        match how {
            Break::Immutable => self.guard = Some(Immutable::set(&self.dir)),
            Break::Directory => {
                fs::rename(&self.file, self.dir.join("vault.aside")).unwrap();
                fs::create_dir(&self.file).unwrap();
            }
        }
    }

    fn mend(&mut self, how: Break) {
        match how {
            Break::Immutable => self.guard = None,
            Break::Directory => {
                fs::remove_dir(&self.file).unwrap();
                fs::rename(self.dir.join("vault.aside"), &self.file).unwrap();
            }
        }
    }
}

/// Files written and committed through the mount, then removed: deletions
/// that the unmount's commit must erase.
fn write_commit_remove(env: &Env) {
    fs::create_dir(env.mnt.join("dir")).unwrap();
    fs::write(env.mnt.join("dir/gone"), b"secret in a directory").unwrap();
    fs::write(env.mnt.join("doomed"), vec![7u8; 100_000]).unwrap();
    fs::write(env.mnt.join("kept"), b"kept").unwrap();
    env.cmd().arg("commit").assert().success();
    fs::remove_file(env.mnt.join("doomed")).unwrap();
    fs::remove_file(env.mnt.join("dir/gone")).unwrap();
}

fn pending_deletions(env: &Env) -> u64 {
    let out = env.cmd().args(["status", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["pending_deletions"].as_u64().unwrap()
}

/// The failure a broken vault leaves: exit 6, the deletions named, how to finish.
fn assert_names_the_pending_deletions(code: Option<i32>, stderr: &str) {
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains(" deletions ")
            && stderr.contains("/doomed")
            && stderr.contains("/dir/gone")
            && stderr.contains("oubli commit")
            && stderr.contains("(exit 6)"),
        "{stderr}"
    );
}

/// Once the vault works again, `oubli commit` erases what the unmount could
/// not: nothing pending, nothing deleted recoverable, the kept file there.
fn commit_finishes(env: &Env) {
    env.cmd().arg("commit").assert().success();
    assert_eq!(pending_deletions(env), 0);
    env.cmd().arg("audit").assert().success();
    env.cmd()
        .args(["get", "kept"])
        .assert()
        .success()
        .stdout("kept");
}

/// A store whose vault is a [`FileVault`] under `dir`, for the test to
/// break and mend.
fn env_on_a_file_vault(dir: &std::path::Path) -> (FileVault, Env) {
    let vault = FileVault::new(dir);
    let env = Env::with_vault("parent-pointer", Some(vault.address()), Vec::new());
    (vault, env)
}

/// Mounts `env`'s store with the policy's commits off (an hour apart): only
/// what the test asks for, and the unmount, commit.
fn mount_without_policy_commits(env: &Env) {
    env.cmd()
        .arg("mount")
        .arg(&env.mnt)
        .args(["-o", "epoch_interval=3600"])
        .assert()
        .success();
}

/// Issue 39 item 2: `oubli umount` of a mount whose last commit fails
/// (the vault's directory made immutable; the vault file replaced by a
/// directory) exits 6, naming the pending deletions and `oubli commit`,
/// instead of "unmounted" and 0; `oubli commit` finishes once the vault works.
#[test]
fn umount_fails_when_the_last_commit_fails() {
    if !fuse_available() {
        return;
    }
    for how in [Break::Immutable, Break::Directory] {
        let dir = tempfile::tempdir().unwrap();
        let (mut vault, env) = env_on_a_file_vault(dir.path());
        mount_without_policy_commits(&env);
        write_commit_remove(&env);
        vault.break_it(how);
        let out = env.cmd().arg("umount").arg(&env.mnt).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_names_the_pending_deletions(out.status.code(), &stderr);
        assert!(stderr.contains("unmounted"), "{how:?}: {stderr}");
        assert!(
            !fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(&env.mnt.display().to_string()),
            "{how:?}: still mounted"
        );
        vault.mend(how);
        match how {
            // The vault refused at once: the deletions reached the intent log.
            Break::Immutable => {
                assert!(
                    stderr.contains("deletions are still recoverable"),
                    "{stderr}"
                );
                assert!(pending_deletions(&env) > 0);
            }
            // The vault's state is unknown after the failure, so the engine
            // stores nothing more: said so, and the removed names are back.
            Break::Directory => {
                assert!(
                    stderr.contains("writes since the last flush were not stored")
                        && stderr.contains("the others are undone"),
                    "{stderr}"
                );
                env.cmd()
                    .arg("ls")
                    .assert()
                    .success()
                    .stdout(predicate::str::contains("doomed"));
            }
        }
        commit_finishes(&env);
    }
}

/// A foreground mount whose last commit fails exits 6 with the message,
/// whether the kernel's unmount (fusermount3 -u) or SIGTERM ends it.
#[test]
fn the_mount_process_exits_6_when_its_last_commit_fails() {
    if !fuse_available() {
        return;
    }
    for stop in ["fusermount3", "SIGTERM"] {
        let dir = tempfile::tempdir().unwrap();
        let (mut vault, env) = env_on_a_file_vault(dir.path());
        let log = env.dir.path().join("mount.log");
        let mut child = env
            .std_cmd()
            .arg("mount")
            .arg("--foreground")
            .arg(&env.mnt)
            .args(["-o", "epoch_interval=3600"])
            .stdin(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while !fs::read_to_string(&log).unwrap().contains("mounted store") {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{}",
                fs::read_to_string(&log).unwrap()
            );
            assert!(start.elapsed().as_secs() < 60, "the mount did not come up");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        write_commit_remove(&env);
        vault.break_it(Break::Immutable);
        let ok = match stop {
            "fusermount3" => fusermount_u(&env.mnt),
            _ => std::process::Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status()
                .unwrap()
                .success(),
        };
        assert!(ok, "{stop}");
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                start.elapsed().as_secs() < 60,
                "{stop}: the mount process did not end"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let stderr = fs::read_to_string(&log).unwrap();
        assert_names_the_pending_deletions(status.code(), &stderr);
        vault.mend(Break::Immutable);
        commit_finishes(&env);
    }
}

/// Writes the unmount could not store (the store's segments and the vault
/// made immutable before the kernel hands them over): exit 9, the medium's
/// code, saying the writes were not stored.
#[test]
fn umount_fails_when_the_writes_cannot_be_stored() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut vault, env) = env_on_a_file_vault(dir.path());
    mount_without_policy_commits(&env);
    // Not synced: the writes wait in the mount for the unmount's commit.
    fs::write(env.mnt.join("late"), vec![1u8; 300_000]).unwrap();
    let segments = Immutable::set(&env.store.join("segments"));
    vault.break_it(Break::Immutable);
    let out = env.cmd().arg("umount").arg(&env.mnt).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "{stderr}");
    assert!(
        stderr.contains("writes since the last flush were not stored")
            && stderr.contains("check the disk"),
        "{stderr}"
    );
    drop(segments);
    vault.mend(Break::Immutable);
}

/// Mounts `env`'s store (policy commits off), writes, commits and removes,
/// breaks the vault with `break_it`, and checks that `oubli umount` fails
/// naming the deletions; `mend` then lets `oubli commit` finish them.
fn umount_with_a_vault_that_fails(env: &Env, break_it: impl FnOnce(), mend: impl FnOnce()) {
    mount_without_policy_commits(env);
    write_commit_remove(env);
    break_it();
    let out = env.cmd().arg("umount").arg(&env.mnt).output().unwrap();
    assert_names_the_pending_deletions(out.status.code(), &String::from_utf8_lossy(&out.stderr));
    mend();
    commit_finishes(env);
}

/// A TPM vault (swtpm) that goes away before the unmount: exit 6, named.
#[cfg(feature = "tpm")]
#[test]
fn umount_fails_when_the_tpm_is_gone() {
    if !fuse_available() || hw::skip_hw() {
        return;
    }
    let tpm = std::cell::RefCell::new(hw::Swtpm::start());
    let address = format!("tpm:{}", tpm.borrow().location());
    let env = Env::with_vault("parent-pointer", Some(address), Vec::new());
    umount_with_a_vault_that_fails(
        &env,
        || tpm.borrow_mut().kill(),
        || tpm.borrow_mut().restart(),
    );
}

/// A PKCS#11 vault (SoftHSM2) whose token cannot be written (its files
/// made immutable) at the unmount: exit 6, named.
#[test]
fn umount_fails_when_the_token_cannot_be_written() {
    if !fuse_available() || hw::skip_hw() {
        return;
    }
    let hsm = hw::SoftHsm::new();
    hsm.init_token("umount", "1234");
    let uri = format!(
        "pkcs11:token=umount;object=oubli?module-path={}&pin-value=1234",
        hw::SOFTHSM_MODULE
    );
    let conf = vec![("SOFTHSM2_CONF".to_string(), hsm.conf.display().to_string())];
    let env = Env::with_vault("parent-pointer", Some(uri), conf);
    let guard = std::cell::RefCell::new(None);
    umount_with_a_vault_that_fails(
        &env,
        || *guard.borrow_mut() = Some(Immutable::set(&hsm.tokens)),
        || *guard.borrow_mut() = None,
    );
}

/// `fusermount3 -u`, a few tries: a file closed a moment before keeps the
/// mount busy until the kernel's release reaches the file system.
fn fusermount_u(mnt: &std::path::Path) -> bool {
    (0..50).any(|_| {
        let ok = std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(mnt)
            .status()
            .unwrap()
            .success();
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        ok
    })
}
