//! `FileMedium`: a store inside one regular file or block device, cut into fixed-size segment slots.
//!
//! Layout (all integers little-endian; details in docs/FORMAT-media.md):
//!
//! ```text
//! 0       4 KiB   medium header (magic, version, slot size, size limit, nonce, checksum)
//! 4 KiB   8 KiB   superblock slot A (32-byte slot header + up to 4096 bytes)
//! 12 KiB  8 KiB   superblock slot B
//! 20 KiB  44 KiB  reserved (zero)
//! 64 KiB  ...     segment slot i at 64 KiB + i * slot_size:
//!                 4 KiB slot header (who occupies it) + slot_size - 4 KiB of data
//! ```
//!
//! A superblock slot is 8 KiB rather than 4 KiB because it must hold a full
//! `SUPERBLOCK_MAX` (4096) bytes *plus* its length.
//!
//! Every header carries the 16-byte nonce drawn when the medium was
//! formatted, so headers left over from an earlier format of the same file
//! or device are never mistaken for live ones.
//!
//! **Segment lengths are not stored.** Recording the length would mean
//! rewriting a slot header on every sync, and a torn header write could lose
//! the whole segment. Instead, for a segment written since `open`, the exact
//! length is known in memory; for older ones `segment_len` returns an upper
//! bound (the slot's capacity, or less if the file ends sooner), and `read`
//! may return stale bytes past the real end (from an earlier occupant of the
//! slot, or zeros). The engine authenticates every unit it reads, so stale
//! bytes are rejected, never trusted.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use oubli_core::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};

use crate::util::{
    check_append_bounds, check_rewrite_bounds, check_superblock_len, eof, fnv1a64, invalid_data,
    invalid_input, lock_exclusive, not_found, start_writeback, storage_full, writeback_due,
};

/// Default segment slot size: 64 MiB.
pub const DEFAULT_SLOT_SIZE: u64 = 64 << 20;
/// Smallest accepted slot size: 1 MiB.
pub const MIN_SLOT_SIZE: u64 = 1 << 20;
/// Largest accepted slot size: 4 GiB (segment offsets are `u32`).
pub const MAX_SLOT_SIZE: u64 = 1 << 32;

const MAGIC: [u8; 8] = *b"OUBLI\0FM";
const SB_MAGIC: [u8; 8] = *b"OUBLI\0SB";
const SEG_MAGIC: [u8; 8] = *b"OUBLI\0SG";
const VERSION: u32 = 1;

/// Alignment unit of every region (a common page / sector size).
const BLOCK: u64 = 4096;
const HEADER_LEN: usize = 64;
const SB_OFFSETS: [u64; 2] = [BLOCK, 3 * BLOCK];
const SB_REGION: u64 = 2 * BLOCK;
const SB_HEADER_LEN: usize = 32;
/// Where segment slots begin.
const DATA_START: u64 = 16 * BLOCK;
/// Bytes at the start of each segment slot reserved for its header (only
/// the first `SEG_HEADER_LEN` are used; the rest keeps data block-aligned).
const SEG_HEADER_REGION: u64 = BLOCK;
const SEG_HEADER_LEN: usize = 40;
const SEG_STATE_USED: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Regular,
    Block,
}

/// The medium header, as stored at offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    slot_size: u64,
    /// Size limit in bytes; 0 = unbounded (regular files only).
    total_size: u64,
    nonce: [u8; 16],
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        // 12..16: flags, reserved (0).
        b[16..24].copy_from_slice(&self.slot_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.total_size.to_le_bytes());
        b[32..48].copy_from_slice(&self.nonce);
        b[48..56].copy_from_slice(&DATA_START.to_le_bytes());
        let sum = fnv1a64(&b[0..56]);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_LEN], what: &str) -> io::Result<Header> {
        if b[0..8] != MAGIC {
            return Err(invalid_data(format!(
                "{what} is not an oubli file store (bad magic)"
            )));
        }
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(invalid_data(format!(
                "{what}: unsupported file store format version {version}"
            )));
        }
        if u64::from_le_bytes(b[56..64].try_into().unwrap()) != fnv1a64(&b[0..56]) {
            return Err(invalid_data(format!("{what}: header checksum mismatch")));
        }
        let flags = u32::from_le_bytes(b[12..16].try_into().unwrap());
        let data_start = u64::from_le_bytes(b[48..56].try_into().unwrap());
        if flags != 0 || data_start != DATA_START {
            return Err(invalid_data(format!(
                "{what}: unsupported header (flags {flags:#x}, data start {data_start})"
            )));
        }
        let h = Header {
            slot_size: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            total_size: u64::from_le_bytes(b[24..32].try_into().unwrap()),
            nonce: b[32..48].try_into().unwrap(),
        };
        check_slot_size(h.slot_size).map_err(|e| invalid_data(format!("{what}: {e}")))?;
        Ok(h)
    }
}

fn check_slot_size(slot_size: u64) -> io::Result<()> {
    if !(MIN_SLOT_SIZE..=MAX_SLOT_SIZE).contains(&slot_size) || !slot_size.is_multiple_of(BLOCK) {
        return Err(invalid_input(format!(
            "slot size {slot_size} must be a multiple of {BLOCK} between {MIN_SLOT_SIZE} and {MAX_SLOT_SIZE}"
        )));
    }
    Ok(())
}

fn encode_seg_header(nonce: &[u8; 16], id: SegmentId) -> [u8; SEG_HEADER_LEN] {
    let mut b = [0u8; SEG_HEADER_LEN];
    b[0..8].copy_from_slice(&SEG_MAGIC);
    b[8..24].copy_from_slice(nonce);
    b[24..28].copy_from_slice(&id.to_le_bytes());
    b[28..32].copy_from_slice(&SEG_STATE_USED.to_le_bytes());
    let sum = fnv1a64(&b[0..32]);
    b[32..40].copy_from_slice(&sum.to_le_bytes());
    b
}

/// The segment id recorded in a slot header, or `None` for a free, torn or
/// foreign one.
fn decode_seg_header(nonce: &[u8; 16], b: &[u8; SEG_HEADER_LEN]) -> Option<SegmentId> {
    let valid = b[0..8] == SEG_MAGIC
        && b[8..24] == nonce[..]
        && u32::from_le_bytes(b[28..32].try_into().unwrap()) == SEG_STATE_USED
        && u64::from_le_bytes(b[32..40].try_into().unwrap()) == fnv1a64(&b[0..32]);
    valid.then(|| u32::from_le_bytes(b[24..28].try_into().unwrap()))
}

/// 16 bytes that differ between formats. Uniqueness is all that matters
/// (it is not a secret), so the clock is an acceptable fallback.
fn fresh_nonce() -> [u8; 16] {
    let mut n = [0u8; 16];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut n))
        .is_ok()
    {
        return n;
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let seed = format!("{t}-{}-{:p}", std::process::id(), &n);
    n[..8].copy_from_slice(&fnv1a64(seed.as_bytes()).to_le_bytes());
    n[8..].copy_from_slice(&fnv1a64(format!("{seed}!").as_bytes()).to_le_bytes());
    n
}

#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    slot: u64,
    /// Exact length when written since open; `None` when unknown.
    len: Option<u64>,
    /// Where the kernel was last asked to start writing the segment out
    /// (see [`WRITEBACK_HINT`](crate::util::WRITEBACK_HINT)).
    hinted_to: u64,
}

#[derive(Debug)]
struct FileState {
    map: BTreeMap<SegmentId, SlotInfo>,
    /// Free slot indices below `next_slot`, reused lowest first.
    free: BTreeSet<u64>,
    /// Slots freed since the last sync. They are not reused until a sync
    /// makes the deletion durable: otherwise a power cut could leave the old
    /// segment's header in front of the new segment's data.
    freed_unsynced: Vec<u64>,
    /// First slot index never handed out (slots grow the file from here).
    next_slot: u64,
    /// Current length of a regular file (bounds reads and `segment_len`).
    file_len: u64,
}

/// A store in one regular file or block device. See module docs.
#[derive(Debug)]
pub struct FileMedium {
    path: PathBuf,
    file: File,
    kind: Kind,
    header: Header,
    /// How many slots fit (`u64::MAX`-ish for an unbounded regular file).
    max_slots: u64,
    state: Mutex<FileState>,
}

impl FileMedium {
    /// Formats `path` as a new store and opens it.
    ///
    /// * A regular file is created if missing; an existing one must be
    ///   empty. It grows as slots are used; `total_size`, if given, caps it.
    /// * A block device is formatted whatever it held, unless it already
    ///   holds an oubli store; its size is the device size, or `total_size`
    ///   if given (which must not exceed it).
    ///
    /// `slot_size` must be a multiple of 4096 between [`MIN_SLOT_SIZE`] and
    /// [`MAX_SLOT_SIZE`] ([`DEFAULT_SLOT_SIZE`] is a good choice).
    pub fn create(
        path: impl AsRef<Path>,
        total_size: Option<u64>,
        slot_size: u64,
    ) -> io::Result<FileMedium> {
        let path = path.as_ref();
        check_slot_size(slot_size)?;
        // A store file made here is the owner's only from the start: it is
        // also the store's lock, which another user must not hold.
        use std::os::unix::fs::OpenOptionsExt;
        let (file, created) = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                (OpenOptions::new().read(true).write(true).open(path)?, false)
            }
            Err(e) => return Err(e),
        };
        let what = path.display().to_string();
        lock_exclusive(&file, &what)?;
        let kind = file_kind(&file, &what)?;
        let existing = size_of(&file, kind)?;
        if !created {
            let mut b = [0u8; HEADER_LEN];
            let holds_store = existing >= HEADER_LEN as u64
                && file.read_exact_at(&mut b, 0).is_ok()
                && b[0..8] == MAGIC;
            if holds_store {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{what} already holds an oubli store"),
                ));
            }
            if kind == Kind::Regular && existing > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("refusing to format non-empty file {what}"),
                ));
            }
        }
        let total = match (kind, total_size) {
            (Kind::Block, Some(t)) if t > existing => {
                return Err(invalid_input(format!(
                    "size {t} exceeds the device size {existing} of {what}"
                )))
            }
            (Kind::Block, Some(t)) => t,
            (Kind::Block, None) => existing,
            (Kind::Regular, t) => t.unwrap_or(0),
        };
        if total != 0 && total < DATA_START + slot_size {
            return Err(invalid_input(format!(
                "size {total} cannot hold even one slot of {slot_size} bytes"
            )));
        }
        let header = Header {
            slot_size,
            total_size: total,
            nonce: fresh_nonce(),
        };
        // Zero the superblock slots so nothing from a previous life reads
        // back (the nonce would reject it anyway), then the header last: a
        // file with a valid header is a complete, empty store.
        let zeros = vec![0u8; (DATA_START - BLOCK) as usize];
        file.write_all_at(&zeros, BLOCK)?;
        let mut block0 = vec![0u8; BLOCK as usize];
        block0[..HEADER_LEN].copy_from_slice(&header.encode());
        file.write_all_at(&block0, 0)?;
        file.sync_all()?;
        if created {
            // Make the new file's directory entry durable.
            let parent = path
                .canonicalize()?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("/"));
            File::open(parent)?.sync_all()?;
        }
        Self::from_file(path, file, kind, header, 0)
    }

    /// Opens an existing store. Fails with `NotFound` if `path` does not
    /// exist, `InvalidData` if it holds no oubli file store (or an unknown
    /// version), `WouldBlock` if another handle has it open.
    pub fn open(path: impl AsRef<Path>) -> io::Result<FileMedium> {
        let path = path.as_ref();
        let what = path.display().to_string();
        let meta = std::fs::metadata(path)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot open store {what}: {e}")))?;
        if !(meta.is_file() || meta.file_type().is_block_device()) {
            return Err(invalid_input(format!(
                "{what} is neither a regular file nor a block device"
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot open store {what}: {e}")))?;
        let kind = file_kind(&file, &what)?;
        lock_exclusive(&file, &what)?;
        let size = size_of(&file, kind)?;
        if size < DATA_START {
            return Err(invalid_data(format!(
                "{what} is not an oubli file store (only {size} bytes)"
            )));
        }
        let mut b = [0u8; HEADER_LEN];
        file.read_exact_at(&mut b, 0)?;
        let header = Header::decode(&b, &what)?;
        if kind == Kind::Block && header.total_size > size {
            return Err(invalid_data(format!(
                "{what}: store was formatted for {} bytes but the device has {size}",
                header.total_size
            )));
        }
        // Slots that may hold a header: all that fit, or for a growing file
        // those the file reaches into.
        let scan = if kind == Kind::Regular {
            (size - DATA_START).div_ceil(header.slot_size)
        } else {
            u64::MAX
        };
        Self::from_file(path, file, kind, header, scan)
    }

    /// Builds the in-memory state, scanning the first `scan` slots (clamped
    /// to how many fit) for segment headers.
    fn from_file(
        path: &Path,
        file: File,
        kind: Kind,
        header: Header,
        scan: u64,
    ) -> io::Result<FileMedium> {
        let max_slots = if header.total_size == 0 {
            (u64::MAX - DATA_START) / header.slot_size
        } else {
            (header.total_size - DATA_START) / header.slot_size
        };
        let scan = scan.min(max_slots);
        let mut map = BTreeMap::new();
        let mut free = BTreeSet::new();
        let what = path.display();
        for slot in 0..scan {
            let mut b = [0u8; SEG_HEADER_LEN];
            let at = DATA_START + slot * header.slot_size;
            let id = match file.read_exact_at(&mut b, at) {
                Ok(()) => decode_seg_header(&header.nonce, &b),
                // A growing file may end inside the last slot's header.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
                Err(e) => return Err(e),
            };
            match id {
                Some(id) => {
                    if let Some(prev) = map.insert(
                        id,
                        SlotInfo {
                            slot,
                            len: None,
                            hinted_to: 0,
                        },
                    ) {
                        return Err(invalid_data(format!(
                            "{what}: segment {id:08x} claimed by slots {} and {slot}",
                            prev.slot
                        )));
                    }
                }
                None => {
                    free.insert(slot);
                }
            }
        }
        let file_len = size_of(&file, kind)?;
        let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        Ok(FileMedium {
            path,
            file,
            kind,
            header,
            max_slots,
            state: Mutex::new(FileState {
                map,
                free,
                freed_unsynced: Vec::new(),
                next_slot: scan,
                file_len,
            }),
        })
    }

    /// Slot size chosen at format time.
    pub fn slot_size(&self) -> u64 {
        self.header.slot_size
    }

    /// Size limit in bytes (`None` for a regular file that may grow freely).
    pub fn total_size(&self) -> Option<u64> {
        (self.header.total_size != 0).then_some(self.header.total_size)
    }

    /// Number of segment slots the medium can hold (huge when unbounded).
    pub fn slot_count(&self) -> u64 {
        self.max_slots
    }

    fn lock(&self) -> MutexGuard<'_, FileState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot_start(&self, slot: u64) -> u64 {
        DATA_START + slot * self.header.slot_size
    }

    fn data_start(&self, slot: u64) -> u64 {
        self.slot_start(slot) + SEG_HEADER_REGION
    }

    /// Upper bound on the length of a segment whose exact length is unknown.
    fn len_bound(&self, st: &FileState, info: SlotInfo) -> u64 {
        if let Some(len) = info.len {
            return len;
        }
        let cap = self.segment_capacity();
        match self.kind {
            Kind::Block => cap,
            Kind::Regular => cap.min(st.file_len.saturating_sub(self.data_start(info.slot))),
        }
    }

    /// Writes at an absolute position, keeping `file_len` current.
    fn write_at(&self, st: &mut FileState, data: &[u8], pos: u64) -> io::Result<()> {
        let r = self.file.write_all_at(data, pos);
        // Even a failed write may have extended the file.
        let end = pos + data.len() as u64;
        if r.is_ok() {
            st.file_len = st.file_len.max(end);
        } else if self.kind == Kind::Regular {
            st.file_len = self.file.metadata().map(|m| m.len()).unwrap_or(st.file_len);
        }
        r
    }

    /// Finds a slot for a new segment and writes its header.
    fn allocate(&self, st: &mut FileState, id: SegmentId) -> io::Result<u64> {
        let slot = match st.free.pop_first() {
            Some(s) => s,
            None if st.next_slot < self.max_slots => {
                st.next_slot += 1;
                st.next_slot - 1
            }
            None => {
                return Err(storage_full(format!(
                    "{}: all {} segment slots are in use",
                    self.describe(),
                    self.max_slots
                )))
            }
        };
        let hdr = encode_seg_header(&self.header.nonce, id);
        if let Err(e) = self.write_at(st, &hdr, self.slot_start(slot)) {
            st.free.insert(slot);
            return Err(e);
        }
        Ok(slot)
    }
}

fn file_kind(file: &File, what: &str) -> io::Result<Kind> {
    let ft = file.metadata()?.file_type();
    if ft.is_file() {
        Ok(Kind::Regular)
    } else if ft.is_block_device() {
        Ok(Kind::Block)
    } else {
        Err(invalid_input(format!(
            "{what} is neither a regular file nor a block device"
        )))
    }
}

/// Size in bytes; for a block device `metadata().len()` is 0, so seek to the end.
fn size_of(file: &File, kind: Kind) -> io::Result<u64> {
    match kind {
        Kind::Regular => Ok(file.metadata()?.len()),
        Kind::Block => {
            let mut f = file;
            f.seek(SeekFrom::End(0))
        }
    }
}

impl Medium for FileMedium {
    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }

    /// Slot size minus the 4 KiB slot header (and never above 4 GiB - 1).
    fn segment_capacity(&self) -> u64 {
        (self.header.slot_size - SEG_HEADER_REGION).min(u64::from(u32::MAX))
    }

    /// For a segment whose length is unknown (written before this `open`),
    /// the offset cannot be checked and is trusted.
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        check_append_bounds(self.segment_capacity(), offset, data.len())?;
        let mut st = self.lock();
        let slot = match st.map.get(&id).copied() {
            Some(info) => {
                if let Some(len) = info.len {
                    if len != offset {
                        return Err(invalid_input(format!(
                            "append to segment {id:08x} at {offset}, but its length is {len}"
                        )));
                    }
                }
                info.slot
            }
            None if offset != 0 => {
                return Err(not_found(format!(
                    "append at {offset} to missing segment {id:08x}"
                )))
            }
            None => {
                let slot = self.allocate(&mut st, id)?;
                st.map.insert(
                    id,
                    SlotInfo {
                        slot,
                        len: Some(0),
                        hinted_to: 0,
                    },
                );
                slot
            }
        };
        let r = self.write_at(&mut st, data, self.data_start(slot) + offset);
        let info = st.map.get_mut(&id).expect("segment is mapped");
        let end = offset + data.len() as u64;
        info.len = match &r {
            Ok(()) => Some(end),
            // Out of room (a sparse image file on a full file system): the
            // segment still ends at `offset`, as the `Medium` contract
            // promises. A prefix that landed stays in the slot, never
            // shown: the next append writes over it, and it is sealed
            // under a key nothing kept.
            Err(e) if e.kind() == io::ErrorKind::StorageFull => Some(offset),
            // Some prefix may have landed: the length is now unknown.
            Err(_) => None,
        };
        r?;
        let hint = writeback_due(&mut info.hinted_to, end);
        // As in `DirMedium`: the hint may wait for the device's queue, so
        // not under the lock that every append and read takes.
        drop(st);
        if let Some((from, len)) = hint {
            start_writeback(&self.file, self.data_start(slot) + from, len);
        }
        Ok(())
    }

    fn can_rewrite(&self) -> bool {
        true
    }

    /// Whole free slots (counting a slot freed but not yet synced as
    /// taken, and the open segments' tails as nothing: on the safe side).
    /// A regular file without a size limit grows into its file system:
    /// that file system's free space, as `DirMedium` reports it.
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let cap = self.segment_capacity();
        if self.header.total_size == 0 && self.kind == Kind::Regular {
            let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
            // SAFETY: FFI on an open descriptor with a writable statvfs.
            if unsafe { libc::fstatvfs(self.file.as_raw_fd(), s.as_mut_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: fstatvfs succeeded and filled it.
            let s = unsafe { s.assume_init() };
            let unit = s.f_frsize;
            let st = self.lock();
            return Ok(Some(oubli_core::Space {
                total: s.f_blocks * unit,
                free: (s.f_bavail * unit).saturating_add(st.free.len() as u64 * cap),
            }));
        }
        let st = self.lock();
        let slots = st.free.len() as u64 + self.max_slots.saturating_sub(st.next_slot);
        Ok(Some(oubli_core::Space {
            total: self.max_slots.saturating_mul(cap),
            free: slots.saturating_mul(cap),
        }))
    }

    /// Only inside what was appended since this `open` (a segment whose
    /// length is known); no writeback hint, as in `DirMedium`.
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        let info = st.map.get(&id).copied();
        let Some(SlotInfo {
            slot,
            len: Some(len),
            ..
        }) = info
        else {
            return Err(invalid_input(format!(
                "rewrite in segment {id:08x}, which this handle did not append to"
            )));
        };
        check_rewrite_bounds(id, len, offset, data.len())?;
        self.write_at(&mut st, data, self.data_start(slot) + offset)
    }

    /// May return stale bytes past the true end of a segment written before
    /// this `open` (see module docs).
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (slot, bound) = {
            let st = self.lock();
            let info = *st
                .map
                .get(&id)
                .ok_or_else(|| not_found(format!("segment {id:08x} does not exist")))?;
            (info.slot, self.len_bound(&st, info))
        };
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| invalid_input("read: offset overflow"))?;
        if end > bound {
            return Err(eof(format!(
                "read of {offset}..{end} past the end ({bound}) of segment {id:08x}"
            )));
        }
        self.file.read_exact_at(buf, self.data_start(slot) + offset)
    }

    /// Exact for segments written since `open`, an upper bound otherwise.
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        let st = self.lock();
        Ok(st.map.get(&id).map(|&info| self.len_bound(&st, info)))
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        Ok(self.lock().map.keys().copied().collect())
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        let mut st = self.lock();
        let Some(info) = st.map.remove(&id) else {
            return Ok(());
        };
        if let Err(e) = self.write_at(&mut st, &[0u8; SEG_HEADER_LEN], self.slot_start(info.slot)) {
            st.map.insert(id, info);
            return Err(e);
        }
        st.freed_unsynced.push(info.slot);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // Slots freed before this point are reusable once the flush below
        // has made their deletion durable; the flush runs without the lock
        // so that appends from other threads go on meanwhile (what they
        // write is the next sync's business).
        let freed = std::mem::take(&mut self.lock().freed_unsynced);
        // fdatasync: data plus the size of a growing file; on a block device
        // it also flushes the device's write cache.
        if let Err(e) = self.file.sync_data() {
            self.lock().freed_unsynced.extend(freed);
            return Err(crate::util::sync_failed(e));
        }
        self.lock().free.extend(freed);
        Ok(())
    }

    /// `None` for a slot never written, or one whose header is torn.
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        let mut region = vec![0u8; SB_HEADER_LEN + SUPERBLOCK_MAX];
        self.file
            .read_exact_at(&mut region, SB_OFFSETS[slot.index()])?;
        if region[0..8] != SB_MAGIC || region[8..24] != self.header.nonce {
            return Ok(None);
        }
        let len = u32::from_le_bytes(region[24..28].try_into().unwrap()) as usize;
        if len > SUPERBLOCK_MAX {
            return Ok(None);
        }
        region.truncate(SB_HEADER_LEN + len);
        region.drain(..SB_HEADER_LEN);
        Ok(Some(region))
    }

    /// One in-place write of header and data: a power cut may tear this
    /// slot, never the other one (they are separate blocks).
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        check_superblock_len(data.len())?;
        let mut region = Vec::with_capacity(SB_HEADER_LEN + data.len());
        region.extend_from_slice(&SB_MAGIC);
        region.extend_from_slice(&self.header.nonce);
        region.extend_from_slice(&(data.len() as u32).to_le_bytes());
        region.extend_from_slice(&[0u8; 4]);
        region.extend_from_slice(data);
        debug_assert!(region.len() as u64 <= SB_REGION);
        self.file.write_all_at(&region, SB_OFFSETS[slot.index()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn tmp() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("store.img");
        (d, p)
    }

    fn read_n(m: &impl Medium, id: SegmentId, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        m.read(id, 0, &mut buf).unwrap();
        buf
    }

    /// Issue 40 item 3: a store file `create` makes is its owner's only
    /// (it is also the store's lock), whatever the umask lets through.
    #[test]
    fn a_new_store_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, p) = tmp();
        let _m = FileMedium::create(&p, None, MIB).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn header_round_trip_and_checks() {
        let h = Header {
            slot_size: MIB,
            total_size: 0,
            nonce: [7; 16],
        };
        let b = h.encode();
        assert_eq!(Header::decode(&b, "x").unwrap(), h);
        let mut bad = b;
        bad[20] ^= 1;
        assert!(Header::decode(&bad, "x")
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        let mut v2 = b;
        v2[8] = 2;
        assert!(Header::decode(&v2, "x")
            .unwrap_err()
            .to_string()
            .contains("version"));
        assert!(check_slot_size(MIB - BLOCK).is_err());
        assert!(check_slot_size(MIB + 1).is_err());
        assert!(check_slot_size(MAX_SLOT_SIZE).is_ok());
        let s = encode_seg_header(&[1; 16], 42);
        assert_eq!(decode_seg_header(&[1; 16], &s), Some(42));
        assert_eq!(decode_seg_header(&[2; 16], &s), None, "foreign nonce");
        assert_eq!(decode_seg_header(&[1; 16], &[0; SEG_HEADER_LEN]), None);
    }

    #[test]
    fn round_trip_and_reopen() {
        let (_d, p) = tmp();
        {
            let m = FileMedium::create(&p, None, MIB).unwrap();
            assert_eq!(m.segment_capacity(), MIB - BLOCK);
            assert!(m.describe().starts_with("file:/"));
            m.append(5, 0, b"hello ").unwrap();
            m.append(5, 6, b"world").unwrap();
            m.append(9, 0, b"nine").unwrap();
            assert_eq!(m.segment_len(5).unwrap(), Some(11));
            assert_eq!(read_n(&m, 5, 11), b"hello world");
            m.write_superblock(Slot::A, b"sb-a").unwrap();
            m.sync().unwrap();
            assert_eq!(
                FileMedium::open(&p).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
        }
        let m = FileMedium::open(&p).unwrap();
        assert_eq!(m.list_segments().unwrap(), vec![5, 9]);
        assert_eq!(read_n(&m, 5, 11), b"hello world");
        assert_eq!(read_n(&m, 9, 4), b"nine");
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"sb-a");
        assert_eq!(m.read_superblock(Slot::B).unwrap(), None);
        // After reopen the length is only an upper bound.
        let len9 = m.segment_len(9).unwrap().unwrap();
        assert!(len9 >= 4 && len9 <= m.segment_capacity());
        // Appending to an old segment trusts the offset, then tracks it.
        m.append(9, 4, b"+").unwrap();
        assert_eq!(m.segment_len(9).unwrap(), Some(5));
        assert_eq!(read_n(&m, 9, 5), b"nine+");
    }

    #[test]
    fn rewrites_inside_what_was_appended() {
        let (_d, p) = tmp();
        let m = FileMedium::create(&p, None, MIB).unwrap();
        assert!(m.can_rewrite());
        m.append(1, 0, b"abcdef").unwrap();
        m.rewrite(1, 1, b"XYZ").unwrap();
        let mut buf = [0u8; 6];
        m.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"aXYZef");
        assert_eq!(m.segment_len(1).unwrap(), Some(6));
        assert_eq!(
            m.rewrite(1, 4, b"XYZ").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            m.rewrite(2, 0, b"X").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn append_only_and_read_errors() {
        let (_d, p) = tmp();
        let m = FileMedium::create(&p, None, MIB).unwrap();
        m.append(1, 0, b"abc").unwrap();
        assert_eq!(
            m.append(1, 1, b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            m.append(2, 1, b"x").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            m.append(1, 3, &vec![0; MIB as usize]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let mut buf = [0u8; 4];
        assert_eq!(
            m.read(1, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            m.read(7, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        // Filling a segment to capacity works.
        let cap = m.segment_capacity() as usize;
        m.append(3, 0, &vec![3u8; cap]).unwrap();
        assert_eq!(m.segment_len(3).unwrap(), Some(cap as u64));
    }

    #[test]
    fn superblocks_independent() {
        let (_d, p) = tmp();
        let m = FileMedium::create(&p, None, MIB).unwrap();
        m.write_superblock(Slot::A, &[0xaa; 4096]).unwrap();
        m.write_superblock(Slot::B, b"b").unwrap();
        m.write_superblock(Slot::A, b"short").unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"short");
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"b");
        m.write_superblock(Slot::B, &[0xbb; 4096]).unwrap();
        assert_eq!(
            m.read_superblock(Slot::B).unwrap().unwrap(),
            vec![0xbb; 4096]
        );
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"short");
        assert!(m.write_superblock(Slot::A, &[0; 4097]).is_err());
        m.write_superblock(Slot::A, b"").unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"");
    }

    #[test]
    fn slot_reuse_only_after_sync_and_storage_full() {
        let (_d, p) = tmp();
        // Room for exactly 3 slots.
        let total = DATA_START + 3 * MIB;
        let m = FileMedium::create(&p, Some(total), MIB).unwrap();
        assert_eq!(m.slot_count(), 3);
        assert_eq!(m.total_size(), Some(total));
        let cap = m.segment_capacity();
        // `space` counts whole free slots, a slot freed as taken until the sync.
        let free = |m: &FileMedium| m.space().unwrap().unwrap().free;
        assert_eq!(m.space().unwrap().unwrap().total, 3 * cap);
        assert_eq!(free(&m), 3 * cap);
        for id in 1..=3 {
            m.append(id, 0, &[id as u8; 100]).unwrap();
        }
        assert_eq!(free(&m), 0);
        let full = m.append(4, 0, b"x").unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::StorageFull, "{full}");
        m.delete_segment(2).unwrap();
        m.delete_segment(2).unwrap();
        // The freed slot waits for a sync.
        assert_eq!(
            m.append(4, 0, b"x").unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        assert_eq!(free(&m), 0);
        m.sync().unwrap();
        assert_eq!(free(&m), cap);
        m.append(4, 0, b"four").unwrap();
        assert_eq!(m.lock().map[&4].slot, 1, "reuses the freed slot");
        assert_eq!(m.list_segments().unwrap(), vec![1, 3, 4]);
        // Stale bytes from segment 2 lie past segment 4's end in the slot.
        m.sync().unwrap();
        drop(m);

        let m = FileMedium::open(&p).unwrap();
        assert_eq!(m.list_segments().unwrap(), vec![1, 3, 4]);
        assert_eq!(read_n(&m, 4, 4), b"four");
        let mut stale = [0u8; 4];
        m.read(4, 4, &mut stale).unwrap();
        assert_eq!(stale, [2u8; 4], "documented: stale bytes past the end");
        assert_eq!(read_n(&m, 3, 100), vec![3u8; 100]);
        assert_eq!(
            m.append(5, 0, b"x").unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
    }

    #[test]
    fn growing_file_grows_by_slots() {
        let (_d, p) = tmp();
        let m = FileMedium::create(&p, None, MIB).unwrap();
        assert_eq!(m.total_size(), None);
        let len0 = std::fs::metadata(&p).unwrap().len();
        assert!(len0 <= DATA_START);
        m.append(1, 0, b"a").unwrap();
        m.append(2, 0, b"b").unwrap();
        let len = std::fs::metadata(&p).unwrap().len();
        assert_eq!(len, DATA_START + MIB + BLOCK + 1);
        // Reads bounded by the file end for the last, reopened segment.
        m.sync().unwrap();
        drop(m);
        let m = FileMedium::open(&p).unwrap();
        assert_eq!(m.segment_len(2).unwrap(), Some(1));
        assert!(m.segment_len(1).unwrap().unwrap() >= 1);
        // A deleted slot is free after reopen too.
        m.delete_segment(1).unwrap();
        m.sync().unwrap();
        drop(m);
        let m = FileMedium::open(&p).unwrap();
        m.append(3, 0, b"c").unwrap();
        assert_eq!(m.lock().map[&3].slot, 0);
        assert_eq!(m.list_segments().unwrap(), vec![2, 3]);
    }

    #[test]
    fn create_and_open_refuse_wrong_things() {
        let (d, p) = tmp();
        drop(FileMedium::create(&p, None, MIB).unwrap());
        assert_eq!(
            FileMedium::create(&p, None, MIB).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let other = d.path().join("text");
        std::fs::write(&other, b"not a store at all, but long enough? no").unwrap();
        assert_eq!(
            FileMedium::create(&other, None, MIB).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(
            FileMedium::open(&other).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let big = d.path().join("big");
        std::fs::write(&big, vec![0u8; 2 * DATA_START as usize]).unwrap();
        let e = FileMedium::open(&big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not an oubli file store"), "{e}");
        assert_eq!(
            FileMedium::open(d.path().join("missing"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            FileMedium::create(d.path().join("x"), None, 1000)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            FileMedium::create(d.path().join("y"), Some(DATA_START), MIB)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        // An empty existing file can be formatted.
        let empty = d.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        FileMedium::create(&empty, None, MIB).unwrap();
    }

    #[test]
    fn stale_headers_from_an_old_format_are_ignored() {
        let (_d, p) = tmp();
        let m = FileMedium::create(&p, None, MIB).unwrap();
        m.append(1, 0, b"old").unwrap();
        m.write_superblock(Slot::A, b"old-sb").unwrap();
        m.sync().unwrap();
        drop(m);
        // Reformat the same bytes (as re-creating a store on a block device
        // would), then put the old superblock and slot bytes back: only the
        // nonce tells them apart from live ones.
        let img = std::fs::read(&p).unwrap();
        std::fs::write(&p, b"").unwrap();
        drop(FileMedium::create(&p, None, MIB).unwrap());
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&img[BLOCK as usize..], BLOCK).unwrap();
        drop(f);
        let m = FileMedium::open(&p).unwrap();
        assert!(m.list_segments().unwrap().is_empty());
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None);
        m.append(1, 0, b"new").unwrap();
        assert_eq!(read_n(&m, 1, 3), b"new");
    }

    #[test]
    fn not_a_file() {
        let (d, _p) = tmp();
        assert_eq!(
            FileMedium::open(d.path()).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
