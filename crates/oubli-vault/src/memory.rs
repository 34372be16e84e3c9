//! `MemoryVault`: an in-process vault for tests, counting its writes.

use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use std::sync::Mutex;

/// Holds the record in memory. For tests only: nothing survives the process,
/// so it models a vault whose overwrites are perfect erasure.
///
/// Follows the same conventions as [`FileVault`](crate::FileVault): writing
/// the first record counts as one write, and a record for another store is
/// refused with [`VaultError::Corrupt`].
#[derive(Debug, Default)]
pub struct MemoryVault {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    record: Option<VaultRecord>,
    writes: u64,
}

impl MemoryVault {
    /// A vault already holding `record` (write count 1, as after a create).
    pub fn new(record: VaultRecord) -> Self {
        MemoryVault {
            inner: Mutex::new(Inner {
                record: Some(record),
                writes: 1,
            }),
        }
    }

    /// A vault holding nothing yet: `load` fails with [`VaultError::Missing`]
    /// until the first `store`.
    pub fn empty() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is a single assignment, so a poisoned lock is consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Vault for MemoryVault {
    fn info(&self) -> VaultInfo {
        VaultInfo {
            kind: "memory".into(),
            location: "memory".into(),
            endurance_writes: None,
            overwrite_is_erasure: true,
        }
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        self.lock()
            .record
            .clone()
            .ok_or_else(|| VaultError::Missing("memory".into()))
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        let mut inner = self.lock();
        if let Some(current) = &inner.record {
            if current.store_id != record.store_id {
                return Err(VaultError::Corrupt(
                    "memory vault belongs to another store".into(),
                ));
            }
        }
        inner.record = Some(record.clone());
        inner.writes += 1;
        Ok(())
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        Ok(self.lock().writes)
    }

    /// One record only: a memory vault's overwrite is perfect.
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        Ok(vec![self.load()?])
    }

    fn erase_leftovers(&self) -> Result<(), VaultError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_crypto::SecretKey;

    fn rec(epoch: u64) -> VaultRecord {
        VaultRecord {
            store_id: [1; 16],
            epoch,
            key: SecretKey::from_bytes([epoch as u8; 32]),
        }
    }

    #[test]
    fn holds_and_counts() {
        let v = MemoryVault::empty();
        assert!(matches!(v.load(), Err(VaultError::Missing(_))));
        assert_eq!(v.write_count().unwrap(), 0);
        v.store(&rec(1)).unwrap();
        v.store(&rec(2)).unwrap();
        assert_eq!(v.load().unwrap(), rec(2));
        assert_eq!(v.write_count().unwrap(), 2);
        assert_eq!(v.info().kind, "memory");

        let v = MemoryVault::new(rec(5));
        assert_eq!(v.write_count().unwrap(), 1);
        let other = VaultRecord {
            store_id: [2; 16],
            ..rec(6)
        };
        assert!(matches!(v.store(&other), Err(VaultError::Corrupt(_))));
        assert_eq!(v.load().unwrap(), rec(5));
        assert_eq!(v.write_count().unwrap(), 1);
    }
}
