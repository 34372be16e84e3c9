//! Bad input: flipped bits, truncated or swapped segments, rolled-back superblocks, wrong passwords and broken vaults — each a specific error, never data.

use oubli_core::{
    CreateOptions, EpochPolicy, Error, Medium, Options, Store, TallyCadence, Vault, VaultError,
};
use oubli_crypto::{RingProvider, SecretBytes};
use oubli_media::{DirMedium, FaultMedium, ReadFault, ReadTarget};
use oubli_testkit::{harness, marker};
use oubli_vault::{FileVault, KdfParams, MemoryVault};
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Fixture {
    _dir: tempfile::TempDir,
    store: PathBuf,
    vault: PathBuf,
}

fn password() -> SecretBytes {
    SecretBytes::new(b"correct horse battery staple".to_vec())
}

/// A tally record with every flush, as format 2 had: each acknowledged
/// batch is counted before its flush returns.
fn options() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        tally: TallyCadence::EveryFlush,
        ..Options::default()
    }
}

/// Where each whole frame of a (format-6) log ends: a frame is its sealed
/// length (u32), salt, the length of the cells it carries (u32), the cells
/// and the sealed batch; after the last, the zeros the medium writes ahead
/// (`Medium::reserve`). `None` if the bytes are not whole frames.
fn frame_ends(b: &[u8]) -> Option<Vec<usize>> {
    let (mut at, mut ends) = (0usize, Vec::new());
    while at + 24 <= b.len() && b[at..at + 4] != [0; 4] {
        let word =
            |i: usize| u32::from_le_bytes(b[at + i..at + i + 4].try_into().unwrap()) as usize;
        at += 24 + word(20) + word(0);
        ends.push(at);
    }
    let zeros_after = b.get(at..).is_some_and(|rest| rest.iter().all(|&x| x == 0));
    (!ends.is_empty() && zeros_after).then_some(ends)
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_scheme(oubli_crypto::SCHEME_PARENT_POINTER)
    }

    fn with_scheme(key_scheme: u8) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let vault = dir.path().join("vault");
        let medium = Arc::new(DirMedium::create(&store).unwrap());
        let vault_path = vault.clone();
        Store::create(
            medium,
            |record| {
                FileVault::create(
                    &vault_path,
                    &password(),
                    KdfParams::testing(),
                    record,
                    Arc::new(RingProvider::new()),
                )
                .map_err(Error::from)
            },
            CreateOptions {
                key_scheme,
                ..CreateOptions::default()
            },
            options(),
        )
        .unwrap();
        Fixture {
            _dir: dir,
            store,
            vault,
        }
    }

    fn open_with(&self, password: &SecretBytes) -> Result<Store, Error> {
        let vault = FileVault::open(&self.vault, password, Arc::new(RingProvider::new()))?;
        let medium = DirMedium::open(&self.store).map_err(|e| Error::Invalid(e.to_string()))?;
        Store::open(Arc::new(medium), Arc::new(vault), options())
    }

    fn open(&self) -> Result<Store, Error> {
        self.open_with(&password())
    }

    /// What a power cut now would leave: the store directory copied as it
    /// is (lock removed), with a vault of its own (a reopen commits, which
    /// rotates the vault).
    fn power_cut_copy(&self, name: &str) -> Fixture {
        let store = self.store.with_file_name(name);
        copy_dir(&self.store, &store);
        std::fs::remove_file(store.join("lock")).ok();
        let vault = store.with_extension("vault");
        std::fs::copy(&self.vault, &vault).unwrap();
        Fixture {
            _dir: tempfile::tempdir().unwrap(),
            store,
            vault,
        }
    }

    fn open_with_options(&self, options: Options) -> Result<Store, Error> {
        let vault = FileVault::open(&self.vault, &password(), Arc::new(RingProvider::new()))?;
        let medium = DirMedium::open(&self.store).map_err(|e| Error::Invalid(e.to_string()))?;
        Store::open(Arc::new(medium), Arc::new(vault), options)
    }

    /// Writes `len` marked bytes to a new object named `name`, commits; returns (oid, data).
    fn put(&self, name: &[u8], write_id: u64, len: usize) -> (u64, Vec<u8>) {
        let store = self.open().unwrap();
        let oid = store.create_object(b"").unwrap();
        store.link(oubli_core::ROOT_DIR, name, oid).unwrap();
        let data = marker::data(write_id, len);
        store.write(oid, 0, &data).unwrap();
        store.commit().unwrap();
        (oid, data)
    }

    fn segments(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(self.store.join("segments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .collect();
        v.sort();
        v
    }
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

/// Opens and reads `oid`: either the exact data or a `Corrupt` error; anything else fails the test.
fn read_is_exact_or_corrupt(f: &Fixture, oid: u64, data: &[u8]) -> bool {
    let result = f.open().and_then(|s| s.read(oid, 0, data.len()));
    match result {
        Ok(got) => {
            assert_eq!(got, data, "wrong data returned instead of an error");
            false
        }
        Err(Error::Corrupt(_)) => true,
        Err(e) => panic!("expected an integrity error, got: {e}"),
    }
}

#[test]
fn flipped_bit_in_a_data_cell_is_an_integrity_error() {
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 100_000);
    let seg = f
        .segments()
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    flip(&seg, 1000);
    assert!(read_is_exact_or_corrupt(&f, oid, &data));
}

#[test]
fn a_flipped_bit_late_in_a_large_read_fails_the_whole_read() {
    // 3 MiB of whole cells back to back, read in one call: they are opened
    // in place, one after the other, and the flipped one is near the end.
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 3 << 20);
    let seg = f
        .segments()
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    flip(&seg, 5 << 19);
    assert!(read_is_exact_or_corrupt(&f, oid, &data));
}

#[test]
fn flipped_bit_in_a_tree_node_is_an_integrity_error() {
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 100_000);
    // The root node is the last unit a commit appends.
    let seg = f
        .segments()
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    flip(&seg, len - 20);
    assert!(read_is_exact_or_corrupt(&f, oid, &data));
}

/// Under every key scheme (the segment then also holds the scheme's state).
#[test]
fn every_flipped_byte_of_the_medium_is_detected_or_harmless() {
    for scheme in harness::SCHEMES {
        every_flipped_byte_with(scheme);
    }
}

fn every_flipped_byte_with(scheme: u8) {
    let f = Fixture::with_scheme(scheme);
    let (oid, data) = f.put(b"a", 1, 40_000);
    let seg = f
        .segments()
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let pristine = std::fs::read(&seg).unwrap();
    let mut detected = 0;
    for offset in (0..pristine.len() as u64).step_by(97) {
        flip(&seg, offset);
        detected += read_is_exact_or_corrupt(&f, oid, &data) as usize;
        std::fs::write(&seg, &pristine).unwrap();
    }
    // Every byte of this segment belongs to a live unit: every flip must be caught.
    assert_eq!(detected, pristine.len().div_ceil(97));
}

#[test]
fn truncated_segment_is_an_integrity_error() {
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 100_000);
    for seg in f.segments() {
        let len = std::fs::metadata(&seg).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
    }
    assert!(read_is_exact_or_corrupt(&f, oid, &data));
}

#[test]
fn missing_segment_is_an_integrity_error() {
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 100_000);
    for seg in f.segments() {
        std::fs::remove_file(seg).unwrap();
    }
    assert!(read_is_exact_or_corrupt(&f, oid, &data));
}

#[test]
fn swapped_segments_are_an_integrity_error() {
    let f = Fixture::new();
    let (a, data_a) = f.put(b"a", 1, 60_000);
    let (b, data_b) = f.put(b"b", 2, 60_000);
    let segs = f.segments();
    assert!(segs.len() >= 2, "{segs:?}");
    let tmp = f.store.join("swap.tmp");
    std::fs::rename(&segs[0], &tmp).unwrap();
    std::fs::rename(&segs[1], &segs[0]).unwrap();
    std::fs::rename(&tmp, &segs[1]).unwrap();
    let a_caught = read_is_exact_or_corrupt(&f, a, &data_a);
    let b_caught = read_is_exact_or_corrupt(&f, b, &data_b);
    assert!(a_caught || b_caught, "a swap went unnoticed");
}

#[test]
fn superblock_rolled_back_to_an_older_one_is_refused() {
    let f = Fixture::new();
    f.put(b"a", 1, 10_000);
    let old_a = std::fs::read(f.store.join("super.a")).unwrap();
    let old_b = std::fs::read(f.store.join("super.b")).unwrap();
    f.put(b"b", 2, 10_000);
    f.put(b"c", 3, 10_000);
    std::fs::write(f.store.join("super.a"), old_a).unwrap();
    std::fs::write(f.store.join("super.b"), old_b).unwrap();
    match f.open() {
        Err(Error::Rollback { vault, found }) => assert!(found.iter().all(|e| *e < vault)),
        Err(e) => panic!("expected a rollback error, got {e}"),
        Ok(_) => panic!("a rolled-back superblock was accepted"),
    }
}

#[test]
fn corrupted_superblock_is_an_integrity_error() {
    let f = Fixture::new();
    f.put(b"a", 1, 10_000);
    for slot in ["super.a", "super.b"] {
        let p = f.store.join(slot);
        let len = std::fs::metadata(&p).unwrap().len();
        flip(&p, len - 3);
    }
    assert!(matches!(f.open(), Err(Error::Corrupt(_))));
}

#[test]
fn wrong_password_is_refused_and_changes_nothing() {
    let f = Fixture::new();
    let (oid, data) = f.put(b"a", 1, 10_000);
    let before = std::fs::read(&f.vault).unwrap();
    let wrong = SecretBytes::new(b"Tr0ub4dor&3".to_vec());
    assert!(matches!(
        f.open_with(&wrong),
        Err(Error::Vault(VaultError::WrongPassword))
    ));
    assert_eq!(std::fs::read(&f.vault).unwrap(), before);
    assert_eq!(f.open().unwrap().read(oid, 0, data.len()).unwrap(), data);
}

#[test]
fn missing_vault_is_reported() {
    let f = Fixture::new();
    std::fs::remove_file(&f.vault).unwrap();
    assert!(matches!(
        f.open(),
        Err(Error::Vault(VaultError::Missing(_)))
    ));
}

#[test]
fn corrupted_vault_is_reported() {
    let f = Fixture::new();
    let mut bytes = std::fs::read(&f.vault).unwrap();
    for b in bytes.iter_mut().step_by(7) {
        *b ^= 0xff;
    }
    std::fs::write(&f.vault, bytes).unwrap();
    assert!(matches!(
        f.open(),
        Err(Error::Vault(VaultError::Corrupt(_)))
    ));
}

#[test]
fn vault_of_another_store_is_refused() {
    let f = Fixture::new();
    let g = Fixture::new();
    std::fs::copy(&g.vault, &f.vault).unwrap();
    assert!(matches!(f.open(), Err(Error::WrongVault)));
}

#[test]
fn bit_flips_on_read_are_errors_not_data() {
    let medium = Arc::new(FaultMedium::new(oubli_media::MemMedium::new()));
    let vault = Arc::new(MemoryVault::empty());
    let v = vault.clone();
    let store = Store::create(
        medium.clone() as Arc<dyn Medium>,
        move |r| {
            v.store(r)?;
            Ok(v)
        },
        CreateOptions::default(),
        options(),
    )
    .unwrap();
    let oid = store.create_object(b"").unwrap();
    let data = marker::data(9, 70_000);
    store.write(oid, 0, &data).unwrap();
    store.commit().unwrap();
    drop(store);
    medium.set_read_fault(ReadTarget::Segments, Some(ReadFault::FlipBit));
    match Store::open(medium.clone() as Arc<dyn Medium>, vault, options())
        .and_then(|s| s.read(oid, 0, data.len()))
    {
        Err(Error::Corrupt(_)) => {}
        Err(e) => panic!("expected an integrity error, got {e}"),
        Ok(_) => panic!("flipped bits returned as data"),
    }
}

/// The current epoch's intent log and its tally, as files: the log is the
/// segment made of whole frames ([`frame_ends`]), the tally the segment
/// allocated right after it.
fn log_and_tally(f: &Fixture) -> (PathBuf, PathBuf) {
    let log = f
        .segments()
        .into_iter()
        .find(|p| frame_ends(&std::fs::read(p).unwrap()).is_some())
        .expect("log segment");
    let id = u32::from_str_radix(log.file_stem().unwrap().to_str().unwrap(), 16).unwrap();
    // (Not there yet when no tally record was written.)
    let tally = log.with_file_name(format!("{:08x}.seg", id + 1));
    (log, tally)
}

/// A store with three acknowledged flushes in its current epoch, "crashed"
/// right after the third (the directory copied as it was, lock removed).
fn three_flushes() -> (Fixture, u64) {
    let mut f = Fixture::new();
    let store = f.open().unwrap();
    let oid = store.create_object(b"").unwrap();
    for i in 0..3 {
        store
            .write(oid, i * 10_000, &marker::data(i + 1, 10_000))
            .unwrap();
        store.flush().unwrap();
    }
    let crashed = f.store.with_file_name("crashed");
    copy_dir(&f.store, &crashed);
    std::fs::remove_file(crashed.join("lock")).ok();
    drop(store);
    f.store = crashed;
    (f, oid)
}

fn assert_log_damage(f: &Fixture, what: &str) {
    match f.open() {
        Err(Error::LogDamaged(msg)) => assert!(msg.contains("intent log"), "{what}: {msg}"),
        Err(e) => panic!("{what}: expected a damaged-log error, got {e}"),
        Ok(_) => panic!("{what}: the store opened without the acknowledged batches"),
    }
}

/// Issue 9 item 3: damage to, or truncation of, any acknowledged batch —
/// at a frame boundary or through a flipped length byte — is reported; only
/// a batch its flush never acknowledged (not in the tally) may be missing.
#[test]
fn truncated_or_damaged_log_is_reported_but_an_unacknowledged_tail_is_not() {
    let (mut f, oid) = three_flushes();
    let (log, tally) = log_and_tally(&f);
    let pristine = std::fs::read(&log).unwrap();
    let pristine_tally = std::fs::read(&tally).unwrap();
    assert_eq!(pristine_tally.len(), 3 * oubli_core::log::TALLY_RECORD_LEN);
    let frame_ends = frame_ends(&pristine).unwrap();
    assert_eq!(frame_ends.len(), 3);
    let restore = |f: &Fixture| {
        std::fs::write(&log, &pristine).unwrap();
        std::fs::write(&tally, &pristine_tally).unwrap();
        let _ = f;
    };
    // A flipped bit in the first batch's body.
    flip(&log, 30);
    assert_log_damage(&f, "flipped body bit");
    restore(&f);
    // A flipped byte in the second batch's length field.
    flip(&log, frame_ends[0] as u64 + 1);
    assert_log_damage(&f, "flipped length byte");
    restore(&f);
    // Truncated at each frame boundary, and inside the last frame.
    for cut in [0, frame_ends[0], frame_ends[1], frame_ends[2] - 5] {
        std::fs::write(&log, &pristine[..cut]).unwrap();
        assert_log_damage(&f, &format!("log cut at {cut}"));
        restore(&f);
    }
    // The segment removed altogether.
    std::fs::remove_file(&log).unwrap();
    assert_log_damage(&f, "log segment removed");
    restore(&f);
    // A power cut before the third flush's tally record: that batch was never
    // acknowledged, so a torn copy of it is a tail the store drops.
    std::fs::write(
        &tally,
        &pristine_tally[..2 * oubli_core::log::TALLY_RECORD_LEN],
    )
    .unwrap();
    std::fs::write(&log, &pristine[..frame_ends[2] - 5]).unwrap();
    let store = f.open().unwrap();
    assert_eq!(store.size(oid).unwrap(), 20_000);
    assert_eq!(
        store.read(oid, 0, 20_000).unwrap(),
        [marker::data(1, 10_000), marker::data(2, 10_000)].concat()
    );
    drop(store);
    // And the untouched copy opens with all three.
    f.store = f.store.with_file_name("crashed-again");
    let (g, oid) = three_flushes();
    assert_eq!(g.open().unwrap().size(oid).unwrap(), 30_000);
}

/// A tally that lags the frames (the mount's default: a record at most once
/// per interval, and from the timer) loses nothing: a flush returns once
/// its frame (cells included) is durable, and frames past the tally are
/// replayed when they open. What the lag gives up is the check: a log cut
/// at a boundary the tally has not reached yet opens shorter. The timer's
/// record brings every acknowledged frame under the check again.
#[test]
fn frames_past_a_lagging_tally_are_replayed_and_the_timer_counts_them() {
    let f = Fixture::new();
    let lagging = Options {
        tally: TallyCadence::Every(std::time::Duration::from_millis(200)),
        ..options()
    };
    let store = f.open_with_options(lagging.clone()).unwrap();
    let oid = store.create_object(b"").unwrap();
    // Small writes: their cells travel in the frames.
    for i in 0..3 {
        store
            .write(oid, i * 1_000, &marker::data(i + 1, 1_000))
            .unwrap();
        store.flush().unwrap();
    }
    let (log, tally) = log_and_tally(&f);
    let bytes = std::fs::read(&log).unwrap();
    let frames = frame_ends(&bytes).unwrap();
    assert_eq!(frames.len(), 3);
    let cells_len = u32::from_le_bytes(bytes[20..24].try_into().unwrap());
    assert!(
        cells_len >= 1_000,
        "the first frame carries {cells_len} bytes of cells"
    );
    let counted = std::fs::read(&tally).map(|t| t.len()).unwrap_or(0);
    assert!(
        counted < 3 * oubli_core::log::TALLY_RECORD_LEN,
        "a tally record per flush: the cadence was not followed"
    );
    // A power cut now: every acknowledged write is there.
    let copy = f.power_cut_copy("lag-crashed");
    {
        let reopened = copy.open_with_options(lagging.clone()).unwrap();
        assert_eq!(reopened.size(oid).unwrap(), 3_000);
        let want: Vec<u8> = (0..3).flat_map(|i| marker::data(i + 1, 1_000)).collect();
        assert_eq!(reopened.read(oid, 0, 3_000).unwrap(), want);
    }
    // The timer, once the interval has passed, counts the three frames.
    std::thread::sleep(std::time::Duration::from_millis(250));
    store.tick();
    let records = std::fs::read(&tally).unwrap();
    assert!(records.len() > counted, "the timer wrote no tally record");
    let copy = f.power_cut_copy("tally-crashed");
    drop(store);
    let (copy_log, _) = log_and_tally(&copy);
    let pristine = std::fs::read(&copy_log).unwrap();
    std::fs::write(&copy_log, &pristine[..frames[1]]).unwrap();
    match copy.open_with_options(lagging) {
        Err(Error::LogDamaged(_)) => {}
        Err(e) => panic!("expected a damaged-log error, got {e}"),
        Ok(_) => panic!("a log cut below the tally opened"),
    }
}

/// Issue 9 item 6: a crash that leaves a few bytes of an epoch's first log
/// frame must not make every later flush fail.
#[test]
fn a_torn_first_frame_does_not_block_later_flushes() {
    let (f, _) = three_flushes();
    let (log, tally) = log_and_tally(&f);
    // The state of a power cut during the epoch's first flush: a few bytes
    // of its frame, no tally record.
    let bytes = std::fs::read(&log).unwrap();
    std::fs::write(&log, &bytes[..10]).unwrap();
    std::fs::remove_file(&tally).unwrap();
    let store = f.open().unwrap();
    let other = store.create_object(b"").unwrap();
    store.write(other, 0, &marker::data(7, 5_000)).unwrap();
    store.flush().unwrap();
    store.write(other, 5_000, &marker::data(8, 5_000)).unwrap();
    store.flush().unwrap();
    drop(store);
    let store = f.open().unwrap();
    assert_eq!(store.size(other).unwrap(), 10_000);
    assert_eq!(
        store.read(other, 0, 10_000).unwrap(),
        [marker::data(7, 5_000), marker::data(8, 5_000)].concat()
    );
}

/// Issue 9 item 2: a first frame written but lost in a power cut (an
/// adversary may have copied it while it was in flight) and the different
/// batch the reopened store flushes next never share a (key, nonce).
#[test]
fn a_lost_first_frame_and_the_next_flush_never_share_a_key() {
    let (f, _) = three_flushes();
    let (log, tally) = log_and_tally(&f);
    let lost = std::fs::read(&log).unwrap();
    // The adversary's copy of the first frame; the medium lost it all.
    std::fs::remove_file(&log).unwrap();
    std::fs::remove_file(&tally).unwrap();
    let store = f.open().unwrap();
    let epoch = store.epoch();
    let oid = store.create_object(b"").unwrap();
    store.write(oid, 0, &marker::data(9, 10_000)).unwrap();
    store.flush().unwrap();
    drop(store);
    let vault = FileVault::open(&f.vault, &password(), Arc::new(RingProvider::new())).unwrap();
    let record = vault.load().unwrap();
    assert_eq!(record.epoch, epoch);
    let provider = RingProvider::new();
    let keys = oubli_core::log::LogKeys {
        provider: &provider,
        epoch_key: &record.key,
        store_id: &record.store_id,
        epoch,
    };
    let first_frame_key = |frame: &[u8]| {
        let (_, salt) = oubli_core::log::frame_header(frame).expect("frame header");
        *keys.batch_key(0, Some(&salt)).expose()
    };
    let (new_log, _) = log_and_tally(&f);
    let written = std::fs::read(&new_log).unwrap();
    assert_ne!(
        lost[24..],
        written[24..written.len().min(lost.len())],
        "the test needs two different batches"
    );
    assert_ne!(
        first_frame_key(&lost),
        first_frame_key(&written),
        "two different frames were sealed under the same key and nonce"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
