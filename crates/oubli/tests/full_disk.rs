//! A store on a file system that fills up (issue 39): writes fail cleanly (ENOSPC, NBD_ENOSPC, exit 9), deletes, commits, the cleaner and reopening still work from the reserve, and nothing accepted is lost silently — through `oubli put`, `oubli mount`, `oubli serve` and on a NAND image. Needs root (a small tmpfs holds the store).

mod common;

use common::{fuse_available, on_path, require, run, wait_for};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const PASSWORD: &str = "full disk";

/// A tmpfs of `size` mounted at `at`, unmounted (lazily) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (or a failure, without OUBLI_SKIP_EXTERNAL=1) when mounting
    /// is not allowed here.
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        fs::create_dir_all(at).unwrap();
        let (ok, out) = run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("oubli-full-disk")
            .arg(at));
        if !require(ok, &format!("mounting a tmpfs needs root: {out}")) {
            return None;
        }
        Some(Tmpfs(at.to_path_buf()))
    }

    /// Bytes the file system has free (statvfs `f_bavail`).
    fn avail(&self) -> u64 {
        avail(&self.0)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run(Command::new("umount").arg("-l").arg(&self.0));
    }
}

/// statvfs of `path`: `(f_blocks, f_bavail)` in bytes.
fn statvfs(path: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: FFI with a valid C string and a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    assert_eq!(rc, 0, "statvfs {}", path.display());
    // SAFETY: statvfs succeeded.
    let s = unsafe { s.assume_init() };
    (s.f_blocks * s.f_frsize, s.f_bavail * s.f_frsize)
}

fn avail(path: &Path) -> u64 {
    statvfs(path).1
}

/// A store (on a tmpfs, or a NAND image) and its vault beside it.
struct Env {
    dir: tempfile::TempDir,
    store: String,
    vault: PathBuf,
    tmpfs: Option<Tmpfs>,
}

impl Env {
    /// A store alone on a tmpfs of `size`.
    fn on_tmpfs(size: &str) -> Option<Env> {
        let dir = tempfile::tempdir().unwrap();
        let tmpfs = Tmpfs::mount(&dir.path().join("store"), size)?;
        let env = Env {
            store: tmpfs.0.display().to_string(),
            vault: dir.path().join("vault"),
            dir,
            tmpfs: Some(tmpfs),
        };
        env.ok(env
            .cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"]));
        Some(env)
    }

    /// A store and its vault on a simulated NAND chip of `geometry`.
    fn on_nand(geometry: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let env = Env {
            store: format!("nand:{}", dir.path().join("chip.img").display()),
            vault: "nand".into(),
            dir,
            tmpfs: None,
        };
        env.ok(env
            .cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"])
            .args(["--nand-geometry", geometry]));
        env
    }

    /// A store in a directory of a tmpfs of `size`, which other files
    /// (`self.tmpfs`'s path) may share: another program filling the disk.
    fn on_shared_tmpfs(size: &str) -> Option<Env> {
        let dir = tempfile::tempdir().unwrap();
        let tmpfs = Tmpfs::mount(&dir.path().join("fs"), size)?;
        let env = Env {
            store: tmpfs.0.join("store").display().to_string(),
            vault: dir.path().join("vault"),
            dir,
            tmpfs: Some(tmpfs),
        };
        env.ok(env
            .cmd()
            .args(["init", "--kdf-memory", "1", "--kdf-iterations", "1"]));
        Some(env)
    }

    /// A mount point for the store, and a guard that unmounts it (if
    /// mounted) when the test ends, failed or not.
    fn mount_point(&self) -> (PathBuf, Umount) {
        let mnt = self.path("mnt");
        fs::create_dir(&mnt).unwrap();
        let guard = Umount(
            mnt.clone(),
            vec![
                "OUBLI_STORE".into(),
                self.store.clone().into(),
                "OUBLI_VAULT".into(),
                self.vault.clone().into(),
                "OUBLI_PASSWORD".into(),
                PASSWORD.into(),
            ],
        );
        (mnt, guard)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oubli"));
        c.env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("OUBLI_STORE", &self.store)
            .env("OUBLI_VAULT", &self.vault)
            .env("OUBLI_PASSWORD", PASSWORD)
            .current_dir(self.dir.path());
        c
    }

    /// Runs `cmd` to its end (within a limit), reading its output meanwhile.
    fn output(&self, cmd: &mut Command) -> Output {
        let shown = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(child.wait_with_output()));
        match rx.recv_timeout(common::LIMIT) {
            Ok(out) => out.unwrap(),
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("{shown} did not finish");
            }
        }
    }

    /// Runs `cmd`, which must succeed; returns its stdout.
    fn ok(&self, cmd: &mut Command) -> String {
        let shown = format!("{cmd:?}");
        let o = self.output(cmd);
        assert!(
            o.status.success(),
            "{shown}: {:?}\n{}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `oubli put NAME` of `data`; the exit code and stderr.
    fn put(&self, name: &str, data: &[u8]) -> (Option<i32>, String) {
        let src = self.path("src");
        fs::write(&src, data).unwrap();
        let o = self.output(self.cmd().arg("put").arg(name).arg(&src));
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn get(&self, name: &str) -> Vec<u8> {
        let o = self.output(self.cmd().args(["get", name, "-"]));
        assert!(
            o.status.success(),
            "get {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }
}

/// Runs `oubli umount` on its mount point when dropped.
struct Umount(PathBuf, Vec<std::ffi::OsString>);

impl Drop for Umount {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_oubli"))
            .env_clear()
            .envs(self.1.chunks(2).map(|p| (&p[0], &p[1])))
            .arg("umount")
            .arg(&self.0)
            .output();
    }
}

/// Pseudo-random bytes (xorshift): nothing compresses or repeats.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Puts files of `size` until `oubli put` fails; returns the names stored.
/// The failure must be exit 9 with the medium's "full" message.
fn put_until_full(env: &Env, size: usize, limit: usize) -> Vec<(String, u64)> {
    let mut stored = Vec::new();
    for i in 0..limit {
        let name = format!("f{i}");
        let (code, err) = env.put(&name, &noise(size, i as u64));
        match code {
            Some(0) => stored.push((name, i as u64)),
            Some(9) => {
                assert!(
                    err.contains("full") && err.contains("oubli rm"),
                    "exit 9 without saying full and what to do: {err}"
                );
                return stored;
            }
            other => panic!("put {name}: exit {other:?}: {err}"),
        }
    }
    panic!("{limit} puts of {size} bytes never filled the store");
}

/// Asserts that each stored `(name, seed)` reads back as the `size` bytes
/// of noise it was put with.
fn assert_reads_back<'a>(
    env: &Env,
    size: usize,
    files: impl IntoIterator<Item = &'a (String, u64)>,
) {
    for (name, seed) in files {
        assert!(
            env.get(name) == noise(size, *seed),
            "{name} reads back wrong"
        );
    }
}

/// On the full store: deletes the stored files up to the middle but the
/// first (the caller deleted it already), then collects and commits.
fn rm_half_gc_and_commit(env: &Env, stored: &[(String, u64)]) {
    for (name, _) in &stored[1..stored.len() / 2] {
        env.ok(env.cmd().arg("rm").arg(name));
    }
    env.ok(env.cmd().arg("gc"));
    env.ok(env.cmd().arg("commit"));
}

/// The CLI on a store whose file system fills: `put` exits 9 and stores
/// nothing, everything stored before reads back, `status` warns, `rm`,
/// `gc` and `commit` work on the full store, and `put` works again.
#[test]
fn cli_on_a_full_file_system() {
    let Some(env) = Env::on_tmpfs("48m") else {
        return;
    };
    let size = 1 << 20;
    let stored = put_until_full(&env, size, 100);
    assert!(stored.len() >= 20, "only {} files fit", stored.len());
    // The failed put left no name behind, and did not poison anything.
    let ls = env.ok(env.cmd().arg("ls"));
    assert!(!ls.contains(&format!("f{}", stored.len())), "{ls}");
    assert_reads_back(&env, size, [&stored[0], stored.last().unwrap()]);
    // Deleting on the full store (and `status` warns while it is full).
    env.ok(env.cmd().arg("rm").arg(&stored[0].0));
    let status = env.ok(env.cmd().arg("status"));
    assert!(status.contains("nearly full"), "no warning in:\n{status}");
    let json = env.ok(env.cmd().args(["status", "--json"]));
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(json["space"]["reserve"].as_u64().unwrap() > 0, "{json}");
    // Collecting and committing on the full store.
    rm_half_gc_and_commit(&env, &stored);
    let before = env.tmpfs.as_ref().unwrap().avail();
    // Writes resume, and what is left reads back.
    for i in 0..4 {
        let (code, err) = env.put(&format!("again{i}"), &noise(size, 1000 + i));
        assert_eq!(
            code,
            Some(0),
            "put after rm+gc+commit (free {before}): {err}"
        );
    }
    assert_reads_back(&env, size, &stored[stored.len() / 2..]);
    env.ok(env.cmd().arg("fsck"));
}

/// The same on a NAND image that fills up: `put` exits 9, `rm`, `gc` and
/// `commit` work, `put` works again, and the chip's free space is what
/// `status` counts.
#[test]
fn cli_on_a_full_nand_image() {
    // 2 KiB pages, 16 per block, 256 blocks: an 8 MiB chip.
    let env = Env::on_nand("2048x16x256");
    let size = 256 << 10;
    let stored = put_until_full(&env, size, 64);
    assert!(stored.len() >= 8, "only {} files fit", stored.len());
    assert_reads_back(&env, size, [&stored[0], stored.last().unwrap()]);
    env.ok(env.cmd().arg("rm").arg(&stored[0].0));
    let status = env.ok(env.cmd().arg("status"));
    assert!(status.contains("nearly full"), "no warning in:\n{status}");
    rm_half_gc_and_commit(&env, &stored);
    for i in 0..2 {
        let (code, err) = env.put(&format!("again{i}"), &noise(size, 1000 + i));
        assert_eq!(code, Some(0), "put after rm+gc+commit: {err}");
    }
    assert_reads_back(&env, size, &stored[stored.len() / 2..]);
    env.ok(env.cmd().arg("fsck"));
}

/// Writes `data` to `path` without fsync; whether open, write and close
/// all succeeded.
fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(data)?;
    // close(2) reports a failed write-back too (the FUSE flush).
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: FFI on a descriptor this function owns.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `oubli mount` on a store whose file system fills: writes without fsync
/// until ENOSPC, every file closed without error survives the unmount
/// (or the unmount fails), statfs leaves the reserve out, files are
/// removed on the full mount, a commit works, writes resume without a
/// remount, and the full store mounts again.
#[test]
fn mount_on_a_full_file_system() {
    if !fuse_available() {
        return;
    }
    let Some(env) = Env::on_tmpfs("64m") else {
        return;
    };
    let (mnt, _guard) = env.mount_point();
    let metrics = env.path("metrics.prom");
    env.ok(env
        .cmd()
        .arg("mount")
        .arg(&mnt)
        .arg("--metrics-file")
        .arg(&metrics));
    let size = 1 << 20;
    let mut written = Vec::new();
    let failed = loop {
        let i = written.len();
        assert!(i < 200, "200 MiB fit on a 64 MiB file system");
        match write_file(&mnt.join(format!("f{i}")), &noise(size, i as u64)) {
            Ok(()) => written.push(i),
            Err(e) => break e,
        }
    };
    assert_eq!(failed.raw_os_error(), Some(libc::ENOSPC), "{failed}");
    assert!(written.len() >= 20, "only {} files fit", written.len());
    let (_, free) = statvfs(&mnt);
    assert!(
        free < 2 << 20,
        "statfs says {free} bytes free on a full store"
    );
    // Deleting on the full mount, and a commit.
    for i in &written[..written.len() / 2] {
        fs::remove_file(mnt.join(format!("f{i}"))).unwrap();
    }
    env.ok(env.cmd().arg("commit").arg(&mnt));
    // Writes resume without a remount once the cleaner returned the space.
    let again = mnt.join("again");
    wait_for("writes to resume", || {
        let ok = write_file(&again, &noise(4 * size, 77)).is_ok();
        if !ok {
            let _ = env.output(env.cmd().arg("commit").arg(&mnt));
        }
        ok
    });
    // The metrics (written at each commit) carry the reserve.
    let text = fs::read_to_string(&metrics).unwrap();
    let reserve = text
        .lines()
        .find(|l| l.starts_with("oubli_space_reserve_bytes{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(reserve.is_some_and(|r| r >= (2 << 20) as f64), "{text}");
    let o = env.output(env.cmd().arg("umount").arg(&mnt));
    assert!(
        o.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // The full store mounts again, and every file closed without error is there.
    env.ok(env.cmd().arg("mount").arg(&mnt));
    for i in &written[written.len() / 2..] {
        let got = fs::read(mnt.join(format!("f{i}"))).unwrap_or_default();
        assert!(got == noise(size, *i as u64), "f{i} lost after the unmount");
    }
    assert!(fs::read(&again).unwrap() == noise(4 * size, 77));
    // statfs leaves the reserve out.
    let host = env.tmpfs.as_ref().unwrap().avail();
    let (_, free) = statvfs(&mnt);
    assert!(
        free + (2 << 20) <= host,
        "statfs says {free} bytes free, the file system under the store {host}: the reserve is counted"
    );
    // Fill it again, then unmount and mount the full store.
    let mut i = 1000;
    while write_file(&mnt.join(format!("g{i}")), &noise(size, i)).is_ok() {
        i += 1;
        assert!(i < 1200, "never full again");
    }
    env.ok(env.cmd().arg("umount").arg(&mnt));
    env.ok(env.cmd().arg("mount").arg(&mnt));
    for j in 1000..i {
        let got = fs::read(mnt.join(format!("g{j}"))).unwrap_or_default();
        assert!(got == noise(size, j), "g{j} lost after the unmount");
    }
    env.ok(env.cmd().arg("umount").arg(&mnt));
    env.ok(env.cmd().arg("fsck"));
}

/// Writes `data` to `path` and fsyncs it; whether every step succeeded.
fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Fills the file system under `dir` with the file `dir/hog` (another
/// program's, outside the store) until it reports ENOSPC.
fn hog(dir: &Path) -> PathBuf {
    let path = dir.join("hog");
    let mut f = fs::File::create(&path).unwrap();
    let zeros = vec![0u8; 64 << 10];
    loop {
        match f.write(&zeros) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    path
}

/// `oubli mount` on a store whose file system another program fills past
/// the reserve (issue 39 item 1): writes and fsync on the mount get
/// ENOSPC, `oubli commit MNT` exits 9, `rm` works on the full mount; once
/// the other program's file is gone, writes, `rm` and commits work again
/// without a remount, the unmount exits 0, and everything fsynced or
/// closed without error is there after a remount.
#[test]
fn mount_when_another_program_fills_the_disk() {
    if !fuse_available() {
        return;
    }
    let Some(env) = Env::on_shared_tmpfs("64m") else {
        return;
    };
    let (mnt, _guard) = env.mount_point();
    env.ok(env.cmd().arg("mount").arg(&mnt));
    let size = 1 << 20;
    for i in 0..4u64 {
        write_synced(&mnt.join(format!("a{i}")), &noise(size, i)).unwrap();
    }
    // Small files closed without fsync: their data may still be buffered.
    for i in 0..4u64 {
        write_file(&mnt.join(format!("b{i}")), &noise(20 << 10, 10 + i)).unwrap();
    }
    let fs_root = env.tmpfs.as_ref().unwrap().0.clone();
    let hog = hog(&fs_root);
    // The disk is full: writes and fsync get ENOSPC.
    let err = write_synced(&mnt.join("c0"), &noise(size, 20)).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let o = env.output(env.cmd().arg("commit").arg(&mnt));
    assert_eq!(
        o.status.code(),
        Some(9),
        "commit on the full disk: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Not poisoned: reads, and a delete.
    assert!(fs::read(mnt.join("a1")).unwrap() == noise(size, 1));
    fs::remove_file(mnt.join("a0")).unwrap();
    // The other program's file goes: everything resumes on this mount.
    fs::remove_file(&hog).unwrap();
    write_synced(&mnt.join("c1"), &noise(size, 21)).unwrap();
    fs::remove_file(mnt.join("a2")).unwrap();
    env.ok(env.cmd().arg("commit").arg(&mnt));
    write_file(&mnt.join("c2"), &noise(size, 22)).unwrap();
    let o = env.output(env.cmd().arg("umount").arg(&mnt));
    assert!(
        o.status.success(),
        "umount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    env.ok(env.cmd().arg("mount").arg(&mnt));
    for gone in ["a0", "a2"] {
        assert!(!mnt.join(gone).exists(), "{gone} is back");
    }
    assert!(fs::read(mnt.join("a1")).unwrap() == noise(size, 1));
    assert!(fs::read(mnt.join("a3")).unwrap() == noise(size, 3));
    for i in 0..4u64 {
        let got = fs::read(mnt.join(format!("b{i}"))).unwrap_or_default();
        assert!(got == noise(20 << 10, 10 + i), "b{i} lost");
    }
    assert!(fs::read(mnt.join("c1")).unwrap() == noise(size, 21));
    assert!(fs::read(mnt.join("c2")).unwrap() == noise(size, 22));
    env.ok(env.cmd().arg("umount").arg(&mnt));
    env.ok(env.cmd().arg("fsck"));
}

/// `oubli serve` of an export larger than the file system under its
/// store: once that fills, the client's writes fail with ENOSPC (the
/// server's NBD_ENOSPC), earlier data reads back, TRIM still works and
/// frees the space, writes resume, and the server commits at its exit.
#[test]
fn serve_on_a_full_file_system() {
    if !require(on_path("qemu-io"), "qemu-io is missing (qemu-utils)") {
        return;
    }
    let Some(env) = Env::on_tmpfs("48m") else {
        return;
    };
    let server = Served::start(&env);
    let io = |cmds: &[String]| server.io(&env, cmds);
    // 1 MiB writes, each followed by a flush, until one fails.
    let mut filled = 0u64;
    let failure = loop {
        assert!(filled < 256, "256 MiB fit on a 48 MiB file system");
        let (ok, out) = io(&[
            format!("write -P {} {}M 1M", filled % 200 + 1, filled),
            "flush".into(),
        ]);
        if !ok {
            break out;
        }
        filled += 1;
    };
    assert!(
        failure.contains("No space left on device"),
        "the write failed otherwise: {failure}"
    );
    assert!(filled >= 16, "only {filled} MiB fit");
    // What was written reads back; the server still serves.
    let (ok, out) = io(&[
        "read -P 1 0 1M".into(),
        format!("read -P {} {}M 1M", (filled - 1) % 200 + 1, filled - 1),
    ]);
    assert!(ok, "{out}");
    // TRIM the first half, commit, and writes resume.
    let half = filled / 2;
    let (ok, out) = io(&[format!("discard 0 {half}M"), "flush".into()]);
    assert!(ok, "discard on a full store: {out}");
    env.ok(env.cmd().arg("commit"));
    wait_for("writes to resume", || {
        let (ok, _) = io(&["write -P 222 0 4M".into(), "flush".into()]);
        if !ok {
            let _ = env.output(env.cmd().arg("commit"));
        }
        ok
    });
    let (ok, out) = io(&[
        "read -P 222 0 4M".into(),
        format!("read -P 0 4M {}M", half - 4),
        format!("read -P {} {}M 1M", half % 200 + 1, half),
    ]);
    assert!(ok, "{out}");
    server.stop();
    env.ok(env.cmd().arg("fsck"));
}

/// `oubli serve --export disk --size 256M` of `env`'s store, on a Unix
/// socket; killed when dropped.
struct Served {
    child: std::process::Child,
    uri: String,
    log: PathBuf,
}

impl Served {
    fn start(env: &Env) -> Served {
        let sock = env.path("nbd.sock");
        let log = env.path("serve.log");
        let child = env
            .cmd()
            .args(["serve", "--export", "disk", "--size", "256M", "--socket"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let served = Served {
            child,
            uri: format!("nbd+unix:///disk?socket={}", sock.display()),
            log,
        };
        wait_for("the socket", || {
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        served
    }

    /// Runs `qemu-io` commands against the export: whether all went
    /// well, and what it said.
    fn io(&self, env: &Env, cmds: &[String]) -> (bool, String) {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]).arg(&self.uri);
        for cmd in cmds {
            c.args(["-c", cmd]);
        }
        let o = env.output(&mut c);
        let out =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        (o.status.success() && !out.contains("failed"), out)
    }

    /// SIGTERM, and the server must exit 0 (it commits on the way out).
    fn stop(mut self) {
        let pid = self.child.id();
        run(Command::new("kill").args(["-TERM", &pid.to_string()]));
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(start.elapsed() < common::LIMIT, "serve ignored SIGTERM");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "serve exited {status}: {}",
            fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `oubli serve` whose store's disk another program fills past the
/// reserve (issue 39 item 1): a write and flush from the client fail with
/// ENOSPC (NBD_ENOSPC) and do not poison the store; once the other file
/// is gone, writes and flushes succeed on the same server, TRIM works, the
/// server exits 0, and every flushed write reads back after a restart.
#[test]
fn serve_when_another_program_fills_the_disk() {
    if !require(on_path("qemu-io"), "qemu-io is missing (qemu-utils)") {
        return;
    }
    let Some(env) = Env::on_shared_tmpfs("48m") else {
        return;
    };
    let server = Served::start(&env);
    let io = |cmds: &[String]| server.io(&env, cmds);
    let (ok, out) = io(&["write -P 1 0 4M".into(), "flush".into()]);
    assert!(ok, "{out}");
    let hog = hog(&env.tmpfs.as_ref().unwrap().0);
    let (ok, out) = io(&["write -P 2 8M 4M".into(), "flush".into()]);
    assert!(
        !ok && out.contains("No space left on device"),
        "a write on the full disk: {out}"
    );
    // Not poisoned: reads, and TRIM.
    let (ok, out) = io(&[
        "read -P 1 0 4M".into(),
        "discard 2M 1M".into(),
        "flush".into(),
    ]);
    assert!(ok, "{out}");
    fs::remove_file(&hog).unwrap();
    let (ok, out) = io(&["write -P 3 16M 4M".into(), "flush".into()]);
    assert!(ok, "a write once the space is back: {out}");
    env.ok(env.cmd().arg("commit"));
    let (ok, out) = io(&[
        "read -P 1 0 2M".into(),
        "read -P 0 2M 1M".into(),
        "read -P 1 3M 1M".into(),
        "read -P 3 16M 4M".into(),
    ]);
    assert!(ok, "{out}");
    server.stop();
    let server = Served::start(&env);
    let (ok, out) = server.io(
        &env,
        &[
            "read -P 1 0 2M".into(),
            "read -P 0 2M 1M".into(),
            "read -P 3 16M 4M".into(),
        ],
    );
    assert!(ok, "after a restart: {out}");
    server.stop();
    env.ok(env.cmd().arg("fsck"));
}
