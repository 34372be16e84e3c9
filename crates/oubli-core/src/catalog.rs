//! The catalog: the snapshots and key shares of a store, sealed as one unit under a fresh key that the superblock names.

use crate::codec::{DecodeError, Reader, Writer};
use crate::share::{decode_share, encode_share, ShareRecord};
use crate::snapshot::{decode_record, encode_record, SnapshotRecord};

/// Associated data of the sealed catalog.
pub(crate) const CATALOG_AAD: &[u8] = b"oubli/catalog/v1";

/// What the catalog lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    /// In name order.
    pub snapshots: Vec<SnapshotRecord>,
    /// In id order; destroyed shares stay (ids are never reused).
    pub shares: Vec<ShareRecord>,
}

impl Catalog {
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.shares.is_empty()
    }

    /// The plaintext: each list as a count and its records.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.varint(self.snapshots.len() as u64);
        for s in &self.snapshots {
            encode_record(&mut w, s);
        }
        w.varint(self.shares.len() as u64);
        for s in &self.shares {
            encode_share(&mut w, s);
        }
        w.buf
    }

    pub fn decode(bytes: &[u8]) -> Result<Catalog, DecodeError> {
        let mut r = Reader::new(bytes);
        let count = |r: &mut Reader| -> Result<usize, DecodeError> {
            let n = r.varint()? as usize;
            if n > bytes.len() {
                return Err(DecodeError("catalog count"));
            }
            Ok(n)
        };
        let mut out = Catalog::default();
        for _ in 0..count(&mut r)? {
            out.snapshots.push(decode_record(&mut r)?);
        }
        for _ in 0..count(&mut r)? {
            out.shares.push(decode_share(&mut r)?);
        }
        if !r.is_empty() {
            return Err(DecodeError("trailing bytes"));
        }
        Ok(out)
    }
}
