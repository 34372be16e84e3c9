//! The intent log: tree operations acknowledged by a flush, sealed in batches under keys derived from the epoch key.
//!
//! Each epoch has its own log segment. A flush appends one *frame*: a 4-byte
//! length and one AEAD-sealed batch of [`Op`]s. The batch key is derived from
//! the epoch key and the batch's sequence number, so the log dies with the
//! epoch key: once the vault holds the next epoch's key, nothing in an old log
//! — including the keys of cells written and deleted within that epoch — opens.

use crate::codec::{DecodeError, Reader, Writer};
use crate::tree::{CellRef, NameBucket, ObjectRecord};
use crate::vault::StoreId;
use oubli_crypto::{CryptoProvider, KeyRef, SecretKey};

/// One logical change to the tree. Replaying the ops of a log in order on the
/// epoch's committed tree reproduces every flushed state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutCell {
        oid: u64,
        cell: u64,
        cref: CellRef,
    },
    DropCell {
        oid: u64,
        cell: u64,
    },
    /// Drop every cell with `from <= index < to` (only the cells that exist).
    DropCells {
        oid: u64,
        from: u64,
        to: u64,
    },
    SetObject {
        oid: u64,
        record: ObjectRecord,
    },
    /// Drop the object with all its cells and names.
    DeleteObject {
        oid: u64,
    },
    /// Replace the bucket of directory `dir` for name hash `hash` (empty = remove).
    PutNames {
        dir: u64,
        hash: u64,
        bucket: NameBucket,
    },
}

fn batch_key(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    seq: u64,
) -> SecretKey {
    let mut ctx = store_id.to_vec();
    ctx.extend_from_slice(&epoch.to_le_bytes());
    ctx.extend_from_slice(&seq.to_le_bytes());
    provider.derive(epoch_key, b"oubli/intent-log", &ctx)
}

fn batch_aad(epoch: u64, seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    w.raw(b"oubli/log/v1");
    w.u64(epoch);
    w.u64(seq);
    w.buf
}

pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::default();
    w.varint(ops.len() as u64);
    for op in ops {
        match op {
            Op::PutCell { oid, cell, cref } => {
                w.u8(1);
                w.varint(*oid);
                w.varint(*cell);
                w.varint(cref.start as u64);
                w.varint(cref.len as u64);
                w.varint(cref.addr);
                w.raw(cref.key.expose());
            }
            Op::DropCell { oid, cell } => {
                w.u8(2);
                w.varint(*oid);
                w.varint(*cell);
            }
            Op::DropCells { oid, from, to } => {
                w.u8(3);
                w.varint(*oid);
                w.varint(*from);
                w.varint(*to);
            }
            Op::SetObject { oid, record } => {
                w.u8(4);
                w.varint(*oid);
                w.varint(record.size);
                w.bytes(&record.meta);
            }
            Op::DeleteObject { oid } => {
                w.u8(5);
                w.varint(*oid);
            }
            Op::PutNames { dir, hash, bucket } => {
                w.u8(6);
                w.varint(*dir);
                w.varint(*hash);
                w.varint(bucket.entries.len() as u64);
                for (name, target) in &bucket.entries {
                    w.bytes(name);
                    w.varint(*target);
                }
            }
        }
    }
    w.buf
}

pub fn decode_ops(bytes: &[u8]) -> Result<Vec<Op>, DecodeError> {
    let mut r = Reader::new(bytes);
    let n = r.varint()? as usize;
    if n > bytes.len() {
        return Err(DecodeError("op count"));
    }
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let op = match r.u8()? {
            1 => Op::PutCell {
                oid: r.varint()?,
                cell: r.varint()?,
                cref: CellRef {
                    start: u32::try_from(r.varint()?).map_err(|_| DecodeError("start"))?,
                    len: u32::try_from(r.varint()?).map_err(|_| DecodeError("len"))?,
                    addr: r.varint()?,
                    key: KeyRef::from_bytes(r.array()?),
                },
            },
            2 => Op::DropCell {
                oid: r.varint()?,
                cell: r.varint()?,
            },
            3 => Op::DropCells {
                oid: r.varint()?,
                from: r.varint()?,
                to: r.varint()?,
            },
            4 => Op::SetObject {
                oid: r.varint()?,
                record: ObjectRecord {
                    size: r.varint()?,
                    meta: r.bytes()?.to_vec(),
                },
            },
            5 => Op::DeleteObject { oid: r.varint()? },
            6 => {
                let dir = r.varint()?;
                let hash = r.varint()?;
                let count = r.varint()? as usize;
                if count > bytes.len() {
                    return Err(DecodeError("bucket size"));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let name = r.bytes()?.to_vec();
                    entries.push((name, r.varint()?));
                }
                Op::PutNames {
                    dir,
                    hash,
                    bucket: NameBucket { entries },
                }
            }
            _ => return Err(DecodeError("unknown op")),
        };
        ops.push(op);
    }
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(ops)
}

/// Seals a batch into a frame ready to append to the log segment.
pub fn seal_frame(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    seq: u64,
    ops: &[Op],
) -> Vec<u8> {
    let mut body = encode_ops(ops);
    provider.seal(
        &batch_key(provider, epoch_key, store_id, epoch, seq),
        &batch_aad(epoch, seq),
        &mut body,
    );
    let mut frame = Vec::with_capacity(body.len() + 4);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Opens the sealed part of a frame; `None` if it does not authenticate.
pub fn open_frame(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    seq: u64,
    mut sealed: Vec<u8>,
) -> Option<Vec<Op>> {
    provider
        .open(
            &batch_key(provider, epoch_key, store_id, epoch, seq),
            &batch_aad(epoch, seq),
            &mut sealed,
        )
        .ok()?;
    decode_ops(&sealed).ok()
}
