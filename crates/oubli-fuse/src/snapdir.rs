//! The read-only `.snapshots` directory of a mount: every snapshot of the store as a directory tree, on inode numbers of its own.
//!
//! Inode numbers (docs/FUSE.md, "Snapshots"): the live store's objects keep
//! their ids, which are below 2^48; object `oid` of the snapshot in slot `s`
//! is `s << 48 | oid`, slots counting from 1 in the order the mount first
//! meets each snapshot and never reused while mounted (a removed snapshot's
//! inodes answer ENOENT, never another snapshot's files); `.snapshots` itself
//! is [`SNAPDIR_INO`]. Each snapshot is served by its own read-only file
//! system over [`Store::snapshot`] (the live one's type, through
//! [`SnapshotFs`]), so every read path is the live one.
//!
//! Views hold tree keys in memory. They are dropped whenever the store's
//! [`Store::snapshot_generation`] moves (a snapshot removed or redacted, a
//! share destroyed, the cleaner run, a commit), so nothing erased stays
//! readable through a view made before.

use crate::options::MountOptions;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use oubli_core::Store;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

type R<T> = Result<T, Errno>;

/// What `.snapshots` needs of the file system that serves one snapshot:
/// that it can be opened over it. The only dependence of this module on
/// the file system it serves.
pub(crate) trait SnapshotFs: Sized {
    /// The file system over snapshot `name` of `store`, with `opts` (read-only).
    fn open_snapshot(store: &Store, name: &str, opts: &MountOptions) -> R<Self>;
}

/// Bits of an inode number that hold the object id.
const SLOT_SHIFT: u32 = 48;
const OID_MASK: u64 = (1 << SLOT_SHIFT) - 1;
/// The last slot a snapshot can take (0 is the live store, 0xFFFF `.snapshots`).
const MAX_SLOT: u16 = 0xFFFE;
/// The inode of `MOUNTPOINT/.snapshots`.
pub(crate) const SNAPDIR_INO: u64 = (0xFFFF << SLOT_SHIFT) | 1;
/// Its name in the root directory.
pub(crate) const SNAPDIR_NAME: &[u8] = b".snapshots";

/// Where an inode lives.
pub(crate) enum Place<F> {
    /// The live store's object.
    Live(u64),
    /// `.snapshots` itself.
    Snapdir,
    /// Object `oid` of the snapshot served by `fs`.
    Snap { slot: u16, fs: Arc<F>, oid: u64 },
}

/// The kernel's inode number for object `oid` in `slot` (0: the live store).
pub(crate) fn ino(slot: u16, oid: u64) -> u64 {
    if slot == 0 {
        oid
    } else {
        (u64::from(slot) << SLOT_SHIFT) | (oid & OID_MASK)
    }
}

/// An attribute as the kernel must see it in `slot`.
pub(crate) fn attr_in(slot: u16, mut attr: FileAttr) -> FileAttr {
    attr.ino = INodeNo(ino(slot, attr.ino.0));
    attr
}

/// Is this inode outside the live store (a snapshot's, or `.snapshots`)?
pub(crate) fn in_snapshot(ino: u64) -> bool {
    ino >> SLOT_SHIFT != 0
}

pub(crate) struct Snapdir<F> {
    store: Arc<Store>,
    /// What each snapshot's file system is mounted with (read-only).
    opts: MountOptions,
    views: Mutex<Views<F>>,
}

struct Views<F> {
    /// The store's snapshot generation the fields below were made at.
    generation: Option<u64>,
    /// Snapshots that exist at that generation.
    existing: BTreeSet<String>,
    slot_of: HashMap<String, u16>,
    name_of: HashMap<u16, String>,
    open: HashMap<u16, Arc<F>>,
    next_slot: u16,
}

fn lock<F>(m: &Mutex<Views<F>>) -> MutexGuard<'_, Views<F>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<F: SnapshotFs> Snapdir<F> {
    pub(crate) fn new(store: Arc<Store>, live: &MountOptions) -> Snapdir<F> {
        let opts = MountOptions {
            read_only: true,
            policy: None,
            snapdir_visible: false,
            ..live.clone()
        };
        Snapdir {
            store,
            opts,
            views: Mutex::new(Views {
                generation: None,
                existing: BTreeSet::new(),
                slot_of: HashMap::new(),
                name_of: HashMap::new(),
                open: HashMap::new(),
                next_slot: 1,
            }),
        }
    }

    /// Brings the views up to the store's generation: stale views dropped.
    fn refresh<'a>(&'a self, views: &mut MutexGuard<'a, Views<F>>) {
        let generation = self.store.snapshot_generation();
        if views.generation != Some(generation) {
            views.open.clear();
            views.existing = self.store.snapshots().into_iter().map(|s| s.name).collect();
            views.generation = Some(generation);
        }
    }

    /// Where `ino` lives; ENOENT for a snapshot removed since the kernel learnt it.
    pub(crate) fn place(&self, ino: u64) -> R<Place<F>> {
        if !in_snapshot(ino) {
            return Ok(Place::Live(ino));
        }
        if ino == SNAPDIR_INO {
            return Ok(Place::Snapdir);
        }
        let slot = (ino >> SLOT_SHIFT) as u16;
        let fs = self.fs_of(slot)?;
        Ok(Place::Snap {
            slot,
            fs,
            oid: ino & OID_MASK,
        })
    }

    fn fs_of(&self, slot: u16) -> R<Arc<F>> {
        let mut views = lock(&self.views);
        self.refresh(&mut views);
        let name = views.name_of.get(&slot).cloned().ok_or(Errno::ENOENT)?;
        if !views.existing.contains(&name) {
            return Err(Errno::ENOENT);
        }
        if let Some(fs) = views.open.get(&slot) {
            return Ok(fs.clone());
        }
        let fs = Arc::new(F::open_snapshot(&self.store, &name, &self.opts)?);
        views.open.insert(slot, fs.clone());
        Ok(fs)
    }

    fn assign<'a>(&'a self, views: &mut MutexGuard<'a, Views<F>>, name: &str) -> R<u16> {
        if let Some(&slot) = views.slot_of.get(name) {
            return Ok(slot);
        }
        let slot = views.next_slot;
        if slot > MAX_SLOT {
            // 65,534 snapshots met in one mount: remount to renumber.
            return Err(Errno::ENFILE);
        }
        views.next_slot += 1;
        views.slot_of.insert(name.to_string(), slot);
        views.name_of.insert(slot, name.to_string());
        Ok(slot)
    }

    /// The slot and file system of the snapshot `name`.
    pub(crate) fn lookup(&self, name: &[u8]) -> R<(u16, Arc<F>)> {
        let name = std::str::from_utf8(name).map_err(|_| Errno::ENOENT)?;
        let slot = {
            let mut views = lock(&self.views);
            self.refresh(&mut views);
            if !views.existing.contains(name) {
                return Err(Errno::ENOENT);
            }
            self.assign(&mut views, name)?
        };
        Ok((slot, self.fs_of(slot)?))
    }

    /// `.snapshots`' entries after `.` and `..`: each snapshot's root.
    pub(crate) fn entries(&self) -> R<Vec<(Vec<u8>, u64)>> {
        let mut views = lock(&self.views);
        self.refresh(&mut views);
        let names: Vec<String> = views.existing.iter().cloned().collect();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let slot = self.assign(&mut views, &name)?;
            out.push((name.into_bytes(), ino(slot, oubli_core::ROOT_DIR)));
        }
        Ok(out)
    }

    /// `.snapshots`' attributes: the live root's owner and times, read-only.
    pub(crate) fn attr(&self, root: FileAttr) -> FileAttr {
        let count = lock(&self.views).existing.len() as u32;
        FileAttr {
            ino: INodeNo(SNAPDIR_INO),
            size: 4096,
            blocks: 8,
            kind: FileType::Directory,
            perm: 0o555,
            nlink: 2 + count,
            ..root
        }
    }
}
