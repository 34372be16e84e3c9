//! The simulator's medium: power cuts, torn writes and EIO over a recording of every byte, with a capacity that fills (ENOSPC) and a flush that can be made to lie.

use oubli_core::{Medium, SegmentId, Slot};
use oubli_media::{FaultMedium, MemMedium, RecordingMedium};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The layers the seed controls: [`FaultMedium`] (cuts, tears, EIO at any
/// I/O point) over a [`RecordingMedium`] (every byte for the adversary)
/// over memory. On top, a capacity: an append that would take the medium
/// past it fails with `StorageFull`, and deleting segments gives the room
/// back, as a file system does.
pub struct SimMedium {
    pub fault: FaultMedium<RecordingMedium<MemMedium>>,
    /// Bytes the segments hold now.
    used: AtomicU64,
    /// Bytes the medium may hold (`u64::MAX`: no limit).
    capacity: AtomicU64,
    /// Mutation check only: `sync` reports success without syncing.
    pub skip_sync: AtomicBool,
    /// Appends refused for lack of room.
    pub full_refusals: AtomicU64,
}

impl SimMedium {
    /// Wraps `mem` (a fresh medium or what a crash left).
    pub fn new(mem: MemMedium) -> SimMedium {
        let used = mem
            .list_segments()
            .unwrap_or_default()
            .into_iter()
            .map(|id| mem.segment_len(id).ok().flatten().unwrap_or(0))
            .sum();
        SimMedium {
            fault: FaultMedium::new(RecordingMedium::new(mem)),
            used: AtomicU64::new(used),
            capacity: AtomicU64::new(u64::MAX),
            skip_sync: AtomicBool::new(false),
            full_refusals: AtomicU64::new(0),
        }
    }

    pub fn recording(&self) -> &RecordingMedium<MemMedium> {
        self.fault.inner()
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Sets the capacity (`u64::MAX` lifts it).
    pub fn set_capacity(&self, capacity: u64) {
        self.capacity.store(capacity, Ordering::SeqCst);
    }

    pub fn capacity(&self) -> u64 {
        self.capacity.load(Ordering::SeqCst)
    }

    fn room_for(&self, n: u64) -> io::Result<()> {
        if self.used().saturating_add(n) > self.capacity() {
            self.full_refusals.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "no space left on the simulated medium",
            ));
        }
        Ok(())
    }
}

impl Medium for SimMedium {
    fn describe(&self) -> String {
        format!("simulated medium over {}", self.fault.describe())
    }
    fn segment_capacity(&self) -> u64 {
        self.fault.segment_capacity()
    }
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.room_for(data.len() as u64)?;
        self.fault.append(id, offset, data)?;
        self.used.fetch_add(data.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.fault.read(id, offset, buf)
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.fault.segment_len(id)
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.fault.list_segments()
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        let len = self.fault.segment_len(id).ok().flatten().unwrap_or(0);
        self.fault.delete_segment(id)?;
        self.used.fetch_sub(len.min(self.used()), Ordering::SeqCst);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        if self.skip_sync.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.fault.sync()
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.fault.read_superblock(slot)
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.fault.write_superblock(slot, data)
    }
    fn keeps_append_order(&self) -> bool {
        self.fault.keeps_append_order()
    }
    fn reserve(&self, id: SegmentId, upto: u64) -> io::Result<()> {
        self.fault.reserve(id, upto)
    }
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        self.fault.finish_segment(id, len)
    }
    // sim-space-begin (the medium's room, as a file system reports it)
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let capacity = self.capacity();
        if capacity == u64::MAX {
            return Ok(None);
        }
        Ok(Some(oubli_core::Space {
            total: capacity,
            free: capacity.saturating_sub(self.used()),
        }))
    }
    // sim-space-end
    fn can_rewrite(&self) -> bool {
        self.fault.can_rewrite()
    }
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.fault.rewrite(id, offset, data)
    }
}
