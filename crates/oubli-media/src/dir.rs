//! `DirMedium`: the embedded default medium, one file per segment in a directory.
//!
//! Layout (see docs/FORMAT-media.md):
//!
//! ```text
//! ROOT/oubli-medium          marker: "oubli dir medium\nversion 1\n"
//! ROOT/super.a, super.b      superblock slots (replaced by rename)
//! ROOT/segments/XXXXXXXX.seg one file per segment, id as 8 lowercase hex digits
//! ```
//!
//! Durability follows the trait: appends and deletions become durable at the
//! next `sync`, which fsyncs every segment file written since the previous
//! sync and then the directories whose entries changed. Superblock writes go
//! to `super.X.tmp`, are fsynced and renamed over `super.X`, so a slot is
//! always either the old or the new content, never torn; the rename itself
//! becomes durable at the next `sync` (directory fsync).

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use oubli_core::{Medium, SegmentId, Slot};

use crate::util::{
    check_append_bounds, check_rewrite_bounds, check_superblock_len, eof, invalid_data,
    invalid_input, lock_exclusive, lock_shared, not_found, start_writeback, writeback_due,
};

/// Name of the marker file that says "this directory is an oubli store".
pub const DIR_MARKER: &str = "oubli-medium";
/// Content of the marker file (format version 1).
const DIR_MARKER_V1: &[u8] = b"oubli dir medium\nversion 1\n";
const SEGMENTS: &str = "segments";

/// Segment files kept open for appending. The engine appends to one or two
/// segments at a time (log + cleaner), so a handful is plenty.
const WRITER_CACHE: usize = 4;
/// The most [`Medium::reserve`] writes ahead of a segment's end.
const RESERVE_MAX: u64 = 4 << 20;

/// Whether `file` holds only zeros in `from..to`.
fn zeros_from(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; (to - from) as usize];
    file.read_exact_at(&mut buf, from)?;
    Ok(buf.iter().all(|&b| b == 0))
}

/// Segment files kept open for reading (reads hop between many segments).
const READER_CACHE: usize = 32;

/// A tiny most-recently-used list; linear search is faster than hashing at
/// these sizes.
#[derive(Debug)]
struct Mru<T> {
    cap: usize,
    items: Vec<(SegmentId, T)>,
}

impl<T> Mru<T> {
    fn new(cap: usize) -> Self {
        Mru {
            cap,
            items: Vec::with_capacity(cap),
        }
    }

    /// Looks `id` up and moves it to the front.
    fn get(&mut self, id: SegmentId) -> Option<&mut T> {
        let i = self.items.iter().position(|(k, _)| *k == id)?;
        let item = self.items.remove(i);
        self.items.insert(0, item);
        Some(&mut self.items[0].1)
    }

    fn insert(&mut self, id: SegmentId, v: T) {
        self.remove(id);
        if self.items.len() == self.cap {
            self.items.pop();
        }
        self.items.insert(0, (id, v));
    }

    fn remove(&mut self, id: SegmentId) -> Option<T> {
        let i = self.items.iter().position(|(k, _)| *k == id)?;
        Some(self.items.remove(i).1)
    }
}

#[derive(Debug)]
struct Writer {
    file: Arc<File>,
    /// The segment's length as we wrote it; `append` checks against it.
    len: u64,
    /// Where the kernel was last asked to start writing out (see [`WRITEBACK_HINT`](crate::util::WRITEBACK_HINT)).
    hinted_to: u64,
    /// The file's size when zeros were written past `len` ([`Medium::reserve`]).
    zeroed_to: u64,
}

#[derive(Debug)]
struct DirState {
    writers: Mru<Writer>,
    readers: Mru<Arc<File>>,
    /// Handles for rewriting segments that are no longer appended to.
    rewriters: Mru<Arc<File>>,
    /// How long each segment this handle appended to is (finished or not;
    /// forgotten when it is deleted): `rewrite` writes only inside these.
    appended: HashMap<SegmentId, u64>,
    /// Segments written since the last successful sync. Kept by id rather
    /// than by handle so that evicting a handle from the cache does not lose
    /// the obligation to fsync it (fsync flushes the file, whatever fd).
    dirty: BTreeSet<SegmentId>,
    /// `segments/` gained or lost an entry since the last sync.
    segdir_dirty: bool,
    /// A superblock was renamed into the root since the last sync.
    root_dirty: bool,
}

/// A store kept as a directory of segment files. See module docs.
#[derive(Debug)]
pub struct DirMedium {
    root: PathBuf,
    segdir: PathBuf,
    /// Open marker file holding an exclusive advisory lock, so two handles
    /// (in this or another process) never write the same store.
    _lock: File,
    /// Opened with [`DirMedium::open_read_only`]: writes are refused.
    read_only: bool,
    state: Mutex<DirState>,
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

fn slot_name(slot: Slot) -> &'static str {
    match slot {
        Slot::A => "super.a",
        Slot::B => "super.b",
    }
}

/// Parses `XXXXXXXX.seg` (exactly 8 lowercase hex digits).
fn parse_segment_name(name: &str) -> Option<SegmentId> {
    let hex = name.strip_suffix(".seg")?;
    if hex.len() != 8 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

impl DirMedium {
    /// Creates a new store at `path` (creating the directory if needed) and
    /// opens it. An existing directory is accepted if it holds no store (a
    /// mount point with `lost+found` is fine); one that already holds a
    /// store fails with `AlreadyExists`.
    pub fn create(path: impl AsRef<Path>) -> io::Result<DirMedium> {
        let root = path.as_ref();
        if root.exists() {
            if !root.is_dir() {
                return Err(invalid_input(format!(
                    "{} exists and is not a directory",
                    root.display()
                )));
            }
            for name in [DIR_MARKER, SEGMENTS, "super.a", "super.b"] {
                if root.join(name).exists() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} already holds an oubli store", root.display()),
                    ));
                }
            }
        }
        // Owner only: names and sizes of segments are metadata too, and a
        // store directory holds the control socket.
        {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root)?;
            fs::DirBuilder::new()
                .mode(0o700)
                .create(root.join(SEGMENTS))?;
        }
        // The marker goes in last and atomically: a directory with a marker
        // is a complete (empty) store.
        let tmp = root.join(format!("{DIR_MARKER}.tmp"));
        {
            let mut f = create_private(&tmp)?;
            f.write_all(DIR_MARKER_V1)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, root.join(DIR_MARKER))?;
        fsync_dir(root)?;
        // Make the directory's own entry durable too (best effort: the
        // parent may not be ours to open).
        if let Some(parent) = root.canonicalize()?.parent() {
            let _ = fsync_dir(parent);
        }
        Self::open(root)
    }

    /// Opens an existing store. Fails with `NotFound` if `path` does not
    /// exist and `InvalidData` if it is not an oubli directory store (no
    /// marker, or an unknown format version); `WouldBlock` if another handle
    /// has it open.
    pub fn open(path: impl AsRef<Path>) -> io::Result<DirMedium> {
        Self::open_with(path.as_ref(), false)
    }

    /// Opens an existing store for reading only, under a *shared* lock: any
    /// number of readers may hold it at once, but not while a writer has the
    /// store open (and no writer while they do). Every write fails with
    /// `PermissionDenied`.
    pub fn open_read_only(path: impl AsRef<Path>) -> io::Result<DirMedium> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(root: &Path, read_only: bool) -> io::Result<DirMedium> {
        let meta = fs::metadata(root).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open store {}: {e}", root.display()),
            )
        })?;
        if !meta.is_dir() {
            return Err(invalid_input(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        let root = root.canonicalize()?;
        let marker_path = root.join(DIR_MARKER);
        let marker = match fs::read(&marker_path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(invalid_data(format!(
                    "{} is not an oubli store (no {DIR_MARKER} file)",
                    root.display()
                )))
            }
            Err(e) => return Err(e),
        };
        if marker != DIR_MARKER_V1 {
            return Err(invalid_data(format!(
                "{}: unrecognised or unsupported {DIR_MARKER} content {:?}",
                root.display(),
                String::from_utf8_lossy(&marker)
            )));
        }
        let segdir = root.join(SEGMENTS);
        if !segdir.is_dir() {
            return Err(invalid_data(format!(
                "{} is damaged: {SEGMENTS}/ is missing",
                root.display()
            )));
        }
        let lock = File::open(&marker_path)?;
        let what = format!("store {}", root.display());
        if read_only {
            lock_shared(&lock, &what)?;
        } else {
            lock_exclusive(&lock, &what)?;
        }
        Ok(DirMedium {
            root,
            segdir,
            _lock: lock,
            read_only,
            state: Mutex::new(DirState {
                writers: Mru::new(WRITER_CACHE),
                readers: Mru::new(READER_CACHE),
                rewriters: Mru::new(WRITER_CACHE),
                appended: HashMap::new(),
                dirty: BTreeSet::new(),
                segdir_dirty: false,
                root_dirty: false,
            }),
        })
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("store {} is open read-only", self.root.display()),
            ));
        }
        Ok(())
    }

    /// The store's directory (canonical).
    pub fn path(&self) -> &Path {
        &self.root
    }

    fn seg_path(&self, id: SegmentId) -> PathBuf {
        self.segdir.join(format!("{id:08x}.seg"))
    }

    /// fdatasync of every listed segment (opened again when its writer
    /// was evicted; gone is fine), then of the directories whose entries
    /// changed.
    fn flush_dirty(
        &self,
        dirty: &[(SegmentId, Option<Arc<File>>)],
        segdir: bool,
        root: bool,
    ) -> io::Result<()> {
        for (id, file) in dirty {
            let file = match file {
                Some(f) => f.clone(),
                None => match File::open(self.seg_path(*id)) {
                    Ok(f) => Arc::new(f),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                },
            };
            // fdatasync also flushes the file size, which is all the
            // metadata an appended file needs.
            file.sync_data().map_err(crate::util::sync_failed)?;
        }
        if segdir {
            fsync_dir(&self.segdir).map_err(crate::util::sync_failed)?;
        }
        if root {
            fsync_dir(&self.root).map_err(crate::util::sync_failed)?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, DirState> {
        // Every field stays meaningful even if a holder panicked.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens segment `id` for appending at `offset`, checking the offset.
    fn open_writer(&self, st: &mut DirState, id: SegmentId, offset: u64) -> io::Result<Writer> {
        let path = self.seg_path(id);
        if offset == 0 {
            use std::os::unix::fs::OpenOptionsExt;
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => {
                    st.segdir_dirty = true;
                    return Ok(Writer {
                        file: Arc::new(f),
                        len: 0,
                        hinted_to: 0,
                        zeroed_to: 0,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    not_found(format!("append at {offset} to missing segment {id:08x}"))
                } else {
                    e
                }
            })?;
        let size = f.metadata()?.len();
        // Zeros this medium wrote ahead ([`Medium::reserve`]) before the
        // writer was evicted from the cache: the segment ends at `offset`.
        let len = if size > offset && size - offset <= RESERVE_MAX && zeros_from(&f, offset, size)?
        {
            offset
        } else {
            size
        };
        Ok(Writer {
            file: Arc::new(f),
            len,
            hinted_to: len,
            zeroed_to: size,
        })
    }

    /// A handle for reading segment `id` (from a cache when possible).
    fn reader(&self, id: SegmentId) -> io::Result<Arc<File>> {
        let mut st = self.lock();
        if let Some(w) = st.writers.get(id) {
            return Ok(w.file.clone());
        }
        if let Some(f) = st.readers.get(id) {
            return Ok(f.clone());
        }
        let f = File::open(self.seg_path(id)).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                not_found(format!("segment {id:08x} does not exist"))
            } else {
                e
            }
        })?;
        let f = Arc::new(f);
        st.readers.insert(id, f.clone());
        Ok(f)
    }
}

impl Medium for DirMedium {
    fn describe(&self) -> String {
        format!("dir:{}", self.root.display())
    }

    /// 4 GiB - 1: the engine stores offsets as `u32`.
    fn segment_capacity(&self) -> u64 {
        u64::from(u32::MAX)
    }

    fn append(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.writable()?;
        check_append_bounds(self.segment_capacity(), offset, data.len())?;
        let mut st = self.lock();
        let cached = st.writers.get(id).map(|w| (w.file.clone(), w.len));
        let (file, len) = match cached {
            Some(c) => c,
            None => {
                let w = self.open_writer(&mut st, id, offset)?;
                let c = (w.file.clone(), w.len);
                st.writers.insert(id, w);
                c
            }
        };
        if len != offset {
            return Err(invalid_input(format!(
                "append to segment {id:08x} at {offset}, but its length is {len}"
            )));
        }
        // Mark dirty before writing: even a failed write may have changed
        // the file, and the next sync should flush whatever landed.
        st.dirty.insert(id);
        if let Err(e) = file.write_all_at(data, offset) {
            // A write cut short (ENOSPC part-way) is rolled back: the
            // segment ends where it did, so the engine may append there
            // again once there is room (the zeros `reserve` wrote stay).
            let keep = st
                .writers
                .get(id)
                .map_or(offset, |w| w.zeroed_to.max(offset));
            if file.set_len(keep).is_err() {
                // The length is now unknown; reopening re-reads it.
                st.writers.remove(id);
                st.appended.remove(&id);
            }
            return Err(e);
        }
        let mut hint = None;
        st.appended.insert(id, offset + data.len() as u64);
        if let Some(w) = st.writers.get(id) {
            w.len = offset + data.len() as u64;
            hint = writeback_due(&mut w.hinted_to, w.len);
        }
        // The hint may wait for the device's queue: not under the lock
        // that every append and every reader's handle lookup takes.
        drop(st);
        if let Some((from, len)) = hint {
            start_writeback(&file, from, len);
        }
        Ok(())
    }

    fn can_rewrite(&self) -> bool {
        !self.read_only
    }

    /// The file system's size and what it gives an unprivileged user
    /// (`statvfs`: `f_blocks`, `f_bavail`), as `df` shows them.
    fn space(&self) -> io::Result<Option<oubli_core::Space>> {
        let c = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())
            .map_err(|e| invalid_input(e.to_string()))?;
        let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: FFI with a valid C string and a writable statvfs.
        if unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: statvfs succeeded and filled it.
        let s = unsafe { s.assume_init() };
        let unit = s.f_frsize;
        Ok(Some(oubli_core::Space {
            total: s.f_blocks * unit,
            free: s.f_bavail * unit,
        }))
    }

    /// Only inside what this handle appended, to a segment it still
    /// appends to or one it finished (a block device's writeback rewrites
    /// a file's extents a pass apart: hundreds of MiB, several segments).
    /// No writeback hint: the page cache is where an overwrite costs
    /// nothing, and the next sync writes what is left.
    fn rewrite(&self, id: SegmentId, offset: u64, data: &[u8]) -> io::Result<()> {
        self.writable()?;
        let mut st = self.lock();
        let Some(&len) = st.appended.get(&id) else {
            return Err(invalid_input(format!(
                "rewrite in segment {id:08x}, which this handle did not append to"
            )));
        };
        check_rewrite_bounds(id, len, offset, data.len())?;
        let file = match st.writers.get(id) {
            Some(w) => w.file.clone(),
            None => match st.rewriters.get(id) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(OpenOptions::new().write(true).open(self.seg_path(id))?);
                    st.rewriters.insert(id, f.clone());
                    f
                }
            },
        };
        // Dirty before writing, as an append: the next sync flushes
        // whatever landed, through any handle.
        st.dirty.insert(id);
        drop(st);
        file.write_all_at(data, offset)
    }

    /// Writes zeros from the segment's end (or the last zeros) to `upto`,
    /// at most [`RESERVE_MAX`] past its end; the next sync makes the new
    /// size durable, after which appends inside are overwrites.
    fn reserve(&self, id: SegmentId, upto: u64) -> io::Result<()> {
        self.writable()?;
        let mut st = self.lock();
        if st.writers.get(id).is_none() {
            if self.seg_path(id).exists() {
                // Not one this medium is appending to: leave it as it is.
                return Ok(());
            }
            let w = self.open_writer(&mut st, id, 0)?;
            st.writers.insert(id, w);
        }
        let w = st.writers.get(id).expect("inserted above");
        let from = w.len.max(w.zeroed_to);
        let upto = upto.min(w.len + RESERVE_MAX).min(self.segment_capacity());
        if upto <= from {
            return Ok(());
        }
        let file = w.file.clone();
        if let Err(e) = file.write_all_at(&vec![0u8; (upto - from) as usize], from) {
            // No room for the hint: give back what part of it took.
            let _ = file.set_len(from);
            return Err(e);
        }
        w.zeroed_to = upto;
        st.dirty.insert(id);
        Ok(())
    }

    /// Cuts the zeros `reserve` wrote past `len` (the file's size change
    /// is durable at the next sync; a crash before leaves the zeros).
    fn finish_segment(&self, id: SegmentId, len: u64) -> io::Result<()> {
        self.writable()?;
        let mut st = self.lock();
        let file = match st.writers.remove(id) {
            Some(w) if w.len == len && w.zeroed_to <= len => return Ok(()),
            Some(w) if w.len == len => w.file,
            // Reopened since, or evicted: only a tail of zeros goes.
            _ => match OpenOptions::new()
                .write(true)
                .read(true)
                .open(self.seg_path(id))
            {
                Ok(f) => Arc::new(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        let size = file.metadata()?.len();
        if size <= len || size - len > RESERVE_MAX || !zeros_from(&file, len, size)? {
            return Ok(());
        }
        file.set_len(len)?;
        st.dirty.insert(id);
        Ok(())
    }

    fn read(&self, id: SegmentId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = self.reader(id)?;
        file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                eof(format!(
                    "read of {} bytes at {offset} past the end of segment {id:08x}",
                    buf.len()
                ))
            } else {
                e
            }
        })
    }

    fn segment_len(&self, id: SegmentId) -> io::Result<Option<u64>> {
        if let Some(w) = self.lock().writers.get(id) {
            return Ok(Some(w.len));
        }
        match fs::metadata(self.seg_path(id)) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list_segments(&self) -> io::Result<Vec<SegmentId>> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(&self.segdir)? {
            let entry = entry?;
            // Anything not named like a segment (editor droppings, ...) is ignored.
            if let Some(id) = entry.file_name().to_str().and_then(parse_segment_name) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    fn delete_segment(&self, id: SegmentId) -> io::Result<()> {
        self.writable()?;
        // Closing and unlinking run without the lock: freeing a 64 MiB
        // file's blocks took ~18 ms on ext4, and every append and read of
        // other segments would wait for it. Nobody uses a segment being
        // deleted (the engine deletes only segments no tree names).
        let handles = {
            let mut st = self.lock();
            st.dirty.remove(&id);
            st.appended.remove(&id);
            (
                st.writers.remove(id),
                st.readers.remove(id),
                st.rewriters.remove(id),
            )
        };
        drop(handles);
        let path = self.seg_path(id);
        shrink_in_steps(&path);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.lock().segdir_dirty = true;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        // The flags are cleared under the lock *before* the flushes, which
        // run without it: an append that slips in meanwhile marks its
        // segment dirty again for the next sync, and appends from other
        // threads (writers beside a commit's sync) do not wait for the disk.
        let (dirty, segdir, root) = {
            let mut st = self.lock();
            let ids = std::mem::take(&mut st.dirty);
            let files: Vec<(SegmentId, Option<Arc<File>>)> = ids
                .into_iter()
                .map(|id| (id, st.writers.get(id).map(|w| w.file.clone())))
                .collect();
            let flags = (
                std::mem::take(&mut st.segdir_dirty),
                std::mem::take(&mut st.root_dirty),
            );
            (files, flags.0, flags.1)
        };
        let flushed = self.flush_dirty(&dirty, segdir, root);
        if flushed.is_err() {
            // Nothing is known to be durable: everything stays dirty.
            let mut st = self.lock();
            st.dirty.extend(dirty.iter().map(|(id, _)| *id));
            st.segdir_dirty |= segdir;
            st.root_dirty |= root;
        }
        flushed
    }

    fn read_superblock(&self, slot: Slot) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.root.join(slot_name(slot))) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write_superblock(&self, slot: Slot, data: &[u8]) -> io::Result<()> {
        self.writable()?;
        check_superblock_len(data.len())?;
        // Serialises with sync() and with another write to the same slot
        // (which would share the temporary file).
        let mut st = self.lock();
        let name = slot_name(slot);
        let tmp = self.root.join(format!("{name}.tmp"));
        {
            let mut f = create_private(&tmp)?;
            f.write_all(data)?;
            // The content must be on disk before the rename can be, or a
            // crash could leave a renamed but empty slot.
            f.sync_data()?;
        }
        fs::rename(&tmp, self.root.join(name))?;
        st.root_dirty = true;
        Ok(())
    }
}

/// Creates `path` afresh for writing, mode 0600 from the moment it exists
/// (the store's files are the owner's only, whatever the umask: its lock
/// must not be another user's to take). A temporary file a crash left
/// behind goes first, so neither its mode nor a link in its place is
/// inherited.
fn create_private(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// Frees a file's blocks a few MiB at a time before it is unlinked. ext4
/// frees a 64 MiB file's extents in one journal transaction, 20–35 ms here,
/// and appends to other files that need the journal meanwhile (a new
/// block, a size change) wait for it: a writer beside the deleting thread
/// saw 68–122 ms stalls, 35–42 ms with 4 MiB steps
/// (`bench/engine --only commit-stall`, policy-1s-background). Best
/// effort: the unlink that follows frees whatever is left, and a crash
/// half-way leaves a shorter segment that nothing names (DESIGN §7: only
/// unreachable segments are deleted).
fn shrink_in_steps(path: &Path) {
    const STEP: u64 = 4 << 20;
    let Ok(file) = OpenOptions::new().write(true).open(path) else {
        return;
    };
    let mut len = file.metadata().map_or(0, |m| m.len());
    while len > STEP {
        len -= STEP;
        if file.set_len(len).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, DirMedium) {
        let dir = tempfile::tempdir().unwrap();
        let m = DirMedium::create(dir.path().join("store")).unwrap();
        (dir, m)
    }

    fn read_all(m: &impl Medium, id: SegmentId) -> Vec<u8> {
        let len = m.segment_len(id).unwrap().unwrap();
        let mut buf = vec![0; len as usize];
        m.read(id, 0, &mut buf).unwrap();
        buf
    }

    /// Issue 9 item 9: a new store directory (and its segment directory)
    /// is the owner's only, whatever the umask lets through; issue 40 item
    /// 3: so is every file the medium creates in it (the marker, which is
    /// also its lock; the superblocks; the segments).
    #[test]
    fn a_new_store_directory_is_private() {
        use std::os::unix::fs::MetadataExt;
        let (dir, m) = store();
        let root = dir.path().join("store");
        for d in [root.clone(), root.join(SEGMENTS)] {
            let mode = fs::metadata(&d).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
        m.append(3, 0, b"segment").unwrap();
        m.write_superblock(Slot::A, b"slot a").unwrap();
        m.write_superblock(Slot::B, b"slot b").unwrap();
        m.write_superblock(Slot::A, b"slot a again").unwrap();
        m.sync().unwrap();
        for f in [
            root.join(DIR_MARKER),
            root.join("super.a"),
            root.join("super.b"),
            m.seg_path(3),
        ] {
            let mode = fs::metadata(&f).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let (dir, m) = store();
        m.append(0x1f, 0, b"hello ").unwrap();
        m.append(0x1f, 6, b"world").unwrap();
        m.append(2, 0, b"").unwrap();
        assert_eq!(read_all(&m, 0x1f), b"hello world");
        assert_eq!(m.segment_len(2).unwrap(), Some(0));
        assert_eq!(m.segment_len(3).unwrap(), None);
        assert_eq!(m.list_segments().unwrap(), vec![2, 0x1f]);
        m.sync().unwrap();
        let root = dir.path().join("store");
        assert!(root.join("segments/0000001f.seg").is_file());
        assert_eq!(fs::read(root.join(DIR_MARKER)).unwrap(), DIR_MARKER_V1);
        assert_eq!(m.segment_capacity(), 0xffff_ffff);
        assert!(m.describe().starts_with("dir:/"));
    }

    /// `reserve` writes zeros ahead: appends land inside them (the file's
    /// size stays), the segment's length is what was appended, also after
    /// its handle left the cache; once reopened, the zeros count as an
    /// upper bound and read as zeros.
    #[test]
    fn reserved_room_takes_appends_and_keeps_the_length() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let m = DirMedium::create(&root).unwrap();
        let file = root.join(SEGMENTS).join("00000001.seg");
        m.reserve(1, 1000).unwrap();
        assert_eq!(fs::metadata(&file).unwrap().len(), 1000);
        m.append(1, 0, b"frame one").unwrap();
        m.append(1, 9, b"frame two").unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(18));
        assert_eq!(fs::metadata(&file).unwrap().len(), 1000);
        assert_eq!(read_all(&m, 1), b"frame oneframe two");
        // Past the room, appends grow the file as usual.
        m.append(1, 18, &[7u8; 2000]).unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(2018));
        m.reserve(1, 3000).unwrap();
        // The handle evicted: the next append still finds the end.
        for id in 10..20 {
            m.append(id, 0, b"z").unwrap();
        }
        m.append(1, 2018, b"three").unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(2023));
        // Nothing past RESERVE_MAX, and nothing for a segment it did not write.
        m.reserve(1, 1 << 40).unwrap();
        assert_eq!(fs::metadata(&file).unwrap().len(), 2023 + RESERVE_MAX);
        m.sync().unwrap();
        drop(m);
        let m = DirMedium::open(&root).unwrap();
        m.reserve(1, 1 << 30).unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(2023 + RESERVE_MAX));
        let mut tail = [1u8; 8];
        m.read(1, 2023, &mut tail).unwrap();
        assert_eq!(tail, [0; 8]);
        // Released at its true end, the zeros go; a wrong end keeps data.
        m.finish_segment(1, 2000).unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(2023 + RESERVE_MAX));
        m.finish_segment(1, 2023).unwrap();
        assert_eq!(m.segment_len(1).unwrap(), Some(2023));
        m.reserve(2, 500).unwrap();
        m.append(2, 0, b"log").unwrap();
        m.finish_segment(2, 3).unwrap();
        assert_eq!(m.segment_len(2).unwrap(), Some(3));
        assert_eq!(read_all(&m, 2), b"log");
    }

    #[test]
    fn rewrites_only_what_this_handle_appended() {
        let (d, m) = store();
        assert!(m.can_rewrite());
        m.append(1, 0, b"abcdef").unwrap();
        m.rewrite(1, 2, b"XY").unwrap();
        let mut buf = [0u8; 6];
        m.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"abXYef");
        assert_eq!(m.segment_len(1).unwrap(), Some(6));
        assert_eq!(
            m.rewrite(1, 5, b"XY").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // Finished, and its writer evicted by appends to more segments than
        // the cache keeps: still this handle's, still rewritable inside.
        m.finish_segment(1, 6).unwrap();
        for id in 2..=(WRITER_CACHE as u32 + 2) {
            m.append(id, 0, b"other").unwrap();
        }
        m.rewrite(1, 0, b"Q").unwrap();
        assert_eq!(
            m.rewrite(1, 5, b"XY").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        m.sync().unwrap();
        assert_eq!(read_all(&m, 1), b"QbXYef");
        assert_eq!(fs::read(m.seg_path(1)).unwrap(), b"QbXYef");
        // Deleted: forgotten.
        m.delete_segment(2).unwrap();
        assert_eq!(
            m.rewrite(2, 0, b"Z").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        drop(m);
        // Reopened: the segment is no longer one this handle appended to.
        let m = DirMedium::open(d.path().join("store")).unwrap();
        assert_eq!(
            m.rewrite(1, 0, b"Z").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        drop(m);
        let ro = DirMedium::open_read_only(d.path().join("store")).unwrap();
        assert!(!ro.can_rewrite());
    }

    #[test]
    fn append_only_enforced() {
        let (_d, m) = store();
        m.append(1, 0, b"abc").unwrap();
        for off in [0, 2, 4] {
            assert_eq!(
                m.append(1, off, b"x").unwrap_err().kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert_eq!(
            m.append(5, 3, b"x").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            m.append(1, 3, &[])
                .map(|_| m.segment_len(1).unwrap())
                .unwrap(),
            Some(3)
        );
        assert_eq!(
            m.append(1, u64::from(u32::MAX), b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // Offset check also holds for a segment not in the handle cache.
        for id in 10..20 {
            m.append(id, 0, b"z").unwrap();
        }
        assert_eq!(
            m.append(1, 0, b"x").unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        m.append(1, 3, b"d").unwrap();
        assert_eq!(read_all(&m, 1), b"abcd");
    }

    #[test]
    fn read_errors() {
        let (_d, m) = store();
        m.append(1, 0, b"abc").unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(
            m.read(1, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            m.read(2, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        let mut buf = [0u8; 2];
        m.read(1, 1, &mut buf).unwrap();
        assert_eq!(&buf, b"bc");
    }

    #[test]
    fn reopen_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        {
            let m = DirMedium::create(&path).unwrap();
            m.append(7, 0, b"persist").unwrap();
            m.write_superblock(Slot::B, b"sb").unwrap();
            m.sync().unwrap();
            // A second handle on the same store is refused while this one lives.
            assert_eq!(
                DirMedium::open(&path).unwrap_err().kind(),
                io::ErrorKind::WouldBlock
            );
        }
        let m = DirMedium::open(&path).unwrap();
        assert_eq!(read_all(&m, 7), b"persist");
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"sb");
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None);
        // Appending continues where the segment ends.
        m.append(7, 7, b"!").unwrap();
        assert_eq!(read_all(&m, 7), b"persist!");
    }

    #[test]
    fn create_and_open_refuse_wrong_things() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        drop(DirMedium::create(&path).unwrap());
        assert_eq!(
            DirMedium::create(&path).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        // Not a store.
        let plain = dir.path().join("plain");
        fs::create_dir(&plain).unwrap();
        let err = DirMedium::open(&plain).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("not an oubli store"), "{err}");
        assert_eq!(
            DirMedium::open(dir.path().join("missing"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
        // An existing non-store directory with unrelated content can be formatted.
        fs::create_dir(plain.join("lost+found")).unwrap();
        DirMedium::create(&plain).unwrap();
        // Wrong version.
        let other = dir.path().join("v9");
        drop(DirMedium::create(&other).unwrap());
        fs::write(other.join(DIR_MARKER), b"oubli dir medium\nversion 9\n").unwrap();
        assert_eq!(
            DirMedium::open(&other).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn superblock_slots_independent_and_atomic() {
        let (dir, m) = store();
        m.write_superblock(Slot::A, b"a1").unwrap();
        m.write_superblock(Slot::B, b"b1").unwrap();
        m.write_superblock(Slot::A, b"a2-longer").unwrap();
        m.write_superblock(Slot::A, b"a3").unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"a3");
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"b1");
        assert!(m.write_superblock(Slot::A, &[0; 4097]).is_err());
        m.write_superblock(Slot::B, &[9; 4096]).unwrap();
        m.sync().unwrap();
        assert!(!dir.path().join("store/super.a.tmp").exists());
    }

    #[test]
    fn delete_is_idempotent_and_drops_caches() {
        let (_d, m) = store();
        m.append(1, 0, b"abc").unwrap();
        let mut buf = [0u8; 1];
        m.read(1, 0, &mut buf).unwrap();
        m.delete_segment(1).unwrap();
        m.delete_segment(1).unwrap();
        m.delete_segment(99).unwrap();
        assert_eq!(m.segment_len(1).unwrap(), None);
        assert_eq!(
            m.read(1, 0, &mut buf).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(m.list_segments().unwrap().is_empty());
        m.sync().unwrap();
    }

    #[test]
    fn sync_flushes_evicted_writers() {
        let (_d, m) = store();
        for id in 0..(WRITER_CACHE as u32 * 3) {
            m.append(id, 0, &[id as u8; 100]).unwrap();
        }
        assert_eq!(m.lock().dirty.len(), WRITER_CACHE * 3);
        m.delete_segment(0).unwrap();
        m.sync().unwrap();
        let st = m.lock();
        assert!(st.dirty.is_empty() && !st.segdir_dirty && !st.root_dirty);
    }

    #[test]
    fn list_ignores_foreign_files() {
        let (dir, m) = store();
        m.append(3, 0, b"x").unwrap();
        let segs = dir.path().join("store/segments");
        for name in [
            "junk",
            "0000000G.seg",
            "0000000A.seg",
            "00000001.seg.tmp",
            "1.seg",
        ] {
            fs::write(segs.join(name), b"").unwrap();
        }
        assert_eq!(m.list_segments().unwrap(), vec![3]);
        assert_eq!(parse_segment_name("ffffffff.seg"), Some(u32::MAX));
    }

    #[test]
    fn enospc_is_storage_full() {
        // A segment file that is really /dev/full makes every write fail
        // with ENOSPC, which must surface as StorageFull.
        if !Path::new("/dev/full").exists() {
            return;
        }
        let (dir, m) = store();
        std::os::unix::fs::symlink("/dev/full", dir.path().join("store/segments/00000001.seg"))
            .unwrap();
        let err = m.append(1, 0, b"data").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
    }

    /// A tmpfs of `size` at a fresh directory, unmounted when dropped;
    /// `None` where mounting is not allowed (not root).
    struct SmallFs(tempfile::TempDir);

    impl SmallFs {
        fn mount(size: &str) -> Option<SmallFs> {
            use std::os::unix::ffi::OsStrExt;
            let dir = tempfile::tempdir().unwrap();
            let target = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
            let fstype = std::ffi::CString::new("tmpfs").unwrap();
            let opts = std::ffi::CString::new(format!("size={size}")).unwrap();
            // SAFETY: FFI with valid C strings.
            let rc = unsafe {
                libc::mount(
                    fstype.as_ptr(),
                    target.as_ptr(),
                    fstype.as_ptr(),
                    0,
                    opts.as_ptr().cast(),
                )
            };
            if rc != 0 {
                eprintln!(
                    "skipped: mounting a tmpfs needs root ({})",
                    io::Error::last_os_error()
                );
                return None;
            }
            Some(SmallFs(dir))
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            use std::os::unix::ffi::OsStrExt;
            let target = std::ffi::CString::new(self.0.path().as_os_str().as_bytes()).unwrap();
            // SAFETY: FFI with a valid C string.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    /// An append that the file system cuts short with ENOSPC is rolled
    /// back: the segment ends where it did, reads and the length say so
    /// (no torn tail), and once there is room the same append goes
    /// through at the same offset. `space` reports the file system's
    /// room. (Needs root for a 2 MiB tmpfs.)
    #[test]
    fn an_append_cut_short_by_enospc_is_rolled_back() {
        let Some(fs) = SmallFs::mount("2m") else {
            return;
        };
        let m = DirMedium::create(fs.0.path().join("store")).unwrap();
        let space = m.space().unwrap().unwrap();
        assert_eq!(space.total, 2 << 20);
        assert!(
            space.free <= space.total && space.free > 1 << 20,
            "{space:?}"
        );
        let head = vec![7u8; 512 << 10];
        m.append(1, 0, &head).unwrap();
        // Another segment takes most of what is left.
        m.append(2, 0, &vec![1u8; 1 << 20]).unwrap();
        let big = vec![9u8; 1 << 20];
        let err = m.append(1, head.len() as u64, &big).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        assert_eq!(m.segment_len(1).unwrap(), Some(head.len() as u64));
        let on_disk = fs::metadata(m.seg_path(1)).unwrap().len();
        assert_eq!(on_disk, head.len() as u64, "a torn tail stayed on disk");
        assert!(m.space().unwrap().unwrap().free < 1 << 20);
        // Room again: the same append at the same offset.
        m.delete_segment(2).unwrap();
        m.append(1, head.len() as u64, &big).unwrap();
        m.sync().unwrap();
        assert_eq!(read_all(&m, 1), [head, big].concat());
    }

    #[test]
    fn concurrent_appends_and_reads() {
        let (_d, m) = store();
        let m = Arc::new(m);
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..50u64 {
                        m.append(t, i * 4, &(i as u32).to_le_bytes()).unwrap();
                        let mut b = [0u8; 4];
                        m.read(t, i * 4, &mut b).unwrap();
                        assert_eq!(u32::from_le_bytes(b), i as u32);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        m.sync().unwrap();
        for t in 0..4 {
            assert_eq!(m.segment_len(t).unwrap(), Some(200));
        }
    }
}

#[cfg(test)]
mod read_only_tests {
    use super::*;

    #[test]
    fn readers_share_and_exclude_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let w = DirMedium::create(&path).unwrap();
        w.append(1, 0, b"abc").unwrap();
        w.sync().unwrap();
        assert_eq!(
            DirMedium::open_read_only(&path).err().map(|e| e.kind()),
            Some(io::ErrorKind::WouldBlock)
        );
        drop(w);
        let r1 = DirMedium::open_read_only(&path).unwrap();
        let r2 = DirMedium::open_read_only(&path).unwrap();
        let mut buf = [0u8; 3];
        r2.read(1, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"abc");
        assert_eq!(
            r1.append(1, 3, b"d").unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert_eq!(
            DirMedium::open(&path).err().map(|e| e.kind()),
            Some(io::ErrorKind::WouldBlock)
        );
    }
}
