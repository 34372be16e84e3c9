//! The simulator's medium: power cuts, torn writes and EIO over a recording of every byte, with a capacity that fills (ENOSPC), slow calls on a simulated clock, a flush that can be made to lie, and optionally a real medium underneath (sim/media.rs).

use super::media::{Backend, SimClock, MEDIUM_CALL, MEDIUM_SYNC};
use oubli_core::{Medium, SegmentId, Slot};
use oubli_media::{FaultMedium, MemMedium, RecordingMedium};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The layers the seed controls: [`FaultMedium`] (cuts, tears, EIO at any
/// I/O point) over a [`RecordingMedium`] (every byte for the adversary)
/// over memory. On top, a capacity: an append that would take the medium
/// past it fails with `StorageFull`, and deleting segments gives the room
/// back, as a file system does.
///
/// With a real medium underneath ([`SimMedium::on`]), the memory medium is
/// its shadow: a write the fault layer lets through goes to both, a read
/// is served by the real medium and must match the shadow, and the
/// capabilities are what both allow. Power cuts act on the shadow (see
/// sim/media.rs).
pub struct SimMedium {
    pub fault: FaultMedium<RecordingMedium<MemMedium>>,
    /// Bytes the segments hold now.
    used: AtomicU64,
    /// Bytes the medium may hold (`u64::MAX`: no limit).
    capacity: AtomicU64,
    /// The size the medium reports while it has a capacity (0: the
    /// capacity): a disk larger than what is free for the store
    /// (sim/full.rs, "filled by the store").
    total: AtomicU64,
    /// Mutation check only: `sync` reports success without syncing.
    pub skip_sync: AtomicBool,
    /// Appends refused for lack of room.
    pub full_refusals: AtomicU64,
    backend: RwLock<Option<Backend>>,
    clock: Arc<SimClock>,
    /// Medium calls still to be slow, and what each then costs (nanoseconds).
    slow_left: AtomicU64,
    slow_each: AtomicU64,
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
            total: AtomicU64::new(0),
            skip_sync: AtomicBool::new(false),
            full_refusals: AtomicU64::new(0),
            backend: RwLock::new(None),
            clock: Arc::default(),
            slow_left: AtomicU64::new(0),
            slow_each: AtomicU64::new(0),
        }
    }

    /// Wraps `mem` with `backend` (a real medium holding the same content)
    /// underneath, on `clock`.
    pub fn on(mem: MemMedium, backend: Option<Backend>, clock: Arc<SimClock>) -> SimMedium {
        let mut medium = SimMedium::new(mem);
        medium.backend = RwLock::new(backend);
        medium.clock = clock;
        medium
    }

    /// The next `calls` medium calls cost `each` of simulated time.
    pub fn slow_calls(&self, calls: u64, each: Duration) {
        self.slow_each
            .store(each.as_nanos() as u64, Ordering::SeqCst);
        self.slow_left.store(calls, Ordering::SeqCst);
    }

    /// Lets the real medium go (a power cut replaced this medium).
    pub fn retire(&self) {
        *self.backend.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Drops the real medium's handle and opens it again, as a restart
    /// does (a no-op on memory). Called before every open of the store.
    pub fn reopen_backend(&self) -> io::Result<()> {
        match self
            .backend
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            Some(b) => b.reopen(),
            None => Ok(()),
        }
    }

    /// Advances the clock by one call's cost (more if the call is slow).
    fn tick(&self, cost: Duration) {
        let slow = self
            .slow_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        self.clock.advance(if slow {
            Duration::from_nanos(self.slow_each.load(Ordering::SeqCst))
        } else {
            cost
        });
    }

    /// Runs `f` on the real medium, if there is one.
    fn real<T>(&self, f: impl FnOnce(&dyn Medium) -> io::Result<T>) -> Option<io::Result<T>> {
        let backend = self.backend.read().unwrap_or_else(|p| p.into_inner());
        backend.as_ref().map(|b| f(&*b.medium))
    }

    /// A mutating call: the fault layer (and the shadow) first, then the
    /// real medium, which must take what the shadow took.
    fn write(
        &self,
        shadow: impl FnOnce() -> io::Result<()>,
        real: impl FnOnce(&dyn Medium) -> io::Result<()>,
    ) -> io::Result<()> {
        shadow()?;
        self.real(real).unwrap_or(Ok(()))
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

    /// Sets the size the medium reports (0: its capacity).
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::SeqCst);
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
        match self.real(|m| Ok(m.describe())) {
            Some(Ok(real)) => format!("simulated medium: {real}, beside {}", self.fault.describe()),
            _ => format!("simulated medium over {}", self.fault.describe()),
        }
    }
    fn segment_capacity(&self) -> u64 {
        self.fault.segment_capacity()
    }
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        super::sched::point("append");
        self.tick(MEDIUM_CALL);
        self.room_for(data.len() as u64)?;
        self.write(
            || self.fault.append(id, offset, data),
            |m| m.append(id, offset, data),
        )?;
        self.used.fetch_add(data.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        super::sched::point("read");
        self.tick(MEDIUM_CALL);
        let shadow = self.fault.read(id, offset, buf);
        let Some(real) = self.real(|m| {
            let mut got = vec![0; buf.len()];
            m.read(id, offset, &mut got).map(|()| got)
        }) else {
            return shadow;
        };
        match shadow {
            // A cut fails every read, whatever the real medium would say.
            Err(e) if self.fault.is_cut() => Err(e),
            Ok(()) => {
                let got = real?;
                // A real medium that hands back other bytes than it took
                // is a defect of that medium: said as such, not left to
                // the oracle.
                assert!(
                    got == buf,
                    "the real medium read back other bytes than were written (segment {id:08x}, {} bytes at {offset})",
                    buf.len()
                );
                Ok(())
            }
            // Past what was appended: the real medium may hold room it
            // prepared (zeros, see `Medium::reserve`); it answers.
            Err(_) => {
                buf.copy_from_slice(&real?);
                Ok(())
            }
        }
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.tick(MEDIUM_CALL);
        let len = self.fault.segment_len(id)?;
        match self.real(|m| m.segment_len(id)) {
            Some(real) => {
                let real = real?;
                // An upper bound (room `reserve` prepared counts), never
                // less than was appended; a segment `reserve` prepared
                // whose first append then failed exists on the real medium
                // only (seed 1002368: a directory medium, EIO on that append).
                assert!(
                    real.unwrap_or(0) >= len.unwrap_or(0) && (real.is_some() || len.is_none()),
                    "the real medium says segment {id:08x} is {real:?} bytes long, the writes made it {len:?}"
                );
                Ok(real)
            }
            None => Ok(len),
        }
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.tick(MEDIUM_CALL);
        let shadow = self.fault.list_segments()?;
        self.real(|m| m.list_segments()).unwrap_or(Ok(shadow))
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        super::sched::point("segment deletion");
        self.tick(MEDIUM_CALL);
        let len = self.fault.segment_len(id).ok().flatten().unwrap_or(0);
        self.write(|| self.fault.delete_segment(id), |m| m.delete_segment(id))?;
        self.used.fetch_sub(len.min(self.used()), Ordering::SeqCst);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        super::sched::point("sync");
        self.tick(MEDIUM_SYNC);
        if self.skip_sync.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.write(|| self.fault.sync(), |m| m.sync())
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.tick(MEDIUM_CALL);
        let shadow = self.fault.read_superblock(slot)?;
        match self.real(|m| m.read_superblock(slot)) {
            Some(real) => {
                let real = real?;
                assert!(
                    real == shadow,
                    "the real medium's superblock {slot:?} is not the one last written"
                );
                Ok(real)
            }
            None => Ok(shadow),
        }
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        super::sched::point("superblock write");
        self.tick(MEDIUM_CALL);
        self.write(
            || self.fault.write_superblock(slot, data),
            |m| m.write_superblock(slot, data),
        )
    }
    fn keeps_append_order(&self) -> bool {
        self.fault.keeps_append_order()
    }
    fn reserve(&self, id: SegmentId, upto: u64) -> io::Result<()> {
        self.tick(MEDIUM_CALL);
        self.write(|| self.fault.reserve(id, upto), |m| m.reserve(id, upto))
    }
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        self.tick(MEDIUM_CALL);
        self.write(
            || self.fault.finish_segment(id, len),
            |m| m.finish_segment(id, len),
        )
    }
    // sim-space-begin (the medium's room, as a file system reports it)
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let capacity = self.capacity();
        if capacity == u64::MAX {
            return Ok(None);
        }
        Ok(Some(oubli_core::Space {
            total: capacity.max(self.total.load(Ordering::SeqCst)),
            free: capacity.saturating_sub(self.used()),
        }))
    }
    // sim-space-end
    fn can_rewrite(&self) -> bool {
        self.fault.can_rewrite()
            && self
                .real(|m| Ok(m.can_rewrite()))
                .is_none_or(|r| r.is_ok_and(|b| b))
    }
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.tick(MEDIUM_CALL);
        self.write(
            || self.fault.rewrite(id, offset, data),
            |m| m.rewrite(id, offset, data),
        )
    }
}
