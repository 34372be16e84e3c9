//! ext4 on `oubli serve`: nbdfuse + losetup + mkfs.ext4, deletions with `-o discard` and with fstrim erased at the next commit (checked by an adversary with the current vault), e2fsck clean, and a kill -9 mid-workload whose remount replays the journal.
//!
//! Needs root (losetup, mount), /dev/fuse and the Debian packages libnbd-bin
//! (nbdfuse), e2fsprogs, fuse3, util-linux and mount. A missing piece fails
//! the test with the package to install, unless OUBLI_SKIP_EXTERNAL=1.
mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn ext4_on_oubli_serve_erases_deleted_files() {
    let root = run(Command::new("id").arg("-u")).1.trim() == "0";
    if !require(root, "this test needs root (losetup, mount)") {
        return;
    }
    for (tool, package) in [
        ("nbdfuse", "libnbd-bin"),
        ("fusermount3", "fuse3"),
        ("mkfs.ext4", "e2fsprogs"),
        ("e2fsck", "e2fsprogs"),
        ("losetup", "mount"),
        ("fstrim", "util-linux"),
        ("mount", "mount"),
    ] {
        if !require(
            on_path(tool),
            &format!("`{tool}` is not installed: apt-get install -y {package} (see scripts/apt-packages)"),
        ) {
            return;
        }
    }
    if !require(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing (load the fuse module)",
    ) {
        return;
    }
    let mut rig = Rig {
        dir: tempfile::tempdir().unwrap(),
        server: None,
        nbdfuse: None,
        loopdev: None,
        mounted: false,
        serves: 0,
    };
    sh(rig
        .oubli()
        .args(["init", "--kdf-memory", "8", "--kdf-iterations", "1"]));
    rig.start_server();
    rig.attach();
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .arg(rig.dev()));
    let mnt = rig.path("mnt");

    // Phase 1: online discard (-o discard).
    rig.mount("discard,errors=remount-ro");
    let files = write_tree(&mnt, 0..40);
    sync();
    rig.purge();
    let (old_store, old_vault) = snapshot(&rig, "before-rm");
    let gone1: Vec<usize> = (0..40).filter(|f| f % 4 == 1).collect();
    sh(Command::new("rm").arg("-r").arg(mnt.join("d1")));
    sync();
    rig.purge();

    // Phase 2: batched discard (mounted without it, then fstrim).
    rig.umount();
    rig.mount("nodiscard,errors=remount-ro");
    let gone2: Vec<usize> = (0..40).filter(|f| f % 4 == 3 && f % 5 != 0).collect();
    for f in &gone2 {
        std::fs::remove_file(&files[f]).unwrap();
    }
    sync();
    // Without a discard the device cannot know: after a commit the deleted
    // files are still there for the adversary. fstrim is what erases them.
    rig.purge();
    let (untrimmed, untrimmed_vault) = snapshot(&rig, "before-fstrim");
    let before = recoverable(&untrimmed, &untrimmed_vault, &gone2);
    assert!(
        before.values().all(|found| *found),
        "control: before fstrim the deleted files are still on the device"
    );
    let trimmed = sh(Command::new("fstrim").arg("-v").arg(&mnt));
    assert!(trimmed.contains("trimmed"), "{trimmed}");
    rig.purge();
    let (now_store, now_vault) = snapshot(&rig, "after-purge");

    let kept: Vec<usize> = (0..40)
        .filter(|f| !gone1.contains(f) && !gone2.contains(f))
        .collect();
    let all: Vec<usize> = (0..40).collect();
    let found = recoverable(&now_store, &now_vault, &all);
    let leaked: Vec<_> = gone1.iter().chain(&gone2).filter(|f| found[f]).collect();
    assert!(
        leaked.is_empty(),
        "deleted files recoverable after the commit: {leaked:?}"
    );
    let missing: Vec<_> = kept.iter().filter(|f| !found[f]).collect();
    assert!(
        missing.is_empty(),
        "the adversary must read live files (it is not blind): {missing:?}"
    );
    // The old copy of the store opens nothing under the current key...
    let old_now = recoverable(&old_store, &now_vault, &all);
    assert!(old_now.values().all(|found| !found));
    // ...but with the old vault it does (so the check above can fail).
    let old_old = recoverable(&old_store, &old_vault, &gone1);
    assert!(
        old_old.values().all(|found| *found),
        "control: the old vault must open the old copy"
    );

    rig.umount();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck after the deletions:\n{out}");

    // Phase 3: kill -9 in the middle of a workload; acknowledged (synced)
    // files survive, and the remount replays ext4's journal.
    rig.mount("discard,errors=remount-ro");
    let synced = write_tree(&mnt, 100..120);
    sync();
    let workload = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "i=0; while [ $i -lt 400 ]; do head -c 65536 /dev/zero > {}/w$i || exit 0; i=$((i+1)); done",
            mnt.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    rig.kill_server();
    let mut workload = workload;
    let _ = workload.kill();
    let _ = workload.wait();
    rig.detach();

    rig.start_server();
    // The socket answers a moment before the server says where it started.
    wait_for("the restarted server's first line", || {
        rig.server_log().contains("at epoch")
    });
    rig.attach();
    rig.mount("discard,errors=remount-ro");
    for (f, path) in synced.iter().chain(kept.iter().map(|f| (f, &files[f]))) {
        let len = [100, 4096, 5000, 70_000, 333_333][f % 5] + f;
        assert!(
            std::fs::read(path).unwrap() == content(*f, len),
            "file {f} differs after the crash"
        );
    }
    rig.umount();
    let (ok, out) = run(Command::new("e2fsck").args(["-f", "-n"]).arg(rig.dev()));
    assert!(ok, "e2fsck after the crash and journal replay:\n{out}");
    rig.detach();
    assert!(rig.stop_server(), "oubli serve exits 0 on SIGTERM");
    let status = sh(rig.oubli().args(["status", "--json"]));
    assert!(
        status.contains("\"pending_deletions\": 0") || status.contains("\"pending_deletions\":0"),
        "{status}"
    );
}
