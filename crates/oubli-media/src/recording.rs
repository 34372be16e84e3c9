//! `RecordingMedium`: a wrapper that remembers every byte ever written, for adversary tests.
//!
//! Secure deletion in oubli must hold even against someone who kept every
//! version of the medium (SSD remapping, snapshots, backups). This wrapper
//! plays that adversary: it logs every successful mutating call with its
//! payload, forever, so a test can hand an attacker every superblock
//! version, every segment byte including deleted segments, and any past
//! state of the whole medium.
//!
//! Only calls the inner medium accepted are logged. To also capture the
//! prefix of a torn write, put the recorder *inside* a
//! [`FaultMedium`](crate::FaultMedium) (the fault wrapper forwards the torn
//! prefix as an ordinary, successful write).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use oubli_core::{Medium, SegmentId, Slot};

use crate::mem::MemMedium;
use crate::op::Op;

/// Wraps a medium and logs every mutating operation. See module docs.
#[derive(Debug)]
pub struct RecordingMedium<M: Medium> {
    inner: M,
    log: Mutex<Vec<Op>>,
}

impl<M: Medium> RecordingMedium<M> {
    /// Starts recording `inner`. The log covers only what happens from now
    /// on, so wrap a freshly created medium to capture a store's whole life.
    pub fn new(inner: M) -> Self {
        RecordingMedium {
            inner,
            log: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The wrapped medium.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Unwraps the medium, dropping the log.
    pub fn into_inner(self) -> M {
        self.inner
    }

    /// The full operation log, in the order the operations took effect.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().clone()
    }

    /// Number of logged operations (the valid range of [`state_at`](Self::state_at) is `0..=op_count()`).
    pub fn op_count(&self) -> usize {
        self.lock().len()
    }

    /// Every superblock version ever written, oldest first.
    pub fn every_superblock(&self) -> Vec<(Slot, Vec<u8>)> {
        self.lock()
            .iter()
            .filter_map(|op| match op {
                Op::Superblock { slot, data } => Some((*slot, data.to_vec())),
                _ => None,
            })
            .collect()
    }

    /// All bytes ever written to each segment id, deleted segments
    /// included, laid out at the offsets they were written to: where a
    /// [`rewrite`](Medium::rewrite) wrote over appended bytes, the last
    /// version ([`every_segment_as_appended`](Self::every_segment_as_appended)
    /// has the first).
    pub fn every_segment(&self) -> BTreeMap<SegmentId, Vec<u8>> {
        self.segments_with(true)
    }

    /// [`every_segment`](Self::every_segment) with each byte as it was
    /// first appended, before any rewrite.
    pub fn every_segment_as_appended(&self) -> BTreeMap<SegmentId, Vec<u8>> {
        self.segments_with(false)
    }

    /// Whether any rewrite was logged.
    pub fn rewrote(&self) -> bool {
        self.lock()
            .iter()
            .any(|op| matches!(op, Op::Rewrite { .. }))
    }

    fn segments_with(&self, rewrites: bool) -> BTreeMap<SegmentId, Vec<u8>> {
        let mut out: BTreeMap<SegmentId, Vec<u8>> = BTreeMap::new();
        for op in self.lock().iter() {
            let written = match op {
                Op::Append { id, offset, data } => Some((id, offset, data)),
                Op::Rewrite { id, offset, data } if rewrites => Some((id, offset, data)),
                _ => None,
            };
            if let Some((id, offset, data)) = written {
                let seg = out.entry(*id).or_default();
                let start = *offset as usize;
                let end = start + data.len();
                if seg.len() < end {
                    seg.resize(end, 0);
                }
                seg[start..end].copy_from_slice(data);
            }
        }
        out
    }

    /// The medium as it looked after the first `n` logged operations
    /// (clamped to the log's length): writes up to the last sync among them
    /// are durable, later ones pending, so the result can be crashed too.
    pub fn state_at(&self, n: usize) -> MemMedium {
        let log = self.lock();
        let n = n.min(log.len());
        let state = MemMedium::from_ops(self.inner.segment_capacity(), &log[..n]);
        if self.inner.keeps_append_order() {
            state.in_order()
        } else {
            state
        }
    }

    /// Sum of all payload bytes ever written (appends and superblocks).
    pub fn total_bytes_written(&self) -> u64 {
        self.lock().iter().map(|op| op.payload_len() as u64).sum()
    }

    /// Runs `f` on the inner medium and logs `op` if it succeeded. The log
    /// lock is held across the call so the log order is the order in which
    /// the operations took effect.
    fn record(&self, op: Op, f: impl FnOnce(&M) -> io::Result<()>) -> io::Result<()> {
        let mut log = self.lock();
        f(&self.inner)?;
        log.push(op);
        Ok(())
    }
}

impl<M: Medium> Medium for RecordingMedium<M> {
    fn describe(&self) -> String {
        format!("recording({})", self.inner.describe())
    }

    fn segment_capacity(&self) -> u64 {
        self.inner.segment_capacity()
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        let data: Arc<[u8]> = Arc::from(data);
        let op = Op::Append {
            id,
            offset,
            data: data.clone(),
        };
        self.record(op, |m| m.append(id, offset, &data))
    }

    fn can_rewrite(&self) -> bool {
        self.inner.can_rewrite()
    }

    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        self.inner.space()
    }

    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        let data: Arc<[u8]> = Arc::from(data);
        let op = Op::Rewrite {
            id,
            offset,
            data: data.clone(),
        };
        self.record(op, |m| m.rewrite(id, offset, &data))
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read(id, offset, buf)
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.inner.segment_len(id)
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.inner.list_segments()
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.record(Op::Delete { id }, |m| m.delete_segment(id))
    }

    fn sync(&self) -> io::Result<()> {
        self.record(Op::Sync, |m| m.sync())
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.inner.read_superblock(slot)
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        let data: Arc<[u8]> = Arc::from(data);
        let op = Op::Superblock {
            slot,
            data: data.clone(),
        };
        self.record(op, |m| m.write_superblock(slot, &data))
    }

    fn keeps_append_order(&self) -> bool {
        self.inner.keeps_append_order()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fault, FaultMedium, TearMode};

    #[test]
    fn keeps_what_a_rewrite_wrote_over() {
        let m = RecordingMedium::new(FaultMedium::new(MemMedium::new()));
        m.append(1, 0, b"first-").unwrap();
        assert!(!m.rewrote());
        m.rewrite(1, 0, b"FIRST").unwrap();
        assert!(m.rewrote());
        assert_eq!(m.every_segment()[&1], b"FIRST-");
        assert_eq!(m.every_segment_as_appended()[&1], b"first-");
        let replayed = m.state_at(m.op_count()).crash(TearMode::KeepAll, 0);
        let mut buf = [0u8; 6];
        replayed.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"FIRST-");
    }

    #[test]
    fn keeps_deleted_segments_and_overwritten_superblocks() {
        let m = RecordingMedium::new(MemMedium::new());
        m.append(1, 0, b"secret").unwrap();
        m.append(1, 6, b"-one").unwrap();
        m.write_superblock(Slot::A, b"sb1").unwrap();
        m.sync().unwrap();
        m.append(2, 0, b"two").unwrap();
        m.write_superblock(Slot::A, b"sb2").unwrap();
        m.write_superblock(Slot::B, b"sbB").unwrap();
        m.delete_segment(1).unwrap();
        m.sync().unwrap();

        assert_eq!(m.list_segments().unwrap(), vec![2]);
        let segs = m.every_segment();
        assert_eq!(segs[&1], b"secret-one");
        assert_eq!(segs[&2], b"two");
        assert_eq!(
            m.every_superblock(),
            vec![
                (Slot::A, b"sb1".to_vec()),
                (Slot::A, b"sb2".to_vec()),
                (Slot::B, b"sbB".to_vec())
            ]
        );
        assert_eq!(m.total_bytes_written(), 10 + 3 + 9);
        assert_eq!(m.op_count(), 9);
        assert!(m.describe().starts_with("recording("));
    }

    #[test]
    fn state_at_reopens_the_past() {
        let m = RecordingMedium::new(MemMedium::new());
        m.append(1, 0, b"old").unwrap();
        m.write_superblock(Slot::A, b"v1").unwrap();
        m.sync().unwrap(); // 3 ops
        m.delete_segment(1).unwrap();
        m.write_superblock(Slot::A, b"v2").unwrap();
        m.sync().unwrap(); // 6 ops

        let empty = m.state_at(0);
        assert!(empty.list_segments().unwrap().is_empty());
        assert_eq!(empty.read_superblock(Slot::A).unwrap(), None);

        let past = m.state_at(3);
        let mut buf = [0u8; 3];
        past.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"old");
        assert_eq!(past.read_superblock(Slot::A).unwrap().unwrap(), b"v1");
        assert_eq!(past.unsynced_ops(), 0);

        // Mid-way: the delete is pending and can be crashed away.
        let mid = m.state_at(4);
        assert!(mid.list_segments().unwrap().is_empty());
        let crashed = mid.crash(TearMode::DropUnsynced, 0);
        assert_eq!(crashed.list_segments().unwrap(), vec![1]);

        let now = m.state_at(usize::MAX);
        assert_eq!(now.read_superblock(Slot::A).unwrap().unwrap(), b"v2");
        assert!(now.list_segments().unwrap().is_empty());
    }

    #[test]
    fn failed_ops_are_not_logged_but_torn_prefixes_are() {
        let m = RecordingMedium::new(MemMedium::new());
        assert!(m.append(1, 5, b"x").is_err());
        assert_eq!(m.op_count(), 0);

        let f = FaultMedium::with_fault(
            RecordingMedium::new(MemMedium::new()),
            0,
            Fault::TearThenCut,
        );
        assert!(f.append(1, 0, b"abcdef").is_err());
        assert_eq!(f.inner().every_segment()[&1], b"abc");
    }

    #[test]
    fn thread_safe_recording() {
        let m = Arc::new(RecordingMedium::new(MemMedium::new()));
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        m.append(t, i, &[t as u8]).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(m.op_count(), 400);
        let segs = m.every_segment();
        for t in 0..4u32 {
            assert_eq!(segs[&t], vec![t as u8; 100]);
        }
        // Replaying the log reproduces the live state.
        let replay = m.state_at(400);
        assert_eq!(replay.list_segments().unwrap(), m.list_segments().unwrap());
    }
}
