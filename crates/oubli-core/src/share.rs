//! Key shares: second secrets, each in its own vault, that the keys of the data placed under them depend on.
//!
//! The AEAD key of a data cell of an object under share `s` is
//! `derive(K_s, "oubli/share-cell/v1", k_cell)`: the cell's key from the key
//! tree (which dies with the epoch key, as every key) bound to the share's
//! key, which lives only in the share's vault. Destroying that vault's key
//! makes the data unrecoverable at once, in the live store, every snapshot
//! and every old copy of the medium, even for whoever kept every epoch key.

use crate::codec::{DecodeError, Reader, Writer};
use oubli_crypto::{CryptoProvider, SecretKey};

/// One share as the catalog and the intent log record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareRecord {
    /// Never 0 (no share), never reused.
    pub id: u32,
    pub name: String,
    /// Where its key lives (a vault address: a file, `tpm:...`, `pkcs11:...`).
    pub vault: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// When it was destroyed; its data is unrecoverable from then on.
    pub destroyed_at: Option<u64>,
}

/// Checks a share name: 1 to 255 bytes without control characters or spaces.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 || name.contains(char::is_whitespace) {
        return Err(format!(
            "a share name has 1 to 255 bytes and no spaces: {name:?}"
        ));
    }
    if name.contains(char::is_control) {
        return Err(format!(
            "a share name may not contain a control character: {name:?}"
        ));
    }
    Ok(())
}

/// The AEAD key of a data cell under a share (see the module comment).
pub(crate) fn bind(
    provider: &dyn CryptoProvider,
    share: &SecretKey,
    cell: &SecretKey,
) -> SecretKey {
    provider.derive(share, b"oubli/share-cell/v1", cell.expose())
}

pub(crate) fn encode_share(w: &mut Writer, s: &ShareRecord) {
    w.u32(s.id);
    w.bytes(s.name.as_bytes());
    w.bytes(s.vault.as_bytes());
    w.u64(s.created_at);
    w.u64(s.destroyed_at.map_or(0, |t| t.max(1)));
}

pub(crate) fn decode_share(r: &mut Reader) -> Result<ShareRecord, DecodeError> {
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| DecodeError("share text"));
    Ok(ShareRecord {
        id: r.u32()?,
        name: text(r.bytes()?)?,
        vault: text(r.bytes()?)?,
        created_at: r.u64()?,
        destroyed_at: match r.u64()? {
            0 => None,
            t => Some(t),
        },
    })
}
