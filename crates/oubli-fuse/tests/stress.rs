//! Random operations through the mount against a reference model: writes, truncates, punches, renames, hard links, unlinks, pread and mmap reads, remounts.

mod common;
use common::*;
use oubli_media::SplitMix64;
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// Names map to inodes; inodes hold content (hard links share it).
#[derive(Default)]
struct Model {
    names: BTreeMap<String, usize>,
    inodes: Vec<Vec<u8>>,
}

impl Model {
    fn content(&self, name: &str) -> &Vec<u8> {
        &self.inodes[self.names[name]]
    }
    fn content_mut(&mut self, name: &str) -> &mut Vec<u8> {
        let i = self.names[name];
        &mut self.inodes[i]
    }
    fn links(&self, name: &str) -> usize {
        let i = self.names[name];
        self.names.values().filter(|&&j| j == i).count()
    }
}

const NAMES: &[&str] = &["a", "b", "c", "d", "sub/e", "sub/f", "sub/deeper/g", "h"];

fn mmap_read(path: &Path, len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    let f = File::open(path).unwrap();
    // SAFETY: FFI: a private read-only mapping of `len` bytes of an open file,
    // copied out and unmapped before the file can change.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let out = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        out
    }
}

fn verify(m: &Mounted, model: &Model, rng: &mut SplitMix64) {
    for name in NAMES {
        let p = m.path(name);
        match model.names.get(*name) {
            None => assert_eq!(
                errno(fs::metadata(&p)),
                libc::ENOENT,
                "{name} should not exist"
            ),
            Some(_) => {
                let want = model.content(name);
                let md = fs::metadata(&p).unwrap();
                assert_eq!(md.len(), want.len() as u64, "size of {name}");
                assert_eq!(md.nlink() as usize, model.links(name), "links of {name}");
                let got = if rng.coin() {
                    mmap_read(&p, want.len())
                } else {
                    fs::read(&p).unwrap()
                };
                if got != *want {
                    let at = got.iter().zip(want.iter()).position(|(a, b)| a != b);
                    panic!(
                        "content of {name} differs (len {} vs {}, first difference at {at:?})",
                        got.len(),
                        want.len()
                    );
                }
            }
        }
    }
}

#[test]
fn random_operations_match_the_model() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mut m = Mounted::new(store.clone(), default_options());
    fs::create_dir_all(m.path("sub/deeper")).unwrap();
    let seed = std::env::var("OUBLI_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0b11_f05e);
    let mut rng = SplitMix64::new(seed);
    let mut model = Model::default();
    let max = 3u64 << 20;
    let mut write_id = 0u64;
    for step in 0..3000 {
        let name = NAMES[rng.below(NAMES.len() as u64) as usize];
        let other = NAMES[rng.below(NAMES.len() as u64) as usize];
        let p = m.path(name);
        let exists = model.names.contains_key(name);
        match rng.below(100) {
            // write (creating the file if needed)
            0..=34 => {
                let off = rng.below(max);
                let len = match rng.below(4) {
                    0 => rng.below(64) + 1,
                    1 => rng.below(40_000) + 1,
                    2 => 32 * 1024 * (rng.below(4) + 1),
                    _ => rng.below(300_000) + 1,
                } as usize;
                write_id += 1;
                let data: Vec<u8> = (0..len)
                    .map(|i| (write_id as u8) ^ (i as u8).wrapping_mul(31))
                    .collect();
                let f = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&p)
                    .unwrap();
                f.write_all_at(&data, off).unwrap();
                if !exists {
                    model.inodes.push(Vec::new());
                    let idx = model.inodes.len() - 1;
                    model.names.insert(name.to_string(), idx);
                }
                let c = model.content_mut(name);
                let end = off as usize + len;
                if c.len() < end {
                    c.resize(end, 0);
                }
                c[off as usize..end].copy_from_slice(&data);
            }
            // truncate / extend
            35..=44 if exists => {
                let size = rng.below(max);
                OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_len(size)
                    .unwrap();
                model.content_mut(name).resize(size as usize, 0);
            }
            // punch a hole
            45..=52 if exists => {
                let len = model.content(name).len() as u64;
                if len == 0 {
                    continue;
                }
                let off = rng.below(len);
                let n = rng.below(len - off) + 1;
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                // SAFETY: FFI on an open descriptor.
                check(unsafe {
                    libc::fallocate(
                        f.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        off as i64,
                        n as i64,
                    )
                })
                .unwrap();
                model.content_mut(name)[off as usize..(off + n) as usize].fill(0);
            }
            // rename, replacing
            53..=62 if exists && name != other => {
                fs::rename(&p, m.path(other)).unwrap();
                // Between two links of one inode, rename does nothing (POSIX).
                if model.names.get(other) != model.names.get(name) {
                    let i = model.names.remove(name).unwrap();
                    model.names.insert(other.to_string(), i);
                }
            }
            // hard link
            63..=69 if exists && !model.names.contains_key(other) => {
                fs::hard_link(&p, m.path(other)).unwrap();
                let i = model.names[name];
                model.names.insert(other.to_string(), i);
            }
            // unlink
            70..=77 if exists => {
                fs::remove_file(&p).unwrap();
                model.names.remove(name);
            }
            // read a range
            78..=89 if exists => {
                let c = model.content(name);
                let off = rng.below(c.len() as u64 + 10);
                let n = rng.below(200_000) as usize;
                let mut buf = vec![0u8; n];
                let got = File::open(&p).unwrap().read_at(&mut buf, off).unwrap();
                let want_end = (off as usize + n).min(c.len());
                let want = if (off as usize) < c.len() {
                    &c[off as usize..want_end]
                } else {
                    &[][..]
                };
                assert_eq!(&buf[..got], want, "read {name} at {off}+{n}");
            }
            90..=95 => verify(&m, &model, &mut rng),
            // remount: everything must come back from the store
            96 => {
                m.unmount();
                m = Mounted::new(store.clone(), default_options());
                verify(&m, &model, &mut rng);
            }
            97 => m.session().purge().unwrap(),
            _ => {}
        }
        if step % 250 == 0 {
            verify(&m, &model, &mut rng);
        }
    }
    verify(&m, &model, &mut rng);
    m.unmount();
    let m = Mounted::new(store, default_options());
    verify(&m, &model, &mut rng);
}

/// Many threads on many files at once: the per-inode and namespace locks hold up.
#[test]
fn concurrent_writers() {
    if !fuse_available() {
        return;
    }
    let m = Mounted::new(mem_store(), default_options());
    std::thread::scope(|s| {
        for t in 0..6u8 {
            let dir = m.path(&format!("t{t}"));
            s.spawn(move || {
                fs::create_dir(&dir).unwrap();
                for i in 0..60u32 {
                    let p = dir.join(format!("f{i}"));
                    let data = vec![t ^ i as u8; 10_000 + i as usize * 300];
                    fs::write(&p, &data).unwrap();
                    if i % 3 == 0 {
                        fs::rename(&p, dir.join(format!("r{i}"))).unwrap();
                    } else if i % 3 == 1 {
                        fs::remove_file(&p).unwrap();
                    }
                }
            });
        }
    });
    for t in 0..6u8 {
        let n = fs::read_dir(m.path(&format!("t{t}"))).unwrap().count();
        assert_eq!(n, 40);
        assert_eq!(
            fs::read(m.path(&format!("t{t}/r3"))).unwrap(),
            vec![t ^ 3; 10_900]
        );
    }
}
