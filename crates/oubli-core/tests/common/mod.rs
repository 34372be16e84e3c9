//! A store in memory with a memory vault and manual epochs, for the engine's integration tests.
#![allow(dead_code)]

use oubli_core::{CreateOptions, EpochPolicy, Options, Store, Vault};
use oubli_media::MemMedium;
use oubli_vault::MemoryVault;
use std::sync::Arc;

/// Manual epochs: the tests commit when they mean to.
pub fn options() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    }
}

pub fn store(create: CreateOptions) -> Store {
    store_with_parts(create, options()).0
}

/// A store, its medium (to crash it) and its vault (to reopen it).
pub fn store_with_parts(
    create: CreateOptions,
    options: Options,
) -> (Store, Arc<MemMedium>, Arc<MemoryVault>) {
    let medium = Arc::new(MemMedium::new());
    let (store, vault) = store_on(medium.clone(), create, options);
    (store, medium, vault)
}

/// A store made on `medium`, and its vault.
pub fn store_on(
    medium: Arc<MemMedium>,
    create: CreateOptions,
    options: Options,
) -> (Store, Arc<MemoryVault>) {
    let vault = Arc::new(MemoryVault::empty());
    let v = vault.clone();
    let store = Store::create(
        medium.clone(),
        move |r| {
            v.store(r)?;
            Ok(v)
        },
        create,
        options,
    )
    .unwrap();
    (store, vault)
}

/// Opens `medium` (a crashed copy, say) with `vault` and manual epochs.
pub fn reopen(medium: Arc<MemMedium>, vault: &Arc<MemoryVault>) -> Store {
    Store::open(medium, vault.clone(), options()).unwrap()
}

/// [`reopen`] without writing anything: the medium stays as it was cut.
pub fn reopen_read_only(medium: Arc<MemMedium>, vault: &Arc<MemoryVault>) -> Store {
    let options = Options {
        read_only: true,
        ..options()
    };
    Store::open(medium, vault.clone(), options).unwrap()
}

/// `len` bytes that tell `seed`s apart and repeat only every 251 bytes.
pub fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

/// Bytes of sealed units the overwrites and deletions since the last
/// commit leave to erase at the next.
pub fn pending_erasure(s: &Store) -> u64 {
    s.status().unwrap().pending_erasure_bytes
}
