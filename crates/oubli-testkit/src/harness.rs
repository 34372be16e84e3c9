//! Store construction shared by the proof tests: deterministic crypto, small cells, manual epochs.

use crate::vault::RecordingVault;
use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store, Vault};
use oubli_crypto::{CryptoProvider, DeterministicProvider};
use oubli_vault::{FlakyVault, MemoryVault};
use std::sync::Arc;

/// Segment capacity of the in-memory media of the proof tests: small, so segments rotate and the cleaner has work.
pub const TEST_SEGMENT: u64 = 256 * 1024;

/// Cell size used by the proof tests: small, so that small stores have many cells and tree levels.
pub const TEST_CELL: u32 = 4096;

/// Options with the INSECURE deterministic provider (reproducible runs) and commits only on demand.
pub fn options(seed: u64) -> Options {
    Options {
        provider: Arc::new(DeterministicProvider::new(seed)),
        policy: EpochPolicy::manual(),
        ..Options::default()
    }
}

pub fn provider(options: &Options) -> Arc<dyn CryptoProvider> {
    options.provider.clone()
}

/// Creates a store on `medium` with a recording vault; returns both.
pub fn create(medium: Arc<dyn Medium>, options: &Options) -> (Store, Arc<RecordingVault>) {
    let mut vault = None;
    let store = Store::create(
        medium,
        |record| {
            let v = Arc::new(RecordingVault::new(record.clone()));
            vault = Some(v.clone());
            Ok(v)
        },
        CreateOptions {
            cell_size: TEST_CELL,
        },
        options.clone(),
    )
    .expect("create store");
    (store, vault.expect("vault created"))
}

/// Creates a store on `medium` whose vault fails on demand (a
/// [`FlakyVault`] around a [`MemoryVault`]); returns both.
pub fn create_flaky(
    medium: Arc<dyn Medium>,
    options: &Options,
) -> (Store, Arc<FlakyVault<MemoryVault>>) {
    let vault = Arc::new(FlakyVault::new(MemoryVault::empty()));
    let v = vault.clone();
    let store = Store::create(
        medium,
        move |record| {
            v.store(record)?;
            Ok(v)
        },
        CreateOptions {
            cell_size: TEST_CELL,
        },
        options.clone(),
    )
    .expect("create store");
    (store, vault)
}
