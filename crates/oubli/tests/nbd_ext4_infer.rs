//! ext4 on `oubli serve --infer-deletes ext4`, mounted WITHOUT discard and never trimmed: rm, truncate, overwrite and rm -rf of a tree of 2,000 files are erased at the next commit because the server follows ext4's journal (the adversary with the current vault recovers none of the deleted files, every kept file is intact, e2fsck -fn clean); the control without inference recovers them; the setting persists across a restart; a file system it cannot follow is refused with exit 2.
//!
//! Needs root (losetup, mount), /dev/fuse and the Debian packages libnbd-bin
//! (nbdfuse), e2fsprogs, fuse3, util-linux and mount. A missing piece fails
//! the test with the package to install, unless OUBLI_SKIP_EXTERNAL=1.
mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn rig() -> Rig {
    Rig {
        dir: tempfile::tempdir().unwrap(),
        server: None,
        nbdfuse: None,
        loopdev: None,
        mounted: false,
        serves: 0,
    }
}

fn prerequisites() -> bool {
    let root = run(Command::new("id").arg("-u")).1.trim() == "0";
    if !require(root, "this test needs root (losetup, mount)") {
        return false;
    }
    for (tool, package) in [
        ("nbdfuse", "libnbd-bin"),
        ("fusermount3", "fuse3"),
        ("mkfs.ext4", "e2fsprogs"),
        ("e2fsck", "e2fsprogs"),
        ("losetup", "mount"),
        ("mount", "mount"),
    ] {
        if !require(
            on_path(tool),
            &format!("`{tool}` is not installed: apt-get install -y {package} (see scripts/apt-packages)"),
        ) {
            return false;
        }
    }
    require(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing (load the fuse module)",
    )
}

/// Lets ext4 commit its journal (mounted with commit=1) and the server see it.
fn settle() {
    sync();
    std::thread::sleep(Duration::from_millis(2500));
}

const TREE: std::ops::Range<usize> = 1000..3000;

/// One run: files, a restart, deletions of every kind, purge; returns
/// (deleted files the adversary recovers, kept files it cannot, rig).
fn scenario(infer: bool) -> (Vec<usize>, Vec<usize>, Rig, String) {
    let mut rig = rig();
    sh(rig.oubli().args([
        "init",
        "--cell-size",
        "4K",
        "--kdf-memory",
        "8",
        "--kdf-iterations",
        "1",
    ]));
    if infer {
        rig.start_server_with(&["--infer-deletes", "ext4"]);
    } else {
        rig.start_server();
    }
    rig.attach();
    sh(Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
        ])
        .arg(rig.dev()));
    let mnt = rig.path("mnt");
    rig.mount("nodiscard,commit=1,errors=remount-ro");
    let files = write_tree(&mnt, 0..60);
    let tree = mnt.join("src");
    for f in TREE {
        let d = tree.join(format!("m{}", f % 37));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("x{f}.c")), content(f, 200 + (f % 9) * 700)).unwrap();
    }
    settle();
    rig.purge();
    // Restart: the stored setting applies without the flag.
    rig.detach();
    assert!(rig.stop_server());
    rig.start_server();
    let log = rig.server_log();
    assert_eq!(
        log.contains("deletions are inferred from its ext4 journal"),
        infer,
        "{log}"
    );
    rig.attach();
    rig.mount("nodiscard,commit=1,errors=remount-ro");

    let removed: Vec<usize> = (0..60).filter(|f| f % 4 == 1).collect();
    let truncated: Vec<usize> = (0..60).filter(|f| f % 4 == 2).collect();
    let overwritten: Vec<usize> = (0..60).filter(|f| f % 4 == 3).collect();
    for f in &removed {
        std::fs::remove_file(&files[f]).unwrap();
    }
    for f in &truncated {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&files[f])
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    for f in &overwritten {
        // As an editor saves: a new file renamed over the old one.
        let tmp = files[f].with_extension("new");
        std::fs::write(&tmp, content(f + 100_000, 3000)).unwrap();
        std::fs::rename(&tmp, &files[f]).unwrap();
    }
    sh(Command::new("rm").arg("-rf").arg(&tree));
    settle();
    // One more transaction, so that blocks written just before the frees'
    // commit are examined again.
    std::fs::write(mnt.join("tick"), b"tick").unwrap();
    settle();
    let status = sh(rig.oubli().arg("status"));
    rig.purge();
    let (now_store, now_vault) = snapshot(&rig, "after");
    let gone: Vec<usize> = removed
        .iter()
        .chain(&truncated)
        .chain(&overwritten)
        .copied()
        .chain(TREE)
        .collect();
    let kept: Vec<usize> = (0..60)
        .filter(|f| f % 4 == 0)
        .chain(overwritten.iter().map(|f| f + 100_000))
        .collect();
    let mut ask = gone.clone();
    ask.extend(&kept);
    let found = recoverable(&now_store, &now_vault, &ask);
    let leaked: Vec<usize> = gone.iter().copied().filter(|f| found[f]).collect();
    let blind: Vec<usize> = kept.iter().copied().filter(|f| !found[f]).collect();
    // Every kept file reads back intact.
    for f in (0..60).filter(|f| f % 4 == 0) {
        let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
        assert!(
            std::fs::read(&files[&f]).unwrap() == content(f, len),
            "file {f} differs"
        );
    }
    for f in &overwritten {
        assert!(std::fs::read(&files[f]).unwrap() == content(f + 100_000, 3000));
    }
    rig.umount();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck -fn after the deletions:\n{out}");
    (leaked, blind, rig, status)
}

#[test]
fn ext4_deletions_inferred_without_trim() {
    if !prerequisites() {
        return;
    }
    let (leaked, blind, rig, status) = scenario(true);
    eprintln!("status:\n{status}\nserver log:\n{}", rig.server_log());
    assert!(
        blind.is_empty(),
        "the adversary must read live files: {blind:?}"
    );
    assert!(
        leaked.is_empty(),
        "deleted files recoverable after the commit: {} of them, e.g. {:?}",
        leaked.len(),
        &leaked[..leaked.len().min(10)]
    );
    assert!(status.contains("deletions inferred (ext4)"), "{status}");
    assert!(
        status.contains("0 trims received"),
        "never trimmed: {status}"
    );
    // The audit (oracle: the ext4's own bitmaps) finds no free block the store still holds.
    let mut rig = rig;
    rig.detach();
    assert!(rig.stop_server());
    let (ok, out) = run(rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk"]));
    eprintln!("audit with inference: {out}");
    assert!(ok && out.contains("the store holds 0 of them"), "{out}");
    drop(rig);

    // Control: the same without inference leaves the deleted files readable.
    let (leaked, blind, rig, _) = scenario(false);
    assert!(blind.is_empty());
    eprintln!(
        "control: {} deleted files recoverable without --infer-deletes",
        leaked.len()
    );
    assert!(
        leaked.len() > 1000,
        "control: without inference the deleted files stay: {}",
        leaked.len()
    );
    // The audit lists what the file system freed (exit 10); --erase drops it.
    let mut rig = rig;
    rig.detach();
    assert!(rig.stop_server());
    let out = rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "audit without inference: {}",
        text.lines().next().unwrap_or("")
    );
    assert_eq!(out.status.code(), Some(10), "{text}");
    assert!(text.contains("LEAKED"), "{text}");
    let (ok, out) = run(rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk", "--erase"]));
    assert!(ok && out.contains("erased"), "{out}");
    let (ok, out) = run(rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk"]));
    assert!(ok && out.contains("the store holds 0 of them"), "{out}");
    let (s2, v2) = snapshot(&rig, "after-erase");
    let gone: Vec<usize> = (0..60).filter(|f| f % 4 != 0).chain(TREE).collect();
    let found = recoverable(&s2, &v2, &gone);
    let still: Vec<usize> = gone.iter().copied().filter(|f| found[f]).collect();
    assert!(still.is_empty(), "after audit --erase: {still:?}");
    // The file system is intact.
    rig.start_server();
    rig.attach();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck -fn after audit --erase:\n{out}");
    rig.mount("ro");
    for f in (0..60).filter(|f| f % 4 == 0) {
        let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
        let p = rig.path("mnt").join(format!("d{}/f{f}", f % 4));
        assert!(
            std::fs::read(p).unwrap() == content(f, len),
            "file {f} after audit --erase"
        );
    }
    drop(rig);
}

#[test]
fn infer_deletes_refuses_ext4_without_journal() {
    if !prerequisites() {
        return;
    }
    let mut rig = rig();
    sh(rig
        .oubli()
        .args(["init", "--kdf-memory", "8", "--kdf-iterations", "1"]));
    rig.start_server();
    rig.attach();
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-O", "^has_journal"])
        .arg(rig.dev()));
    rig.detach();
    assert!(rig.stop_server());
    let out = rig
        .oubli()
        .args(["serve", "--export", "disk", "--socket"])
        .arg(rig.path("nbd.sock"))
        .args(["--infer-deletes", "ext4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("without a journal"), "{err}");
    // Nothing was stored: served again without the flag, no inference.
    rig.start_server();
    assert!(!rig.server_log().contains("inferred"));
}

/// kill -9 of the server at random points of a workload, with inference on:
/// the file system crashes with it; after the restart the remount replays
/// ext4's journal through the new server (a fresh tracker). Synced files
/// stay intact and e2fsck is clean after every crash; at the end the audit
/// erases whatever the crashes left.
#[test]
fn kill_9_and_journal_replay_with_inference() {
    if !prerequisites() {
        return;
    }
    let mut rig = rig();
    sh(rig.oubli().args([
        "init",
        "--cell-size",
        "4K",
        "--kdf-memory",
        "8",
        "--kdf-iterations",
        "1",
    ]));
    rig.start_server_with(&["--infer-deletes", "ext4"]);
    rig.attach();
    sh(Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
        ])
        .arg(rig.dev()));
    let mnt = rig.path("mnt");
    rig.mount("nodiscard,commit=1,errors=remount-ro");
    let synced = write_tree(&mnt, 0..24);
    settle();
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..4 {
        let workload = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "i=0; while [ $i -lt 2000 ]; do head -c $(( (i % 7 + 1) * 9000 )) /dev/urandom > {m}/w{round}-$i || exit 0; \
                 [ $((i % 3)) -eq 0 ] && rm -f {m}/w{round}-$((i / 2)); i=$((i+1)); done",
                m = mnt.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300 + next() % 1500));
        rig.kill_server();
        let mut workload = workload;
        let _ = workload.kill();
        let _ = workload.wait();
        rig.detach();
        rig.start_server();
        rig.attach();
        rig.mount("nodiscard,commit=1,errors=remount-ro");
        for (f, path) in &synced {
            let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
            assert!(
                std::fs::read(path).unwrap() == content(*f, len),
                "round {round}: synced file {f} differs after kill -9 and replay"
            );
        }
        rig.umount();
        let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
        assert!(
            ok,
            "round {round}: e2fsck -fn after kill -9 and replay:\n{out}"
        );
        rig.mount("nodiscard,commit=1,errors=remount-ro");
        eprintln!(
            "round {round}: killed, replayed, {} synced files intact, e2fsck clean",
            synced.len()
        );
    }
    // Delete everything the rounds wrote and half of the synced files.
    for e in std::fs::read_dir(&mnt).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap().to_string_lossy().starts_with('w') {
            std::fs::remove_file(p).unwrap();
        }
    }
    for (f, path) in &synced {
        if f % 2 == 1 {
            std::fs::remove_file(path).unwrap();
        }
    }
    settle();
    std::fs::write(mnt.join("tick"), b"tick").unwrap();
    settle();
    let status = sh(rig.oubli().arg("status"));
    eprintln!(
        "{}",
        status
            .lines()
            .find(|l| l.starts_with("export"))
            .unwrap_or("")
    );
    rig.detach();
    assert!(rig.stop_server());
    let out = rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk"])
        .output()
        .unwrap();
    eprintln!(
        "audit after the crashes: {}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .next()
            .unwrap_or_default()
    );
    let (ok, out) = run(rig
        .oubli()
        .args(["audit", "--fs", "ext4", "--export", "disk", "--erase"]));
    assert!(ok, "{out}");
    let (s, v) = snapshot(&rig, "end");
    let gone: Vec<usize> = (0..24).filter(|f| f % 2 == 1).collect();
    let kept: Vec<usize> = (0..24).filter(|f| f % 2 == 0).collect();
    let mut ask = gone.clone();
    ask.extend(&kept);
    let found = recoverable(&s, &v, &ask);
    assert!(
        gone.iter().all(|f| !found[f]),
        "deleted synced files recoverable"
    );
    assert!(kept.iter().all(|f| found[f]), "kept files readable");
}
