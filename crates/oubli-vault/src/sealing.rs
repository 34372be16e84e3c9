//! `Sealer`: the password-sealed record format for vaults kept outside this crate (e.g. on a NAND chip).
//!
//! A thin public face over [`crate::sealed`]: a vault elsewhere hands in its
//! slots as byte strings (one per place that may hold a record) and gets
//! back the current record, the next record's sealed bytes, or the slots to
//! destroy — so that it never re-implements the cryptography that guards
//! the key.

use crate::kdf::KdfParams;
use crate::sealed::{self, KekState};
use oubli_core::{VaultError, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use std::sync::Arc;

/// Bytes of a sealed record.
pub const SEALED_RECORD_LEN: usize = crate::format::SLOT_LEN;

/// The password-derived key of one vault, and the provider to seal with.
pub struct Sealer {
    state: KekState,
    provider: Arc<dyn CryptoProvider>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("params", &self.state.params)
            .field("kek", &"<redacted>")
            .finish()
    }
}

fn names(i: usize) -> String {
    format!("copy {i}")
}

fn parse(slots: &[Vec<u8>]) -> Vec<Result<crate::format::Slot, crate::format::SlotFault>> {
    slots.iter().map(|s| sealed::parse_exact(s)).collect()
}

impl Sealer {
    /// A fresh salt and key for `password`, and the sealed first record
    /// (generation 1).
    pub fn create(
        password: &SecretBytes,
        params: KdfParams,
        record: &VaultRecord,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<(Sealer, Vec<u8>), VaultError> {
        let state = KekState::fresh(password, params, &*provider)?;
        let header = sealed::first_header(&state, &*provider);
        let bytes = sealed::seal(&*provider, &state, &header, record);
        Ok((Sealer { state, provider }, bytes))
    }

    /// Derives the key of `password` from the salt of the newest readable
    /// slot (or another slot's, after a password change cut short).
    pub fn unlock(
        place: &str,
        slots: &[Vec<u8>],
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<Sealer, VaultError> {
        let state = sealed::unlock(place, &parse(slots), &names, password, &*provider)?;
        Ok(Sealer { state, provider })
    }

    /// The index of the slot holding the current record, the record and its write count.
    pub fn current(
        &self,
        place: &str,
        slots: &[Vec<u8>],
    ) -> Result<(usize, VaultRecord, u64), VaultError> {
        let c = sealed::current(place, &parse(slots), &names, &self.state, &*self.provider)?;
        Ok((c.index, c.record, c.header.write_count))
    }

    /// The sealed bytes of the record that replaces the current one
    /// (refused for another store's record).
    pub fn next(
        &self,
        place: &str,
        slots: &[Vec<u8>],
        record: &VaultRecord,
    ) -> Result<Vec<u8>, VaultError> {
        let c = sealed::current(place, &parse(slots), &names, &self.state, &*self.provider)?;
        sealed::check_same_store(place, &c, record)?;
        let header = sealed::next_header(&c, &self.state, &*self.provider)?;
        Ok(sealed::seal(&*self.provider, &self.state, &header, record))
    }

    /// Every record among `slots` this key opens, the newest first.
    pub fn readable(&self, slots: &[Vec<u8>]) -> Vec<VaultRecord> {
        sealed::readable_records(&parse(slots), &self.state, &*self.provider)
    }

    /// The slots to destroy so that only the current record is left
    /// (refused when a newer record under another password is there).
    pub fn leftovers(&self, place: &str, slots: &[Vec<u8>]) -> Result<Vec<usize>, VaultError> {
        let parsed = parse(slots);
        let c = sealed::current(place, &parsed, &names, &self.state, &*self.provider)?;
        sealed::leftover_indices(place, &parsed, &c, &|i| slots[i].is_empty())
    }
}
