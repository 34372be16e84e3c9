//! Real jbd2 traffic from the kernel: an ext4 image served by nbdkit (a shell plugin that records every write, in order, with its data), mounted through nbdfuse + a loop device without discard, under data=ordered and data=writeback; the recorded writes replayed through the tracker with its drops applied. After every phase (the file system unmounted, so the image is its state): no block in use differs from the real image (live blocks dropped = 0), `e2fsck -fn` of the replayed image is clean, and the free blocks still holding data (missed deletes) are counted — 0 at the end.
//!
//! Needs root, /dev/fuse, nbdkit, nbdfuse (libnbd-bin), e2fsprogs, util-linux.

mod common;
use common::*;
use oubli_ext4::{free_space, Ext4Tracker};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc_getuid() == 0 }
}
extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

struct Served {
    dir: PathBuf,
    nbdkit: Child,
    fuse: Child,
    loopdev: String,
    mnt: PathBuf,
}

fn sh(cmd: &str) -> String {
    run(Command::new("sh").arg("-c").arg(cmd))
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("timed out waiting for {what}");
}

impl Served {
    fn start(dir: &Path) -> Served {
        let img = dir.join("img");
        let script = dir.join("rec.sh");
        std::fs::write(
            &script,
            format!(
                r#"#!/bin/bash
case "$1" in
  get_size) stat -c %s {img} ;;
  pread) dd if={img} iflag=skip_bytes,count_bytes skip=$4 count=$3 status=none ;;
  pwrite) echo "$4 $3" >> {idx}; tee -a {dat} | dd of={img} oflag=seek_bytes conv=notrunc seek=$4 status=none ;;
  can_write|can_flush|flush) exit 0 ;;
  thread_model) echo serialize_all_requests ;;
  *) exit 2 ;;
esac
"#,
                img = img.display(),
                idx = dir.join("idx").display(),
                dat = dir.join("dat").display()
            ),
        )
        .unwrap();
        sh(&format!("chmod +x {}", script.display()));
        let sock = dir.join("sock");
        let nbdkit = Command::new("nbdkit")
            .args(["-U"])
            .arg(&sock)
            .args(["-f", "sh"])
            .arg(&script)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("nbdkit's socket", || sock.exists());
        let fusedir = dir.join("fuse");
        std::fs::create_dir_all(&fusedir).unwrap();
        let fuse = Command::new("nbdfuse")
            .arg(&fusedir)
            .arg("--unix")
            .arg(&sock)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        wait_for("nbdfuse", || fusedir.join("nbd").exists());
        let loopdev = sh(&format!(
            "losetup -f --show {}",
            fusedir.join("nbd").display()
        ))
        .trim()
        .to_string();
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        Served {
            dir: dir.to_path_buf(),
            nbdkit,
            fuse,
            loopdev,
            mnt,
        }
    }
    fn mount(&self, opts: &str) {
        sh(&format!(
            "mount -o commit=1,noinit_itable,{opts} {} {}",
            self.loopdev,
            self.mnt.display()
        ));
    }
    fn umount(&self) {
        sh(&format!("umount {}", self.mnt.display()));
    }
    fn writes(&self) -> usize {
        std::fs::read_to_string(self.dir.join("idx")).map_or(0, |s| s.lines().count())
    }
    fn stop(mut self) {
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(self.dir.join("fuse"))
            .status();
        let _ = self.fuse.wait();
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }
}

fn settle() {
    sh("sync");
    std::thread::sleep(Duration::from_millis(1500));
}

/// A file's content: a unique marker repeated.
fn marked(tag: &str, len: usize) -> Vec<u8> {
    let m = format!("<<MARK:{tag}>>");
    m.as_bytes().iter().copied().cycle().take(len).collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn phases(s: &Served, mode: &str, rng: &mut Rng) -> Vec<(String, usize)> {
    let m = &s.mnt;
    let mut marks = Vec::new();
    let mut phase = |name: &str, s: &Served, f: &mut dyn FnMut()| {
        s.mount(mode);
        f();
        settle();
        s.umount();
        marks.push((name.to_string(), s.writes()));
    };
    phase("create 300 marked files", s, &mut || {
        for i in 0..300 {
            std::fs::write(
                m.join(format!("f{i}")),
                marked(&format!("f{i}"), 3000 + i * 97),
            )
            .unwrap();
        }
    });
    phase("rm, truncate, overwrite", s, &mut || {
        for i in 0..100 {
            std::fs::remove_file(m.join(format!("f{i}"))).unwrap();
        }
        for i in 100..150 {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(m.join(format!("f{i}")))
                .unwrap();
            f.set_len(100).unwrap();
        }
        for i in 150..200 {
            // Overwrite by rename of a new file over the old one.
            let t = m.join(format!("t{i}"));
            std::fs::write(&t, marked(&format!("new{i}"), 5000)).unwrap();
            std::fs::rename(&t, m.join(format!("f{i}"))).unwrap();
        }
    });
    phase("tree of 2000 files, then rm -rf", s, &mut || {
        for d in 0..20 {
            let dd = m.join(format!("tree/d{d}"));
            std::fs::create_dir_all(&dd).unwrap();
            for f in 0..100 {
                std::fs::write(
                    dd.join(format!("s{f}.c")),
                    marked(&format!("tree{d}/{f}"), 600 + f * 40),
                )
                .unwrap();
            }
        }
        sh("sync");
        std::fs::remove_dir_all(m.join("tree")).unwrap();
    });
    // Five steps of 120 random operations each, the file system unmounted
    // (and checked) after every step; files live on across steps.
    let mut live: Vec<String> = Vec::new();
    for r in 0..5 {
        phase(
            &format!("random step {r}: create, append, truncate, rm, rename, fallocate, punch"),
            s,
            &mut || {
                for step in 0..120 {
                    let op = rng.below(8);
                    match op {
                        0 | 1 => {
                            let n = format!("r{r}-{step}");
                            std::fs::write(m.join(&n), marked(&n, 1 + rng.below(40000) as usize))
                                .unwrap();
                            live.push(n);
                        }
                        _ if live.is_empty() => {}
                        2 => {
                            use std::io::Write;
                            let n = &live[rng.below(live.len() as u64) as usize];
                            let mut f = std::fs::OpenOptions::new()
                                .append(true)
                                .open(m.join(n))
                                .unwrap();
                            f.write_all(&marked(&format!("{n}+"), 1 + rng.below(20000) as usize))
                                .unwrap();
                        }
                        3 => {
                            let n = &live[rng.below(live.len() as u64) as usize];
                            let f = std::fs::OpenOptions::new()
                                .write(true)
                                .open(m.join(n))
                                .unwrap();
                            f.set_len(rng.below(10000)).unwrap();
                        }
                        4 => {
                            let i = rng.below(live.len() as u64) as usize;
                            std::fs::remove_file(m.join(live.swap_remove(i))).unwrap();
                        }
                        5 => {
                            let i = rng.below(live.len() as u64) as usize;
                            let to = format!("{}x", live[i]);
                            std::fs::rename(m.join(&live[i]), m.join(&to)).unwrap();
                            live[i] = to;
                        }
                        6 => {
                            let n = &live[rng.below(live.len() as u64) as usize];
                            sh(&format!(
                                "fallocate -o {} -l {} {}",
                                rng.below(50000),
                                1 + rng.below(50000),
                                m.join(n).display()
                            ));
                        }
                        _ => {
                            let n = &live[rng.below(live.len() as u64) as usize];
                            sh(&format!(
                                "fallocate -p -o {} -l {} {}",
                                rng.below(30000),
                                1 + rng.below(30000),
                                m.join(n).display()
                            ));
                        }
                    }
                    if step % 50 == 49 {
                        settle();
                    }
                }
            },
        );
    }
    phase("settle (one more commit)", s, &mut || {
        std::fs::write(m.join("last"), b"x").unwrap();
    });
    marks
}

/// (files compared, files that differ or are missing) between two dumps.
fn compare_trees(a: &Path, b: &Path) -> (usize, usize) {
    let (mut n, mut bad) = (0, 0);
    let mut stack = vec![a.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(a).unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
                continue;
            }
            n += 1;
            if std::fs::read(&p).ok() != std::fs::read(b.join(rel)).ok() {
                eprintln!("differs: {}", rel.display());
                bad += 1;
            }
        }
    }
    (n, bad)
}

fn replay(dir: &Path, base: &[u8], marks: &[(String, usize)], label: &str) {
    let idx = std::fs::read_to_string(dir.join("idx")).unwrap();
    let dat = std::fs::read(dir.join("dat")).unwrap();
    let mut raw = base.to_vec();
    let mut model = base.to_vec();
    let mut t = Ext4Tracker::load(&mut reader(&model), model.len() as u64).unwrap();
    let mut pos = 0usize;
    let mut lines = idx.lines().enumerate();
    let mut dropped_blocks = 0u64;
    for (pi, (name, upto)) in marks.iter().enumerate() {
        for (_, line) in lines
            .by_ref()
            .take(upto - if pi == 0 { 0 } else { marks[pi - 1].1 })
        {
            let (o, n) = line.split_once(' ').unwrap();
            let (o, n): (usize, usize) = (o.parse().unwrap(), n.parse().unwrap());
            let data = &dat[pos..pos + n];
            pos += n;
            raw[o..o + n].copy_from_slice(data);
            model[o..o + n].copy_from_slice(data);
            let obs = t.observe_write(o as u64, data);
            for &(a, b) in &obs.freed {
                model[a as usize..b as usize].fill(0);
                dropped_blocks += 1;
            }
            if obs.relearn {
                let m2 = model.clone();
                let _ = t.relearn(&mut reader(&m2));
            }
            for n in obs.notes {
                eprintln!("{label}: note: {n}");
            }
        }
        // The file system is unmounted: the raw image is its state.
        let free = free_space(&mut reader(&raw), raw.len() as u64)
            .unwrap()
            .unwrap();
        let bs = free.block_size as usize;
        let mut live_dropped = 0;
        let mut missed = 0;
        for b in 0..free.blocks_count as usize {
            let (r, m) = (&raw[b * bs..(b + 1) * bs], &model[b * bs..(b + 1) * bs]);
            if free.is_free(b as u64) {
                if m.iter().any(|&x| x != 0) {
                    missed += 1;
                }
            } else if r != m {
                live_dropped += 1;
            }
        }
        let c = t.counters();
        eprintln!(
            "{label}: {name}: {upto} writes; free blocks still holding data (missed deletes) {missed}; freed_inferred {}, suspicious_kept {} (now {}), commits {} (incomplete {}, unanchored {}), quiesced {}",
            c.freed_inferred, c.suspicious_kept, c.suspicious_now, c.commits, c.commits_incomplete, c.commits_unanchored, c.quiesced
        );
        // Blocks in use may legitimately differ where they hold no file data
        // (fallocated, unwritten extents keep stale bytes that read as zeros):
        // the files themselves are the test.
        let f = dir.join("model.img");
        std::fs::write(&f, &model).unwrap();
        let r = dir.join("raw.img");
        std::fs::write(&r, &raw).unwrap();
        let out = Command::new("e2fsck")
            .args(["-fn"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{label}: {name}: e2fsck -fn on the replayed image: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let (dm, dr) = (dir.join("dump-model"), dir.join("dump-raw"));
        for (img, d) in [(&f, &dm), (&r, &dr)] {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir_all(d).unwrap();
            run(Command::new("debugfs")
                .arg("-R")
                .arg(format!("rdump / {}", d.display()))
                .arg(img));
        }
        let (files, differ) = compare_trees(&dr, &dm);
        eprintln!("{label}: {name}: {files} files compared, {differ} differ; in-use blocks with other bytes {live_dropped}");
        assert_eq!(differ, 0, "{label}: {name}: a live file lost data");
        if pi + 1 == marks.len() {
            assert_eq!(
                missed, 0,
                "{label}: deleted data left in free blocks at the end"
            );
        }
    }
    assert!(dropped_blocks > 0);
}

#[test]
fn kernel_traffic_ordered_and_writeback() {
    if !require("nbdkit", "nbdkit")
        || !require("nbdfuse", "libnbd-bin")
        || !require("mkfs.ext4", "e2fsprogs")
        || !require("losetup", "util-linux")
    {
        return;
    }
    if !is_root() || !Path::new("/dev/fuse").exists() {
        assert!(
            skip_external(),
            "needs root and /dev/fuse (or OUBLI_SKIP_EXTERNAL=1)"
        );
        return;
    }
    for (label, size, mkfs_args, mode) in [
        (
            "1k data=ordered",
            96u64 << 20,
            &["-b", "1024"][..],
            "data=ordered",
        ),
        (
            "4k data=writeback",
            192u64 << 20,
            &["-b", "4096"][..],
            "data=writeback",
        ),
    ] {
        let dir = tmpdir(&format!("kernel-{}", &label[..2]));
        let base = mkfs(&dir.join("img"), size, mkfs_args);
        let s = Served::start(&dir);
        let mut rng = Rng(0x5EED ^ size);
        let marks =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| phases(&s, mode, &mut rng)));
        if marks.is_err() {
            let _ = Command::new("umount").arg(&s.mnt).status();
        }
        s.stop();
        let marks = marks.unwrap();
        replay(&dir, &base, &marks, label);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
