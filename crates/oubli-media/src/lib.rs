//! oubli-media: implementations of the `Medium` seam (directory, single file / block device, in-memory crash model) and test wrappers (faults, recording).
//!
//! * [`DirMedium`]: the embedded default, a directory of segment files.
//! * [`FileMedium`]: one regular file or block device cut into slots.
//! * [`MemMedium`]: in memory, with a deterministic power-cut model.
//! * [`FaultMedium`]: injects errors, power cuts and torn writes.
//! * [`RecordingMedium`]: keeps every byte ever written, for adversary tests.
//! * [`GateMedium`]: holds reads or syncs at a gate, for concurrency tests.
//! * [`open_medium`] / [`create_medium`]: choose a medium from a location.
//!
//! Byte layouts and durability guarantees: docs/FORMAT-media.md.

mod dir;
mod fault;
mod file;
mod gate;
mod location;
mod mem;
mod op;
mod recording;
mod util;

pub use dir::{DirMedium, DIR_MARKER};
pub use fault::{Fault, FaultMedium, ReadFault, ReadTarget};
pub use file::{FileMedium, DEFAULT_SLOT_SIZE, MAX_SLOT_SIZE, MIN_SLOT_SIZE};
pub use gate::{Gate, GateMedium, Gated};
pub use location::{create_medium, open_medium};
pub use mem::{MemMedium, TearMode};
pub use op::Op;
pub use recording::RecordingMedium;
/// Seedable, deterministic, NOT secure: picks crash outcomes and test workloads.
pub use util::SplitMix64;

pub use oubli_core::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};
