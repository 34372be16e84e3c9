//! The mount's backing device in sysfs: its readahead window and its share of the system's dirty pages, both set small by the kernel for every FUSE mount and raised here (as root).
//!
//! A FUSE mount's backing device (`/sys/class/bdi/MAJOR:MINOR`) starts with
//! the kernel's defaults for any FUSE server, trusted or not:
//!
//! * **Readahead window 128 KiB**, and the `max_readahead` a file system
//!   negotiates can only lower it. With 128 KiB a sequential reader gets
//!   128 KiB requests one or two at a time; with 1 MiB the kernel asks ahead
//!   in 1 MiB requests (FUSE `max_pages`): 1.40–1.45 GB/s against
//!   1.09–1.23 GB/s for 1 GiB read in 1 MiB calls (FUSE.md).
//! * **1 % of the system's dirty-page limit** (`max_ratio`, under
//!   `strict_limit`), against the whole limit for a local file system: with
//!   the writeback cache a writer is throttled, and the kernel writes back
//!   page by page, once its file has a few tens of MiB dirty. At 10 %
//!   buffered random 4 KiB writes into 256 MiB went from 306–345 MB/s to
//!   847–1,060 MB/s (FUSE.md, "The writeback cache").

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The share of the system's dirty-page limit a mount takes as root unless
/// told otherwise (`-o dirty_share=PERCENT`), in percent: the kernel gives
/// FUSE mounts 1.
pub const DEFAULT_DIRTY_SHARE: u32 = 10;

/// The sysfs directory of the backing device of the file system mounted at `mountpoint`.
pub fn sysfs_dir(mountpoint: &Path) -> io::Result<PathBuf> {
    // stat is answered by the mount itself: call this once it serves requests.
    let dev = std::fs::metadata(mountpoint)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Ok(PathBuf::from(format!("/sys/class/bdi/{major}:{minor}")))
}

fn get(mountpoint: &Path, file: &str) -> io::Result<u32> {
    let text = std::fs::read_to_string(sysfs_dir(mountpoint)?.join(file))?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("{file}: {text:?}")))
}

fn set(mountpoint: &Path, file: &str, value: u32) -> io::Result<()> {
    std::fs::write(sysfs_dir(mountpoint)?.join(file), format!("{value}\n"))
}

/// The mount's readahead window in KiB.
pub fn readahead(mountpoint: &Path) -> io::Result<u32> {
    get(mountpoint, "read_ahead_kb")
}

/// Sets the mount's readahead window to `kib` KiB (needs root).
pub fn set_readahead(mountpoint: &Path, kib: u32) -> io::Result<()> {
    set(mountpoint, "read_ahead_kb", kib)
}

/// The mount's share of the system's dirty-page limit, in percent.
pub fn dirty_share(mountpoint: &Path) -> io::Result<u32> {
    get(mountpoint, "max_ratio")
}

/// Sets the mount's share of the system's dirty-page limit to `percent` (needs root).
pub fn set_dirty_share(mountpoint: &Path, percent: u32) -> io::Result<()> {
    set(mountpoint, "max_ratio", percent)
}
