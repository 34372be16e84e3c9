//! Small shared helpers: a seeded PRNG, a non-cryptographic checksum, error constructors, a writeback hint.

use std::io;

/// SplitMix64: tiny, seedable and good enough to pick crash outcomes and
/// bit flips deterministically. Not for anything secret.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-ish value in `0..n` (`n > 0`); the modulo bias is irrelevant here.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

/// FNV-1a, 64 bit. Used only to notice torn or foreign headers on the file
/// medium; integrity against an adversary is the engine's job.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(crate) fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

pub(crate) fn invalid_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

pub(crate) fn eof(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, msg.into())
}

pub(crate) fn not_found(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, msg.into())
}

pub(crate) fn storage_full(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, msg.into())
}

/// A sync that failed for want of room: the kernel may have dropped the
/// pages it could not write back (after a failed `fsync`, Linux marks them
/// clean), so unlike a failed append this may have lost earlier writes.
/// The `Medium` contract keeps `StorageFull` for failures that lost
/// nothing; this one is reported as an I/O error, which poisons the store.
pub(crate) fn sync_failed(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => io::Error::other(format!(
            "writing back what was appended failed for want of space, and may have lost it: {e}"
        )),
        _ => e,
    }
}

/// Checks the length/offset rules every medium shares for `append`.
pub(crate) fn check_append_bounds(capacity: u64, offset: u64, len: usize) -> io::Result<()> {
    let end = offset
        .checked_add(len as u64)
        .ok_or_else(|| invalid_input("append: offset overflow"))?;
    if end > capacity {
        return Err(invalid_input(format!(
            "append: segment would reach {end} bytes, capacity is {capacity}"
        )));
    }
    Ok(())
}

/// Checks that a rewrite lies inside the `len` bytes appended to segment `id`.
pub(crate) fn check_rewrite_bounds(id: u32, len: u64, offset: u64, n: usize) -> io::Result<()> {
    match offset.checked_add(n as u64) {
        Some(end) if end <= len => Ok(()),
        _ => Err(invalid_input(format!(
            "rewrite of {n} bytes at {offset} of segment {id:08x}, which holds {len}"
        ))),
    }
}

/// Checks the superblock size limit every medium shares.
pub(crate) fn check_superblock_len(len: usize) -> io::Result<()> {
    if len > oubli_core::SUPERBLOCK_MAX {
        return Err(invalid_input(format!(
            "superblock of {len} bytes exceeds the {} byte maximum",
            oubli_core::SUPERBLOCK_MAX
        )));
    }
    Ok(())
}

/// Maps `File::try_lock`'s error to io::Error, with a message saying why.
pub(crate) fn lock_exclusive(file: &std::fs::File, what: &str) -> io::Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{what} is already open (locked by another handle or process)"),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

pub(crate) fn lock_shared(file: &std::fs::File, what: &str) -> io::Result<()> {
    match file.try_lock_shared() {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{what} is open for writing by another handle or process"),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Every this many appended bytes, a segment's new bytes are handed to the
/// kernel's writeback at once, without waiting (`sync_file_range`). A
/// log-structured store writes every byte it is given, overwrites included,
/// and `sync` must then wait for all that the page cache holds: handed over
/// as it comes, most of it is already on disk when the client flushes, and
/// the disk works while the client writes instead of after. Measured with
/// ext4 on an NBD export (docs/NBD.md, Performance): 1–2 MiB did best;
/// 32 MiB gained little over none.
pub(crate) const WRITEBACK_HINT: u64 = 2 << 20;

/// The range of a segment to hand to writeback now that it reaches `end`
/// (offsets within the segment), if [`WRITEBACK_HINT`] bytes have been
/// appended since `hinted_to`, which then moves to `end`.
pub(crate) fn writeback_due(hinted_to: &mut u64, end: u64) -> Option<(u64, u64)> {
    let from = (*hinted_to).min(end);
    if end - from < WRITEBACK_HINT {
        return None;
    }
    *hinted_to = end;
    Some((from, end - from))
}

/// Asks the kernel to start writing `len` bytes at `offset` of `file` to
/// disk and returns without waiting for them. Only a hint: durability still
/// comes from the fsync at the next `sync`, which also reports any error.
pub(crate) fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: FFI on a descriptor `file` keeps open for the call; no memory is passed.
    unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_deterministic() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = SplitMix64::new(8);
        assert_ne!(SplitMix64::new(7).next_u64(), c.next_u64());
    }

    #[test]
    fn writeback_is_asked_for_every_hint_of_new_bytes() {
        let mut hinted_to = 0;
        assert_eq!(writeback_due(&mut hinted_to, WRITEBACK_HINT - 1), None);
        assert_eq!(hinted_to, 0);
        assert_eq!(
            writeback_due(&mut hinted_to, WRITEBACK_HINT + 10),
            Some((0, WRITEBACK_HINT + 10))
        );
        assert_eq!(hinted_to, WRITEBACK_HINT + 10);
        assert_eq!(writeback_due(&mut hinted_to, 2 * WRITEBACK_HINT), None);
        // A segment reopened shorter than the last hint (a failed append
        // made its length unknown) starts counting from where it ends.
        let mut hinted_to = 3 * WRITEBACK_HINT;
        assert_eq!(writeback_due(&mut hinted_to, WRITEBACK_HINT), None);
        assert_eq!(
            writeback_due(&mut hinted_to, 3 * WRITEBACK_HINT),
            None,
            "the bytes up to the old hint were handed over already"
        );
    }

    #[test]
    fn fnv_known_value() {
        // Reference value of FNV-1a 64 for "a".
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn bounds() {
        assert!(check_append_bounds(10, 5, 5).is_ok());
        assert_eq!(
            check_append_bounds(10, 5, 6).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(check_append_bounds(u64::MAX, u64::MAX, 1).is_err());
        assert!(check_superblock_len(4096).is_ok());
        assert!(check_superblock_len(4097).is_err());
    }
}
