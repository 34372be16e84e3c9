//! `NandVault`: the epoch key in a logical erase block of the store's own NAND chip; a rotation erases the old block.
//!
//! The record is the password-sealed record every oubli vault uses
//! (`oubli_vault::sealing`), kept in LEB 2 of the chip. A rotation is the
//! UBI layer's atomic change: the new record is programmed into a fresh
//! erase block, then the block holding the old one is erased. On the
//! simulator an erase really destroys the bytes (a chip-off reader finds
//! `0xFF`), so `overwrite_is_erasure` is true — unlike a file vault on an
//! SSD, whose controller may keep the old copy.

use crate::medium::LNUM_VAULT;
use crate::ubi::Ubi;
use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use oubli_vault::sealing::Sealer;
use oubli_vault::KdfParams;
use std::sync::{Arc, Mutex, MutexGuard};

/// The vault in the reserved LEB of a NAND chip.
pub struct NandVault {
    ubi: Arc<Ubi>,
    sealer: Mutex<Sealer>,
}

impl std::fmt::Debug for NandVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NandVault")
            .field("ubi", &self.ubi)
            .field("sealer", &"<redacted>")
            .finish()
    }
}

/// A chip error (a dead chip after a power cut included) is an I/O error:
/// nothing is gained by the engine retrying on the same chip.
fn io(e: std::io::Error) -> VaultError {
    VaultError::Io(e)
}

impl NandVault {
    /// Writes the first record into the chip's vault block (refused if the
    /// chip already holds a vault).
    pub fn create(
        ubi: Arc<Ubi>,
        password: &SecretBytes,
        params: KdfParams,
        record: &VaultRecord,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<NandVault, VaultError> {
        if ubi.pages(LNUM_VAULT).is_some() {
            return Err(VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the NAND chip already holds a vault",
            )));
        }
        params.validate().map_err(|e| {
            VaultError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        let (sealer, bytes) = Sealer::create(password, params, record, provider)?;
        ubi.change(LNUM_VAULT, &bytes).map_err(io)?;
        let vault = NandVault {
            ubi,
            sealer: Mutex::new(sealer),
        };
        vault.load()?;
        Ok(vault)
    }

    /// Opens the vault on the chip with `password`.
    pub fn open(
        ubi: Arc<Ubi>,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<NandVault, VaultError> {
        let copies = ubi.copies(LNUM_VAULT).map_err(io)?;
        if copies.is_empty() {
            return Err(VaultError::Missing(place(&ubi)));
        }
        let sealer = Sealer::unlock(&place(&ubi), &copies, password, provider)?;
        Ok(NandVault {
            ubi,
            sealer: Mutex::new(sealer),
        })
    }

    /// What an adversary holding `password` reads from the vault records a
    /// chip-off reader carved out of the chip
    /// ([`Carved::vault`](crate::Carved::vault)).
    pub fn carved_records(
        carved: &[Vec<u8>],
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
    ) -> Vec<VaultRecord> {
        if carved.is_empty() {
            return Vec::new();
        }
        match Sealer::unlock("carved", carved, password, provider) {
            Ok(sealer) => sealer.readable(carved),
            Err(_) => Vec::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sealer> {
        // The sealer is never left half-updated.
        self.sealer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn copies(&self) -> Result<Vec<Vec<u8>>, VaultError> {
        let copies = self.ubi.copies(LNUM_VAULT).map_err(io)?;
        if copies.is_empty() {
            return Err(VaultError::Missing(place(&self.ubi)));
        }
        Ok(copies)
    }
}

fn place(ubi: &Ubi) -> String {
    match ubi.chip().path() {
        Some(p) => format!("nand vault in {}", p.display()),
        None => "nand vault (memory)".into(),
    }
}

impl Vault for NandVault {
    fn info(&self) -> VaultInfo {
        VaultInfo {
            kind: "nand".into(),
            location: place(&self.ubi),
            // Its erase blocks are wear-levelled with the store's: the
            // chip's wear figures (status) cover it.
            endurance_writes: None,
            overwrite_is_erasure: true,
        }
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        let copies = self.copies()?;
        Ok(self.lock().current(&place(&self.ubi), &copies)?.1)
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        let sealer = self.lock();
        let copies = self.copies()?;
        let bytes = sealer.next(&place(&self.ubi), &copies, record)?;
        // Program the new block, then erase the old one.
        self.ubi.change(LNUM_VAULT, &bytes).map_err(io)
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        let copies = self.copies()?;
        Ok(self.lock().current(&place(&self.ubi), &copies)?.2)
    }

    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        let copies = self.copies()?;
        Ok(self.lock().readable(&copies))
    }

    fn erase_leftovers(&self) -> Result<(), VaultError> {
        let copies = self.copies()?;
        // Refuses when a newer record under another password is there.
        self.lock().leftovers(&place(&self.ubi), &copies)?;
        self.ubi.erase_stale().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chip::{Geometry, NandChip};
    use crate::medium::NandMedium;
    use crate::ubi::UbiConfig;
    use oubli_crypto::{RingProvider, SecretKey};

    fn record(epoch: u64) -> VaultRecord {
        VaultRecord {
            store_id: [9; 16],
            epoch,
            key: SecretKey::from_bytes([epoch as u8; 32]),
        }
    }

    #[test]
    fn rotation_erases_the_old_record_from_the_chip() {
        let g = Geometry {
            page_size: 512,
            pages_per_block: 16,
            blocks: 32,
            oob_bytes: 32,
        };
        let chip = Arc::new(NandChip::in_memory(g, &[], None).unwrap());
        let ubi = Arc::new(Ubi::attach(chip.clone(), UbiConfig::default()).unwrap());
        let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
        let pw = SecretBytes::new(b"pw".to_vec());
        let v = NandVault::create(
            ubi.clone(),
            &pw,
            KdfParams::testing(),
            &record(1),
            provider.clone(),
        )
        .unwrap();
        assert!(NandVault::create(
            ubi.clone(),
            &pw,
            KdfParams::testing(),
            &record(1),
            provider.clone()
        )
        .is_err());
        assert!(v.info().overwrite_is_erasure);
        assert!(!format!("{v:?}").contains("key"), "{v:?}");
        for epoch in 2..=5 {
            v.store(&record(epoch)).unwrap();
        }
        assert_eq!(v.load().unwrap(), record(5));
        assert_eq!(v.write_count().unwrap(), 5);
        assert_eq!(v.readable_records().unwrap(), vec![record(5)]);
        // A chip-off reader finds exactly one sealed record: the current one.
        let carved = NandMedium::carve(g, &chip.chip_off().unwrap());
        assert_eq!(carved.vault.len(), 1);
        assert_eq!(
            NandVault::carved_records(&carved.vault, &pw, provider.clone()),
            vec![record(5)]
        );
        let wrong = SecretBytes::new(b"px".to_vec());
        assert!(matches!(
            NandVault::open(ubi.clone(), &wrong, provider.clone()),
            Err(VaultError::WrongPassword)
        ));
        let again = NandVault::open(ubi, &pw, provider).unwrap();
        assert_eq!(again.load().unwrap(), record(5));
        let other = VaultRecord {
            store_id: [1; 16],
            ..record(6)
        };
        assert!(again.store(&other).is_err(), "another store's record");
    }
}
