//! The FUSE metadata kept in each object's `meta`: a versioned, compact encoding of POSIX attributes (docs/FORMAT.md, "FUSE metadata").

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// First byte of every FUSE metadata record: tells it apart from the JSON the CLI writes and from empty metadata.
pub const MAGIC: u8 = 0xF5;
/// Encoding version (second byte).
pub const VERSION: u8 = 1;

const TAG_SYMLINK: u64 = 1;
const TAG_XATTR: u64 = 2;
const TAG_FS: u64 = 3;
const TAG_PREALLOC: u64 = 4;
/// Preallocated ranges a file's record keeps at most.
const MAX_PREALLOC_RANGES: usize = 64;

/// The file-type bits of `st_mode`.
pub const S_IFMT: u32 = libc::S_IFMT;
pub const S_IFDIR: u32 = libc::S_IFDIR;
pub const S_IFREG: u32 = libc::S_IFREG;
pub const S_IFLNK: u32 = libc::S_IFLNK;

/// A point in time as stored: seconds since the Unix epoch (may be negative) and nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// The time a change made now is stamped with: the kernel's coarse
    /// clock (`CLOCK_REALTIME_COARSE`, which moves once a tick), the clock
    /// the kernel stamps its own changes with (`current_time`) — the file
    /// times it keeps under the writeback cache, and every local file
    /// system's. A file created and written within one tick then keeps the
    /// times its creation gave it, so the kernel has no new ones to send at
    /// close (one `SETATTR` less per new file); with a finer clock here, the
    /// kernel's first write stamped a time up to a tick *before* the
    /// creation and sent it back.
    pub fn now() -> Timestamp {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: FFI: clock_gettime writes one timespec into `ts`, which
        // outlives the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
            return Timestamp::from_system(SystemTime::now());
        }
        Timestamp {
            secs: ts.tv_sec,
            nanos: ts.tv_nsec as u32,
        }
    }

    pub fn from_system(t: SystemTime) -> Timestamp {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                // Before 1970: floor the seconds so nanos stay in 0..1e9.
                let d = e.duration();
                let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Timestamp { secs, nanos }
            }
        }
    }

    pub fn to_system(self) -> SystemTime {
        if self.secs >= 0 {
            UNIX_EPOCH + Duration::new(self.secs as u64, self.nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(self.secs.unsigned_abs())
                + Duration::from_nanos(self.nanos as u64)
        }
    }
}

/// File-system-wide state kept in the root directory's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FsRecord {
    /// The directory object listing files unlinked while open (erased at the next mount after a crash).
    pub orphans: u64,
    /// Set while mounted, cleared by a clean unmount.
    pub mounted: bool,
}

/// The POSIX attributes of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
    pub rdev: u32,
    /// Directories: the object id of the parent directory (for `..`); 0 otherwise.
    pub parent: u64,
    pub symlink: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub fs: Option<FsRecord>,
    /// Byte ranges `[start, end)` of a regular file preallocated with
    /// `fallocate`, ascending and disjoint, inside the file's size: they
    /// count in `st_blocks` (with the ranges that hold cells) and read as
    /// zeros; nothing is stored for them.
    pub prealloc: Vec<(u64, u64)>,
    /// Fields of a later version this one does not know: kept as they are.
    pub unknown: Vec<(u64, Vec<u8>)>,
    /// Decoded from metadata another front-end wrote (or none): defaults were used.
    pub foreign: bool,
    /// Another front-end's object (not the CLI's, not bare): shown read-only,
    /// never changed through the mount, its metadata never rewritten.
    pub protected: bool,
}

impl Attr {
    /// Fresh attributes for a new object of `mode`, owned by `uid:gid`, with all times `now`.
    pub fn new(mode: u32, uid: u32, gid: u32, now: Timestamp) -> Attr {
        Attr {
            mode,
            uid,
            gid,
            nlink: if mode & S_IFMT == S_IFDIR { 2 } else { 1 },
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            rdev: 0,
            parent: 0,
            symlink: None,
            xattrs: BTreeMap::new(),
            fs: None,
            prealloc: Vec::new(),
            unknown: Vec::new(),
            foreign: false,
            protected: false,
        }
    }

    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }

    /// Decodes `meta`. Metadata this front-end did not write is shown as a
    /// regular file — or, for `root`, a directory — owned by `owner`: the
    /// CLI's (JSON) or none at all as `0644`, taken over when the object is
    /// changed here; any other front-end's (the NBD exports) as a protected
    /// `0444`.
    pub fn decode(meta: &[u8], is_root: bool, owner: (u32, u32)) -> Result<Attr, String> {
        if meta.len() < 2 || meta[0] != MAGIC {
            let plain = is_root || meta.is_empty() || meta[0] == b'{';
            let mode = if is_root {
                S_IFDIR | 0o755
            } else if plain {
                S_IFREG | 0o644
            } else {
                S_IFREG | 0o444
            };
            // The CLI records the source's modification time as `"mtime":SECONDS`.
            let t = Timestamp {
                secs: json_number(meta, b"\"mtime\":").unwrap_or(0),
                nanos: 0,
            };
            let mut a = Attr::new(mode, owner.0, owner.1, t);
            a.foreign = true;
            a.protected = !plain;
            if is_root {
                a.parent = 1;
            }
            return Ok(a);
        }
        if meta[1] != VERSION {
            return Err(format!(
                "FUSE metadata version {} is not supported",
                meta[1]
            ));
        }
        let mut r = Reader { buf: &meta[2..] };
        let mode = r.u32()?;
        let uid = r.u32()?;
        let gid = r.u32()?;
        let nlink = r.u32()?;
        let atime = r.time()?;
        let mtime = r.time()?;
        let ctime = r.time()?;
        let btime = r.time()?;
        let rdev = r.u32()?;
        let parent = r.varint()?;
        let mut a = Attr {
            mode,
            uid,
            gid,
            nlink,
            atime,
            mtime,
            ctime,
            btime,
            rdev,
            parent,
            symlink: None,
            xattrs: BTreeMap::new(),
            fs: None,
            prealloc: Vec::new(),
            unknown: Vec::new(),
            foreign: false,
            protected: false,
        };
        while !r.buf.is_empty() {
            let tag = r.varint()?;
            let len = r.varint()? as usize;
            let body = r.take(len)?;
            match tag {
                TAG_SYMLINK => a.symlink = Some(body.to_vec()),
                TAG_XATTR => {
                    let mut b = Reader { buf: body };
                    let n = b.varint()? as usize;
                    let name = b.take(n)?.to_vec();
                    a.xattrs.insert(name, b.buf.to_vec());
                }
                TAG_FS => {
                    let mut b = Reader { buf: body };
                    let orphans = b.varint()?;
                    let flags = b.varint()?;
                    a.fs = Some(FsRecord {
                        orphans,
                        mounted: flags & 1 != 0,
                    });
                }
                TAG_PREALLOC => {
                    let mut b = Reader { buf: body };
                    let mut at = 0u64;
                    while !b.buf.is_empty() {
                        // Each range as (gap from the previous end, length).
                        let start = at
                            .checked_add(b.varint()?)
                            .ok_or("FUSE metadata: preallocated range out of range")?;
                        let end = start
                            .checked_add(b.varint()?)
                            .filter(|&e| e > start)
                            .ok_or("FUSE metadata: bad preallocated range")?;
                        a.prealloc.push((start, end));
                        at = end;
                    }
                }
                other => a.unknown.push((other, body.to_vec())),
            }
        }
        Ok(a)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(48);
        w.push(MAGIC);
        w.push(VERSION);
        for v in [self.mode, self.uid, self.gid, self.nlink] {
            varint(&mut w, v as u64);
        }
        for t in [self.atime, self.mtime, self.ctime, self.btime] {
            varint(&mut w, zigzag(t.secs));
            varint(&mut w, t.nanos as u64);
        }
        varint(&mut w, self.rdev as u64);
        varint(&mut w, self.parent);
        if let Some(target) = &self.symlink {
            field(&mut w, TAG_SYMLINK, target);
        }
        for (name, value) in &self.xattrs {
            let mut body = Vec::with_capacity(name.len() + value.len() + 2);
            varint(&mut body, name.len() as u64);
            body.extend_from_slice(name);
            body.extend_from_slice(value);
            field(&mut w, TAG_XATTR, &body);
        }
        if let Some(fs) = &self.fs {
            let mut body = Vec::new();
            varint(&mut body, fs.orphans);
            varint(&mut body, fs.mounted as u64);
            field(&mut w, TAG_FS, &body);
        }
        if !self.prealloc.is_empty() {
            let mut body = Vec::new();
            let mut at = 0;
            for &(start, end) in &self.prealloc {
                varint(&mut body, start - at);
                varint(&mut body, end - start);
                at = end;
            }
            field(&mut w, TAG_PREALLOC, &body);
        }
        for (tag, body) in &self.unknown {
            field(&mut w, *tag, body);
        }
        w
    }

    /// Adds `[start, end)` to the preallocated ranges (merging neighbours).
    pub fn preallocate(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // Ranges that touch or overlap the new one merge into it.
        self.prealloc.retain(|&(a, b)| {
            let apart = b < s || a > e;
            if !apart {
                s = s.min(a);
                e = e.max(b);
            }
            apart
        });
        let at = self.prealloc.partition_point(|&(a, _)| a < s);
        self.prealloc.insert(at, (s, e));
        // The record is rewritten with every attribute change: a file
        // preallocated in many scattered pieces keeps a bounded list, the
        // closest neighbours joined (st_blocks then counts their gap too).
        while self.prealloc.len() > MAX_PREALLOC_RANGES {
            let i = (1..self.prealloc.len())
                .min_by_key(|&i| self.prealloc[i].0 - self.prealloc[i - 1].1)
                .expect("more than one range");
            self.prealloc[i - 1].1 = self.prealloc[i].1;
            self.prealloc.remove(i);
        }
    }

    /// Removes `[start, end)` from the preallocated ranges (a punched or
    /// zeroed range, or everything past a truncation); whether any changed.
    pub fn unpreallocate(&mut self, start: u64, end: u64) -> bool {
        let mut changed = false;
        let mut kept = Vec::with_capacity(self.prealloc.len() + 1);
        for &(a, b) in &self.prealloc {
            if b <= start || a >= end {
                kept.push((a, b));
                continue;
            }
            changed = true;
            if a < start {
                kept.push((a, start));
            }
            if b > end {
                kept.push((end, b));
            }
        }
        self.prealloc = kept;
        changed
    }

    /// Bytes the extended attributes take (names and values).
    pub fn xattr_bytes(&self) -> usize {
        self.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum()
    }
}

/// The non-negative integer right after `key` in `bytes`, if any.
fn json_number(bytes: &[u8], key: &[u8]) -> Option<i64> {
    let at = bytes.windows(key.len()).position(|w| w == key)? + key.len();
    let digits: Vec<u8> = bytes[at..]
        .iter()
        .skip_while(|b| **b == b' ')
        .take_while(|b| b.is_ascii_digit())
        .copied()
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

fn field(w: &mut Vec<u8>, tag: u64, body: &[u8]) {
    varint(w, tag);
    varint(w, body.len() as u64);
    w.extend_from_slice(body);
}

fn varint(w: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        w.push((v as u8) | 0x80);
        v >>= 7;
    }
    w.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or("FUSE metadata truncated")?;
            self.buf = rest;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("FUSE metadata: varint too long".into())
    }

    fn u32(&mut self) -> Result<u32, String> {
        u32::try_from(self.varint()?).map_err(|_| "FUSE metadata: value out of range".into())
    }

    fn time(&mut self) -> Result<Timestamp, String> {
        let secs = unzigzag(self.varint()?);
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err("FUSE metadata: nanoseconds out of range".into());
        }
        Ok(Timestamp { secs, nanos })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err("FUSE metadata truncated".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Attr {
        let mut a = Attr::new(
            S_IFREG | 0o4755,
            1000,
            100,
            Timestamp {
                secs: 1_700_000_000,
                nanos: 123,
            },
        );
        a.atime = Timestamp {
            secs: -5,
            nanos: 999_999_999,
        };
        a.nlink = 3;
        a.rdev = 0x0801;
        a.xattrs.insert(b"user.a".to_vec(), b"1".to_vec());
        a.xattrs.insert(b"user.empty".to_vec(), Vec::new());
        a
    }

    #[test]
    fn round_trip() {
        let mut a = sample();
        assert_eq!(Attr::decode(&a.encode(), false, (0, 0)).unwrap(), a);
        a.mode = S_IFLNK | 0o777;
        a.symlink = Some(b"../target".to_vec());
        a.fs = Some(FsRecord {
            orphans: 7,
            mounted: true,
        });
        a.unknown.push((99, b"future".to_vec()));
        a.prealloc = vec![(0, 4096), (10_000, 1 << 40)];
        assert_eq!(Attr::decode(&a.encode(), false, (0, 0)).unwrap(), a);
    }

    #[test]
    fn preallocated_ranges_merge_and_split() {
        let mut a = sample();
        a.preallocate(100, 200);
        a.preallocate(300, 400);
        a.preallocate(0, 50);
        assert_eq!(a.prealloc, [(0, 50), (100, 200), (300, 400)]);
        a.preallocate(200, 300); // touches both neighbours
        assert_eq!(a.prealloc, [(0, 50), (100, 400)]);
        a.preallocate(40, 120);
        assert_eq!(a.prealloc, [(0, 400)]);
        assert!(a.unpreallocate(100, 150));
        assert_eq!(a.prealloc, [(0, 100), (150, 400)]);
        assert!(!a.unpreallocate(100, 150));
        assert!(a.unpreallocate(350, u64::MAX));
        assert_eq!(a.prealloc, [(0, 100), (150, 350)]);
        assert!(a.unpreallocate(0, u64::MAX));
        assert!(a.prealloc.is_empty());
        // An empty or backwards range adds nothing.
        a.preallocate(5, 5);
        assert!(a.prealloc.is_empty());
        // Scattered pieces: the list stays bounded, the closest joined.
        for i in 0..1000u64 {
            a.preallocate(i * 100, i * 100 + 10 + i % 7);
        }
        assert_eq!(a.prealloc.len(), MAX_PREALLOC_RANGES);
        assert_eq!(a.prealloc[0].0, 0);
        assert_eq!(a.prealloc.last().unwrap().1, 99_900 + 10 + 999 % 7);
        assert!(a.prealloc.windows(2).all(|w| w[0].1 < w[1].0));
    }

    #[test]
    fn malformed_preallocated_ranges_are_errors() {
        let mut bytes = sample().encode();
        // A range of length 0.
        bytes.extend_from_slice(&[TAG_PREALLOC as u8, 2, 5, 0]);
        assert!(Attr::decode(&bytes, false, (0, 0)).is_err());
    }

    #[test]
    fn compact() {
        // A typical file: mode, ids, nlink, four times, rdev, parent.
        let a = Attr::new(S_IFREG | 0o644, 1000, 1000, Timestamp::now());
        assert!(a.encode().len() <= 56, "{}", a.encode().len());
    }

    #[test]
    fn foreign_metadata_gets_defaults() {
        let a = Attr::decode(br#"{"kind":"file","mtime":5}"#, false, (7, 8)).unwrap();
        assert!(a.foreign);
        assert_eq!((a.mode, a.uid, a.gid, a.nlink), (S_IFREG | 0o644, 7, 8, 1));
        assert_eq!(a.mtime.secs, 5);
        assert!(!a.protected);
        let root = Attr::decode(b"", true, (0, 0)).unwrap();
        assert!(root.is_dir() && root.foreign && !root.protected);
        let nbd = Attr::decode(b"oubli-nbd export v1", false, (0, 0)).unwrap();
        assert!(nbd.protected && nbd.mode == S_IFREG | 0o444);
    }

    #[test]
    fn damaged_metadata_is_an_error_not_a_panic() {
        let bytes = sample().encode();
        for cut in 2..bytes.len() {
            let _ = Attr::decode(&bytes[..cut], false, (0, 0));
        }
        assert!(Attr::decode(&[MAGIC, 9], false, (0, 0)).is_err());
    }

    #[test]
    fn timestamps_before_1970() {
        let t = UNIX_EPOCH - Duration::new(3, 250_000_000);
        let ts = Timestamp::from_system(t);
        assert_eq!(
            ts,
            Timestamp {
                secs: -4,
                nanos: 750_000_000
            }
        );
        assert_eq!(ts.to_system(), t);
    }
}
