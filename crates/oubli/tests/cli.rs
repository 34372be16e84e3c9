//! End-to-end tests of the `oubli` command: round trips, erasure verdicts, and every documented failure's exit code.

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use tempfile::TempDir;

const PASSWORD: &str = "correct horse battery staple";

/// A store and its vault in a temporary directory, created with a fast KDF.
struct Env {
    dir: TempDir,
    store: PathBuf,
    vault: PathBuf,
}

impl Env {
    fn new() -> Env {
        Env::with_key_scheme("parent-pointer")
    }

    fn with_key_scheme(scheme: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let env = Env {
            store: dir.path().join("store"),
            vault: dir.path().join("vault"),
            dir,
        };
        env.cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
            .args(["--key-scheme", scheme])
            .assert()
            .success()
            .stdout(predicate::str::contains("created store"));
        env
    }

    /// A store to be made on a simulated NAND chip (`chip.img` in the
    /// temporary directory) with its vault in the chip; not initialised.
    fn on_nand() -> Env {
        let dir = tempfile::tempdir().unwrap();
        Env {
            store: format!("nand:{}", dir.path().join("chip.img").display()).into(),
            vault: "nand".into(),
            dir,
        }
    }

    /// The command with a clean environment pointing at this store.
    fn cmd(&self) -> Command {
        let mut cmd = Command::cargo_bin("oubli").unwrap();
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("OUBLI_STORE", &self.store)
            .env("OUBLI_VAULT", &self.vault)
            .env("OUBLI_PASSWORD", PASSWORD);
        cmd
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `data` to a file and stores it under `name`.
    fn put(&self, name: &str, data: &[u8]) {
        let src = self.path(&format!("{name}.src"));
        fs::write(&src, data).unwrap();
        self.cmd().arg("put").arg(name).arg(&src).assert().success();
    }

    fn get(&self, name: &str) -> Vec<u8> {
        let out = self.cmd().args(["get", name, "-"]).assert().success();
        out.get_output().stdout.clone()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.cmd().args(args).output().unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `audit --json --with-copy OLD_STORE`.
    fn audit_with_copy(&self, old_store: &Path) -> Value {
        self.json(&[
            "audit",
            "--json",
            "--with-copy",
            old_store.to_str().unwrap(),
        ])
    }

    /// `oubli audit --with-copy COPY`, run with the vault `vault` instead of the store's.
    fn audit_with_vault(&self, vault: &Path, copy: &Path) -> assert_cmd::assert::Assert {
        self.cmd()
            .arg("--vault")
            .arg(vault)
            .arg("audit")
            .arg("--with-copy")
            .arg(copy)
            .assert()
    }

    /// The largest segment file: the one holding the data cells.
    fn largest_segment(&self) -> PathBuf {
        fs::read_dir(self.store.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .max_by_key(|p| fs::metadata(p).unwrap().len())
            .unwrap()
    }
}

/// Pseudo-random bytes (xorshift), so that no cell is all zeros.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Every file under `dir` with its content, to prove a command changed nothing.
fn snapshot(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            snapshot(&path, out);
        } else {
            out.insert(path.clone(), fs::read(&path).unwrap());
        }
    }
}

#[test]
fn put_ls_get_round_trip() {
    let env = Env::new();
    env.put("small", b"hello, oubli\n");
    // Multi-MiB and not a multiple of the chunk or cell size.
    let big = noise(3 * 1024 * 1024 + 12_345, 7);
    env.put("big", &big);
    // From stdin.
    env.cmd()
        .args(["put", "piped", "-"])
        .write_stdin("from a pipe")
        .assert()
        .success()
        .stdout(predicate::str::contains("stored piped"));

    env.cmd()
        .arg("ls")
        .assert()
        .success()
        .stdout("big\npiped\nsmall\n");
    env.cmd()
        .args(["ls", "-l"])
        .assert()
        .success()
        .stdout(predicate::str::contains("3158073").and(predicate::str::contains("small")));
    let listing = env.json(&["ls", "--json"]);
    let sizes: BTreeMap<String, u64> = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sizes["big"], big.len() as u64);
    assert_eq!(sizes["piped"], 11);

    assert_eq!(env.get("small"), b"hello, oubli\n");
    assert_eq!(env.get("piped"), b"from a pipe");
    assert_eq!(env.get("big"), big);
    // To a file.
    let dst = env.path("big.out");
    env.cmd().arg("get").arg("big").arg(&dst).assert().success();
    assert_eq!(fs::read(&dst).unwrap(), big);

    // Replacing a name replaces its content.
    env.put("small", b"second version");
    assert_eq!(env.get("small"), b"second version");
    env.cmd().arg("fsck").assert().success();
}

#[test]
fn rm_commit_and_audit_verdicts() {
    let env = Env::new();
    env.put("secret", &noise(100_000, 1));
    env.put("keeper", &noise(50_000, 2));
    env.cmd()
        .args(["rm", "secret"])
        .assert()
        .success()
        .stdout(predicate::str::contains("next commit"));
    env.cmd().args(["get", "secret"]).assert().code(3);

    // Before the commit, the deleted cells are pending: expected, exit 0.
    let before = env.json(&["audit", "--json"]);
    assert_eq!(before["verdict"], "pending", "{before}");
    assert!(before["pending_units"].as_u64().unwrap() > 0);
    let status = env.json(&["status", "--json"]);
    assert!(
        status["pending_erasure_bytes"].as_u64().unwrap() >= 100_000,
        "{status}"
    );

    env.cmd()
        .arg("commit")
        .assert()
        .success()
        .stdout(predicate::str::contains("unrecoverable"));
    let after = env.json(&["audit", "--json"]);
    assert_eq!(after["verdict"], "ok", "{after}");
    assert_eq!(after["leaked_units"], 0);
    assert_eq!(after["pending_units"], 0);
    assert!(after["live_units"].as_u64().unwrap() > 0);
    env.cmd()
        .arg("audit")
        .assert()
        .success()
        .stdout(predicate::str::contains("nothing deleted can be recovered"));

    // rm --purge commits at once: nothing is left pending.
    env.put("other", b"short-lived");
    env.cmd()
        .args(["rm", "--purge", "other"])
        .assert()
        .success();
    let purged = env.json(&["audit", "--json"]);
    assert_eq!(purged["verdict"], "ok", "{purged}");
    assert_eq!(env.get("keeper"), noise(50_000, 2));
}

#[test]
fn status_json_parses() {
    let env = Env::new();
    env.put("a", b"data");
    let status = env.json(&["status", "--json"]);
    for field in [
        "epoch",
        "seconds_since_commit",
        "pending_deletions",
        "pending_erasure_bytes",
        "live_bytes",
        "dead_bytes",
        "medium_bytes",
        "cell_size",
    ] {
        assert!(status[field].is_u64(), "{field} in {status}");
    }
    assert_eq!(status["cell_size"], 32768);
    assert_eq!(status["vault"]["kind"], "file");
    assert_eq!(status["vault"]["overwrite_is_erasure"], false);
    assert_eq!(status["policy"]["mode"], "manual");
    assert!(status["key_scheme"].is_string() && status["provider"].is_string());
    env.cmd()
        .arg("status")
        .assert()
        .success()
        .stdout(predicate::str::contains("epoch"));
}

/// Every key scheme behind the same commands: round trip, erasure at the
/// commit (the audit with an old copy of the store opens nothing deleted;
/// with an old copy of the vault too it does), `status` naming the scheme,
/// fsck and gc.
#[test]
fn every_key_scheme_erases_at_commit_and_reports_itself() {
    for (scheme, ref_bytes) in [
        ("parent-pointer", 32),
        ("keyed-hash-forest", 8),
        ("key-storage-area", 8),
    ] {
        let env = Env::with_key_scheme(scheme);
        env.put("secret", &noise(100_000, 1));
        env.put("keeper", &noise(50_000, 2));
        let (old_store, old_vault) = copy_then_delete(&env);
        let after = env.audit_with_copy(&old_store);
        assert_eq!(after["verdict"], "ok", "{scheme}: {after}");
        assert_eq!(after["leaked_units"], 0, "{scheme}");
        env.audit_with_vault(&old_vault, &old_store).code(10);
        let status = env.json(&["status", "--json"]);
        assert_eq!(status["key_scheme"], scheme, "{status}");
        assert_eq!(status["key_ref_bytes"], ref_bytes, "{status}");
        assert_eq!(
            status["key_forest_roots"].is_u64(),
            scheme == "keyed-hash-forest",
            "{status}"
        );
        assert_eq!(
            status["key_area_keys"].is_u64(),
            scheme == "key-storage-area",
            "{status}"
        );
        env.cmd().arg("fsck").assert().success();
        env.cmd()
            .args(["gc", "--consolidate-keys"])
            .assert()
            .success()
            .stdout(predicate::str::contains(if scheme == "keyed-hash-forest" {
                "key forest roots"
            } else {
                "consolidated"
            }));
        assert_eq!(env.get("keeper"), noise(50_000, 2), "{scheme}");
        env.cmd().arg("audit").assert().success();
    }
    let dir = tempfile::tempdir().unwrap();
    Command::cargo_bin("oubli")
        .unwrap()
        .env_clear()
        .env("OUBLI_PASSWORD", PASSWORD)
        .arg("--store")
        .arg(dir.path().join("s"))
        .arg("--vault")
        .arg(dir.path().join("v"))
        .args(["init", "--key-scheme", "eraser-tree"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("unknown key scheme"));
}

#[test]
fn wrong_password_exits_5_and_changes_nothing() {
    let env = Env::new();
    env.put("a", b"data");
    let mut before = BTreeMap::new();
    snapshot(env.dir.path(), &mut before);
    for args in [
        &["put", "b", "-"][..],
        &["rm", "a"],
        &["commit"],
        &["ls"],
        &["gc"],
    ] {
        env.cmd()
            .args(args)
            .env("OUBLI_PASSWORD", "not the password")
            .write_stdin("x")
            .assert()
            .code(5)
            .stderr(
                predicate::str::contains("wrong password")
                    .and(predicate::str::contains("OUBLI_PASSWORD")),
            );
    }
    let mut after = BTreeMap::new();
    snapshot(env.dir.path(), &mut after);
    assert!(
        before == after,
        "a command with the wrong password changed files"
    );

    // --password-file takes the first line and wins over the environment.
    let file = env.path("pw");
    fs::write(&file, format!("{PASSWORD}\nignored\n")).unwrap();
    env.cmd()
        .arg("--password-file")
        .arg(&file)
        .env("OUBLI_PASSWORD", "wrong")
        .arg("ls")
        .assert()
        .success()
        .stdout("a\n");
}

#[test]
fn missing_vault_exits_6() {
    let env = Env::new();
    env.cmd()
        .arg("--vault")
        .arg(env.path("nowhere"))
        .arg("ls")
        .assert()
        .code(6)
        .stderr(predicate::str::contains("no vault at"));
    // Another store's vault is refused too.
    let other = Env::new();
    env.cmd()
        .arg("--vault")
        .arg(&other.vault)
        .arg("ls")
        .assert()
        .code(6)
        .stderr(predicate::str::contains("another store"));
}

#[test]
fn no_store_exits_8_and_leaves_no_trace() {
    let env = Env::new();
    let empty = env.path("empty");
    fs::create_dir(&empty).unwrap();
    for store in [env.path("missing"), empty.clone()] {
        env.cmd()
            .arg("--store")
            .arg(&store)
            .arg("ls")
            .assert()
            .code(8)
            .stderr(predicate::str::contains("oubli init"));
    }
    assert_eq!(fs::read_dir(&empty).unwrap().count(), 0);
}

#[test]
fn missing_name_exits_3() {
    let env = Env::new();
    for args in [&["get", "nope"][..], &["rm", "nope"]] {
        env.cmd()
            .args(args)
            .assert()
            .code(3)
            .stderr(predicate::str::contains("no such name"));
    }
}

#[test]
fn init_twice_exits_4_and_usage_errors_exit_2() {
    let env = Env::new();
    env.cmd().arg("init").assert().code(4);
    // A fresh store with an existing vault is refused before anything is made.
    env.cmd()
        .arg("--store")
        .arg(env.path("second"))
        .arg("init")
        .assert()
        .code(4);
    assert!(!env.path("second").exists());
    env.cmd().arg("no-such-command").assert().code(2);
    env.cmd()
        .args(["put", "a/b", "-"])
        .write_stdin("x")
        .assert()
        .code(2);
    env.cmd().args(["gc", "--threshold", "3"]).assert().code(2);
    env.cmd()
        .args(["--log-tally", "sometimes", "ls"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("every-flush"));
    for when in ["every-flush", "0", "5"] {
        env.cmd()
            .args(["--log-tally", when, "ls"])
            .assert()
            .success();
    }
    // `file:PATH` (a single-file store, a library medium) is refused, not
    // turned into a directory named `file:...`; `dir:PATH` is the store
    // directory PATH.
    let single = format!("file:{}", env.path("store.img").display());
    env.cmd()
        .args(["--store", single.as_str(), "ls"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "not available from the command line",
        ));
    env.put("in-the-store", b"x");
    let dir = format!("dir:{}", env.path("store").display());
    assert_eq!(
        env.json(&["--store", dir.as_str(), "ls", "--json"]),
        env.json(&["ls", "--json"])
    );
    // No password source and no terminal: a clear error, not a hang.
    env.cmd()
        .env_remove("OUBLI_PASSWORD")
        .arg("ls")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--password-file"));
}

#[test]
fn flipped_bit_exits_7_and_prints_no_data() {
    let env = Env::new();
    let data = noise(200_000, 3);
    env.put("f", &data);
    env.cmd().arg("commit").assert().success();
    let segment = env.largest_segment();
    let mut bytes = fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    fs::write(&segment, bytes).unwrap();
    env.cmd()
        .args(["get", "f", "-"])
        .assert()
        .code(7)
        .stdout("")
        .stderr(predicate::str::contains("integrity failure"));
    let dst = env.path("f.out");
    env.cmd().arg("get").arg("f").arg(&dst).assert().code(7);
    assert!(!dst.exists());
    assert_eq!(
        fs::read_dir(env.dir.path())
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".part"))
            .count(),
        0,
        "a partial file was left behind"
    );
    env.cmd()
        .arg("fsck")
        .assert()
        .code(7)
        .stdout(predicate::str::contains("problem"));
}

#[test]
fn truncated_segment_exits_7() {
    let env = Env::new();
    env.put("f", &noise(200_000, 4));
    env.cmd().arg("commit").assert().success();
    let segment = env.largest_segment();
    let len = fs::metadata(&segment).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    env.cmd()
        .args(["get", "f", "-"])
        .assert()
        .code(7)
        .stdout("");
    env.cmd().arg("fsck").assert().code(7);
}

#[test]
fn busy_store_exits_11() {
    let env = Env::new();
    let lock = fs::File::open(env.store.join("lock")).unwrap();
    lock.try_lock().unwrap();
    env.cmd()
        .arg("ls")
        .assert()
        .code(11)
        .stderr(predicate::str::contains("in use by another process"));
    lock.unlock().unwrap();
    env.cmd().arg("ls").assert().success();
}

/// Takes copies of the store directory and vault as an adversary would,
/// then deletes `secret` and commits.
fn copied_then_deleted() -> (Env, PathBuf, PathBuf) {
    let env = Env::new();
    env.put("secret", b"the launch code is 0000");
    env.put("keeper", &noise(70_000, 5));
    let (old_store, old_vault) = copy_then_delete(&env);
    (env, old_store, old_vault)
}

/// Copies the store and the vault aside (an adversary's old copies), then
/// removes "secret" and commits; returns the copies.
fn copy_then_delete(env: &Env) -> (PathBuf, PathBuf) {
    let old_store = env.path("old-store");
    let old_vault = env.path("old-vault");
    copy_dir(&env.store, &old_store);
    fs::copy(&env.vault, &old_vault).unwrap();
    env.cmd().args(["rm", "secret"]).assert().success();
    env.cmd().arg("commit").assert().success();
    (old_store, old_vault)
}

#[test]
fn old_copy_of_the_store_opens_nothing_deleted() {
    let (env, old_store, _) = copied_then_deleted();
    let verdict = env.audit_with_copy(&old_store);
    assert_eq!(verdict["verdict"], "ok", "{verdict}");
    assert_eq!(verdict["leaked_units"], 0);
    assert_eq!(verdict["copies"][0]["units_opened"], 0);
    env.cmd()
        .arg("audit")
        .arg("--with-copy")
        .arg(&old_store)
        .assert()
        .success();
    assert_eq!(env.get("keeper"), noise(70_000, 5));
}

#[test]
fn old_copy_of_the_vault_too_is_caught() {
    // The control: with the vault copied as well, the deleted data opens,
    // and the audit must say so. This proves the check can fail.
    let (env, old_store, old_vault) = copied_then_deleted();
    env.audit_with_vault(&old_vault, &old_store)
        .code(10)
        .stdout(predicate::str::contains("ERASURE FAILURE"))
        .stderr(predicate::str::contains("erasure failure"));

    // With the current vault and the old one as extra adversary knowledge,
    // the audit tells the deleted secret from the still-live keeper.
    let out = env
        .cmd()
        .args(["audit", "--json", "--with-copy"])
        .arg(&old_store)
        .arg("--with-vault-copy")
        .arg(&old_vault)
        .assert()
        .code(10);
    let verdict: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(verdict["verdict"], "leaked", "{verdict}");
    assert_eq!(verdict["leaked_units"], 1, "{verdict}");
    assert!(verdict["live_units"].as_u64().unwrap() >= 3, "{verdict}");

    // An old vault that opens nothing it is given is just the wrong vault.
    let new_copy = env.path("new-store");
    copy_dir(&env.store, &new_copy);
    env.audit_with_vault(&old_vault, &new_copy)
        .code(6)
        .stderr(predicate::str::contains("old copy"));
}

#[test]
fn gc_keeps_live_data() {
    let env = Env::new();
    env.put("a", &noise(300_000, 8));
    env.put("b", &noise(300_000, 9));
    env.cmd().args(["rm", "a"]).assert().success();
    env.cmd()
        .args(["gc", "--threshold", "0.9"])
        .assert()
        .success()
        .stdout(predicate::str::contains("gc:"));
    assert_eq!(env.get("b"), noise(300_000, 9));
    env.cmd().arg("fsck").assert().success();
    let verdict = env.json(&["audit", "--json"]);
    assert_eq!(verdict["verdict"], "ok", "{verdict}");
}

/// `oubli commit` and `oubli status` reach a process that holds the store
/// open (a mount or a server) through its control socket.
#[test]
fn commit_and_status_reach_a_live_process_through_the_control_socket() {
    let env = Env::new();
    env.put("secret", &noise(100_000, 9));
    let password = oubli::SecretBytes::new(PASSWORD.as_bytes().to_vec());
    let store =
        std::sync::Arc::new(oubli::open_dir_store(&env.store, &env.vault, &password).unwrap());
    let _server = oubli::control::ControlServer::start(
        &oubli::control::socket_path(&env.store),
        store.clone(),
        oubli::report::control_status(env.store.clone()),
        None,
    )
    .unwrap();
    let oid = store.lookup(oubli::ROOT_DIR, b"secret").unwrap().unwrap();
    store.unlink(oubli::ROOT_DIR, b"secret").unwrap();
    store.delete(oid).unwrap();
    let before = env.json(&["status", "--json"]);
    assert_eq!(before["live"], true);
    assert!(
        before["pending_deletions"].as_u64().unwrap() > 0,
        "{before}"
    );
    env.cmd()
        .arg("commit")
        .assert()
        .success()
        .stdout(predicate::str::contains("by the process holding the store"));
    let after = env.json(&["status", "--json"]);
    assert_eq!(after["pending_deletions"], 0);
    assert_eq!(
        after["epoch"].as_u64().unwrap(),
        before["epoch"].as_u64().unwrap() + 1
    );
    assert_eq!(store.audit().unwrap().pending_units, 0);
    // Snapshots too: created, listed and removed by the live process.
    env.cmd()
        .args(["snapshot", "create", "--expire", "1h", "live-1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("by the process holding the store"));
    assert_eq!(store.snapshots()[0].name, "live-1");
    let list = env.json(&["snapshot", "ls", "--json"]);
    assert_eq!(list[0]["name"], "live-1", "{list}");
    env.cmd()
        .args(["snapshot", "rm", "--purge", "live-1"])
        .assert()
        .success()
        .stdout(predicate::str::contains("by the process holding the store"));
    assert!(store.snapshots().is_empty());
    // Through the live process, the same exit code as without one (3).
    env.cmd()
        .args(["snapshot", "rm", "live-1"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no such snapshot"));
    env.cmd()
        .args(["snapshot", "create", "bad/name"])
        .assert()
        .code(2);
}

/// Issue 9 item 10: every `oubli` process is undumpable with no core limit,
/// so another process of the same user reads neither its memory nor its
/// environment (where OUBLI_PASSWORD may be). Checked from outside, on a
/// process running as an unprivileged user: a dumpable process's /proc
/// files belong to that user; an undumpable one's to root.
#[test]
fn the_process_holding_keys_is_not_dumpable_and_dumps_no_core() {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix_is_root() || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root and setpriv (util-linux) to run oubli as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let bin = assert_cmd::cargo::cargo_bin("oubli");
    let as_nobody = |args: &[&str]| {
        let mut cmd = std::process::Command::new("/usr/bin/setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .env_clear()
            .env("HOME", dir.path())
            .env("OUBLI_STORE", dir.path().join("store"))
            .env("OUBLI_VAULT", dir.path().join("vault"))
            .env("OUBLI_PASSWORD", PASSWORD);
        cmd
    };
    let init = as_nobody(&["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    // `put NAME -` holds the store (and the epoch key) while it waits for input.
    let mut put = as_nobody(&["put", "waiting", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = put.id();
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    // Wait until the process runs oubli itself (setpriv execs it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fs::read_link(proc_dir.join("exe")).map_or(true, |e| e != bin) {
        assert!(std::time::Instant::now() < deadline, "oubli did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let limits = fs::read_to_string(proc_dir.join("limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    let fields: Vec<&str> = core.split_whitespace().collect();
    assert_eq!(&fields[4..6], ["0", "0"], "{core}");
    let environ_owner = fs::metadata(proc_dir.join("environ")).unwrap().uid();
    assert_eq!(
        environ_owner, 0,
        "/proc/PID/environ belongs to the process's user: it is dumpable"
    );
    put.stdin.take().unwrap().write_all(b"done").unwrap();
    assert!(put.wait().unwrap().success());
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Issue 9 item 11: `vault move` from a file vault commits a new epoch under
/// the new vault, so a copy of the old vault file (what an SSD or a backup
/// may keep) opens nothing current; and it says so honestly.
#[test]
fn vault_move_commits_so_the_old_file_opens_nothing_current() {
    let env = Env::new();
    env.put("kept", b"still here after the move");
    let old_copy = env.path("old-vault-copy");
    fs::copy(&env.vault, &old_copy).unwrap();
    let new_vault = env.path("new-vault");
    let out = env
        .cmd()
        .args([
            "vault",
            "move",
            "--kdf-memory",
            "1",
            "--kdf-iterations",
            "1",
            "--to",
        ])
        .arg(&new_vault)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.contains("began under the new vault"), "{text}");
    assert!(
        text.contains("SSD"),
        "the move must say what an SSD may keep: {text}"
    );
    // The old key opens nothing current: the store is past its epoch.
    env.cmd()
        .env("OUBLI_VAULT", &old_copy)
        .arg("ls")
        .assert()
        .code(6)
        .stderr(predicate::str::contains("epoch"));
    let got = env
        .cmd()
        .env("OUBLI_VAULT", &new_vault)
        .args(["get", "kept", "-"])
        .assert()
        .success();
    assert_eq!(got.get_output().stdout, b"still here after the move");
}

/// Issue 9 item 5: a `put` that fails half-way leaves the store as it was —
/// no nameless object holding the partial plaintext.
#[test]
fn a_failed_put_leaves_no_object_behind() {
    let env = Env::new();
    env.put("before", b"unchanged");
    let before = env.json(&["fsck", "--json"]);
    // /proc/self/mem opens, then fails to read at offset 0 (EIO).
    env.cmd()
        .args(["put", "x", "/proc/self/mem"])
        .assert()
        .failure();
    let after = env.json(&["fsck", "--json"]);
    assert_eq!(after["objects"], before["objects"], "{after}");
    assert_eq!(after["orphans"], serde_json::json!([]));
    env.cmd().args(["get", "x"]).assert().code(3);
    assert_eq!(env.get("before"), b"unchanged");
}

/// Issue 9 item 5: an object nothing reaches is reported by `fsck` (exit 7,
/// listed in `orphans`) and deleted by `gc`, after which nothing of it opens.
#[test]
fn fsck_reports_orphans_and_gc_erases_them() {
    let env = Env::new();
    env.put("named", b"reachable by its name");
    {
        let store = oubli::open_dir_store(
            &env.store,
            &env.vault,
            &oubli::SecretBytes::new(PASSWORD.as_bytes().to_vec()),
        )
        .unwrap();
        let lost = store.create_object(b"").unwrap();
        store.write(lost, 0, b"orphaned plaintext").unwrap();
        store.flush().unwrap();
    }
    let out = env.cmd().args(["fsck", "--json"]).assert().code(7);
    let json: Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(json["orphans"].as_array().unwrap().len(), 1, "{json}");
    env.cmd()
        .arg("gc")
        .assert()
        .success()
        .stdout(predicate::str::contains("1 orphan object(s) deleted"));
    let json = env.json(&["fsck", "--json"]);
    assert_eq!(json["orphans"], serde_json::json!([]));
    env.cmd()
        .arg("audit")
        .assert()
        .success()
        .stdout(predicate::str::contains("nothing deleted can be recovered"));
    assert_eq!(env.get("named"), b"reachable by its name");
}

/// Issue 10: `snapshot create|ls|rm`, `get`/`ls --snapshot`, `rm` that
/// says what snapshots keep, `rm --all-snapshots` that erases a file from
/// every version (the audit finds none of it), and the exit codes.
#[test]
fn snapshots_keep_versions_and_rm_all_snapshots_erases_one_file_from_all() {
    let env = Env::new();
    let (old, new, other) = (noise(70_000, 21), noise(50_000, 22), noise(40_000, 23));
    env.put("report", &old);
    env.put("other", &other);
    env.cmd()
        .args(["snapshot", "create", "monday", "--expire", "30d"])
        .assert()
        .success()
        .stdout(predicate::str::contains("created snapshot monday"));
    env.put("report", &new);
    env.cmd()
        .args(["snapshot", "create", "tuesday"])
        .assert()
        .success();
    // Each version reads back; the live store has the newest.
    let get_at = |snap: &str, name: &str| {
        env.cmd()
            .args(["get", "--snapshot", snap, name, "-"])
            .output()
            .unwrap()
    };
    assert_eq!(get_at("monday", "report").stdout, old);
    assert_eq!(get_at("tuesday", "report").stdout, new);
    assert_eq!(env.get("report"), new);
    env.cmd()
        .args(["ls", "--snapshot", "monday"])
        .assert()
        .success()
        .stdout("other\nreport\n");
    let list = env.json(&["snapshot", "ls", "--json"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["name"], "monday");
    assert!(list[0]["expires_at"].as_u64().is_some());
    // Monday alone holds the old report.
    assert!(
        list[0]["unique_bytes"].as_u64().unwrap() >= 70_000,
        "{list:?}"
    );
    assert!(
        list[1]["shared_bytes"].as_u64().unwrap() >= 90_000,
        "{list:?}"
    );
    env.cmd()
        .args(["snapshot", "ls"])
        .assert()
        .success()
        .stdout(predicate::str::contains("UNIQUE").and(predicate::str::contains("tuesday")));

    // A plain rm says which snapshots keep the data.
    env.cmd()
        .args(["rm", "other"])
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "except from 2 snapshot(s) that hold it (monday, tuesday)",
        ));
    assert_eq!(get_at("monday", "other").stdout, other);

    // Erased from every version: the live store and both snapshots.
    env.cmd()
        .args(["rm", "--all-snapshots", "--purge", "report"])
        .assert()
        .success()
        .stdout(predicate::str::contains("from the store and 2 snapshot(s)"));
    for snap in ["monday", "tuesday"] {
        assert_eq!(get_at(snap, "report").status.code(), Some(3));
        assert_eq!(get_at(snap, "other").stdout, other);
    }
    let verdict = env.json(&["audit", "--json"]);
    assert_eq!(verdict["verdict"], "ok", "{verdict}");
    assert_eq!(
        env.json(&["fsck", "--json"])["problems"],
        serde_json::json!([])
    );

    // Removing a snapshot; errors.
    env.cmd()
        .args(["snapshot", "rm", "--purge", "monday"])
        .assert()
        .success()
        .stdout(predicate::str::contains("now unrecoverable"));
    env.cmd()
        .args(["snapshot", "rm", "monday"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no such snapshot: monday"));
    env.cmd()
        .args(["snapshot", "create", "tuesday"])
        .assert()
        .code(4);
    env.cmd()
        .args(["snapshot", "create", "a@b"])
        .assert()
        .code(2);
    env.cmd()
        .args(["snapshot", "create", "x", "--expire", "soon"])
        .assert()
        .code(2);
    assert_eq!(env.json(&["status", "--json"])["snapshots"], 1);
}

/// The data of a removed snapshot is not recoverable by the audit (which
/// plays the adversary with every copy of the store directory it is
/// given), while an old vault copy proves the test could fail.
#[test]
fn a_removed_snapshot_opens_nothing_even_from_an_old_copy() {
    let env = Env::new();
    env.put("ledger", &noise(80_000, 31));
    env.cmd()
        .args(["snapshot", "create", "q1"])
        .assert()
        .success();
    env.cmd().args(["rm", "ledger"]).assert().success();
    env.cmd().arg("commit").assert().success();
    // The snapshot still holds it: live, not leaked.
    let held = env.json(&["audit", "--json"]);
    assert_eq!(held["verdict"], "ok", "{held}");
    let copy = env.path("store-copy");
    copy_dir(&env.store, &copy);
    let vault_copy = env.path("vault-copy");
    fs::copy(&env.vault, &vault_copy).unwrap();
    env.cmd()
        .args(["snapshot", "rm", "--purge", "q1"])
        .assert()
        .success();
    let copy_arg = copy.display().to_string();
    let verdict = env.json(&["audit", "--json", "--with-copy", &copy_arg]);
    assert_eq!(verdict["verdict"], "ok", "{verdict}");
    let vault_arg = vault_copy.display().to_string();
    let control = env
        .cmd()
        .args([
            "audit",
            "--with-copy",
            &copy_arg,
            "--with-vault-copy",
            &vault_arg,
        ])
        .output()
        .unwrap();
    assert_eq!(control.status.code(), Some(10), "{control:?}");
}

/// Issue 10: a store written by format 2 (before snapshots; made by the
/// previous release and checked in) opens, reads, and takes a snapshot,
/// which upgrades its superblock to the current format.
#[test]
fn a_format_2_store_opens_and_upgrades() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/format-v2");
    copy_dir(&fixture.join("store"), &dir.path().join("store"));
    fs::copy(fixture.join("vault"), dir.path().join("vault")).unwrap();
    let cmd = || {
        let mut cmd = Command::cargo_bin("oubli").unwrap();
        cmd.env_clear()
            .env("HOME", dir.path())
            .env("OUBLI_STORE", dir.path().join("store"))
            .env("OUBLI_VAULT", dir.path().join("vault"))
            .env("OUBLI_PASSWORD", "fixture-password");
        cmd
    };
    let version = |slot: &str| {
        let b = fs::read(dir.path().join("store").join(slot)).unwrap();
        u16::from_le_bytes([b[8], b[9]])
    };
    assert_eq!(version("super.a").max(version("super.b")), 2);
    cmd()
        .args(["get", "hello", "-"])
        .assert()
        .success()
        .stdout("made by format 2\n");
    cmd().args(["ls"]).assert().success().stdout("hello\n");
    cmd()
        .args(["snapshot", "create", "first"])
        .assert()
        .success();
    cmd().arg("commit").assert().success();
    assert_eq!(
        version("super.a").max(version("super.b")),
        oubli_core::FORMAT_VERSION
    );
    cmd()
        .args(["get", "--snapshot", "first", "hello", "-"])
        .assert()
        .success()
        .stdout("made by format 2\n");
    assert_eq!(
        cmd().args(["audit"]).output().unwrap().status.code(),
        Some(0)
    );
}

/// Issue 10: key shares from the command line: data put under a share
/// reads while its vault is there; `share destroy` makes it unreadable
/// (exit 6, naming the share) in the store and in a snapshot, leaving the
/// rest intact; an unreachable share vault fails only that data.
#[test]
fn shares_put_read_destroy() {
    let env = Env::new();
    let share_vault = env.path("tenant.vault");
    let share_vault_arg = share_vault.display().to_string();
    env.cmd()
        .args([
            "share",
            "create",
            "tenant",
            "--share-vault",
            &share_vault_arg,
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("created share tenant"));
    assert!(share_vault.is_file());
    env.cmd()
        .args([
            "share",
            "create",
            "tenant",
            "--share-vault",
            &share_vault_arg,
        ])
        .assert()
        .code(4);
    let (secret, public) = (noise(90_000, 41), noise(30_000, 42));
    let src = env.path("secret.src");
    fs::write(&src, &secret).unwrap();
    env.cmd()
        .args(["put", "--share", "tenant", "dossier"])
        .arg(&src)
        .assert()
        .success();
    env.cmd()
        .args(["put", "--share", "nobody", "x"])
        .arg(&src)
        .assert()
        .code(3);
    env.put("public", &public);
    assert_eq!(env.get("dossier"), secret);
    env.cmd()
        .args(["snapshot", "create", "s"])
        .assert()
        .success();
    let list = env.json(&["share", "ls", "--json"]);
    assert_eq!(list[0]["name"], "tenant", "{list}");
    assert!(list[0]["destroyed_at"].is_null());

    // The share vault is away: only the dossier fails, naming the share.
    let away = env.path("tenant.vault.away");
    fs::rename(&share_vault, &away).unwrap();
    env.cmd()
        .args(["get", "dossier", "-"])
        .assert()
        .code(6)
        .stdout("")
        .stderr(predicate::str::contains("key share tenant"));
    assert_eq!(env.get("public"), public);
    fs::rename(&away, &share_vault).unwrap();
    assert_eq!(env.get("dossier"), secret);

    env.cmd()
        .args(["share", "destroy", "tenant"])
        .assert()
        .code(2);
    env.cmd()
        .args(["share", "destroy", "--yes", "tenant"])
        .assert()
        .success()
        .stdout(predicate::str::contains("destroyed share tenant"));
    for args in [
        &["get", "dossier", "-"][..],
        &["get", "--snapshot", "s", "dossier", "-"][..],
    ] {
        env.cmd()
            .args(args)
            .assert()
            .code(6)
            .stdout("")
            .stderr(predicate::str::contains("which was destroyed"));
    }
    assert_eq!(env.get("public"), public);
    assert!(env.json(&["share", "ls", "--json"])[0]["destroyed_at"].is_u64());
    let verdict = env.json(&["audit", "--json"]);
    assert_eq!(verdict["verdict"], "ok", "{verdict}");
}

/// The man pages and completions in `share/` are what the current clap
/// definitions generate (run `cargo run -p oubli -- generate share` after
/// changing the CLI); the pages render with man(1) and the bash completion loads.
#[test]
fn man_pages_and_completions_are_current() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    Command::cargo_bin("oubli")
        .unwrap()
        .arg("generate")
        .arg(tmp.path())
        .assert()
        .success();
    let mut generated = Vec::new();
    let mut stack = vec![tmp.path().to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                generated.push(path.strip_prefix(tmp.path()).unwrap().to_path_buf());
            }
        }
    }
    assert!(generated.len() > 25, "{generated:?}");
    let stale: Vec<String> = generated
        .iter()
        .filter(|rel| {
            std::fs::read(repo.join("share").join(rel)).ok()
                != Some(std::fs::read(tmp.path().join(rel)).unwrap())
        })
        .map(|rel| rel.display().to_string())
        .collect();
    assert!(
        stale.is_empty(),
        "share/ is stale for {stale:?}: run `cargo run -p oubli -- generate share`"
    );
    let committed_pages = std::fs::read_dir(repo.join("share/man/man1"))
        .unwrap()
        .count();
    let generated_pages = generated.iter().filter(|p| p.starts_with("man")).count();
    assert_eq!(
        committed_pages, generated_pages,
        "a page for a removed command is left in share/man/man1"
    );
    if which("man") {
        let out = std::process::Command::new("man")
            .env("MANPAGER", "cat")
            .arg("-l")
            .arg(repo.join("share/man/man1/oubli-mount.1"))
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("oubli-mount"));
    }
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("source \"$1\" && complete -p oubli")
        .arg("bash")
        .arg(repo.join("share/bash-completion/completions/oubli"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("_oubli oubli"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

#[test]
fn version_names_the_features_and_the_crypto_provider() {
    let out = Command::cargo_bin("oubli")
        .unwrap()
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("oubli {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(
        text.contains("+fuse") && text.contains("+nbd") && text.contains("+pkcs11"),
        "{text}"
    );
    assert!(
        text.contains("tpm") && text.contains("crypto provider: ring"),
        "{text}"
    );
}

/// The `oubli` command on a simulated raw NAND chip: `--store nand:IMAGE
/// --vault nand`, a round trip, and the chip's wear in `status`.
#[test]
fn a_store_and_its_vault_on_one_nand_chip() {
    let env = Env::on_nand();
    let image = env.path("chip.img");
    env.cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .args(["--nand-geometry", "2048x16x256"])
        .assert()
        .success()
        .stdout(predicate::str::contains("created store nand:"))
        // The vault in the chip is honest: no stand-in note.
        .stdout(predicate::str::contains("Note:").not());
    // 2 KiB pages + 64 OOB bytes, 16 pages per block, 256 blocks, 4 KiB header.
    assert_eq!(
        std::fs::metadata(&image).unwrap().len(),
        4096 + 256 * 16 * 2112
    );
    use std::os::unix::fs::PermissionsExt;
    // The image holds the sealed vault record: private, like a vault file.
    let mode = std::fs::metadata(&image).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    env.cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .failure();

    let secret = noise(100_000, 3);
    env.put("doc", &secret);
    assert_eq!(env.get("doc"), secret);
    env.cmd().args(["rm", "doc"]).assert().success();
    env.cmd().arg("commit").assert().success();
    env.cmd().args(["get", "doc", "-"]).assert().failure();

    let status = env.json(&["status", "--json"]);
    assert_eq!(status["vault"]["kind"], "nand");
    assert_eq!(status["store"], format!("nand:{}", image.display()));
    assert_eq!(status["vault"]["overwrite_is_erasure"], true);
    let wear = &status["nand_wear"];
    assert_eq!(wear["blocks"], 256);
    assert_eq!(wear["rated_cycles"], 10_000);
    assert!(wear["erase_count_max"].as_u64().unwrap() >= 1, "{wear}");
    assert!(wear["erases_per_commit"].as_f64().unwrap() > 0.0, "{wear}");
    let hoover = wear["hoover_index"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hoover), "{wear}");
    assert!(
        wear["projected_lifetime_years"].as_f64().unwrap() > 0.0,
        "{wear}"
    );
    env.cmd()
        .arg("status")
        .env("OUBLI_NAND_RATED_CYCLES", "3000")
        .assert()
        .success()
        .stdout(predicate::str::contains("Hoover index"))
        .stdout(predicate::str::contains("rated for 3000 cycles"));

    // Not built yet for the NAND vault: refused, no vault file named `nand` made.
    for args in [&["vault", "passwd"][..], &["vault", "move", "--to", "nand"]] {
        env.cmd()
            .current_dir(env.dir.path())
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("NAND vault"));
    }
    assert!(!env.dir.path().join("nand").exists());

    // The raw image holds no plaintext.
    let raw = std::fs::read(&image).unwrap();
    assert!(!raw.windows(64).any(|w| w == &secret[5000..5064]));
}

#[test]
fn the_nand_vault_needs_a_nand_store() {
    let dir = tempfile::tempdir().unwrap();
    Command::cargo_bin("oubli")
        .unwrap()
        .env_clear()
        .env("HOME", dir.path())
        .env("OUBLI_STORE", dir.path().join("store"))
        .env("OUBLI_VAULT", "nand")
        .env("OUBLI_PASSWORD", "pw")
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("nand:IMAGE"));
    assert!(!dir.path().join("nand").exists());
}

/// Every directory under `root` (itself included) and every file in them:
/// the permission bits of each, keyed by path.
fn modes_under(root: &Path) -> BTreeMap<PathBuf, u32> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = fs::symlink_metadata(&p).unwrap();
        out.insert(p.clone(), meta.permissions().mode() & 0o777);
        if meta.is_dir() {
            todo.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out
}

/// Issue 40 item 3: a new store directory (and the parents `init` makes for
/// it), the state directory of a NAND store, and every file in them are
/// the owner's only from the start: directories 0700, files 0600.
#[test]
fn a_new_store_and_everything_in_it_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env {
        store: dir.path().join("made/for/it/store"),
        vault: dir.path().join("vault"),
        dir,
    };
    env.cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success();
    env.put("doc", &noise(300_000, 7));
    env.cmd().args(["rm", "doc"]).assert().success();
    env.cmd().arg("commit").assert().success();
    env.put("kept", b"kept");
    let mut modes = modes_under(&env.path("made"));
    assert!(modes.contains_key(&env.store.join("lock")), "{modes:?}");
    assert!(modes.contains_key(&env.store.join("super.b")), "{modes:?}");
    assert!(
        modes
            .keys()
            .any(|p| p.extension().is_some_and(|e| e == "seg")),
        "{modes:?}"
    );

    let nand = Env::on_nand();
    nand.cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .args(["--nand-geometry", "2048x16x256"])
        .assert()
        .success();
    nand.put("doc", b"on the chip");
    let state = nand.path("chip.img.state");
    modes.extend(modes_under(&state));
    assert!(modes.contains_key(&state.join("lock")), "{modes:?}");

    let open: Vec<_> = modes
        .iter()
        .filter(|(p, &m)| m != if p.is_dir() { 0o700 } else { 0o600 })
        .map(|(p, m)| format!("{} {m:o}", p.display()))
        .collect();
    assert!(open.is_empty(), "not private: {open:#?}");
}

/// `setpriv` running `args` as nobody:nogroup without supplementary groups.
fn as_nobody(args: &[&std::ffi::OsStr]) -> std::process::Command {
    let mut cmd = std::process::Command::new("/usr/bin/setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .env_clear();
    cmd
}

/// Mount options that need root (set through sysfs, or refused by
/// fusermount3 to other users) are refused to another user as a usage error
/// (exit 2) that names what needs root, and nothing is mounted — as
/// docs/CLI.md says. (They used to exit 1, blaming a mount point in use.)
#[test]
fn root_only_mount_options_are_refused_to_other_users_with_exit_2() {
    use std::os::unix::fs::PermissionsExt;
    if !nix_is_root() || !Path::new("/usr/bin/setpriv").exists() || !Path::new("/dev/fuse").exists()
    {
        eprintln!("skipped: needs root, setpriv (util-linux) and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    for d in [dir.path(), &mnt] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let bin = assert_cmd::cargo::cargo_bin("oubli");
    let run = |args: &[&str]| {
        let mut argv: Vec<&std::ffi::OsStr> = vec![bin.as_os_str()];
        argv.extend(args.iter().map(std::ffi::OsStr::new));
        as_nobody(&argv)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .env("OUBLI_STORE", dir.path().join("store"))
            .env("OUBLI_VAULT", dir.path().join("vault"))
            .env("OUBLI_PASSWORD", PASSWORD)
            .output()
            .unwrap()
    };
    let init = run(&["init", "--kdf-memory", "1", "--kdf-iterations", "1"]);
    assert!(init.status.success(), "{init:?}");
    let mounted = || {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(4) == mnt.to_str())
    };
    for opt in ["dirty_share=5", "readahead=256", "dev", "suid"] {
        let out = run(&["mount", "-o", opt, mnt.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "-o {opt}: {err}");
        assert!(err.contains("root"), "-o {opt}: {err}");
        assert!(!mounted(), "-o {opt}: mounted anyway");
    }
}

/// Issue 40 item 3: another local user cannot take the store's lock files
/// (the command's `lock`, the medium's `oubli-medium`) and so cannot hold
/// off the owner's commits: not through a store directory as `init` makes
/// it, and not even when its owner opened the directory to others (the
/// files themselves are 0600). Before the fix, `flock -s STORE/lock` as
/// nobody made the owner's `put` and `commit` exit 11.
#[test]
fn another_user_cannot_hold_the_store_lock() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    if !nix_is_root() || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root and setpriv (util-linux) to act as another user");
        return;
    }
    let env = Env::new();
    // The temporary directory itself lets others in: the store must not.
    fs::set_permissions(env.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for opened_up in [false, true] {
        if opened_up {
            fs::set_permissions(&env.store, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for name in ["lock", "oubli-medium"] {
            let file = env.store.join(name);
            // The holder says "held" once it has the lock, then waits for
            // its stdin to close; a holder that cannot lock says nothing.
            let mut holder = as_nobody(&[
                "flock".as_ref(),
                "-s".as_ref(),
                file.as_os_str(),
                "-c".as_ref(),
                "echo held; read wait".as_ref(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
            let mut said = String::new();
            BufReader::new(holder.stdout.take().unwrap())
                .read_line(&mut said)
                .unwrap();
            let put = env
                .cmd()
                .args(["put", &format!("{name}-{opened_up}"), "-"])
                .write_stdin("x")
                .output()
                .unwrap();
            let commit = env.cmd().arg("commit").output().unwrap();
            drop(holder.stdin.take());
            let held = holder.wait_with_output().unwrap();
            let what = format!(
                "{} (store directory opened up: {opened_up})",
                file.display()
            );
            assert!(
                put.status.success(),
                "{what}: put: {}",
                String::from_utf8_lossy(&put.stderr)
            );
            assert!(
                commit.status.success(),
                "{what}: commit: {}",
                String::from_utf8_lossy(&commit.stderr)
            );
            assert_eq!(said, "", "{what}: nobody took the lock");
            assert!(!held.status.success(), "{what}");
        }
    }
}

/// Issue 40 item 3: `fsck` and `status` warn about a store directory other
/// users can enter (a store made before the fix, or opened up since) and
/// say how to close it; once closed, no warning. The commands still work.
/// `init` warns about an existing directory it keeps open.
#[test]
fn fsck_and_status_warn_about_a_store_others_can_enter() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    env.put("doc", b"x");
    fs::set_permissions(&env.store, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(env.store.join("lock"), fs::Permissions::from_mode(0o644)).unwrap();
    let fix = format!("chmod -R go= {}", env.store.display());
    for args in [
        &["fsck"][..],
        &["status"],
        &["status", "--json"],
        &["fsck", "--json"],
    ] {
        env.cmd()
            .args(args)
            .assert()
            .success()
            .stderr(predicate::str::contains("warning: store directory"))
            .stderr(predicate::str::contains("other users"))
            .stderr(predicate::str::contains("mode 755"))
            .stderr(predicate::str::contains(fix.as_str()));
    }
    // The store directory closed but a file in it left open still warns.
    fs::set_permissions(&env.store, fs::Permissions::from_mode(0o700)).unwrap();
    env.cmd()
        .arg("fsck")
        .assert()
        .success()
        .stderr(predicate::str::contains("lock (mode 644)"))
        .stderr(predicate::str::contains(fix.as_str()));
    let closed = std::process::Command::new("chmod")
        .args(["-R", "go="])
        .arg(&env.store)
        .status()
        .unwrap();
    assert!(closed.success());
    for args in [&["fsck"][..], &["status"]] {
        env.cmd()
            .args(args)
            .assert()
            .success()
            .stderr(predicate::str::contains("warning").not());
    }
    // `init` in a directory that was already there (a mount point, say)
    // keeps its mode, and says so when it lets others in.
    let existing = env.path("existing");
    fs::create_dir(&existing).unwrap();
    fs::set_permissions(&existing, fs::Permissions::from_mode(0o755)).unwrap();
    env.cmd()
        .arg("--store")
        .arg(&existing)
        .arg("--vault")
        .arg(env.path("existing-vault"))
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .success()
        .stderr(predicate::str::contains("the directory (mode 755)"))
        .stderr(predicate::str::contains(format!(
            "chmod -R go= {}",
            existing.display()
        )));
}

/// Issue 40 item 4: a password file other users can read (or write) draws a warning,
/// as ssh gives for a private key, from `--password-file`,
/// `--new-password-file` and fstab's `password-file=` (the mount helper);
/// a 0600 file draws none.
#[test]
fn a_password_file_others_can_read_draws_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let file = env.path("password");
    fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let warning = |f: &Path, mode: u32| {
        format!(
            "warning: password file {} is open to other users (mode {mode:o}): run `chmod 600 {}`",
            f.display(),
            f.display()
        )
    };
    for mode in [0o644, 0o640, 0o604, 0o620] {
        fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
        env.cmd()
            .env_remove("OUBLI_PASSWORD")
            .arg("--password-file")
            .arg(&file)
            .arg("ls")
            .assert()
            .success()
            .stderr(predicate::str::contains(warning(&file, mode)));
    }
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    env.cmd()
        .env_remove("OUBLI_PASSWORD")
        .arg("--password-file")
        .arg(&file)
        .arg("ls")
        .assert()
        .success()
        .stderr(predicate::str::contains("warning").not());

    // The mount helper, as mount(8) runs it for an fstab line; the password
    // in the file is wrong, so it stops at the vault and mounts nothing.
    let helper_dir = env.path("sbin");
    fs::create_dir(&helper_dir).unwrap();
    let helper = helper_dir.join("mount.fuse.oubli");
    std::os::unix::fs::symlink(assert_cmd::cargo::cargo_bin("oubli"), &helper).unwrap();
    let wrong = env.path("wrong-password");
    fs::write(&wrong, "not it\n").unwrap();
    fs::set_permissions(&wrong, fs::Permissions::from_mode(0o644)).unwrap();
    let mnt = env.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let options = format!(
        "vault={},password-file={}",
        env.vault.display(),
        wrong.display()
    );
    let out = std::process::Command::new(&helper)
        .env_clear()
        .env("HOME", env.dir.path())
        .arg(&env.store)
        .arg(&mnt)
        .args(["-o", &options])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains(&warning(&wrong, 0o644)), "{stderr}");

    let new = env.path("new-password");
    fs::write(&new, "a new one\n").unwrap();
    fs::set_permissions(&new, fs::Permissions::from_mode(0o640)).unwrap();
    env.cmd()
        .args([
            "vault",
            "passwd",
            "--kdf-memory",
            "1",
            "--kdf-iterations",
            "1",
        ])
        .arg("--new-password-file")
        .arg(&new)
        .assert()
        .success()
        .stderr(predicate::str::contains(warning(&new, 0o640)));
}

/// Makes `path` unwritable, even for root (`chattr +i`, e2fsprogs), or writable again.
fn unwritable(path: &Path, on: bool) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if on { 0o444 } else { 0o644 };
    if nix_is_root() && !on {
        chattr(path, "-i");
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    if nix_is_root() && on {
        chattr(path, "+i");
    }
}

fn chattr(path: &Path, flag: &str) {
    let status = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .expect("chattr (Debian package e2fsprogs)");
    assert!(
        status.success(),
        "chattr {flag} {}: this file system cannot make a file immutable for root",
        path.display()
    );
}

/// Issue 39 item 3: a `share destroy` cut between the share vault's two
/// steps (recreated from the vault file before and after: the random key
/// in, the share's key still in the other slot, the store not told).
/// While the share vault cannot be written, `status` and `audit` report
/// the leftover; the next command that opens the share vault erases the
/// old record, so that with the newer slot blanked `get` does not return
/// the file; and the retried `share destroy` finishes.
#[test]
fn a_share_destruction_cut_between_its_vault_steps_is_finished_and_reported() {
    const SLOT: usize = 4096; // oubli-vault's file layout: two slots of 4 KiB
    let env = Env::new();
    let share_vault = env.path("tenant.vault");
    env.cmd()
        .args(["share", "create", "tenant", "--share-vault"])
        .arg(&share_vault)
        .assert()
        .success();
    let secret = noise(90_000, 43);
    let src = env.path("secret.src");
    fs::write(&src, &secret).unwrap();
    env.cmd()
        .args(["put", "--share", "tenant", "dossier"])
        .arg(&src)
        .assert()
        .success();
    let store_before = env.path("store.before");
    copy_dir(&env.store, &store_before);
    let vault_before = fs::read(&env.vault).unwrap();
    let share_before = fs::read(&share_vault).unwrap();
    env.cmd()
        .args(["share", "destroy", "--yes", "tenant"])
        .assert()
        .success();
    // The cut: the share vault as after its first step (the erased slot
    // still holds the share's key), the store as before.
    let after = fs::read(&share_vault).unwrap();
    let mut cut = after.clone();
    for k in 0..after.len() / SLOT {
        let slot = k * SLOT..(k + 1) * SLOT;
        if after[slot.clone()].iter().all(|&b| b == 0) {
            cut[slot.clone()].copy_from_slice(&share_before[slot]);
        }
    }
    assert_ne!(cut, after, "the destruction erased a slot");
    fs::write(&share_vault, &cut).unwrap();
    fs::remove_dir_all(&env.store).unwrap();
    copy_dir(&store_before, &env.store);
    fs::write(&env.vault, &vault_before).unwrap();

    // The share vault cannot be written: its leftover is reported.
    unwritable(&share_vault, true);
    let status = env.json(&["status", "--json"]);
    let leftovers = status["share_leftovers"].as_array().unwrap().clone();
    unwritable(&share_vault, false);
    assert_eq!(leftovers.len(), 1, "{status}");
    assert_eq!(leftovers[0]["share"], "tenant");
    unwritable(&share_vault, true);
    env.cmd()
        .arg("status")
        .assert()
        .success()
        .stdout(predicate::str::contains("vault of key share tenant"));
    let audit = env.cmd().args(["audit", "--json"]).output().unwrap();
    unwritable(&share_vault, false);
    assert_eq!(audit.status.code(), Some(10), "{audit:?}");
    let audit: Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(audit["verdict"], "incomplete", "{audit}");
    assert_eq!(audit["share_leftovers"][0]["share"], "tenant", "{audit}");
    assert_eq!(
        fs::read(&share_vault).unwrap(),
        cut,
        "nothing was erased yet"
    );

    // Writable again: the next open of the share vault erases the old record.
    let status = env.json(&["status", "--json"]);
    assert_eq!(status["share_leftovers"], serde_json::json!([]), "{status}");
    let erased = fs::read(&share_vault).unwrap();
    assert_eq!(erased, after, "the old slot is zeros again");
    // With the newer slot blanked as well, the share's key is nowhere.
    let mut blanked = erased.clone();
    blanked.iter_mut().for_each(|b| *b = 0);
    fs::write(&share_vault, &blanked).unwrap();
    let get = env.cmd().args(["get", "dossier", "-"]).output().unwrap();
    assert!(!get.status.success());
    assert!(get.stdout.is_empty(), "get returned data");
    fs::write(&share_vault, &erased).unwrap();

    // The retry (refused before: "does not hold share") finishes.
    env.cmd()
        .args(["share", "destroy", "--yes", "tenant"])
        .assert()
        .success()
        .stdout(predicate::str::contains("destroyed share tenant"));
    assert!(env.json(&["share", "ls", "--json"])[0]["destroyed_at"].is_u64());
    env.cmd()
        .args(["get", "dossier", "-"])
        .assert()
        .code(6)
        .stdout("")
        .stderr(predicate::str::contains("which was destroyed"));
}

/// Issue 39 item 5: an `oubli put` killed part-way, after the engine had
/// flushed by itself (its queue of changes full: 2^17 by default, 64 here
/// through `OUBLI_TEST_PENDING_OPS_MAX` so that a few MiB do it), leaves an
/// object with the partial plaintext and no name. `audit` reports it as
/// unnamed readable data, and the next command that opens the store for
/// writing erases it without being asked: `fsck` then finds no orphan and
/// nothing of it opens.
#[test]
fn an_interrupted_put_is_erased_at_the_next_writable_open() {
    use std::io::Write;
    let env = Env::new();
    env.put("named", b"kept");
    let mut put = std::process::Command::new(assert_cmd::cargo::cargo_bin("oubli"))
        .args(["put", "big", "-"])
        .env_clear()
        .env("HOME", env.dir.path())
        .env("OUBLI_STORE", &env.store)
        .env("OUBLI_VAULT", &env.vault)
        .env("OUBLI_PASSWORD", PASSWORD)
        .env("OUBLI_TEST_PENDING_OPS_MAX", "64")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // 8 MiB (8 of put's 1 MiB chunks, 256 cells of 32 KiB): the engine
    // flushes by itself more than once on the way.
    let data = noise(8 << 20, 44);
    let mut stdin = put.stdin.take().unwrap();
    stdin.write_all(&data).unwrap();
    // The pipe drained, then put back in read(2) on it: every chunk it
    // took is in the store.
    let syscall = PathBuf::from(format!("/proc/{}/syscall", put.id()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut queued: libc::c_int = 0;
        // SAFETY: FFI; FIONREAD on our end of the pipe writes one int.
        let rc = unsafe {
            libc::ioctl(
                std::os::unix::io::AsRawFd::as_raw_fd(&stdin),
                libc::FIONREAD,
                &mut queued,
            )
        };
        assert_eq!(rc, 0, "FIONREAD");
        let reading = fs::read_to_string(&syscall).is_ok_and(|s| s.starts_with("0 0x0 "));
        if queued == 0 && reading {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "put did not take its input"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    put.kill().unwrap();
    put.wait().unwrap();
    drop(stdin);

    env.cmd().arg("ls").assert().success().stdout("named\n");
    // Read-only commands leave it; audit reports it.
    let audit = env.json(&["audit", "--json"]);
    assert_eq!(audit["unnamed_objects"], 1, "{audit}");
    assert!(
        audit["unnamed_bytes"].as_u64().unwrap() >= 2 << 20,
        "{audit}"
    );
    assert_eq!(audit["verdict"], "unnamed", "{audit}");
    env.cmd()
        .arg("audit")
        .assert()
        .success()
        .stdout(predicate::str::contains("no name reaches"));
    let fsck = env.cmd().args(["fsck", "--json"]).output().unwrap();
    let fsck: Value = serde_json::from_slice(&fsck.stdout).unwrap();
    assert_eq!(fsck["orphans"].as_array().unwrap().len(), 1, "{fsck}");

    // The next writable open erases it, unasked.
    env.cmd()
        .args(["put", "other", "-"])
        .write_stdin("another file")
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "erased 1 object(s) that no name reached",
        ));
    let fsck = env.json(&["fsck", "--json"]);
    assert_eq!(fsck["orphans"], serde_json::json!([]), "{fsck}");
    let audit = env.json(&["audit", "--json"]);
    assert_eq!(audit["unnamed_objects"], 0, "{audit}");
    assert_eq!(audit["verdict"], "ok", "{audit}");
    assert_eq!(audit["leaked_units"], 0, "{audit}");
    assert_eq!(env.get("named"), b"kept");
    assert_eq!(env.get("other"), b"another file");
}
