//! oubli-nand: a simulated raw NAND chip, a UBI-like layer over it, oubli's medium and a vault on it (`--store nand:IMAGE`, `--vault nand`).
//!
//! * [`NandChip`]: the chip in an image file — programs, erases, wear, bad
//!   blocks, power cuts with torn programs.
//! * [`Ubi`]: logical erase blocks, mapping rebuilt at attach from the OOB
//!   headers, atomic block change, wear levelling.
//! * [`NandMedium`]: the `Medium` (segments are runs of erase blocks;
//!   deleting one erases them).
//! * [`NandVault`]: the epoch key in an erase block of the same chip.
//! * [`Wear`]: erase counts, Hoover index and projected lifetime.
//!
//! On this medium deletion is physical as well as cryptographic: an erase
//! leaves nothing for a chip-off reader. See docs/DESIGN.md ("Raw NAND
//! simulator") and docs/FORMAT.md ("Raw NAND image").

mod chip;
mod medium;
mod ubi;
mod vault;
mod wear;

pub use chip::{is_bad_block, is_power_cut, power_cut, Geometry, NandChip, MIN_OOB};
pub use medium::{
    Carved, NandMedium, FIRST_SEGMENT_LNUM, LEBS_PER_SEGMENT, LNUM_SUPERBLOCK, LNUM_VAULT,
    SEGMENT_BLOCKS,
};
pub use ubi::{carve_block, CarvedBlock, Lnum, Ubi, UbiConfig, HEADER_LEN};
pub use vault::NandVault;
pub use wear::{Wear, RATED_CYCLES};

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// Attached chips of this process by image path: the medium and the vault
/// of one store share one UBI layer (two attachments of one image would
/// each believe they own its free blocks).
static ATTACHED: Mutex<Vec<(PathBuf, Weak<Ubi>)>> = Mutex::new(Vec::new());

/// The UBI layer of the image at `path`, attached once per process.
pub fn attach(path: &Path) -> io::Result<Arc<Ubi>> {
    let key = std::fs::canonicalize(path)?;
    let mut attached = ATTACHED.lock().unwrap_or_else(|e| e.into_inner());
    attached.retain(|(_, w)| w.strong_count() > 0);
    if let Some(ubi) = attached
        .iter()
        .find(|(p, _)| *p == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(ubi);
    }
    let chip = Arc::new(NandChip::open(path)?);
    let ubi = Arc::new(Ubi::attach(chip, UbiConfig::default())?);
    attached.push((key, Arc::downgrade(&ubi)));
    Ok(ubi)
}

/// Makes a new chip image at `path` (refused if anything is there) and attaches it.
pub fn format(path: &Path, geometry: Geometry) -> io::Result<Arc<Ubi>> {
    NandChip::create(path, geometry, &[], None)?;
    attach(path)
}

/// The store medium on the image at `path`.
pub fn open_medium(path: &Path) -> io::Result<NandMedium> {
    NandMedium::new(attach(path)?)
}

/// Parses `PAGExPAGESxBLOCKS[xOOB]` (e.g. `2048x64x2048x64`), the
/// geometry option of `oubli init`.
pub fn parse_geometry(text: &str) -> Result<Geometry, String> {
    let parts: Vec<&str> = text.split(['x', 'X']).collect();
    let nums: Result<Vec<u32>, _> = parts.iter().map(|p| p.trim().parse::<u32>()).collect();
    let bad = || {
        format!(
            "{text:?}: expected PAGE_SIZExPAGES_PER_BLOCKxBLOCKS[xOOB_BYTES], e.g. 2048x64x2048x64"
        )
    };
    let nums = nums.map_err(|_| bad())?;
    let g = match nums[..] {
        [page_size, pages_per_block, blocks] => Geometry {
            page_size,
            pages_per_block,
            blocks,
            oob_bytes: Geometry::default().oob_bytes,
        },
        [page_size, pages_per_block, blocks, oob_bytes] => Geometry {
            page_size,
            pages_per_block,
            blocks,
            oob_bytes,
        },
        _ => return Err(bad()),
    };
    g.validate().map_err(|e| e.to_string())?;
    Ok(g)
}
