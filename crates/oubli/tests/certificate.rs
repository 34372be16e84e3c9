//! Certificates of sanitization through the `oubli` binary: one per erasing command, tampering, wrong keys, a rolled-back vault, file vault (not a Purge) and SoftHSM2 (a Purge).

mod common;
#[path = "../../oubli-vault/tests/common/mod.rs"]
mod hw;

use assert_cmd::Command;
use serde_json::Value;
use std::path::PathBuf;
use tempfile::TempDir;

const PASSWORD: &str = "certify this";

// Two organisation keys, as `openssl genpkey -algorithm ed25519` and
// `openssl pkey -pubout` write them.
const KEY_A: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIIxXZLsXuVsauk4cWHiSCFRdwEf2bbllfa0U7NqpEaAb\n-----END PRIVATE KEY-----\n";
const PUB_A: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAPyR4EB7hFZCF63XK5ForF6ROtWHzfBIVILpEBGudXeY=\n-----END PUBLIC KEY-----\n";
const KEY_B: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEILSz+/h/oEyWlG6S/e1cATYGVdQKLtKGi6mtu5fwamRp\n-----END PRIVATE KEY-----\n";
const PUB_B: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEApi69czjmeSNhLgRCCFQ4KWVFd7T1/eAfjLSv4rEH8yo=\n-----END PUBLIC KEY-----\n";

/// A store with its vault in a temporary directory, and the keys beside it.
struct Env {
    dir: TempDir,
    vault: String,
    /// `--store`: the directory `store` in `dir`, or `nand:IMAGE`.
    store: PathBuf,
    envs: Vec<(String, String)>,
}

impl Env {
    /// A store with a file vault.
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let vault = dir.path().join("vault").display().to_string();
        Env::with_vault(dir, vault, Vec::new())
    }

    fn with_vault(dir: TempDir, vault: String, envs: Vec<(String, String)>) -> Env {
        for (name, text) in [
            ("a.pem", KEY_A),
            ("a.pub", PUB_A),
            ("b.pem", KEY_B),
            ("b.pub", PUB_B),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let store = dir.path().join("store");
        let env = Env {
            dir,
            vault,
            store,
            envs,
        };
        env.ok(&["init", "--kdf-memory", "1", "--kdf-iterations", "1"]);
        env
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A store whose vault is on a fresh swtpm, holding `in-tpm-store`
    /// (4096 bytes); None when the hardware tests are switched off.
    #[cfg(feature = "tpm")]
    fn on_swtpm() -> Option<(hw::Swtpm, Env)> {
        if hw::skip_hw() {
            return None;
        }
        let tpm = hw::Swtpm::start();
        let address = format!("tpm:{}", tpm.location());
        let env = Env::with_vault(tempfile::tempdir().unwrap(), address, Vec::new());
        env.put("in-tpm-store", &[3u8; 4096]);
        Some((tpm, env))
    }

    /// A store on a simulated NAND chip, its vault in the chip.
    fn on_nand() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("nand:{}", dir.path().join("chip.img").display());
        for (name, text) in [("a.pem", KEY_A), ("a.pub", PUB_A)] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let env = Env {
            dir,
            vault: "nand".into(),
            store: store.into(),
            envs: Vec::new(),
        };
        env.ok(&[
            "init",
            "--kdf-memory",
            "1",
            "--kdf-iterations",
            "1",
            "--nand-geometry",
            "2048x64x256",
        ]);
        env
    }

    fn store(&self) -> PathBuf {
        self.store.clone()
    }

    /// `oubli` with nothing but this store's vault and password (and no
    /// `--store`: `certificate verify` then checks the file alone).
    fn bare(&self) -> Command {
        let mut cmd = Command::cargo_bin("oubli").unwrap();
        cmd.env_clear()
            .env("HOME", self.dir.path())
            // fusermount3, for the mount tests.
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OUBLI_VAULT", &self.vault)
            .env("OUBLI_PASSWORD", PASSWORD)
            .current_dir(self.dir.path())
            .timeout(common::LIMIT);
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        cmd
    }

    fn cmd(&self) -> Command {
        let mut cmd = self.bare();
        cmd.env("OUBLI_STORE", self.store());
        cmd
    }

    /// Runs `oubli ARGS` and returns (exit code, stdout, stderr).
    fn run(&self, cmd: &mut Command) -> (i32, String, String) {
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(self.cmd().args(args));
        assert_eq!(code, 0, "oubli {args:?}: {err}");
        out
    }

    fn put(&self, name: &str, data: &[u8]) {
        common::put(self.cmd(), name, data);
    }

    /// `oubli ARGS --certificate FILE --sign-key a.pem`; the certificate.
    fn certified(&self, args: &[&str], file: &str) -> Value {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--certificate", file, "--sign-key", "a.pem"]);
        let out = self.ok(&all);
        assert!(out.contains("wrote the certificate"), "{out}");
        self.read(file)
    }

    fn read(&self, file: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.path(file)).unwrap()).unwrap()
    }

    /// `oubli certificate verify FILE --public-key PUB`, with the store or
    /// not: the exit code and what it printed.
    fn verify(&self, file: &str, public: &str, with_store: bool) -> (i32, String) {
        let mut cmd = if with_store { self.cmd() } else { self.bare() };
        cmd.args(["certificate", "verify", file, "--public-key", public]);
        let (code, out, err) = self.run(&mut cmd);
        (code, out + &err)
    }

    /// Fails the test unless `certificate verify FILE --store` passes with
    /// organisation key A.
    fn verifies(&self, file: &str) {
        let (code, out) = self.verify(file, "a.pub", true);
        assert_eq!(code, 0, "{file}: {out}");
    }
}

/// The certificate's erased items as (kind, name, bytes).
fn items(c: &Value) -> Vec<(String, String, u64)> {
    c["certificate"]["erased"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["kind"].as_str().unwrap().to_string(),
                i["name"].as_str().unwrap().to_string(),
                i["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn retained(c: &Value) -> Vec<String> {
    c["certificate"]["erased"]["retained"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

/// Checks what every certificate states about the erasure itself.
fn assert_erasure(c: &Value, category: &str) {
    let c = &c["certificate"];
    assert_eq!(c["method"]["category"], category, "{c:#}");
    assert_eq!(c["verification"]["outcome"], "pass", "{c:#}");
    assert_eq!(c["verification"]["leaked_units_after"], 0, "{c:#}");
    assert!(
        c["store"]["epoch_after"].as_u64() > c["store"]["epoch_before"].as_u64(),
        "{c:#}"
    );
    assert_ne!(c["vault_records"]["before"], c["vault_records"]["after"]);
    assert!(c["verification"]["erased_units_before"].as_u64().unwrap() > 0);
}

#[test]
fn rm_purge_certifies_the_name_it_erased_and_nothing_kept() {
    let env = Env::new();
    env.put("kept-file", b"stays");
    env.put("gone-file", &[7u8; 10_000]);
    let c = env.certified(&["rm", "gone-file", "--purge"], "rm.json");
    assert_eq!(items(&c), [("name".into(), "gone-file".into(), 10_000)]);
    assert!(retained(&c).is_empty());
    assert!(!c.to_string().contains("kept-file"), "{c:#}");
    // A file vault: the certificate says plainly it is not a Purge.
    assert_erasure(&c, "clear");
    let statement = c["certificate"]["method"]["statement"].as_str().unwrap();
    assert!(statement.contains("NOT a Purge"), "{statement}");
    env.verifies("rm.json");
}

#[test]
fn rm_purge_of_a_name_a_snapshot_holds_lists_it_as_not_erased() {
    let env = Env::new();
    env.put("held", b"a snapshot keeps this");
    env.ok(&["snapshot", "create", "before"]);
    let c = env.certified(&["rm", "held", "--purge"], "rm.json");
    assert!(items(&c).is_empty(), "{c:#}");
    assert_eq!(retained(&c), ["held"]);
    let kept = &c["certificate"]["erased"]["retained"][0]["kept_in"];
    assert_eq!(kept, &serde_json::json!(["before"]));
    let text = env.ok(&["certificate", "show", "rm.json"]);
    assert!(text.contains("NOT erased name: held"), "{text}");
}

#[test]
fn rm_purge_all_snapshots_certifies_the_name_and_the_snapshots() {
    let env = Env::new();
    env.put("other", b"not touched");
    env.put("everywhere", &[1u8; 5000]);
    env.ok(&["snapshot", "create", "s1"]);
    let c = env.certified(
        &["rm", "everywhere", "--purge", "--all-snapshots"],
        "all.json",
    );
    assert_eq!(items(&c), [("name".into(), "everywhere".into(), 5000)]);
    assert_eq!(
        c["certificate"]["erased"]["items"][0]["from_snapshots"],
        serde_json::json!(["s1"])
    );
    assert!(!c.to_string().contains("\"other\""), "{c:#}");
    assert_erasure(&c, "clear");
    env.verifies("all.json");
}

#[test]
fn hash_names_puts_salted_hashes_in_place_of_names() {
    let env = Env::new();
    env.put("patient-record-1234", b"personal");
    env.ok(&["snapshot", "create", "s"]);
    let c = env.certified(
        &[
            "rm",
            "patient-record-1234",
            "--purge",
            "--all-snapshots",
            "--hash-names",
        ],
        "hashed.json",
    );
    let text = std::fs::read_to_string(env.path("hashed.json")).unwrap();
    assert!(!text.contains("patient-record"), "{text}");
    let names = &c["certificate"]["erased"]["names"];
    assert_eq!(names["form"], "salted_sha256");
    let salt = hex_decode(names["salt"].as_str().unwrap());
    let item = &c["certificate"]["erased"]["items"][0];
    assert_eq!(item["name"], sha256_hex(&salt, "patient-record-1234"));
    assert_eq!(item["from_snapshots"][0], sha256_hex(&salt, "s"));
    env.verifies("hashed.json");
}

fn hex_decode(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// SHA-256(salt ‖ name) by `sha256sum`, independent of oubli's code.
fn sha256_hex(salt: &[u8], name: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = salt.to_vec();
    input.extend_from_slice(name.as_bytes());
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

#[test]
fn commit_certifies_every_deletion_since_the_last_commit() {
    let env = Env::new();
    env.put("x", &[3u8; 3000]);
    env.put("y", b"kept");
    env.ok(&["commit"]);
    env.ok(&["rm", "x"]);
    let c = env.certified(&["commit"], "commit.json");
    // The store keeps no names of deleted data: the totals say what went.
    assert!(items(&c).is_empty(), "{c:#}");
    let totals = &c["certificate"]["erased"]["epoch_totals"];
    assert!(totals["deletions"].as_u64().unwrap() >= 1, "{totals}");
    assert!(totals["units"].as_u64().unwrap() >= 1, "{totals}");
    assert!(totals["sealed_bytes"].as_u64().unwrap() >= 3000, "{totals}");
    assert_erasure(&c, "clear");
    env.verifies("commit.json");
}

#[test]
fn snapshot_rm_purge_certifies_the_snapshot() {
    let env = Env::new();
    env.put("old", &[9u8; 20_000]);
    env.ok(&["snapshot", "create", "gone-snap"]);
    env.ok(&["snapshot", "create", "kept-snap"]);
    env.ok(&["rm", "old", "--purge"]);
    let c = env.certified(&["snapshot", "rm", "gone-snap", "--purge"], "snap.json");
    let listed = items(&c);
    assert_eq!(listed.len(), 1, "{c:#}");
    assert_eq!(
        (listed[0].0.as_str(), listed[0].1.as_str()),
        ("snapshot", "gone-snap")
    );
    assert!(!c.to_string().contains("kept-snap"), "{c:#}");
    let c2 = env.certified(&["snapshot", "rm", "kept-snap", "--purge"], "snap2.json");
    // The last snapshot holding the data: its units go now.
    assert!(items(&c2)[0].2 >= 20_000, "{c2:#}");
    assert_erasure(&c2, "clear");
    env.verifies("snap2.json");
    // A new snapshot under the old name is not the erased one coming back.
    env.ok(&["snapshot", "create", "kept-snap"]);
    let (code, out) = env.verify("snap2.json", "a.pub", true);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn share_destroy_certifies_the_share_and_what_was_under_it() {
    let env = Env::new();
    let share_vault = env.path("share-vault").display().to_string();
    env.ok(&[
        "share",
        "create",
        "customer-7",
        "--share-vault",
        &share_vault,
    ]);
    env.cmd()
        .args(["put", "under", "-", "--share", "customer-7"])
        .write_stdin(vec![5u8; 4096])
        .assert()
        .success();
    env.put("elsewhere-file", b"not under the share");
    let c = env.certified(&["share", "destroy", "customer-7", "--yes"], "share.json");
    assert_eq!(items(&c), [("share".into(), "customer-7".into(), 4096)]);
    assert_eq!(
        c["certificate"]["erased"]["items"][0]["object_ids"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(!c.to_string().contains("elsewhere-file"), "{c:#}");
    assert_eq!(c["certificate"]["verification"]["outcome"], "pass");
    // The data under the share went with the share's key, in its own vault.
    let method = &c["certificate"]["method"];
    assert_eq!(method["category"], "clear", "{method}");
    let statement = method["statement"].as_str().unwrap();
    assert!(
        statement.contains("share's own vault, of kind file"),
        "{statement}"
    );
    env.verifies("share.json");
}

/// Every leaf of `v` (scalars, empty arrays and objects) with its path.
fn leaves(v: &Value, path: Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(x, p, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                let mut p = path.clone();
                p.push(i.to_string());
                leaves(x, p, out);
            }
        }
        _ => out.push(path),
    }
}

fn at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match v {
        Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => &mut v[k.as_str()],
    })
}

/// The leaf changed to another value of the same kind (or another kind).
fn altered(v: &Value) -> Value {
    match v {
        Value::String(s) if s.is_empty() => Value::String("x".into()),
        // A different last character keeps hex hex and base64 base64.
        Value::String(s) => {
            let mut t = s.clone();
            let last = t.pop().unwrap();
            t.push(if last == 'A' { 'B' } else { 'A' });
            Value::String(t)
        }
        Value::Number(n) => Value::from(n.as_u64().map_or(1, |n| n + 1)),
        Value::Bool(b) => Value::Bool(!b),
        Value::Null => Value::String("x".into()),
        Value::Array(_) => serde_json::json!([1]),
        Value::Object(_) => serde_json::json!({"x": 1}),
    }
}

#[test]
fn a_certificate_edited_in_any_field_fails_verification() {
    let env = Env::new();
    env.put("a", &[1u8; 1000]);
    env.ok(&["snapshot", "create", "s"]);
    env.certified(&["rm", "a", "--purge", "--all-snapshots"], "c.json");
    assert_eq!(env.verify("c.json", "a.pub", false).0, 0);
    let original = env.read("c.json");
    let mut paths = Vec::new();
    leaves(&original, Vec::new(), &mut paths);
    assert!(paths.len() > 40, "{} leaves", paths.len());
    for path in paths {
        let mut edited = original.clone();
        let leaf = at(&mut edited, &path);
        *leaf = altered(leaf);
        std::fs::write(
            env.path("edited.json"),
            serde_json::to_string_pretty(&edited).unwrap(),
        )
        .unwrap();
        let (code, out) = env.verify("edited.json", "a.pub", false);
        assert_eq!(code, 10, "editing {path:?} went unnoticed: {out}");
    }
    // An added member is refused too.
    let mut added = original.clone();
    added["certificate"]["store"]["note"] = Value::String("ok".into());
    std::fs::write(env.path("added.json"), added.to_string()).unwrap();
    assert_eq!(env.verify("added.json", "a.pub", false).0, 10);
}

#[test]
fn a_signature_by_another_key_fails() {
    let env = Env::new();
    env.put("a", b"data");
    env.certified(&["rm", "a", "--purge"], "c.json");
    let (code, out) = env.verify("c.json", "b.pub", false);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("not by the key given"), "{out}");
    // Signed by b, checked against a.
    env.put("b", b"data");
    let out = env.ok(&[
        "rm",
        "b",
        "--purge",
        "--certificate",
        "by-b.json",
        "--sign-key",
        "b.pem",
    ]);
    assert!(out.contains("wrote the certificate"), "{out}");
    assert_eq!(env.verify("by-b.json", "b.pub", false).0, 0);
    assert_eq!(env.verify("by-b.json", "a.pub", false).0, 10);
    // A forger who swaps in their own key and signature still needs ours.
    let mut forged = env.read("c.json");
    forged["signature"] = env.read("by-b.json")["signature"].clone();
    std::fs::write(env.path("forged.json"), forged.to_string()).unwrap();
    assert_eq!(env.verify("forged.json", "a.pub", false).0, 10);
}

#[test]
fn a_certificate_replayed_against_a_rolled_back_file_vault_fails() {
    let env = Env::new();
    env.put("secret", b"to be erased");
    env.ok(&["commit"]);
    let old_vault = std::fs::read(&env.vault).unwrap();
    env.certified(&["rm", "secret", "--purge"], "c.json");
    env.verifies("c.json");
    // The old vault file copied back: epoch N's key is readable again.
    std::fs::write(&env.vault, old_vault).unwrap();
    let (code, out) = env.verify("c.json", "a.pub", true);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("rolled back"), "{out}");
    // The file alone still verifies: only the store shows the rollback.
    assert_eq!(env.verify("c.json", "a.pub", false).0, 0);
}

#[test]
fn a_certificate_against_another_store_fails() {
    let one = Env::new();
    one.put("a", b"x");
    one.certified(&["rm", "a", "--purge"], "c.json");
    let two = Env::new();
    std::fs::copy(one.path("c.json"), two.path("c.json")).unwrap();
    let (code, out) = two.verify("c.json", "a.pub", true);
    assert_eq!(code, 10, "{out}");
    assert!(out.contains("store's id"), "{out}");
}

#[test]
fn bad_certificate_options_fail_before_anything_is_erased() {
    let env = Env::new();
    env.put("a", b"must survive");
    std::fs::write(env.path("taken.json"), b"").unwrap();
    let cases: [(&[&str], i32); 4] = [
        // The file exists: never overwritten.
        (
            &[
                "--certificate",
                "taken.json",
                "--sign-key",
                "a.pem",
                "--purge",
            ],
            4,
        ),
        // Not a private key.
        (
            &["--certificate", "n1.json", "--sign-key", "a.pub", "--purge"],
            2,
        ),
        // No key at all.
        (&["--certificate", "n2.json", "--purge"], 2),
        // Nothing is erased without --purge.
        (&["--certificate", "n3.json", "--sign-key", "a.pem"], 2),
    ];
    for (extra, want) in cases {
        let mut args = vec!["rm", "a"];
        args.extend_from_slice(extra);
        let (code, _, err) = env.run(env.cmd().args(&args));
        assert_eq!(code, want, "{args:?}: {err}");
        assert_eq!(env.ok(&["get", "a"]), "must survive", "{args:?}");
    }
    for name in ["n1.json", "n2.json", "n3.json"] {
        assert!(!env.path(name).exists(), "{name} left behind");
    }
    assert_eq!(std::fs::read(env.path("taken.json")).unwrap(), b"");
}

#[test]
fn show_renders_text_and_a_self_contained_page_that_wraps_long_names() {
    let env = Env::new();
    let long = "a-very-long-name-without-any-space-".repeat(7);
    env.put(&long, b"x");
    env.put("<b>&", b"y");
    env.certified(&["rm", &long, "--purge"], "c.json");
    env.certified(&["rm", "<b>&", "--purge"], "d.json");
    let text = env.ok(&["certificate", "show", "c.json"]);
    assert!(
        text.contains(&long) && text.contains("NOT a Purge"),
        "{text}"
    );
    let html = env.ok(&["certificate", "show", "c.json", "--html"]);
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(html.contains(&long), "{html}");
    assert!(html.contains("overflow-wrap:anywhere"), "{html}");
    assert!(html.contains("@media print"), "{html}");
    // Self-contained: nothing fetched.
    for external in ["src=", "href=", "@import", "url("] {
        assert!(!html.contains(external), "{external} in {html}");
    }
    let escaped = env.ok(&["certificate", "show", "d.json", "--html"]);
    assert!(escaped.contains("&lt;b&gt;&amp;"), "{escaped}");
    assert!(!escaped.contains("<b>&"), "{escaped}");
}

/// `erased.items_unlisted` (names a mount removed past the 100,000 it
/// lists) is absent when 0, so other certificates sign what they did
/// before it existed; when present it is shown, and it is signed like
/// every member.
#[test]
fn names_past_a_mounts_list_are_counted_shown_and_signed() {
    let env = Env::new();
    env.put("one", b"x");
    env.certified(&["rm", "one", "--purge"], "c.json");
    let text = std::fs::read_to_string(env.path("c.json")).unwrap();
    assert!(!text.contains("items_unlisted"), "{text}");
    let mut c = env.read("c.json");
    c["certificate"]["erased"]["items_unlisted"] = serde_json::json!(12345);
    std::fs::write(env.path("more.json"), c.to_string()).unwrap();
    let shown = env.ok(&["certificate", "show", "more.json"]);
    assert!(shown.contains("12345 more name(s)"), "{shown}");
    let (code, out) = env.verify("more.json", "a.pub", false);
    assert_eq!(code, 10, "{out}");
}

/// SoftHSM2 is a software token: its objects are files on the host, which
/// may keep old copies, and the vault says so (`overwrite_is_erasure` is
/// false for it, true for a hardware token). The certificate follows: a
/// Purge only on hardware (covered by the model's unit test
/// `only_a_vault_whose_overwrite_erases_makes_a_purge`).
#[test]
fn a_softhsm_vault_certificate_names_the_token_and_says_it_is_software() {
    if hw::skip_hw() {
        return;
    }
    let hsm = hw::SoftHsm::new();
    hsm.init_token("cert", "1234");
    let uri = format!(
        "pkcs11:token=cert;object=oubli?module-path={}&pin-value=1234",
        hw::SOFTHSM_MODULE
    );
    let envs = vec![("SOFTHSM2_CONF".into(), hsm.conf.display().to_string())];
    let env = Env::with_vault(tempfile::tempdir().unwrap(), uri, envs);
    env.put("on-token", &[2u8; 2048]);
    let c = env.certified(&["rm", "on-token", "--purge"], "c.json");
    assert_eq!(items(&c), [("name".into(), "on-token".into(), 2048)]);
    assert_erasure(&c, "clear");
    let m = &c["certificate"]["method"];
    assert_eq!(m["vault_kind"], "pkcs11");
    assert_eq!(m["vault_overwrite_erases"], false);
    let statement = m["statement"].as_str().unwrap();
    assert!(statement.contains("software token"), "{statement}");
    // The PIN never reaches the certificate.
    assert!(!c.to_string().contains("pin-value"), "{c:#}");
    env.verifies("c.json");
}

/// Runs `test` with a fresh store mounted (see [`Mounted`]), when FUSE is
/// available here.
fn with_a_mount(test: impl FnOnce(&Env, Mounted<'_>)) {
    if !common::fuse_available() {
        return;
    }
    let env = Env::new();
    test(&env, Mounted::new(&env));
}

/// A store mounted (detached) at `mnt` in the temporary directory, with no
/// commit of its own for an hour; unmounted on drop if a test failed.
struct Mounted<'a> {
    env: &'a Env,
    mnt: PathBuf,
}

impl Mounted<'_> {
    fn new(env: &Env) -> Mounted<'_> {
        let mnt = env.path("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        env.ok(&["mount", mnt.to_str().unwrap(), "-o", "epoch_interval=3600"]);
        Mounted { env, mnt }
    }

    fn at(&self) -> &str {
        self.mnt.to_str().unwrap()
    }
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = self.env.cmd().args(["umount", self.at()]).output();
    }
}

/// Paths under a live mount the removals below erase, and files they keep:
/// a file in nested directories, a tree removed with `rm -rf`, and a file
/// renamed over another (the name lives on with the new file; the old
/// file's data is what goes). Returns the expected items (sorted) and the
/// object id of the file renamed over.
fn remove_through_the_mount(mnt: &std::path::Path, env: &Env) -> (Vec<(String, String, u64)>, u64) {
    use std::os::unix::fs::MetadataExt;
    std::fs::create_dir_all(mnt.join("a/b/c")).unwrap();
    std::fs::write(mnt.join("a/b/c/deep"), vec![4u8; 50_000]).unwrap();
    std::fs::write(mnt.join("a/b/sibling-kept"), b"kept").unwrap();
    std::fs::create_dir_all(mnt.join("tree/sub")).unwrap();
    std::fs::write(mnt.join("tree/x"), vec![1u8; 3_000]).unwrap();
    std::fs::write(mnt.join("tree/sub/y"), vec![2u8; 7_000]).unwrap();
    std::fs::write(mnt.join("victim"), vec![3u8; 11_000]).unwrap();
    std::fs::write(mnt.join("newcomer"), b"the new content").unwrap();
    std::fs::write(mnt.join("kept"), b"kept").unwrap();
    env.ok(&["commit", mnt.to_str().unwrap()]);
    let victim = std::fs::metadata(mnt.join("victim")).unwrap().ino();
    std::fs::remove_file(mnt.join("a/b/c/deep")).unwrap();
    assert!(std::process::Command::new("rm")
        .arg("-rf")
        .arg(mnt.join("tree"))
        .status()
        .unwrap()
        .success());
    std::fs::rename(mnt.join("newcomer"), mnt.join("victim")).unwrap();
    assert_ne!(std::fs::metadata(mnt.join("victim")).unwrap().ino(), victim);
    let expected = [
        ("a/b/c/deep", 50_000),
        ("tree", 0),
        ("tree/sub", 0),
        ("tree/sub/y", 7_000),
        ("tree/x", 3_000),
        ("victim", 11_000),
    ];
    let expected = expected
        .iter()
        .map(|(n, b)| ("path".to_string(), n.to_string(), *b))
        .collect();
    (expected, victim)
}

/// The certificate's items sorted by name, and checks that what was kept
/// is named nowhere in it, and that the file renamed over is listed with
/// its own object id.
fn sorted_items_and_nothing_kept(c: &Value, victim: u64) -> Vec<(String, String, u64)> {
    let mut listed = items(c);
    listed.sort();
    let text = c.to_string();
    for kept in ["sibling-kept", "\"kept\"", "newcomer"] {
        assert!(!text.contains(kept), "{kept} is listed: {c:#}");
    }
    let renamed_over = c["certificate"]["erased"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "victim")
        .unwrap_or_else(|| panic!("victim not listed: {c:#}"));
    assert_eq!(renamed_over["object_ids"], serde_json::json!([victim]));
    assert!(retained(c).is_empty(), "{c:#}");
    listed
}

#[test]
fn commit_through_a_live_mount_certifies_its_deletions() {
    with_a_mount(|env, m| {
        let (expected, victim) = remove_through_the_mount(&m.mnt, env);
        let c = env.certified(&["commit", m.at()], "commit.json");
        assert_eq!(sorted_items_and_nothing_kept(&c, victim), expected, "{c:#}");
        let totals = &c["certificate"]["erased"]["epoch_totals"];
        assert!(totals["units"].as_u64().unwrap() >= 1, "{totals}");
        assert!(
            totals["sealed_bytes"].as_u64().unwrap() >= 50_000,
            "{totals}"
        );
        assert_erasure(&c, "clear");
        // The next commit's certificate lists only what was removed since.
        std::fs::remove_file(m.mnt.join("kept")).unwrap();
        let c = env.certified(&["commit", m.at()], "again.json");
        assert_eq!(items(&c), [("path".into(), "kept".into(), 4)], "{c:#}");
        drop(m);
        env.verifies("commit.json");
        env.verifies("again.json");
    });
}

/// A file removed through the mount that a snapshot still holds, and one
/// with another hard link, are listed as removed but not erased.
#[test]
fn a_mount_certificate_lists_removed_files_a_snapshot_or_a_link_keeps_as_retained() {
    with_a_mount(|env, m| {
        std::fs::write(m.mnt.join("held"), vec![5u8; 9_000]).unwrap();
        env.ok(&["snapshot", "create", "monday", m.at()]);
        std::fs::write(m.mnt.join("linked"), vec![6u8; 9_000]).unwrap();
        std::fs::hard_link(m.mnt.join("linked"), m.mnt.join("other-name")).unwrap();
        std::fs::write(m.mnt.join("untouched"), vec![7u8; 2_000]).unwrap();
        std::fs::write(m.mnt.join("fresh"), vec![8u8; 1_000]).unwrap();
        env.ok(&["commit", m.at()]);
        for name in ["held", "linked", "fresh"] {
            std::fs::remove_file(m.mnt.join(name)).unwrap();
        }
        let c = env.certified(&["commit", m.at()], "commit.json");
        assert_eq!(items(&c), [("path".into(), "fresh".into(), 1_000)], "{c:#}");
        let kept = &c["certificate"]["erased"]["retained"];
        assert_eq!(kept[0]["name"], "held", "{c:#}");
        assert_eq!(kept[0]["kept_in"], serde_json::json!(["monday"]), "{c:#}");
        assert_eq!(kept[1]["name"], "linked", "{c:#}");
        assert_eq!(
            kept[1]["kept_in"],
            serde_json::json!(["another name"]),
            "{c:#}"
        );
        assert!(!c.to_string().contains("untouched"), "{c:#}");
        assert!(!c.to_string().contains("other-name"), "{c:#}");
        drop(m);
        env.verifies("commit.json");
    });
}

#[test]
fn redact_purge_certifies_the_path_and_the_snapshots_it_left() {
    with_a_mount(|env, m| {
        std::fs::create_dir(m.mnt.join("clients")).unwrap();
        std::fs::write(m.mnt.join("clients/alice"), vec![1u8; 30_000]).unwrap();
        std::fs::write(m.mnt.join("clients/bob"), b"bob stays").unwrap();
        env.ok(&["snapshot", "create", "monday", m.at()]);
        let alice = m.mnt.join("clients/alice");
        let alice_oid = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&alice).unwrap());
        let c = env.certified(
            &["redact", alice.to_str().unwrap(), "--purge"],
            "redact.json",
        );
        // Listed once, with its object (the mount's removal of it too).
        assert_eq!(items(&c), [("path".into(), "clients/alice".into(), 30_000)]);
        assert_eq!(
            c["certificate"]["erased"]["items"][0]["object_ids"],
            serde_json::json!([alice_oid])
        );
        assert_eq!(
            c["certificate"]["erased"]["items"][0]["from_snapshots"],
            serde_json::json!(["monday"])
        );
        assert!(!c.to_string().contains("bob"), "{c:#}");
        assert_erasure(&c, "clear");
        assert!(!alice.exists());
        drop(m);
        env.verifies("redact.json");
    });
}

#[test]
fn snapshot_rm_purge_through_a_live_mount_certifies_the_snapshot() {
    with_a_mount(|env, m| {
        std::fs::write(m.mnt.join("old"), vec![6u8; 40_000]).unwrap();
        env.ok(&["snapshot", "create", "only-holder", m.at()]);
        std::fs::remove_file(m.mnt.join("old")).unwrap();
        env.ok(&["commit", m.at()]);
        let c = env.certified(
            &["snapshot", "rm", "only-holder", "--purge", m.at()],
            "snap.json",
        );
        let listed = items(&c);
        assert_eq!(listed.len(), 1, "{c:#}");
        assert_eq!(listed[0].0, "snapshot");
        assert_eq!(listed[0].1, "only-holder");
        assert!(listed[0].2 >= 40_000, "{c:#}");
        assert_erasure(&c, "clear");
        drop(m);
        env.verifies("snap.json");
    });
}

#[test]
fn umount_certifies_the_mounts_final_commit() {
    with_a_mount(|env, m| {
        let (expected, victim) = remove_through_the_mount(&m.mnt, env);
        let c = env.certified(&["umount", m.at()], "umount.json");
        assert_eq!(sorted_items_and_nothing_kept(&c, victim), expected, "{c:#}");
        assert_eq!(c["certificate"]["command"], "oubli umount");
        let totals = &c["certificate"]["erased"]["epoch_totals"];
        assert!(
            totals["sealed_bytes"].as_u64().unwrap() >= 50_000,
            "{totals}"
        );
        assert_erasure(&c, "clear");
        assert!(!std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .contains(m.at()));
        env.verifies("umount.json");
    });
}

/// `--hash-names` hashes the paths a mount removed like any other name.
#[test]
fn umount_with_hash_names_lists_the_removed_paths_hashed() {
    with_a_mount(|env, m| {
        std::fs::create_dir(m.mnt.join("patients")).unwrap();
        std::fs::write(m.mnt.join("patients/record-1234"), vec![8u8; 5_000]).unwrap();
        env.ok(&["commit", m.at()]);
        std::fs::remove_file(m.mnt.join("patients/record-1234")).unwrap();
        let c = env.certified(&["umount", m.at(), "--hash-names"], "umount.json");
        let text = std::fs::read_to_string(env.path("umount.json")).unwrap();
        assert!(!text.contains("record-1234"), "{text}");
        let salt = hex_decode(
            c["certificate"]["erased"]["names"]["salt"]
                .as_str()
                .unwrap(),
        );
        assert_eq!(
            items(&c),
            [(
                "path".into(),
                sha256_hex(&salt, "patients/record-1234"),
                5_000
            )],
            "{c:#}"
        );
        env.verifies("umount.json");
    });
}

/// A TPM vault (swtpm): the certificate carries the TPM's NV_Certify of the
/// vault's slots, `verify` checks it, and `verify --store` has the TPM
/// certify its slots again. swtpm is a simulator (its NV memory is a host
/// file): the certificate says so and is not a Purge.
#[cfg(feature = "tpm")]
#[test]
fn a_tpm_vault_certificate_carries_the_tpms_attestation() {
    let Some((_tpm, env)) = Env::on_swtpm() else {
        return;
    };
    let c = env.certified(&["rm", "in-tpm-store", "--purge"], "c.json");
    assert_eq!(items(&c), [("name".into(), "in-tpm-store".into(), 4096)]);
    assert_erasure(&c, "clear");
    let m = &c["certificate"]["method"];
    assert_eq!(m["vault_kind"], "tpm2");
    assert!(
        m["statement"].as_str().unwrap().contains("TPM simulator"),
        "{m}"
    );
    let a = &c["certificate"]["vault_attestation"];
    assert_eq!(a["kind"], "tpm_nv_certify", "{a}");
    let (code, out) = env.verify("c.json", "a.pub", false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("TPM attestation valid"), "{out}");
    let (code, out) = env.verify("c.json", "a.pub", true);
    assert_eq!(code, 0, "{out}");
}

/// A TPM vault whose NV memory is put back to before the erasure (a
/// simulator's state file restored): `verify --store` fails, and the TPM
/// itself, asked to certify its slots again, says epoch N's record is back.
#[cfg(feature = "tpm")]
#[test]
fn a_tpm_rolled_back_to_before_the_erasure_fails_verify_in_the_tpms_own_words() {
    let Some((mut tpm, env)) = Env::on_swtpm() else {
        return;
    };
    let saved = tpm.nv_files();
    env.certified(&["rm", "in-tpm-store", "--purge"], "c.json");
    env.verifies("c.json");
    tpm.roll_back(&saved);
    let (code, out) = env.verify("c.json", "a.pub", true);
    assert_eq!(code, 10, "{out}");
    assert!(
        out.contains("the TPM now") && out.contains("still holds the erased epoch's record"),
        "{out}"
    );
}

/// Whoever holds the organisation's key cannot edit a TPM attestation, or
/// move one into another certificate: re-signed, it still fails.
#[cfg(feature = "tpm")]
#[test]
fn a_tpm_attestation_edited_and_re_signed_with_the_organisations_key_fails() {
    use base64::Engine as _;
    use oubli::certificate::{sign::SigningKey, SignedCertificate, VaultAttestation};
    let Some((_tpm, env)) = Env::on_swtpm() else {
        return;
    };
    env.certified(&["rm", "in-tpm-store", "--purge"], "c.json");
    let original =
        SignedCertificate::from_json(&std::fs::read_to_string(env.path("c.json")).unwrap())
            .unwrap();
    let key = SigningKey::from_pkcs8_pem(KEY_A).unwrap();
    fn flip(s: &mut String, at: usize) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut bytes = b64.decode(&*s).unwrap();
        bytes[at] ^= 1;
        *s = b64.encode(bytes);
    }
    type Edit = Box<dyn Fn(&mut oubli::certificate::Certificate)>;
    let edits: Vec<(&str, Edit, &str)> = vec![
        (
            "a byte of the TPM's statement after the commit",
            Box::new(|c| {
                let Some(VaultAttestation::TpmNvCertify { attest, .. }) = &mut c.vault_attestation
                else {
                    panic!("a TPM attestation")
                };
                flip(attest, 60);
            }),
            "signature does not match",
        ),
        (
            "a byte of the TPM's statement before the commit",
            Box::new(|c| {
                let Some(VaultAttestation::TpmNvCertify { before_attest, .. }) =
                    &mut c.vault_attestation
                else {
                    panic!("a TPM attestation")
                };
                flip(before_attest, 60);
            }),
            "before the commit",
        ),
        (
            "the erased name (the attestation now in another certificate)",
            Box::new(|c| c.erased.items[0].name = "something-else".into()),
            "qualifying data",
        ),
    ];
    for (what, edit, expected) in edits {
        let mut c = original.certificate.clone();
        edit(&mut c);
        std::fs::write(env.path("edited.json"), key.sign(c).to_json()).unwrap();
        let (code, out) = env.verify("edited.json", "a.pub", false);
        assert_eq!(code, 10, "{what}: {out}");
        assert!(out.contains(expected), "{what}: {out}");
    }
}

/// A store on a simulated NAND chip: the medium is named as such, and the
/// chip's vault, an image file here, makes no Purge.
#[test]
fn a_nand_store_certificate_names_the_chip_and_is_not_a_purge() {
    let env = Env::on_nand();
    env.put("on-chip", &[5u8; 3000]);
    let c = env.certified(&["rm", "on-chip", "--purge"], "c.json");
    assert_eq!(items(&c), [("name".into(), "on-chip".into(), 3000)]);
    let store = &c["certificate"]["store"];
    assert_eq!(store["medium"], "nand", "{store}");
    assert!(store["location"].as_str().unwrap().contains("chip.img"));
    assert_erasure(&c, "clear");
    let statement = c["certificate"]["method"]["statement"].as_str().unwrap();
    assert!(statement.contains("simulated NAND"), "{statement}");
    env.verifies("c.json");
}

/// `oubli commit --certificate` while `oubli serve` holds the store: the
/// server measures and commits through its control socket, as a mount does.
#[test]
fn commit_through_a_running_server_is_certified() {
    let env = Env::new();
    let sock = env.path("nbd.sock");
    let log = std::fs::File::create(env.path("serve.log")).unwrap();
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_oubli"))
        .env_clear()
        .env("HOME", env.dir.path())
        .env("OUBLI_STORE", env.store())
        .env("OUBLI_VAULT", &env.vault)
        .env("OUBLI_PASSWORD", PASSWORD)
        .args(["serve", "--export", "disk", "--size", "1M", "--socket"])
        .arg(&sock)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for("the server's socket", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let result = std::panic::catch_unwind(|| env.certified(&["commit"], "served.json"));
    let _ = serve.kill();
    let _ = serve.wait();
    let c = result.unwrap();
    let cert = &c["certificate"];
    assert_eq!(cert["command"], "oubli commit");
    assert_eq!(cert["verification"]["outcome"], "pass", "{c:#}");
    assert!(cert["store"]["epoch_after"].as_u64() > cert["store"]["epoch_before"].as_u64());
    env.verifies("served.json");
}

/// `--sign-key pkcs11:URI`: a certificate signed by an Ed25519 key made
/// inside a PKCS#11 token (SoftHSM2), which never leaves it. It verifies
/// against the token key's public half, not the organisation's file key;
/// a key the token does not hold, or no PIN, fails before anything is
/// erased.
#[test]
fn a_certificate_signed_by_a_key_inside_a_pkcs11_token_verifies() {
    use base64::Engine as _;
    if hw::skip_hw() {
        return;
    }
    let hsm = hw::SoftHsm::new();
    hsm.init_token("org-keys", "1234");
    let key_uri = |label: &str, pin: &str| {
        format!(
            "pkcs11:token=org-keys;object={label}?module-path={}{pin}",
            hw::SOFTHSM_MODULE
        )
    };
    let uri = key_uri("certificates", "&pin-value=1234");
    // The key pair is made inside the token (`pkcs11-tool --keypairgen
    // --key-type EC:edwards25519` does the same), here in this process.
    std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
    let public = oubli::crates::vault::TokenSigner::open(
        &oubli::crates::vault::Pkcs11Uri::parse(&uri).unwrap(),
        &oubli::SecretBytes::new(Vec::new()),
        Default::default(),
    )
    .unwrap()
    .generate()
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let vault = dir.path().join("vault").display().to_string();
    let envs = vec![("SOFTHSM2_CONF".into(), hsm.conf.display().to_string())];
    let env = Env::with_vault(dir, vault, envs);
    // Its public half as `openssl pkey -pubout` writes it (SPKI, RFC 8410).
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(&public);
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(spki)
    );
    std::fs::write(env.path("token.pub"), pem).unwrap();

    env.put("kept", b"stays");
    for (label, pin, code) in [
        ("no-such-key", "&pin-value=1234", 6),
        ("certificates", "", 2),
    ] {
        let (got, _, err) = env.run(env.cmd().args([
            "rm",
            "kept",
            "--purge",
            "--certificate",
            "bad.json",
            "--sign-key",
            &key_uri(label, pin),
        ]));
        assert_eq!(got, code, "{label}: {err}");
        assert!(!env.path("bad.json").exists(), "{label}");
        assert_eq!(env.ok(&["get", "kept"]), "stays", "{label}");
        assert!(!err.contains("1234"), "the PIN in a message: {err}");
    }

    env.put("gone", &[4u8; 3000]);
    let out = env.ok(&[
        "rm",
        "gone",
        "--purge",
        "--certificate",
        "c.json",
        "--sign-key",
        &uri,
    ]);
    assert!(out.contains("wrote the certificate"), "{out}");
    let c = env.read("c.json");
    assert_eq!(items(&c), [("name".into(), "gone".into(), 3000)]);
    assert!(!c.to_string().contains("1234"), "{c:#}");
    let (code, out) = env.verify("c.json", "token.pub", true);
    assert_eq!(code, 0, "{out}");
    assert_eq!(env.verify("c.json", "a.pub", false).0, 10);
}
