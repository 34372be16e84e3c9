//! `NandMedium`: oubli's `Medium` on the UBI layer — segments in runs of erase blocks, superblock slots as atomically changed blocks.
//!
//! LEB numbers: 0 and 1 are the superblock slots A and B, 2 the NAND vault,
//! 3..16 reserved; segment `id` owns LEBs `16 + id * 64 ..` (a segment fills
//! them in order). Page 0 of each segment LEB starts with the segment offset
//! of the LEB's first byte (8 bytes, little endian), so that a reader of the
//! raw chip can place every block it finds. Appends are gathered into whole
//! pages in memory; `sync` programs the partial last page of each segment
//! (the rest of that page is lost space). Deleting a segment erases its
//! blocks: on this medium the ciphertext is really gone.

use crate::chip::{Geometry, NandChip};
use crate::ubi::{carve_block, CarvedBlock, Lnum, Ubi};
use oubli_core::{Medium, SegmentId, Slot, SUPERBLOCK_MAX};
use std::collections::BTreeMap;
use std::io::{self, ErrorKind};
use std::sync::{Arc, Mutex, MutexGuard};

/// LEB of superblock slot A (B is the next one).
pub const LNUM_SUPERBLOCK: Lnum = 0;
/// LEB of the NAND vault.
pub const LNUM_VAULT: Lnum = 2;
/// First LEB of segment 0.
pub const FIRST_SEGMENT_LNUM: Lnum = 16;
/// LEB numbers set aside per segment (more than it needs when every sync
/// leaves a partial page behind).
pub const LEBS_PER_SEGMENT: u64 = 64;
/// A segment's capacity, in erase blocks' worth of bytes.
pub const SEGMENT_BLOCKS: u64 = 8;
/// Bytes of the start-offset prefix on page 0 of a segment LEB.
const PREFIX: usize = 8;

fn lnum_of(id: SegmentId, index: u64) -> Lnum {
    FIRST_SEGMENT_LNUM + id as u64 * LEBS_PER_SEGMENT + index
}

/// A programmed run of segment bytes: one page's data.
#[derive(Debug, Clone, Copy)]
struct Extent {
    lnum: Lnum,
    page: usize,
    /// Segment offset of the first byte.
    start: u64,
    len: usize,
    /// Bytes of the page's data before the segment's (the prefix).
    skip: usize,
}

#[derive(Debug, Default)]
struct Segment {
    extents: Vec<Extent>,
    programmed: u64,
    /// Appended, not yet programmed (less than a page).
    tail: Vec<u8>,
    /// The LEB (index in the segment) the next page goes to; the page
    /// itself is the UBI layer's next one in that LEB.
    next_leb: u64,
    /// Nothing of it is on the chip yet (created since the last sync).
    unwritten: bool,
}

impl Segment {
    fn len(&self) -> u64 {
        self.programmed + self.tail.len() as u64
    }
}

/// Oubli's medium on a (simulated) raw NAND chip.
pub struct NandMedium {
    ubi: Arc<Ubi>,
    segments: Mutex<BTreeMap<SegmentId, Segment>>,
    attached_at: std::time::Instant,
}

impl std::fmt::Debug for NandMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NandMedium")
            .field("ubi", &self.ubi)
            .finish()
    }
}

impl NandMedium {
    /// The medium on an attached UBI layer: segments are found from the
    /// mapped LEBs.
    pub fn new(ubi: Arc<Ubi>) -> io::Result<NandMedium> {
        let ppl = ubi.pages_per_leb();
        let mut segments: BTreeMap<SegmentId, Segment> = BTreeMap::new();
        for lnum in ubi.lebs().into_iter().filter(|&l| l >= FIRST_SEGMENT_LNUM) {
            let rel = lnum - FIRST_SEGMENT_LNUM;
            let Ok(id) = SegmentId::try_from(rel / LEBS_PER_SEGMENT) else {
                continue;
            };
            let index = rel % LEBS_PER_SEGMENT;
            let seg = segments.entry(id).or_default();
            let pages = ubi.pages(lnum).unwrap_or_default();
            for (page, &used) in pages.iter().enumerate() {
                let skip = if page == 0 { PREFIX } else { 0 };
                let len = (used as usize).saturating_sub(skip);
                if len > 0 {
                    seg.extents.push(Extent {
                        lnum,
                        page,
                        start: seg.programmed,
                        len,
                        skip,
                    });
                    seg.programmed += len as u64;
                }
            }
            seg.next_leb = if pages.len() >= ppl { index + 1 } else { index };
        }
        Ok(NandMedium {
            ubi,
            segments: Mutex::new(segments),
            attached_at: std::time::Instant::now(),
        })
    }

    /// The UBI layer underneath (shared with the NAND vault).
    pub fn ubi(&self) -> &Arc<Ubi> {
        &self.ubi
    }

    pub fn chip(&self) -> &Arc<NandChip> {
        self.ubi.chip()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<SegmentId, Segment>> {
        self.segments.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn leb_bytes(&self) -> u64 {
        (self.ubi.page_size() * self.ubi.pages_per_leb()) as u64
    }

    /// Erasures per hour since this medium attached.
    pub fn erase_rate(&self) -> f64 {
        let hours = self.attached_at.elapsed().as_secs_f64() / 3600.0;
        self.chip().erases_since_attach() as f64 / hours.max(1e-9)
    }

    /// Programs the next page of `seg` with as much of its tail as fits
    /// (all of it when `partial`).
    fn program_page(&self, id: SegmentId, seg: &mut Segment, partial: bool) -> io::Result<()> {
        let ps = self.ubi.page_size();
        let mut page = self
            .ubi
            .pages(lnum_of(id, seg.next_leb))
            .map_or(0, |p| p.len());
        if page >= self.ubi.pages_per_leb() {
            seg.next_leb += 1;
            page = 0;
        }
        let index = seg.next_leb;
        if index >= LEBS_PER_SEGMENT {
            return Err(io::Error::new(
                ErrorKind::StorageFull,
                format!("segment {id} used up its erase blocks"),
            ));
        }
        let skip = if page == 0 { PREFIX } else { 0 };
        let room = ps - skip;
        if !partial && seg.tail.len() < room {
            return Ok(());
        }
        let n = seg.tail.len().min(room);
        let mut data = Vec::with_capacity(skip + n);
        if skip > 0 {
            data.extend_from_slice(&seg.programmed.to_le_bytes());
        }
        data.extend_from_slice(&seg.tail[..n]);
        let lnum = lnum_of(id, index);
        // A failed program spends the page or not as the UBI layer says
        // (a torn page is never reused; a block never taken is not spent).
        self.ubi.append_page(lnum, &data)?;
        if n > 0 {
            seg.extents.push(Extent {
                lnum,
                page,
                start: seg.programmed,
                len: n,
                skip,
            });
        }
        seg.programmed += n as u64;
        seg.tail.drain(..n);
        seg.unwritten = false;
        Ok(())
    }

    /// What a chip-off reader recovers from raw erase blocks (the current
    /// chip, and any earlier block contents): every segment piece it can
    /// place, and every superblock copy.
    pub fn carve(geometry: Geometry, blocks: &[(u32, Vec<u8>)]) -> Carved {
        let mut carved = Carved::default();
        for (_, raw) in blocks {
            let Some(CarvedBlock { lnum, pages, .. }) = carve_block(raw, geometry) else {
                continue;
            };
            if lnum < FIRST_SEGMENT_LNUM {
                let data: Vec<u8> = pages.into_iter().flat_map(|(_, d)| d).collect();
                match lnum {
                    0 | 1 => carved.superblocks.push(data),
                    LNUM_VAULT => carved.vault.push(data),
                    _ => {}
                }
                continue;
            }
            let rel = lnum - FIRST_SEGMENT_LNUM;
            let Ok(id) = SegmentId::try_from(rel / LEBS_PER_SEGMENT) else {
                continue;
            };
            let mut pages = pages.into_iter();
            let Some((0, first)) = pages.next() else {
                continue;
            };
            let Some(start) = first.get(..PREFIX) else {
                continue;
            };
            let at = u64::from_le_bytes(start.try_into().unwrap());
            let mut bytes = first[PREFIX..].to_vec();
            for (_, d) in pages {
                bytes.extend_from_slice(&d);
            }
            if !bytes.is_empty() {
                carved.pieces.push((id, at, bytes));
            }
        }
        carved
    }
}

/// What [`NandMedium::carve`] found.
#[derive(Debug, Default)]
pub struct Carved {
    /// `(segment, offset, bytes)`.
    pub pieces: Vec<(SegmentId, u64, Vec<u8>)>,
    pub superblocks: Vec<Vec<u8>>,
    /// The NAND vault's sealed records.
    pub vault: Vec<Vec<u8>>,
}

fn not_found(id: SegmentId) -> io::Error {
    io::Error::new(ErrorKind::NotFound, format!("no segment {id}"))
}

impl Medium for NandMedium {
    fn describe(&self) -> String {
        match self.chip().path() {
            Some(p) => format!("nand:{}", p.display()),
            None => "nand:(memory)".into(),
        }
    }

    fn segment_capacity(&self) -> u64 {
        SEGMENT_BLOCKS * self.leb_bytes()
    }

    /// Whole erase blocks: those appends may still take, less the page
    /// prefix each carries; the open segments' last blocks count as full.
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let (free, total) = self.ubi.blocks_for_appends();
        let usable = self.leb_bytes() - (PREFIX as u64);
        Ok(Some(oubli_core::Space {
            total: total as u64 * self.leb_bytes(),
            free: free as u64 * usable,
        }))
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut segments = self.lock();
        if offset == 0 && !segments.contains_key(&id) {
            segments.insert(
                id,
                Segment {
                    unwritten: true,
                    ..Segment::default()
                },
            );
        }
        let seg = segments.get_mut(&id).ok_or_else(|| not_found(id))?;
        if offset != seg.len() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "append to segment {id} at {offset}, its end is {}",
                    seg.len()
                ),
            ));
        }
        if offset + data.len() as u64 > self.segment_capacity() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("segment {id} would pass its capacity"),
            ));
        }
        let held = seg.tail.len();
        seg.tail.extend_from_slice(data);
        let total = seg.tail.len();
        loop {
            let before = seg.tail.len();
            if before == 0 {
                break;
            }
            if let Err(e) = self.program_page(id, seg, false) {
                if e.kind() != ErrorKind::StorageFull {
                    return Err(e);
                }
                // Out of erase blocks. If no byte of `data` was programmed
                // (only the tail held from earlier appends, or nothing), the
                // append is taken back whole: the segment ends where it did,
                // as the `Medium` contract wants of `StorageFull`. A page of
                // it programmed cannot be taken back: then it is an I/O error.
                if total - seg.tail.len() <= held {
                    let keep = seg.tail.len() - data.len();
                    seg.tail.truncate(keep);
                    return Err(e);
                }
                return Err(io::Error::other(format!(
                    "segment {id}: the chip filled up partway through an append: {e}"
                )));
            }
            if seg.tail.len() == before {
                break;
            }
        }
        Ok(())
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        // Copy what is needed under the lock, read the chip after it.
        let (extents, tail_part) = {
            let segments = self.lock();
            let seg = segments.get(&id).ok_or_else(|| not_found(id))?;
            let end = offset + buf.len() as u64;
            if end > seg.len() {
                return Err(io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("read of segment {id} up to {end}, it holds {}", seg.len()),
                ));
            }
            let first = seg
                .extents
                .partition_point(|e| e.start + e.len as u64 <= offset);
            let extents: Vec<Extent> = seg.extents[first..]
                .iter()
                .take_while(|e| e.start < end)
                .copied()
                .collect();
            let tail_part = if end > seg.programmed {
                let from = offset.max(seg.programmed);
                let a = (from - seg.programmed) as usize;
                let b = (end - seg.programmed) as usize;
                Some((from, seg.tail[a..b].to_vec()))
            } else {
                None
            };
            (extents, tail_part)
        };
        for e in extents {
            let data = self.ubi.read_page(e.lnum, e.page)?;
            let data = &data[e.skip..e.skip + e.len];
            let from = offset.max(e.start);
            let to = (offset + buf.len() as u64).min(e.start + e.len as u64);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - e.start) as usize..(to - e.start) as usize]);
        }
        if let Some((from, bytes)) = tail_part {
            let at = (from - offset) as usize;
            buf[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        Ok(self.lock().get(&id).map(Segment::len))
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        Ok(self.lock().keys().copied().collect())
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        let mut segments = self.lock();
        let Some(seg) = segments.remove(&id) else {
            return Ok(());
        };
        // Last block first: a cut part-way leaves a prefix of the segment,
        // whose offsets attach still computes right.
        for index in (0..=seg.next_leb.min(LEBS_PER_SEGMENT - 1)).rev() {
            self.ubi.unmap(lnum_of(id, index))?;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut segments = self.lock();
        for (&id, seg) in segments.iter_mut() {
            // A segment made since the last sync exists on the chip only
            // once a page of it is programmed, even an empty one.
            if !seg.tail.is_empty() || seg.unwritten {
                self.program_page(id, seg, true)?;
            }
        }
        drop(segments);
        self.ubi.erase_stale()?;
        self.chip().sync()
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        let lnum = LNUM_SUPERBLOCK + slot.index() as Lnum;
        if self.ubi.pages(lnum).is_none() {
            return Ok(None);
        }
        Ok(self.ubi.copies(lnum)?.into_iter().next())
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        if data.len() > SUPERBLOCK_MAX {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("superblock of {} bytes", data.len()),
            ));
        }
        self.ubi
            .change(LNUM_SUPERBLOCK + slot.index() as Lnum, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ubi::UbiConfig;

    /// A chip that runs out of erase blocks: the append that finds none is
    /// taken back whole (the `Medium` contract for `StorageFull`), so the
    /// segment ends where it did and what landed before reads back.
    #[test]
    fn an_append_that_finds_no_erase_block_is_taken_back() {
        let geometry = Geometry {
            page_size: 512,
            pages_per_block: 16,
            blocks: 48,
            oob_bytes: 32,
        };
        let chip = Arc::new(NandChip::in_memory(geometry, &[3], None).unwrap());
        let ubi = Arc::new(Ubi::attach(chip, UbiConfig::default()).unwrap());
        let m = NandMedium::new(ubi).unwrap();
        let capacity = m.segment_capacity();
        // Under a page each, so that no append programs a page of its own
        // before the one that needs a new block.
        let chunk: Vec<u8> = (0..100u8).collect();
        let (mut id, mut offset) = (10, 0u64);
        let err = loop {
            if offset + chunk.len() as u64 > capacity {
                id += 1;
                offset = 0;
            }
            match m.append(id, offset, &chunk) {
                Ok(()) => offset += chunk.len() as u64,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
        assert_eq!(m.segment_len(id).unwrap().unwrap_or(0), offset);
        assert!(offset >= chunk.len() as u64, "the failure came first");
        let mut buf = vec![0u8; chunk.len()];
        m.read(id, offset - chunk.len() as u64, &mut buf).unwrap();
        assert_eq!(buf, chunk);
    }
}
