//! The `Medium` seam: where ciphertext goes (append-only segments plus two superblock slots).

use std::io;

/// Segment identifier. Ids grow monotonically and are never reused by the engine.
pub type SegmentId = u32;

/// Largest superblock a medium must be able to hold in one slot.
pub const SUPERBLOCK_MAX: usize = 4096;

/// One of the two superblock slots (written alternately, see docs/DESIGN.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    A,
    B,
}

impl Slot {
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }
    pub fn index(self) -> usize {
        match self {
            Slot::A => 0,
            Slot::B => 1,
        }
    }
}

/// How much room a medium has: what [`Medium::space`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes the medium holds in all (the file system's or chip's size).
    pub total: u64,
    /// Bytes appends may still take now (for a directory, what the file
    /// system gives an unprivileged user: `f_bavail`).
    pub free: u64,
}

/// Storage for ciphertext. The engine is its only user and relies on no more
/// than this:
///
/// * **Segments** are append-only byte strings named by [`SegmentId`]. The
///   engine writes each byte once (`append` at the segment's end) and
///   rewrites none that anything durable may name (the one rewrite it makes,
///   [`rewrite`](Medium::rewrite), is optional and covers a unit nothing
///   but its memory names); it reads back only what it appended. A medium that cannot
///   tell a segment's true end may return stale bytes past it: every unit is
///   authenticated, so the engine never trusts such bytes.
/// * **Superblock slots**: two small in-place slots. A torn write may garble
///   the slot being written, never the other one.
/// * **Ordering**: nothing is durable until [`sync`](Medium::sync) returns;
///   after it returns, every earlier append, superblock write and deletion is.
///   Writes between two syncs may be lost, reordered or torn by a power cut.
///
/// What the medium does *not* need to do: overwrite or erase anything. Old
/// copies of segments and slots may live forever (SSD controllers,
/// snapshots, backups); the key tree makes them unreadable.
///
/// Errors are `std::io::Error`; `ErrorKind::StorageFull` means out of space,
/// `UnexpectedEof` a read past what the segment holds, `NotFound` a missing
/// segment.
///
/// **Out of room** (`StorageFull`, or `QuotaExceeded`) is a promise that
/// the failed call changed nothing the engine relies on: an `append` left
/// the segment's length where it was (bytes of a torn prefix may stay
/// behind it, never shown: the next append at that offset replaces them),
/// a `sync` lost none of the writes before it (a later sync still makes
/// them durable), a `write_superblock` left the other slot alone. The
/// engine then does not poison the store: it undoes or keeps for a retry
/// what it changed in memory and answers `NoSpace` (DESIGN §7, "A full
/// medium"). A medium that cannot keep that promise — a file system whose
/// `fsync` reports ENOSPC may have dropped the pages it could not write
/// back, a flash page programmed cannot be taken back — reports such a
/// failure as another error, which poisons the store until it is reopened.
pub trait Medium: Send + Sync {
    /// Human-readable location, e.g. `dir:/srv/store`.
    fn describe(&self) -> String;
    /// Largest size a single segment may reach on this medium.
    fn segment_capacity(&self) -> u64;
    /// Writes `data` at `offset` of segment `id`, creating the segment when
    /// `offset` is 0. `offset` must be the segment's current length.
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Fills `buf` from `offset` of segment `id`.
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Bytes held by segment `id` (an upper bound on media that do not track
    /// lengths), or `None` if it does not exist.
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>>;
    /// Every existing segment, ascending.
    fn list_segments(&self) -> io::Result<Vec<SegmentId>>;
    /// Removes a segment (idempotent). Space reclamation only: security never
    /// depends on the bytes going away. The engine calls it from a thread of
    /// its own, beside appends, reads and syncs of *other* segments; nobody
    /// uses a segment while it is deleted (DESIGN §7).
    fn delete_segment(&self, id: SegmentId) -> io::Result<()>;
    /// Makes every earlier write and deletion durable.
    fn sync(&self) -> io::Result<()>;
    /// The content of a slot, or `None` if it was never written.
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>>;
    /// Replaces a slot's content (at most [`SUPERBLOCK_MAX`] bytes).
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()>;
    /// Whether a power cut can only ever leave the appends made since the
    /// last sync up to some point, in the order they were made: never a
    /// later append without every earlier one (the last survivor may be
    /// torn). On such a medium the engine skips the syncs whose only job is
    /// ordering — a flush is then one sync, which on object storage is one
    /// request instead of three. Default `false`: appends between two syncs
    /// may land in any order.
    fn keeps_append_order(&self) -> bool {
        false
    }
    /// A hint: segment `id` (which exists, or is created empty) will take
    /// many small appends up to about `upto` bytes, each followed by a
    /// sync — the intent log. A medium may prepare the room so that such an
    /// append is cheaper to make durable (`DirMedium` writes zeros ahead:
    /// an append inside them changes no file-system metadata, so its
    /// `fdatasync` writes the data and flushes the device cache, nothing
    /// more). The segment's length stays what was appended; `segment_len`
    /// may count the prepared room once the medium is reopened (an upper
    /// bound, as on media that do not track lengths), and reads there see
    /// zeros. Default: nothing.
    fn reserve(&self, id: SegmentId, upto: u64) -> io::Result<()> {
        let _ = (id, upto);
        Ok(())
    }
    /// A hint: segment `id` takes no more appends and ends at `len`; a
    /// medium may give back the room [`reserve`](Self::reserve) prepared
    /// past it. Default: nothing.
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        let _ = (id, len);
        Ok(())
    }
    /// The medium's size and the room left for appends, if it can tell
    /// (`None`: unknown, e.g. object storage). The engine keeps a reserve
    /// of it for deletes, commits, the cleaner and opening, and refuses
    /// new data with `NoSpace` once only the reserve remains (DESIGN §7,
    /// "A full medium"). Asked at most about once a second while writes
    /// come, and at every write once the room is nearly gone: it should
    /// be a system call, not a scan. Default `None`.
    fn space(&self) -> io::Result<Option<Space>> {
        Ok(None)
    }
    /// Whether [`rewrite`](Self::rewrite) works here. Default `false`: raw
    /// flash cannot program a page twice, and an object store takes whole
    /// objects.
    fn can_rewrite(&self) -> bool {
        false
    }
    /// Writes `data` over bytes `offset..offset + data.len()` of segment
    /// `id`, which were appended earlier (the segment's length does not
    /// change). The engine calls it only over units that no durable state
    /// and no write in flight names — appended since the last intent-log
    /// frame and tree capture, now replaced by units of the same lengths,
    /// one or a run of consecutive ones (DESIGN §7, "Overwrites in place")
    /// — so the ordering rule is the append's: nothing is durable until
    /// the next [`sync`](Self::sync), and a power cut before it may leave
    /// the old bytes, the new ones or any mix. What it saves is bytes: a
    /// page the kernel has not yet written back takes the overwrite in
    /// memory. Default: `Unsupported`.
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        let _ = (id, offset, data);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this medium does not rewrite",
        ))
    }
}

impl<M: Medium + ?Sized> Medium for std::sync::Arc<M> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn segment_capacity(&self) -> u64 {
        (**self).segment_capacity()
    }
    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        (**self).append(id, offset, data)
    }
    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read(id, offset, buf)
    }
    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        (**self).segment_len(id)
    }
    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        (**self).list_segments()
    }
    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        (**self).delete_segment(id)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        (**self).read_superblock(slot)
    }
    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        (**self).write_superblock(slot, data)
    }
    fn keeps_append_order(&self) -> bool {
        (**self).keeps_append_order()
    }
    fn reserve(&self, id: SegmentId, upto: u64) -> io::Result<()> {
        (**self).reserve(id, upto)
    }
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        (**self).finish_segment(id, len)
    }
    fn space(&self) -> io::Result<Option<Space>> {
        (**self).space()
    }
    fn can_rewrite(&self) -> bool {
        (**self).can_rewrite()
    }
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        (**self).rewrite(id, offset, data)
    }
}
