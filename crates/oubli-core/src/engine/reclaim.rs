//! Deletes the segments no tree references any more, on a thread of its own, outside the engine lock (DESIGN §7).
//!
//! Deleting is for space only: a segment handed over here is unreadable
//! already (its units' keys are gone, or it held only dead units), so the
//! moment it goes is no part of any guarantee. It is slow, though:
//! unlinking a 64 MiB segment file took about 18 ms on ext4, and a cleaner
//! run frees dozens. Done under the engine lock, that was a pause of up to
//! 600 ms for every writer; done by the thread that committed, a pause for
//! that writer (the NBD server's only one).

use crate::medium::{Medium, SegmentId};
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

/// Hands segments to the deleting thread (started on first use).
pub(super) struct Reclaimer {
    medium: Arc<dyn Medium>,
    /// Readers outside the engine lock hold it shared (see `Shared::io_guard`).
    io_guard: Arc<RwLock<()>>,
    state: Arc<(Mutex<Queue>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Queue {
    /// Handed over, not yet taken by the thread.
    waiting: Vec<SegmentId>,
    /// Handed over and not yet deleted (taken or not).
    unfinished: BTreeSet<SegmentId>,
    stop: bool,
}

impl Reclaimer {
    pub(super) fn new(medium: Arc<dyn Medium>, io_guard: Arc<RwLock<()>>) -> Reclaimer {
        Reclaimer {
            medium,
            io_guard,
            state: Arc::default(),
            thread: Mutex::new(None),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.state.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `segments` for deletion. The caller has made sure no tree of
    /// the store references them; a reader that found one earlier holds the
    /// I/O guard shared, and the thread waits for it before deleting.
    pub(super) fn hand_over(&self, segments: Vec<SegmentId>) {
        if segments.is_empty() {
            return;
        }
        {
            let mut q = self.queue();
            q.unfinished.extend(segments.iter().copied());
            q.waiting.extend(segments);
        }
        self.state.1.notify_all();
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let (medium, guard, state) = (
                self.medium.clone(),
                self.io_guard.clone(),
                self.state.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("oubli-reclaim".into())
                .spawn(move || delete_until_stopped(&*medium, &guard, &state));
            match spawned {
                Ok(handle) => *thread = Some(handle),
                // No thread to be had: delete here (correct, only slower).
                Err(_) => delete_waiting(&*self.medium, &self.io_guard, &self.state),
            }
        }
    }

    /// Whether `segment` was handed over and is not deleted yet: its bytes
    /// are not counted as the store's.
    pub(super) fn is_unfinished(&self, segment: SegmentId) -> bool {
        self.queue().unfinished.contains(&segment)
    }

    /// Waits until every segment handed over so far is deleted (or its
    /// deletion failed: deletion errors are ignored, as before).
    pub(super) fn wait_idle(&self) {
        let mut q = self.queue();
        while !q.unfinished.is_empty() {
            q = self.state.1.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Reclaimer {
    /// Deletes what is still queued, then ends the thread.
    fn drop(&mut self) {
        self.queue().stop = true;
        self.state.1.notify_all();
        let thread = self.thread.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = thread.take() {
            let _ = handle.join();
        }
    }
}

fn delete_until_stopped(
    medium: &dyn Medium,
    io_guard: &RwLock<()>,
    state: &(Mutex<Queue>, Condvar),
) {
    loop {
        {
            let mut q = state.0.lock().unwrap_or_else(|p| p.into_inner());
            while q.waiting.is_empty() && !q.stop {
                q = state.1.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.waiting.is_empty() {
                return;
            }
        }
        delete_waiting(medium, io_guard, state);
    }
}

/// Deletes every segment waiting, one at a time.
fn delete_waiting(medium: &dyn Medium, io_guard: &RwLock<()>, state: &(Mutex<Queue>, Condvar)) {
    let batch = std::mem::take(&mut state.0.lock().unwrap_or_else(|p| p.into_inner()).waiting);
    // A barrier, not a hold: readers that found a unit in these segments
    // took the guard before the engine lock let go of the tree that named
    // it, and no tree names them now, so once every such reader is done
    // none can come.
    drop(io_guard.write().unwrap_or_else(|p| p.into_inner()));
    for segment in batch {
        let _ = medium.delete_segment(segment);
        let mut q = state.0.lock().unwrap_or_else(|p| p.into_inner());
        q.unfinished.remove(&segment);
        drop(q);
        state.1.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::Slot;
    use std::io;
    use std::time::Duration;

    /// A medium that only records which segments were deleted.
    #[derive(Default)]
    struct Deletions(Mutex<Vec<SegmentId>>);

    impl Deletions {
        fn deleted(&self) -> Vec<SegmentId> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Medium for Deletions {
        fn describe(&self) -> String {
            "deletions".into()
        }
        fn segment_capacity(&self) -> u64 {
            1 << 20
        }
        fn append(&self, _: SegmentId, _: u64, _: &[u8]) -> io::Result<()> {
            unreachable!("the reclaimer only deletes")
        }
        fn read(&self, _: SegmentId, _: u64, _: &mut [u8]) -> io::Result<()> {
            unreachable!("the reclaimer only deletes")
        }
        fn segment_len(&self, _: SegmentId) -> io::Result<Option<u64>> {
            unreachable!("the reclaimer only deletes")
        }
        fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
            unreachable!("the reclaimer only deletes")
        }
        fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
            self.0.lock().unwrap().push(id);
            Ok(())
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn read_superblock(&self, _: Slot) -> io::Result<Option<Vec<u8>>> {
            unreachable!("the reclaimer only deletes")
        }
        fn write_superblock(&self, _: Slot, _: &[u8]) -> io::Result<()> {
            unreachable!("the reclaimer only deletes")
        }
    }

    #[test]
    fn a_reader_in_progress_keeps_the_segments_it_may_read() {
        let medium = Arc::new(Deletions::default());
        let io_guard = Arc::new(RwLock::new(()));
        let reclaimer = Reclaimer::new(medium.clone(), io_guard.clone());
        let reading = io_guard.read().unwrap();
        reclaimer.hand_over(vec![7, 8]);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            medium.deleted(),
            Vec::<SegmentId>::new(),
            "deleted under a reader"
        );
        assert!(reclaimer.is_unfinished(7) && reclaimer.is_unfinished(8));
        drop(reading);
        reclaimer.wait_idle();
        assert_eq!(medium.deleted(), vec![7, 8]);
        assert!(!reclaimer.is_unfinished(7));
    }

    #[test]
    fn dropping_the_reclaimer_deletes_what_it_was_handed() {
        let medium = Arc::new(Deletions::default());
        let reclaimer = Reclaimer::new(medium.clone(), Arc::default());
        for id in 0..100 {
            reclaimer.hand_over(vec![id]);
        }
        drop(reclaimer);
        assert_eq!(medium.deleted(), (0..100).collect::<Vec<_>>());
    }
}
