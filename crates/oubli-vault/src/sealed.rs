//! Password-sealed records shared by every vault kind: unlock, pick the current record, build the next one.
//!
//! The file, TPM and PKCS#11 vaults all keep the epoch key in the same
//! 176-byte slot (docs/FORMAT-vault.md): an Argon2id key-encryption key
//! (KEK) derived from the password, a one-message record key derived from the
//! KEK and a fresh nonce, and an AES-256-GCM body. They differ only in where
//! the slots live (two file regions, two NV indices, N token objects) and how
//! an old slot is destroyed. This module holds everything that is *not*
//! about the place, so that the three backends cannot drift apart on the one
//! piece of cryptography that guards the key.

use crate::format::{open_slot, seal_slot, Slot, SlotFault, SlotHeader, NONCE_LEN, SLOT_LEN};
use crate::kdf::{derive_kek, KdfParams, SALT_LEN};
use oubli_core::{VaultError, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes, SecretKey};

/// The password-derived key-encryption key, with the salt and parameters it
/// was derived with. Deriving costs an Argon2id run, so it is done once per
/// open (or password change) and kept; `SecretKey` wipes it on drop.
pub(crate) struct KekState {
    pub kek: SecretKey,
    pub salt: [u8; SALT_LEN],
    pub params: KdfParams,
}

impl KekState {
    /// Derives the KEK of `password` under `salt` and `params`.
    pub fn derive(
        password: &SecretBytes,
        salt: [u8; SALT_LEN],
        params: KdfParams,
    ) -> Result<KekState, VaultError> {
        Ok(KekState {
            kek: derive_kek(password, &salt, params)?,
            salt,
            params,
        })
    }

    /// A fresh random salt and the KEK of `password` under it, for create
    /// and password changes.
    pub fn fresh(
        password: &SecretBytes,
        params: KdfParams,
        provider: &dyn CryptoProvider,
    ) -> Result<KekState, VaultError> {
        params.validate().map_err(|e| {
            VaultError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        let mut salt = [0u8; SALT_LEN];
        provider.fill_random(&mut salt);
        Self::derive(password, salt, params)
    }

    /// Whether `slot` was sealed under this KEK's salt and parameters (a
    /// slot sealed under another salt cannot open with it, so it is not
    /// even tried).
    pub fn unlocks(&self, slot: &Slot) -> bool {
        slot.header.salt == self.salt && slot.header.params == self.params
    }

    /// A key derived from the KEK for another purpose than sealing records
    /// (e.g. a TPM NV index's authorization value). Distinct labels give
    /// independent keys, so the KEK itself never leaves this module.
    #[cfg_attr(not(feature = "tpm"), allow(dead_code))]
    pub fn derive_subkey(
        &self,
        provider: &dyn CryptoProvider,
        label: &[u8],
        context: &[u8],
    ) -> SecretKey {
        provider.derive(&self.kek, label, context)
    }
}

/// The slot that currently holds the record, as found by a read.
pub(crate) struct Current {
    /// Position of the slot in the list the backend passed in.
    pub index: usize,
    pub header: SlotHeader,
    pub record: VaultRecord,
    /// Highest generation and write count over every readable slot, so that
    /// the next record outranks even a leftover this handle cannot open.
    pub max_generation: u64,
    pub max_write_count: u64,
}

/// Indices of the readable slots, newest generation first; `Corrupt` if
/// there are none. `names` labels the slots in the message ("slot A",
/// "object 3", ...), `place` names the vault.
pub(crate) fn by_generation(
    place: &str,
    slots: &[Result<Slot, SlotFault>],
    names: &dyn Fn(usize) -> String,
) -> Result<Vec<usize>, VaultError> {
    let mut readable: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].is_ok()).collect();
    if readable.is_empty() {
        let why: Vec<String> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{}: {}", names(i), s.as_ref().unwrap_err()))
            .collect();
        let why = if why.is_empty() {
            "no record at all".to_string()
        } else {
            why.join(", ")
        };
        return Err(VaultError::Corrupt(format!(
            "no readable record in {place} ({why})"
        )));
    }
    readable.sort_by_key(|&i| std::cmp::Reverse(slots[i].as_ref().unwrap().header.generation));
    Ok(readable)
}

/// Derives the KEK from `password` and the salt of the newest readable slot,
/// and, if that slot does not open, from the other slots' salts (when they
/// differ). So after a password change cut short, either password opens.
pub(crate) fn unlock(
    place: &str,
    slots: &[Result<Slot, SlotFault>],
    names: &dyn Fn(usize) -> String,
    password: &SecretBytes,
    provider: &dyn CryptoProvider,
) -> Result<KekState, VaultError> {
    let candidates = by_generation(place, slots, names)?;
    let mut tried: Option<KekState> = None;
    for index in candidates {
        let slot = slots[index].as_ref().expect("candidate is readable");
        let state = match tried.take() {
            Some(state) if state.unlocks(slot) => state,
            _ => KekState::derive(password, slot.header.salt, slot.header.params)?,
        };
        if open_slot(provider, &state.kek, slot).is_some() {
            return Ok(state);
        }
        tried = Some(state);
    }
    Err(VaultError::WrongPassword)
}

/// Finds the newest slot `state` opens.
pub(crate) fn current(
    place: &str,
    slots: &[Result<Slot, SlotFault>],
    names: &dyn Fn(usize) -> String,
    state: &KekState,
    provider: &dyn CryptoProvider,
) -> Result<Current, VaultError> {
    let candidates = by_generation(place, slots, names)?;
    let readable = || slots.iter().flatten();
    let max_generation = readable().map(|s| s.header.generation).max().unwrap_or(0);
    let max_write_count = readable().map(|s| s.header.write_count).max().unwrap_or(0);
    for index in candidates {
        let slot = slots[index].as_ref().expect("candidate is readable");
        // A slot sealed under another salt (a password change by another
        // handle, or one cut short) cannot be opened with this KEK; an
        // older slot that can is still a valid "old record".
        if !state.unlocks(slot) {
            continue;
        }
        if let Some(record) = open_slot(provider, &state.kek, slot) {
            return Ok(Current {
                index,
                header: slot.header.clone(),
                record,
                max_generation,
                max_write_count,
            });
        }
    }
    // A checksum-valid slot failed authentication: the KEK is wrong (or
    // someone forged the header and fixed the checksum, which the AEAD
    // cannot tell apart from a wrong password).
    Err(VaultError::WrongPassword)
}

/// Every record among `slots` that `state` opens, the newest generation
/// first (so the current record, as [`current`] finds it, comes first).
pub(crate) fn readable_records(
    slots: &[Result<Slot, SlotFault>],
    state: &KekState,
    provider: &dyn CryptoProvider,
) -> Vec<VaultRecord> {
    let mut found: Vec<(u64, VaultRecord)> = slots
        .iter()
        .flatten()
        .filter(|slot| state.unlocks(slot))
        .filter_map(|slot| {
            open_slot(provider, &state.kek, slot).map(|r| (slot.header.generation, r))
        })
        .collect();
    found.sort_by_key(|(generation, _)| std::cmp::Reverse(*generation));
    found.into_iter().map(|(_, record)| record).collect()
}

/// The slots `erase_leftovers` destroys: every one but the current that is
/// not blank already (damaged ones too: a torn slot may still hold key
/// bytes). A readable slot of a generation at least the current one's is a
/// record this handle cannot open — sealed under another password — that
/// may be the real current one: refused, never destroyed on a guess.
pub(crate) fn leftover_indices(
    place: &str,
    slots: &[Result<Slot, SlotFault>],
    current: &Current,
    is_blank: &dyn Fn(usize) -> bool,
) -> Result<Vec<usize>, VaultError> {
    let mut doomed = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        if i == current.index || is_blank(i) {
            continue;
        }
        if let Ok(slot) = slot {
            if slot.header.generation >= current.header.generation {
                return Err(VaultError::Corrupt(format!(
                    "{place} holds a newer record than the one this password opens \
                     (generation {} over {}): open it with the newest password to erase the old one",
                    slot.header.generation, current.header.generation
                )));
            }
        }
        doomed.push(i);
    }
    Ok(doomed)
}

/// Refuses a record for another store than the one the vault holds.
pub(crate) fn check_same_store(
    place: &str,
    current: &Current,
    record: &VaultRecord,
) -> Result<(), VaultError> {
    if current.record.store_id != record.store_id {
        return Err(VaultError::Corrupt(format!(
            "{place} belongs to store {}, refusing a record for store {}",
            hex(&current.record.store_id),
            hex(&record.store_id)
        )));
    }
    Ok(())
}

/// The header of the record that replaces `current`, sealed under `state`.
pub(crate) fn next_header(
    current: &Current,
    state: &KekState,
    provider: &dyn CryptoProvider,
) -> Result<SlotHeader, VaultError> {
    let overflow = || VaultError::Corrupt("generation counter exhausted".into());
    Ok(SlotHeader {
        generation: current.max_generation.checked_add(1).ok_or_else(overflow)?,
        write_count: current
            .max_write_count
            .checked_add(1)
            .ok_or_else(overflow)?,
        params: state.params,
        salt: state.salt,
        // Fresh per record: the record key derive(KEK, label, nonce) then
        // seals exactly one message, as the provider's contract requires.
        nonce: fresh_nonce(provider),
    })
}

/// The header of the very first record (generation 1, write count 1).
pub(crate) fn first_header(state: &KekState, provider: &dyn CryptoProvider) -> SlotHeader {
    SlotHeader {
        generation: 1,
        write_count: 1,
        params: state.params,
        salt: state.salt,
        nonce: fresh_nonce(provider),
    }
}

/// The sealed slot bytes (exactly [`SLOT_LEN`], without the file's padding).
pub(crate) fn seal(
    provider: &dyn CryptoProvider,
    state: &KekState,
    header: &SlotHeader,
    record: &VaultRecord,
) -> Vec<u8> {
    let mut region = seal_slot(provider, &state.kek, header, record);
    region.truncate(SLOT_LEN);
    region
}

/// Parses a slot that a device returned as a byte string of its own length
/// (an NV index, a token object): anything but [`SLOT_LEN`] bytes is damage.
pub(crate) fn parse_exact(bytes: &[u8]) -> Result<Slot, SlotFault> {
    if bytes.len() != SLOT_LEN {
        return Err(SlotFault::BadHeader(format!(
            "{} bytes, expected {SLOT_LEN}",
            bytes.len()
        )));
    }
    crate::format::parse_slot(bytes)
}

pub(crate) fn fresh_nonce(provider: &dyn CryptoProvider) -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    provider.fill_random(&mut nonce);
    nonce
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::parse_slot;
    use oubli_crypto::RingProvider;

    fn rec(epoch: u64) -> VaultRecord {
        VaultRecord {
            store_id: [7; 16],
            epoch,
            key: SecretKey::from_bytes([epoch as u8; 32]),
        }
    }

    fn names(i: usize) -> String {
        format!("slot {i}")
    }

    #[test]
    fn unlock_current_and_next_over_any_number_of_slots() {
        let p = RingProvider::new();
        let pw = SecretBytes::new(b"pw".to_vec());
        let state = KekState::fresh(&pw, KdfParams::testing(), &p).unwrap();
        let h1 = first_header(&state, &p);
        let s1 = seal(&p, &state, &h1, &rec(1));
        assert_eq!(s1.len(), SLOT_LEN);
        let slots1 = vec![parse_slot(&s1)];
        let cur = current("v", &slots1, &names, &state, &p).unwrap();
        assert_eq!(cur.record, rec(1));
        let h2 = next_header(&cur, &state, &p).unwrap();
        assert_eq!((h2.generation, h2.write_count), (2, 2));
        let s2 = seal(&p, &state, &h2, &rec(2));
        // Three slots: old, erased, new; order does not matter.
        let slots = vec![
            parse_slot(&s1),
            parse_slot(&[0u8; SLOT_LEN]),
            parse_slot(&s2),
        ];
        let unlocked = unlock("v", &slots, &names, &pw, &p).unwrap();
        let cur = current("v", &slots, &names, &unlocked, &p).unwrap();
        assert_eq!((cur.index, cur.record.epoch), (2, 2));
        let wrong = SecretBytes::new(b"px".to_vec());
        assert!(matches!(
            unlock("v", &slots, &names, &wrong, &p),
            Err(VaultError::WrongPassword)
        ));
        let err = current("v", &[], &names, &state, &p).err().unwrap();
        assert!(matches!(&err, VaultError::Corrupt(m) if m.contains("no record at all")));
        let other = VaultRecord {
            store_id: [8; 16],
            ..rec(3)
        };
        assert!(check_same_store("v", &cur, &other).is_err());
        check_same_store("v", &cur, &rec(3)).unwrap();
    }
}
