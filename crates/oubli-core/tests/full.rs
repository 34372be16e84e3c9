//! A store whose medium fills up (issue 39), in memory: writes are refused with `NoSpace` before anything changes, what was accepted is flushed and survives, and deleting, committing, the cleaner and reopening work from the reserve.

mod common;

use common::options;
use oubli_core::{CreateOptions, Error, Medium, Store, Vault};
use oubli_media::{FaultMedium, MemMedium};
use oubli_vault::MemoryVault;
use std::sync::Arc;

const LIMIT: u64 = 48 << 20;

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn full_medium() -> (Arc<FaultMedium<Arc<MemMedium>>>, Arc<MemMedium>) {
    let mem = Arc::new(MemMedium::new());
    let medium = Arc::new(FaultMedium::new(mem.clone()));
    medium.set_space_limit(Some(LIMIT));
    (medium, mem)
}

fn create(medium: Arc<dyn Medium>) -> (Store, Arc<MemoryVault>) {
    let vault = Arc::new(MemoryVault::empty());
    let v = vault.clone();
    let store = Store::create(
        medium,
        move |r| {
            v.store(r)?;
            Ok(v)
        },
        CreateOptions::default(),
        options(),
    )
    .unwrap();
    (store, vault)
}

/// Writes objects of `size` (some in small writes that stay buffered)
/// until a write is refused; returns the objects written whole.
fn fill(store: &Store, size: usize) -> Vec<(u64, u64)> {
    let mut written = Vec::new();
    for seed in 0.. {
        assert!(seed < 1000, "never full");
        let oid = match store.create_object(b"") {
            Ok(oid) => oid,
            Err(Error::NoSpace(_)) => return written,
            Err(e) => panic!("create_object: {e}"),
        };
        let data = noise(size, seed);
        // Every third object in 4 KiB writes, which stay in the write buffer.
        let step = if seed % 3 == 0 { 4096 } else { size };
        for (i, chunk) in data.chunks(step).enumerate() {
            match store.write(oid, (i * step) as u64, chunk) {
                Ok(()) => {}
                Err(Error::NoSpace(why)) => {
                    assert!(why.contains("kept for deleting"), "{why}");
                    return written;
                }
                Err(e) => panic!("write: {e}"),
            }
        }
        written.push((oid, seed));
    }
    unreachable!()
}

fn check(store: &Store, written: &[(u64, u64)], size: usize) {
    for &(oid, seed) in written {
        assert!(
            store.read(oid, 0, size).unwrap() == noise(size, seed),
            "object {oid} reads back wrong"
        );
    }
}

/// Fill, then every way out: the refused write changed nothing and did not
/// poison the store; the buffered writes accepted before are flushed;
/// the full store reopens; deletes, a commit and the cleaner return the
/// space; writes resume.
#[test]
fn a_full_medium_refuses_writes_and_recovers() {
    let (medium, mem) = full_medium();
    let (store, vault) = create(medium.clone());
    let size = 256 << 10;
    let written = fill(&store, size);
    assert!(written.len() >= 100, "only {} objects fit", written.len());
    let space = store.space().unwrap().unwrap();
    assert!(space.nearly_full(), "{space:?}");
    assert!(
        space.reserve > 0 && space.free >= space.reserve && space.available < size as u64 * 2,
        "{space:?}"
    );
    // Not poisoned: reads, a flush of what the buffer holds, a commit.
    check(&store, &written, size);
    store.flush().unwrap();
    store.commit().unwrap();
    drop(store);
    // The full store opens, and everything accepted is there.
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    check(&store, &written, size);
    let (gone, kept) = written.split_at(written.len() / 2);
    for &(oid, _) in gone {
        store.delete(oid).unwrap();
    }
    store.commit().unwrap();
    let report = store.gc(0.9).unwrap();
    assert!(report.bytes_reclaimed > 0, "{report:?}");
    let again = fill(&store, size);
    assert!(
        again.len() >= 10,
        "only {} objects after the cleaner",
        again.len()
    );
    check(&store, kept, size);
    check(&store, &again, size);
    store.commit().unwrap();
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
    drop(store);
    // Never past the limit, so never a failed append.
    let used: u64 = mem
        .list_segments()
        .unwrap()
        .iter()
        .map(|&s| mem.segment_len(s).unwrap().unwrap_or(0))
        .sum();
    assert!(used <= LIMIT);
}
