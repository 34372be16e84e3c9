//! Objects that nothing reaches: no name in any directory, no front-end's own list — left by a command that died half-way; `fsck` reports them, `gc` deletes them.

use oubli_core::{Result, Store, ROOT_DIR};
use std::collections::{BTreeSet, VecDeque};

/// Every object no name and no front-end reaches, ascending. Reachable are
/// the root directory, everything named in a directory reachable from it
/// (the NBD exports' directory among them), and the mount's own roots (its
/// orphan list of files unlinked while open, which the next mount erases).
/// Meaningful only while no mount or server holds the store (their open
/// files are reached by their memory alone): the CLI holds the store lock.
pub fn orphans(store: &Store) -> Result<Vec<u64>> {
    let mut reached = BTreeSet::from([ROOT_DIR]);
    let mut queue: VecDeque<u64> = VecDeque::from([ROOT_DIR]);
    for root in oubli_fuse::unnamed_roots(store)? {
        if reached.insert(root) {
            queue.push_back(root);
        }
    }
    while let Some(dir) = queue.pop_front() {
        for (_, target) in store.list(dir)? {
            if reached.insert(target) {
                queue.push_back(target);
            }
        }
    }
    Ok(store
        .objects()?
        .into_iter()
        .map(|(oid, _)| oid)
        .filter(|oid| !reached.contains(oid))
        .collect())
}

/// Deletes every orphan (erased at the next commit); returns how many.
pub fn delete_orphans(store: &Store) -> Result<usize> {
    let doomed = orphans(store)?;
    for &oid in &doomed {
        store.delete(oid)?;
    }
    Ok(doomed.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateOptions, EpochPolicy, MemMedium, MemoryVault, Options};
    use std::sync::Arc;

    #[test]
    fn unnamed_objects_are_orphans_named_ones_are_not() {
        let store = Store::create(
            Arc::new(MemMedium::new()),
            |first| Ok(MemoryVault::new(first.clone())),
            CreateOptions::default(),
            Options {
                policy: EpochPolicy::manual(),
                ..Options::default()
            },
        )
        .unwrap();
        let dir = store.create_object(b"").unwrap();
        store.link(ROOT_DIR, b"d", dir).unwrap();
        let named = store.create_object(b"").unwrap();
        store.link(dir, b"f", named).unwrap();
        let lost = store.create_object(b"").unwrap();
        store.write(lost, 0, b"partial plaintext").unwrap();
        assert_eq!(orphans(&store).unwrap(), vec![lost]);
        assert_eq!(delete_orphans(&store).unwrap(), 1);
        assert!(orphans(&store).unwrap().is_empty());
        assert!(store.exists(named).unwrap());
        assert!(!store.exists(lost).unwrap());
    }
}
