//! jbd2 on-disk blocks: the journal superblock, descriptor blocks (v2/v3 tags, csum v2/v3 tag sizes, 64-bit block numbers, escape flag), commit and revoke blocks, and their CRC32C checksums.

use crate::bytes::{be16, be32, crc32c_raw, u8_at};

pub const JBD2_MAGIC: u32 = 0xC03B_3998;
pub const BT_DESCRIPTOR: u32 = 1;
pub const BT_COMMIT: u32 = 2;
pub const BT_SB_V1: u32 = 3;
pub const BT_SB_V2: u32 = 4;
pub const BT_REVOKE: u32 = 5;

pub const JINCOMPAT_REVOKE: u32 = 0x1;
pub const JINCOMPAT_64BIT: u32 = 0x2;
pub const JINCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const JINCOMPAT_CSUM_V2: u32 = 0x8;
pub const JINCOMPAT_CSUM_V3: u32 = 0x10;
pub const JINCOMPAT_FAST_COMMIT: u32 = 0x20;
pub const JINCOMPAT_KNOWN: u32 = JINCOMPAT_REVOKE
    | JINCOMPAT_64BIT
    | JINCOMPAT_ASYNC_COMMIT
    | JINCOMPAT_CSUM_V2
    | JINCOMPAT_CSUM_V3
    | JINCOMPAT_FAST_COMMIT;

pub const TAG_ESCAPE: u32 = 0x1;
pub const TAG_SAME_UUID: u32 = 0x2;
pub const TAG_LAST: u32 = 0x8;

/// A block's jbd2 header: (block type, sequence), if it carries the magic.
pub fn header(block: &[u8]) -> Option<(u32, u32)> {
    if be32(block, 0)? != JBD2_MAGIC {
        return None;
    }
    Some((be32(block, 4)?, be32(block, 8)?))
}

/// The journal superblock fields the tracker uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalSb {
    pub block_size: u32,
    pub maxlen: u64,
    pub first: u64,
    pub sequence: u32,
    /// 0: the log is empty (clean).
    pub start: u64,
    pub incompat: u32,
    /// The seed of every v2/v3 checksum: crc32c(~0, uuid).
    pub csum_seed: u32,
}

impl JournalSb {
    pub fn parse(b: &[u8]) -> Result<JournalSb, String> {
        let (ty, _) = header(b).ok_or("no jbd2 magic in the journal superblock")?;
        if ty != BT_SB_V1 && ty != BT_SB_V2 {
            return Err(format!("journal superblock of type {ty}"));
        }
        let f = |o| be32(b, o).ok_or_else(|| "short journal superblock".to_string());
        let block_size = f(0xC)?;
        let maxlen = f(0x10)? as u64;
        let first = f(0x14)? as u64;
        let incompat = if ty == BT_SB_V2 { f(0x28)? } else { 0 };
        if first == 0 || first >= maxlen {
            return Err(format!("journal log from {first} to {maxlen}"));
        }
        let uuid = b.get(0x30..0x40).ok_or("short journal superblock")?;
        Ok(JournalSb {
            block_size,
            maxlen,
            first,
            sequence: f(0x18)?,
            start: f(0x1C)? as u64,
            incompat,
            csum_seed: crc32c_raw(!0, uuid),
        })
    }

    pub fn csum(&self) -> bool {
        self.incompat & (JINCOMPAT_CSUM_V2 | JINCOMPAT_CSUM_V3) != 0
    }
    pub fn csum_v3(&self) -> bool {
        self.incompat & JINCOMPAT_CSUM_V3 != 0
    }
    pub fn is64(&self) -> bool {
        self.incompat & JINCOMPAT_64BIT != 0
    }
    /// Bytes of one descriptor tag (without the optional 16-byte UUID).
    pub fn tag_bytes(&self) -> usize {
        if self.csum_v3() {
            return 16;
        }
        let mut sz = 12;
        if self.incompat & JINCOMPAT_CSUM_V2 != 0 {
            sz += 2;
        }
        if self.is64() {
            sz
        } else {
            sz - 4
        }
    }
    /// The log position after `p` (the log wraps from `maxlen` to `first`).
    pub fn next(&self, p: u64) -> u64 {
        if p + 1 >= self.maxlen {
            self.first
        } else {
            p + 1
        }
    }

    /// The descriptor or revoke block's tail checksum holds (or there is none).
    pub fn tail_ok(&self, block: &[u8]) -> bool {
        if !self.csum() {
            return true;
        }
        let n = block.len();
        let Some(want) = n.checked_sub(4).and_then(|o| be32(block, o)) else {
            return false;
        };
        let crc = crc32c_raw(self.csum_seed, &block[..n - 4]);
        crc32c_raw(crc, &[0; 4]) == want
    }

    /// The commit block's checksum holds (or there is none).
    pub fn commit_ok(&self, block: &[u8]) -> bool {
        if !self.csum() {
            return true;
        }
        let Some(want) = be32(block, 0x10) else {
            return false;
        };
        let mut copy = block.to_vec();
        for b in &mut copy[0xC..0x14] {
            *b = 0;
        }
        crc32c_raw(self.csum_seed, &copy) == want
    }

    /// A journalled copy matches its tag's checksum (or there is none).
    pub fn tag_ok(&self, tag: &Tag, seq: u32, copy: &[u8]) -> bool {
        if !self.csum() {
            return true;
        }
        let crc = crc32c_raw(crc32c_raw(self.csum_seed, &seq.to_be_bytes()), copy);
        if self.csum_v3() {
            crc == tag.checksum
        } else {
            (crc & 0xffff) == tag.checksum
        }
    }
}

/// One descriptor tag: the home block of the copy that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    pub home: u64,
    pub flags: u32,
    pub checksum: u32,
}

/// The tags of a descriptor block. `None`: malformed (no room, bad tail).
pub fn descriptor_tags(jsb: &JournalSb, block: &[u8]) -> Option<Vec<Tag>> {
    if !jsb.tail_ok(block) {
        return None;
    }
    let end = block.len().checked_sub(if jsb.csum() { 4 } else { 0 })?;
    let tb = jsb.tag_bytes();
    let mut off = 12usize;
    let mut tags = Vec::new();
    while off.checked_add(tb)? <= end {
        let lo = be32(block, off)? as u64;
        let (flags, hi, checksum) = if jsb.csum_v3() {
            (
                be32(block, off + 4)?,
                be32(block, off + 8)?,
                be32(block, off + 12)?,
            )
        } else {
            let hi = if jsb.is64() { be32(block, off + 8)? } else { 0 };
            let sum = if jsb.incompat & JINCOMPAT_CSUM_V2 != 0 {
                be16(block, off + 4)? as u32
            } else {
                0
            };
            (be16(block, off + 6)? as u32, hi, sum)
        };
        let home = lo | if jsb.is64() { (hi as u64) << 32 } else { 0 };
        tags.push(Tag {
            home,
            flags,
            checksum,
        });
        off += tb;
        if flags & TAG_SAME_UUID == 0 {
            off = off.checked_add(16)?;
        }
        if flags & TAG_LAST != 0 {
            return Some(tags);
        }
    }
    // jbd2 always marks the last tag; a block that ends without one is not ours.
    None
}

/// The home blocks a revoke block revokes. `None`: malformed.
pub fn revoke_records(jsb: &JournalSb, block: &[u8]) -> Option<Vec<u64>> {
    if !jsb.tail_ok(block) {
        return None;
    }
    let count = be32(block, 12)? as usize;
    let limit = block.len().checked_sub(if jsb.csum() { 4 } else { 0 })?;
    if count < 16 || count > limit {
        return None;
    }
    let rs = if jsb.is64() { 8 } else { 4 };
    let mut out = Vec::new();
    let mut off = 16;
    while off + rs <= count {
        let v = if rs == 8 {
            ((be32(block, off)? as u64) << 32) | be32(block, off + 4)? as u64
        } else {
            be32(block, off)? as u64
        };
        out.push(v);
        off += rs;
    }
    Some(out)
}

/// The copy as it was before jbd2 escaped it (a block starting with the
/// magic is journalled with its first four bytes zeroed).
pub fn unescape(copy: &[u8], tag: &Tag) -> Vec<u8> {
    let mut v = copy.to_vec();
    if tag.flags & TAG_ESCAPE != 0 && v.len() >= 4 {
        v[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    }
    v
}

/// Whether `b` is a commit block (by its header; its checksum is checked apart).
pub fn is_commit(b: &[u8]) -> Option<u32> {
    match header(b) {
        Some((BT_COMMIT, seq)) => Some(seq),
        _ => None,
    }
}

/// Byte 0xC of a commit block: the checksum type (used only for logging).
pub fn commit_checksum_type(b: &[u8]) -> Option<u8> {
    u8_at(b, 0xC)
}
