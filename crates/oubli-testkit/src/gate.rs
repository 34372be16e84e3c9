//! `GateProvider`: a crypto provider whose sealing of whole cells can be held at a gate, to pin down what runs while a write seals outside the engine lock.

use crate::forward::forward_crypto;
use oubli_crypto::{CryptoProvider, SecretKey, TAG_LEN};
use oubli_media::Gate;
use std::sync::Arc;

/// Wraps a provider; while held, every `seal_detached` call waits at the
/// gate (the engine seals the whole cells of a large write with it, outside
/// its lock; `seal`, which it uses under the lock, is not held), and [`wait_for_waiters`](Self::wait_for_waiters) tells the test
/// when a call is there. The way `GateMedium` holds reads or syncs, at the
/// same [`Gate`].
pub struct GateProvider {
    inner: Arc<dyn CryptoProvider>,
    gate: Gate,
}

impl GateProvider {
    /// Wraps `inner`; the gate starts open.
    pub fn new(inner: Arc<dyn CryptoProvider>) -> Self {
        GateProvider {
            inner,
            gate: Gate::default(),
        }
    }

    /// Holds every `seal_detached` call from now on.
    pub fn hold(&self) {
        self.gate.hold()
    }

    /// Opens the gate: the calls waiting at it go on.
    pub fn release(&self) {
        self.gate.release()
    }

    /// Blocks until at least `n` calls wait at the gate.
    pub fn wait_for_waiters(&self, n: usize) {
        self.gate.wait_for_waiters(n)
    }
}

impl CryptoProvider for GateProvider {
    fn seal_detached(&self, key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        self.gate.pass();
        self.inner.seal_detached(key, aad, buf)
    }
    // Not gated: `seal`, which the engine uses for single cells, nodes and
    // frames under its lock.
    forward_crypto!(
        inner: name,
        is_secure,
        fill_random,
        seal,
        open_in_place,
        open_detached,
        open_within,
        derive,
    );
}
