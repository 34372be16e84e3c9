//! Units on the medium: the engine's read-only context, associated data, and opening (authenticating) one sealed unit or tree node.

use crate::error::{read_error, Error, Result};
use crate::medium::Medium;
use crate::tree::{addr_offset, addr_segment, CellRef, Node, NodePtr, NodeSource};
use oubli_crypto::{CryptoProvider, KeyScheme, PlainBuf, SecretKey};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

/// Everything the tree needs to load a node: the read-only context of the engine.
pub(crate) struct Ctx {
    pub(crate) medium: Arc<dyn Medium>,
    pub(crate) provider: Arc<dyn CryptoProvider>,
    pub(crate) scheme: Arc<dyn KeyScheme>,
    pub(crate) cache: RefCell<NodeCache>,
    pub(crate) io_guard: Arc<RwLock<()>>,
}

#[derive(Default)]
pub(crate) struct NodeCache {
    map: HashMap<u64, (Arc<Node>, usize)>,
    order: VecDeque<u64>,
    bytes: usize,
    pub(crate) limit: usize,
}

impl NodeCache {
    /// An empty cache holding at most `limit` bytes of memory in decrypted
    /// nodes (as [`Node::mem_bytes`] counts them).
    pub(crate) fn with_limit(limit: usize) -> NodeCache {
        NodeCache {
            limit,
            ..Default::default()
        }
    }
    pub(crate) fn get(&self, addr: u64) -> Option<Arc<Node>> {
        self.map.get(&addr).map(|(n, _)| n.clone())
    }
    pub(crate) fn insert(&mut self, addr: u64, node: Arc<Node>, size: usize) {
        if self.map.insert(addr, (node, size)).is_none() {
            self.order.push_back(addr);
            self.bytes += size;
        }
        while self.bytes > self.limit {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, s)) = self.map.remove(&old) {
                self.bytes -= s;
            }
        }
    }
}

pub(crate) fn node_aad(level: u8) -> Vec<u8> {
    let mut aad = b"oubli/node/v1".to_vec();
    aad.push(level);
    aad
}

pub(crate) fn cell_aad(oid: u64, cell: u64, start: u32, len: u32) -> [u8; CELL_AAD_LEN] {
    // A fixed array, not a Vec: it is made for every cell read and sealed.
    let mut aad = [0u8; CELL_AAD_LEN];
    let parts: [&[u8]; 5] = [
        CELL_AAD_LABEL,
        &oid.to_le_bytes(),
        &cell.to_le_bytes(),
        &start.to_le_bytes(),
        &len.to_le_bytes(),
    ];
    let mut at = 0;
    for part in parts {
        aad[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    aad
}

const CELL_AAD_LABEL: &[u8] = b"oubli/cell/v1";
/// The label, the object, the cell, and the stored range's start and length.
pub(crate) const CELL_AAD_LEN: usize = CELL_AAD_LABEL.len() + 8 + 8 + 4 + 4;

/// Cell ids from here on name the small cells of a split cell (DESIGN §3,
/// "Split cells"): id `SPLIT_CELLS | j` covers bytes
/// `[j·SMALL_CELL_SIZE, (j+1)·SMALL_CELL_SIZE)` of its object, whatever
/// the object's cell size. They sort after the object's other cells.
pub const SPLIT_CELLS: u64 = 1 << 63;

/// Where cell `cell` of an object whose cell size is `cell_size` lies: its
/// first byte and its size (a split cell's small cell, or one of the
/// object's own cells).
pub fn cell_span(cell: u64, cell_size: u32) -> (u64, u32) {
    let small = crate::SMALL_CELL_SIZE;
    if cell >= SPLIT_CELLS {
        ((cell - SPLIT_CELLS) * u64::from(small), small)
    } else {
        (cell * u64::from(cell_size), cell_size)
    }
}

/// Names a cell in a message: by byte offset, or by index when the
/// object's cell size is not at hand (`cell_size` 0).
pub(crate) fn describe_cell(oid: u64, cell: u64, c: &CellRef, cell_size: u32) -> String {
    let at = match cell_size {
        0 if cell < SPLIT_CELLS => format!("cell {cell}"),
        cs => format!("byte {}", cell_span(cell, cs).0 + c.start as u64),
    };
    format!(
        "data of object {oid} at {at} (segment {} offset {})",
        addr_segment(c.addr),
        addr_offset(c.addr)
    )
}

/// Reads, authenticates and decrypts one data cell.
#[allow(clippy::too_many_arguments)] // the unit's identity (oid, cell, ref) and its keys, from two callers that share no context type
pub(crate) fn open_cell_unit(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    scheme: &dyn KeyScheme,
    cell_size: u32,
    oid: u64,
    cell: u64,
    c: &CellRef,
    share: Option<&SecretKey>,
) -> Result<PlainBuf> {
    let key = scheme
        .resolve(&c.key)
        .map_err(|e| Error::Corrupt(format!("{}: {e}", describe_cell(oid, cell, c, cell_size))))?;
    let key = match share {
        Some(s) => crate::share::bind(provider, s, &key),
        None => key,
    };
    open_unit(
        medium,
        provider,
        &key,
        c.addr,
        c.sealed_len(),
        &cell_aad(oid, cell, c.start, c.len),
        &|| describe_cell(oid, cell, c, cell_size),
    )
}

/// Reads and authenticates one sealed unit.
pub(crate) fn open_unit(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    key: &SecretKey,
    at: u64,
    sealed_len: u64,
    aad: &[u8],
    what: &dyn Fn() -> String,
) -> Result<PlainBuf> {
    let mut buf = PlainBuf::zeroed(sealed_len as usize);
    medium
        .read(addr_segment(at), addr_offset(at) as u64, &mut buf)
        .map_err(|e| read_error(&what(), e))?;
    let len = provider
        .open_in_place(key, aad, &mut buf)
        .map_err(|_| Error::Corrupt(what()))?;
    buf.truncate(len);
    Ok(buf)
}

impl NodeSource for Ctx {
    fn load(&self, ptr: &NodePtr, level: u8) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.borrow().get(ptr.addr) {
            return Ok(node);
        }
        let what = || {
            format!(
                "tree node (level {level}) at segment {} offset {}",
                addr_segment(ptr.addr),
                addr_offset(ptr.addr)
            )
        };
        let key = self
            .scheme
            .resolve(&ptr.key)
            .map_err(|e| Error::Corrupt(format!("{}: {e}", what())))?;
        let plain = open_unit(
            &*self.medium,
            &*self.provider,
            &key,
            ptr.addr,
            ptr.len as u64,
            &node_aad(level),
            &what,
        )?;
        let node = crate::tree::decode_node(&plain)
            .map_err(|e| Error::Corrupt(format!("{} ({e})", what())))?;
        if node.level() != level {
            return Err(Error::Corrupt(what()));
        }
        let node = Arc::new(node);
        let mem = node.mem_bytes();
        self.cache.borrow_mut().insert(ptr.addr, node.clone(), mem);
        Ok(node)
    }
}
