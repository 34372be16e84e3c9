//! A commit releases the engine lock across its syncs and vault rotation: reads and writes go on meanwhile, a flush waits for it, and nothing accepted meanwhile is lost.

use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store, Vault, ROOT_DIR};
use oubli_media::MemMedium;
use oubli_vault::{MemoryVault, SlowVault};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

type Gate = SlowVault<MemoryVault>;

fn options() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    }
}

fn create() -> (Arc<MemMedium>, Arc<Gate>, Arc<Store>) {
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = create_on(medium.clone(), vault.clone());
    (medium, vault, Arc::new(store))
}

fn create_on(medium: Arc<dyn Medium>, vault: Arc<dyn Vault>) -> Store {
    create_with(medium, vault, options())
}

fn create_with(medium: Arc<dyn Medium>, vault: Arc<dyn Vault>, options: Options) -> Store {
    Store::create(
        medium,
        move |r| {
            vault.store(r)?;
            Ok(vault)
        },
        CreateOptions::default(),
        options,
    )
    .unwrap()
}

/// Runs `f` on another thread; `None` if it has not finished within `wait`.
fn within<T: Send + 'static>(wait: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(wait).ok()
}

/// What a power cut does to a store: the process is gone without a flush
/// (the leaked handle never runs its `Drop`), the medium keeps what it has.
fn cut_power(store: Arc<Store>) {
    std::mem::forget(store);
}

#[test]
fn changes_go_on_while_the_vault_rotates_and_survive_a_crash_after_it() {
    let (medium, vault, store) = create();
    let oid = store.create_object(b"file").unwrap();
    store.write(oid, 0, b"before the commit").unwrap();
    store.link(ROOT_DIR, b"old", oid).unwrap();
    store.flush().unwrap();
    let epoch = store.epoch();

    vault.hold();
    let committer = {
        let store = store.clone();
        std::thread::spawn(move || store.commit())
    };
    vault.wait_until_entered();
    // The commit is inside the vault. Reads and changes do not wait for it
    // (they would, for as long as the vault takes, if it held the lock).
    let s = store.clone();
    let during = within(Duration::from_secs(20), move || {
        assert_eq!(s.read(oid, 0, 6).unwrap(), b"before");
        s.write(oid, 0, b"DURING").unwrap();
        let new = s.create_object(b"new").unwrap();
        s.write(new, 0, b"made during the commit").unwrap();
        s.link(ROOT_DIR, b"new", new).unwrap();
        s.unlink(ROOT_DIR, b"old").unwrap();
        s.link(ROOT_DIR, b"renamed", oid).unwrap();
        new
    });
    let Some(new) = during else {
        vault.release();
        panic!("a write waited for the vault rotation of a commit");
    };
    // A flush must not reach the old epoch's log, which the commit is about
    // to drop: it waits until the commit lands.
    let s = store.clone();
    let flusher = std::thread::spawn(move || s.flush());
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !flusher.is_finished(),
        "a flush returned while a commit was rotating the vault"
    );
    vault.release();
    committer.join().unwrap().unwrap();
    flusher.join().unwrap().unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    // The overwrite and the unlink came after the commit captured its tree:
    // their deletions wait for the next commit.
    assert!(store.status().unwrap().pending_deletions >= 1);

    cut_power(store);
    let store = Store::open(medium as Arc<dyn Medium>, vault, options()).unwrap();
    assert_eq!(store.read(oid, 0, 100).unwrap(), b"DURING the commit");
    assert_eq!(store.read(new, 0, 100).unwrap(), b"made during the commit");
    assert_eq!(store.lookup(ROOT_DIR, b"new").unwrap(), Some(new));
    assert_eq!(store.lookup(ROOT_DIR, b"renamed").unwrap(), Some(oid));
    assert_eq!(store.lookup(ROOT_DIR, b"old").unwrap(), None);
}

#[test]
fn a_second_commit_waits_for_the_first() {
    let (_medium, vault, store) = create();
    let oid = store.create_object(b"").unwrap();
    store.write(oid, 0, b"one").unwrap();
    let epoch = store.epoch();
    vault.hold();
    let first = {
        let store = store.clone();
        std::thread::spawn(move || store.commit())
    };
    vault.wait_until_entered();
    let s = store.clone();
    if within(Duration::from_secs(20), move || {
        s.write(oid, 0, b"two").unwrap()
    })
    .is_none()
    {
        vault.release();
        panic!("a write waited for the vault rotation of a commit");
    }
    let s = store.clone();
    let second = std::thread::spawn(move || s.commit());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!second.is_finished(), "two commits ran at once");
    vault.release();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert_eq!(store.epoch(), epoch + 2);
    assert_eq!(store.status().unwrap().pending_deletions, 0);
    assert_eq!(store.read(oid, 0, 3).unwrap(), b"two");
}

#[test]
fn a_medium_failure_anywhere_in_a_commit_poisons_the_store() {
    use oubli_media::{Fault, FaultMedium};
    // Every I/O point of the commit in turn, those of its unlocked part
    // (syncs, superblock) included: the medium may then be behind memory,
    // so changes are refused until the store is reopened.
    for k in 0.. {
        let medium = Arc::new(FaultMedium::new(MemMedium::new()));
        let store = create_on(medium.clone(), Arc::new(MemoryVault::empty()));
        let oid = store.create_object(b"").unwrap();
        store.write(oid, 0, &[5u8; 100_000]).unwrap();
        medium.arm(medium.points() + k, Fault::FailOnce);
        if store.commit().is_ok() {
            assert!(k > 3, "the commit made only {k} I/O calls");
            break;
        }
        assert!(
            store.write(oid, 0, b"more").is_err(),
            "a write was accepted after the commit failed at its I/O point {k}"
        );
    }
}

/// A cleaner run goes on a slice per change, beside a commit in flight too.
/// The victims it finishes emptying meanwhile are still named by the tree
/// that commit captured, so they must outlive its landing: a power cut
/// right after it leaves that tree as the store's.
#[test]
fn victims_emptied_beside_a_commit_outlive_its_landing() {
    use oubli_core::CleanerPolicy;
    use oubli_media::TearMode;
    const CELL: usize = 32 << 10;
    let medium = Arc::new(MemMedium::with_segment_capacity(256 << 10));
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = create_with(
        medium.clone(),
        vault.clone(),
        Options {
            policy: EpochPolicy {
                bytes: Some(4 << 20),
                ..EpochPolicy::manual()
            },
            cleaner: CleanerPolicy {
                dead_share: 0.1,
                min_dead_bytes: 64 << 10,
                threshold: 0.9,
                max_move_bytes: 64 << 20,
            },
            ..Options::default()
        },
    );
    let store = Arc::new(store);
    // Every other cell overwritten: each of the first segments half dead.
    let a = store.create_object(b"a").unwrap();
    let mut model: Vec<u8> = (0..2 << 20).map(|i| (i / CELL) as u8).collect();
    store.write(a, 0, &model).unwrap();
    store.commit().unwrap();
    for cell in (0..64).step_by(2) {
        let data = vec![0xa0 ^ cell as u8; CELL];
        store.write(a, (cell * CELL) as u64, &data).unwrap();
        model[cell * CELL..(cell + 1) * CELL].copy_from_slice(&data);
    }
    store.commit().unwrap();
    // A commit the epoch policy makes starts the cleaner.
    let b = store.create_object(b"b").unwrap();
    store.write(b, 0, &vec![0xbb; 4 << 20]).unwrap();
    let status = store.status().unwrap();
    let run = status
        .cleaner
        .expect("the policy commit started a cleaner run");
    assert!(run.victims > 0 && run.bytes_moved == 0, "{run:?}");

    vault.hold();
    let committing = {
        let store = store.clone();
        std::thread::spawn(move || store.commit())
    };
    vault.wait_until_entered();
    // Each change carries out a slice of the run.
    let c = store.create_object(b"c").unwrap();
    for i in 0..64u64 {
        store.write(c, i * 4096, &[i as u8; 4096]).unwrap();
    }
    vault.release();
    committing.join().unwrap().unwrap();
    let status = store.status().unwrap();
    assert!(status.cleaner.is_none(), "the run did not end");
    assert!(
        status.segments_awaiting_commit > 0,
        "the victims emptied beside the commit went with it"
    );

    store.flush().unwrap();
    // Power cut right after the landing (every write and deletion so far
    // reached the medium): the landed commit's tree is the store's.
    let after_cut = Arc::new(medium.crash(TearMode::KeepAll, 1));
    cut_power(store);
    let store = Store::open(after_cut, vault, options()).unwrap();
    assert!(store.read(a, 0, model.len()).unwrap() == model);
    assert_eq!(store.read(b, 0, 4 << 20).unwrap(), vec![0xbb; 4 << 20]);
    assert_eq!(store.read(c, 63 * 4096, 4096).unwrap(), vec![63u8; 4096]);
}
