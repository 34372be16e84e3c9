//! `NandChip`: a simulated raw NAND chip in an image file — program-once pages, block erases, wear, bad blocks, power cuts.
//!
//! The image file is a header (geometry and a per-block table the simulator
//! keeps: erase count, bad mark, programmed pages) followed by the data area,
//! page after page, each page's main bytes then its out-of-band (OOB) bytes:
//! exactly what a chip-off reader dumping the chip "raw with spare" sees.
//! Erased bytes read `0xFF`; a programmed page keeps its bytes until its
//! block is erased. Layout: docs/FORMAT.md, "Raw NAND image".

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

const MAGIC: &[u8; 8] = b"OUBLNAND";
const VERSION: u32 = 1;
/// Fixed part of the header; the per-block table follows.
const FIXED_LEN: usize = 64;
/// Per block: erase count (u32), flags (u16), programmed pages (u16).
const ENTRY_LEN: usize = 8;
const FLAG_BAD: u16 = 1;
/// Smallest OOB area: the UBI layer's page header needs 32 bytes.
pub const MIN_OOB: u32 = 32;

/// Shape of a chip, fixed when it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of a page's main area.
    pub page_size: u32,
    pub pages_per_block: u32,
    /// Erase blocks on the chip.
    pub blocks: u32,
    /// Out-of-band (spare) bytes per page.
    pub oob_bytes: u32,
}

impl Default for Geometry {
    /// A small real SLC chip: 2 KiB pages, 64 pages per block, 2,048 blocks
    /// (256 MiB), 64 spare bytes per page.
    fn default() -> Self {
        Geometry {
            page_size: 2048,
            pages_per_block: 64,
            blocks: 2048,
            oob_bytes: 64,
        }
    }
}

impl Geometry {
    /// Refuses shapes the layers above cannot use.
    pub fn validate(&self) -> io::Result<()> {
        let ok = (512..=32768).contains(&self.page_size)
            && self.page_size.is_power_of_two()
            && (4..=1024).contains(&self.pages_per_block)
            && (16..=1 << 20).contains(&self.blocks)
            && (MIN_OOB..=4096).contains(&self.oob_bytes)
            // A superblock (4 KiB) must fit one erase block.
            && self.page_size * self.pages_per_block >= 8192;
        if ok {
            Ok(())
        } else {
            Err(invalid(format!(
                "unsupported NAND geometry {self:?}: page size a power of two in 512..=32768, \
                 4..=1024 pages per block, at least 8 KiB per block, 16..=1048576 blocks, {MIN_OOB}..=4096 OOB bytes"
            )))
        }
    }

    /// Bytes of one page in the image: main area then OOB.
    pub fn raw_page(&self) -> usize {
        (self.page_size + self.oob_bytes) as usize
    }

    /// Bytes of one erase block in the image.
    pub fn raw_block(&self) -> usize {
        self.raw_page() * self.pages_per_block as usize
    }

    fn header_len(&self) -> u64 {
        let len = FIXED_LEN + ENTRY_LEN * self.blocks as usize;
        len.div_ceil(4096) as u64 * 4096
    }

    fn page_offset(&self, block: u32, page: u32) -> u64 {
        self.header_len()
            + (block as u64 * self.pages_per_block as u64 + page as u64) * self.raw_page() as u64
    }
}

/// Where the image lives: a file (the CLI) or memory (fast crash sweeps).
enum Backing {
    File(File),
    Memory(Vec<u8>),
}

impl Backing {
    fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.read_exact_at(buf, at),
            Backing::Memory(m) => {
                let at = at as usize;
                buf.copy_from_slice(&m[at..at + buf.len()]);
                Ok(())
            }
        }
    }
    fn write_at(&mut self, buf: &[u8], at: u64) -> io::Result<()> {
        match self {
            Backing::File(f) => f.write_all_at(buf, at),
            Backing::Memory(m) => {
                let at = at as usize;
                m[at..at + buf.len()].copy_from_slice(buf);
                Ok(())
            }
        }
    }
}

/// A power cut armed for a test: it strikes when the chip's operation
/// counter reaches `at`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    at: u64,
    /// For a program: how many of the page's raw bytes (main then OOB)
    /// reach the cells before the power goes (a torn program). `None`: none.
    torn: Option<usize>,
}

struct Inner {
    backing: Backing,
    erase_counts: Vec<u32>,
    flags: Vec<u16>,
    /// Pages programmed since the last erase (the next page to program).
    next_page: Vec<u16>,
    /// Program and erase operations since attach.
    ops: u64,
    erases: u64,
    cut: Option<Cut>,
    dead: bool,
    wear_limit: Option<u32>,
    /// Test switch: an erase that only pretends (the block's bytes go to
    /// `ghosts`, where a chip-off reader still finds them).
    erase_remaps: bool,
    ghosts: Vec<(u32, Vec<u8>)>,
    /// Test switch: every block's bytes just before each erase.
    history: Option<Vec<(u32, Vec<u8>)>>,
}

/// A simulated NAND chip. Pages are programmed once, in order, within a
/// block; a block must be erased (all bytes back to `0xFF`) before its
/// pages are programmed again. Every operation goes straight to the image
/// (as it goes straight to the cells of a chip); [`sync`](Self::sync) only
/// makes the image file durable against the host's own crashes.
pub struct NandChip {
    geometry: Geometry,
    path: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for NandChip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NandChip")
            .field("geometry", &self.geometry)
            .field("path", &self.path)
            .finish()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(ErrorKind::InvalidInput, msg)
}

/// The error of every operation after a simulated power cut.
pub fn power_cut() -> io::Error {
    io::Error::other("simulated power cut (NAND chip)")
}

/// Whether `e` is [`power_cut`].
pub fn is_power_cut(e: &io::Error) -> bool {
    e.kind() == ErrorKind::Other && e.to_string().starts_with("simulated power cut")
}

impl NandChip {
    /// Makes a new image file at `path` (refused if anything is there):
    /// every page erased, every erase count 0, the blocks in `bad` marked
    /// bad (factory bad blocks), and blocks going bad once erased
    /// `wear_limit` times if given.
    pub fn create(
        path: &Path,
        geometry: Geometry,
        bad: &[u32],
        wear_limit: Option<u32>,
    ) -> io::Result<NandChip> {
        let image = blank_image(geometry, bad, wear_limit)?;
        use std::os::unix::fs::OpenOptionsExt;
        // The image may hold the vault's sealed record: as private as a vault file.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.write_all_at(&image, 0)?;
        file.sync_all()?;
        let chip = Self::attach(Backing::File(file), Some(path.to_path_buf()))?;
        Ok(chip)
    }

    /// Opens an existing image file.
    pub fn open(path: &Path) -> io::Result<NandChip> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Self::attach(Backing::File(file), Some(path.to_path_buf()))
    }

    /// A new chip in memory (tests).
    pub fn in_memory(geometry: Geometry, bad: &[u32], wear_limit: Option<u32>) -> io::Result<Self> {
        Self::attach(
            Backing::Memory(blank_image(geometry, bad, wear_limit)?),
            None,
        )
    }

    /// A chip in memory holding `image` (what [`image`](Self::image)
    /// returned): the same chip powered up again after a cut.
    pub fn from_image(image: Vec<u8>) -> io::Result<NandChip> {
        Self::attach(Backing::Memory(image), None)
    }

    fn attach(backing: Backing, path: Option<PathBuf>) -> io::Result<NandChip> {
        let mut fixed = [0u8; FIXED_LEN];
        backing.read_at(&mut fixed, 0).map_err(|e| {
            if e.kind() == ErrorKind::UnexpectedEof {
                invalid("not a NAND image (too short)".into())
            } else {
                e
            }
        })?;
        if &fixed[..8] != MAGIC {
            return Err(invalid("not a NAND image (bad magic)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(fixed[o..o + 4].try_into().unwrap());
        if u32_at(8) != VERSION {
            return Err(invalid(format!("NAND image version {}", u32_at(8))));
        }
        let geometry = Geometry {
            page_size: u32_at(12),
            pages_per_block: u32_at(16),
            blocks: u32_at(20),
            oob_bytes: u32_at(24),
        };
        geometry.validate()?;
        let wear_limit = Some(u32_at(28)).filter(|&l| l != 0);
        let n = geometry.blocks as usize;
        let mut table = vec![0u8; ENTRY_LEN * n];
        backing.read_at(&mut table, FIXED_LEN as u64)?;
        let entry = |b: usize| &table[b * ENTRY_LEN..(b + 1) * ENTRY_LEN];
        let inner = Inner {
            erase_counts: (0..n)
                .map(|b| u32::from_le_bytes(entry(b)[..4].try_into().unwrap()))
                .collect(),
            flags: (0..n)
                .map(|b| u16::from_le_bytes(entry(b)[4..6].try_into().unwrap()))
                .collect(),
            next_page: (0..n)
                .map(|b| u16::from_le_bytes(entry(b)[6..8].try_into().unwrap()))
                .collect(),
            backing,
            ops: 0,
            erases: 0,
            cut: None,
            dead: false,
            wear_limit,
            erase_remaps: false,
            ghosts: Vec::new(),
            history: None,
        };
        let chip = NandChip {
            geometry,
            path,
            inner: Mutex::new(inner),
        };
        // The last block's last page must be inside the image.
        let end = geometry.page_offset(geometry.blocks - 1, geometry.pages_per_block - 1);
        let mut probe = vec![0u8; geometry.raw_page()];
        chip.lock()
            .backing
            .read_at(&mut probe, end)
            .map_err(|_| invalid("NAND image is truncated".into()))?;
        Ok(chip)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves the state consistent; a panic elsewhere does not poison it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The image file, if the chip lives in one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn check_addr(&self, block: u32, page: u32) -> io::Result<()> {
        if block >= self.geometry.blocks || page >= self.geometry.pages_per_block {
            return Err(invalid(format!(
                "no page {page} of block {block} on this chip"
            )));
        }
        Ok(())
    }

    /// Reads a page's main area and OOB (erased bytes read `0xFF`).
    pub fn read_page(&self, block: u32, page: u32) -> io::Result<(Vec<u8>, Vec<u8>)> {
        self.check_addr(block, page)?;
        let mut raw = vec![0u8; self.geometry.raw_page()];
        self.lock()
            .backing
            .read_at(&mut raw, self.geometry.page_offset(block, page))?;
        let oob = raw.split_off(self.geometry.page_size as usize);
        Ok((raw, oob))
    }

    /// Reads only a page's OOB (what a scan at attach reads).
    pub fn read_oob(&self, block: u32, page: u32) -> io::Result<Vec<u8>> {
        self.check_addr(block, page)?;
        let mut oob = vec![0u8; self.geometry.oob_bytes as usize];
        let at = self.geometry.page_offset(block, page) + self.geometry.page_size as u64;
        self.lock().backing.read_at(&mut oob, at)?;
        Ok(oob)
    }

    /// Programs a page: `main` (at most a page) and `oob` (at most the
    /// spare area); bytes not given stay `0xFF`. Only an erased page may
    /// be programmed, and only after every earlier programmed page of its
    /// block (pages are programmed in order).
    pub fn program(&self, block: u32, page: u32, main: &[u8], oob: &[u8]) -> io::Result<()> {
        self.check_addr(block, page)?;
        let g = self.geometry;
        if main.len() > g.page_size as usize || oob.len() > g.oob_bytes as usize {
            return Err(invalid(format!(
                "{} + {} bytes do not fit a {} + {} byte page",
                main.len(),
                oob.len(),
                g.page_size,
                g.oob_bytes
            )));
        }
        let mut inner = self.lock();
        inner.alive()?;
        if inner.flags[block as usize] & FLAG_BAD != 0 {
            return Err(bad_block(block));
        }
        let next = inner.next_page[block as usize] as u32;
        if page < next {
            return Err(invalid(format!(
                "page {page} of block {block} is not erased (pages up to {} are programmed): \
                 a NAND page is programmed once, in order, between erases",
                next - 1
            )));
        }
        let mut raw = vec![0xFFu8; g.raw_page()];
        raw[..main.len()].copy_from_slice(main);
        raw[g.page_size as usize..g.page_size as usize + oob.len()].copy_from_slice(oob);
        let torn = inner.strike()?;
        if let Some(keep) = torn {
            raw.truncate(keep.min(raw.len()));
        }
        inner.backing.write_at(&raw, g.page_offset(block, page))?;
        inner.next_page[block as usize] = page as u16 + 1;
        inner.write_entry(block)?;
        if torn.is_some() {
            inner.dead = true;
            return Err(power_cut());
        }
        Ok(())
    }

    /// Erases a block: every byte back to `0xFF`, its erase count + 1. A
    /// block erased past the wear limit goes bad and the erase fails.
    pub fn erase(&self, block: u32) -> io::Result<()> {
        self.check_addr(block, 0)?;
        let g = self.geometry;
        let mut inner = self.lock();
        inner.alive()?;
        let b = block as usize;
        if inner.flags[b] & FLAG_BAD != 0 {
            return Err(bad_block(block));
        }
        if inner.strike()?.is_some() {
            // An erase cut short is modelled as not done at all.
            inner.dead = true;
            return Err(power_cut());
        }
        let at = g.page_offset(block, 0);
        if inner.history.is_some() || inner.erase_remaps {
            let mut old = vec![0u8; g.raw_block()];
            inner.backing.read_at(&mut old, at)?;
            if inner.erase_remaps {
                inner.ghosts.push((block, old.clone()));
            }
            if let Some(h) = inner.history.as_mut() {
                h.push((block, old));
            }
        }
        inner.backing.write_at(&vec![0xFF; g.raw_block()], at)?;
        inner.erase_counts[b] += 1;
        inner.erases += 1;
        inner.next_page[b] = 0;
        let worn = matches!(inner.wear_limit, Some(l) if inner.erase_counts[b] >= l);
        if worn {
            inner.flags[b] |= FLAG_BAD;
        }
        inner.write_entry(block)?;
        if worn {
            return Err(bad_block(block));
        }
        Ok(())
    }

    /// Makes the image file durable (a no-op in memory).
    pub fn sync(&self) -> io::Result<()> {
        let inner = self.lock();
        inner.alive()?;
        match &inner.backing {
            Backing::File(f) => f.sync_data(),
            Backing::Memory(_) => Ok(()),
        }
    }

    pub fn is_bad(&self, block: u32) -> bool {
        self.lock()
            .flags
            .get(block as usize)
            .is_some_and(|f| f & FLAG_BAD != 0)
    }

    /// Pages of `block` programmed since its last erase.
    pub fn programmed_pages(&self, block: u32) -> u32 {
        self.lock().next_page[block as usize] as u32
    }

    pub fn erase_count(&self, block: u32) -> u32 {
        self.lock().erase_counts[block as usize]
    }

    /// Every block's erase count.
    pub fn erase_counts(&self) -> Vec<u32> {
        self.lock().erase_counts.clone()
    }

    /// Erases since this handle attached.
    pub fn erases_since_attach(&self) -> u64 {
        self.lock().erases
    }

    /// Program and erase operations since attach (the clock of [`arm_cut`](Self::arm_cut)).
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Test hook: the power goes when the operation counter reaches `at`.
    /// That operation does not happen, except that a program keeps the
    /// first `torn` raw bytes of its page when given (a torn program).
    /// Every later program, erase or sync fails with [`power_cut`].
    pub fn arm_cut(&self, at: u64, torn: Option<usize>) {
        self.lock().cut = Some(Cut { at, torn });
    }

    /// Whether a cut has struck.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Test hook (the adversary's control): erases leave the block's bytes
    /// where a chip-off reader finds them, as a device that remaps a block
    /// instead of erasing it would.
    pub fn set_erase_remaps(&self, on: bool) {
        self.lock().erase_remaps = on;
    }

    /// Test hook: keep every block's content just before each erase. With
    /// the current image, that is every state the chip ever had (a page
    /// changes only by being programmed, then by its block's erase).
    pub fn record_history(&self, on: bool) {
        self.lock().history = on.then(Vec::new);
    }

    /// The whole image (header and data area), e.g. to power a copy up
    /// again with [`from_image`](Self::from_image).
    pub fn image(&self) -> io::Result<Vec<u8>> {
        let inner = self.lock();
        let len = self.geometry.page_offset(self.geometry.blocks, 0) as usize;
        let mut out = vec![0u8; len];
        inner.backing.read_at(&mut out, 0)?;
        Ok(out)
    }

    /// What a chip-off reader gets now: every block's raw bytes, plus the
    /// blocks a remapping "erase" only pretended to erase.
    pub fn chip_off(&self) -> io::Result<Vec<(u32, Vec<u8>)>> {
        let g = self.geometry;
        let inner = self.lock();
        let mut out = Vec::with_capacity(g.blocks as usize);
        for b in 0..g.blocks {
            let mut raw = vec![0u8; g.raw_block()];
            inner.backing.read_at(&mut raw, g.page_offset(b, 0))?;
            out.push((b, raw));
        }
        out.extend(inner.ghosts.iter().cloned());
        Ok(out)
    }

    /// Every block content ever erased (with [`record_history`](Self::record_history) on).
    pub fn history(&self) -> Vec<(u32, Vec<u8>)> {
        self.lock().history.clone().unwrap_or_default()
    }
}

impl Inner {
    fn alive(&self) -> io::Result<()> {
        if self.dead {
            Err(power_cut())
        } else {
            Ok(())
        }
    }

    /// Counts one operation and fires an armed cut: `Err` when the
    /// operation must not happen at all, `Ok(Some(n))` when a program is
    /// torn after `n` bytes.
    fn strike(&mut self) -> io::Result<Option<usize>> {
        let now = self.ops;
        self.ops += 1;
        match self.cut {
            Some(cut) if cut.at == now => match cut.torn {
                Some(n) => Ok(Some(n)),
                None => {
                    self.dead = true;
                    Err(power_cut())
                }
            },
            _ => Ok(None),
        }
    }

    fn write_entry(&mut self, block: u32) -> io::Result<()> {
        let b = block as usize;
        let mut e = [0u8; ENTRY_LEN];
        e[..4].copy_from_slice(&self.erase_counts[b].to_le_bytes());
        e[4..6].copy_from_slice(&self.flags[b].to_le_bytes());
        e[6..8].copy_from_slice(&self.next_page[b].to_le_bytes());
        self.backing
            .write_at(&e, (FIXED_LEN + b * ENTRY_LEN) as u64)
    }
}

fn bad_block(block: u32) -> io::Error {
    io::Error::other(format!("NAND block {block} is bad"))
}

/// Whether `e` is a bad-block refusal.
pub fn is_bad_block(e: &io::Error) -> bool {
    e.to_string().contains(" is bad")
}

fn blank_image(geometry: Geometry, bad: &[u32], wear_limit: Option<u32>) -> io::Result<Vec<u8>> {
    geometry.validate()?;
    if let Some(b) = bad.iter().find(|&&b| b >= geometry.blocks) {
        return Err(invalid(format!("bad block {b} is not on the chip")));
    }
    let header = geometry.header_len() as usize;
    let mut image = vec![0xFFu8; geometry.page_offset(geometry.blocks, 0) as usize];
    image[..header].fill(0);
    image[..8].copy_from_slice(MAGIC);
    for (o, v) in [
        (8, VERSION),
        (12, geometry.page_size),
        (16, geometry.pages_per_block),
        (20, geometry.blocks),
        (24, geometry.oob_bytes),
        (28, wear_limit.unwrap_or(0)),
    ] {
        image[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    for &b in bad {
        let at = FIXED_LEN + b as usize * ENTRY_LEN + 4;
        image[at..at + 2].copy_from_slice(&FLAG_BAD.to_le_bytes());
    }
    Ok(image)
}

#[cfg(test)]
mod tests;
