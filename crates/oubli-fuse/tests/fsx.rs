//! fsx (the crates.io port of the File System eXerciser) over 100,000 random operations against the mount (and 20,000 on a store in an S3 bucket): pread/pwrite, mmap reads and writes, truncate, fallocate, hole punching, sendfile, copy_file_range, fsync.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

const FSX_VERSION: &str = "0.3.2";

/// The fsx binary: on PATH or in cargo's bin directory, else installed with
/// `cargo install` (once; OUBLI_SKIP_EXTERNAL=1 skips the test instead).
fn fsx() -> Option<PathBuf> {
    let home_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("bin").join("fsx"));
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("fsx"))
            .find(|p| p.is_file())
    });
    if let Some(p) = on_path.or(home_bin.clone().filter(|p| p.is_file())) {
        return Some(p);
    }
    if std::env::var("OUBLI_SKIP_EXTERNAL").as_deref() == Ok("1") {
        eprintln!("skipped (OUBLI_SKIP_EXTERNAL=1): fsx is not installed");
        return None;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["install", "--locked", "fsx", "--version", FSX_VERSION])
        .status()
        .expect("running cargo install fsx");
    assert!(status.success(), "cargo install fsx failed: install it by hand (cargo install fsx) or set OUBLI_SKIP_EXTERNAL=1");
    home_bin.filter(|p| p.is_file())
}

const CONFIG: &str = r#"
flen = 4194304
[opsize]
max = 131072
[weights]
close_open = 1
read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 1
punch_hole = 2
sendfile = 1
posix_fadvise = 1
copy_file_range = 1
"#;

#[test]
fn fsx_hundred_thousand_operations() {
    if !fuse_available() {
        return;
    }
    let Some(fsx) = fsx() else { return };
    run_fsx(&fsx, &Mounted::new(mem_store(), default_options()), 100_000);
}

/// Issue 13: the mount on a store in an S3 bucket (versitygw on loopback),
/// 20,000 operations, every fsync a PUT.
#[test]
fn fsx_twenty_thousand_operations_on_s3() {
    if !fuse_available() {
        return;
    }
    let Some(fsx) = fsx() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = oubli_s3::test_server::TestServer::start_or_skip(dir.path()) else {
        return;
    };
    let at = server.bucket("fsx", true, "store");
    let medium = oubli_s3::S3Medium::open_with(&at, &server.config()).unwrap();
    let store = store_on(std::sync::Arc::new(medium), store_options());
    run_fsx(&fsx, &Mounted::new(store, default_options()), 20_000);
}

fn run_fsx(fsx: &std::path::Path, m: &Mounted, operations: u32) {
    let config = m.tmp.path().join("fsx.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = Command::new(fsx)
        .arg("-f")
        .arg(&config)
        .args(["-N", &operations.to_string(), "-S", "20261122", "-P"])
        .arg(m.tmp.path())
        .arg(m.path("fsxfile"))
        .output()
        .expect("running fsx");
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("All operations completed A-OK!"),
        "fsx failed ({}):\n{}",
        out.status,
        log.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
