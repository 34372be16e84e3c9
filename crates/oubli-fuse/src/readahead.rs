//! The mount's readahead window: the kernel starts every FUSE mount at 128 KiB, whatever the file system asks, so oubli raises it through sysfs (as root).
//!
//! A FUSE mount's backing device (`/sys/class/bdi/MAJOR:MINOR`) starts with
//! the kernel's default window, and the `max_readahead` a file system
//! negotiates can only lower it. With 128 KiB, a sequential reader gets
//! 128 KiB requests one or two at a time; with 1 MiB, the kernel asks ahead
//! in 1 MiB requests (FUSE `max_pages`), which measured 1.40–1.45 GB/s
//! against 1.09–1.23 GB/s for 1 GiB read in 1 MiB calls (FUSE.md).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The sysfs file holding the readahead window of the file system mounted at `mountpoint`.
pub fn sysfs_path(mountpoint: &Path) -> io::Result<PathBuf> {
    // stat is answered by the mount itself: call this once it serves requests.
    let dev = std::fs::metadata(mountpoint)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Ok(PathBuf::from(format!(
        "/sys/class/bdi/{major}:{minor}/read_ahead_kb"
    )))
}

/// The mount's readahead window in KiB.
pub fn get(mountpoint: &Path) -> io::Result<u32> {
    let text = std::fs::read_to_string(sysfs_path(mountpoint)?)?;
    text.trim().parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("read_ahead_kb: {text:?}"),
        )
    })
}

/// Sets the mount's readahead window to `kib` KiB (needs root).
pub fn set(mountpoint: &Path, kib: u32) -> io::Result<()> {
    std::fs::write(sysfs_path(mountpoint)?, format!("{kib}\n"))
}
