//! The CLI with every kind of vault: `tpm:` against a private swtpm, `pkcs11:` against SoftHSM2, `vault show|passwd|move`, the wear warning, the vault-failure policies.
//!
//! The device fixtures are oubli-vault's own (tests/common), compiled in
//! here: they fail the test when swtpm or softhsm2 is missing, unless
//! `OUBLI_SKIP_HW=1`.

mod common;
#[path = "../../oubli-vault/tests/common/mod.rs"]
mod hw;

use assert_cmd::Command;
use hw::{SoftHsm, Swtpm, SOFTHSM_MODULE};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const PASSWORD: &str = "vault cli test";

/// A store directory with its vault somewhere, and the environment for it.
struct Env {
    dir: TempDir,
    vault: String,
    envs: Vec<(String, String)>,
}

impl Env {
    fn new(vault: impl Into<String>) -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
            vault: vault.into(),
            envs: Vec::new(),
        }
    }

    fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn cmd_with(&self, vault: &str, password: &str) -> Command {
        let mut c = Command::cargo_bin("oubli").unwrap();
        c.env_remove("OUBLI_PIN")
            .env_remove("OUBLI_NEW_PASSWORD")
            .env_remove("OUBLI_VAULT_ENDURANCE")
            .env_remove("OUBLI_ON_VAULT_FAILURE")
            .env("OUBLI_PASSWORD", password)
            .env("OUBLI_STORE", self.store())
            .env("OUBLI_VAULT", vault)
            .timeout(Duration::from_secs(120));
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        c
    }

    fn cmd(&self) -> Command {
        self.cmd_with(&self.vault, PASSWORD)
    }

    fn init(&self) {
        self.cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
            .assert()
            .success();
    }

    fn put(&self, name: &str, data: &[u8]) {
        common::put(self.cmd(), name, data);
    }

    fn get_with(&self, vault: &str, password: &str, name: &str) -> (i32, Vec<u8>) {
        let out = self
            .cmd_with(vault, password)
            .args(["get", name])
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), out.stdout)
    }

    /// `oubli serve --export disk --size 1M --socket DIR/nbd.sock` and
    /// `extra`, once it listens; its stderr goes to DIR/serve.log.
    fn serve(&self, extra: &[&str]) -> std::process::Child {
        let sock = self.dir.path().join("nbd.sock");
        let log = self.dir.path().join("serve.log");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_oubli"));
        cmd.env_remove("OUBLI_ON_VAULT_FAILURE")
            .env("OUBLI_PASSWORD", PASSWORD)
            .env("OUBLI_STORE", self.store())
            .env("OUBLI_VAULT", &self.vault)
            .args(["serve", "--export", "disk", "--size", "1M"])
            .args(extra)
            .arg("--socket")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let mut serve = cmd.spawn().unwrap();
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            if let Some(st) = serve.try_wait().unwrap() {
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("serve exited {st}: {err}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "serve did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        serve
    }

    fn stdout(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "oubli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

#[cfg(feature = "tpm")]
fn tpm_address(tpm: &Swtpm) -> String {
    format!("tpm:{}", tpm.location())
}

/// A SoftHSM2 token and the URI of a vault on it (PIN in the URI).
fn token(label: &str) -> (SoftHsm, String) {
    let hsm = SoftHsm::new();
    hsm.init_token(label, "1234");
    let uri =
        format!("pkcs11:token={label};object=oubli?module-path={SOFTHSM_MODULE}&pin-value=1234");
    (hsm, uri)
}

#[cfg(feature = "tpm")]
#[test]
fn tpm_vault_init_put_get_show_and_passwd() {
    if hw::skip_hw() {
        return;
    }
    let tpm = Swtpm::start();
    let env = Env::new(tpm_address(&tpm));
    env.init();
    env.put("a", b"kept in a store whose key is in a TPM");
    let (code, data) = env.get_with(&env.vault, PASSWORD, "a");
    assert_eq!(
        (code, &data[..]),
        (0, &b"kept in a store whose key is in a TPM"[..])
    );

    let show = env.stdout(&["vault", "show"]);
    assert!(show.contains("kind         tpm2"), "{show}");
    assert!(show.contains("writes"), "{show}");
    let json: serde_json::Value =
        serde_json::from_str(&env.stdout(&["vault", "show", "--json"])).unwrap();
    assert_eq!(json["kind"], "tpm2");
    assert!(json["writes"].as_u64().unwrap() >= 1, "{json}");
    assert_eq!(json["wear"]["policy_source"], "default");

    // A TPM vault cannot be re-sealed in place: passwd moves it to the
    // next index, with the new password.
    let out = env
        .cmd()
        .env("OUBLI_NEW_PASSWORD", "new secret")
        .args([
            "vault",
            "passwd",
            "--kdf-memory",
            "1",
            "--kdf-iterations",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = format!("{};index=0x01500019", tpm_address(&tpm));
    assert!(
        text.contains(&new) && text.contains("OUBLI_VAULT"),
        "{text}"
    );
    // The old vault is gone, the old password does not open the new one.
    assert_eq!(env.get_with(&env.vault, PASSWORD, "a").0, 6);
    assert_eq!(env.get_with(&new, PASSWORD, "a").0, 5);
    let (code, data) = env.get_with(&new, "new secret", "a");
    assert_eq!(
        (code, &data[..]),
        (0, &b"kept in a store whose key is in a TPM"[..])
    );
}

#[test]
fn pkcs11_vault_init_put_get() {
    if hw::skip_hw() {
        return;
    }
    let (hsm, uri) = token("cli");
    let mut env = Env::new(uri.clone());
    env.envs
        .push(("SOFTHSM2_CONF".into(), hsm.conf.display().to_string()));
    let out = env
        .cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The PIN never shows.
    assert!(
        !text.contains("pin-value") && text.contains("pkcs11:"),
        "{text}"
    );
    env.put("n", b"on a token");
    assert_eq!(
        env.get_with(&uri, PASSWORD, "n"),
        (0, b"on a token".to_vec())
    );
    assert!(env
        .stdout(&["vault", "show"])
        .contains("kind         pkcs11"));
    // PIN from OUBLI_PIN instead of the URI.
    let no_pin = uri.replace("&pin-value=1234", "");
    let out = env
        .cmd_with(&no_pin, PASSWORD)
        .env("OUBLI_PIN", "1234")
        .args(["get", "n"])
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"on a token");
    // The token made unavailable (its tokens gone from the module's view):
    // writing fails with exit 6, "unreachable".
    let empty = hsm.dir.path().join("empty.conf");
    std::fs::create_dir_all(hsm.dir.path().join("none")).unwrap();
    std::fs::write(
        &empty,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            hsm.dir.path().join("none").display()
        ),
    )
    .unwrap();
    let out = env
        .cmd()
        .env("SOFTHSM2_CONF", &empty)
        .args(["put", "m", "-"])
        .write_stdin(b"x".to_vec())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.contains("unreachable") || err.contains("no vault"),
        "{err}"
    );
}

#[test]
fn file_vault_passwd_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("vault").display().to_string();
    let env = Env::new(vault.clone());
    env.init();
    env.put("x", b"data");
    env.cmd()
        .env("OUBLI_NEW_PASSWORD", "second")
        .args(["vault", "passwd"])
        .assert()
        .success();
    assert_eq!(env.get_with(&vault, PASSWORD, "x").0, 5);
    assert_eq!(env.get_with(&vault, "second", "x"), (0, b"data".to_vec()));
    // --to is for hardware vaults only.
    env.cmd_with(&vault, "second")
        .args(["vault", "passwd", "--to", "elsewhere"])
        .assert()
        .code(2);
}

#[test]
fn move_file_to_pkcs11_and_back() {
    if hw::skip_hw() {
        return;
    }
    let (hsm, uri) = token("mover");
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("vault").display().to_string();
    let mut env = Env::new(first.clone());
    env.envs
        .push(("SOFTHSM2_CONF".into(), hsm.conf.display().to_string()));
    env.init();
    env.put("x", b"moving data");

    let out = env
        .cmd()
        .args([
            "vault",
            "move",
            "--to",
            &uri,
            "--kdf-memory",
            "1",
            "--kdf-iterations",
            "1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("OUBLI_VAULT") && !text.contains("pin-value"),
        "{text}"
    );
    assert!(
        !Path::new(&first).exists(),
        "the old vault file must be deleted"
    );
    assert_eq!(env.get_with(&first, PASSWORD, "x").0, 6);
    assert_eq!(
        env.get_with(&uri, PASSWORD, "x"),
        (0, b"moving data".to_vec())
    );

    // And back to a file, from the token.
    let second = dir.path().join("sub/vault2").display().to_string();
    env.cmd_with(&uri, PASSWORD)
        .args(["vault", "move", "--to", &second])
        .assert()
        .success();
    assert_eq!(env.get_with(&uri, PASSWORD, "x").0, 6);
    assert_eq!(
        env.get_with(&second, PASSWORD, "x"),
        (0, b"moving data".to_vec())
    );
    // Moving onto an existing vault that is not ours is refused (exit 4).
    let other = Env::new(dir.path().join("other-vault").display().to_string());
    other.init();
    env.cmd_with(&second, PASSWORD)
        .args(["vault", "move", "--to", &other.vault])
        .assert()
        .code(4);
    assert_eq!(env.get_with(&second, PASSWORD, "x").0, 0);
}

#[cfg(feature = "tpm")]
#[test]
fn status_warns_of_wear_at_a_live_one_second_policy() {
    if hw::skip_hw() {
        return;
    }
    let tpm = Swtpm::start();
    let mut env = Env::new(tpm_address(&tpm));
    env.init();
    // swtpm reports no endurance (a simulator does not wear): rehearse with
    // a hardware TPM's rating.
    env.envs
        .push(("OUBLI_VAULT_ENDURANCE".into(), "100000".into()));
    // Without a live process: the default policy of mount/serve, said so.
    let status = env.stdout(&["status"]);
    assert!(status.contains("default policy of mount/serve"), "{status}");

    let mut serve = env.serve(&[
        "--epoch-interval",
        "1",
        "--on-vault-failure",
        "refuse-writes",
    ]);
    let status = env.stdout(&["status"]);
    let json: serde_json::Value = serde_json::from_str(&env.stdout(&["status", "--json"])).unwrap();
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(
        status.contains("WARNING") && status.contains("wear out"),
        "{status}"
    );
    assert!(status.contains("running process's policy"), "{status}");
    assert_eq!(json["wear"]["policy_source"], "live");
    assert_eq!(json["wear"]["interval_seconds"], 1);
    assert!(json["wear"]["warning"].is_string(), "{json}");
}

#[test]
fn on_vault_failure_is_checked() {
    let env = Env::new("/nonexistent/vault");
    env.cmd()
        .args(["--on-vault-failure", "sometimes", "status"])
        .assert()
        .code(2);
    env.cmd()
        .env("OUBLI_ON_VAULT_FAILURE", "refuse-writes")
        .args(["status"])
        .assert()
        .code(8);
}

/// `--on-vault-failure refuse-writes` maps to `VaultFailurePolicy::RefuseWrites`:
/// with the vault down, a failed commit makes writes fail with exit code 6.
#[test]
fn refuse_writes_library_level() {
    use oubli::crates::core::VaultFailurePolicy;
    use oubli::{
        CreateOptions, EpochPolicy, FlakyVault, MemMedium, MemoryVault, Options, Store, Vault,
    };
    let flaky = Arc::new(FlakyVault::new(MemoryVault::empty()));
    let handle = flaky.clone();
    let store = Store::create(
        Arc::new(MemMedium::new()),
        move |first| {
            handle.inner().store(first)?;
            Ok(handle)
        },
        CreateOptions::default(),
        Options {
            policy: EpochPolicy::manual(),
            vault_failure: VaultFailurePolicy::RefuseWrites,
            ..Options::default()
        },
    )
    .unwrap();
    let obj = store.create_object(b"").unwrap();
    store.write(obj, 0, b"before").unwrap();
    flaky.unavailable(true);
    assert!(store.commit().is_err());
    let err = store.write(obj, 0, b"during").unwrap_err();
    assert!(matches!(err, oubli::Error::WritesRefused(_)), "{err}");
    assert_eq!(oubli::exit_code(&err), oubli::exit::VAULT);
    flaky.unavailable(false);
    store.commit().unwrap();
    store.write(obj, 0, b"after").unwrap();
}

/// Issue 39 item 2 on the hardware vaults: `oubli serve` whose last commit
/// fails at SIGTERM — the swtpm gone, the SoftHSM2 token's files made
/// immutable — exits 6, saying the deletions are still recoverable and
/// that `oubli commit` finishes them; it does once the vault is back.
#[test]
fn serve_exits_6_when_the_hardware_vault_fails_at_its_last_commit() {
    if hw::skip_hw()
        || !common::require(
            common::on_path("qemu-io"),
            "qemu-io is missing (Debian package qemu-utils)",
        )
    {
        return;
    }
    let check = |env: &Env, break_it: &mut dyn FnMut(), mend: &mut dyn FnMut()| {
        env.init();
        let mut serve = env.serve(&["--epoch-interval", "0"]);
        let uri = format!(
            "nbd+unix:///disk?socket={}",
            env.dir.path().join("nbd.sock").display()
        );
        let io = |cmd: &str| {
            let out = std::process::Command::new("qemu-io")
                .args(["-f", "raw"])
                .arg(&uri)
                .args(["-c", cmd])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        };
        io("write -P 0x5a 0 64k");
        env.stdout(&["commit"]);
        io("discard 0 64k");
        break_it();
        let ok = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(serve.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let start = Instant::now();
        let status = loop {
            if let Some(st) = serve.try_wait().unwrap() {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "serve did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = std::fs::read_to_string(env.dir.path().join("serve.log")).unwrap();
        assert_eq!(status.code(), Some(6), "{log}");
        assert!(
            log.contains("stopped, but the last commit failed")
                && log.contains("recoverable")
                && log.contains("oubli commit")
                && !log.contains("pin-value"),
            "{log}"
        );
        mend();
        env.stdout(&["commit"]);
        let json: serde_json::Value =
            serde_json::from_str(&env.stdout(&["status", "--json"])).unwrap();
        assert_eq!(json["pending_deletions"], 0, "{json}");
    };

    #[cfg(feature = "tpm")]
    {
        let tpm = std::cell::RefCell::new(Swtpm::start());
        let env = Env::new(tpm_address(&tpm.borrow()));
        check(&env, &mut || tpm.borrow_mut().kill(), &mut || {
            tpm.borrow_mut().restart()
        });
    }

    let (hsm, uri) = token("serve");
    let mut env = Env::new(uri);
    env.envs
        .push(("SOFTHSM2_CONF".into(), hsm.conf.display().to_string()));
    let guard = std::cell::RefCell::new(None);
    check(
        &env,
        &mut || *guard.borrow_mut() = Some(common::Immutable::set(&hsm.tokens)),
        &mut || *guard.borrow_mut() = None,
    );
}
