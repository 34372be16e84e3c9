//! A gate test wrappers hold calls at, and the medium whose reads or syncs wait at one, to pin down what runs meanwhile.

use oubli_core::{Medium, SegmentId, Slot};
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a [`GateMedium`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gated {
    Reads,
    Syncs,
}

/// A medium whose reads or syncs can be held at a gate (the way
/// `SlowVault` holds a rotation): what reads or syncs the medium then
/// waits until the test lets it go, and [`waiting`](Self::waiting) says
/// how many calls wait at once (how many reads a front-end puts in the
/// medium's queue together, say). It also notes two syncs running at
/// once, which a medium like `DirMedium` (it takes its dirty set, then
/// fsyncs) does not survive: the second may return before the first's
/// data is down.
#[derive(Debug)]
pub struct GateMedium<M: Medium> {
    inner: M,
    gated: Gated,
    gate: Gate,
    /// Syncs running now, the most that ever ran at once, and how many ran.
    syncing: Mutex<(usize, usize, usize)>,
    /// Sleep inside each sync, to widen the window two syncs could share.
    sync_delay: Duration,
}

/// A gate that calls can be held at: while the test holds it, every call
/// that [`pass`](Self::pass)es waits until the test releases it or lets it
/// through. [`GateMedium`] holds a medium's reads or syncs at one; a test
/// wrapper of another seam (a crypto provider, say) can hold its own calls.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    held: bool,
    /// Calls waiting at the gate now.
    waiting: usize,
    /// Calls it lets through while held.
    let_through: usize,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds every call that passes from now on.
    pub fn hold(&self) {
        self.lock().held = true;
    }

    /// Opens the gate: the calls waiting at it go on.
    pub fn release(&self) {
        self.lock().held = false;
        self.changed.notify_all();
    }

    /// Lets the next `n` calls through a held gate, and waits until they
    /// are through (it stays held for the ones after).
    pub fn let_through(&self, n: usize) {
        let mut g = self.lock();
        g.let_through += n;
        self.changed.notify_all();
        while g.let_through > 0 {
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits until a call is held at the gate (panics after 20 s: the
    /// call the test expects never came).
    pub fn wait_until_entered(&self) {
        assert!(
            self.wait_for_waiting(1, Duration::from_secs(20)) >= 1,
            "no call reached the gate within 20 s"
        );
    }

    /// Waits until `n` calls are held at the gate together, at most
    /// `limit`; returns how many wait when it stops waiting.
    pub fn wait_for_waiting(&self, n: usize, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut g = self.lock();
        while g.waiting < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        g.waiting
    }

    /// How many calls wait at the gate now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Waits at the gate while it is held (unless let through).
    pub fn pass(&self) {
        let mut g = self.lock();
        if g.held {
            g.waiting += 1;
            self.changed.notify_all();
            while g.held && g.let_through == 0 {
                g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            if g.held {
                g.let_through -= 1; // let through while held
            }
            g.waiting -= 1;
            self.changed.notify_all();
        }
    }

    /// Blocks until at least `n` calls wait at the gate, however long that
    /// takes.
    pub fn wait_for_waiters(&self, n: usize) {
        let mut g = self.lock();
        while g.waiting < n {
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<M: Medium> GateMedium<M> {
    /// Wraps `inner`, gating `gated`; the gate starts open.
    pub fn new(inner: M, gated: Gated) -> Self {
        GateMedium {
            inner,
            gated,
            gate: Gate::default(),
            syncing: Mutex::new((0, 0, 0)),
            sync_delay: Duration::ZERO,
        }
    }

    /// Sleeps this long inside each sync.
    pub fn with_sync_delay(mut self, delay: Duration) -> Self {
        self.sync_delay = delay;
        self
    }

    /// The wrapped medium (to crash it, say).
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// [`Gate::hold`] at the medium's gate.
    pub fn hold(&self) {
        self.gate.hold()
    }

    /// [`Gate::release`] at the medium's gate.
    pub fn release(&self) {
        self.gate.release()
    }

    /// [`Gate::let_through`] at the medium's gate.
    pub fn let_through(&self, n: usize) {
        self.gate.let_through(n)
    }

    /// [`Gate::wait_until_entered`] at the medium's gate.
    pub fn wait_until_entered(&self) {
        self.gate.wait_until_entered()
    }

    /// [`Gate::wait_for_waiting`] at the medium's gate.
    pub fn wait_for_waiting(&self, n: usize, limit: Duration) -> usize {
        self.gate.wait_for_waiting(n, limit)
    }

    /// [`Gate::waiting`] at the medium's gate.
    pub fn waiting(&self) -> usize {
        self.gate.waiting()
    }

    /// The most syncs that ever ran at once.
    pub fn most_syncs_at_once(&self) -> usize {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Syncs so far.
    pub fn syncs(&self) -> usize {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner()).2
    }

    fn pass(&self, what: Gated) {
        if what == self.gated {
            self.gate.pass();
        }
    }
}

impl<M: Medium> Medium for GateMedium<M> {
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
        self.pass(Gated::Reads);
        self.inner.read(id, offset, buf)
    }
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        self.inner.space()
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        self.inner.segment_len(id)
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        self.inner.list_segments()
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.inner.delete_segment(id)
    }
    fn sync(&self) -> io::Result<()> {
        {
            let mut s = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
            s.0 += 1;
            s.1 = s.1.max(s.0);
            s.2 += 1;
        }
        self.pass(Gated::Syncs);
        std::thread::sleep(self.sync_delay);
        let result = self.inner.sync();
        self.syncing.lock().unwrap_or_else(|e| e.into_inner()).0 -= 1;
        result
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        self.inner.read_superblock(slot)
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.inner.write_superblock(slot, data)
    }
}
