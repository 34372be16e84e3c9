//! Byte layout of a file-vault slot: plaintext header, sealed record, checksum (see docs/FORMAT-vault.md).

use crate::kdf::{KdfParams, SALT_LEN};
use oubli_core::{StoreId, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretKey, KEY_LEN, TAG_LEN};
use zeroize::Zeroizing;

pub(crate) const MAGIC: &[u8; 8] = b"OUBLIVLT";
/// Version of the slot layout. Bumped on any change of the bytes below.
pub(crate) const FORMAT_VERSION: u16 = 1;
/// Identifies the password KDF: 1 = Argon2id, algorithm version 0x13, 32-byte output.
pub(crate) const KDF_ARGON2ID_V13: u16 = 1;
/// Bytes of the per-record derivation nonce.
pub(crate) const NONCE_LEN: usize = 32;
/// Label of the per-record key: key = derive(KEK, LABEL, nonce).
pub(crate) const RECORD_KEY_LABEL: &[u8] = b"oubli-vault-record";

// Header field offsets.
const OFF_VERSION: usize = 8;
const OFF_KDF: usize = 10;
const OFF_GENERATION: usize = 12;
const OFF_WRITE_COUNT: usize = 20;
const OFF_M_COST: usize = 28;
const OFF_T_COST: usize = 32;
const OFF_P_COST: usize = 36;
const OFF_SALT: usize = 40;
const OFF_NONCE: usize = OFF_SALT + SALT_LEN;
pub(crate) const HEADER_LEN: usize = OFF_NONCE + NONCE_LEN; // 88

/// Plaintext of the sealed body: store_id, epoch, key.
const BODY_LEN: usize = 16 + 8 + KEY_LEN; // 56
pub(crate) const SEALED_LEN: usize = BODY_LEN + TAG_LEN; // 72
/// SHA-256 truncated: enough to tell a torn or rotten slot from a wrong
/// password; authenticity comes from the AEAD, not from this.
pub(crate) const CHECKSUM_LEN: usize = 16;
pub(crate) const OFF_CHECKSUM: usize = HEADER_LEN + SEALED_LEN; // 160
/// Meaningful bytes of a slot; the rest of its stride is zero padding.
pub(crate) const SLOT_LEN: usize = OFF_CHECKSUM + CHECKSUM_LEN; // 176

/// Each slot occupies its own 4 KiB-aligned region, so that a torn write of
/// one slot can never reach into the other on devices with 512-byte or
/// 4 KiB atomic sectors.
pub(crate) const SLOT_STRIDE: usize = 4096;
pub(crate) const SLOT_COUNT: usize = 2;
pub(crate) const FILE_LEN: usize = SLOT_STRIDE * SLOT_COUNT;

const _: () = assert!(SLOT_LEN <= SLOT_STRIDE);

/// The clear-text part of a slot. All of it is the AEAD's associated data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotHeader {
    pub generation: u64,
    pub write_count: u64,
    pub params: KdfParams,
    pub salt: [u8; SALT_LEN],
    pub nonce: [u8; NONCE_LEN],
}

impl SlotHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[OFF_KDF..OFF_KDF + 2].copy_from_slice(&KDF_ARGON2ID_V13.to_le_bytes());
        h[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        h[OFF_WRITE_COUNT..OFF_WRITE_COUNT + 8].copy_from_slice(&self.write_count.to_le_bytes());
        h[OFF_M_COST..OFF_M_COST + 4].copy_from_slice(&self.params.m_cost_kib.to_le_bytes());
        h[OFF_T_COST..OFF_T_COST + 4].copy_from_slice(&self.params.t_cost.to_le_bytes());
        h[OFF_P_COST..OFF_P_COST + 4].copy_from_slice(&self.params.p_cost.to_le_bytes());
        h[OFF_SALT..OFF_SALT + SALT_LEN].copy_from_slice(&self.salt);
        h[OFF_NONCE..OFF_NONCE + NONCE_LEN].copy_from_slice(&self.nonce);
        h
    }

    /// Parses a header whose checksum already matched. Anything unexpected
    /// here was written by another version or tampered with.
    fn decode(h: &[u8; HEADER_LEN]) -> Result<Self, String> {
        if &h[..8] != MAGIC {
            return Err("bad magic".into());
        }
        let version = u16_at(h, OFF_VERSION);
        if version != FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let kdf = u16_at(h, OFF_KDF);
        if kdf != KDF_ARGON2ID_V13 {
            return Err(format!("unknown password KDF {kdf}"));
        }
        let params = KdfParams {
            m_cost_kib: u32_at(h, OFF_M_COST),
            t_cost: u32_at(h, OFF_T_COST),
            p_cost: u32_at(h, OFF_P_COST),
        };
        params.validate()?;
        Ok(SlotHeader {
            generation: u64_at(h, OFF_GENERATION),
            write_count: u64_at(h, OFF_WRITE_COUNT),
            params,
            salt: h[OFF_SALT..OFF_SALT + SALT_LEN].try_into().unwrap(),
            nonce: h[OFF_NONCE..OFF_NONCE + NONCE_LEN].try_into().unwrap(),
        })
    }
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

fn checksum(bytes: &[u8]) -> [u8; CHECKSUM_LEN] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref()[..CHECKSUM_LEN].try_into().unwrap()
}

/// Why a slot holds no usable record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotFault {
    /// All zero: erased by a completed replace, or never written.
    Erased,
    /// Torn write or bit rot.
    BadChecksum,
    /// Checksum fine, content not a slot this version can read.
    BadHeader(String),
}

impl std::fmt::Display for SlotFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotFault::Erased => f.write_str("erased"),
            SlotFault::BadChecksum => f.write_str("bad checksum"),
            SlotFault::BadHeader(e) => write!(f, "bad header ({e})"),
        }
    }
}

/// A slot whose checksum and header are fine; its body is still sealed.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub header: SlotHeader,
    header_bytes: [u8; HEADER_LEN],
    sealed: [u8; SEALED_LEN],
}

/// Parses the first [`SLOT_LEN`] bytes of a slot region.
pub(crate) fn parse_slot(region: &[u8]) -> Result<Slot, SlotFault> {
    let bytes = &region[..SLOT_LEN];
    if bytes.iter().all(|&b| b == 0) {
        return Err(SlotFault::Erased);
    }
    if checksum(&bytes[..OFF_CHECKSUM]) != bytes[OFF_CHECKSUM..SLOT_LEN] {
        return Err(SlotFault::BadChecksum);
    }
    let header_bytes: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
    let header = SlotHeader::decode(&header_bytes).map_err(SlotFault::BadHeader)?;
    Ok(Slot {
        header,
        header_bytes,
        sealed: bytes[HEADER_LEN..OFF_CHECKSUM].try_into().unwrap(),
    })
}

/// Seals `record` under a one-message key derived from `kek` and the
/// header's fresh nonce, and returns the full slot region (padding included).
pub(crate) fn seal_slot(
    provider: &dyn CryptoProvider,
    kek: &SecretKey,
    header: &SlotHeader,
    record: &VaultRecord,
) -> Vec<u8> {
    let header_bytes = header.encode();
    let key = provider.derive(kek, RECORD_KEY_LABEL, &header.nonce);
    // The plaintext holds the epoch key: wipe it whatever happens. `seal`
    // encrypts in place, so the same buffer ends up holding the ciphertext.
    let mut body = Zeroizing::new(Vec::with_capacity(SEALED_LEN));
    body.extend_from_slice(&record.store_id);
    body.extend_from_slice(&record.epoch.to_le_bytes());
    body.extend_from_slice(record.key.expose());
    provider.seal(&key, &header_bytes, &mut body);
    debug_assert_eq!(body.len(), SEALED_LEN);

    let mut region = vec![0u8; SLOT_STRIDE];
    region[..HEADER_LEN].copy_from_slice(&header_bytes);
    region[HEADER_LEN..OFF_CHECKSUM].copy_from_slice(&body);
    let sum = checksum(&region[..OFF_CHECKSUM]);
    region[OFF_CHECKSUM..SLOT_LEN].copy_from_slice(&sum);
    region
}

/// Authenticates and decrypts a slot's body. `None` means the AEAD refused
/// it: wrong KEK (password), or a header/body forged with a fixed checksum.
pub(crate) fn open_slot(
    provider: &dyn CryptoProvider,
    kek: &SecretKey,
    slot: &Slot,
) -> Option<VaultRecord> {
    let key = provider.derive(kek, RECORD_KEY_LABEL, &slot.header.nonce);
    let mut body = Zeroizing::new(slot.sealed.to_vec());
    provider.open(&key, &slot.header_bytes, &mut body).ok()?;
    if body.len() != BODY_LEN {
        return None;
    }
    let store_id: StoreId = body[..16].try_into().unwrap();
    let epoch = u64_at(&body, 16);
    let key = SecretKey::from_slice(&body[24..24 + KEY_LEN])?;
    Some(VaultRecord {
        store_id,
        epoch,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_crypto::RingProvider;

    fn header() -> SlotHeader {
        SlotHeader {
            generation: 7,
            write_count: 9,
            params: KdfParams::testing(),
            salt: [3; SALT_LEN],
            nonce: [4; NONCE_LEN],
        }
    }

    #[test]
    fn layout_sizes_are_pinned() {
        assert_eq!(HEADER_LEN, 88);
        assert_eq!(SEALED_LEN, 72);
        assert_eq!(OFF_CHECKSUM, 160);
        assert_eq!(SLOT_LEN, 176);
        assert_eq!(FILE_LEN, 8192);
    }

    #[test]
    fn header_round_trip() {
        let h = header();
        let bytes = h.encode();
        assert_eq!(&bytes[..8], b"OUBLIVLT");
        assert_eq!(SlotHeader::decode(&bytes).unwrap(), h);
    }

    #[test]
    fn seal_parse_open_round_trip() {
        let p = RingProvider::new();
        let kek = p.random_key();
        let rec = VaultRecord {
            store_id: [5; 16],
            epoch: 42,
            key: p.random_key(),
        };
        let region = seal_slot(&p, &kek, &header(), &rec);
        assert_eq!(region.len(), SLOT_STRIDE);
        assert!(region[SLOT_LEN..].iter().all(|&b| b == 0));
        let slot = parse_slot(&region).unwrap();
        assert_eq!(slot.header, header());
        assert_eq!(open_slot(&p, &kek, &slot).unwrap(), rec);
        assert!(open_slot(&p, &p.random_key(), &slot).is_none());

        // The key never appears in clear.
        let key = rec.key.expose();
        assert!(!region.windows(KEY_LEN).any(|w| w == key));

        let mut torn = region.clone();
        torn[100] ^= 0x10;
        assert_eq!(parse_slot(&torn).unwrap_err(), SlotFault::BadChecksum);
        assert_eq!(
            parse_slot(&vec![0u8; SLOT_STRIDE]).unwrap_err(),
            SlotFault::Erased
        );
    }

    #[test]
    fn absurd_params_with_fixed_checksum_are_bad_header() {
        let p = RingProvider::new();
        let kek = p.random_key();
        let rec = VaultRecord {
            store_id: [5; 16],
            epoch: 1,
            key: p.random_key(),
        };
        let mut h = header();
        h.params.m_cost_kib = u32::MAX; // > 4 GiB
        let region = seal_slot(&p, &kek, &h, &rec);
        assert!(matches!(parse_slot(&region), Err(SlotFault::BadHeader(_))));
    }
}
