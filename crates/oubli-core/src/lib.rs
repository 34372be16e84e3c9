//! oubli-core: the sans-IO engine of oubli, reaching storage only through `Medium` and keys only through `Vault`.
//!
//! The engine keeps every object of a store in one copy-on-write B+tree whose
//! nodes are each sealed under their own key, kept in the parent (the key
//! tree). Object data is cut into *cells* (32 KiB by default), each sealed
//! under a fresh key. A flush appends the changes to an intent log sealed
//! under a key derived from the current epoch key; a commit writes the
//! changed nodes, a superblock sealed under a new epoch key, and then
//! replaces the epoch key in the vault — after which every deleted unit,
//! wherever the medium kept it, is ciphertext nobody can open.
//!
//! The library facade and a runnable example live in the `oubli` crate.

pub mod audit;
pub mod catalog;
mod codec;
mod engine;
mod error;
pub mod holes;
pub mod log;
pub mod medium;
mod scheme_state;
pub mod share;
pub mod snapshot;
mod superblock;
pub use superblock::FORMAT_VERSION;
pub mod tree;
mod unit;
pub mod vault;
#[cfg(test)]
mod vectors;

pub use audit::{AuditReport, Recovered, Recovery};
pub use engine::{
    name_hash, reserve_for, CleanerPolicy, CleanerProgress, ConsolidateReport, CreateOptions,
    EpochPolicy, FsckReport, GcReport, Options, Overhead, ShareInfo, ShareLeftover, ShareOpener,
    SnapshotInfo, SnapshotUsage, SpaceInfo, Status, Store, VaultFailurePolicy, DEFAULT_CELL_SIZE,
    ROOT_DIR, SHARE_DESTROYED, SMALL_CELL_SIZE,
};
pub use error::{Error, Result};
pub use log::TallyCadence;
pub use medium::{Medium, SegmentId, Slot, Space, SUPERBLOCK_MAX};
pub use share::ShareRecord;
pub use snapshot::SnapshotRecord;
pub use tree::ObjectRecord;
pub use unit::{cell_span, SPLIT_CELLS};
pub use vault::{StoreId, Vault, VaultError, VaultInfo, VaultRecord};
