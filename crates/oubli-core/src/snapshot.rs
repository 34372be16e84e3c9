//! Snapshots: kept tree roots, as the catalog (crate::catalog) and the intent log record them.
//!
//! A snapshot is the root pointer (address and key) of the tree as it was
//! when the snapshot was taken. Its nodes and cells are shared with the live
//! tree and with other snapshots until one of them changes; nothing is
//! copied. The catalog holds every snapshot's root and key, sealed like a
//! node under a fresh key kept in the superblock: when a snapshot leaves
//! it, the next commit's new epoch key is the end of the only chain that
//! reached its root, and every unit only it reached is erased.

use crate::codec::{DecodeError, Reader, Writer};
use crate::tree::NodePtr;

/// Longest snapshot name, in bytes.
pub const NAME_MAX: usize = 255;

/// One snapshot as the table and the intent log record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// The epoch in which it was taken.
    pub epoch: u64,
    /// When automatic retention removes it (seconds since the Unix epoch).
    pub expires_at: Option<u64>,
    /// The root of the tree it keeps, and the root's level; `None`: an empty store.
    pub root: Option<(NodePtr, u8)>,
}

/// Checks a snapshot name: 1 to 255 bytes, no `/`, no `@` (NBD's
/// `EXPORT@SNAP`), no control character, not `.` or `..`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(format!(
            "a snapshot name has 1 to {NAME_MAX} bytes: {name:?}"
        ));
    }
    if name == "." || name == ".." || name.contains(['/', '@']) || name.contains(char::is_control) {
        return Err(format!(
            "a snapshot name may not be . or .. nor contain /, @ or a control character: {name:?}"
        ));
    }
    Ok(())
}

pub(crate) fn encode_record(w: &mut Writer, s: &SnapshotRecord) {
    w.bytes(s.name.as_bytes());
    w.u64(s.created_at);
    w.u64(s.epoch);
    w.u64(s.expires_at.map_or(0, |t| t.max(1)));
    crate::superblock::write_root(w, &s.root);
}

pub(crate) fn decode_record(r: &mut Reader) -> Result<SnapshotRecord, DecodeError> {
    let name = String::from_utf8(r.bytes()?.to_vec()).map_err(|_| DecodeError("name"))?;
    let created_at = r.u64()?;
    let epoch = r.u64()?;
    let expires_at = match r.u64()? {
        0 => None,
        t => Some(t),
    };
    let root = crate::superblock::read_root(r)?;
    Ok(SnapshotRecord {
        name,
        created_at,
        epoch,
        expires_at,
        root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_crypto::KeyRef;

    #[test]
    fn catalog_round_trips() {
        let records = vec![
            SnapshotRecord {
                name: "a".into(),
                created_at: 5,
                epoch: 3,
                expires_at: None,
                root: None,
            },
            SnapshotRecord {
                name: "daily-2026-11-23".into(),
                created_at: 1_800_000_000,
                epoch: 77,
                expires_at: Some(1_800_086_400),
                root: Some((
                    NodePtr {
                        addr: (9 << 32) | 4096,
                        len: 300,
                        key: KeyRef::from_bytes([7; 32]),
                    },
                    2,
                )),
            },
        ];
        let catalog = crate::catalog::Catalog {
            snapshots: records,
            shares: vec![crate::share::ShareRecord {
                id: 1,
                name: "t".into(),
                vault: "/v".into(),
                created_at: 9,
                destroyed_at: None,
            }],
        };
        let bytes = catalog.encode();
        assert_eq!(crate::catalog::Catalog::decode(&bytes).unwrap(), catalog);
        assert!(crate::catalog::Catalog::decode(&bytes[..20]).is_err());
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "daily-1", "x.y", &"n".repeat(255)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a@b", "a\0", "a\nb", &"n".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
