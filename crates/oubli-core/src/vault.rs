//! The `Vault` seam: the one place that holds the epoch key and must really overwrite it.

use oubli_crypto::SecretKey;

/// Identifies a store; the vault and every superblock carry it so that a vault
/// cannot be used with the wrong store.
pub type StoreId = [u8; 16];

/// What a vault holds: the key of the current epoch, for one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultRecord {
    pub store_id: StoreId,
    pub epoch: u64,
    pub key: SecretKey,
}

/// Static facts about a vault, for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultInfo {
    /// `file`, `tpm2`, `pkcs11`, `memory`, ...
    pub kind: String,
    /// Where it is (path, TCTI, token URI without secrets).
    pub location: String,
    /// Rated number of writes before the device may wear out; `None` if unbounded.
    pub endurance_writes: Option<u64>,
    /// Whether the vault's medium honours overwrites (false for a file on an SSD).
    pub overwrite_is_erasure: bool,
}

/// Why a vault operation failed. Each variant maps to its own CLI exit code.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("no vault at {0}")]
    Missing(String),
    #[error("wrong password (or PIN) for the vault")]
    WrongPassword,
    #[error("vault is corrupted: {0}")]
    Corrupt(String),
    #[error("vault is unavailable: {0}")]
    Unavailable(String),
    #[error("vault I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Holds one [`VaultRecord`] and replaces it atomically.
///
/// Contract for [`store`](Vault::store): when it returns `Ok`, the vault holds
/// the new record and the previous key is gone (to the extent the vault's
/// medium honours overwrites, see [`VaultInfo::overwrite_is_erasure`]). When
/// it fails — or the power is cut during it — a later [`load`](Vault::load)
/// returns either the old record or the new one, never neither. Every write
/// to the underlying device is counted in [`write_count`](Vault::write_count).
///
/// A rotation is two steps on every real vault (write the new record, then
/// destroy the old one), and the second can fail or be cut by a power loss
/// while the first is durable. The old key then survives next to the new
/// one, and with it everything deleted in its epoch. So a vault also tells
/// what it still holds ([`readable_records`](Vault::readable_records)) and
/// finishes the job on demand ([`erase_leftovers`](Vault::erase_leftovers)):
/// the engine calls it on every open and after a `store` that failed once the
/// new record is in, and reports a commit as done only when it succeeded.
pub trait Vault: Send + Sync {
    fn info(&self) -> VaultInfo;
    fn load(&self) -> Result<VaultRecord, VaultError>;
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError>;
    fn write_count(&self) -> Result<u64, VaultError>;
    /// Every record the vault holds that opens with this handle's password
    /// key: the current one first, then any older leftover a rotation cut
    /// short has not destroyed yet. It is what an adversary holding the
    /// vault and the password reads.
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError>;
    /// Destroys every record but the current one (overwritten with zeros or
    /// deleted on the device), including records sealed under an older
    /// password. After `Ok`, only the current key is readable.
    fn erase_leftovers(&self) -> Result<(), VaultError>;
}

impl<V: Vault + ?Sized> Vault for std::sync::Arc<V> {
    fn info(&self) -> VaultInfo {
        (**self).info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        (**self).load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        (**self).store(record)
    }
    fn write_count(&self) -> Result<u64, VaultError> {
        (**self).write_count()
    }
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        (**self).readable_records()
    }
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        (**self).erase_leftovers()
    }
}

impl<V: Vault + ?Sized> Vault for Box<V> {
    fn info(&self) -> VaultInfo {
        (**self).info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        (**self).load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        (**self).store(record)
    }
    fn write_count(&self) -> Result<u64, VaultError> {
        (**self).write_count()
    }
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        (**self).readable_records()
    }
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        (**self).erase_leftovers()
    }
}
