//! The inode table: which inodes are in memory, loading them from and writing them back to their objects, and the gate that orders namespace operations.

use super::{errno, kind_of, lock, Fs, Node, State, R};
use crate::meta::{Attr, S_IFDIR};
use fuser::{Errno, FileType};
use oubli_core::ROOT_DIR;
use std::collections::HashMap;
use std::sync::{Arc, RwLockReadGuard, RwLockWriteGuard};

/// Inodes kept whole in memory. The kernel references every inode it has
/// in its cache (a million after a walk of a million files) until memory
/// pressure makes it forget them; past this many, clean inodes nobody is
/// using are shed to their lookup count and loaded again when asked for, so
/// the mount's memory does not grow with the kernel's cache (about 300 B per
/// whole inode, 32 B per shed one).
pub(crate) const LOADED_INODES_MAX: usize = 1 << 16;

/// The inodes the kernel knows: whole, or shed to their lookup count.
#[derive(Default)]
pub(super) struct Inodes {
    pub(super) loaded: HashMap<u64, Arc<Node>>,
    /// Lookups of inodes whose state was dropped (clean, unused, not deleted).
    pub(super) shed: HashMap<u64, u64>,
}

impl Inodes {
    pub(super) fn insert(&mut self, oid: u64, node: Arc<Node>) {
        self.loaded.insert(oid, node);
        if self.loaded.len() > LOADED_INODES_MAX {
            self.shed_unused(LOADED_INODES_MAX / 4);
        }
    }

    /// Sheds up to `count` inodes that only this table holds (no request
    /// has them: every `Arc` is cloned under the table's lock) and that hold
    /// nothing the store lacks: no open handle, no pending attribute, not
    /// deleted (an unlinked inode lives only here until forgotten).
    pub(super) fn shed_unused(&mut self, count: usize) {
        let victims: Vec<(u64, u64)> = self
            .loaded
            .iter()
            .filter(|(&oid, node)| oid != ROOT_DIR && Arc::strong_count(node) == 1)
            .filter_map(|(&oid, node)| {
                let st = node.st.try_lock().ok()?;
                (st.opens == 0 && !st.dirty && !st.deleted).then_some((oid, st.lookups))
            })
            .take(count)
            .collect();
        for (oid, lookups) in victims {
            self.loaded.remove(&oid);
            if lookups > 0 {
                self.shed.insert(oid, lookups);
            }
        }
    }
}

impl Fs {
    pub(super) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn writable(&self) -> R<()> {
        if self.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// Reads an object's attributes and size from the store.
    pub(super) fn fetch(&self, oid: u64) -> R<(Attr, u64)> {
        let rec = self.store.object(oid).map_err(errno)?;
        let attr = Attr::decode(&rec.meta, oid == ROOT_DIR, self.owner).map_err(|e| {
            eprintln!("oubli-fuse: object {oid}: {e}");
            Errno::EIO
        })?;
        let mut attr = attr;
        if attr.protected && !self.store.list(oid).map_err(errno)?.is_empty() {
            // Another front-end's directory object: browsable, read-only.
            attr.mode = S_IFDIR | 0o555;
            attr.nlink = 2;
            attr.parent = ROOT_DIR;
        }
        let size = match &attr.symlink {
            Some(t) => t.len() as u64,
            None => rec.size,
        };
        Ok((attr, size))
    }

    /// The inode in memory, loading it if needed; `lookups` references are added for the kernel.
    pub(super) fn node_ref(&self, oid: u64, lookups: u64) -> R<Arc<Node>> {
        let mut table = lock(&self.table);
        let node = match table.loaded.get(&oid) {
            Some(n) => n.clone(),
            None => {
                let (attr, size) = self.fetch(oid)?;
                let node = Node::new(oid, attr, size, table.shed.remove(&oid).unwrap_or(0), 0);
                table.insert(oid, node.clone());
                node
            }
        };
        if lookups > 0 {
            lock(&node.st).lookups += lookups;
        }
        Ok(node)
    }

    pub(super) fn node(&self, oid: u64) -> R<Arc<Node>> {
        self.node_ref(oid, 0)
    }

    /// The inode if it is in memory (the table lock is released on return).
    pub(super) fn cached(&self, oid: u64) -> Option<Arc<Node>> {
        lock(&self.table).loaded.get(&oid).cloned()
    }

    /// Drops an inode from memory once neither the kernel nor a handle uses it (writing back pending changes).
    pub(super) fn evict_if_unused(&self, oid: u64) {
        let mut table = lock(&self.table);
        let Some(node) = table.loaded.get(&oid).cloned() else {
            return;
        };
        let mut st = lock(&node.st);
        if st.lookups > 0 || st.opens > 0 || oid == ROOT_DIR {
            return;
        }
        if st.dirty && !st.deleted {
            // Under the table lock, so nobody reloads the stale copy meanwhile.
            if let Err(e) = self.persist(oid, &mut st) {
                eprintln!("oubli-fuse: writing back attributes of {oid}: {e:?}");
            }
        }
        table.loaded.remove(&oid);
    }

    /// Writes an inode's attributes to its object.
    pub(super) fn persist(&self, oid: u64, st: &mut State) -> R<()> {
        // Another front-end's metadata is never replaced by ours.
        if st.deleted || self.read_only || st.attr.protected {
            return Ok(());
        }
        self.store.set_meta(oid, &st.attr.encode()).map_err(errno)?;
        st.dirty = false;
        st.attr.foreign = false;
        Ok(())
    }

    /// Attributes of an object for a listing, without keeping it in memory.
    pub(super) fn peek_kind(&self, oid: u64) -> Option<FileType> {
        if let Some(node) = lock(&self.table).loaded.get(&oid) {
            return Some(kind_of(lock(&node.st).attr.mode));
        }
        self.fetch(oid).ok().map(|(a, _)| kind_of(a.mode))
    }

    pub(crate) fn forget(&self, ino: u64, n: u64) {
        {
            let mut table = lock(&self.table);
            if let Some(lookups) = table.shed.get_mut(&ino) {
                *lookups = lookups.saturating_sub(n);
                if *lookups == 0 {
                    table.shed.remove(&ino);
                }
                return;
            }
        }
        if let Some(node) = self.cached(ino) {
            let mut st = lock(&node.st);
            st.lookups = st.lookups.saturating_sub(n);
        }
        self.evict_if_unused(ino);
    }
}
