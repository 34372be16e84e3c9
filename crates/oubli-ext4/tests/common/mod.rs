//! Shared helpers: ext4 images made with mkfs.ext4 under /tmp, dumpe2fs as the oracle, and a jbd2 block builder.
#![allow(dead_code)]

use oubli_ext4::crc32c_raw;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn skip_external() -> bool {
    std::env::var("OUBLI_SKIP_EXTERNAL").is_ok_and(|v| v == "1")
}

/// Fails (or, with OUBLI_SKIP_EXTERNAL=1, returns false) when a tool is missing.
pub fn require(tool: &str, package: &str) -> bool {
    let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(tool).is_file());
    if found {
        return true;
    }
    if skip_external() {
        eprintln!("SKIPPED (OUBLI_SKIP_EXTERNAL=1): {tool} missing (Debian package {package})");
        return false;
    }
    panic!(
        "{tool} is missing: install the Debian package {package} (or set OUBLI_SKIP_EXTERNAL=1)"
    );
}

pub fn tmpdir(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("oubli-ext4-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

/// Makes an image of `size` bytes with `mkfs.ext4 -F -q ARGS`.
pub fn mkfs(path: &Path, size: u64, args: &[&str]) -> Vec<u8> {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    drop(f);
    let mut c = Command::new("mkfs.ext4");
    c.args(["-F", "-q", "-E", "nodiscard"]).args(args).arg(path);
    run(&mut c);
    std::fs::read(path).unwrap()
}

/// Free blocks according to dumpe2fs (ranges, [first, end)).
pub fn dumpe2fs_free(path: &Path) -> Vec<(u64, u64)> {
    let text = run(Command::new("dumpe2fs").arg(path));
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(list) = line.strip_prefix("  Free blocks: ") else {
            continue;
        };
        for part in list.split(", ").filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()),
                None => {
                    let a = part.parse::<u64>().unwrap();
                    (a, a)
                }
            };
            out.push((a, b + 1));
        }
    }
    out.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in out {
        match merged.last_mut() {
            Some(l) if l.1 == a => l.1 = b,
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// A reader over an image held in memory (reads past the end give zeros).
pub fn reader(img: &[u8]) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + '_ {
    move |off, buf| {
        buf.fill(0);
        let off = off as usize;
        if off < img.len() {
            let n = buf.len().min(img.len() - off);
            buf[..n].copy_from_slice(&img[off..off + n]);
        }
        Ok(())
    }
}

pub const MAGIC: u32 = 0xC03B_3998;

/// Builds jbd2 blocks for a journal with the given incompat features.
#[derive(Clone)]
pub struct Jbd {
    pub bs: usize,
    pub incompat: u32,
    pub uuid: [u8; 16],
}

impl Jbd {
    pub fn csum(&self) -> bool {
        self.incompat & 0x18 != 0
    }
    pub fn v3(&self) -> bool {
        self.incompat & 0x10 != 0
    }
    pub fn is64(&self) -> bool {
        self.incompat & 0x2 != 0
    }
    pub fn seed(&self) -> u32 {
        crc32c_raw(!0, &self.uuid)
    }
    fn header(&self, ty: u32, seq: u32) -> Vec<u8> {
        let mut b = vec![0u8; self.bs];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&ty.to_be_bytes());
        b[8..12].copy_from_slice(&seq.to_be_bytes());
        b
    }
    /// A v2 journal superblock from `old` with these features, `start` and `sequence`.
    pub fn superblock(&self, old: &[u8], seq: u32, start: u32) -> Vec<u8> {
        let mut b = old.to_vec();
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&4u32.to_be_bytes());
        b[0x18..0x1C].copy_from_slice(&seq.to_be_bytes());
        b[0x1C..0x20].copy_from_slice(&start.to_be_bytes());
        b[0x28..0x2C].copy_from_slice(&self.incompat.to_be_bytes());
        b[0x30..0x40].copy_from_slice(&self.uuid);
        b
    }
    pub fn tag_csum(&self, seq: u32, data: &[u8]) -> u32 {
        crc32c_raw(crc32c_raw(self.seed(), &seq.to_be_bytes()), data)
    }
    fn tail(&self, b: &mut [u8]) {
        if self.csum() {
            let n = b.len();
            b[n - 4..].fill(0);
            let c = crc32c_raw(self.seed(), b);
            b[n - 4..].copy_from_slice(&c.to_be_bytes());
        }
    }
    /// A descriptor for (home, copy as written to the log, escaped) tags.
    pub fn descriptor(&self, seq: u32, tags: &[(u64, &[u8], bool)]) -> Vec<u8> {
        let mut b = self.header(1, seq);
        let mut off = 12;
        for (i, &(home, copy, escaped)) in tags.iter().enumerate() {
            let mut flags: u32 = if i > 0 { 2 } else { 0 }; // SAME_UUID after the first
            if escaped {
                flags |= 1;
            }
            if i + 1 == tags.len() {
                flags |= 8;
            }
            let sum = self.tag_csum(seq, copy);
            if self.v3() {
                b[off..off + 4].copy_from_slice(&(home as u32).to_be_bytes());
                b[off + 4..off + 8].copy_from_slice(&flags.to_be_bytes());
                b[off + 8..off + 12].copy_from_slice(&((home >> 32) as u32).to_be_bytes());
                b[off + 12..off + 16].copy_from_slice(&sum.to_be_bytes());
                off += 16;
            } else {
                b[off..off + 4].copy_from_slice(&(home as u32).to_be_bytes());
                if self.incompat & 0x8 != 0 {
                    b[off + 4..off + 6].copy_from_slice(&(sum as u16).to_be_bytes());
                }
                b[off + 6..off + 8].copy_from_slice(&(flags as u16).to_be_bytes());
                let mut sz = 12;
                if self.incompat & 0x8 != 0 {
                    sz += 2;
                }
                if self.is64() {
                    b[off + 8..off + 12].copy_from_slice(&((home >> 32) as u32).to_be_bytes());
                } else {
                    sz -= 4;
                }
                off += sz;
            }
            if flags & 2 == 0 {
                b[off..off + 16].copy_from_slice(&self.uuid);
                off += 16;
            }
        }
        self.tail(&mut b);
        b
    }
    pub fn commit(&self, seq: u32) -> Vec<u8> {
        let mut b = self.header(2, seq);
        if self.csum() {
            b[0xC] = 4; // crc32c
            b[0xD] = 4;
            let mut z = b.clone();
            z[0xC..0x14].fill(0);
            let c = crc32c_raw(self.seed(), &z);
            b[0x10..0x14].copy_from_slice(&c.to_be_bytes());
        }
        b
    }
    pub fn revoke(&self, seq: u32, homes: &[u64]) -> Vec<u8> {
        let mut b = self.header(5, seq);
        let rs = if self.is64() { 8 } else { 4 };
        let mut off = 16;
        for &h in homes {
            if rs == 8 {
                b[off..off + 8].copy_from_slice(&h.to_be_bytes());
            } else {
                b[off..off + 4].copy_from_slice(&(h as u32).to_be_bytes());
            }
            off += rs;
        }
        b[12..16].copy_from_slice(&(off as u32).to_be_bytes());
        self.tail(&mut b);
        b
    }
}
