//! `FaultMedium`: a wrapper that injects I/O errors, power cuts, torn writes and bad reads.
//!
//! Every mutating call (append, superblock write, delete, sync) is one *I/O
//! point*, numbered from 0 in call order. A test first runs a workload
//! unfaulted to learn how many points it has, then reruns it once per point
//! with a fault armed there. Combined with [`MemMedium::crash`] on the inner
//! medium this enumerates every place a power cut can hit.
//!
//! [`MemMedium::crash`]: crate::MemMedium::crash

use std::io;
use std::sync::{Mutex, MutexGuard};

use oubli_core::{Medium, SegmentId, Slot};

use crate::util::SplitMix64;

/// What happens at the armed I/O point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// That operation returns an error without touching the inner medium;
    /// later operations work normally.
    FailOnce,
    /// That operation and every later one (reads included) fail with an
    /// error whose message says "power cut"; the operation has no effect.
    PowerCut,
    /// For an append or superblock write: the first half of the data reaches
    /// the inner medium, then the medium behaves as after `PowerCut`. For a
    /// delete or sync: same as `PowerCut`.
    TearThenCut,
}

/// A read fault, set with [`FaultMedium::set_read_fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFault {
    /// Reads fail with an I/O error.
    Fail,
    /// Reads succeed but one bit of the returned data is flipped (a
    /// different, deterministic bit each time).
    FlipBit,
}

/// Which reads a [`ReadFault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadTarget {
    /// `read` (segment data).
    Segments,
    /// `read_superblock`.
    Superblocks,
}

#[derive(Debug)]
struct FaultState {
    points: u64,
    armed: Option<(u64, Fault)>,
    /// Point at which a power cut happened, once it has.
    cut_at: Option<u64>,
    seg_read: Option<ReadFault>,
    sb_read: Option<ReadFault>,
    flips: SplitMix64,
    /// [`FaultMedium::set_space_limit`].
    space_limit: Option<u64>,
    /// [`FaultMedium::arm_no_space`].
    no_space_at: Option<u64>,
}

/// What the current mutating call must do.
enum Verdict {
    Proceed,
    Fail(io::Error),
    /// Write this many bytes of the payload, then report the power cut.
    Tear(usize, io::Error),
}

/// Wraps a medium and injects faults at chosen I/O points. See module docs.
#[derive(Debug)]
pub struct FaultMedium<M: Medium> {
    inner: M,
    state: Mutex<FaultState>,
}

fn power_cut_error(point: u64) -> io::Error {
    io::Error::other(format!("power cut (injected at I/O point {point})"))
}

impl<M: Medium> FaultMedium<M> {
    /// Wraps `inner` with nothing armed (it only counts points).
    pub fn new(inner: M) -> Self {
        FaultMedium {
            inner,
            state: Mutex::new(FaultState {
                points: 0,
                armed: None,
                cut_at: None,
                seg_read: None,
                sb_read: None,
                flips: SplitMix64::new(0x0b11),
                space_limit: None,
                no_space_at: None,
            }),
        }
    }

    /// Wraps `inner` with `fault` armed at I/O point `at`.
    pub fn with_fault(inner: M, at: u64, fault: Fault) -> Self {
        let m = Self::new(inner);
        m.arm(at, fault);
        m
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms `fault` at I/O point `at` (an absolute point number; if it has
    /// already passed, nothing will fire). Replaces any armed fault.
    pub fn arm(&self, at: u64, fault: Fault) {
        self.lock().armed = Some((at, fault));
    }

    /// Removes the armed fault, if it has not fired yet.
    pub fn disarm(&self) {
        self.lock().armed = None;
    }

    /// Ends a simulated power cut: operations reach the inner medium again.
    /// (A "reboot" usually means crashing the inner medium instead; this is
    /// for tests that keep using the same handle.)
    pub fn restore_power(&self) {
        self.lock().cut_at = None;
    }

    /// Makes the medium `limit` bytes large (`None`: as the inner one):
    /// `space` reports that size and what the segments leave of it, and an
    /// append that would pass it fails with `StorageFull` having written
    /// nothing — what `DirMedium` leaves after an append the file system
    /// cut short (it truncates the segment back). A full disk without the
    /// disk.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.lock().space_limit = limit;
    }

    /// Makes I/O point `at` (an append, superblock write or sync) fail
    /// once with `StorageFull`, having done nothing: what the `Medium`
    /// contract lets a full medium answer (a disk another program filled
    /// between two of the store's writes). Independent of [`arm`](Self::arm).
    pub fn arm_no_space(&self, at: u64) {
        self.lock().no_space_at = Some(at);
    }

    /// Bytes the inner medium's segments hold.
    fn used(&self) -> io::Result<u64> {
        let mut used = 0;
        for id in self.inner.list_segments()? {
            used += self.inner.segment_len(id)?.unwrap_or(0);
        }
        Ok(used)
    }

    /// `StorageFull` if `more` bytes do not fit under the space limit.
    fn check_room(&self, more: usize) -> io::Result<()> {
        let Some(limit) = self.lock().space_limit else {
            return Ok(());
        };
        let used = self.used()?;
        if used + more as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("injected: {more} bytes do not fit ({used} of {limit} used)"),
            ));
        }
        Ok(())
    }

    /// How many I/O points have been seen so far (including failed ones).
    pub fn points(&self) -> u64 {
        self.lock().points
    }

    /// Whether a power cut has happened (and not been restored).
    pub fn is_cut(&self) -> bool {
        self.lock().cut_at.is_some()
    }

    /// Makes reads of `target` fail or return flipped bits (`None` clears).
    pub fn set_read_fault(&self, target: ReadTarget, fault: Option<ReadFault>) {
        let mut s = self.lock();
        match target {
            ReadTarget::Segments => s.seg_read = fault,
            ReadTarget::Superblocks => s.sb_read = fault,
        }
    }

    /// The wrapped medium.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Unwraps the medium.
    pub fn into_inner(self) -> M {
        self.inner
    }

    /// Counts one I/O point and decides what happens to it. `payload` is the
    /// data length for writes that can be torn.
    fn point(&self, payload: Option<usize>) -> Verdict {
        let mut s = self.lock();
        let point = s.points;
        s.points += 1;
        if let Some(at) = s.cut_at {
            return Verdict::Fail(power_cut_error(at));
        }
        if s.no_space_at == Some(point) {
            s.no_space_at = None;
            return Verdict::Fail(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("injected: no space at I/O point {point}"),
            ));
        }
        match s.armed {
            Some((at, fault)) if at == point => {
                s.armed = None;
                match (fault, payload) {
                    (Fault::FailOnce, _) => Verdict::Fail(io::Error::other(format!(
                        "injected I/O error at point {point}"
                    ))),
                    (Fault::PowerCut, _) | (Fault::TearThenCut, None) => {
                        s.cut_at = Some(point);
                        Verdict::Fail(power_cut_error(point))
                    }
                    (Fault::TearThenCut, Some(len)) => {
                        s.cut_at = Some(point);
                        Verdict::Tear(len / 2, power_cut_error(point))
                    }
                }
            }
            _ => Verdict::Proceed,
        }
    }

    /// One write of `data` to a segment (`write` passes it to the inner
    /// medium): an I/O point that may fail, or tear and cut the power.
    fn segment_write(
        &self,
        data: &[u8],
        write: impl Fn(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        match self.point(Some(data.len())) {
            Verdict::Proceed => write(data),
            Verdict::Fail(e) => Err(e),
            Verdict::Tear(n, e) => {
                // The torn prefix's own outcome does not matter: the caller
                // sees the power cut either way.
                let _ = write(&data[..n]);
                Err(e)
            }
        }
    }

    /// Fails non-mutating calls once the power is cut.
    fn check_power(&self) -> io::Result<()> {
        match self.lock().cut_at {
            Some(at) => Err(power_cut_error(at)),
            None => Ok(()),
        }
    }

    /// Applies a read fault to `buf` after a successful read, or fails.
    fn read_fault(&self, target: ReadTarget, buf: &mut [u8]) -> io::Result<()> {
        let mut s = self.lock();
        let fault = match target {
            ReadTarget::Segments => s.seg_read,
            ReadTarget::Superblocks => s.sb_read,
        };
        match fault {
            None => Ok(()),
            Some(ReadFault::Fail) => Err(io::Error::other("injected read error")),
            Some(ReadFault::FlipBit) => {
                if !buf.is_empty() {
                    let bit = s.flips.below(buf.len() as u64 * 8);
                    buf[(bit / 8) as usize] ^= 1 << (bit % 8);
                }
                Ok(())
            }
        }
    }
}

impl<M: Medium> Medium for FaultMedium<M> {
    fn describe(&self) -> String {
        format!("fault({})", self.inner.describe())
    }

    fn segment_capacity(&self) -> u64 {
        self.inner.segment_capacity()
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check_room(data.len())?;
        self.segment_write(data, |d| self.inner.append(id, offset, d))
    }

    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let limit = self.lock().space_limit;
        match limit {
            Some(total) => Ok(Some(oubli_core::Space {
                total,
                free: total.saturating_sub(self.used()?),
            })),
            None => self.inner.space(),
        }
    }

    fn can_rewrite(&self) -> bool {
        self.inner.can_rewrite()
    }

    /// An I/O point like an append, torn the same way.
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.segment_write(data, |d| self.inner.rewrite(id, offset, d))
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_power()?;
        // Decide failure before touching the inner medium.
        if self.lock().seg_read == Some(ReadFault::Fail) {
            return Err(io::Error::other("injected read error"));
        }
        self.inner.read(id, offset, buf)?;
        self.read_fault(ReadTarget::Segments, buf)
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.check_power()?;
        self.inner.segment_len(id)
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.check_power()?;
        self.inner.list_segments()
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        match self.point(None) {
            Verdict::Proceed => self.inner.delete_segment(id),
            Verdict::Fail(e) | Verdict::Tear(_, e) => Err(e),
        }
    }

    fn sync(&self) -> io::Result<()> {
        match self.point(None) {
            Verdict::Proceed => self.inner.sync(),
            Verdict::Fail(e) | Verdict::Tear(_, e) => Err(e),
        }
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.check_power()?;
        if self.lock().sb_read == Some(ReadFault::Fail) {
            return Err(io::Error::other("injected read error"));
        }
        match self.inner.read_superblock(slot)? {
            None => Ok(None),
            Some(mut data) => {
                self.read_fault(ReadTarget::Superblocks, &mut data)?;
                Ok(Some(data))
            }
        }
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        match self.point(Some(data.len())) {
            Verdict::Proceed => self.inner.write_superblock(slot, data),
            Verdict::Fail(e) => Err(e),
            Verdict::Tear(n, e) => {
                let _ = self.inner.write_superblock(slot, &data[..n]);
                Err(e)
            }
        }
    }

    fn keeps_append_order(&self) -> bool {
        self.inner.keeps_append_order()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemMedium, TearMode};

    /// Five I/O points: append, append, superblock, delete, sync.
    fn workload(m: &impl Medium) -> io::Result<()> {
        m.append(1, 0, b"abcd")?;
        m.append(1, 4, b"efgh")?;
        m.write_superblock(Slot::A, b"super")?;
        m.delete_segment(1)?;
        m.sync()
    }

    #[test]
    fn counts_points() {
        let m = FaultMedium::new(MemMedium::new());
        workload(&m).unwrap();
        assert_eq!(m.points(), 5);
        // Reads are not points.
        m.read_superblock(Slot::A).unwrap();
        m.list_segments().unwrap();
        assert_eq!(m.points(), 5);
        assert!(m.describe().starts_with("fault(mem:"));
    }

    #[test]
    fn fail_once_at_each_point() {
        for at in 0..5 {
            let m = FaultMedium::with_fault(MemMedium::new(), at, Fault::FailOnce);
            let err = workload(&m).unwrap_err();
            assert!(err.to_string().contains("injected"), "{err}");
            assert_eq!(m.points(), at + 1);
            assert!(!m.is_cut());
            // Later operations work.
            m.append(2, 0, b"x").unwrap();
            m.sync().unwrap();
        }
        // The failed op had no effect.
        let m = FaultMedium::with_fault(MemMedium::new(), 0, Fault::FailOnce);
        assert!(m.append(1, 0, b"abcd").is_err());
        assert_eq!(m.segment_len(1).unwrap(), None);
        m.append(1, 0, b"abcd").unwrap();
    }

    #[test]
    fn power_cut_stops_everything() {
        for at in 0..5 {
            let m = FaultMedium::with_fault(MemMedium::new(), at, Fault::PowerCut);
            let err = workload(&m).unwrap_err();
            assert!(err.to_string().contains("power cut"), "{err}");
            assert!(m.is_cut());
            let e = m.append(9, 0, b"x").unwrap_err();
            assert!(e.to_string().contains("power cut"));
            assert!(m.sync().unwrap_err().to_string().contains("power cut"));
            assert!(m.read_superblock(Slot::A).is_err());
            assert!(m.list_segments().is_err());
            assert_eq!(m.inner().segment_len(9).unwrap(), None);
            // Nothing was synced, so a crash leaves an empty medium.
            let c = m.inner().crash(TearMode::DropUnsynced, 0);
            assert!(c.list_segments().unwrap().is_empty());
            m.restore_power();
            m.list_segments().unwrap();
        }
        // The cut op itself has no effect.
        let m = FaultMedium::with_fault(MemMedium::new(), 1, Fault::PowerCut);
        assert!(workload(&m).is_err());
        assert_eq!(m.inner().segment_len(1).unwrap(), Some(4));
    }

    #[test]
    fn tear_then_cut_writes_a_prefix() {
        let m = FaultMedium::with_fault(MemMedium::new(), 1, Fault::TearThenCut);
        assert!(workload(&m).unwrap_err().to_string().contains("power cut"));
        assert_eq!(m.inner().segment_len(1).unwrap(), Some(6));
        let mut buf = [0u8; 6];
        m.inner().read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"abcdef");

        let m = FaultMedium::with_fault(MemMedium::new(), 2, Fault::TearThenCut);
        assert!(workload(&m).is_err());
        assert_eq!(m.inner().read_superblock(Slot::A).unwrap().unwrap(), b"su");

        // On a delete it is a plain power cut.
        let m = FaultMedium::with_fault(MemMedium::new(), 3, Fault::TearThenCut);
        assert!(workload(&m).is_err());
        assert_eq!(m.inner().segment_len(1).unwrap(), Some(8));
        assert!(m.is_cut());
    }

    #[test]
    fn arm_and_disarm_at_runtime() {
        let m = FaultMedium::new(MemMedium::new());
        m.append(1, 0, b"a").unwrap();
        m.arm(2, Fault::FailOnce);
        m.append(1, 1, b"b").unwrap();
        assert!(m.append(1, 2, b"c").is_err());
        m.arm(5, Fault::PowerCut);
        m.disarm();
        for i in 2..10 {
            m.append(1, i, b"c").unwrap();
        }
        assert!(!m.is_cut());
        // Arming a point already passed never fires.
        m.arm(0, Fault::PowerCut);
        m.sync().unwrap();
        assert_eq!(m.into_inner().segment_len(1).unwrap(), Some(10));
    }

    #[test]
    fn read_faults() {
        let m = FaultMedium::new(MemMedium::new());
        m.append(1, 0, &[0u8; 64]).unwrap();
        m.write_superblock(Slot::B, &[0u8; 32]).unwrap();
        let mut buf = [0u8; 64];

        m.set_read_fault(ReadTarget::Segments, Some(ReadFault::Fail));
        assert!(m.read(1, 0, &mut buf).is_err());
        assert!(m.read_superblock(Slot::B).is_ok());

        m.set_read_fault(ReadTarget::Segments, Some(ReadFault::FlipBit));
        m.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf.iter().map(|b| b.count_ones()).sum::<u32>(), 1);

        m.set_read_fault(ReadTarget::Segments, None);
        m.read(1, 0, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 64]);

        m.set_read_fault(ReadTarget::Superblocks, Some(ReadFault::FlipBit));
        let sb = m.read_superblock(Slot::B).unwrap().unwrap();
        assert_eq!(sb.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
        m.set_read_fault(ReadTarget::Superblocks, Some(ReadFault::Fail));
        assert!(m.read_superblock(Slot::B).is_err());
        assert!(m.read_superblock(Slot::A).is_err());
        m.set_read_fault(ReadTarget::Superblocks, None);
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None);
    }
}
