//! `SlowVault`: wraps a vault and makes every rotation slow (a fixed delay) or hold until released, to measure and test what a slow TPM or token does to the engine.

use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A [`Vault`] wrapper whose `store` (the rotation) first sleeps for a fixed
/// delay — a TPM or a PKCS#11 token takes 20–50 ms there — and, while a
/// test [`hold`](Self::hold)s it, waits until [`release`](Self::release).
/// Everything else passes straight through.
#[derive(Debug)]
pub struct SlowVault<V: Vault> {
    inner: V,
    delay: Duration,
    gate: Mutex<Gate>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Gate {
    held: bool,
    /// Stores that have entered and not yet returned.
    inside: u32,
}

impl<V: Vault> SlowVault<V> {
    pub fn new(inner: V, delay: Duration) -> Self {
        SlowVault {
            inner,
            delay,
            gate: Mutex::new(Gate::default()),
            changed: Condvar::new(),
        }
    }

    pub fn inner(&self) -> &V {
        &self.inner
    }

    /// Stores from now on wait inside the vault until [`release`](Self::release).
    pub fn hold(&self) {
        self.gate().held = true;
    }

    /// Lets held stores (and later ones) through.
    pub fn release(&self) {
        self.gate().held = false;
        self.changed.notify_all();
    }

    /// Blocks until a store is waiting inside the vault (after [`hold`](Self::hold)).
    pub fn wait_until_entered(&self) {
        let mut g = self.gate();
        while g.inside == 0 {
            g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn gate(&self) -> std::sync::MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<V: Vault> Vault for SlowVault<V> {
    fn info(&self) -> VaultInfo {
        self.inner.info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        self.inner.load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        {
            let mut g = self.gate();
            g.inside += 1;
            self.changed.notify_all();
            while g.held {
                g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        }
        std::thread::sleep(self.delay);
        let stored = self.inner.store(record);
        self.gate().inside -= 1;
        stored
    }
    fn write_count(&self) -> Result<u64, VaultError> {
        self.inner.write_count()
    }
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        self.inner.readable_records()
    }
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        self.inner.erase_leftovers()
    }
}
