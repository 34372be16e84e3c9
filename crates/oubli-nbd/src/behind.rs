//! Write-behind: a WRITE without FUA is acknowledged once its data is queued, and one thread carries the queue out in order.
//!
//! NBD asks no more of a write's reply than a disk's volatile cache gives:
//! later reads see the data, and it is durable once a FLUSH (or FUA)
//! completes. nbdkit's `file` plugin and qemu-nbd reply once the bytes are in
//! the page cache. Before this queue, oubli replied only after sealing and
//! logging the write, so a client that waits for each reply (the loop device
//! under a file system writes back 512 KiB at a time, one after another)
//! paid for the encryption in its own latency. Queued, the sealing of one
//! write overlaps the client's work towards the next.
//!
//! What keeps the reply's promises:
//!
//! - **Order.** One thread applies the queue first in, first out, so two
//!   writes to the same block land in the order their replies went out.
//! - **Reads see acknowledged writes.** Every other request (READ, FLUSH,
//!   TRIM, WRITE_ZEROES, a FUA write), on any connection, first waits until
//!   the writes queued before it arrived are applied ([`WriteBehind::mark`],
//!   [`WriteBehind::wait_for`]). That is also what `NBD_FLAG_CAN_MULTI_CONN`
//!   promises across connections.
//! - **FLUSH covers them.** A flush waits the same way, so everything
//!   acknowledged before it is in the store when `Store::flush` runs.
//! - **Failures are not lost.** A queued write that fails (a full disk, an
//!   I/O error) has already been acknowledged; like a page cache's writeback
//!   error, it is reported by the next FLUSH or FUA request of every
//!   connection open when it failed, and logged at once.
//! - **Commits see them.** A connection waits for its queued writes before it
//!   ends, the server before its shutdown commit, and `oubli serve` before
//!   a commit asked for on the control socket or by SIGUSR1
//!   ([`WriteBehind::settle`]): an overwrite acknowledged before `oubli
//!   commit` is erased by it.
//! - **Memory is bounded.** The queue holds at most [`QUEUE_BYTES`] of
//!   payloads (a reader outrunning the applier waits to queue more), and a
//!   queued write keeps holding its payload budget
//!   (`ServerConfig::max_inflight_bytes` and the connection's share) until
//!   it is applied.

use crate::proto::Errno;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The payload bytes the queue holds at most (one larger write still goes
/// in, alone). A few requests' worth is all the overlap needs; without it,
/// the queue filled the whole payload budget (256 MiB) and `oubli serve`
/// peaked at 470 MiB in bench/nbd.
pub const QUEUE_BYTES: u64 = 32 << 20;

/// What a failed request replies: the error number and a message.
pub(crate) type Failure = (Errno, String);

/// The queue of acknowledged writes waiting to be applied. Made by the
/// caller of [`crate::serve`] (through `ServerConfig::write_behind`) so that
/// whoever else commits the store can [`settle`](Self::settle) it first.
pub struct WriteBehind<T = crate::server::Queued> {
    state: Mutex<State<T>>,
    /// The most payload bytes queued at once ([`QUEUE_BYTES`] by default).
    cap: u64,
    /// Signalled when a write is queued or the applier is told to stop.
    queued: Condvar,
    /// Signalled when writes have been applied (or the applier is gone).
    applied: Condvar,
}

struct State<T> {
    waiting: VecDeque<(T, u64)>,
    /// Payload bytes of the writes waiting or being applied.
    bytes: u64,
    /// Writes ever queued; a write's sequence number is this count once it is in.
    pushed: u64,
    /// Writes applied (or given up on), in order: every write numbered up to here is done.
    done: u64,
    /// Writes that failed after their reply, ever; the newest one's reply.
    failures: u64,
    last_failure: Option<Failure>,
    /// An applier is taking writes off the queue.
    applier: bool,
    stopping: bool,
}

impl<T> Default for WriteBehind<T> {
    fn default() -> Self {
        WriteBehind {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                bytes: 0,
                pushed: 0,
                done: 0,
                failures: 0,
                last_failure: None,
                applier: false,
                stopping: false,
            }),
            cap: QUEUE_BYTES,
            queued: Condvar::new(),
            applied: Condvar::new(),
        }
    }
}

impl<T> WriteBehind<T> {
    /// An empty queue with no applier yet ([`crate::serve`] starts one).
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every write acknowledged so far is in the store.
    pub fn settle(&self) {
        let mark = self.mark();
        self.wait_for(mark);
    }

    /// Queues a write of `bytes` payload bytes, first waiting while the
    /// queue holds its cap; gives it back if no applier runs (the caller
    /// then carries it out itself, before replying).
    pub(crate) fn push(&self, write: T, bytes: u64) -> Result<(), T> {
        let mut s = self.lock();
        while s.applier && !s.stopping && s.bytes > 0 && s.bytes + bytes > self.cap {
            s = self.applied.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if !s.applier || s.stopping {
            return Err(write);
        }
        s.waiting.push_back((write, bytes));
        s.bytes += bytes;
        s.pushed += 1;
        drop(s);
        self.queued.notify_one();
        Ok(())
    }

    /// The sequence number of the newest write queued so far.
    pub(crate) fn mark(&self) -> u64 {
        self.lock().pushed
    }

    /// Waits until the writes numbered up to `mark` are applied.
    pub(crate) fn wait_for(&self, mark: u64) {
        let mut s = self.lock();
        while s.done < mark && s.applier {
            s = self.applied.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The count of failures so far: a connection remembers it when it starts
    /// and hands it to [`unreported`](Self::unreported).
    pub(crate) fn failures(&self) -> u64 {
        self.lock().failures
    }

    /// A failure this connection has not been told of yet (and marks it told).
    pub(crate) fn unreported(&self, seen: &AtomicU64) -> Option<Failure> {
        let s = self.lock();
        let before = seen.swap(s.failures, Ordering::Relaxed);
        (s.failures > before).then(|| {
            let (errno, msg) = s.last_failure.clone().unwrap_or((Errno::Io, String::new()));
            let more = s.failures - before;
            let msg = format!(
                "{more} write(s) acknowledged before this request failed when carried out; the last: {msg}"
            );
            (errno, msg)
        })
    }

    /// Registers the applier. Until [`stop`](Self::stop), writes are queued.
    pub(crate) fn start(&self) {
        let mut s = self.lock();
        s.applier = true;
        s.stopping = false;
    }

    /// Tells the applier to finish the queue and return. A reader still
    /// waiting to queue (none, when the server stops: its connections have
    /// ended) carries its write out itself.
    pub(crate) fn stop(&self) {
        self.lock().stopping = true;
        self.queued.notify_all();
        self.applied.notify_all();
    }

    /// For the applier: every write waiting, oldest first (waits for one);
    /// `None` once stopping and nothing is left.
    pub(crate) fn next_batch(&self) -> Option<Vec<(T, u64)>> {
        let mut s = self.lock();
        loop {
            if !s.waiting.is_empty() {
                return Some(s.waiting.drain(..).collect());
            }
            if s.stopping {
                return None;
            }
            s = self.queued.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// For the applier: one more write (of `bytes`) is applied, with its outcome.
    pub(crate) fn applied(&self, bytes: u64, outcome: Result<(), Failure>) {
        let mut s = self.lock();
        s.done += 1;
        s.bytes -= bytes;
        if let Err(f) = outcome {
            s.failures += 1;
            s.last_failure = Some(f);
        }
        drop(s);
        self.applied.notify_all();
    }

    /// For the applier, when it returns (or unwinds): writes it did not
    /// apply count as failed, and nobody waits for it any more.
    pub(crate) fn applier_gone(&self) {
        let mut s = self.lock();
        let lost = s.pushed - s.done;
        if lost > 0 {
            s.failures += 1;
            s.last_failure = Some((
                Errno::Io,
                format!("{lost} write(s) were never carried out: the write-behind thread stopped"),
            ));
        }
        s.waiting.clear();
        s.bytes = 0;
        s.done = s.pushed;
        s.applier = false;
        drop(s);
        self.applied.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_full_queue_makes_the_next_push_wait_for_the_applier() {
        let q: Arc<WriteBehind<u32>> = Arc::new(WriteBehind::new());
        q.start();
        q.push(1, QUEUE_BYTES - 1).unwrap();
        let in_queue = Arc::new(AtomicBool::new(false));
        let pusher = {
            let (q, in_queue) = (q.clone(), in_queue.clone());
            std::thread::spawn(move || {
                q.push(2, 2).unwrap();
                in_queue.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!in_queue.load(Ordering::SeqCst), "the cap was not kept");
        let batch = q.next_batch().unwrap();
        assert_eq!(batch, vec![(1, QUEUE_BYTES - 1)]);
        q.applied(QUEUE_BYTES - 1, Ok(()));
        pusher.join().unwrap();
        assert!(in_queue.load(Ordering::SeqCst));
        // One write larger than the cap still goes in, alone.
        assert_eq!(q.next_batch().unwrap(), vec![(2, 2)]);
        q.applied(2, Ok(()));
        q.push(3, 2 * QUEUE_BYTES).unwrap();
        q.stop();
        q.applier_gone();
    }

    #[test]
    fn waiters_wake_once_their_writes_are_applied_and_failures_reach_each_connection_once() {
        let q: Arc<WriteBehind<u32>> = Arc::new(WriteBehind::new());
        assert_eq!(
            q.push(1, 8),
            Err(1),
            "without an applier the caller applies"
        );
        q.start();
        let early = AtomicU64::new(q.failures());
        q.push(1, 8).unwrap();
        q.push(2, 8).unwrap();
        let mark = q.mark();
        assert_eq!(mark, 2);
        let applier = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(batch) = q.next_batch() {
                    for (w, bytes) in batch {
                        got.push(w);
                        let outcome = if w == 2 {
                            Err((Errno::NoSpc, "disk full".to_string()))
                        } else {
                            Ok(())
                        };
                        q.applied(bytes, outcome);
                    }
                }
                q.applier_gone();
                got
            })
        };
        q.wait_for(mark);
        let late = AtomicU64::new(q.failures());
        let (errno, msg) = q.unreported(&early).expect("the failure is reported");
        assert_eq!(errno, Errno::NoSpc);
        assert!(msg.contains("disk full"), "{msg}");
        assert!(
            q.unreported(&early).is_none(),
            "reported once per connection"
        );
        assert!(
            q.unreported(&late).is_none(),
            "a connection opened after it is not told"
        );
        q.stop();
        assert_eq!(applier.join().unwrap(), vec![1, 2]);
        assert_eq!(q.push(3, 8), Err(3), "stopped: the caller applies again");
        q.settle();
    }
}
