//! Store construction shared by the proof tests: deterministic crypto, small cells, manual epochs.

use crate::vault::RecordingVault;
use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store, TallyCadence, Vault};
use oubli_crypto::{
    CryptoProvider, DeterministicProvider, SCHEME_KEYED_HASH_FOREST, SCHEME_KEY_STORAGE_AREA,
    SCHEME_PARENT_POINTER,
};
use oubli_vault::{FlakyVault, MemoryVault};
use std::sync::Arc;

/// Segment capacity of the in-memory media of the proof tests: small, so segments rotate and the cleaner has work.
pub const TEST_SEGMENT: u64 = 256 * 1024;

/// Cell size used by the proof tests: small, so that small stores have many
/// cells and tree levels, and larger than `SMALL_CELL_SIZE`, so that objects
/// of both cell sizes live in one store (see `workload::Runner`).
pub const TEST_CELL: u32 = 16384;

/// Options with the INSECURE deterministic provider (reproducible runs) and
/// commits only on demand. The log's tally follows the frames by a count,
/// not a clock, so that every run makes the same I/O: every flush for odd
/// seeds (format 2's rule), every third frame for even ones (a tally that
/// lags, as a mount's does by its second).
///
/// One seed in three seals every whole cell as it completes instead of
/// buffering the first megabyte for the next frame: the small stores of
/// these tests then take the data-segment path, where an overwrite before
/// the next flush rewrites its unit in place (DESIGN §7).
pub fn options(seed: u64) -> Options {
    Options {
        provider: Arc::new(DeterministicProvider::new(seed)),
        policy: EpochPolicy::manual(),
        tally: if seed % 2 == 1 {
            TallyCadence::EveryFlush
        } else {
            TallyCadence::EveryNthFrame(3)
        },
        small_writes_buffered: if seed.is_multiple_of(3) { 0 } else { 1 << 20 },
        ..Options::default()
    }
}

pub fn provider(options: &Options) -> Arc<dyn CryptoProvider> {
    options.provider.clone()
}

/// Every key scheme: the proof tests that take a scheme run once per entry.
pub const SCHEMES: [u8; 3] = [
    SCHEME_PARENT_POINTER,
    SCHEME_KEYED_HASH_FOREST,
    SCHEME_KEY_STORAGE_AREA,
];

/// The scheme's name, for test messages.
pub fn scheme_name(scheme: u8) -> &'static str {
    oubli_crypto::scheme_name(scheme).expect("a known key scheme")
}

/// The store parameters of the front-end suites (mount, block device): the
/// defaults, on the key scheme named by `OUBLI_TEST_KEY_SCHEME` (a name
/// `oubli init --key-scheme` takes; parent-pointer when unset).
/// scripts/test runs those suites once more on each other scheme.
pub fn front_end_create_options() -> CreateOptions {
    let key_scheme = match std::env::var("OUBLI_TEST_KEY_SCHEME") {
        Err(_) => SCHEME_PARENT_POINTER,
        Ok(name) => {
            oubli_crypto::SCHEME_NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("OUBLI_TEST_KEY_SCHEME={name}: not a key scheme"))
                .1
        }
    };
    CreateOptions {
        key_scheme,
        ..CreateOptions::default()
    }
}

fn create_options(scheme: u8) -> CreateOptions {
    CreateOptions {
        cell_size: TEST_CELL,
        key_scheme: scheme,
    }
}

/// Creates a store on `medium` with a recording vault; returns both.
pub fn create(medium: Arc<dyn Medium>, options: &Options) -> (Store, Arc<RecordingVault>) {
    create_with(medium, options, SCHEME_PARENT_POINTER)
}

/// [`create`] with the given key scheme.
pub fn create_with(
    medium: Arc<dyn Medium>,
    options: &Options,
    scheme: u8,
) -> (Store, Arc<RecordingVault>) {
    let mut vault = None;
    let store = Store::create(
        medium,
        |record| {
            let v = Arc::new(RecordingVault::new(record.clone()));
            vault = Some(v.clone());
            Ok(v)
        },
        create_options(scheme),
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
    create_flaky_with(medium, options, SCHEME_PARENT_POINTER)
}

/// [`create_flaky`] with the given key scheme.
pub fn create_flaky_with(
    medium: Arc<dyn Medium>,
    options: &Options,
    scheme: u8,
) -> (Store, Arc<FlakyVault<MemoryVault>>) {
    let vault = Arc::new(FlakyVault::new(MemoryVault::empty()));
    let v = vault.clone();
    let store = Store::create(
        medium,
        move |record| {
            v.store(record)?;
            Ok(v)
        },
        create_options(scheme),
        options.clone(),
    )
    .expect("create store");
    (store, vault)
}
