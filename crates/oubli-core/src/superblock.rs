//! Superblocks: a plaintext header naming store and epoch, and a body sealed under the epoch key.

use crate::codec::{DecodeError, Reader, Writer};
use crate::error::{Error, Result};
use crate::tree::NodePtr;
use crate::vault::StoreId;
use oubli_crypto::{CryptoProvider, KeyRef, SecretKey};

pub const MAGIC: &[u8; 8] = b"OUBLI\0SB";
/// Version 7: split cells — small cells of a large one, leaf entries
/// with cell ids from `SPLIT_CELLS` (DESIGN §3); nothing else changed.
/// Version 6: intent-log frames carry the cells their batch puts, and the
/// tally may lag them (docs/FORMAT.md). Version 5: a cell size per object (a leaf-entry kind and a log op; the
/// superblock itself is as in 3). Version 4: holes inside cells (a
/// leaf-entry flag and a log op). Version 3: the snapshot table, the key-scheme id and the scheme's state
/// pointer. Version 2: salted intent-log frames and the log tally
/// (docs/FORMAT.md). Older stores still open; their first commit writes
/// the current version.
pub const FORMAT_VERSION: u16 = 7;
/// The key scheme of every store so far: a random key in each parent pointer.
pub const KEY_SCHEME_PARENT_POINTER: u8 = 0;
const HEADER_LEN: usize = 8 + 2 + 2 + 16 + 8 + 4;

/// The header every superblock slot starts with, readable without keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub store_id: StoreId,
    pub epoch: u64,
}

/// What an epoch's superblock records (sealed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    /// Cell size in bytes (power of two), fixed at init.
    pub cell_size: u32,
    /// The tree root and its level, or none for an empty store.
    pub root: Option<(NodePtr, u8)>,
    pub next_oid: u64,
    pub next_segment: u32,
    /// The segment carrying this epoch's intent log.
    pub log_segment: u32,
    /// The segment carrying the log's tally (format 2; `None` in format 1).
    pub log_tally: Option<u32>,
    /// Sealed bytes reachable from the root (data cells and nodes).
    pub live_bytes: u64,
    /// Seconds since the Unix epoch when this epoch was committed.
    pub committed_at: u64,
    /// The catalog of snapshots and key shares, sealed as one unit
    /// (format 3; `None`: neither).
    pub catalog: Option<NodePtr>,
    /// Which key scheme made the unit keys (format 3; 0 before):
    /// `oubli_crypto::SCHEME_*`.
    pub key_scheme: u8,
    /// The key scheme's own committed state, sealed under the epoch key
    /// (`crate::scheme_state`; the pointer's key slot holds its salt).
    /// `None` for the parent-pointer scheme, which keeps every key in the
    /// tree, and for the others before their first commit.
    pub scheme_state: Option<NodePtr>,
}

/// A tree root and its level, or none (an empty tree).
pub(crate) fn write_root(w: &mut Writer, root: &Option<(NodePtr, u8)>) {
    match root {
        None => w.u8(0),
        Some((ptr, level)) => {
            w.u8(1);
            w.u8(*level);
            w.u64(ptr.addr);
            w.u32(ptr.len);
            w.raw(ptr.key.expose());
        }
    }
}

pub(crate) fn read_root(r: &mut Reader) -> Result<Option<(NodePtr, u8)>, DecodeError> {
    Ok(match r.u8()? {
        0 => None,
        1 => {
            let level = r.u8()?;
            let addr = r.u64()?;
            let len = r.u32()?;
            let key = KeyRef::from_bytes(r.array()?);
            Some((NodePtr { addr, len, key }, level))
        }
        _ => return Err(DecodeError("root flag")),
    })
}

fn write_ptr(w: &mut Writer, ptr: &Option<NodePtr>) {
    match ptr {
        None => w.u8(0),
        Some(p) => {
            w.u8(1);
            w.u64(p.addr);
            w.u32(p.len);
            w.raw(p.key.expose());
        }
    }
}

fn read_ptr(r: &mut Reader) -> Result<Option<NodePtr>, DecodeError> {
    Ok(match r.u8()? {
        0 => None,
        1 => Some(NodePtr {
            addr: r.u64()?,
            len: r.u32()?,
            key: KeyRef::from_bytes(r.array()?),
        }),
        _ => return Err(DecodeError("pointer flag")),
    })
}

pub fn superblock_key(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    header: &Header,
) -> SecretKey {
    let mut ctx = header.store_id.to_vec();
    ctx.extend_from_slice(&header.epoch.to_le_bytes());
    provider.derive(epoch_key, b"oubli/superblock", &ctx)
}

fn encode_header(h: &Header, sealed_len: u32) -> Vec<u8> {
    let mut w = Writer::with_capacity(HEADER_LEN);
    w.raw(MAGIC);
    w.u16(h.version);
    w.u16(0);
    w.raw(&h.store_id);
    w.u64(h.epoch);
    w.u32(sealed_len);
    w.buf
}

/// Parses the plaintext header; `None` when the slot holds no superblock at all.
pub fn parse_header(bytes: &[u8]) -> Result<Option<(Header, usize)>> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return Ok(None);
    }
    let mut r = Reader::new(&bytes[8..HEADER_LEN]);
    let parse = |r: &mut Reader| -> Result<(Header, usize), DecodeError> {
        let version = r.u16()?;
        let _flags = r.u16()?;
        let store_id = r.array()?;
        let epoch = r.u64()?;
        let sealed_len = r.u32()? as usize;
        Ok((
            Header {
                version,
                store_id,
                epoch,
            },
            sealed_len,
        ))
    };
    let (h, sealed_len) =
        parse(&mut r).map_err(|e| Error::Corrupt(format!("superblock header: {e}")))?;
    Ok(Some((h, sealed_len)))
}

pub fn seal(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    header: &Header,
    body: &Body,
) -> Vec<u8> {
    let mut w = Writer::default();
    w.u32(body.cell_size);
    write_root(&mut w, &body.root);
    w.u64(body.next_oid);
    w.u32(body.next_segment);
    w.u32(body.log_segment);
    if header.version >= 2 {
        w.u32(
            body.log_tally
                .expect("a format-2 superblock names its log tally"),
        );
    }
    w.u64(body.live_bytes);
    w.u64(body.committed_at);
    if header.version >= 3 {
        write_ptr(&mut w, &body.catalog);
        w.u8(body.key_scheme);
        write_ptr(&mut w, &body.scheme_state);
    } else {
        assert!(
            body.catalog.is_none() && body.key_scheme == KEY_SCHEME_PARENT_POINTER,
            "format {} has no snapshots and one key scheme",
            header.version
        );
    }
    let mut sealed = w.buf;
    let aad = encode_header(header, (sealed.len() + oubli_crypto::TAG_LEN) as u32);
    provider.seal(
        &superblock_key(provider, epoch_key, header),
        &aad,
        &mut sealed,
    );
    let mut out = aad;
    out.extend_from_slice(&sealed);
    out
}

pub fn open(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    bytes: &[u8],
) -> Result<(Header, Body)> {
    let (header, sealed_len) =
        parse_header(bytes)?.ok_or_else(|| Error::Corrupt("superblock magic".into()))?;
    if !(1..=FORMAT_VERSION).contains(&header.version) {
        return Err(Error::Version(header.version));
    }
    if bytes.len() < HEADER_LEN + sealed_len {
        return Err(Error::Corrupt("superblock (truncated)".into()));
    }
    let mut body = bytes[HEADER_LEN..HEADER_LEN + sealed_len].to_vec();
    provider
        .open(
            &superblock_key(provider, epoch_key, &header),
            &bytes[..HEADER_LEN],
            &mut body,
        )
        .map_err(|_| Error::Corrupt(format!("superblock of epoch {}", header.epoch)))?;
    let mut r = Reader::new(&body);
    let parse = |r: &mut Reader| -> Result<Body, DecodeError> {
        let cell_size = r.u32()?;
        let root = read_root(r)?;
        Ok(Body {
            cell_size,
            root,
            next_oid: r.u64()?,
            next_segment: r.u32()?,
            log_segment: r.u32()?,
            log_tally: if header.version >= 2 {
                Some(r.u32()?)
            } else {
                None
            },
            live_bytes: r.u64()?,
            committed_at: r.u64()?,
            catalog: if header.version >= 3 {
                read_ptr(r)?
            } else {
                None
            },
            key_scheme: if header.version >= 3 {
                r.u8()?
            } else {
                KEY_SCHEME_PARENT_POINTER
            },
            scheme_state: if header.version >= 3 {
                read_ptr(r)?
            } else {
                None
            },
        })
    };
    let body = parse(&mut r).map_err(|e| Error::Corrupt(format!("superblock body: {e}")))?;
    // The parent-pointer scheme keeps no state; the others name theirs
    // from their first commit on.
    match (body.key_scheme, &body.scheme_state) {
        (KEY_SCHEME_PARENT_POINTER, None)
        | (oubli_crypto::SCHEME_KEYED_HASH_FOREST | oubli_crypto::SCHEME_KEY_STORAGE_AREA, _) => {}
        _ => return Err(Error::UnknownKeyScheme(body.key_scheme)),
    }
    if !valid_cell_size(body.cell_size) {
        return Err(Error::Corrupt("superblock cell size".into()));
    }
    Ok((header, body))
}

/// A cell size the format can hold: a power of two from 512 B to 16 MiB.
pub(crate) fn valid_cell_size(size: u32) -> bool {
    size.is_power_of_two() && (512..=1 << 24).contains(&size)
}

impl Body {
    /// Where this epoch's intent log lives, and in which format (that of
    /// the superblock's `version`).
    pub fn log_place(&self, version: u16) -> crate::log::LogPlace {
        crate::log::LogPlace {
            segment: self.log_segment,
            tally: self.log_tally,
            format: crate::log::LogFormat::of_version(version),
        }
    }
}
