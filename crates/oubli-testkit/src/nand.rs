//! The proof harness on simulated raw NAND: a store and its vault on one chip, re-attach after a cut, and the chip-off adversary.

use crate::{harness, Adversary};
use oubli_core::{CreateOptions, Options, Store, Vault, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use oubli_nand::{Geometry, NandChip, NandMedium, NandVault, Ubi, UbiConfig};
use oubli_vault::KdfParams;
use std::sync::Arc;

/// 2 KiB pages, 16 pages per block (32 KiB), 256 blocks: 8 MiB.
pub fn geometry() -> Geometry {
    Geometry {
        page_size: 2048,
        pages_per_block: 16,
        blocks: 256,
        oob_bytes: 64,
    }
}

pub fn password() -> SecretBytes {
    SecretBytes::new(b"nand test password".to_vec())
}

/// A store on `chip`, its vault in the chip's vault block.
pub struct NandStore {
    pub store: Store,
    pub vault: Arc<NandVault>,
    pub ubi: Arc<Ubi>,
}

/// Formats a store on a fresh in-memory chip (erases recorded, so that
/// every past state of the chip is known).
pub fn create(options: &Options) -> NandStore {
    create_with(options, oubli_crypto::SCHEME_PARENT_POINTER)
}

/// [`create`] with the given key scheme.
pub fn create_with(options: &Options, scheme: u8) -> NandStore {
    let chip = Arc::new(NandChip::in_memory(geometry(), &[17], None).unwrap());
    chip.record_history(true);
    create_on_with(chip, options, scheme)
}

pub fn create_on(chip: Arc<NandChip>, options: &Options) -> NandStore {
    create_on_with(chip, options, oubli_crypto::SCHEME_PARENT_POINTER)
}

/// [`create_on`] with the given key scheme.
pub fn create_on_with(chip: Arc<NandChip>, options: &Options, scheme: u8) -> NandStore {
    let ubi = Arc::new(Ubi::attach(chip, UbiConfig::default()).unwrap());
    let medium = Arc::new(NandMedium::new(ubi.clone()).unwrap());
    let provider = options.provider.clone();
    let mut vault = None;
    let u = ubi.clone();
    let store = Store::create(
        medium,
        |record| {
            let v = Arc::new(NandVault::create(
                u,
                &password(),
                KdfParams::testing(),
                record,
                provider,
            )?);
            vault = Some(v.clone());
            Ok(v)
        },
        CreateOptions {
            cell_size: harness::TEST_CELL,
            key_scheme: scheme,
        },
        options.clone(),
    )
    .expect("create store on NAND");
    NandStore {
        store,
        vault: vault.expect("vault created"),
        ubi,
    }
}

/// Powers the chip's image up again and opens the store on it.
pub fn reopen(chip: &NandChip, options: &Options) -> oubli_core::Result<NandStore> {
    let again = Arc::new(NandChip::from_image(chip.image().unwrap()).unwrap());
    let io = |e: std::io::Error| oubli_core::Error::Vault(e.into());
    let ubi = Arc::new(Ubi::attach(again, UbiConfig::default()).map_err(io)?);
    let medium = Arc::new(NandMedium::new(ubi.clone()).map_err(io)?);
    let vault = Arc::new(NandVault::open(
        ubi.clone(),
        &password(),
        options.provider.clone(),
    )?);
    let store = Store::open(medium, vault.clone() as Arc<dyn Vault>, options.clone())?;
    Ok(NandStore { store, vault, ubi })
}

/// The chip-off adversary: the data area at every past state of `chips`
/// (every block content ever erased, plus the chips as they are now), and
/// the vault records the chip holds *now* (`now`), opened with the password.
pub fn seize(
    chips: &[&NandChip],
    now: &NandChip,
    provider: Arc<dyn CryptoProvider>,
) -> (Adversary, Vec<VaultRecord>) {
    let mut blocks = Vec::new();
    for chip in chips {
        blocks.extend(chip.history());
        blocks.extend(chip.chip_off().unwrap());
    }
    let past = NandMedium::carve(geometry(), &blocks);
    let adversary = Adversary::from_parts(past.pieces, past.superblocks);
    let current = NandMedium::carve(geometry(), &now.chip_off().unwrap());
    let keys = NandVault::carved_records(&current.vault, &password(), provider);
    (adversary, keys)
}
