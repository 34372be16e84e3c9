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

/// Options whose epoch policy commits every 64 KiB written, on the
/// committer thread.
fn background_options() -> Options {
    Options {
        policy: EpochPolicy {
            bytes: Some(64 << 10),
            ..EpochPolicy::manual()
        },
        background_commits: true,
        ..Options::default()
    }
}

/// With `background_commits`, the change that makes the epoch policy due
/// hands the commit to the committer thread and returns: it does not wait
/// for the vault (here held until the test lets it go), and neither do the
/// changes after it.
#[test]
fn a_change_that_makes_a_commit_due_does_not_wait_for_it_in_the_background() {
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = Arc::new(create_with(medium, vault.clone(), background_options()));
    let oid = store.create_object(b"").unwrap();
    let epoch = store.epoch();
    vault.hold();
    let s = store.clone();
    let returned = within(Duration::from_secs(20), move || {
        s.write(oid, 0, &[1u8; 64 << 10]).unwrap();
    });
    if returned.is_none() {
        vault.release();
        panic!("the change that made the policy due waited for its commit");
    }
    // The commit it asked for is in the vault now, on the committer thread.
    vault.wait_until_entered();
    // Changes below the policy's next trigger do not wait either.
    let s = store.clone();
    let during = within(Duration::from_secs(20), move || {
        s.write(oid, 64 << 10, &[2u8; 16 << 10]).unwrap();
        s.read(oid, 0, 80 << 10).unwrap()
    });
    vault.release();
    let during = during.expect("a change waited for the committer's rotation");
    assert_eq!(&during[..64 << 10], &[1u8; 64 << 10][..]);
    assert_eq!(&during[64 << 10..], &[2u8; 16 << 10][..]);
    // `epoch` waits for the commit in flight to land.
    assert!(store.epoch() > epoch);
}

/// Closing a store waits for the commit its committer thread was asked
/// for, and carries it out if it had not begun: a store reopened after
/// the drop finds that epoch ended, and every write.
#[test]
fn dropping_a_store_lands_the_commit_its_committer_was_asked_for() {
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = create_with(medium.clone(), vault.clone(), background_options());
    let oid = store.create_object(b"").unwrap();
    let epoch = store.epoch();
    vault.hold();
    let store = Arc::new(store);
    let s = store.clone();
    match within(Duration::from_secs(20), move || {
        s.write(oid, 0, &[7u8; 64 << 10])
    }) {
        Some(written) => written.unwrap(),
        None => {
            vault.release();
            panic!("the change that made the policy due waited for its commit");
        }
    }
    vault.wait_until_entered();
    store.write(oid, 64 << 10, b"after the request").unwrap();
    let store = Arc::into_inner(store).expect("the only handle");
    let closing = std::thread::spawn(move || drop(store));
    std::thread::sleep(Duration::from_millis(200));
    let closed_early = closing.is_finished();
    vault.release();
    closing.join().unwrap();
    assert!(
        !closed_early,
        "the store closed with its committer's commit in flight"
    );
    assert!(
        vault.load().unwrap().epoch > epoch,
        "the commit did not land"
    );
    let store = Store::open(medium, vault, options()).unwrap();
    assert_eq!(store.read(oid, 0, 64 << 10).unwrap(), vec![7u8; 64 << 10]);
    assert_eq!(store.read(oid, 64 << 10, 17).unwrap(), b"after the request");
}

/// A request the committer thread has not begun when the store closes is
/// still carried out: closing right after a change the policy answered
/// ends the epoch, as it did when that change committed itself.
#[test]
fn a_commit_requested_just_before_closing_is_made() {
    for _ in 0..20 {
        let medium = Arc::new(MemMedium::new());
        let vault = Arc::new(MemoryVault::empty());
        let store = create_with(medium.clone(), vault.clone(), background_options());
        let oid = store.create_object(b"").unwrap();
        let epoch = store.epoch();
        store.write(oid, 0, &[3u8; 64 << 10]).unwrap();
        drop(store);
        // Before opening, which commits a replayed log by itself.
        assert!(
            vault.load().unwrap().epoch > epoch,
            "the request was dropped"
        );
        let store = Store::open(medium, vault, options()).unwrap();
        assert_eq!(store.read(oid, 0, 64 << 10).unwrap(), vec![3u8; 64 << 10]);
    }
}

/// The changed-tree cap holds beside a commit in flight. With background
/// commits a lone writer is no longer held back by its own commits, so the
/// change that takes the next epoch's nodes over the cap waits for the
/// commit in flight (here held in the vault) to land, then commits them.
#[test]
fn the_changed_tree_cap_holds_beside_a_background_commit() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const FILES: u64 = 40_000;
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let options = Options {
        dirty_tree_bytes: 1 << 20,
        ..background_options()
    };
    let store = Arc::new(create_with(medium, vault.clone(), options));
    let epoch = store.epoch();
    vault.hold();
    let s = store.clone();
    if within(Duration::from_secs(20), move || {
        let oid = s.create_object(b"").unwrap();
        s.write(oid, 0, &[1u8; 64 << 10]).unwrap();
    })
    .is_none()
    {
        vault.release();
        panic!("the change that made the policy due waited for its commit");
    }
    vault.wait_until_entered();
    let made = Arc::new(AtomicU64::new(0));
    let (s, count) = (store.clone(), made.clone());
    // Empty files with names (no bytes written: the policy's byte trigger,
    // which holds too, must not be what stops them).
    let files = std::thread::spawn(move || {
        for i in 0..FILES {
            let oid = s.create_object(&i.to_le_bytes()).unwrap();
            s.link(ROOT_DIR, format!("f{i}").as_bytes(), oid).unwrap();
            count.store(i + 1, Ordering::Relaxed);
        }
    });
    // Until the writer stops making progress (held at the cap) or is done.
    loop {
        let before = made.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(200));
        if files.is_finished() || made.load(Ordering::Relaxed) == before {
            break;
        }
    }
    let ran_past_the_cap = files.is_finished();
    let held_at = made.load(Ordering::Relaxed);
    vault.release();
    files.join().unwrap();
    assert!(
        !ran_past_the_cap,
        "{FILES} files made while a commit was in flight: the cap did not hold"
    );
    assert!(held_at > 0, "the writer waited before it reached the cap");
    assert!(store.epoch() >= epoch + 2, "no commit for the cap");
    let s = &store;
    for i in (0..FILES).step_by(997) {
        let oid = s.lookup(ROOT_DIR, format!("f{i}").as_bytes()).unwrap();
        let oid = oid.expect("a file made beside the commits");
        assert_eq!(s.object(oid).unwrap().meta, i.to_le_bytes());
    }
}

/// The epoch policy's count triggers hold with background commits too: a
/// writer that reaches the next trigger while the commit it asked for is
/// still in flight (the vault held here) waits for that commit to land,
/// then asks for the next. Otherwise each epoch would grow by what a fast
/// writer puts down during a commit, and each commit's sync with it.
#[test]
fn a_writer_outrunning_background_commits_waits_for_the_one_in_flight() {
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = Arc::new(create_with(medium, vault.clone(), background_options()));
    let oid = store.create_object(b"").unwrap();
    let epoch = store.epoch();
    vault.hold();
    let s = store.clone();
    if within(Duration::from_secs(20), move || {
        s.write(oid, 0, &[1u8; 64 << 10]).unwrap();
    })
    .is_none()
    {
        vault.release();
        panic!("the change that made the policy due waited for its commit");
    }
    // The commit captured its tree (it is in the vault): what is written
    // from here on counts for the next epoch.
    vault.wait_until_entered();
    let s = store.clone();
    if within(Duration::from_secs(20), move || {
        s.write(oid, 64 << 10, &[2u8; 32 << 10]).unwrap();
    })
    .is_none()
    {
        vault.release();
        panic!("a change below the next trigger waited for the commit in flight");
    }
    let s = store.clone();
    let outrunning = std::thread::spawn(move || s.write(oid, 96 << 10, &[3u8; 32 << 10]));
    std::thread::sleep(Duration::from_millis(200));
    let ran_ahead = outrunning.is_finished();
    vault.release();
    outrunning.join().unwrap().unwrap();
    assert!(
        !ran_ahead,
        "a write reached the next epoch's trigger beside the commit in flight"
    );
    // It asked for the next commit once the first had landed.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.epoch() < epoch + 2 {
        assert!(std::time::Instant::now() < deadline, "no second commit");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(store.read(oid, 96 << 10, 4).unwrap(), [3u8; 4]);
}
