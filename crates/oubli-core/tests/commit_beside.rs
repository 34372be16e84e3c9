//! A commit releases the engine lock across its syncs and vault rotation, a flush across its syncs: reads and writes go on meanwhile, a flush waits for a commit or flush in flight, and nothing accepted meanwhile is lost.

use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store, Vault, ROOT_DIR};
use oubli_media::{GateMedium, Gated, MemMedium};
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

/// Options with a commit per `bytes` written, each followed by a cleaner
/// run as soon as a tenth of the medium is dead.
fn eager_cleaner(bytes: u64) -> Options {
    Options {
        policy: EpochPolicy {
            bytes: Some(bytes),
            ..EpochPolicy::manual()
        },
        cleaner: oubli_core::CleanerPolicy {
            dead_share: 0.1,
            min_dead_bytes: 64 << 10,
            threshold: 0.9,
            max_move_bytes: 64 << 20,
        },
        ..Options::default()
    }
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
    use oubli_media::TearMode;
    const CELL: usize = 32 << 10;
    let medium = Arc::new(MemMedium::with_segment_capacity(256 << 10));
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = create_with(medium.clone(), vault.clone(), eager_cleaner(4 << 20));
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

/// Writes `data` at `at` on another thread; fails the test (letting the
/// vault go first) if the write has not returned within 20 s, as one that
/// waits for the held vault never would.
fn write_without_waiting(
    store: &Arc<Store>,
    vault: &Gate,
    oid: u64,
    at: u64,
    data: &[u8],
    what: &str,
) {
    let (s, data) = (store.clone(), data.to_vec());
    match within(Duration::from_secs(20), move || s.write(oid, at, &data)) {
        Some(written) => written.unwrap(),
        None => {
            vault.release();
            panic!("{what} waited for the commit in flight");
        }
    }
}

/// A store on `options` (background commits) whose first policy commit is
/// held in the vault: an object written with 64 KiB of 1s made it due, the
/// change returned, and the committer thread is inside the rotation.
struct Held {
    medium: Arc<MemMedium>,
    vault: Arc<Gate>,
    store: Arc<Store>,
    oid: u64,
    /// The epoch before the held commit.
    epoch: u64,
}

fn policy_commit_held(options: Options) -> Held {
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options));
    let oid = store.create_object(b"").unwrap();
    let epoch = store.epoch();
    vault.hold();
    write_without_waiting(
        &store,
        &vault,
        oid,
        0,
        &[1u8; 64 << 10],
        "the change that made the policy due",
    );
    vault.wait_until_entered();
    Held {
        medium,
        vault,
        store,
        oid,
        epoch,
    }
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
    let Held {
        vault,
        store,
        oid,
        epoch,
        ..
    } = policy_commit_held(background_options());
    // The commit it asked for is in the vault now, on the committer thread.
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
    let Held {
        medium,
        vault,
        store,
        oid,
        epoch,
    } = policy_commit_held(background_options());
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
    assert_eq!(store.read(oid, 0, 64 << 10).unwrap(), vec![1u8; 64 << 10]);
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

/// Empty files with names `f0`, `f1`, ... made on another thread until
/// `count` are (no bytes written: the policy's byte trigger must not be
/// what stops them); `made` counts them as they come.
fn make_files(
    store: &Arc<Store>,
    count: u64,
    made: &Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let (s, made) = (store.clone(), made.clone());
    std::thread::spawn(move || {
        for i in 0..count {
            let oid = s.create_object(&i.to_le_bytes()).unwrap();
            s.link(ROOT_DIR, format!("f{i}").as_bytes(), oid).unwrap();
            made.store(i + 1, std::sync::atomic::Ordering::Relaxed);
        }
    })
}

/// Every 997th of the files `make_files` made is there, with its metadata.
fn check_files(store: &Store, count: u64) {
    for i in (0..count).step_by(997) {
        let oid = store.lookup(ROOT_DIR, format!("f{i}").as_bytes()).unwrap();
        let oid = oid.expect("a file made beside the commits");
        assert_eq!(store.object(oid).unwrap().meta, i.to_le_bytes());
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
    let Held {
        vault,
        store,
        epoch,
        ..
    } = policy_commit_held(Options {
        dirty_tree_bytes: 1 << 20,
        ..background_options()
    });
    let made = Arc::new(AtomicU64::new(0));
    let files = make_files(&store, FILES, &made);
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
    check_files(&store, FILES);
}

/// With background commits the commit the changed-tree cap forces runs on
/// the committer thread too: while it is in the vault (held here), the
/// writer that reached the cap goes on making files (until the cap holds it
/// beside that commit), instead of carrying the commit out in its path.
#[test]
fn the_changed_tree_caps_commit_runs_on_the_committer_thread() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const FILES: u64 = 40_000;
    let medium = Arc::new(MemMedium::new());
    let vault = Arc::new(SlowVault::new(MemoryVault::empty(), Duration::ZERO));
    let capped = Options {
        dirty_tree_bytes: 1 << 20,
        background_commits: true,
        ..options()
    };
    let store = Arc::new(create_with(medium.clone(), vault.clone(), capped));
    let epoch = store.epoch();
    vault.hold();
    let made = Arc::new(AtomicU64::new(0));
    let files = make_files(&store, FILES, &made);
    let v = vault.clone();
    if within(Duration::from_secs(20), move || v.wait_until_entered()).is_none() {
        vault.release();
        panic!("no commit for the cap while {made:?} files were made");
    }
    // The cap's commit is in the vault: the writer must get past the files
    // it had made then (waiting up to 20 s for a slow machine).
    let entered_at = made.load(Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while made.load(Ordering::Relaxed) < entered_at + 100 && !files.is_finished() {
        if std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let went_on = made.load(Ordering::Relaxed) - entered_at;
    vault.release();
    files.join().unwrap();
    assert!(
        went_on >= 100,
        "the writer made {went_on} files while the cap's commit was in the vault: it ran that commit"
    );
    assert!(store.epoch() > epoch, "no commit for the cap");
    check_files(&store, FILES);
    // Everything made is durable past a power cut.
    store.flush().unwrap();
    cut_power(store);
    let store = Store::open(medium, vault, options()).unwrap();
    check_files(&store, FILES);
}

/// The epoch policy's count triggers hold with background commits too: a
/// writer that reaches the next trigger while the commit it asked for is
/// still in flight (the vault held here) waits for that commit to land,
/// then asks for the next. Otherwise each epoch would grow by what a fast
/// writer puts down during a commit, and each commit's sync with it.
#[test]
fn a_writer_outrunning_background_commits_waits_for_the_one_in_flight() {
    let Held {
        vault,
        store,
        oid,
        epoch,
        ..
    } = policy_commit_held(background_options());
    // The commit captured its tree (it is in the vault): what is written
    // from here on counts for the next epoch.
    write_without_waiting(
        &store,
        &vault,
        oid,
        64 << 10,
        &[2u8; 32 << 10],
        "a change below the next trigger",
    );
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

/// A flush syncs and appends the intent log without the engine lock:
/// writes and reads go on while its syncs are held, a second flush waits
/// for the first (no second sync starts beside it), and after a power cut
/// everything either flush acknowledged is there.
#[test]
fn writes_go_on_while_a_flush_syncs_and_what_it_acknowledged_survives_a_crash() {
    let medium = Arc::new(GateMedium::new(MemMedium::new(), Gated::Syncs));
    let vault = Arc::new(MemoryVault::empty());
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options()));
    let a = store.create_object(b"a").unwrap();
    store.write(a, 0, b"flushed by the first flush").unwrap();
    store.link(ROOT_DIR, b"a", a).unwrap();

    medium.hold();
    let s = store.clone();
    let first = std::thread::spawn(move || s.flush());
    medium.wait_until_entered();
    // The first flush is inside a sync. Changes and reads do not wait for
    // it (they would, for as long as the sync takes, under the lock).
    let s = store.clone();
    let during = within(Duration::from_secs(20), move || {
        assert_eq!(s.read(a, 0, 7).unwrap(), b"flushed");
        let b = s.create_object(b"b").unwrap();
        s.write(b, 0, b"written during the first flush").unwrap();
        s.link(ROOT_DIR, b"b", b).unwrap();
        s.write(a, 0, b"FLUSHED").unwrap();
        b
    });
    let Some(b) = during else {
        medium.release();
        panic!("a write waited for a flush's sync");
    };
    // A second flush (of what was written meanwhile) must not sync beside
    // the first: it waits until the first lands.
    let s = store.clone();
    let second = std::thread::spawn(move || s.flush());
    std::thread::sleep(Duration::from_millis(200));
    let waiting = medium.waiting();
    medium.release();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert_eq!(waiting, 1, "a second flush synced beside the first");
    assert_eq!(medium.most_syncs_at_once(), 1);

    // The power cut loses what was not synced: nothing either flush
    // acknowledged.
    std::mem::forget(store);
    let crashed = Arc::new(medium.inner().crash(oubli_media::TearMode::DropUnsynced, 7));
    let store = Store::open(crashed as Arc<dyn Medium>, vault, options()).unwrap();
    assert_eq!(
        store.read(a, 0, 100).unwrap(),
        b"FLUSHED by the first flush"
    );
    assert_eq!(
        store.read(b, 0, 100).unwrap(),
        b"written during the first flush"
    );
    assert_eq!(store.lookup(ROOT_DIR, b"a").unwrap(), Some(a));
    assert_eq!(store.lookup(ROOT_DIR, b"b").unwrap(), Some(b));
}

/// A flush carries small writes in its intent-log frame (format 6); when it
/// must first sync data segments (a large write came before), the frame's
/// batch waits for that sync, but its cells are on the medium before the
/// lock is let go: a read during the sync finds them where the tree says,
/// and after a power cut both writes are there.
#[test]
fn cells_in_a_flushs_frame_are_readable_while_it_syncs() {
    let medium = Arc::new(GateMedium::new(MemMedium::new(), Gated::Syncs));
    let vault = Arc::new(MemoryVault::empty());
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options()));
    // Whole cells sealed into a data segment as they come: the flush syncs
    // that segment before its frame.
    let big = store.create_object(b"").unwrap();
    store.write(big, 0, &[7u8; 256 << 10]).unwrap();
    let small = store.create_object(b"").unwrap();
    store.write(small, 0, b"in the frame").unwrap();
    medium.hold();
    let s = store.clone();
    let flush = std::thread::spawn(move || s.flush());
    medium.wait_until_entered();
    let s = store.clone();
    let read = within(Duration::from_secs(20), move || s.read(small, 0, 12));
    medium.release();
    flush.join().unwrap().unwrap();
    let read = read.expect("a read waited for the flush's sync");
    assert_eq!(read.unwrap(), b"in the frame");
    std::mem::forget(store);
    let crashed = Arc::new(medium.inner().crash(oubli_media::TearMode::DropUnsynced, 3));
    let store = Store::open(crashed as Arc<dyn Medium>, vault, options()).unwrap();
    assert_eq!(store.read(small, 0, 100).unwrap(), b"in the frame");
    assert_eq!(store.read(big, 0, 256 << 10).unwrap(), vec![7u8; 256 << 10]);
}

/// Writers that flush after each write, on several threads: their flushes
/// run one at a time although none holds the lock through its syncs, and
/// each writer's last flushed write survives a power cut.
#[test]
fn flushes_from_many_threads_never_sync_beside_each_other() {
    let gate =
        GateMedium::new(MemMedium::new(), Gated::Syncs).with_sync_delay(Duration::from_micros(300));
    let medium = Arc::new(gate);
    let vault = Arc::new(MemoryVault::empty());
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options()));
    let writers: Vec<_> = (0..4u8)
        .map(|t| {
            let s = store.clone();
            std::thread::spawn(move || {
                let oid = s.create_object(&[t]).unwrap();
                for i in 0..40u32 {
                    let block = [t.wrapping_add(i as u8); 512];
                    s.write(oid, u64::from(i % 8) * 4096, &block).unwrap();
                    s.flush().unwrap();
                }
                oid
            })
        })
        .collect();
    let oids: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(medium.most_syncs_at_once(), 1, "two flushes synced at once");
    std::mem::forget(store);
    let crashed = Arc::new(
        medium
            .inner()
            .crash(oubli_media::TearMode::DropUnsynced, 11),
    );
    let store = Store::open(crashed as Arc<dyn Medium>, vault, options()).unwrap();
    for (t, oid) in oids.into_iter().enumerate() {
        for i in 32..40u32 {
            let want = [(t as u8).wrapping_add(i as u8); 512];
            assert_eq!(
                store.read(oid, u64::from(i % 8) * 4096, 512).unwrap(),
                want,
                "writer {t}'s write {i} was flushed"
            );
        }
    }
}

/// Callers that queue behind a flush in flight are served by the first
/// flush made after they called (group commit), even when more writes
/// arrived meanwhile. One flush is held at its sync; sixteen threads each
/// write and call flush, so all of them queue behind it. It is let
/// through, one of the sixteen makes the next flush (held in turn), a
/// seventeenth write arrives beside it, and then the gate opens: the
/// other fifteen callers' writes are durable and they return, so two
/// flushes were made in all. Fails (a third flush, for the late write)
/// when a caller makes its own flush whatever landed while it waited;
/// `writes_go_on_while_a_flush_syncs...` fails when a flush that began
/// before the call is taken to serve it. Every acknowledged write
/// survives a power cut.
#[test]
fn flushes_queued_behind_one_in_flight_are_served_by_one_frame() {
    const THREADS: u8 = 16;
    let medium = Arc::new(GateMedium::new(MemMedium::new(), Gated::Syncs));
    let vault = Arc::new(MemoryVault::empty());
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options()));
    // The syncs one flush of one small write makes on this medium.
    let probe = store.create_object(b"probe").unwrap();
    store.write(probe, 0, b"probe").unwrap();
    store.flush().unwrap();
    let before = medium.syncs();
    store.write(probe, 0, b"PROBE").unwrap();
    store.flush().unwrap();
    let per_flush = medium.syncs() - before;
    assert!(per_flush >= 1);

    let oids: Vec<u64> = (0..THREADS)
        .map(|t| store.create_object(&[t]).unwrap())
        .collect();
    let late = store.create_object(b"late").unwrap();
    let before = medium.syncs();
    // The flush in flight: held at its first sync.
    store.write(probe, 0, b"first").unwrap();
    medium.hold();
    let first = {
        let s = store.clone();
        std::thread::spawn(move || s.flush())
    };
    medium.wait_until_entered();
    // Each writer's write goes on beside the held flush; its flush then
    // queues behind it. The writers say when their write is done; the
    // step from there to the queue is a function call, given 200 ms.
    let (wrote, written) = mpsc::channel();
    let writers: Vec<_> = oids
        .iter()
        .enumerate()
        .map(|(t, &oid)| {
            let (s, wrote) = (store.clone(), wrote.clone());
            std::thread::spawn(move || {
                s.write(oid, 0, &[t as u8; 512]).unwrap();
                wrote.send(()).unwrap();
                s.flush().unwrap();
            })
        })
        .collect();
    for _ in 0..THREADS {
        written
            .recv_timeout(Duration::from_secs(20))
            .expect("a write beside the held flush");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        medium.waiting(),
        1,
        "only the first flush reached the medium"
    );
    // The first flush goes through; the next, made by one of the queued
    // callers for all sixteen writes, is held in turn, and a write arrives
    // beside it that no queued caller needs.
    medium.let_through(per_flush);
    first.join().unwrap().unwrap();
    medium.wait_until_entered();
    store.write(late, 0, b"late").unwrap();
    medium.release();
    for w in writers {
        w.join().unwrap();
    }
    let flushes = (medium.syncs() - before) / per_flush;
    assert_eq!(
        flushes, 2,
        "{flushes} flushes for the held one and {THREADS} callers queued behind it: \
         callers whose writes the next flush made durable flushed again"
    );
    assert_eq!(medium.most_syncs_at_once(), 1, "two flushes synced at once");
    std::mem::forget(store);
    let crashed = Arc::new(
        medium
            .inner()
            .crash(oubli_media::TearMode::DropUnsynced, 13),
    );
    let store = Store::open(crashed as Arc<dyn Medium>, vault, options()).unwrap();
    assert_eq!(store.read(probe, 0, 5).unwrap(), b"first");
    for (t, oid) in oids.into_iter().enumerate() {
        assert_eq!(
            store.read(oid, 0, 512).unwrap(),
            [t as u8; 512],
            "writer {t}'s write was flushed"
        );
    }
}

/// A cleaner run's trace runs without the engine lock (on the committer
/// thread here), so changes go on beside it, and the segments they fill
/// are ones the trace never saw: the run must neither doom nor empty them.
/// The trace is held at the medium (the first node it reads) while a
/// writer fills several segments; then the run goes through, the segments
/// it doomed are deleted, and everything written must read back, after a
/// reopen too.
#[test]
fn segments_filled_beside_a_cleaner_trace_are_kept() {
    const SEGMENT: u64 = 256 << 10;
    let medium = Arc::new(GateMedium::new(
        MemMedium::with_segment_capacity(SEGMENT),
        Gated::Reads,
    ));
    let vault = Arc::new(MemoryVault::empty());
    let options = Options {
        background_commits: true,
        ..eager_cleaner(2 << 20)
    };
    let store = Arc::new(create_with(medium.clone(), vault.clone(), options.clone()));
    // Dead bytes: an object written, then written over.
    let a = store.create_object(b"a").unwrap();
    store.write(a, 0, &vec![1u8; 1 << 20]).unwrap();
    store.commit().unwrap();
    store.write(a, 0, &vec![2u8; 1 << 20]).unwrap();
    store.commit().unwrap();
    // The change that makes the policy due: its commit, then the trace,
    // run on the committer thread; the trace waits at the gate.
    medium.hold();
    let s = store.clone();
    let b = store.create_object(b"b").unwrap();
    if within(Duration::from_secs(20), move || {
        s.write(b, 0, &vec![3u8; 2 << 20]).unwrap()
    })
    .is_none()
    {
        medium.release();
        panic!("a change waited for the commit it made due");
    }
    medium.wait_until_entered();
    // Beside the trace: more than three segments' worth of new cells.
    let s = store.clone();
    let c = store.create_object(b"c").unwrap();
    let written = within(Duration::from_secs(20), move || {
        for i in 0..32u64 {
            s.write(c, i * (32 << 10), &[i as u8; 32 << 10]).unwrap();
        }
    });
    medium.release();
    written.expect("changes waited for the cleaner's trace");
    // The committer thread finishes the trace and starts the run (or
    // only dooms what is unreached, if nothing is left to move).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = store.status().unwrap();
        if status.cleaner.is_some() || status.segments_awaiting_commit > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no cleaner run");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The run goes through (changes and ticks carry its slices), and a
    // commit deletes what it doomed.
    for _ in 0..200 {
        store.tick();
        if store.status().unwrap().cleaner.is_none() {
            break;
        }
    }
    store.commit().unwrap();
    let check = |s: &Store| {
        assert_eq!(s.read(a, 0, 1 << 20).unwrap(), vec![2u8; 1 << 20]);
        assert_eq!(s.read(b, 0, 2 << 20).unwrap(), vec![3u8; 2 << 20]);
        for i in 0..32u64 {
            assert_eq!(
                s.read(c, i * (32 << 10), 32 << 10).unwrap(),
                vec![i as u8; 32 << 10],
                "cell {i} of the object written beside the trace"
            );
        }
    };
    check(&store);
    let problems = store.fsck(&mut |_| {}).unwrap().problems;
    assert!(problems.is_empty(), "{problems:?}");
    drop(Arc::into_inner(store).expect("the only handle"));
    let store = Store::open(medium, vault, options).unwrap();
    check(&store);
}
