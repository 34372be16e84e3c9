//! The audit's oracle: the blocks an unmounted ext4 has free, computed from its bitmaps (BLOCK_UNINIT groups from their layout) through a block-reading closure.

use crate::layout::{
    bit, fixed_metadata, merge_ranges, read_groups, read_superblock, Layout, Reader, Unsupported,
    INCOMPAT_RECOVER,
};

/// The free blocks of a file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeSpace {
    pub block_size: u64,
    pub blocks_count: u64,
    /// Sorted, merged `[first, end)` block ranges the file system has free.
    pub ranges: Vec<(u64, u64)>,
}

impl FreeSpace {
    pub fn free_blocks(&self) -> u64 {
        self.ranges.iter().map(|r| r.1 - r.0).sum()
    }
    pub fn is_free(&self, b: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.1 <= b);
        self.ranges.get(i).is_some_and(|r| b >= r.0 && b < r.1)
    }
}

/// Computes the free blocks of the ext4 on a device from its block bitmaps.
/// `Ok(None)`: no ext4 there. A file system whose journal needs recovery is
/// refused: its bitmaps are not its state until the journal is replayed.
/// Blocks that are the file system's own metadata (superblocks, descriptor
/// tables, bitmaps, inode tables, the journal) are never reported free, even
/// if a (corrupt) bitmap says so.
pub fn free_space(
    read: &mut Reader<'_>,
    device_size: u64,
) -> Result<Option<FreeSpace>, Unsupported> {
    let Some(sb) = read_superblock(read)? else {
        return Ok(None);
    };
    sb.check_fits(device_size)?;
    sb.check_readable()?;
    if sb.incompat & INCOMPAT_RECOVER != 0 {
        return Err(Unsupported::NeedsRecovery);
    }
    let groups = read_groups(read, &sb)?;
    let mut meta = fixed_metadata(&sb, &groups);
    if sb.check_followable().is_ok() {
        // Ext4 marks the journal in use; keep it out even if a bitmap is wrong.
        if let Ok(Some(l)) = Layout::load(read, device_size) {
            meta = l.pinned;
        }
    }
    let in_meta = |b: u64| {
        let i = meta.partition_point(|r| r.1 <= b);
        meta.get(i).is_some_and(|r| b >= r.0 && b < r.1)
    };
    let mut free = Vec::new();
    let mut buf = vec![0u8; sb.block_size as usize];
    for (g, d) in groups.iter().enumerate() {
        let g = g as u64;
        let first = sb.group_first_block(g);
        let len = sb.group_len(g);
        let uninit = d.block_uninit(&sb);
        if !uninit {
            read(d.block_bitmap * sb.block_size, &mut buf)
                .map_err(|e| Unsupported::Io(e.to_string()))?;
        }
        let mut run: Option<u64> = None;
        for i in 0..len {
            let b = first + i;
            let is_free = !in_meta(b) && (uninit || bit(&buf, i) == Some(false));
            match (is_free, run) {
                (true, None) => run = Some(b),
                (false, Some(s)) => {
                    free.push((s, b));
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(s) = run {
            free.push((s, first + len));
        }
    }
    Ok(Some(FreeSpace {
        block_size: sb.block_size,
        blocks_count: sb.blocks_count,
        ranges: merge_ranges(free),
    }))
}
