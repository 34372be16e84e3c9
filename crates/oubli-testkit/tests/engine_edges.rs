//! Engine edges of issue 39: a medium that takes `finish_segment`'s end literally, and the keys a failed write had reserved.

use oubli_core::{Error, Medium, SegmentId, Slot};
use oubli_media::MemMedium;
use oubli_testkit::{harness, marker};
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

/// A medium that takes the hint of `finish_segment` literally: the segment
/// ends where the engine says, and what was appended past it is gone (a
/// medium that gives the room back by truncating, or an object store that
/// uploads the finished object up to there).
struct LiteralEnds {
    inner: MemMedium,
    ends: Mutex<BTreeMap<SegmentId, u64>>,
}

impl LiteralEnds {
    fn end(&self, id: SegmentId) -> Option<u64> {
        self.ends.lock().unwrap().get(&id).copied()
    }
}

impl Medium for LiteralEnds {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn segment_capacity(&self) -> u64 {
        self.inner.segment_capacity()
    }
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.append(id, offset, data)
    }
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self
            .end(id)
            .is_some_and(|end| offset + buf.len() as u64 > end)
        {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "segment {id} was finished before byte {}",
                    offset + buf.len() as u64
                ),
            ));
        }
        self.inner.read(id, offset, buf)
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        Ok(self
            .inner
            .segment_len(id)?
            .map(|len| self.end(id).map_or(len, |end| len.min(end))))
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.inner.list_segments()
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.inner.delete_segment(id)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.inner.read_superblock(slot)
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.inner.write_superblock(slot, data)
    }
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        self.ends.lock().unwrap().insert(id, len);
        Ok(())
    }
}

/// Issue 39, item 6: a flush whose buffered cells went into the intent log
/// but whose frame then did not fit (too many ops for the rest of the log
/// segment) falls back to a commit, which finishes the old log segment.
/// The end it gives must be past those cells, which the tree names: on a
/// medium that ends the segment there, they must still read.
#[test]
fn a_flush_whose_frame_does_not_fit_finishes_the_log_past_its_cells() {
    for scheme in harness::SCHEMES {
        let options = harness::options(1);
        let medium = Arc::new(LiteralEnds {
            inner: MemMedium::with_segment_capacity(harness::TEST_SEGMENT),
            ends: Mutex::default(),
        });
        let (store, _vault) = harness::create_with(medium.clone(), &options, scheme);
        let oid = store.create_object(b"").unwrap();
        // A small write: buffered, sealed into the next frame's cells.
        let data = marker::data(1, 3_000);
        store.write(oid, 0, &data).unwrap();
        // Enough ops that the frame cannot fit in the log segment.
        let meta = vec![7u8; 2_000];
        let many = harness::TEST_SEGMENT as usize / meta.len() + 8;
        for _ in 0..many {
            store.create_object(&meta).unwrap();
        }
        let epoch = store.status().unwrap().epoch;
        store.flush().unwrap();
        assert!(
            store.status().unwrap().epoch > epoch,
            "the flush fell back to a commit"
        );
        assert!(
            !medium.ends.lock().unwrap().is_empty(),
            "the old log segment was finished"
        );
        let read = store.read(oid, 0, data.len()).unwrap_or_else(|e| {
            panic!(
                "{}: a cell of the finished log is lost: {e}",
                harness::scheme_name(scheme)
            )
        });
        assert!(read == data);
    }
}

/// Issue 39, item 6: the keys a large write reserved (sealed outside the
/// engine lock, detached until placed) are released when the write fails,
/// so the next commit's sweep makes them underivable: the scheme's state
/// after that commit is the same as in a store where the write never
/// happened: as many keys held. Measured on the area scheme, whose state
/// counts its keys; the forest's (its roots) depends on where in its leaf
/// range each allocation fell, so it cannot be compared with a control.
#[test]
fn keys_reserved_for_a_failed_write_are_released() {
    {
        let scheme = oubli_crypto::SCHEME_KEY_STORAGE_AREA;
        let run = |fail: bool| {
            let options = harness::options(2);
            let medium = Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT));
            let (store, _vault) = harness::create_with(medium, &options, scheme);
            let oid = store.create_object(b"").unwrap();
            store.write(oid, 0, &[1]).unwrap();
            store.commit().unwrap();
            if fail {
                // Past the object's end: refused under the lock, after its
                // whole cells were sealed under reserved keys.
                let big = marker::data(2, 8 * harness::TEST_CELL as usize);
                assert!(matches!(
                    store.write_inside(oid, 0, &big),
                    Err(Error::PastEnd(_))
                ));
            }
            store.commit().unwrap();
            store.status().unwrap().key_scheme_stats
        };
        let (failed, control) = (run(true), run(false));
        assert_eq!(
            (failed.keys, failed.state_bytes),
            (control.keys, control.state_bytes),
            "{}: the failed write's keys are still held",
            harness::scheme_name(scheme)
        );
    }
}
