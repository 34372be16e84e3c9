//! `FlakyVault`: wraps a vault and injects failures on demand, to test how the engine copes.

use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_crypto::SecretKey;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

/// A [`Vault`] wrapper whose failures are switched on by the test. Every
/// switch is an atomic, so a test thread can flip them while engine threads
/// use the vault.
///
/// Precedence: [`unavailable`](Self::unavailable) beats everything; then
/// [`fail_next_stores`](Self::fail_next_stores); then
/// [`fail_after_write_next_store`](Self::fail_after_write_next_store); then
/// [`cut_between_steps_next_store`](Self::cut_between_steps_next_store).
/// [`fail_erase`](Self::fail_erase) only affects `erase_leftovers`.
#[derive(Debug)]
pub struct FlakyVault<V: Vault> {
    inner: V,
    stores_to_fail: AtomicU32,
    fail_after_write: AtomicBool,
    garbage_load: AtomicBool,
    down: AtomicBool,
    cut_next: AtomicBool,
    erase_fails: AtomicBool,
    /// The old record a cut rotation left readable.
    leftover: Mutex<Option<VaultRecord>>,
}

impl<V: Vault> FlakyVault<V> {
    pub fn new(inner: V) -> Self {
        FlakyVault {
            inner,
            stores_to_fail: AtomicU32::new(0),
            fail_after_write: AtomicBool::new(false),
            garbage_load: AtomicBool::new(false),
            down: AtomicBool::new(false),
            cut_next: AtomicBool::new(false),
            erase_fails: AtomicBool::new(false),
            leftover: Mutex::new(None),
        }
    }

    /// The wrapped vault, to inspect what it really holds.
    pub fn inner(&self) -> &V {
        &self.inner
    }

    pub fn into_inner(self) -> V {
        self.inner
    }

    /// The next `n` stores fail with [`VaultError::Unavailable`] without
    /// touching the inner vault (replaces any count still pending).
    pub fn fail_next_stores(&self, n: u32) {
        self.stores_to_fail.store(n, Ordering::SeqCst);
    }

    /// The next store reaches the inner vault and *then* fails: the caller is
    /// told "failed" while the vault already holds the new record, as after a
    /// power cut between the write and the acknowledgement.
    pub fn fail_after_write_next_store(&self) {
        self.fail_after_write.store(true, Ordering::SeqCst);
    }

    /// The next successful load returns the stored record with one bit of its
    /// key flipped. The engine must see this as an authentication failure
    /// when it opens the superblock, never return data.
    pub fn garbage_on_next_load(&self) {
        self.garbage_load.store(true, Ordering::SeqCst);
    }

    /// The next store is cut between its two steps, as every real vault's
    /// rotation can be: the new record reaches the inner vault, the old one
    /// stays readable (a leftover, listed by `readable_records`), and the
    /// store fails.
    pub fn cut_between_steps_next_store(&self) {
        self.cut_next.store(true, Ordering::SeqCst);
    }

    /// While `true`, `erase_leftovers` fails and the leftover stays.
    pub fn fail_erase(&self, fail: bool) {
        self.erase_fails.store(fail, Ordering::SeqCst);
    }

    fn leftover(&self) -> std::sync::MutexGuard<'_, Option<VaultRecord>> {
        self.leftover.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// While `true`, every operation fails with [`VaultError::Unavailable`]
    /// (a removed token, a TPM in lockout).
    pub fn unavailable(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check_up(&self) -> Result<(), VaultError> {
        if self.down.load(Ordering::SeqCst) {
            Err(VaultError::Unavailable(
                "injected: vault unavailable".into(),
            ))
        } else {
            Ok(())
        }
    }
}

impl<V: Vault> Vault for FlakyVault<V> {
    /// The inner vault's info: the wrapper is meant to be invisible.
    fn info(&self) -> VaultInfo {
        self.inner.info()
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        self.check_up()?;
        let mut record = self.inner.load()?;
        if self.garbage_load.swap(false, Ordering::SeqCst) {
            let mut bytes = *record.key.expose();
            bytes[bytes.len() / 2] ^= 0x01;
            record.key = SecretKey::from_bytes(bytes);
            zeroize::Zeroize::zeroize(&mut bytes);
        }
        Ok(record)
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        self.check_up()?;
        // Decrement only if positive, atomically with the test.
        if self
            .stores_to_fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(VaultError::Unavailable("injected: store failed".into()));
        }
        if self.fail_after_write.swap(false, Ordering::SeqCst) {
            self.inner.store(record)?;
            return Err(VaultError::Unavailable(
                "injected: store failed after the record was written".into(),
            ));
        }
        if self.cut_next.swap(false, Ordering::SeqCst) {
            let old = self.inner.load().ok();
            self.inner.store(record)?;
            *self.leftover() = old;
            return Err(VaultError::Unavailable(
                "injected: rotation cut between its two steps".into(),
            ));
        }
        self.inner.store(record)?;
        // A complete rotation replaces whatever an earlier cut left.
        *self.leftover() = None;
        Ok(())
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        self.check_up()?;
        self.inner.write_count()
    }

    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        self.check_up()?;
        let mut records = self.inner.readable_records()?;
        records.extend(self.leftover().clone());
        Ok(records)
    }

    fn erase_leftovers(&self) -> Result<(), VaultError> {
        self.check_up()?;
        if self.erase_fails.load(Ordering::SeqCst) {
            return Err(VaultError::Unavailable(
                "injected: the old record cannot be destroyed".into(),
            ));
        }
        self.inner.erase_leftovers()?;
        *self.leftover() = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryVault;
    use std::sync::Arc;

    #[test]
    fn a_cut_rotation_leaves_the_old_record_until_erased() {
        let v = FlakyVault::new(MemoryVault::new(rec(1)));
        v.cut_between_steps_next_store();
        assert!(matches!(v.store(&rec(2)), Err(VaultError::Unavailable(_))));
        assert_eq!(v.load().unwrap(), rec(2));
        assert_eq!(v.readable_records().unwrap(), vec![rec(2), rec(1)]);
        v.fail_erase(true);
        assert!(v.erase_leftovers().is_err());
        assert_eq!(v.readable_records().unwrap().len(), 2);
        v.fail_erase(false);
        v.erase_leftovers().unwrap();
        assert_eq!(v.readable_records().unwrap(), vec![rec(2)]);
        // A later complete rotation also replaces a leftover.
        v.cut_between_steps_next_store();
        let _ = v.store(&rec(3));
        v.store(&rec(4)).unwrap();
        assert_eq!(v.readable_records().unwrap(), vec![rec(4)]);
    }

    fn rec(epoch: u64) -> VaultRecord {
        VaultRecord {
            store_id: [9; 16],
            epoch,
            key: SecretKey::from_bytes([epoch as u8; 32]),
        }
    }

    #[test]
    fn fail_next_stores_leaves_inner_untouched() {
        let v = FlakyVault::new(MemoryVault::new(rec(1)));
        v.fail_next_stores(2);
        for _ in 0..2 {
            assert!(matches!(v.store(&rec(2)), Err(VaultError::Unavailable(_))));
        }
        assert_eq!(v.inner().load().unwrap(), rec(1));
        assert_eq!(v.write_count().unwrap(), 1);
        v.store(&rec(2)).unwrap();
        assert_eq!(v.load().unwrap(), rec(2));
        assert_eq!(v.write_count().unwrap(), 2);
    }

    #[test]
    fn fail_after_write_still_writes() {
        let v = FlakyVault::new(MemoryVault::new(rec(1)));
        v.fail_after_write_next_store();
        assert!(v.store(&rec(2)).is_err());
        assert_eq!(v.load().unwrap(), rec(2));
        // One-shot.
        v.store(&rec(3)).unwrap();
        assert_eq!(v.load().unwrap(), rec(3));
    }

    #[test]
    fn garbage_load_is_one_shot_and_only_the_key_differs() {
        let v = FlakyVault::new(MemoryVault::new(rec(1)));
        v.garbage_on_next_load();
        let bad = v.load().unwrap();
        assert_eq!((bad.store_id, bad.epoch), ([9; 16], 1));
        assert_ne!(bad.key, rec(1).key);
        assert_eq!(v.load().unwrap(), rec(1));
        assert_eq!(v.inner().load().unwrap(), rec(1));
    }

    #[test]
    fn unavailable_fails_everything_until_cleared() {
        let v = FlakyVault::new(MemoryVault::new(rec(1)));
        v.unavailable(true);
        assert!(matches!(v.load(), Err(VaultError::Unavailable(_))));
        assert!(matches!(v.store(&rec(2)), Err(VaultError::Unavailable(_))));
        assert!(matches!(v.write_count(), Err(VaultError::Unavailable(_))));
        assert_eq!(v.info().kind, "memory");
        v.unavailable(false);
        assert_eq!(v.load().unwrap(), rec(1));
    }

    #[test]
    fn shared_between_threads() {
        let v = Arc::new(FlakyVault::new(MemoryVault::new(rec(0))));
        v.fail_next_stores(10);
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let v = Arc::clone(&v);
                std::thread::spawn(move || {
                    (0..10)
                        .filter(|i| v.store(&rec(t * 10 + i + 1)).is_err())
                        .count()
                })
            })
            .collect();
        let failed: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(failed, 10);
        assert_eq!(v.write_count().unwrap(), 1 + 30);
    }
}
