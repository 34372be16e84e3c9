//! The intent log: tree operations acknowledged by a flush, sealed in batches under keys derived from the epoch key, with a tally that proves how many were acknowledged.
//!
//! Each epoch has its own log segment and its own *tally* segment. A flush
//! appends one *frame* to the log — a 4-byte length, a fresh random salt and
//! one AEAD-sealed batch of [`Op`]s — and syncs. From format 6 a frame also
//! carries the sealed cells its batch puts ([`LogFormat::V3`]), covered by
//! the batch's authentication: a frame opens only if every cell it names
//! is whole, so the cells and the frame need one sync, not one each. A
//! *tally record* (the number of batches and the log's end, authenticated)
//! is appended once the frames it counts are durable: after every flush in
//! format 2, at most once per [`TallyCadence`] interval in format 6 (and
//! by the store's timer). So on replay every batch the tally counts must be
//! there and open; batches past it may be missing or torn (a flush cut
//! before it returned), and those that open are replayed. Truncating the
//! log or damaging a length field below the tally is reported
//! ([`LogRead::damage`]), never taken for a short log.
//!
//! Keys: a batch's key is derived from the epoch key, the batch's sequence
//! number *and its salt*, so two different frames never share a key (and
//! hence a nonce), even when a crash makes the store seal a new batch with
//! the sequence number of one that was written but lost. The log dies with
//! the epoch key: once the vault holds the next epoch's key, nothing in an
//! old log — including the keys of cells written and deleted within that
//! epoch — opens. (The cells a format-6 frame carries are sealed under
//! their own keys, as in a data segment, and live on after the epoch.)
//!
//! Stores of format version 1 have frames without salt and no tally; they are
//! still read ([`LogFormat::V1`]) and upgraded by the first commit, as are
//! format-2 to 5 logs ([`LogFormat::V2`]).

use crate::codec::{DecodeError, Reader, Writer};
use crate::medium::{Medium, SegmentId};
use crate::share::ShareRecord;
use crate::snapshot::SnapshotRecord;
use crate::tree::{CellRef, NameBucket, ObjectRecord};
use crate::vault::StoreId;
use oubli_crypto::{CryptoProvider, KeyRef, SecretKey, TAG_LEN};

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
    /// Keep a tree root as a snapshot (format 3). Its nodes were written and
    /// synced before the frame that names them.
    PutSnapshot {
        snapshot: SnapshotRecord,
    },
    /// Forget a snapshot: what only it reached is erased at the next commit.
    DropSnapshot {
        name: String,
    },
    /// Remove these objects — every entry of theirs and every name that
    /// points at one — from every snapshot (the live tree is changed by the
    /// ordinary ops).
    RedactSnapshots {
        oids: Vec<u64>,
    },
    /// Record a key share (created, or destroyed: `destroyed_at` set).
    PutShare {
        share: ShareRecord,
    },
    /// Place an (empty) object under a share.
    SetShare {
        oid: u64,
        share: u32,
    },
    /// A record of the key scheme's own (a keyed hash forest's new tree),
    /// logged before the ops that need it.
    Scheme(Vec<u8>),
    /// The object's cell size, set before its first data (format 5).
    SetCellSize {
        oid: u64,
        cell_size: u32,
    },
}

pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::default();
    w.varint(ops.len() as u64);
    for op in ops {
        match op {
            Op::PutCell { oid, cell, cref } => {
                // 12: a cell with holes (format 4); 1: without.
                w.u8(if cref.holes.is_empty() { 1 } else { 12 });
                w.varint(*oid);
                w.varint(*cell);
                w.varint(cref.start as u64);
                w.varint(cref.len as u64);
                w.varint(cref.addr);
                w.raw(cref.key.expose());
                if !cref.holes.is_empty() {
                    crate::tree::put_holes(&mut w, &cref.holes);
                }
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
            Op::PutSnapshot { snapshot } => {
                w.u8(7);
                crate::snapshot::encode_record(&mut w, snapshot);
            }
            Op::DropSnapshot { name } => {
                w.u8(8);
                w.bytes(name.as_bytes());
            }
            Op::RedactSnapshots { oids } => {
                w.u8(9);
                w.varint(oids.len() as u64);
                for oid in oids {
                    w.varint(*oid);
                }
            }
            Op::PutShare { share } => {
                w.u8(10);
                crate::share::encode_share(&mut w, share);
            }
            Op::SetShare { oid, share } => {
                w.u8(11);
                w.varint(*oid);
                w.u32(*share);
            }
            Op::Scheme(record) => {
                w.u8(13);
                w.bytes(record);
            }
            Op::SetCellSize { oid, cell_size } => {
                w.u8(14);
                w.varint(*oid);
                w.u32(*cell_size);
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
            code @ (1 | 12) => {
                let oid = r.varint()?;
                let cell = r.varint()?;
                let start = u32::try_from(r.varint()?).map_err(|_| DecodeError("start"))?;
                let len = u32::try_from(r.varint()?).map_err(|_| DecodeError("len"))?;
                let addr = r.varint()?;
                let key = KeyRef::from_bytes(r.array()?);
                let end = start.checked_add(len).ok_or(DecodeError("len"))?;
                let holes = if code == 12 {
                    crate::tree::get_holes(&mut r, start, end)?
                } else {
                    Vec::new()
                };
                Op::PutCell {
                    oid,
                    cell,
                    cref: CellRef {
                        start,
                        len,
                        addr,
                        key,
                        holes,
                    },
                }
            }
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
            7 => Op::PutSnapshot {
                snapshot: crate::snapshot::decode_record(&mut r)?,
            },
            8 => Op::DropSnapshot {
                name: String::from_utf8(r.bytes()?.to_vec())
                    .map_err(|_| DecodeError("snapshot name"))?,
            },
            9 => {
                let count = r.varint()? as usize;
                if count > bytes.len() {
                    return Err(DecodeError("oid count"));
                }
                let mut oids = Vec::with_capacity(count);
                for _ in 0..count {
                    oids.push(r.varint()?);
                }
                Op::RedactSnapshots { oids }
            }
            10 => Op::PutShare {
                share: crate::share::decode_share(&mut r)?,
            },
            11 => Op::SetShare {
                oid: r.varint()?,
                share: r.u32()?,
            },
            13 => Op::Scheme(r.bytes()?.to_vec()),
            14 => Op::SetCellSize {
                oid: r.varint()?,
                cell_size: Some(r.u32()?)
                    .filter(|s| crate::superblock::valid_cell_size(*s))
                    .ok_or(DecodeError("cell size"))?,
            },
            _ => return Err(DecodeError("unknown op")),
        };
        ops.push(op);
    }
    if !r.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(ops)
}

/// Bytes of random salt in every frame and tally record.
pub const SALT_LEN: usize = 16;
/// A v2 frame starts with its sealed length (u32) and its salt.
const FRAME_HEADER: usize = 4 + SALT_LEN;
/// A v1 frame starts with its sealed length only.
const FRAME_HEADER_V1: usize = 4;
/// A v3 frame starts with its sealed length, its salt and the length of the
/// cells it carries (which follow the header, before the sealed batch).
pub const FRAME_HEADER_V3: usize = 4 + SALT_LEN + 4;
/// salt ‖ u64 batches ‖ u64 log end ‖ tag.
pub const TALLY_RECORD_LEN: usize = SALT_LEN + 8 + 8 + TAG_LEN;

/// The frame layout of an epoch's log, fixed by its superblock's format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Format 1: no salt, no tally (read only, for stores made before them).
    V1,
    /// Formats 2 to 5: salted frames and a tally segment, a tally record
    /// after every frame.
    V2,
    /// Format 6: frames carry the cells their batch puts, authenticated
    /// with it; the tally may lag the frames ([`TallyCadence`]).
    V3,
}

impl LogFormat {
    /// The log format of an epoch whose superblock is of `version`.
    pub fn of_version(version: u16) -> LogFormat {
        match version {
            1 => LogFormat::V1,
            2..=5 => LogFormat::V2,
            _ => LogFormat::V3,
        }
    }
}

/// How often a format-6 log's tally is brought up to date with the frames.
/// The tally is what tells a truncated or damaged log from a flush cut by a
/// power failure; a frame it does not count yet is replayed if it opens,
/// so a lagging tally loses nothing: it only narrows that check to the
/// frames older than the interval (DESIGN §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TallyCadence {
    /// A tally record after every frame: two syncs per flush.
    EveryFlush,
    /// A flush writes a tally record when the last is older than this
    /// interval, and the store's timer writes one for frames left uncounted
    /// that long; other flushes make one sync.
    Every(std::time::Duration),
    /// A tally record with every `n`th frame of the epoch, and no timer:
    /// the same I/O on every run (crash sweeps cut at every I/O point).
    EveryNthFrame(u64),
}

impl Default for TallyCadence {
    fn default() -> Self {
        TallyCadence::Every(std::time::Duration::from_secs(1))
    }
}

/// What identifies an epoch's log and opens it.
pub struct LogKeys<'a> {
    pub provider: &'a dyn CryptoProvider,
    pub epoch_key: &'a SecretKey,
    pub store_id: &'a StoreId,
    pub epoch: u64,
}

impl LogKeys<'_> {
    fn context(&self, rest: &[&[u8]]) -> Vec<u8> {
        let mut ctx = self.store_id.to_vec();
        ctx.extend_from_slice(&self.epoch.to_le_bytes());
        for part in rest {
            ctx.extend_from_slice(part);
        }
        ctx
    }

    /// The key of batch `seq` sealed with `salt` (`None`: a v1 frame). Public
    /// so that tests can prove no two frames ever share one.
    pub fn batch_key(&self, seq: u64, salt: Option<&[u8; SALT_LEN]>) -> SecretKey {
        match salt {
            None => self.provider.derive(
                self.epoch_key,
                b"oubli/intent-log",
                &self.context(&[&seq.to_le_bytes()]),
            ),
            Some(salt) => self.provider.derive(
                self.epoch_key,
                b"oubli/intent-log/v2",
                &self.context(&[&seq.to_le_bytes(), salt]),
            ),
        }
    }

    fn tally_key(&self, salt: &[u8; SALT_LEN]) -> SecretKey {
        self.provider
            .derive(self.epoch_key, b"oubli/log-tally", &self.context(&[salt]))
    }
}

fn batch_aad(format: LogFormat, epoch: u64, seq: u64, sealed_len: u32, cells: &[u8]) -> Vec<u8> {
    let mut w = Writer::default();
    match format {
        LogFormat::V1 => w.raw(b"oubli/log/v1"),
        LogFormat::V2 => w.raw(b"oubli/log/v2"),
        LogFormat::V3 => w.raw(b"oubli/log/v3"),
    }
    w.u64(epoch);
    w.u64(seq);
    // v2 authenticates the frame's length field too, v3 also the cells the
    // frame carries: a frame whose cells did not all reach the medium does
    // not open.
    if format != LogFormat::V1 {
        w.u32(sealed_len);
    }
    if format == LogFormat::V3 {
        w.u32(cells.len() as u32);
        w.raw(cells);
    }
    w.buf
}

fn tally_aad(epoch: u64, batches: u64, end: u64) -> Vec<u8> {
    let mut w = Writer::default();
    w.raw(b"oubli/log-tally/v2");
    w.u64(epoch);
    w.u64(batches);
    w.u64(end);
    w.buf
}

fn fresh_salt(provider: &dyn CryptoProvider) -> [u8; SALT_LEN] {
    let mut salt = [0u8; SALT_LEN];
    provider.fill_random(&mut salt);
    salt
}

/// Seals batch `seq` into a frame ready to append to the log, under a key
/// of its own (fresh salt).
pub fn seal_frame(keys: &LogKeys, seq: u64, ops: &[Op]) -> Vec<u8> {
    seal_frame_with_salt(keys, seq, ops, fresh_salt(keys.provider))
}

pub(crate) fn seal_frame_with_salt(
    keys: &LogKeys,
    seq: u64,
    ops: &[Op],
    salt: [u8; SALT_LEN],
) -> Vec<u8> {
    let mut body = encode_ops(ops);
    let sealed_len = (body.len() + TAG_LEN) as u32;
    keys.provider.seal(
        &keys.batch_key(seq, Some(&salt)),
        &batch_aad(LogFormat::V2, keys.epoch, seq, sealed_len, &[]),
        &mut body,
    );
    let mut frame = Vec::with_capacity(FRAME_HEADER + body.len());
    frame.extend_from_slice(&sealed_len.to_le_bytes());
    frame.extend_from_slice(&salt);
    frame.extend_from_slice(&body);
    frame
}

/// A format-6 frame in its two appends: the head (header and the sealed
/// cells, which go down at once so that reads find the cells) and the
/// sealed batch (which may have to wait for a data sync).
pub struct FrameV3 {
    pub head: Vec<u8>,
    pub batch: Vec<u8>,
}

/// Seals batch `seq` into a format-6 frame carrying `cells` (sealed units,
/// laid out from [`FRAME_HEADER_V3`] bytes into the frame, where the
/// batch's `PutCell`s point).
pub fn seal_frame_v3(keys: &LogKeys, seq: u64, cells: Vec<u8>, ops: &[Op]) -> FrameV3 {
    seal_frame_v3_with_salt(keys, seq, cells, ops, fresh_salt(keys.provider))
}

pub(crate) fn seal_frame_v3_with_salt(
    keys: &LogKeys,
    seq: u64,
    cells: Vec<u8>,
    ops: &[Op],
    salt: [u8; SALT_LEN],
) -> FrameV3 {
    let mut batch = encode_ops(ops);
    let sealed_len = (batch.len() + TAG_LEN) as u32;
    keys.provider.seal(
        &keys.batch_key(seq, Some(&salt)),
        &batch_aad(LogFormat::V3, keys.epoch, seq, sealed_len, &cells),
        &mut batch,
    );
    let mut head = Vec::with_capacity(FRAME_HEADER_V3 + cells.len());
    head.extend_from_slice(&sealed_len.to_le_bytes());
    head.extend_from_slice(&salt);
    head.extend_from_slice(&(cells.len() as u32).to_le_bytes());
    head.extend_from_slice(&cells);
    FrameV3 { head, batch }
}

/// Seals a tally record: `batches` batches are acknowledged, and the log's
/// first `end` bytes hold them.
pub fn seal_tally(keys: &LogKeys, batches: u64, end: u64) -> Vec<u8> {
    seal_tally_with_salt(keys, batches, end, fresh_salt(keys.provider))
}

pub(crate) fn seal_tally_with_salt(
    keys: &LogKeys,
    batches: u64,
    end: u64,
    salt: [u8; SALT_LEN],
) -> Vec<u8> {
    let mut rec = Vec::with_capacity(TALLY_RECORD_LEN);
    rec.extend_from_slice(&salt);
    rec.extend_from_slice(&batches.to_le_bytes());
    rec.extend_from_slice(&end.to_le_bytes());
    let tag = keys.provider.seal_detached(
        &keys.tally_key(&salt),
        &tally_aad(keys.epoch, batches, end),
        &mut [],
    );
    rec.extend_from_slice(&tag);
    rec
}

/// Opens one tally record: `(batches, end)`.
fn open_tally(keys: &LogKeys, rec: &[u8]) -> Option<(u64, u64)> {
    let salt: [u8; SALT_LEN] = rec[..SALT_LEN].try_into().ok()?;
    let batches = u64::from_le_bytes(rec[SALT_LEN..SALT_LEN + 8].try_into().ok()?);
    let end = u64::from_le_bytes(rec[SALT_LEN + 8..SALT_LEN + 16].try_into().ok()?);
    let tag: &[u8; TAG_LEN] = rec[SALT_LEN + 16..].try_into().ok()?;
    keys.provider
        .open_detached(
            &keys.tally_key(&salt),
            &tally_aad(keys.epoch, batches, end),
            &mut [],
            tag,
        )
        .ok()?;
    Some((batches, end))
}

/// The header of a frame as it lies on the medium, for tests that inspect
/// what was written: `(sealed length, salt)` of a v2 or v3 frame.
pub fn frame_header(frame: &[u8]) -> Option<(u32, [u8; SALT_LEN])> {
    let len = u32::from_le_bytes(frame.get(..4)?.try_into().ok()?);
    let salt = frame.get(4..FRAME_HEADER)?.try_into().ok()?;
    Some((len, salt))
}

/// Where an epoch's log lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPlace {
    pub segment: SegmentId,
    /// The tally segment (v2 only).
    pub tally: Option<SegmentId>,
    pub format: LogFormat,
}

/// What reading an epoch's log found.
#[derive(Debug, Default)]
pub struct LogRead {
    /// The batches that open, in order.
    pub batches: Vec<Vec<Op>>,
    /// Where the next frame goes: the end of the last batch that opened.
    pub end: u64,
    /// Batches the tally proves were acknowledged.
    pub acknowledged: u64,
    /// End of the tally's valid records.
    pub tally_end: u64,
    /// Whether the log segment exists at all (a flush started in this epoch).
    pub exists: bool,
    /// Why an acknowledged batch is missing or damaged: the log was
    /// truncated or tampered with. `batches` holds what opened before it.
    pub damage: Option<String>,
}

/// One frame read at `offset`: its ops and where the next frame starts, or
/// why it could not be read (and the offset the next frame would be at, if
/// its length field was plausible).
fn read_frame(
    medium: &dyn Medium,
    place: &LogPlace,
    keys: &LogKeys,
    offset: u64,
    seq: u64,
) -> Result<(Vec<Op>, u64), (String, Option<u64>)> {
    let header_len = match place.format {
        LogFormat::V1 => FRAME_HEADER_V1,
        LogFormat::V2 => FRAME_HEADER,
        LogFormat::V3 => FRAME_HEADER_V3,
    };
    let mut header = [0u8; FRAME_HEADER_V3];
    medium
        .read(place.segment, offset, &mut header[..header_len])
        .map_err(|e| (format!("missing ({e})"), None))?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let cells_len = match place.format {
        LogFormat::V3 => u32::from_le_bytes(header[FRAME_HEADER..].try_into().expect("4 bytes")),
        _ => 0,
    };
    let capacity = medium.segment_capacity();
    if (len as usize) < TAG_LEN || len as u64 > capacity || cells_len as u64 > capacity {
        return Err((
            format!("its length fields ({len}, {cells_len}) are out of range"),
            None,
        ));
    }
    let body_at = offset + header_len as u64;
    let next = body_at + cells_len as u64 + len as u64;
    let mut cells = vec![0u8; cells_len as usize];
    let mut sealed = vec![0u8; len as usize];
    medium
        .read(place.segment, body_at, &mut cells)
        .and_then(|_| medium.read(place.segment, body_at + cells_len as u64, &mut sealed))
        .map_err(|e| (format!("cut short ({e})"), None))?;
    let salt: Option<[u8; SALT_LEN]> = match place.format {
        LogFormat::V1 => None,
        _ => Some(header[4..FRAME_HEADER].try_into().expect("salt")),
    };
    let opened = keys.provider.open(
        &keys.batch_key(seq, salt.as_ref()),
        &batch_aad(place.format, keys.epoch, seq, len, &cells),
        &mut sealed,
    );
    if opened.is_err() {
        return Err(("it does not authenticate".into(), Some(next)));
    }
    let ops = decode_ops(&sealed).map_err(|e| (format!("it does not decode ({e})"), Some(next)))?;
    Ok((ops, next))
}

/// The tally's last valid record: `(batches, end, bytes of valid records)`.
/// Records are read until the first that does not open (the torn record of
/// a flush cut before it returned, or stale bytes past the segment's end).
fn read_tally(medium: &dyn Medium, tally: SegmentId, keys: &LogKeys) -> (u64, u64, u64) {
    let mut last = (0, 0, 0);
    let mut rec = [0u8; TALLY_RECORD_LEN];
    let mut at = 0u64;
    while medium.read(tally, at, &mut rec).is_ok() {
        match open_tally(keys, &rec) {
            Some((batches, end)) if batches > last.0 => {
                last = (batches, end, at + rec.len() as u64)
            }
            _ => break,
        }
        at += rec.len() as u64;
    }
    last
}

/// Reads an epoch's log: every batch that opens, checked against the tally.
/// A batch past the tally that does not open ends the log (a flush cut
/// before it was acknowledged); an acknowledged one that is missing or does
/// not open — or an unacknowledged one followed by one that opens — is
/// reported in [`LogRead::damage`].
pub fn read_log(medium: &dyn Medium, place: &LogPlace, keys: &LogKeys) -> LogRead {
    let mut out = LogRead {
        exists: matches!(medium.segment_len(place.segment), Ok(Some(_))),
        ..LogRead::default()
    };
    let (acknowledged, acked_end, tally_end) = place
        .tally
        .map(|t| read_tally(medium, t, keys))
        .unwrap_or((0, 0, 0));
    out.acknowledged = acknowledged;
    out.tally_end = tally_end;
    let describe = |seq: u64, offset: u64, why: &str| {
        format!(
            "intent log of epoch {}: batch {seq} (segment {} offset {offset}) {why}",
            keys.epoch, place.segment
        )
    };
    let mut offset = 0u64;
    let mut seq = 0u64;
    loop {
        match read_frame(medium, place, keys, offset, seq) {
            Ok((ops, next)) => {
                out.batches.push(ops);
                offset = next;
                seq += 1;
                if seq == out.acknowledged && offset != acked_end {
                    out.damage = Some(describe(
                        seq - 1,
                        offset,
                        &format!("ends at {offset}, but the tally says {acked_end}"),
                    ));
                    break;
                }
            }
            Err((why, next)) => {
                if seq < out.acknowledged {
                    out.damage = Some(describe(
                        seq,
                        offset,
                        &format!(
                            "is {why}, but {} batches were acknowledged: the log was truncated or damaged",
                            out.acknowledged
                        ),
                    ));
                } else if next.is_some_and(|n| read_frame(medium, place, keys, n, seq + 1).is_ok())
                {
                    // Not a torn tail: a later batch opens, so this one was acknowledged.
                    out.damage = Some(describe(
                        seq,
                        offset,
                        &format!("is {why}, yet the next batch opens"),
                    ));
                }
                break;
            }
        }
    }
    out.end = offset;
    out
}
