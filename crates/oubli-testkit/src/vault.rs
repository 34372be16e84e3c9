//! `RecordingVault`: a vault that also remembers every key it ever held — the control adversary's unfair advantage.

use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_vault::MemoryVault;
use std::sync::Mutex;

/// A [`MemoryVault`] that keeps a copy of every record it was given. A real
/// vault destroys old keys; handing `history()` to the adversary models a
/// vault that failed to, and must let it recover deleted data — which is how
/// the adversary tests prove they can fail.
pub struct RecordingVault {
    inner: MemoryVault,
    history: Mutex<Vec<VaultRecord>>,
}

impl RecordingVault {
    pub fn new(first: VaultRecord) -> Self {
        RecordingVault {
            history: Mutex::new(vec![first.clone()]),
            inner: MemoryVault::new(first),
        }
    }
    pub fn history(&self) -> Vec<VaultRecord> {
        self.history.lock().unwrap().clone()
    }
}

impl Vault for RecordingVault {
    fn info(&self) -> VaultInfo {
        self.inner.info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        self.inner.load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        self.inner.store(record)?;
        self.history.lock().unwrap().push(record.clone());
        Ok(())
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
