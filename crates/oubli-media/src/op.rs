//! `Op`: one mutating medium operation, shared by the crash model and the recorder.

use std::fmt;
use std::sync::Arc;

use oubli_core::{SegmentId, Slot};

/// One mutating call on a [`Medium`](oubli_core::Medium), as it was made.
///
/// Payloads are `Arc<[u8]>` so that the same bytes can sit in a log, in a
/// crash model's pending list and in a segment without being copied.
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    /// `append(id, offset, data)`.
    Append {
        id: SegmentId,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// `rewrite(id, offset, data)`: bytes appended earlier, written over.
    Rewrite {
        id: SegmentId,
        offset: u64,
        data: Arc<[u8]>,
    },
    /// `write_superblock(slot, data)`.
    Superblock { slot: Slot, data: Arc<[u8]> },
    /// `delete_segment(id)`.
    Delete { id: SegmentId },
    /// `sync()`.
    Sync,
}

impl Op {
    /// Payload bytes carried by this operation (0 for deletes and syncs).
    pub fn payload_len(&self) -> usize {
        match self {
            Op::Append { data, .. } | Op::Rewrite { data, .. } | Op::Superblock { data, .. } => {
                data.len()
            }
            Op::Delete { .. } | Op::Sync => 0,
        }
    }
}

// Hand-written so that logging an op does not dump megabytes of ciphertext.
impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Append { id, offset, data } => {
                write!(f, "Append(seg {id:08x} @ {offset}, {} bytes)", data.len())
            }
            Op::Rewrite { id, offset, data } => {
                write!(f, "Rewrite(seg {id:08x} @ {offset}, {} bytes)", data.len())
            }
            Op::Superblock { slot, data } => {
                write!(f, "Superblock({slot:?}, {} bytes)", data.len())
            }
            Op::Delete { id } => write!(f, "Delete(seg {id:08x})"),
            Op::Sync => write!(f, "Sync"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_short_and_payload_len_counts() {
        let op = Op::Append {
            id: 3,
            offset: 10,
            data: Arc::from(vec![0u8; 1 << 20]),
        };
        let s = format!("{op:?}");
        assert!(s.len() < 64, "{s}");
        assert_eq!(op.payload_len(), 1 << 20);
        assert_eq!(Op::Sync.payload_len(), 0);
        assert_eq!(
            format!("{:?}", Op::Delete { id: 1 }),
            "Delete(seg 00000001)"
        );
    }
}
