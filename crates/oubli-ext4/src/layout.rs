//! The ext4 layout the tracker needs: superblock, group descriptors (32/64-byte, 64bit, flex_bg, meta_bg, BLOCK_UNINIT), the journal inode's block map, and the refusal rules.

use crate::bytes::{le16, le32, u8_at};
use std::fmt;

/// Where the ext4 superblock sits on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
pub const SUPERBLOCK_LEN: usize = 1024;
const EXT4_MAGIC: u16 = 0xEF53;

pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
pub const COMPAT_FAST_COMMIT: u32 = 0x400;

pub const INCOMPAT_COMPRESSION: u32 = 0x1;
pub const INCOMPAT_FILETYPE: u32 = 0x2;
pub const INCOMPAT_RECOVER: u32 = 0x4;
pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub const INCOMPAT_META_BG: u32 = 0x10;
pub const INCOMPAT_EXTENTS: u32 = 0x40;
pub const INCOMPAT_64BIT: u32 = 0x80;
pub const INCOMPAT_MMP: u32 = 0x100;
pub const INCOMPAT_FLEX_BG: u32 = 0x200;
pub const INCOMPAT_EA_INODE: u32 = 0x400;
pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
pub const INCOMPAT_CASEFOLD: u32 = 0x20000;
/// Incompat features whose on-disk block bitmaps mean what the tracker
/// assumes (one bit per block, set = in use). Anything else is refused.
pub const INCOMPAT_KNOWN: u32 = INCOMPAT_FILETYPE
    | INCOMPAT_RECOVER
    | INCOMPAT_META_BG
    | INCOMPAT_EXTENTS
    | INCOMPAT_64BIT
    | INCOMPAT_MMP
    | INCOMPAT_FLEX_BG
    | INCOMPAT_EA_INODE
    | INCOMPAT_CSUM_SEED
    | INCOMPAT_LARGEDIR
    | INCOMPAT_INLINE_DATA
    | INCOMPAT_ENCRYPT
    | INCOMPAT_CASEFOLD;

pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
pub const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x80;
pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
pub const RO_COMPAT_SHARED_BLOCKS: u32 = 0x4000;

const BG_BLOCK_UNINIT: u16 = 0x2;
const EXTENTS_FL: u32 = 0x80000;

/// Why a file system cannot be followed (or read for an audit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    NoJournal,
    ExternalJournal,
    FastCommit,
    Bigalloc,
    /// Incompat (or ro_compat) feature bits the tracker does not know.
    UnknownFeature {
        incompat: u32,
        ro_compat: u32,
    },
    /// The superblock or a structure it points to makes no sense.
    Corrupt(String),
    /// The journal holds committed transactions not yet replayed: the
    /// bitmaps on the device are not the file system's state.
    NeedsRecovery,
    /// The device could not be read.
    Io(String),
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::NoJournal => write!(
                f,
                "ext4 without a journal (has_journal off): no commits to follow"
            ),
            Unsupported::ExternalJournal => write!(
                f,
                "ext4 with an external journal: its commits are not written to this device"
            ),
            Unsupported::FastCommit => write!(
                f,
                "ext4 with fast_commit: fast-commit blocks are not parsed"
            ),
            Unsupported::Bigalloc => {
                write!(f, "ext4 with bigalloc: bitmaps count clusters, not blocks")
            }
            Unsupported::UnknownFeature {
                incompat,
                ro_compat,
            } => write!(
                f,
                "ext4 with unknown feature flags (incompat {incompat:#x}, ro_compat {ro_compat:#x})"
            ),
            Unsupported::Corrupt(why) => write!(f, "not a usable ext4 superblock: {why}"),
            Unsupported::NeedsRecovery => write!(
                f,
                "the ext4 journal needs recovery: mount the file system once (or run e2fsck) first"
            ),
            Unsupported::Io(why) => write!(f, "cannot read the device: {why}"),
        }
    }
}

impl std::error::Error for Unsupported {}

/// Reads `buf.len()` bytes at a device byte offset.
pub type Reader<'a> = dyn FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a;

fn corrupt(why: impl Into<String>) -> Unsupported {
    Unsupported::Corrupt(why.into())
}

/// The superblock fields the tracker uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub block_size: u64,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u64,
    pub inodes_per_group: u64,
    pub inode_size: u64,
    pub desc_size: u64,
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
    pub first_meta_bg: u64,
    pub journal_inum: u32,
    pub journal_dev: u32,
    pub journal_uuid_set: bool,
    pub reserved_gdt_blocks: u64,
    pub backup_bgs: [u32; 2],
    /// The superblock bytes that describe the layout; a written superblock
    /// whose fingerprint differs makes the tracker learn the layout again.
    pub fingerprint: Vec<u8>,
}

impl Superblock {
    /// Parses the 1024 superblock bytes. `Ok(None)`: no ext4 magic.
    pub fn parse(sb: &[u8]) -> Result<Option<Superblock>, Unsupported> {
        if le16(sb, 0x38) != Some(EXT4_MAGIC) {
            return Ok(None);
        }
        let f = |o| le32(sb, o).ok_or_else(|| corrupt("short superblock"));
        let log_bs = f(0x18)?;
        if log_bs > 6 {
            return Err(corrupt(format!("block size 2^(10+{log_bs})")));
        }
        let block_size = 1024u64 << log_bs;
        let compat = f(0x5C)?;
        let incompat = f(0x60)?;
        let ro_compat = f(0x64)?;
        let lo = f(0x4)? as u64;
        let hi = if incompat & INCOMPAT_64BIT != 0 {
            f(0x150)? as u64
        } else {
            0
        };
        let blocks_count = lo | (hi << 32);
        let first_data_block = f(0x14)? as u64;
        let blocks_per_group = f(0x20)? as u64;
        let inodes_per_group = f(0x28)? as u64;
        let rev = f(0x4C)?;
        let inode_size = if rev == 0 {
            128
        } else {
            le16(sb, 0x58).unwrap_or(0) as u64
        };
        let desc_size = if incompat & INCOMPAT_64BIT != 0 {
            le16(sb, 0xFE).unwrap_or(0) as u64
        } else {
            32
        };
        let journal_uuid_set = sb
            .get(0xD0..0xE0)
            .is_some_and(|u| u.iter().any(|&b| b != 0));
        let s = Superblock {
            block_size,
            blocks_count,
            first_data_block,
            blocks_per_group,
            inodes_per_group,
            inode_size,
            desc_size,
            compat,
            incompat,
            ro_compat,
            first_meta_bg: f(0x104)? as u64,
            journal_inum: f(0xE0)?,
            journal_dev: f(0xE4)?,
            journal_uuid_set,
            reserved_gdt_blocks: le16(sb, 0xCE).unwrap_or(0) as u64,
            backup_bgs: [f(0x24C)?, f(0x250)?],
            fingerprint: fingerprint(sb),
        };
        if s.ro_compat & RO_COMPAT_BIGALLOC != 0 {
            return Err(Unsupported::Bigalloc);
        }
        s.sanity()?;
        Ok(Some(s))
    }

    fn sanity(&self) -> Result<(), Unsupported> {
        if self.blocks_per_group == 0 || self.blocks_per_group > 8 * self.block_size {
            return Err(corrupt(format!(
                "{} blocks per group",
                self.blocks_per_group
            )));
        }
        if self.blocks_count <= self.first_data_block || self.blocks_count > (1 << 48) {
            return Err(corrupt(format!("{} blocks", self.blocks_count)));
        }
        if self.first_data_block > 1 {
            return Err(corrupt(format!(
                "first data block {}",
                self.first_data_block
            )));
        }
        if self.desc_size < 32
            || self.desc_size > self.block_size
            || !self.desc_size.is_power_of_two()
        {
            return Err(corrupt(format!("group descriptor size {}", self.desc_size)));
        }
        if self.inode_size < 128
            || self.inode_size > self.block_size
            || !self.inode_size.is_power_of_two()
        {
            return Err(corrupt(format!("inode size {}", self.inode_size)));
        }
        if self.inodes_per_group == 0 || self.inodes_per_group > 8 * self.block_size {
            return Err(corrupt(format!(
                "{} inodes per group",
                self.inodes_per_group
            )));
        }
        Ok(())
    }

    /// A file system larger than its device is corrupt (and would make the
    /// tracker allocate for blocks that do not exist).
    pub fn check_fits(&self, device_size: u64) -> Result<(), Unsupported> {
        match self.blocks_count.checked_mul(self.block_size) {
            Some(n) if n <= device_size => Ok(()),
            _ => Err(corrupt(format!(
                "{} blocks of {} bytes on a device of {device_size} bytes",
                self.blocks_count, self.block_size
            ))),
        }
    }

    /// The refusal rules for following a file system's journal.
    pub fn check_followable(&self) -> Result<(), Unsupported> {
        self.check_readable()?;
        if self.compat & COMPAT_HAS_JOURNAL == 0 {
            return Err(Unsupported::NoJournal);
        }
        if self.journal_inum == 0 || self.journal_dev != 0 || self.journal_uuid_set {
            return Err(Unsupported::ExternalJournal);
        }
        if self.compat & COMPAT_FAST_COMMIT != 0 {
            return Err(Unsupported::FastCommit);
        }
        Ok(())
    }

    /// The refusal rules for reading its bitmaps (audit).
    pub fn check_readable(&self) -> Result<(), Unsupported> {
        if self.ro_compat & RO_COMPAT_BIGALLOC != 0 {
            return Err(Unsupported::Bigalloc);
        }
        let unknown_incompat = self.incompat & !INCOMPAT_KNOWN;
        let unknown_ro = self.ro_compat & (RO_COMPAT_HAS_SNAPSHOT | RO_COMPAT_SHARED_BLOCKS);
        if unknown_incompat != 0 || unknown_ro != 0 {
            return Err(Unsupported::UnknownFeature {
                incompat: unknown_incompat,
                ro_compat: unknown_ro,
            });
        }
        Ok(())
    }

    pub fn groups(&self) -> u64 {
        (self.blocks_count - self.first_data_block).div_ceil(self.blocks_per_group)
    }
    pub fn group_first_block(&self, g: u64) -> u64 {
        self.first_data_block + g * self.blocks_per_group
    }
    /// Blocks of group `g` that exist (the last group may be short).
    pub fn group_len(&self, g: u64) -> u64 {
        let first = self.group_first_block(g);
        self.blocks_per_group
            .min(self.blocks_count.saturating_sub(first))
    }
    fn descs_per_block(&self) -> u64 {
        self.block_size / self.desc_size
    }
    pub fn has_super(&self, g: u64) -> bool {
        if g == 0 {
            return true;
        }
        if self.compat & COMPAT_SPARSE_SUPER2 != 0 {
            return g == self.backup_bgs[0] as u64 || g == self.backup_bgs[1] as u64;
        }
        if g <= 1 || self.ro_compat & RO_COMPAT_SPARSE_SUPER == 0 {
            return true;
        }
        if g & 1 == 0 {
            return false;
        }
        [3u64, 5, 7].iter().any(|&b| {
            let mut p = b;
            while p < g {
                p = match p.checked_mul(b) {
                    Some(p) => p,
                    None => return false,
                };
            }
            p == g
        })
    }
    /// The device block holding descriptor block `i` of the primary table.
    pub fn descriptor_block(&self, i: u64) -> u64 {
        if self.incompat & INCOMPAT_META_BG == 0 || i < self.first_meta_bg {
            return self.first_data_block + 1 + i;
        }
        let g = self.descs_per_block() * i;
        self.group_first_block(g) + self.has_super(g) as u64
    }
    fn gdt_blocks(&self) -> u64 {
        self.groups().div_ceil(self.descs_per_block())
    }
    fn group_checksums(&self) -> bool {
        self.ro_compat & (RO_COMPAT_GDT_CSUM | RO_COMPAT_METADATA_CSUM) != 0
    }
}

fn fingerprint(sb: &[u8]) -> Vec<u8> {
    // blocks count lo, first data block, log block size, log cluster size,
    // blocks/clusters/inodes per group, rev, inode size, features, journal
    // inum/dev/uuid, reserved gdt, desc size, first meta bg, s_jnl_blocks,
    // blocks count hi, backup bgs.
    let ranges: [(usize, usize); 12] = [
        (0x4, 0x8),
        (0x14, 0x2C),
        (0x4C, 0x50),
        (0x58, 0x5A),
        (0x5C, 0x68),
        (0xCE, 0xD0),
        (0xD0, 0xE8),
        (0xFE, 0x100),
        (0x104, 0x108),
        (0x10C, 0x150),
        (0x150, 0x154),
        (0x24C, 0x254),
    ];
    let mut out = Vec::new();
    for (a, b) in ranges {
        if let Some(s) = sb.get(a..b) {
            let at = out.len();
            out.extend_from_slice(s);
            if a == 0x5C {
                // The kernel sets and clears needs_recovery at every mount
                // and unmount; it does not change the layout.
                if let Some(x) = out.get_mut(at + 4) {
                    *x &= !(INCOMPAT_RECOVER as u8);
                }
            }
        }
    }
    out
}

/// One group's descriptor fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub flags: u16,
}

/// A run of the journal: journal blocks `logical..logical+len` are device
/// blocks `physical..physical+len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub len: u64,
}

/// Everything learnt from the superblock, the descriptors and the journal inode.
#[derive(Debug, Clone)]
pub struct Layout {
    pub sb: Superblock,
    pub groups: Vec<GroupDesc>,
    /// Sorted (block bitmap block, group).
    pub bitmap_homes: Vec<(u64, u32)>,
    /// Sorted, merged block ranges the tracker never drops: superblocks,
    /// descriptor tables, reserved GDT, bitmaps, inode tables, the journal.
    pub pinned: Vec<(u64, u64)>,
    /// The journal's map, sorted by physical block.
    pub journal: Vec<Extent>,
    /// Journal length in blocks (from the inode size).
    pub journal_blocks: u64,
}

fn read_block(read: &mut Reader<'_>, sb: &Superblock, block: u64) -> Result<Vec<u8>, Unsupported> {
    if block >= sb.blocks_count {
        return Err(corrupt(format!(
            "block {block} beyond the end ({})",
            sb.blocks_count
        )));
    }
    let mut buf = vec![0u8; sb.block_size as usize];
    read(block * sb.block_size, &mut buf).map_err(|e| Unsupported::Io(e.to_string()))?;
    Ok(buf)
}

/// Reads the superblock. `Ok(None)`: the device holds no ext4.
pub fn read_superblock(read: &mut Reader<'_>) -> Result<Option<Superblock>, Unsupported> {
    let mut sb = vec![0u8; SUPERBLOCK_LEN];
    read(SUPERBLOCK_OFFSET, &mut sb).map_err(|e| Unsupported::Io(e.to_string()))?;
    Superblock::parse(&sb)
}

/// Reads the group descriptor table.
pub fn read_groups(read: &mut Reader<'_>, sb: &Superblock) -> Result<Vec<GroupDesc>, Unsupported> {
    let n = sb.groups();
    if n > (1 << 32) {
        return Err(corrupt(format!("{n} groups")));
    }
    let dpb = sb.descs_per_block();
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..sb.gdt_blocks() {
        let blk = read_block(read, sb, sb.descriptor_block(i))?;
        for j in 0..dpb {
            if out.len() as u64 == n {
                break;
            }
            let off = (j * sb.desc_size) as usize;
            let d = blk
                .get(off..off + sb.desc_size as usize)
                .ok_or_else(|| corrupt("descriptor"))?;
            let wide = sb.desc_size >= 64 && sb.incompat & INCOMPAT_64BIT != 0;
            let pair = |lo: usize, hi: usize| -> u64 {
                let l = le32(d, lo).unwrap_or(0) as u64;
                let h = if wide {
                    le32(d, hi).unwrap_or(0) as u64
                } else {
                    0
                };
                l | (h << 32)
            };
            out.push(GroupDesc {
                block_bitmap: pair(0x0, 0x20),
                inode_bitmap: pair(0x4, 0x24),
                inode_table: pair(0x8, 0x28),
                flags: le16(d, 0x12).unwrap_or(0),
            });
        }
    }
    for (g, d) in out.iter().enumerate() {
        for (what, b) in [
            ("block bitmap", d.block_bitmap),
            ("inode bitmap", d.inode_bitmap),
            ("inode table", d.inode_table),
        ] {
            if b < sb.first_data_block || b >= sb.blocks_count {
                return Err(corrupt(format!("group {g}: {what} at block {b}")));
            }
        }
    }
    Ok(out)
}

impl GroupDesc {
    /// The group's block bitmap is not initialised on disk (all free but metadata).
    pub fn block_uninit(&self, sb: &Superblock) -> bool {
        sb.group_checksums() && self.flags & BG_BLOCK_UNINIT != 0
    }
}

pub(crate) fn merge_ranges(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|r| r.0 < r.1);
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(l) if a <= l.1 => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Blocks that are the file system's own fixed metadata.
pub fn fixed_metadata(sb: &Superblock, groups: &[GroupDesc]) -> Vec<(u64, u64)> {
    let mut v = vec![(0, sb.first_data_block + 1)];
    let itable = (sb.inodes_per_group * sb.inode_size).div_ceil(sb.block_size);
    let meta_bg = sb.incompat & INCOMPAT_META_BG != 0;
    let dpb = sb.descs_per_block();
    let old_gdt = if meta_bg {
        sb.first_meta_bg.min(sb.gdt_blocks())
    } else {
        sb.gdt_blocks()
    };
    for g in 0..groups.len() as u64 {
        let first = sb.group_first_block(g);
        if sb.has_super(g) {
            v.push((first, first + 1 + old_gdt + sb.reserved_gdt_blocks));
        }
        if meta_bg {
            let m = g / dpb;
            let r = g % dpb;
            if m >= sb.first_meta_bg && (r == 0 || r == 1 || r == dpb - 1) {
                let b = first + sb.has_super(g) as u64;
                v.push((b, b + 1));
            }
        }
    }
    for d in groups {
        v.push((d.block_bitmap, d.block_bitmap + 1));
        v.push((d.inode_bitmap, d.inode_bitmap + 1));
        v.push((d.inode_table, d.inode_table + itable));
    }
    merge_ranges(v)
}

/// Maps the journal inode's blocks (extents or the old indirect map).
fn journal_map(
    read: &mut Reader<'_>,
    sb: &Superblock,
    groups: &[GroupDesc],
) -> Result<(Vec<Extent>, u64), Unsupported> {
    let ino = sb.journal_inum as u64;
    if ino == 0 || ino > sb.inodes_per_group * groups.len() as u64 {
        return Err(Unsupported::ExternalJournal);
    }
    let g = (ino - 1) / sb.inodes_per_group;
    let idx = (ino - 1) % sb.inodes_per_group;
    let table = groups
        .get(g as usize)
        .ok_or_else(|| corrupt("journal inode group"))?
        .inode_table;
    let mut inode = vec![0u8; sb.inode_size as usize];
    read(table * sb.block_size + idx * sb.inode_size, &mut inode)
        .map_err(|e| Unsupported::Io(e.to_string()))?;
    let size =
        le32(&inode, 0x4).unwrap_or(0) as u64 | ((le32(&inode, 0x6C).unwrap_or(0) as u64) << 32);
    let journal_blocks = size / sb.block_size;
    if journal_blocks < 2 || journal_blocks > sb.blocks_count {
        return Err(corrupt(format!("journal inode size {size}")));
    }
    let flags = le32(&inode, 0x20).unwrap_or(0);
    let iblock = inode
        .get(0x28..0x28 + 60)
        .ok_or_else(|| corrupt("inode"))?
        .to_vec();
    let mut ext = Vec::new();
    let mut budget = 100_000u32;
    if flags & EXTENTS_FL != 0 {
        walk_extents(read, sb, &iblock, 0, &mut ext, &mut budget)?;
    } else {
        let mut logical = 0u64;
        for i in 0..15usize {
            let b = le32(&iblock, i * 4).unwrap_or(0) as u64;
            let depth = i.saturating_sub(11) as u32; // 0 direct, 1..3 indirect
            walk_indirect(
                read,
                sb,
                b,
                depth,
                &mut logical,
                journal_blocks,
                &mut ext,
                &mut budget,
            )?;
        }
    }
    ext.retain(|e| e.logical < journal_blocks);
    for e in &mut ext {
        e.len = e.len.min(journal_blocks - e.logical);
        if e.physical
            .checked_add(e.len)
            .is_none_or(|end| end > sb.blocks_count)
        {
            return Err(corrupt("journal extent beyond the device"));
        }
    }
    ext.sort_unstable_by_key(|e| e.physical);
    let mapped: u64 = ext.iter().map(|e| e.len).sum();
    if mapped < journal_blocks {
        return Err(corrupt(format!(
            "journal maps {mapped} of {journal_blocks} blocks"
        )));
    }
    Ok((ext, journal_blocks))
}

fn walk_extents(
    read: &mut Reader<'_>,
    sb: &Superblock,
    node: &[u8],
    level: u32,
    out: &mut Vec<Extent>,
    budget: &mut u32,
) -> Result<(), Unsupported> {
    *budget = budget
        .checked_sub(1)
        .ok_or_else(|| corrupt("journal extent tree too large"))?;
    if le16(node, 0) != Some(0xF30A) || level > 5 {
        return Err(corrupt("journal extent header"));
    }
    let entries = le16(node, 2).unwrap_or(0) as usize;
    let depth = le16(node, 6).unwrap_or(0);
    for i in 0..entries {
        let e = 12 + i * 12;
        if depth == 0 {
            let (Some(lb), Some(len), Some(hi), Some(lo)) = (
                le32(node, e),
                le16(node, e + 4),
                le16(node, e + 6),
                le32(node, e + 8),
            ) else {
                return Err(corrupt("journal extent"));
            };
            let len = if len > 32768 { len - 32768 } else { len } as u64;
            out.push(Extent {
                logical: lb as u64,
                physical: lo as u64 | ((hi as u64) << 32),
                len,
            });
        } else {
            let (Some(lo), Some(hi)) = (le32(node, e + 4), le16(node, e + 8)) else {
                return Err(corrupt("journal extent index"));
            };
            let child = read_block(read, sb, lo as u64 | ((hi as u64) << 32))?;
            walk_extents(read, sb, &child, level + 1, out, budget)?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn walk_indirect(
    read: &mut Reader<'_>,
    sb: &Superblock,
    block: u64,
    depth: u32,
    logical: &mut u64,
    want: u64,
    out: &mut Vec<Extent>,
    budget: &mut u32,
) -> Result<(), Unsupported> {
    if *logical >= want {
        return Ok(());
    }
    if block == 0 {
        return Err(corrupt("hole in the journal's block map"));
    }
    if depth == 0 {
        match out.last_mut() {
            Some(l) if l.logical + l.len == *logical && l.physical + l.len == block => l.len += 1,
            _ => out.push(Extent {
                logical: *logical,
                physical: block,
                len: 1,
            }),
        }
        *logical += 1;
        return Ok(());
    }
    *budget = budget
        .checked_sub(1)
        .ok_or_else(|| corrupt("journal block map too large"))?;
    let ind = read_block(read, sb, block)?;
    for i in 0..(sb.block_size / 4) as usize {
        if *logical >= want {
            break;
        }
        let b = le32(&ind, i * 4).unwrap_or(0) as u64;
        walk_indirect(read, sb, b, depth - 1, logical, want, out, budget)?;
    }
    Ok(())
}

impl Layout {
    /// Learns the layout of the ext4 on the device and checks that it can be
    /// followed. `Ok(None)`: no ext4 there (yet).
    pub fn load(read: &mut Reader<'_>, device_size: u64) -> Result<Option<Layout>, Unsupported> {
        let Some(sb) = read_superblock(read)? else {
            return Ok(None);
        };
        sb.check_fits(device_size)?;
        sb.check_followable()?;
        let groups = read_groups(read, &sb)?;
        let (journal, journal_blocks) = journal_map(read, &sb, &groups)?;
        let mut pinned = fixed_metadata(&sb, &groups);
        pinned.extend(journal.iter().map(|e| (e.physical, e.physical + e.len)));
        let pinned = merge_ranges(pinned);
        let mut bitmap_homes: Vec<(u64, u32)> = groups
            .iter()
            .enumerate()
            .map(|(g, d)| (d.block_bitmap, g as u32))
            .collect();
        bitmap_homes.sort_unstable();
        Ok(Some(Layout {
            sb,
            groups,
            bitmap_homes,
            pinned,
            journal,
            journal_blocks,
        }))
    }

    /// The journal block (position in the log) stored in device block `b`.
    pub fn journal_pos(&self, b: u64) -> Option<u64> {
        let i = self.journal.partition_point(|e| e.physical + e.len <= b);
        let e = self.journal.get(i)?;
        (b >= e.physical && b < e.physical + e.len).then(|| e.logical + (b - e.physical))
    }

    /// The device block of journal position `pos`.
    pub fn journal_block(&self, pos: u64) -> Option<u64> {
        self.journal
            .iter()
            .find(|e| pos >= e.logical && pos < e.logical + e.len)
            .map(|e| e.physical + (pos - e.logical))
    }

    /// The group whose block bitmap lives in device block `b`.
    pub fn bitmap_group(&self, b: u64) -> Option<u32> {
        let i = self.bitmap_homes.partition_point(|&(h, _)| h < b);
        self.bitmap_homes
            .get(i)
            .filter(|&&(h, _)| h == b)
            .map(|&(_, g)| g)
    }

    pub fn is_pinned(&self, b: u64) -> bool {
        let i = self.pinned.partition_point(|r| r.1 <= b);
        self.pinned.get(i).is_some_and(|r| b >= r.0 && b < r.1)
    }

    /// The group that block `b` belongs to.
    pub fn group_of(&self, b: u64) -> Option<u64> {
        let g = b.checked_sub(self.sb.first_data_block)? / self.sb.blocks_per_group;
        (g < self.groups.len() as u64).then_some(g)
    }
}

/// Checked bit access on a bitmap (bit set = in use).
pub(crate) fn bit(map: &[u8], i: u64) -> Option<bool> {
    Some(u8_at(map, usize::try_from(i / 8).ok()?)? & (1 << (i % 8)) != 0)
}
