//! A store whose medium fills up (issue 39), in memory: writes are refused with `NoSpace` before anything changes, what was accepted is flushed and survives, and deleting, committing, the cleaner and reopening work from the reserve.

mod common;

use common::options;
use oubli_core::{CreateOptions, Error, Medium, Store, Vault, ROOT_DIR};
use oubli_media::{FaultMedium, MemMedium, TearMode};
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
    create_with(medium, CreateOptions::default())
}

fn create_with(medium: Arc<dyn Medium>, create: CreateOptions) -> (Store, Arc<MemoryVault>) {
    let vault = Arc::new(MemoryVault::empty());
    let v = vault.clone();
    let store = Store::create(
        medium,
        move |r| {
            v.store(r)?;
            Ok(v)
        },
        create,
        options(),
    )
    .unwrap();
    (store, vault)
}

/// Options of a store under the keyed hash forest (whose keys live
/// outside the tree, so that key consolidation has work).
fn forest() -> CreateOptions {
    CreateOptions {
        key_scheme: oubli_crypto::SCHEME_KEYED_HASH_FOREST,
        ..CreateOptions::default()
    }
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

/// Bytes the medium's segments hold.
fn used(mem: &MemMedium) -> u64 {
    mem.list_segments()
        .unwrap()
        .iter()
        .map(|&s| mem.segment_len(s).unwrap().unwrap_or(0))
        .sum()
}

fn no_space<T: std::fmt::Debug>(what: &str, r: oubli_core::Result<T>) {
    match r {
        Err(Error::NoSpace(_)) => {}
        other => panic!("{what}: expected NoSpace, got {other:?}"),
    }
}

/// Another program fills the medium past the reserve (the limit drops to
/// what the store holds) and later frees its file: the flush of buffered
/// data, a write already admitted and a commit fail with `NoSpace`
/// without poisoning the store; deletes and reads go on; once the space is
/// back, the same handle flushes, commits and writes, and everything
/// acknowledged is there after a reopen.
#[test]
fn a_medium_filled_by_someone_else_does_not_poison_the_store() {
    let (medium, mem) = full_medium();
    let (store, vault) = create(medium.clone());
    let size = 256 << 10;
    // Committed, flushed, and only buffered (4 KiB writes).
    let committed = store.create_object(b"").unwrap();
    store.write(committed, 0, &noise(size, 1)).unwrap();
    store.commit().unwrap();
    let flushed = store.create_object(b"").unwrap();
    store.write(flushed, 0, &noise(size, 2)).unwrap();
    store.flush().unwrap();
    let buffered = store.create_object(b"").unwrap();
    let small = noise(32 << 10, 3);
    for (i, chunk) in small.chunks(4096).enumerate() {
        store.write(buffered, (i * 4096) as u64, chunk).unwrap();
    }
    // Measured now: the next write is admitted against this.
    assert!(!store.space().unwrap().unwrap().nearly_full());
    // Someone else takes every free byte.
    medium.set_space_limit(Some(used(&mem)));
    let late = store.create_object(b"").unwrap();
    no_space(
        "a write admitted before the disk filled",
        store.write(late, 0, &noise(size, 4)),
    );
    no_space("flushing the buffer", store.flush());
    no_space(
        "a write on the full disk",
        store.write(flushed, 0, &noise(size, 5)),
    );
    // Not poisoned: reads, and a delete (its erasure waits for a commit).
    assert_eq!(store.read(flushed, 0, size).unwrap(), noise(size, 2));
    assert_eq!(store.read(buffered, 0, small.len()).unwrap(), small);
    store.delete(committed).unwrap();
    no_space("committing on the full disk", store.commit());
    // The other program frees its file: everything resumes on this handle.
    medium.set_space_limit(Some(LIMIT));
    store.flush().unwrap();
    store.commit().unwrap();
    store.write(late, 0, &noise(size, 6)).unwrap();
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    assert!(matches!(store.object(committed), Err(Error::NoObject(_))));
    assert_eq!(store.read(flushed, 0, size).unwrap(), noise(size, 2));
    assert_eq!(store.read(buffered, 0, small.len()).unwrap(), small);
    assert_eq!(store.read(late, 0, size).unwrap(), noise(size, 6));
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
}

/// A write at random across two cells of a streamed file, on a disk
/// another program filled with room for one split only (DESIGN §3, "Split
/// cells"): the first cell splits, the second finds no room for its small
/// cells and takes the write whole in the buffer. The write is accepted
/// as a whole — not refused after changing the first cell (the simulator
/// found that, seeds 24, 45 and 9182 once splits came in) — and is there
/// after a reopen.
#[test]
fn a_write_that_finds_no_room_for_a_split_is_taken_whole() {
    let (medium, mem) = full_medium();
    let (store, vault) = create(medium.clone());
    let size = 256 << 10;
    let oid = store.create_object(b"").unwrap();
    let mut want = noise(size, 1);
    store.write(oid, 0, &want).unwrap();
    store.commit().unwrap();
    // Room for the eight small cells of one 32 KiB cell, not sixteen.
    medium.set_space_limit(Some(used(&mem) + 40_000));
    let data = noise(9000, 2);
    store.write(oid, 30_000, &data).unwrap();
    want[30_000..39_000].copy_from_slice(&data);
    assert_eq!(store.read(oid, 0, size).unwrap(), want);
    let status = store.status().unwrap();
    assert_eq!(status.cells_split, 1);
    medium.set_space_limit(Some(LIMIT));
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    assert_eq!(store.read(oid, 0, size).unwrap(), want);
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
}

/// What the sweep below expects each object to hold.
type Expected = Vec<(u64, Vec<u8>)>;

/// The store, its medium and vault, what it holds, and the object deleted.
type Setup = (
    Store,
    Arc<FaultMedium<Arc<MemMedium>>>,
    Arc<MemoryVault>,
    Expected,
    u64,
);

/// A store with committed objects, one of them deleted since, and changes
/// both written out and buffered: a flush and a commit each have work.
fn sweep_setup() -> Setup {
    let medium = Arc::new(FaultMedium::new(Arc::new(MemMedium::new())));
    let (store, vault) = create(medium.clone());
    let mut expected = Vec::new();
    for seed in 0..4 {
        let oid = store.create_object(b"").unwrap();
        let data = noise(100 << 10, seed);
        store.write(oid, 0, &data).unwrap();
        expected.push((oid, data));
    }
    store.commit().unwrap();
    let (doomed, _) = expected.remove(0);
    store.delete(doomed).unwrap();
    // An overwrite sealed at once, and small writes that stay buffered.
    let (oid, data) = &mut expected[0];
    let over = noise(64 << 10, 10);
    store.write(*oid, 0, &over).unwrap();
    data[..over.len()].copy_from_slice(&over);
    let oid = store.create_object(b"").unwrap();
    let small = noise(20 << 10, 11);
    for (i, chunk) in small.chunks(4096).enumerate() {
        store.write(oid, (i * 4096) as u64, chunk).unwrap();
    }
    expected.push((oid, small));
    (store, medium, vault, expected, doomed)
}

fn check_expected(store: &Store, expected: &Expected, doomed: u64, when: &str) {
    for (oid, data) in expected {
        let got = store.read(*oid, 0, data.len() + 1).unwrap();
        assert!(got == *data, "{when}: object {oid} reads back wrong");
    }
    assert!(
        matches!(store.object(doomed), Err(Error::NoObject(_))),
        "{when}: the deleted object is back"
    );
}

/// `StorageFull` at every I/O point of a flush (`commit == false`) or a
/// commit: the call fails with `NoSpace`, the store is not poisoned, the
/// retry succeeds (the space came back), everything acknowledged reads
/// back before and after a reopen, and the deleted object stays gone.
fn sweep(commit: bool) {
    let run = |s: &Store| if commit { s.commit() } else { s.flush() };
    let points = {
        let (store, medium, ..) = sweep_setup();
        let start = medium.points();
        run(&store).unwrap();
        medium.points() - start
    };
    assert!(points >= 3, "only {points} I/O points");
    let mut refused = 0;
    for k in 0..points {
        let (store, medium, vault, expected, doomed) = sweep_setup();
        medium.arm_no_space(medium.points() + k);
        let when = format!("no space at point {k} of {points}");
        match run(&store) {
            Err(Error::NoSpace(_)) => refused += 1,
            // Past the commit point: a segment the commit doomed.
            Ok(()) if commit => {}
            other => panic!("{when}: expected NoSpace, got {other:?}"),
        }
        check_expected(&store, &expected, doomed, &when);
        let mut expected = expected;
        // A change accepted between the failure and the retry.
        let oid = store.create_object(b"").unwrap();
        let data = noise(6000, 20 + k);
        store.write(oid, 0, &data).unwrap();
        expected.push((oid, data));
        run(&store).unwrap_or_else(|e| panic!("{when}: the retry failed: {e}"));
        check_expected(&store, &expected, doomed, &when);
        if !commit {
            // The log alone, replayed: the frame finished late and the
            // one after it are both there.
            drop(store);
            let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
            check_expected(&store, &expected, doomed, &format!("{when}, replayed"));
        } else {
            drop(store);
        }
        let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
        store
            .commit()
            .unwrap_or_else(|e| panic!("{when}: commit: {e}"));
        drop(store);
        let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
        check_expected(&store, &expected, doomed, &format!("{when}, reopened"));
        let fsck = store.fsck(&mut |_| {}).unwrap();
        assert!(fsck.problems.is_empty(), "{when}: {:?}", fsck.problems);
    }
    assert!(refused >= 3, "only {refused} of {points} points refused");
}

#[test]
fn no_space_at_every_io_point_of_a_flush() {
    sweep(false);
}

#[test]
fn no_space_at_every_io_point_of_a_commit() {
    sweep(true);
}

/// A truncate inside a cell on a medium another program filled, and a
/// cleaner run that finds no room for its copies: the truncate, which
/// must seal the cut cell anew, keeps it buffered and succeeds; the run
/// fails with `NoSpace` without poisoning the store; then the same handle
/// collects and commits, and the truncate holds after a reopen.
#[test]
fn the_cleaner_and_a_truncate_on_a_medium_filled_by_someone_else() {
    let (medium, mem) = full_medium();
    let (store, vault) = create(medium.clone());
    let size = 256 << 10;
    let mut objects = Vec::new();
    for seed in 0..8 {
        let oid = store.create_object(b"").unwrap();
        store.write(oid, 0, &noise(size, seed)).unwrap();
        objects.push((oid, seed));
    }
    store.commit().unwrap();
    // Every other object goes: their segments are half dead.
    for &(oid, _) in objects.iter().step_by(2) {
        store.delete(oid).unwrap();
    }
    store.commit().unwrap();
    let kept: Vec<_> = objects.iter().skip(1).step_by(2).copied().collect();
    medium.set_space_limit(Some(used(&mem)));
    // A truncate inside a cell: its cut cell waits in the buffer.
    let (cut, cut_seed) = kept[0];
    store.truncate(cut, 1000).unwrap();
    assert_eq!(
        store.read(cut, 0, size).unwrap(),
        noise(size, cut_seed)[..1000]
    );
    for &(oid, seed) in &kept[1..] {
        assert_eq!(store.read(oid, 0, size).unwrap(), noise(size, seed));
    }
    medium.set_space_limit(Some(LIMIT));
    // The disk fills again between the cleaner's measure and its first
    // copy: the run stops with `NoSpace`, the store goes on.
    medium.arm_no_space(medium.points());
    no_space("a cleaner run that finds no room", store.gc(0.9));
    assert_eq!(
        store.read(kept[1].0, 0, size).unwrap(),
        noise(size, kept[1].1)
    );
    let report = store.gc(0.9).unwrap();
    assert!(report.bytes_reclaimed > 0, "{report:?}");
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    assert_eq!(
        store.read(cut, 0, size).unwrap(),
        noise(size, cut_seed)[..1000]
    );
    for &(oid, seed) in &kept[1..] {
        assert_eq!(store.read(oid, 0, size).unwrap(), noise(size, seed));
    }
    for &(oid, _) in objects.iter().step_by(2) {
        assert!(matches!(store.object(oid), Err(Error::NoObject(_))));
    }
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
}

/// Lengths of every segment of `mem`.
fn lengths(mem: &MemMedium) -> std::collections::BTreeMap<u32, u64> {
    mem.list_segments()
        .unwrap()
        .into_iter()
        .map(|s| (s, mem.segment_len(s).unwrap().unwrap_or(0)))
        .collect()
}

/// Small-log store: objects of `chunk` bytes, one per flush, until a
/// flush commits because its frame does not fit the log. Returns the
/// number of flushes before it and whether that flush had put its cells
/// in the log first (a frame head whose batch never follows).
fn flushes_to_full_log(chunk: usize) -> (usize, bool) {
    let mem = Arc::new(MemMedium::with_segment_capacity(64 << 10));
    let medium = Arc::new(FaultMedium::new(mem.clone()));
    let (store, _vault) = create(medium.clone());
    let mut log = None;
    for k in 0.. {
        assert!(k < 100, "the log never filled");
        let oid = store.create_object(b"").unwrap();
        store.write(oid, 0, &noise(chunk, k as u64)).unwrap();
        let (epoch, before) = (store.epoch(), lengths(&mem));
        store.flush().unwrap();
        let after = lengths(&mem);
        let grew =
            |s: &u32| after.get(s).copied().unwrap_or(0) > before.get(s).copied().unwrap_or(0);
        if store.epoch() != epoch {
            return (k, log.as_ref().is_some_and(grew));
        }
        // The log is the one segment every flush grows.
        if log.is_none() {
            log = after.keys().copied().find(|s| grew(s));
        }
    }
    unreachable!()
}

/// A flush whose frame does not fit the log puts its cells in the log
/// (the tree names them), then commits; when that commit finds no room,
/// the log holds a frame head whose batch never follows, and the flush
/// fails with `NoSpace`. No later frame may follow that head (replay
/// stops at a frame it cannot open): the ops stay queued, so the next
/// frame is larger still and commits too. What the next flush
/// acknowledges — the failed flush's writes with it — survives a power
/// cut.
#[test]
fn a_full_log_whose_commit_found_no_room_loses_nothing_at_a_cut() {
    // The window is the batch's size (tens of bytes) in every frame's
    // worth of sizes: one byte at a time.
    let chunk = (3000..3400)
        .find(|&c| flushes_to_full_log(c).1)
        .expect("no chunk size puts cells in a full log");
    let k = flushes_to_full_log(chunk).0;
    let mem = Arc::new(MemMedium::with_segment_capacity(64 << 10));
    let medium = Arc::new(FaultMedium::new(mem.clone()));
    let (store, vault) = create(medium.clone());
    let mut expected = Vec::new();
    for i in 0..=k {
        let oid = store.create_object(b"").unwrap();
        let data = noise(chunk, i as u64);
        store.write(oid, 0, &data).unwrap();
        expected.push((oid, data));
        if i == k {
            // The cells go down (one point), the commit's first append fails.
            medium.arm_no_space(medium.points() + 1);
            no_space("the flush whose commit found no room", store.flush());
        } else {
            store.flush().unwrap();
        }
    }
    // A small change, acknowledged by a flush.
    let oid = store.create_object(b"small").unwrap();
    store.write(oid, 0, b"acknowledged").unwrap();
    expected.push((oid, b"acknowledged".to_vec()));
    store.flush().unwrap();
    let cut = Arc::new(mem.crash(TearMode::DropUnsynced, 0));
    drop(store);
    let store = Store::open(cut, vault, options()).unwrap();
    for (oid, data) in &expected {
        let got = store.read(*oid, 0, data.len()).unwrap_or_default();
        assert!(got == *data, "object {oid} lost after the cut");
    }
}

/// Key consolidation (a keyed hash forest re-seals every live cell) that
/// finds no room partway: `NoSpace`, and the store is not poisoned — the
/// cells re-sealed so far name copies that landed, the others their old
/// units; deletes and commits go on, a later pass finishes, and
/// everything reads back after a reopen.
#[test]
fn key_consolidation_that_finds_no_room_does_not_poison_the_store() {
    let medium = Arc::new(FaultMedium::new(Arc::new(MemMedium::new())));
    let (store, vault) = create_with(medium.clone(), forest());
    let size = 128 << 10;
    let mut objects = Vec::new();
    for seed in 0..6 {
        let oid = store.create_object(b"").unwrap();
        store.write(oid, 0, &noise(size, seed)).unwrap();
        objects.push((oid, seed));
    }
    store.commit().unwrap();
    let (gone, _) = objects.remove(0);
    store.delete(gone).unwrap();
    // Its commit first (points 0..), then the copies: the one after a few.
    let points = medium.points();
    store.commit().unwrap();
    let commit_points = medium.points() - points;
    medium.arm_no_space(medium.points() + commit_points + 3);
    no_space("consolidation", store.consolidate_keys());
    for &(oid, seed) in &objects {
        assert_eq!(store.read(oid, 0, size).unwrap(), noise(size, seed));
    }
    let (gone2, _) = objects.remove(0);
    store.delete(gone2).unwrap();
    store.commit().unwrap();
    store.consolidate_keys().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    for &(oid, seed) in &objects {
        assert_eq!(store.read(oid, 0, size).unwrap(), noise(size, seed));
    }
    for oid in [gone, gone2] {
        assert!(matches!(store.object(oid), Err(Error::NoObject(_))));
    }
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
}

/// Key consolidation copies all live data, so it is new data as far as the
/// medium's room goes: on a store more than half full it is refused with
/// `NoSpace` before it changes anything, instead of eating the reserve
/// that deletes, commits and the cleaner need.
#[test]
fn key_consolidation_leaves_the_reserve_alone() {
    let (medium, _mem) = full_medium();
    let (store, vault) = create_with(medium.clone(), forest());
    let size = 256 << 10;
    let mut objects = Vec::new();
    for seed in 0..(LIMIT / size as u64 * 2 / 3) {
        let oid = store.create_object(b"").unwrap();
        store.write(oid, 0, &noise(size, seed)).unwrap();
        objects.push((oid, seed));
    }
    store.commit().unwrap();
    let space = store.space().unwrap().unwrap();
    no_space(
        "consolidating two thirds of the medium",
        store.consolidate_keys(),
    );
    assert_eq!(store.space().unwrap().unwrap().free, space.free);
    // Nothing changed, nothing poisoned.
    let (gone, _) = objects.remove(0);
    store.delete(gone).unwrap();
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    for &(oid, seed) in &objects {
        assert_eq!(store.read(oid, 0, size).unwrap(), noise(size, seed));
    }
    assert!(matches!(store.object(gone), Err(Error::NoObject(_))));
}

/// What a snapshot or share call did, as the store shows it: `true` once
/// its change is in.
type Applied = fn(&Store) -> bool;

/// A store with a committed object, snapshot `s` holding it, and changes
/// both written out and buffered, so that the call's flush has work of
/// its own before the call's change.
fn catalog_setup() -> (Store, Arc<FaultMedium<Arc<MemMedium>>>, Arc<MemoryVault>) {
    let medium = Arc::new(FaultMedium::new(Arc::new(MemMedium::new())));
    let (store, vault) = create(medium.clone());
    let kept = store.create_object(b"").unwrap();
    store.write(kept, 0, &noise(64 << 10, 1)).unwrap();
    store.snapshot_create("s", None).unwrap();
    store.commit().unwrap();
    let more = store.create_object(b"").unwrap();
    store.write(more, 0, &noise(40 << 10, 2)).unwrap();
    let small = store.create_object(b"").unwrap();
    for (i, chunk) in noise(12 << 10, 3).chunks(4096).enumerate() {
        store.write(small, (i * 4096) as u64, chunk).unwrap();
    }
    (store, medium, vault)
}

/// `StorageFull` at every I/O point of a call that changes the catalog and
/// is durable when it returns (snapshot removal and creation, redaction,
/// share creation): the call either succeeds, and its change is there
/// after a reopen, or answers `NoSpace` having changed nothing: the store
/// shows the old state, and a flush once the space is back, a commit and a
/// reopen do not bring the change in behind the caller's back.
fn catalog_sweep(what: &str, call: fn(&Store) -> oubli_core::Result<()>, applied: Applied) {
    let points = {
        let (store, medium, _) = catalog_setup();
        let start = medium.points();
        call(&store).unwrap();
        assert!(applied(&store), "{what}: no change without a fault");
        medium.points() - start
    };
    assert!(points >= 3, "{what}: only {points} I/O points");
    let mut refused = 0;
    for k in 0..points {
        let (store, medium, vault) = catalog_setup();
        medium.arm_no_space(medium.points() + k);
        let when = format!("{what}, no space at point {k} of {points}");
        let expect = match call(&store) {
            Ok(()) => true,
            Err(Error::NoSpace(_)) => {
                refused += 1;
                false
            }
            Err(e) => panic!("{when}: expected NoSpace or success, got {e}"),
        };
        let state = if expect {
            "succeeded"
        } else {
            "answered NoSpace"
        };
        assert_eq!(applied(&store), expect, "{when}: the call {state}");
        store
            .flush()
            .unwrap_or_else(|e| panic!("{when}: flush: {e}"));
        assert_eq!(applied(&store), expect, "{when}: after a flush");
        drop(store);
        let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
        assert_eq!(applied(&store), expect, "{when}: the log replayed");
        store.commit().unwrap();
        drop(store);
        let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
        assert_eq!(applied(&store), expect, "{when}: committed and reopened");
    }
    assert!(
        refused >= 2,
        "{what}: only {refused} of {points} points refused"
    );
}

fn has_snapshot(store: &Store, name: &str) -> bool {
    store.snapshots().iter().any(|s| s.name == name)
}

#[test]
fn a_snapshot_removal_that_answers_no_space_changed_nothing() {
    catalog_sweep(
        "snapshot removal",
        |s| s.snapshot_remove("s"),
        |s| !has_snapshot(s, "s"),
    );
}

#[test]
fn a_snapshot_creation_that_answers_no_space_changed_nothing() {
    catalog_sweep(
        "snapshot creation",
        |s| s.snapshot_create("n", None).map(drop),
        |s| has_snapshot(s, "n"),
    );
}

#[test]
fn a_redaction_that_answers_no_space_changed_nothing() {
    // The object snapshot `s` holds besides the root directory.
    fn held(s: &Store) -> Vec<u64> {
        let snapshot = s.snapshot("s").unwrap();
        let objects = snapshot.objects().unwrap();
        objects
            .into_iter()
            .map(|(oid, _)| oid)
            .filter(|&o| o != ROOT_DIR)
            .collect()
    }
    catalog_sweep(
        "redaction",
        |s| s.redact_snapshots(&held(s)).map(drop),
        |s| held(s).is_empty(),
    );
}

#[test]
fn a_share_creation_that_answers_no_space_changed_nothing() {
    catalog_sweep(
        "share creation",
        |s| {
            s.share_create("t", "mem:t", |r| {
                let v = MemoryVault::empty();
                v.store(r)?;
                Ok(v)
            })
            .map(drop)
        },
        |s| s.shares().iter().any(|i| i.name == "t"),
    );
}

/// `StorageFull` at every I/O point of a write whose head merges into a
/// partly overwritten cell and whose whole cells after it were sealed
/// before the lock: the write either succeeds or answers `NoSpace` having
/// changed nothing, and a truncate after it, a flush and a reopen show the
/// same bytes.
#[test]
fn a_write_that_answers_no_space_changed_nothing() {
    let setup = || {
        let medium = Arc::new(FaultMedium::new(Arc::new(MemMedium::new())));
        let small_cells = CreateOptions {
            cell_size: oubli_core::SMALL_CELL_SIZE,
            ..CreateOptions::default()
        };
        let (store, vault) = create_with(medium.clone(), small_cells);
        let oid = store.create_object(b"").unwrap();
        let old = noise(200 << 10, 1);
        store.write(oid, 0, &old).unwrap();
        store.commit().unwrap();
        (store, medium, vault, oid, old)
    };
    let new = noise(18909, 3);
    let points = {
        let (store, medium, _, oid, _) = setup();
        let start = medium.points();
        store.write(oid, 1742, &new).unwrap();
        medium.points() - start
    };
    let mut refused = 0;
    for k in 0..points.max(1) {
        let (store, medium, vault, oid, mut expected) = setup();
        medium.arm_no_space(medium.points() + k);
        let when = format!("no space at point {k} of {points}");
        match store.write(oid, 1742, &new) {
            Ok(()) => expected[1742..1742 + new.len()].copy_from_slice(&new),
            Err(Error::NoSpace(_)) => refused += 1,
            Err(e) => panic!("{when}: {e}"),
        }
        let read = |s: &Store, expected: &[u8], what: &str| {
            let got = s.read(oid, 0, expected.len() + 1).unwrap();
            assert_eq!(got.len(), expected.len(), "{when}, {what}");
            let at = got.iter().zip(expected).position(|(a, b)| a != b);
            assert!(
                at.is_none(),
                "{when}, {what}: first difference at byte {at:?}"
            );
        };
        read(&store, &expected, "after the write");
        store.truncate(oid, 59665).unwrap();
        expected.truncate(59665);
        read(&store, &expected, "after a truncate");
        store.flush().unwrap();
        drop(store);
        let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
        read(&store, &expected, "reopened");
    }
    assert!(refused >= 1, "only {refused} of {points} points refused");
}

/// Another program fills the medium to the last byte while the store is
/// closed, its intent log holding a flush the last commit did not: the
/// store opens (the commit that puts the replayed log in the tree finds
/// no room), reads work, and changes answer `NoSpace` having changed
/// nothing; once the space is back the same handle deletes and commits,
/// and a reopen finds everything acknowledged.
#[test]
fn a_store_opens_on_a_medium_another_program_filled_to_the_last_byte() {
    let (medium, mem) = full_medium();
    let (store, vault) = create(medium.clone());
    let size = 256 << 10;
    let kept = store.create_object(b"").unwrap();
    store.write(kept, 0, &noise(size, 1)).unwrap();
    store.commit().unwrap();
    let logged = store.create_object(b"").unwrap();
    store.write(logged, 0, &noise(size, 2)).unwrap();
    store.flush().unwrap();
    drop(store);
    medium.set_space_limit(Some(used(&mem)));
    let store = Store::open(medium.clone(), vault.clone(), options())
        .unwrap_or_else(|e| panic!("opening on the full medium: {e}"));
    assert_eq!(store.read(kept, 0, size).unwrap(), noise(size, 1));
    assert_eq!(store.read(logged, 0, size).unwrap(), noise(size, 2));
    no_space("a write", store.write(kept, 0, &noise(size, 3)));
    no_space("a delete", store.delete(logged));
    no_space("a commit", store.commit());
    assert_eq!(store.read(logged, 0, size).unwrap(), noise(size, 2));
    // The other program frees its file: the same handle goes on, a flush
    // first (the commit the open could not make is what it writes).
    medium.set_space_limit(Some(LIMIT));
    store.flush().unwrap();
    store.delete(logged).unwrap();
    store.commit().unwrap();
    drop(store);
    let store = Store::open(medium.clone(), vault.clone(), options()).unwrap();
    assert_eq!(store.read(kept, 0, size).unwrap(), noise(size, 1));
    assert!(matches!(store.object(logged), Err(Error::NoObject(_))));
    let fsck = store.fsck(&mut |_| {}).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
}
