//! `Timed`: a `Medium` wrapper that counts calls, bytes and wall time per kind of operation.
//!
//! The engine reaches storage only through the `Medium` trait, so wrapping
//! the real `DirMedium` splits every benchmark phase into time spent in the
//! medium (pwrite, pread, fsync, superblock replace) and time spent in the
//! engine itself (AEAD, tree, copies). Two `Instant::now` calls per medium
//! call cost far less than the smallest operation measured (a 4 KiB pwrite).

use oubli_core::{Medium, SegmentId, Slot};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The kinds of medium operation that are timed separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Append = 0,
    Read = 1,
    Sync = 2,
    Superblock = 3,
    Other = 4,
}

pub const KINDS: [(Kind, &str); 5] = [
    (Kind::Append, "append"),
    (Kind::Read, "read"),
    (Kind::Sync, "sync"),
    (Kind::Superblock, "superblock"),
    (Kind::Other, "other"),
];

#[derive(Default)]
struct Counter {
    calls: AtomicU64,
    nanos: AtomicU64,
    bytes: AtomicU64,
}

/// Calls, seconds and bytes of one kind of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpTotals {
    pub calls: u64,
    pub secs: f64,
    pub bytes: u64,
}

/// Totals of every kind at one moment; subtract two to get a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoSnapshot(pub [OpTotals; 5]);

impl IoSnapshot {
    pub fn get(&self, kind: Kind) -> OpTotals {
        self.0[kind as usize]
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &IoSnapshot) -> IoSnapshot {
        let mut out = IoSnapshot::default();
        for i in 0..out.0.len() {
            out.0[i] = OpTotals {
                calls: self.0[i].calls - earlier.0[i].calls,
                secs: self.0[i].secs - earlier.0[i].secs,
                bytes: self.0[i].bytes - earlier.0[i].bytes,
            };
        }
        out
    }

    /// Seconds spent inside the medium, all kinds together.
    pub fn total_secs(&self) -> f64 {
        self.0.iter().map(|t| t.secs).sum()
    }
}

/// A medium that forwards to `inner` and keeps per-kind totals.
pub struct Timed<M> {
    inner: M,
    counters: [Counter; 5],
}

impl<M: Medium> Timed<M> {
    pub fn new(inner: M) -> Self {
        Timed {
            inner,
            counters: Default::default(),
        }
    }

    pub fn snapshot(&self) -> IoSnapshot {
        let mut s = IoSnapshot::default();
        for (i, c) in self.counters.iter().enumerate() {
            s.0[i] = OpTotals {
                calls: c.calls.load(Ordering::Relaxed),
                secs: c.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
                bytes: c.bytes.load(Ordering::Relaxed),
            };
        }
        s
    }

    fn timed<T>(&self, kind: Kind, bytes: usize, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let c = &self.counters[kind as usize];
        c.nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        out
    }
}

impl<M: Medium> Medium for Timed<M> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn segment_capacity(&self) -> u64 {
        self.inner.segment_capacity()
    }
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.timed(Kind::Append, data.len(), || {
            self.inner.append(id, offset, data)
        })
    }
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let len = buf.len();
        self.timed(Kind::Read, len, || self.inner.read(id, offset, buf))
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.timed(Kind::Other, 0, || self.inner.segment_len(id))
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.timed(Kind::Other, 0, || self.inner.list_segments())
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.timed(Kind::Other, 0, || self.inner.delete_segment(id))
    }
    fn sync(&self) -> io::Result<()> {
        self.timed(Kind::Sync, 0, || self.inner.sync())
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.timed(Kind::Superblock, 0, || self.inner.read_superblock(slot))
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.timed(Kind::Superblock, data.len(), || {
            self.inner.write_superblock(slot, data)
        })
    }
    fn keeps_append_order(&self) -> bool {
        self.inner.keeps_append_order()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_media::MemMedium;

    #[test]
    fn counts_calls_and_bytes_per_kind() {
        let m = Timed::new(MemMedium::new());
        let before = m.snapshot();
        m.append(1, 0, b"hello").unwrap();
        m.append(1, 5, b"!").unwrap();
        let mut buf = [0u8; 3];
        m.read(1, 1, &mut buf).unwrap();
        assert_eq!(&buf, b"ell");
        m.sync().unwrap();
        let d = m.snapshot().since(&before);
        assert_eq!(d.get(Kind::Append).calls, 2);
        assert_eq!(d.get(Kind::Append).bytes, 6);
        assert_eq!(d.get(Kind::Read).bytes, 3);
        assert_eq!(d.get(Kind::Sync).calls, 1);
        assert_eq!(d.get(Kind::Superblock).calls, 0);
        assert!(d.total_secs() >= 0.0);
    }
}
