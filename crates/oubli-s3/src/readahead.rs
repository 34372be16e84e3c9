//! Read-ahead for sequential readers of the S3 medium: aligned windows of runs, fetched in the background ahead of the reader, a bounded number kept.
//!
//! A run is cut into windows of [`READ_AHEAD`] bytes at fixed positions
//! (window `i` is bytes `[i·W, (i+1)·W)` of the run). A sequential reader
//! reads through windows and, after each read, asks for the next
//! [`PREFETCH_DEPTH`] windows (into the segment's next runs too), which
//! are fetched on the medium's runtime while it consumes the current one:
//! a stream costs one round trip at its start instead of one per window.
//! Runs never change, so a window stays right until its segment is deleted.
//! At most [`READ_AHEAD_WINDOWS`] windows, ready or in flight, exist at
//! once: the memory cap.

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use oubli_core::SegmentId;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Bytes of one window.
pub const READ_AHEAD: u64 = 4 << 20;

/// How many windows may exist at once, fetched or in flight: with
/// [`READ_AHEAD`], the cap on the memory they hold (64 MiB).
pub const READ_AHEAD_WINDOWS: usize = 16;

/// How many windows ahead of a sequential reader are fetched.
pub const PREFETCH_DEPTH: u64 = 4;

/// How far from the end of the reads so far a read may start and still
/// continue a stream (the engine opens a large read's cells on several
/// threads, whose reads reach the medium in any order).
pub const STREAM_SLACK: u64 = 1 << 20;

/// A run as the reader sees it: `run_len` bytes of the segment from
/// `run_at`, stored in `object` from byte `base`.
#[derive(Clone)]
pub(crate) struct RunRef {
    pub run_at: u64,
    pub run_len: u64,
    pub object: ObjectPath,
    pub base: u64,
}

/// (segment, run offset, window index).
type WindowKey = (SegmentId, u64, u64);

#[derive(Default)]
struct Windows {
    /// Fetched windows, oldest first.
    ready: VecDeque<(WindowKey, Bytes)>,
    in_flight: HashSet<WindowKey>,
    /// Where the last read of each segment ended, and its streak.
    last_end: HashMap<SegmentId, (u64, u32)>,
    /// Bumped by every deletion: a fetch started before one is dropped on
    /// arrival (its segment may be gone, and a medium may reuse an id).
    generation: u64,
}

impl Windows {
    fn find(&self, key: WindowKey) -> Option<Bytes> {
        self.ready
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, b)| b.clone())
    }
}

#[derive(Default)]
pub(crate) struct ReadAhead {
    windows: Mutex<Windows>,
    arrived: Condvar,
    /// GETs sent for windows (and direct reads after a failed one).
    pub gets: std::sync::atomic::AtomicU64,
}

impl ReadAhead {
    fn lock(&self) -> MutexGuard<'_, Windows> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many reads of segment `id` in a row, this one included, each
    /// started near where the furthest one before ended (0: this one does
    /// not continue them); records where this one ends. "Near" is within
    /// [`STREAM_SLACK`]: a reader that splits a large read over threads
    /// issues its parts in any order. One continued read reads through
    /// windows; from the second the windows ahead are fetched too (two
    /// neighbouring random reads should not cost 16 MiB of GETs).
    pub fn streak(&self, id: SegmentId, offset: u64, end: u64) -> u32 {
        let mut w = self.lock();
        let (streak, furthest) = match w.last_end.get(&id) {
            Some(&(last, n)) if offset.abs_diff(last) <= STREAM_SLACK => {
                (n.saturating_add(1), last.max(end))
            }
            _ => (0, end),
        };
        w.last_end.insert(id, (furthest, streak));
        streak
    }

    /// Copies `out.len()` bytes from `from` of a run out of fetched
    /// windows, if they hold all of them.
    pub fn copy_if_ready(&self, id: SegmentId, run: &RunRef, from: u64, out: &mut [u8]) -> bool {
        let w = self.lock();
        let mut at = from;
        let end = from + out.len() as u64;
        while at < end {
            let index = at / READ_AHEAD;
            let Some(bytes) = w.find((id, run.run_at, index)) else {
                return false;
            };
            let start = index * READ_AHEAD;
            let n = (end.min(start + bytes.len() as u64) - at) as usize;
            let from_in = (at - start) as usize;
            if bytes.len() < from_in + n || n == 0 {
                return false;
            }
            out[(at - from) as usize..][..n].copy_from_slice(&bytes[from_in..from_in + n]);
            at += n as u64;
        }
        true
    }

    /// Reads `out.len()` bytes from `from` of a run through its windows:
    /// each missing window is fetched (in parallel with the others) and
    /// waited for; a window whose fetch failed is read directly instead.
    pub fn read_through(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        store: &Arc<dyn ObjectStore>,
        id: SegmentId,
        run: &RunRef,
        from: u64,
        out: &mut [u8],
    ) -> Result<(), object_store::Error> {
        let end = from + out.len() as u64;
        let first = from / READ_AHEAD;
        let last = (end - 1) / READ_AHEAD;
        for index in first..=last {
            self.request(runtime, store, id, run, index, true);
        }
        let mut at = from;
        while at < end {
            let index = at / READ_AHEAD;
            let start = index * READ_AHEAD;
            let n = (end.min(start + READ_AHEAD).min(run.run_len) - at) as usize;
            let into = &mut out[(at - from) as usize..][..n];
            match self.wait_for((id, run.run_at, index)) {
                Some(bytes) if bytes.len() >= (at - start) as usize + n => {
                    let from_in = (at - start) as usize;
                    into.copy_from_slice(&bytes[from_in..from_in + n]);
                }
                _ => {
                    self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let range = run.base + at..run.base + at + n as u64;
                    let got = runtime.block_on(store.get_range(&run.object, range))?;
                    if got.len() != n {
                        return Err(object_store::Error::Generic {
                            store: "S3",
                            source: "short read".into(),
                        });
                    }
                    into.copy_from_slice(&got);
                }
            }
            at += n as u64;
        }
        Ok(())
    }

    /// Asks for the [`PREFETCH_DEPTH`] windows after byte `pos` of the
    /// first of `runs` (going on into the next ones).
    pub fn prefetch(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        store: &Arc<dyn ObjectStore>,
        id: SegmentId,
        runs: &[RunRef],
        pos: u64,
    ) {
        let mut wanted = PREFETCH_DEPTH;
        let mut index = pos / READ_AHEAD + 1;
        for run in runs {
            while wanted > 0 && index * READ_AHEAD < run.run_len {
                self.request(runtime, store, id, run, index, false);
                index += 1;
                wanted -= 1;
            }
            index = 0;
        }
    }

    /// Starts the fetch of a window unless it is ready or in flight. When
    /// the cap is reached, the oldest ready window makes room; a prefetch
    /// (not `needed`) finding none to evict is skipped.
    fn request(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        store: &Arc<dyn ObjectStore>,
        id: SegmentId,
        run: &RunRef,
        index: u64,
        needed: bool,
    ) {
        let key = (id, run.run_at, index);
        let generation = {
            let mut w = self.lock();
            if w.in_flight.contains(&key) || w.find(key).is_some() {
                return;
            }
            if w.ready.len() + w.in_flight.len() >= READ_AHEAD_WINDOWS
                && w.ready.pop_front().is_none()
                && !needed
            {
                return;
            }
            w.in_flight.insert(key);
            w.generation
        };
        let start = index * READ_AHEAD;
        let end = (start + READ_AHEAD).min(run.run_len);
        let range = run.base + start..run.base + end;
        let (store, object) = (store.clone(), run.object.clone());
        let this = self.clone();
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        runtime.spawn(async move {
            let got = store.get_range(&object, range).await;
            let mut w = this.lock();
            w.in_flight.remove(&key);
            if let Ok(bytes) = got {
                if w.generation == generation && bytes.len() as u64 == end - start {
                    w.ready.push_back((key, bytes));
                }
            }
            drop(w);
            this.arrived.notify_all();
        });
    }

    /// The window, once its fetch has arrived; `None` if it failed (or was
    /// never asked for).
    fn wait_for(&self, key: WindowKey) -> Option<Bytes> {
        let mut w = self.lock();
        loop {
            if let Some(bytes) = w.find(key) {
                return Some(bytes);
            }
            if !w.in_flight.contains(&key) {
                return None;
            }
            w = self.arrived.wait(w).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Drops the windows of a deleted segment (and any fetch in flight).
    pub fn forget(&self, id: SegmentId) {
        let mut w = self.lock();
        w.ready.retain(|((s, _, _), _)| *s != id);
        w.last_end.remove(&id);
        w.generation += 1;
    }
}
