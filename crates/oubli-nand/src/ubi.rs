//! `Ubi`: logical erase blocks over a `NandChip` — OOB headers, mapping rebuilt by scanning, atomic change, wear levelling.
//!
//! Every programmed page carries a 32-byte header in its OOB area naming the
//! logical erase block (LEB) it belongs to, the copy's sequence number, the
//! bytes of the main area in use and two checksums (docs/FORMAT.md, "UBI
//! page header"). Nothing else is kept on the chip: attach rebuilds the
//! LEB -> PEB map by reading the headers, so a power cut at any point leaves
//! a chip that attaches. When two physical blocks claim one LEB (an atomic
//! change or a wear-levelling move cut short before the old block's erase),
//! the newest *complete* copy wins and the other is erased.

use crate::chip::{is_bad_block, NandChip};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, ErrorKind};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of the page header at the start of each page's OOB area.
pub const HEADER_LEN: usize = 32;
const MAGIC: &[u8; 2] = b"UB";
const VERSION: u8 = 1;
/// Flag: the page belongs to a copy written in one go whose page count is
/// in the header (atomic change, wear-levelling move).
const FLAG_COPY: u8 = 1;

/// A logical erase block number.
pub type Lnum = u64;

/// Tuning of the layer.
#[derive(Debug, Clone, Copy)]
pub struct UbiConfig {
    /// Static wear levelling moves the data of the least-erased block in use
    /// to a worn free block when the erase counts differ by more than this.
    pub wl_threshold: u32,
    /// Free blocks kept back for atomic changes (superblocks, vault): plain
    /// appends fail with `StorageFull` rather than take them.
    pub reserve: u32,
}

impl Default for UbiConfig {
    fn default() -> Self {
        UbiConfig {
            wl_threshold: 16,
            reserve: 4,
        }
    }
}

/// The page header, as written in the OOB area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PageHeader {
    lnum: Lnum,
    seq: u64,
    used: u16,
    /// Pages of the copy (with [`FLAG_COPY`]); 0 for an appendable block.
    count: u16,
}

fn digest4(parts: &[&[u8]]) -> [u8; 4] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    ctx.finish().as_ref()[..4].try_into().unwrap()
}

impl PageHeader {
    fn encode(&self, data: &[u8]) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..2].copy_from_slice(MAGIC);
        h[2] = VERSION;
        h[3] = if self.count > 0 { FLAG_COPY } else { 0 };
        h[4..12].copy_from_slice(&self.lnum.to_le_bytes());
        h[12..20].copy_from_slice(&self.seq.to_le_bytes());
        h[20..22].copy_from_slice(&self.used.to_le_bytes());
        h[22..24].copy_from_slice(&self.count.to_le_bytes());
        h[24..28].copy_from_slice(&digest4(&[data]));
        let sum = digest4(&[&h[..28]]);
        h[28..32].copy_from_slice(&sum);
        h
    }

    /// The header of a page whose OOB and main area both check out; `None`
    /// for an erased, torn or foreign page.
    fn decode(oob: &[u8], main: Option<&[u8]>) -> Option<PageHeader> {
        let h = oob.get(..HEADER_LEN)?;
        if &h[..2] != MAGIC || h[2] != VERSION || digest4(&[&h[..28]]) != h[28..32] {
            return None;
        }
        let header = PageHeader {
            lnum: u64::from_le_bytes(h[4..12].try_into().unwrap()),
            seq: u64::from_le_bytes(h[12..20].try_into().unwrap()),
            used: u16::from_le_bytes(h[20..22].try_into().unwrap()),
            count: u16::from_le_bytes(h[22..24].try_into().unwrap()),
        };
        if (h[3] & FLAG_COPY != 0) != (header.count > 0) {
            return None;
        }
        if let Some(main) = main {
            if digest4(&[main.get(..header.used as usize)?]) != h[24..28] {
                return None;
            }
        }
        Some(header)
    }
}

/// Where one LEB lives.
#[derive(Debug, Clone)]
struct Leb {
    peb: u32,
    seq: u64,
    /// Bytes in use of each programmed page (0 for a torn page).
    used: Vec<u16>,
}

struct State {
    map: BTreeMap<Lnum, Leb>,
    /// Erased blocks ready for use, least erased first: `(erase count, peb)`.
    free: BTreeSet<(u32, u32)>,
    /// Blocks holding an older copy whose erase failed (a power cut).
    stale: Vec<(Lnum, u32)>,
    seq: u64,
    /// Wear-levelling moves since attach.
    moves: u64,
}

/// The UBI-like layer over one chip. Its operations are serialized by one lock.
pub struct Ubi {
    chip: Arc<NandChip>,
    config: UbiConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for Ubi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ubi").field("chip", &self.chip).finish()
    }
}

/// A PEB found at attach that claims a LEB.
struct Found {
    peb: u32,
    header: PageHeader,
    used: Vec<u16>,
    complete: bool,
}

impl Ubi {
    /// Attaches to `chip`: reads every programmed page's header, keeps the
    /// newest complete copy of each LEB, and erases everything else that
    /// is not blank (older copies, torn copies, torn first pages).
    pub fn attach(chip: Arc<NandChip>, config: UbiConfig) -> io::Result<Ubi> {
        let g = chip.geometry();
        let mut found: BTreeMap<Lnum, Vec<Found>> = BTreeMap::new();
        let mut garbage = Vec::new();
        let mut free = BTreeSet::new();
        let mut seq = 0;
        for peb in 0..g.blocks {
            if chip.is_bad(peb) {
                continue;
            }
            // The simulator's count of programmed pages spares reading the
            // erased ones; a real attach would read until the first blank page.
            let programmed = chip.programmed_pages(peb);
            if programmed == 0 {
                free.insert((chip.erase_count(peb), peb));
                continue;
            }
            let (main, oob) = chip.read_page(peb, 0)?;
            let Some(first) = PageHeader::decode(&oob, Some(&main)) else {
                garbage.push(peb);
                continue;
            };
            let mut used = vec![first.used];
            for page in 1..programmed {
                let (main, oob) = chip.read_page(peb, page)?;
                match PageHeader::decode(&oob, Some(&main)) {
                    Some(h) if h.lnum == first.lnum && h.seq == first.seq => used.push(h.used),
                    // A torn page: it holds nothing, and is skipped.
                    _ => used.push(0),
                }
            }
            seq = seq.max(first.seq);
            let complete = first.count == 0 || {
                let n = first.count as usize;
                used.len() >= n && Self::pages_valid(&chip, peb, n)?
            };
            found.entry(first.lnum).or_default().push(Found {
                peb,
                header: first,
                used,
                complete,
            });
        }
        let mut map = BTreeMap::new();
        for (lnum, mut copies) in found {
            copies.sort_by_key(|c| std::cmp::Reverse(c.header.seq));
            let winner = copies.iter().position(|c| c.complete);
            for (i, c) in copies.into_iter().enumerate() {
                if Some(i) == winner {
                    map.insert(
                        lnum,
                        Leb {
                            peb: c.peb,
                            seq: c.header.seq,
                            used: c.used,
                        },
                    );
                } else {
                    garbage.push(c.peb);
                }
            }
        }
        let ubi = Ubi {
            chip,
            config,
            state: Mutex::new(State {
                map,
                free,
                stale: Vec::new(),
                seq,
                moves: 0,
            }),
        };
        {
            let mut st = ubi.lock();
            for peb in garbage {
                ubi.erase_to_free(&mut st, peb)?;
            }
        }
        Ok(ubi)
    }

    /// Whether the first `n` pages of `peb` all check out.
    fn pages_valid(chip: &NandChip, peb: u32, n: usize) -> io::Result<bool> {
        for page in 0..n as u32 {
            let (main, oob) = chip.read_page(peb, page)?;
            if PageHeader::decode(&oob, Some(&main)).is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn chip(&self) -> &Arc<NandChip> {
        &self.chip
    }

    /// Bytes of data a page holds.
    pub fn page_size(&self) -> usize {
        self.chip.geometry().page_size as usize
    }

    /// Pages of a LEB.
    pub fn pages_per_leb(&self) -> usize {
        self.chip.geometry().pages_per_block as usize
    }

    /// Every mapped LEB, ascending.
    pub fn lebs(&self) -> Vec<Lnum> {
        self.lock().map.keys().copied().collect()
    }

    /// Bytes in use of each programmed page of `lnum`, or `None` if unmapped.
    pub fn pages(&self, lnum: Lnum) -> Option<Vec<u16>> {
        self.lock().map.get(&lnum).map(|l| l.used.clone())
    }

    /// Wear-levelling moves since attach.
    pub fn moves(&self) -> u64 {
        self.lock().moves
    }

    /// Erased blocks ready for use.
    pub fn free_blocks(&self) -> usize {
        self.lock().free.len()
    }

    /// Erased blocks plain appends may still take (the erased ones less the
    /// reserve kept for atomic changes), and blocks in use or free in all
    /// (bad ones left out).
    pub fn blocks_for_appends(&self) -> (usize, usize) {
        let st = self.lock();
        let free = st.free.len();
        (
            free.saturating_sub(self.config.reserve as usize),
            st.map.len() + free + st.stale.len(),
        )
    }

    /// The bytes in use of page `page` of `lnum`.
    pub fn read_page(&self, lnum: Lnum, page: usize) -> io::Result<Vec<u8>> {
        let st = self.lock();
        let leb = st.map.get(&lnum).ok_or_else(|| not_found(lnum))?;
        let used = *leb.used.get(page).ok_or_else(|| {
            io::Error::new(ErrorKind::UnexpectedEof, format!("LEB {lnum} page {page}"))
        })?;
        let (mut main, _) = self.chip.read_page(leb.peb, page as u32)?;
        main.truncate(used as usize);
        Ok(main)
    }

    /// Programs the next page of `lnum` with `data` (at most a page),
    /// mapping the LEB to the least-erased free block first if needed.
    pub fn append_page(&self, lnum: Lnum, data: &[u8]) -> io::Result<()> {
        if data.len() > self.page_size() {
            return Err(io::Error::new(ErrorKind::InvalidInput, "more than a page"));
        }
        let mut st = self.lock();
        if !st.map.contains_key(&lnum) {
            let peb = self.take_free(&mut st, false)?;
            st.seq += 1;
            let seq = st.seq;
            st.map.insert(
                lnum,
                Leb {
                    peb,
                    seq,
                    used: Vec::new(),
                },
            );
        }
        let leb = st.map.get_mut(&lnum).expect("mapped above");
        let page = leb.used.len();
        if page >= self.pages_per_leb() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("LEB {lnum} is full"),
            ));
        }
        let header = PageHeader {
            lnum,
            seq: leb.seq,
            used: data.len() as u16,
            count: 0,
        };
        // The page counts as used from here even if the program fails: a
        // failed (torn) page cannot be programmed again before an erase.
        leb.used.push(0);
        let peb = leb.peb;
        self.chip
            .program(peb, page as u32, data, &header.encode(data))?;
        st.map.get_mut(&lnum).expect("mapped").used[page] = data.len() as u16;
        Ok(())
    }

    /// Replaces the whole content of `lnum` atomically: the new copy is
    /// written to a fresh block (with its page count in every header), and
    /// only then is the old block erased. A power cut leaves the old copy
    /// or the new one at the next attach, never a mix. May use the reserve.
    pub fn change(&self, lnum: Lnum, data: &[u8]) -> io::Result<()> {
        let ps = self.page_size();
        let chunks: Vec<&[u8]> = if data.is_empty() {
            vec![&[]]
        } else {
            data.chunks(ps).collect()
        };
        if chunks.len() > self.pages_per_leb() {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!("{} bytes do not fit one erase block", data.len()),
            ));
        }
        let mut st = self.lock();
        let peb = self.take_free(&mut st, true)?;
        self.write_copy(&mut st, lnum, &chunks, peb)?;
        self.wear_level(&mut st)
    }

    /// Writes `pages` as the new copy of `lnum` into the free block `peb`
    /// (already taken out of the pool) and erases the old copy.
    fn write_copy(&self, st: &mut State, lnum: Lnum, pages: &[&[u8]], peb: u32) -> io::Result<()> {
        st.seq += 1;
        let seq = st.seq;
        let count = pages.len() as u16;
        for (i, data) in pages.iter().enumerate() {
            let header = PageHeader {
                lnum,
                seq,
                used: data.len() as u16,
                count,
            };
            if let Err(e) = self.chip.program(peb, i as u32, data, &header.encode(data)) {
                // Not usable until erased; attach erases it if we die here.
                let _ = self.erase_to_free(st, peb);
                return Err(e);
            }
        }
        let used = pages.iter().map(|d| d.len() as u16).collect();
        let old = st.map.insert(lnum, Leb { peb, seq, used });
        if let Some(old) = old {
            if let Err(e) = self.erase_to_free(st, old.peb) {
                st.stale.push((lnum, old.peb));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Unmaps `lnum`, erasing its block: its bytes are gone from the chip.
    pub fn unmap(&self, lnum: Lnum) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(leb) = st.map.remove(&lnum) {
            if let Err(e) = self.erase_to_free(&mut st, leb.peb) {
                st.stale.push((lnum, leb.peb));
                return Err(e);
            }
            self.wear_level(&mut st)?;
        }
        Ok(())
    }

    /// The data of every copy of `lnum` still on the chip: the current one
    /// first, then older ones whose erase failed.
    pub fn copies(&self, lnum: Lnum) -> io::Result<Vec<Vec<u8>>> {
        let st = self.lock();
        let mut pebs: Vec<(u32, Vec<u16>)> = Vec::new();
        if let Some(l) = st.map.get(&lnum) {
            pebs.push((l.peb, l.used.clone()));
        }
        for &(_, peb) in st.stale.iter().filter(|(l, _)| *l == lnum) {
            pebs.push((peb, Vec::new()));
        }
        let mut out = Vec::new();
        for (peb, used) in pebs {
            let mut data = Vec::new();
            for page in 0..self.chip.programmed_pages(peb) {
                let (main, oob) = self.chip.read_page(peb, page)?;
                // A stale copy's lengths come from its own headers.
                let u = match used.get(page as usize) {
                    Some(&u) => u,
                    None => PageHeader::decode(&oob, Some(&main)).map_or(0, |h| h.used),
                };
                data.extend_from_slice(&main[..u as usize]);
            }
            out.push(data);
        }
        Ok(out)
    }

    /// Erases every block holding an older copy whose erase failed.
    pub fn erase_stale(&self) -> io::Result<()> {
        let mut st = self.lock();
        while let Some(&(_, peb)) = st.stale.last() {
            self.erase_to_free(&mut st, peb)?;
            st.stale.pop();
        }
        Ok(())
    }

    /// Takes the least-erased free block. Appends leave `reserve` blocks.
    fn take_free(&self, st: &mut State, may_use_reserve: bool) -> io::Result<u32> {
        let floor = if may_use_reserve {
            0
        } else {
            self.config.reserve as usize
        };
        if st.free.len() <= floor {
            return Err(io::Error::new(
                ErrorKind::StorageFull,
                "the NAND chip has no free erase block left",
            ));
        }
        let first = *st.free.iter().next().expect("checked non-empty");
        st.free.remove(&first);
        Ok(first.1)
    }

    /// Erases `peb` and returns it to the free pool; a block that goes bad
    /// (worn out) on the way leaves the pool for good.
    fn erase_to_free(&self, st: &mut State, peb: u32) -> io::Result<()> {
        match self.chip.erase(peb) {
            Ok(()) => {
                st.free.insert((self.chip.erase_count(peb), peb));
                Ok(())
            }
            Err(e) if is_bad_block(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Static wear levelling: while the most-worn free block has been erased
    /// more than `wl_threshold` times more than the least-worn block in use,
    /// the data of the latter moves to the former (so cold data stops
    /// sitting on a fresh block, which goes back into circulation).
    fn wear_level(&self, st: &mut State) -> io::Result<()> {
        // One move per call keeps every operation's cost bounded.
        let Some(&(max_free, _)) = st.free.iter().next_back() else {
            return Ok(());
        };
        let coldest = st
            .map
            .iter()
            .map(|(&lnum, leb)| (self.chip.erase_count(leb.peb), lnum))
            .min();
        let Some((min_used, lnum)) = coldest else {
            return Ok(());
        };
        if max_free <= min_used + self.config.wl_threshold {
            return Ok(());
        }
        let leb = st.map[&lnum].clone();
        let mut pages = Vec::with_capacity(leb.used.len());
        for (page, &u) in leb.used.iter().enumerate() {
            let (mut main, _) = self.chip.read_page(leb.peb, page as u32)?;
            main.truncate(u as usize);
            pages.push(main);
        }
        // The most-worn free block takes the cold data.
        let (_, target) = st.free.pop_last().expect("checked non-empty");
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        self.write_copy(st, lnum, &refs, target)?;
        st.moves += 1;
        Ok(())
    }
}

fn not_found(lnum: Lnum) -> io::Error {
    io::Error::new(ErrorKind::NotFound, format!("LEB {lnum} is not mapped"))
}

/// What a forensic reader recovers from one raw erase block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarvedBlock {
    pub lnum: Lnum,
    /// Sequence number of the copy.
    pub seq: u64,
    /// `(page, bytes in use)` of every page that checks out.
    pub pages: Vec<(usize, Vec<u8>)>,
}

/// Splits a raw erase block (as [`NandChip::chip_off`] returns it) into
/// the LEB it belongs to and the data of its valid pages; `None` for a
/// block without one valid page.
pub fn carve_block(raw: &[u8], geometry: crate::chip::Geometry) -> Option<CarvedBlock> {
    let rp = geometry.raw_page();
    let ps = geometry.page_size as usize;
    let mut first = None;
    let mut pages = Vec::new();
    for (i, page) in raw.chunks(rp).enumerate() {
        let (main, oob) = page.split_at(ps);
        let Some(h) = PageHeader::decode(oob, Some(main)) else {
            continue;
        };
        let (lnum, seq) = *first.get_or_insert((h.lnum, h.seq));
        if (h.lnum, h.seq) == (lnum, seq) {
            pages.push((i, main[..h.used as usize].to_vec()));
        }
    }
    first.map(|(lnum, seq)| CarvedBlock { lnum, seq, pages })
}

#[cfg(test)]
mod tests;
