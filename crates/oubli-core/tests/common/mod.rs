//! A store in memory with a memory vault and manual epochs, for the engine's integration tests.

use oubli_core::{CreateOptions, EpochPolicy, Options, Store, Vault};
use oubli_media::MemMedium;
use oubli_vault::MemoryVault;
use std::sync::Arc;

pub fn store(create: CreateOptions) -> Store {
    let vault = Arc::new(MemoryVault::empty());
    Store::create(
        Arc::new(MemMedium::new()),
        move |r| {
            vault.store(r)?;
            Ok(vault)
        },
        create,
        Options {
            policy: EpochPolicy::manual(),
            ..Options::default()
        },
    )
    .unwrap()
}
