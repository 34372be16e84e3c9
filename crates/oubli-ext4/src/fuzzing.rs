//! Support for the fuzz target and the no-panic tests: a small synthetic ext4 (1 KiB blocks, one group, a 1024-block internal journal with csum v3) and an interpreter that turns arbitrary bytes into writes aimed at its metadata.

use crate::Ext4Tracker;

pub const BS: usize = 1024;
pub const BLOCKS: usize = 8192;
pub const BITMAP: usize = 3;
pub const JOURNAL: usize = 1024;
pub const JOURNAL_LEN: usize = 1024;
const ITABLE: usize = 5;

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

/// An 8 MiB ext4 image that [`Ext4Tracker::load`] follows (journal with
/// `csum_v3` and 64-bit tags).
pub fn synth_image() -> Vec<u8> {
    synth_image_with(0x10 | 0x2)
}

/// The same with the journal's incompat features chosen (0: 32-bit tags
/// without checksums, which random input can form into whole transactions).
pub fn synth_image_with(journal_incompat: u32) -> Vec<u8> {
    let mut img = vec![0u8; BLOCKS * BS];
    let sb = &mut img[1024..2048];
    put32(sb, 0x0, 256); // inodes
    put32(sb, 0x4, BLOCKS as u32);
    put32(sb, 0x14, 1); // first data block
    put32(sb, 0x18, 0); // 1 KiB blocks
    put32(sb, 0x20, 8192);
    put32(sb, 0x28, 256);
    put16(sb, 0x38, 0xEF53);
    put32(sb, 0x4C, 1);
    put16(sb, 0x58, 256);
    put32(sb, 0x5C, 0x4); // has_journal
    put32(sb, 0x60, 0x2 | 0x40 | 0x80); // filetype, extents, 64bit
    put32(sb, 0x64, 0x1 | 0x400); // sparse_super, metadata_csum
    put32(sb, 0xE0, 8);
    put16(sb, 0xFE, 64);
    // Group descriptor (block 2).
    let gd = &mut img[2 * BS..2 * BS + 64];
    put32(gd, 0x0, BITMAP as u32);
    put32(gd, 0x4, 4);
    put32(gd, 0x8, ITABLE as u32);
    // Block bitmap: metadata, inode table and journal in use.
    let itable_blocks = 256 * 256 / BS;
    for b in (1..ITABLE + itable_blocks).chain(JOURNAL..JOURNAL + JOURNAL_LEN) {
        let i = b - 1;
        img[BITMAP * BS + i / 8] |= 1 << (i % 8);
    }
    // Journal inode (8): extents flag, one extent.
    let ino = ITABLE * BS + 7 * 256;
    put32(&mut img, ino + 0x4, (JOURNAL_LEN * BS) as u32);
    put32(&mut img, ino + 0x20, 0x80000);
    let e = ino + 0x28;
    put16(&mut img, e, 0xF30A);
    put16(&mut img, e + 2, 1);
    put16(&mut img, e + 4, 4);
    put32(&mut img, e + 12, 0);
    put16(&mut img, e + 16, JOURNAL_LEN as u16);
    put32(&mut img, e + 20, JOURNAL as u32);
    // Journal superblock (v2, csum v3 + 64bit).
    let j = &mut img[JOURNAL * BS..JOURNAL * BS + BS];
    j[0..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
    j[4..8].copy_from_slice(&4u32.to_be_bytes());
    j[0xC..0x10].copy_from_slice(&(BS as u32).to_be_bytes());
    j[0x10..0x14].copy_from_slice(&(JOURNAL_LEN as u32).to_be_bytes());
    j[0x14..0x18].copy_from_slice(&1u32.to_be_bytes());
    j[0x18..0x1C].copy_from_slice(&7u32.to_be_bytes());
    j[0x1C..0x20].copy_from_slice(&1u32.to_be_bytes());
    j[0x28..0x2C].copy_from_slice(&journal_incompat.to_be_bytes());
    j[0x30..0x40].copy_from_slice(b"oubli-fuzz-uuid!");
    img
}

/// Applies `data` to the image as a sequence of writes, feeding each to the
/// tracker (and the image read back when it asks to relearn). Returns the
/// ranges dropped that were not free in the tracker's layout's terms —
/// fixed metadata — which must be empty.
pub fn run(img: &mut [u8], t: &mut Ext4Tracker, data: &[u8]) -> Vec<(u64, u64)> {
    let mut bad = Vec::new();
    let mut i = 0usize;
    let mut seq = 7u32;
    while i + 4 <= data.len() {
        let op = data[i];
        let sel = u16::from_le_bytes([data[i + 1], data[i + 2]]) as usize;
        let n = data[i + 3] as usize % 4 + 1;
        i += 4;
        let block = match op % 5 {
            0 => JOURNAL + 1 + sel % (JOURNAL_LEN - 1),
            1 => BITMAP,
            2 => 1, // the superblock's block
            3 => JOURNAL,
            _ => sel % BLOCKS,
        };
        let len = (n * BS).min(BLOCKS * BS - block * BS);
        let take = len.min(data.len() - i);
        let mut buf = vec![0u8; len];
        buf[..take].copy_from_slice(&data[i..i + take]);
        i += take;
        if op & 0x40 != 0 && len >= 12 {
            // A plausible jbd2 header, to reach the journal paths.
            buf[0..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
            let ty = [1u32, 2, 5, 4][(op as usize >> 3) % 4];
            buf[4..8].copy_from_slice(&ty.to_be_bytes());
            if op & 0x80 != 0 {
                seq = seq.wrapping_add(1);
            }
            buf[8..12].copy_from_slice(&seq.to_be_bytes());
        }
        let off = block * BS + if op & 0x20 != 0 { sel % 512 } else { 0 };
        let end = (off + buf.len()).min(img.len());
        let buf = &buf[..end - off];
        img[off..end].copy_from_slice(buf);
        let obs = if op & 0x10 != 0 && op % 5 == 4 {
            t.observe_zeroes(off as u64, buf.len() as u64)
        } else {
            t.observe_write(off as u64, buf)
        };
        if let Some(lay) = t.layout() {
            for &(a, b) in &obs.freed {
                let bs = lay.sb.block_size;
                if (a / bs..b.div_ceil(bs)).any(|blk| lay.is_pinned(blk)) {
                    bad.push((a, b));
                }
            }
        }
        for &(a, b) in &obs.freed {
            if let Some(s) = img.get_mut(a as usize..b as usize) {
                s.fill(0);
            }
        }
        if obs.relearn {
            let im: &[u8] = img;
            let _ = t.relearn(&mut |o, b: &mut [u8]| {
                b.fill(0);
                if let Some(s) = im.get(o as usize..) {
                    let k = b.len().min(s.len());
                    b[..k].copy_from_slice(&s[..k]);
                }
                Ok(())
            });
        }
    }
    bad
}
