//! Plain-file baselines on the same file system: sequential `write_all` + `sync_all`, reads, random 4 KiB `pwrite` + sync.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

use crate::report::MIB;

/// Evicts a file's (clean) pages from the page cache with
/// `posix_fadvise(DONTNEED)`, so the next read goes to the device.
pub fn evict(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: plain syscall on a file descriptor we own for the whole call.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Evicts every regular file under `dir` (recursively).
pub fn evict_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            evict_tree(&entry.path())?;
        } else if ty.is_file() {
            evict(&entry.path())?;
        }
    }
    Ok(())
}

/// Timings of a sequential write: the `write_all` calls and the final `sync_all`.
pub struct SeqWrite {
    pub write_s: f64,
    pub sync_s: f64,
}

/// Writes `mib` MiB in 1 MiB `write_all` calls, then `sync_all`.
pub fn seq_write(
    path: &Path,
    mib: u64,
    chunk: &mut dyn FnMut(u64) -> Vec<u8>,
) -> io::Result<SeqWrite> {
    let mut f = File::create(path)?;
    let start = Instant::now();
    for i in 0..mib {
        f.write_all(&chunk(i))?;
    }
    let write_s = start.elapsed().as_secs_f64();
    f.sync_all()?;
    Ok(SeqWrite {
        write_s,
        sync_s: start.elapsed().as_secs_f64() - write_s,
    })
}

/// Reads the whole file in 1 MiB `read_exact` calls; returns seconds.
pub fn seq_read(path: &Path) -> io::Result<(u64, f64)> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; MIB as usize];
    let start = Instant::now();
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        f.read_exact(&mut buf[..n])?;
        left -= n as u64;
    }
    Ok((len, start.elapsed().as_secs_f64()))
}

/// Random writes: a sparse file of `span` bytes, one `pwrite` of `block` at
/// each offset, then `sync_all`. Returns (write seconds, sync seconds).
pub fn rand_write(path: &Path, span: u64, offsets: &[u64], block: &[u8]) -> io::Result<SeqWrite> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    f.set_len(span)?;
    f.sync_all()?;
    let start = Instant::now();
    for &off in offsets {
        f.write_all_at(block, off)?;
    }
    let write_s = start.elapsed().as_secs_f64();
    f.sync_all()?;
    Ok(SeqWrite {
        write_s,
        sync_s: start.elapsed().as_secs_f64() - write_s,
    })
}
