//! The engine's memory between commits is bounded: changed tree nodes past `Options::dirty_tree_bytes` make the store (and the cleaner, part way) commit, and changes waiting for the intent log are logged by themselves.

mod common;

use oubli_core::{CreateOptions, Options, Store, Vault, ROOT_DIR};
use oubli_media::{MemMedium, TearMode};
use oubli_vault::MemoryVault;
use std::sync::Arc;

/// A store with manual epochs: every commit it makes is one the memory bound forced.
fn store(dirty_tree_bytes: usize) -> (Store, Arc<MemMedium>, Arc<MemoryVault>) {
    common::store_with_parts(CreateOptions::default(), options(dirty_tree_bytes))
}

fn options(dirty_tree_bytes: usize) -> Options {
    Options {
        dirty_tree_bytes,
        ..common::options()
    }
}

/// Files with names, as a file system makes them: three tree entries each.
fn make_files(s: &Store, n: u64) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let oid = s.create_object(b"file").unwrap();
            s.write(oid, 0, &i.to_le_bytes()).unwrap();
            s.link(ROOT_DIR, format!("f{i}").as_bytes(), oid).unwrap();
            oid
        })
        .collect()
}

#[test]
fn changed_nodes_past_the_cap_make_the_store_commit_by_itself() {
    const FILES: u64 = 40_000;
    // A generous cap: the policy is manual, so nothing commits.
    let (s, _, _) = store(64 << 20);
    make_files(&s, FILES);
    assert_eq!(s.status().unwrap().epoch, 1, "no commit under the cap");

    // A small cap (the memory of some 64 nodes, measured first at 64): the
    // same work commits by itself.
    let (s, medium, vault) = store(2 << 20);
    let oids = make_files(&s, FILES);
    let epoch = s.status().unwrap().epoch;
    assert!(epoch >= 3, "only {} commits under a 2 MiB cap", epoch - 1);
    // Nothing was lost on the way, and everything is there after a reopen.
    s.flush().unwrap();
    drop(s);
    let s = Store::open(medium, vault, options(2 << 20)).unwrap();
    for (i, &oid) in oids.iter().enumerate().step_by(997) {
        assert_eq!(
            s.lookup(ROOT_DIR, format!("f{i}").as_bytes()).unwrap(),
            Some(oid)
        );
        assert_eq!(s.read(oid, 0, 8).unwrap(), (i as u64).to_le_bytes());
    }
}

#[test]
fn many_changes_without_a_flush_are_logged_by_themselves() {
    // More changes than the engine keeps waiting for the log (2^17), and
    // no flush: a power cut must still keep the early ones, which only an
    // automatic flush can have made durable.
    let (s, medium, vault) = store(64 << 20);
    let oid = s.create_object(b"").unwrap();
    s.flush().unwrap();
    for i in 0..140_000u32 {
        s.set_meta(oid, &i.to_le_bytes()).unwrap();
    }
    let after_cut = Arc::new(medium.crash(TearMode::DropUnsynced, 1));
    drop(s);
    let s = Store::open(after_cut, vault, options(64 << 20)).unwrap();
    let meta = s.object(oid).unwrap().meta;
    // Empty: not even the first change survived.
    let kept = meta.try_into().map_or(0, u32::from_le_bytes);
    assert!(kept >= 130_000, "only the first {kept} changes survived");
}

/// How many commits a cleaner run over a store of many small files makes,
/// with changed tree nodes capped at `dirty_tree_bytes`.
fn commits_of_a_cleaner_run(dirty_tree_bytes: u64) -> u64 {
    // Small segments, so that the store's nodes and cells spread over many.
    let medium = Arc::new(MemMedium::with_segment_capacity(64 << 10));
    let vault = Arc::new(MemoryVault::empty());
    let v = vault.clone();
    let options = options(dirty_tree_bytes as usize);
    let s = Store::create(
        medium.clone(),
        move |r| {
            v.store(r)?;
            Ok(v)
        },
        CreateOptions::default(),
        options.clone(),
    )
    .unwrap();
    let oids = make_files(&s, 20_000);
    s.commit().unwrap();
    // Three files in four go: every segment keeps some live units.
    for (i, &oid) in oids.iter().enumerate().filter(|(i, _)| i % 4 != 0) {
        s.unlink(ROOT_DIR, format!("f{i}").as_bytes()).unwrap();
        s.delete(oid).unwrap();
    }
    s.commit().unwrap();
    let before = s.status().unwrap().epoch;
    let report = s.gc(1.0).unwrap();
    assert!(report.segments_deleted > 10, "{report:?}");
    let commits = s.status().unwrap().epoch - before;
    // What stays is whole, also after a reopen.
    drop(s);
    let s = Store::open(medium, vault, options).unwrap();
    for (i, &oid) in oids.iter().enumerate().step_by(4) {
        let name = format!("f{i}");
        assert_eq!(s.lookup(ROOT_DIR, name.as_bytes()).unwrap(), Some(oid));
        assert_eq!(s.read(oid, 0, 8).unwrap(), (i as u64).to_le_bytes());
    }
    commits
}

#[test]
fn the_cleaner_commits_on_the_way_when_what_it_moves_passes_the_cap() {
    // A generous cap: the cleaner's own commit, after it, which drops its
    // victims and what the tree no longer reaches.
    assert_eq!(commits_of_a_cleaner_run(64 << 20), 1);
    // A small one: relocating decodes and changes the nodes on the way to
    // every unit moved, so the cleaner stops at the cap, commits what it
    // changed and goes on.
    let commits = commits_of_a_cleaner_run(256 << 10);
    assert!(commits > 3, "only {commits} commits under a 256 KiB cap");
}
