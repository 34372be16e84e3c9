//! `MemMedium`: an in-memory medium with a power-cut model, for tests.
//!
//! It keeps two states: the *durable* one (what survived the last `sync`)
//! and the *current* one (what reads see), plus the list of writes made since
//! the last sync. [`MemMedium::crash`] builds what a power cut would leave:
//! the durable state plus some of those writes, possibly torn or reordered,
//! chosen deterministically from a seed.
//!
//! Segment bytes are immutable `Arc<[u8]>` chunks shared between the two
//! states, the pending list and every crashed or cloned medium, so a crash
//! costs a map clone plus replaying the unsynced writes, not a copy of the
//! store. That is what lets a test suite crash a small store tens of
//! thousands of times.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use oubli_core::{Medium, SegmentId, Slot};

use crate::op::Op;
use crate::util::{
    check_append_bounds, check_rewrite_bounds, check_superblock_len, eof, invalid_input, not_found,
    SplitMix64,
};

/// What a simulated power cut does to the writes made since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TearMode {
    /// Nothing unsynced survives: only the durable state remains.
    DropUnsynced,
    /// Every unsynced write survives intact (as if the cut hit right after a sync).
    KeepAll,
    /// The first `n` unsynced writes survive intact, in order (clamped to
    /// how many there are).
    KeepPrefix(usize),
    /// Each unsynced write survives independently with probability 1/2; a
    /// later append may survive without an earlier one (leaving a zero-filled
    /// hole), and when several writes to one superblock slot survive, any of
    /// them may be the one that landed last (writes are reordered).
    RandomSubset,
    /// A random number `k >= 1` of unsynced writes survive in order and the
    /// `k`-th is torn: an append keeps only a strict prefix of its bytes, a
    /// superblock write leaves a strict prefix of the new content over the
    /// old one. Same as `DropUnsynced` when nothing is pending.
    Torn,
    /// Like `Torn` with `k` given (1-based; 0 means nothing survives, and
    /// `k` is clamped to the number of pending writes).
    TornAt(usize),
    /// `RandomSubset`, and on top of it every surviving append or superblock
    /// write is torn with probability 1/4. The harshest model.
    Chaos,
}

/// One segment: an append-only list of shared, immutable chunks.
#[derive(Clone, Default)]
pub(crate) struct Seg {
    chunks: Vec<Arc<[u8]>>,
    /// `starts[i]` is the offset of `chunks[i]`; ascending, for binary search.
    starts: Vec<u64>,
    len: u64,
}

impl Seg {
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    fn push(&mut self, data: Arc<[u8]>) {
        if data.is_empty() {
            return;
        }
        self.starts.push(self.len);
        self.len += data.len() as u64;
        self.chunks.push(data);
    }

    /// Lenient write used when replaying a crash or a log: a gap is filled
    /// with zeros (what a file system shows for a hole) and an overlap
    /// overwrites. Only the append path (`offset == len`) is cheap; the others
    /// happen only in crash replays.
    fn write_at(&mut self, offset: u64, data: Arc<[u8]>) {
        if offset == self.len {
            self.push(data);
        } else if offset > self.len {
            let gap = (offset - self.len) as usize;
            self.push(Arc::from(vec![0u8; gap]));
            self.push(data);
        } else if offset + data.len() as u64 <= self.len {
            self.overwrite(offset, data);
        } else {
            let mut all = self.to_vec();
            let start = offset as usize;
            let end = start + data.len();
            if all.len() < end {
                all.resize(end, 0);
            }
            all[start..end].copy_from_slice(&data);
            *self = Seg::default();
            self.push(Arc::from(all));
        }
    }

    /// Writes `data` over bytes the segment holds, rebuilding only the
    /// chunks it touches (a chunk it covers exactly is swapped).
    fn overwrite(&mut self, offset: u64, data: Arc<[u8]>) {
        let end = offset + data.len() as u64;
        if data.is_empty() {
            return;
        }
        let first = self.starts.partition_point(|&s| s <= offset) - 1;
        let mut last = first;
        while self.starts[last] + (self.chunks[last].len() as u64) < end {
            last += 1;
        }
        let lo = self.starts[first];
        if first == last && lo == offset && self.chunks[first].len() == data.len() {
            self.chunks[first] = data;
            return;
        }
        let mut merged = Vec::new();
        for c in &self.chunks[first..=last] {
            merged.extend_from_slice(c);
        }
        merged[(offset - lo) as usize..(end - lo) as usize].copy_from_slice(&data);
        self.chunks.splice(first..=last, [Arc::from(merged)]);
        self.starts.splice(first..=last, [lo]);
    }

    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| invalid_input("read: offset overflow"))?;
        if end > self.len {
            return Err(eof(format!(
                "read of {}..{end} past segment end {}",
                offset, self.len
            )));
        }
        if buf.is_empty() {
            return Ok(());
        }
        // Index of the chunk holding `offset`.
        let mut i = self.starts.partition_point(|&s| s <= offset) - 1;
        let mut pos = offset;
        let mut done = 0;
        while done < buf.len() {
            let chunk = &self.chunks[i];
            let within = (pos - self.starts[i]) as usize;
            let n = (chunk.len() - within).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&chunk[within..within + n]);
            done += n;
            pos += n as u64;
            i += 1;
        }
        Ok(())
    }

    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len as usize);
        for c in &self.chunks {
            v.extend_from_slice(c);
        }
        v
    }
}

/// A complete medium state. Cloning is O(number of segments).
#[derive(Clone, Default)]
pub(crate) struct MemState {
    segs: BTreeMap<SegmentId, Arc<Seg>>,
    supers: [Option<Arc<[u8]>>; 2],
}

impl MemState {
    /// Applies `op` leniently (see [`Seg::write_at`]); `Sync` is a no-op.
    pub(crate) fn apply(&mut self, op: &Op) {
        match op {
            Op::Append { id, offset, data } | Op::Rewrite { id, offset, data } => {
                let seg = self.segs.entry(*id).or_default();
                Arc::make_mut(seg).write_at(*offset, data.clone());
            }
            Op::Superblock { slot, data } => self.supers[slot.index()] = Some(data.clone()),
            Op::Delete { id } => {
                self.segs.remove(id);
            }
            Op::Sync => {}
        }
    }

    /// Applies a torn version of `op`: a strict prefix of an append or a
    /// rewrite (laid over what it rewrites), or a strict prefix of a
    /// superblock write laid over the slot's old content.
    fn apply_torn(&mut self, op: &Op, rng: &mut SplitMix64) {
        match op {
            Op::Append { id, offset, data } | Op::Rewrite { id, offset, data } => {
                let cut = if data.is_empty() {
                    0
                } else {
                    rng.below(data.len() as u64) as usize
                };
                let seg = self.segs.entry(*id).or_default();
                Arc::make_mut(seg).write_at(*offset, Arc::from(&data[..cut]));
            }
            Op::Superblock { slot, data } => {
                let cut = if data.is_empty() {
                    0
                } else {
                    rng.below(data.len() as u64) as usize
                };
                let old = self.supers[slot.index()].take();
                let mut torn = data[..cut].to_vec();
                if let Some(old) = &old {
                    if old.len() > cut {
                        torn.extend_from_slice(&old[cut..]);
                    }
                }
                self.supers[slot.index()] = if torn.is_empty() && old.is_none() {
                    None
                } else {
                    Some(Arc::from(torn))
                };
            }
            // Deletions and syncs are atomic: they happen or they do not.
            Op::Delete { .. } | Op::Sync => self.apply(op),
        }
    }
}

struct MemInner {
    durable: MemState,
    current: MemState,
    /// Writes since the last sync, in call order (never contains `Op::Sync`).
    pending: Vec<Op>,
}

/// An in-memory [`Medium`] with a deterministic power-cut model.
///
/// Reads see every write at once; [`crash`](MemMedium::crash) shows what a
/// power cut would have left. Cheap to clone and crash (see module docs).
pub struct MemMedium {
    capacity: u64,
    /// Declares [`Medium::keeps_append_order`] (see [`MemMedium::in_order`]).
    in_order: bool,
    inner: Mutex<MemInner>,
}

impl Default for MemMedium {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("MemMedium")
            .field("capacity", &self.capacity)
            .field("segments", &inner.current.segs.len())
            .field("unsynced_ops", &inner.pending.len())
            .finish()
    }
}

impl MemMedium {
    /// An empty medium whose segments may reach 4 GiB - 1 (like `DirMedium`).
    pub fn new() -> Self {
        Self::with_segment_capacity(u64::from(u32::MAX))
    }

    /// An empty medium with a chosen segment capacity (small values let
    /// tests exercise segment rollover cheaply).
    pub fn with_segment_capacity(capacity: u64) -> Self {
        Self::from_states(
            capacity,
            MemState::default(),
            MemState::default(),
            Vec::new(),
        )
    }

    fn from_states(capacity: u64, durable: MemState, current: MemState, pending: Vec<Op>) -> Self {
        MemMedium {
            capacity,
            in_order: false,
            inner: Mutex::new(MemInner {
                durable,
                current,
                pending,
            }),
        }
    }

    /// Rebuilds a medium from an operation log: everything up to the last
    /// `Op::Sync` is durable, the rest is pending (so it can be crashed too).
    pub(crate) fn from_ops(capacity: u64, ops: &[Op]) -> Self {
        let mut current = MemState::default();
        let mut durable = MemState::default();
        let mut pending = Vec::new();
        for op in ops {
            if let Op::Sync = op {
                durable = current.clone();
                pending.clear();
            } else {
                current.apply(op);
                pending.push(op.clone());
            }
        }
        Self::from_states(capacity, durable, current, pending)
    }

    /// A synced medium holding what `pieces` (`(segment, offset, bytes)`,
    /// possibly several per segment, in any order) cover, zeros in any gap:
    /// the segments an adversary rebuilds from everything a medium ever
    /// held (every version an object store kept, say).
    pub fn from_pieces(pieces: impl IntoIterator<Item = (SegmentId, u64, Vec<u8>)>) -> Self {
        let mut whole: BTreeMap<SegmentId, Vec<u8>> = BTreeMap::new();
        for (id, at, bytes) in pieces {
            let seg = whole.entry(id).or_default();
            let end = at as usize + bytes.len();
            if seg.len() < end {
                seg.resize(end, 0);
            }
            seg[at as usize..end].copy_from_slice(&bytes);
        }
        let medium = MemMedium::new();
        for (id, bytes) in whole {
            if !bytes.is_empty() {
                medium
                    .append(id, 0, &bytes)
                    .expect("a fresh in-memory segment");
            }
        }
        medium.sync().expect("in-memory sync");
        medium
    }

    /// This medium, declaring that a power cut keeps appends in order (as
    /// object storage does, where a sync is one atomic request): crash it
    /// only with the tear modes that keep a prefix of the pending writes
    /// (`DropUnsynced`, `KeepAll`, `KeepPrefix`, `Torn`, `TornAt`), so that
    /// the engine's shortened flush is tested against what such a medium
    /// can really leave.
    pub fn in_order(mut self) -> Self {
        self.in_order = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, MemInner> {
        // A panic while holding the lock cannot leave the state half-updated
        // in a way that matters to a test, so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of writes (appends, superblock writes, deletions) made since
    /// the last sync: the `n` that [`TearMode::KeepPrefix`] and
    /// [`TearMode::TornAt`] range over.
    pub fn unsynced_ops(&self) -> usize {
        self.lock().pending.len()
    }

    /// An independent copy of this medium, unsynced writes included (so the
    /// copy can later be crashed exactly like the original).
    pub fn clone_state(&self) -> MemMedium {
        let inner = self.lock();
        let mut copy = Self::from_states(
            self.capacity,
            inner.durable.clone(),
            inner.current.clone(),
            inner.pending.clone(),
        );
        copy.in_order = self.in_order;
        copy
    }

    /// A new medium holding what a power cut at this instant would leave,
    /// according to `tear`, with every random choice drawn from `seed`. The
    /// result has no unsynced writes; `self` is unchanged.
    ///
    /// # Panics
    /// On an [`in_order`](Self::in_order) medium with a tear mode that
    /// reorders writes (`RandomSubset`, `Chaos`): such a medium cannot
    /// leave that, and a test that asks for it tests nothing real.
    pub fn crash(&self, tear: TearMode, seed: u64) -> MemMedium {
        assert!(
            !(self.in_order && matches!(tear, TearMode::RandomSubset | TearMode::Chaos)),
            "an in-order medium never reorders writes: {tear:?} is not a cut it can suffer"
        );
        let inner = self.lock();
        let mut state = inner.durable.clone();
        let pending = &inner.pending;
        let mut rng = SplitMix64::new(seed);
        match tear {
            TearMode::DropUnsynced => {}
            TearMode::KeepAll => pending.iter().for_each(|op| state.apply(op)),
            TearMode::KeepPrefix(n) => pending
                .iter()
                .take(n.min(pending.len()))
                .for_each(|op| state.apply(op)),
            TearMode::Torn => {
                if !pending.is_empty() {
                    let k = 1 + rng.below(pending.len() as u64) as usize;
                    tear_prefix(&mut state, pending, k, &mut rng);
                }
            }
            TearMode::TornAt(k) => {
                let k = k.min(pending.len());
                if k > 0 {
                    tear_prefix(&mut state, pending, k, &mut rng);
                }
            }
            TearMode::RandomSubset => random_subset(&mut state, pending, false, &mut rng),
            TearMode::Chaos => random_subset(&mut state, pending, true, &mut rng),
        }
        let mut crashed = Self::from_states(self.capacity, state.clone(), state, Vec::new());
        crashed.in_order = self.in_order;
        crashed
    }
}

fn tear_prefix(state: &mut MemState, pending: &[Op], k: usize, rng: &mut SplitMix64) {
    for op in &pending[..k - 1] {
        state.apply(op);
    }
    state.apply_torn(&pending[k - 1], rng);
}

fn random_subset(state: &mut MemState, pending: &[Op], tear: bool, rng: &mut SplitMix64) {
    // Surviving superblock writes per slot; the one that "landed last" is
    // drawn at the end, modelling reordering of in-place writes.
    let mut supers: [Vec<&Op>; 2] = [Vec::new(), Vec::new()];
    for op in pending {
        if !rng.coin() {
            continue;
        }
        match op {
            Op::Superblock { slot, .. } => supers[slot.index()].push(op),
            _ if tear && rng.below(4) == 0 => state.apply_torn(op, rng),
            _ => state.apply(op),
        }
    }
    for candidates in supers {
        if candidates.is_empty() {
            continue;
        }
        let op = candidates[rng.below(candidates.len() as u64) as usize];
        if tear && rng.below(4) == 0 {
            state.apply_torn(op, rng);
        } else {
            state.apply(op);
        }
    }
}

impl Medium for MemMedium {
    fn describe(&self) -> String {
        "mem:".to_string()
    }

    fn segment_capacity(&self) -> u64 {
        self.capacity
    }

    fn keeps_append_order(&self) -> bool {
        self.in_order
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        check_append_bounds(self.capacity, offset, data.len())?;
        let mut inner = self.lock();
        let len = inner.current.segs.get(&id).map(|s| s.len());
        match len {
            None if offset != 0 => {
                return Err(not_found(format!(
                    "append at {offset} to missing segment {id:08x}"
                )))
            }
            Some(len) if len != offset => {
                return Err(invalid_input(format!(
                    "append to segment {id:08x} at {offset}, but its length is {len}"
                )))
            }
            _ => {}
        }
        let data: Arc<[u8]> = Arc::from(data);
        let seg = inner.current.segs.entry(id).or_default();
        Arc::make_mut(seg).push(data.clone());
        inner.pending.push(Op::Append { id, offset, data });
        Ok(())
    }

    /// A file's behaviour; an in-order medium stands for object storage,
    /// which takes whole objects.
    fn can_rewrite(&self) -> bool {
        !self.in_order
    }

    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.in_order {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an in-order medium does not rewrite",
            ));
        }
        let mut inner = self.lock();
        let len = inner.current.segs.get(&id).map_or(0, |s| s.len());
        check_rewrite_bounds(id, len, offset, data.len())?;
        let data: Arc<[u8]> = Arc::from(data);
        let seg = inner.current.segs.get_mut(&id).expect("checked above");
        Arc::make_mut(seg).overwrite(offset, data.clone());
        inner.pending.push(Op::Rewrite { id, offset, data });
        Ok(())
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // Clone the Arc and copy outside the lock.
        let seg = self
            .lock()
            .current
            .segs
            .get(&id)
            .cloned()
            .ok_or_else(|| not_found(format!("segment {id:08x} does not exist")))?;
        seg.read(offset, buf)
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        Ok(self.lock().current.segs.get(&id).map(|s| s.len()))
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        Ok(self.lock().current.segs.keys().copied().collect())
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        let mut inner = self.lock();
        if inner.current.segs.remove(&id).is_some() {
            inner.pending.push(Op::Delete { id });
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut inner = self.lock();
        inner.durable = inner.current.clone();
        inner.pending.clear();
        Ok(())
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        Ok(self.lock().current.supers[slot.index()]
            .as_ref()
            .map(|d| d.to_vec()))
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        check_superblock_len(data.len())?;
        let data: Arc<[u8]> = Arc::from(data);
        let mut inner = self.lock();
        inner.current.supers[slot.index()] = Some(data.clone());
        inner.pending.push(Op::Superblock { slot, data });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(m: &MemMedium, id: SegmentId) -> Vec<u8> {
        let len = m.segment_len(id).unwrap().unwrap();
        let mut buf = vec![0; len as usize];
        m.read(id, 0, &mut buf).unwrap();
        buf
    }

    #[test]
    fn round_trip_across_chunks() {
        let m = MemMedium::new();
        m.append(1, 0, b"hello ").unwrap();
        m.append(1, 6, b"").unwrap();
        m.append(1, 6, b"world").unwrap();
        let mut buf = [0u8; 7];
        m.read(1, 3, &mut buf).unwrap();
        assert_eq!(&buf, b"lo worl");
        assert_eq!(read_all(&m, 1), b"hello world");
        assert_eq!(m.segment_len(1).unwrap(), Some(11));
        assert_eq!(m.segment_len(2).unwrap(), None);
        assert_eq!(m.list_segments().unwrap(), vec![1]);
    }

    #[test]
    fn rewrites_inside_a_segment_and_a_cut_may_undo_or_tear_them() {
        let m = MemMedium::new();
        assert!(m.can_rewrite());
        m.append(1, 0, b"aaaa").unwrap();
        m.append(1, 4, b"bbbb").unwrap();
        m.sync().unwrap();
        // Over one chunk exactly, and across two.
        m.rewrite(1, 4, b"cccc").unwrap();
        m.rewrite(1, 2, b"dddd").unwrap();
        assert_eq!(read_all(&m, 1), b"aaddddcc");
        assert_eq!(m.segment_len(1).unwrap(), Some(8));
        for (off, data) in [(6, &b"xyz"[..]), (9, b"x"), (u64::MAX, b"x")] {
            assert_eq!(
                m.rewrite(1, off, data).unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(m.rewrite(2, 0, b"x").is_err());
        // Rewrites are writes like appends: a cut before the sync may drop,
        // keep or tear them.
        assert_eq!(
            read_all(&m.crash(TearMode::DropUnsynced, 0), 1),
            b"aaaabbbb"
        );
        assert_eq!(read_all(&m.crash(TearMode::KeepAll, 0), 1), b"aaddddcc");
        assert_eq!(read_all(&m.crash(TearMode::TornAt(1), 0), 1)[..4], *b"aaaa");
        let in_order = MemMedium::new().in_order();
        in_order.append(1, 0, b"a").unwrap();
        assert!(!in_order.can_rewrite());
        assert!(in_order.rewrite(1, 0, b"b").is_err());
    }

    #[test]
    fn append_only_and_errors() {
        let m = MemMedium::with_segment_capacity(8);
        m.append(1, 0, b"abc").unwrap();
        assert_eq!(
            m.append(1, 2, b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            m.append(1, 0, b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            m.append(1, 3, b"123456").unwrap_err().kind(),
            io::ErrorKind::InvalidInput,
            "beyond capacity"
        );
        assert_eq!(
            m.append(2, 5, b"x").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let mut buf = [0u8; 4];
        assert_eq!(
            m.read(1, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            m.read(9, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(m.write_superblock(Slot::A, &[0; 4097]).is_err());
        m.delete_segment(1).unwrap();
        m.delete_segment(1).unwrap();
        assert_eq!(m.list_segments().unwrap(), Vec::<SegmentId>::new());
    }

    #[test]
    fn superblock_slots_are_independent() {
        let m = MemMedium::new();
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None);
        m.write_superblock(Slot::A, b"a1").unwrap();
        m.write_superblock(Slot::B, b"b1").unwrap();
        m.write_superblock(Slot::A, b"a2").unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"a2");
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"b1");
    }

    /// A medium with synced content and three unsynced writes.
    fn with_pending() -> MemMedium {
        let m = MemMedium::new();
        m.append(1, 0, b"durable").unwrap();
        m.write_superblock(Slot::A, b"sb-old").unwrap();
        m.sync().unwrap();
        m.append(1, 7, b"-more").unwrap();
        m.write_superblock(Slot::A, b"sb-new!").unwrap();
        m.delete_segment(1).unwrap();
        m
    }

    #[test]
    fn crash_drop_unsynced_keeps_only_synced() {
        let m = with_pending();
        assert_eq!(m.unsynced_ops(), 3);
        let c = m.crash(TearMode::DropUnsynced, 0);
        assert_eq!(read_all(&c, 1), b"durable");
        assert_eq!(c.read_superblock(Slot::A).unwrap().unwrap(), b"sb-old");
        assert_eq!(c.unsynced_ops(), 0);
        // The original is untouched.
        assert_eq!(m.list_segments().unwrap(), Vec::<SegmentId>::new());
    }

    #[test]
    fn crash_keep_prefix_and_all() {
        let m = with_pending();
        let c = m.crash(TearMode::KeepPrefix(1), 0);
        assert_eq!(read_all(&c, 1), b"durable-more");
        assert_eq!(c.read_superblock(Slot::A).unwrap().unwrap(), b"sb-old");
        let c = m.crash(TearMode::KeepPrefix(2), 0);
        assert_eq!(c.read_superblock(Slot::A).unwrap().unwrap(), b"sb-new!");
        assert_eq!(c.list_segments().unwrap(), vec![1]);
        let c = m.crash(TearMode::KeepPrefix(99), 0);
        assert!(c.list_segments().unwrap().is_empty());
        let c = m.crash(TearMode::KeepAll, 0);
        assert!(c.list_segments().unwrap().is_empty());
        assert_eq!(c.read_superblock(Slot::A).unwrap().unwrap(), b"sb-new!");
    }

    #[test]
    fn synced_writes_always_survive() {
        let m = with_pending();
        for seed in 0..200 {
            for tear in [
                TearMode::DropUnsynced,
                TearMode::RandomSubset,
                TearMode::Torn,
                TearMode::Chaos,
            ] {
                let c = m.crash(tear, seed);
                // Segment 1 is either deleted (the delete survived) or starts
                // with its synced bytes.
                if let Some(len) = c.segment_len(1).unwrap() {
                    assert!(len >= 7);
                    assert_eq!(&read_all(&c, 1)[..7], b"durable");
                }
                let sb = c.read_superblock(Slot::A).unwrap().unwrap();
                if tear != TearMode::Chaos && tear != TearMode::Torn {
                    assert!(sb == b"sb-old" || sb == b"sb-new!", "{sb:?}");
                }
            }
        }
    }

    #[test]
    fn torn_append_is_strict_prefix() {
        let m = MemMedium::new();
        m.append(1, 0, b"base").unwrap();
        m.sync().unwrap();
        m.append(1, 4, b"0123456789").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..100 {
            let c = m.crash(TearMode::TornAt(1), seed);
            let got = read_all(&c, 1);
            assert!(got.len() < 14);
            assert_eq!(&got[..], &b"base0123456789"[..got.len()]);
            seen.insert(got.len());
        }
        assert!(seen.len() > 3, "cut point should vary with the seed");
    }

    #[test]
    fn torn_superblock_is_new_prefix_over_old() {
        let m = MemMedium::new();
        m.write_superblock(Slot::B, b"OLDOLDOLDOLD").unwrap();
        m.write_superblock(Slot::A, b"other").unwrap();
        m.sync().unwrap();
        m.write_superblock(Slot::B, b"newnew").unwrap();
        for seed in 0..50 {
            let c = m.crash(TearMode::TornAt(1), seed);
            let sb = c.read_superblock(Slot::B).unwrap().unwrap();
            assert_eq!(sb.len(), 12);
            let cut = sb.iter().take_while(|b| b.is_ascii_lowercase()).count();
            assert!(cut < 6);
            assert_eq!(&sb[..cut], &b"newnew"[..cut]);
            assert_eq!(&sb[cut..], &b"OLDOLDOLDOLD"[cut..]);
            // The other slot is never affected.
            assert_eq!(c.read_superblock(Slot::A).unwrap().unwrap(), b"other");
        }
        // Tearing a first-ever write at 0 leaves the slot unwritten.
        let m = MemMedium::new();
        m.write_superblock(Slot::A, b"x").unwrap();
        let c = m.crash(TearMode::TornAt(1), 0);
        assert_eq!(c.read_superblock(Slot::A).unwrap(), None);
    }

    #[test]
    fn random_subset_can_leave_holes_and_is_deterministic() {
        let m = MemMedium::new();
        m.append(1, 0, b"aaaa").unwrap();
        m.append(1, 4, b"bbbb").unwrap();
        let mut holes = 0;
        for seed in 0..64 {
            let c1 = m.crash(TearMode::RandomSubset, seed);
            let c2 = m.crash(TearMode::RandomSubset, seed);
            let a = c1.segment_len(1).unwrap().map(|_| read_all(&c1, 1));
            let b = c2.segment_len(1).unwrap().map(|_| read_all(&c2, 1));
            assert_eq!(a, b);
            match a.as_deref() {
                None | Some(b"aaaa") | Some(b"aaaabbbb") => {}
                Some(b"\0\0\0\0bbbb") => holes += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(holes > 0);
    }

    #[test]
    fn clone_state_is_independent_and_keeps_pending() {
        let m = with_pending();
        let c = m.clone_state();
        assert_eq!(c.unsynced_ops(), 3);
        c.append(7, 0, b"x").unwrap();
        assert_eq!(m.segment_len(7).unwrap(), None);
        let crashed = c.crash(TearMode::DropUnsynced, 0);
        assert_eq!(read_all(&crashed, 1), b"durable");
    }

    #[test]
    fn from_ops_splits_durable_and_pending() {
        let ops = vec![
            Op::Append {
                id: 1,
                offset: 0,
                data: Arc::from(&b"ab"[..]),
            },
            Op::Sync,
            Op::Append {
                id: 1,
                offset: 2,
                data: Arc::from(&b"cd"[..]),
            },
        ];
        let m = MemMedium::from_ops(100, &ops);
        assert_eq!(read_all(&m, 1), b"abcd");
        assert_eq!(m.unsynced_ops(), 1);
        assert_eq!(
            read_all(&m.crash(TearMode::DropUnsynced, 0), 1),
            b"ab".to_vec()
        );
        assert_eq!(m.segment_capacity(), 100);
    }

    #[test]
    fn crashing_many_times_is_cheap() {
        // ~4 MB store in 4 KiB appends; 10k crashes must be quick.
        let m = MemMedium::new();
        let block = vec![7u8; 4096];
        for seg in 0..4u32 {
            for i in 0..256u64 {
                m.append(seg, i * 4096, &block).unwrap();
            }
        }
        m.sync().unwrap();
        m.append(9, 0, &block).unwrap();
        let t = std::time::Instant::now();
        for seed in 0..10_000 {
            let c = m.crash(TearMode::Torn, seed);
            assert_eq!(c.segment_len(0).unwrap(), Some(1 << 20));
        }
        assert!(t.elapsed().as_secs() < 20, "{:?}", t.elapsed());
    }
}
