//! The `oubli` command on a simulated raw NAND chip: `--store nand:IMAGE --vault nand`, a round trip, and the chip's wear in `status`.

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;
use std::path::PathBuf;
use tempfile::TempDir;

struct Env {
    dir: TempDir,
    image: PathBuf,
}

impl Env {
    fn cmd(&self) -> Command {
        let mut cmd = Command::cargo_bin("oubli").unwrap();
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("OUBLI_STORE", format!("nand:{}", self.image.display()))
            .env("OUBLI_VAULT", "nand")
            .env("OUBLI_PASSWORD", "nand password");
        cmd
    }
}

fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_store_and_its_vault_on_one_nand_chip() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env {
        image: dir.path().join("chip.img"),
        dir,
    };
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
        std::fs::metadata(&env.image).unwrap().len(),
        4096 + 256 * 16 * 2112
    );
    use std::os::unix::fs::PermissionsExt;
    // The image holds the sealed vault record: private, like a vault file.
    let mode = std::fs::metadata(&env.image).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    env.cmd()
        .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
        .assert()
        .failure();

    let secret = noise(100_000);
    let src = env.dir.path().join("src");
    std::fs::write(&src, &secret).unwrap();
    env.cmd().arg("put").arg("doc").arg(&src).assert().success();
    let out = env.cmd().args(["get", "doc", "-"]).assert().success();
    assert_eq!(out.get_output().stdout, secret);
    env.cmd().args(["rm", "doc"]).assert().success();
    env.cmd().arg("commit").assert().success();
    env.cmd().args(["get", "doc", "-"]).assert().failure();

    let out = env.cmd().args(["status", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["vault"]["kind"], "nand");
    assert_eq!(status["store"], format!("nand:{}", env.image.display()));
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
    let image = std::fs::read(&env.image).unwrap();
    assert!(!image.windows(64).any(|w| w == &secret[5000..5064]));
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
