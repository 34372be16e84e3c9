//! oubli-core: the sans-IO engine of oubli, reaching storage only through `Medium` and keys only through `Vault`.

pub mod medium;
pub mod vault;

pub use medium::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};
pub use vault::{StoreId, Vault, VaultError, VaultInfo, VaultRecord};
