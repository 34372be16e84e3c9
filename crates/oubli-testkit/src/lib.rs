//! Proof harnesses for oubli: a reference model, marked workloads, the recording adversary and crash sweeps.
//!
//! Every byte a workload writes is made of 32-byte *marker blocks* naming the
//! write and the block, so that any plaintext an adversary recovers can be
//! traced to the write it came from and compared with what the reference
//! model says is still live.

pub mod adversary;
pub mod crash;
mod forward;
pub mod gate;
pub mod harness;
pub mod marker;
pub mod model;
pub mod nand;
pub mod sim;
pub mod vault;
pub mod workload;

pub use adversary::Adversary;
pub use model::Model;
pub use vault::RecordingVault;
pub use workload::{Step, Workload};
