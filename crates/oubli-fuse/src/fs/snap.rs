//! Snapshots and redaction: a quiesced store for taking snapshots, and erasing a path from the live tree and every snapshot.

use super::{errno, Fs, R};
use crate::options::MountOptions;
use crate::snapdir::SnapshotFs;
use fuser::Errno;
use oubli_core::{Error as StoreError, Store, ROOT_DIR};
use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

/// `.snapshots` serves each snapshot with a read-only `Fs` over its view.
impl SnapshotFs for Fs {
    fn open_snapshot(store: &Store, name: &str, opts: &MountOptions) -> R<Fs> {
        let view = store.snapshot(name).map_err(errno)?;
        Fs::new(Arc::new(view), opts).map_err(errno)
    }
}

impl Fs {
    /// Runs `f` with no namespace operation half done and every pending
    /// attribute written (a snapshot then shows what a clean unmount would).
    pub(crate) fn quiesced<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        let _g = self.exclusive();
        self.persist_all();
        f(&self.store)
    }

    /// Erases the file or directory tree at `path` (components from the
    /// root) from the live tree and from every snapshot: the live names go
    /// as by `rm -r` (every hard link of the objects too), and each snapshot
    /// loses the objects at that path in it and the objects removed here.
    pub(crate) fn redact(&self, path: &[Vec<u8>]) -> io::Result<crate::Redacted> {
        let store_err = |e: StoreError| io::Error::other(e.to_string());
        let sys = |e: Errno| io::Error::from_raw_os_error(e.code());
        self.writable().map_err(sys)?;
        let (last, dirs) = path.split_last().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "redact needs a path below the mount point",
            )
        })?;
        let mut oids = BTreeSet::new();
        let live = resolve(&self.store, path).map_err(store_err)?;
        if let Some(oid) = live {
            subtree(&self.store, oid, &mut oids).map_err(store_err)?;
        }
        for snap in self.store.snapshots() {
            let view = self.store.snapshot(&snap.name).map_err(store_err)?;
            if let Some(oid) = resolve(&view, path).map_err(store_err)? {
                subtree(&view, oid, &mut oids).map_err(store_err)?;
            }
        }
        if oids.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        if let Some(oid) = live {
            let parent = resolve(&self.store, dirs)
                .map_err(store_err)?
                .unwrap_or(ROOT_DIR);
            self.remove_tree(parent, last, oid).map_err(sys)?;
            // Other hard links of the removed files, anywhere in the tree.
            for (dir, name, oid) in self.names_of(&oids).map_err(store_err)? {
                match self.unlink(dir, &name) {
                    Ok(()) => self.tell_kernel_removed(dir, &name, oid),
                    Err(Errno::ENOENT) => {}
                    Err(e) => return Err(sys(e)),
                }
            }
        }
        let oids: Vec<u64> = oids.into_iter().collect();
        if live.is_some() {
            // Their attributes (links left) and pages, which the kernel may
            // hold for an inode it keeps after the names went.
            for &oid in &oids {
                self.tell_kernel_changed(oid);
            }
        }
        let still_open = oids
            .iter()
            .filter(|&&oid| self.store.exists(oid).unwrap_or(false))
            .count();
        let snapshots = self.store.redact_snapshots(&oids).map_err(store_err)?;
        Ok(crate::Redacted {
            live: live.is_some(),
            objects: oids.len(),
            still_open,
            snapshots,
        })
    }

    /// `rm -r` of `name` in `parent` (object `oid`), through the usual calls.
    fn remove_tree(&self, parent: u64, name: &[u8], oid: u64) -> R<()> {
        let is_dir = self.fetch(oid)?.0.is_dir();
        if is_dir {
            for (child, target) in self.store.list(oid).map_err(errno)? {
                self.remove_tree(oid, &child, target)?;
            }
            self.rmdir(parent, name)?;
        } else {
            self.unlink(parent, name)?;
        }
        self.tell_kernel_removed(parent, name, oid);
        Ok(())
    }

    /// Every live name (directory, name, object) that points at one of
    /// `oids` (a walk of the whole tree; empty at once when none of them is
    /// linked).
    fn names_of(&self, oids: &BTreeSet<u64>) -> Result<Vec<(u64, Vec<u8>, u64)>, StoreError> {
        let linked = oids.iter().any(|&oid| {
            self.fetch(oid)
                .map(|(a, _)| a.nlink > 0 && !a.is_dir())
                .unwrap_or(false)
        });
        let mut out = Vec::new();
        if !linked {
            return Ok(out);
        }
        let mut dirs = vec![ROOT_DIR];
        while let Some(dir) = dirs.pop() {
            for (name, target) in self.store.list(dir)? {
                if oids.contains(&target) {
                    out.push((dir, name, target));
                } else if self.fetch(target).is_ok_and(|(a, _)| a.is_dir()) {
                    dirs.push(target);
                }
            }
        }
        Ok(out)
    }
}

/// The object at `path` (components from the root) in `store`, if any.
fn resolve(store: &Store, path: &[Vec<u8>]) -> Result<Option<u64>, StoreError> {
    let mut at = ROOT_DIR;
    for name in path {
        match store.lookup(at, name)? {
            Some(next) => at = next,
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

/// Adds `oid` and, for a directory, every object beneath it in `store` to
/// `out` (which may hold objects found in other roots: each root is walked
/// in full, since the same directory may hold other files in each).
fn subtree(store: &Store, oid: u64, out: &mut BTreeSet<u64>) -> Result<(), StoreError> {
    let mut todo = vec![oid];
    let mut seen = BTreeSet::new();
    while let Some(oid) = todo.pop() {
        if !seen.insert(oid) {
            continue;
        }
        out.insert(oid);
        // A file lists no names.
        todo.extend(store.list(oid)?.into_iter().map(|(_, target)| target));
    }
    Ok(())
}
