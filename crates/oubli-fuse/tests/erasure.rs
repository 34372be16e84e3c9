//! Erasure through the mount, checked by the recording adversary: after rm, overwrite, truncate, punch, `mv X Y` onto an existing file, the last of several hard links, a deleted directory tree and purge, no deleted content, name or metadata opens; kept files do.

mod common;
use common::*;
use oubli_core::tree::{decode_node, encode_node, Node, Value};
use oubli_core::{Medium, Vault, VaultRecord};
use oubli_crypto::{CryptoProvider, KeyRef, KeyScheme, ParentPointerScheme};
use oubli_media::{MemMedium, RecordingMedium};
use oubli_testkit::marker::{self, Marker};
use oubli_testkit::{harness, Adversary, RecordingVault};
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

/// Every plaintext of metadata the adversary opens with `keys`: tree nodes
/// (names, object records with their FUSE metadata) of every superblock it
/// can open, and the ops of that epoch's intent log. Follows docs/FORMAT.md.
fn metadata_plaintexts(
    adv: &Adversary,
    keys: &[VaultRecord],
    provider: &dyn CryptoProvider,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let medium = &adv.medium;
    for sb in &adv.superblocks {
        if sb.len() < 40 || &sb[..8] != b"OUBLI\0SB" {
            continue;
        }
        let store_id: [u8; 16] = sb[12..28].try_into().unwrap();
        let epoch = u64::from_le_bytes(sb[28..36].try_into().unwrap());
        let n = u32::from_le_bytes(sb[36..40].try_into().unwrap()) as usize;
        for rec in keys
            .iter()
            .filter(|r| r.epoch == epoch && r.store_id == store_id)
        {
            let mut ctx = store_id.to_vec();
            ctx.extend_from_slice(&epoch.to_le_bytes());
            let key = provider.derive(&rec.key, b"oubli/superblock", &ctx);
            let mut body = sb[40..40 + n].to_vec();
            if provider.open(&key, &sb[..40], &mut body).is_err() {
                continue;
            }
            let mut at = 4;
            if body[at] == 1 {
                let level = body[at + 1];
                let addr = u64::from_le_bytes(body[at + 2..at + 10].try_into().unwrap());
                let len = u32::from_le_bytes(body[at + 10..at + 14].try_into().unwrap());
                let key = KeyRef::from_slice(&body[at + 14..at + 46]).unwrap();
                walk(medium, provider, addr, len, &key, level, &mut out);
                at += 46;
            } else {
                at += 1;
            }
            at += 8 + 4;
            let log_segment = u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
            // Format 2 names the log's tally next; the frames are read with
            // the engine's log reader (salted keys, tally checks; from format
            // 6 with the cells a frame carries), in the header's version.
            let log_tally = u32::from_le_bytes(body[at + 4..at + 8].try_into().unwrap());
            let version = u16::from_le_bytes(sb[8..10].try_into().unwrap());
            let place = oubli_core::log::LogPlace {
                segment: log_segment,
                tally: Some(log_tally),
                format: oubli_core::log::LogFormat::of_version(version),
            };
            let keys = oubli_core::log::LogKeys {
                provider,
                epoch_key: &rec.key,
                store_id: &store_id,
                epoch,
            };
            for ops in oubli_core::log::read_log(medium, &place, &keys).batches {
                out.push(oubli_core::log::encode_ops(&ops));
            }
        }
    }
    out
}

fn walk(
    medium: &MemMedium,
    provider: &dyn CryptoProvider,
    addr: u64,
    len: u32,
    key: &KeyRef,
    level: u8,
    out: &mut Vec<Vec<u8>>,
) {
    let mut buf = vec![0u8; len as usize];
    if medium
        .read((addr >> 32) as u32, addr & 0xffff_ffff, &mut buf)
        .is_err()
    {
        return;
    }
    let mut aad = b"oubli/node/v1".to_vec();
    aad.push(level);
    if provider
        .open(&ParentPointerScheme.resolve(key).unwrap(), &aad, &mut buf)
        .is_err()
    {
        return;
    }
    let Ok(node) = decode_node(&buf) else { return };
    out.push(encode_node(&node));
    if let Node::Inner(level, children) = &node {
        for (_, child) in children {
            if let oubli_core::tree::Child::Disk(p) = child {
                walk(medium, provider, p.addr, p.len, &p.key, level - 1, out);
            }
        }
    }
}

/// Object ids that have a record in any of the opened trees.
fn objects_in(plaintexts: &[Vec<u8>]) -> BTreeSet<u64> {
    let mut oids = BTreeSet::new();
    for p in plaintexts {
        if let Ok(Node::Leaf(entries)) = decode_node(p) {
            for (k, v) in entries {
                if matches!(v, Value::Object(_)) {
                    oids.insert(k.oid);
                }
            }
        }
    }
    oids
}

fn contains(haystacks: &[Vec<u8>], needle: &[u8]) -> bool {
    haystacks
        .iter()
        .any(|h| h.windows(needle.len()).any(|w| w == needle))
}

/// The markers of `write` in `[from, to)` bytes.
fn blocks(write: u64, from: usize, to: usize) -> BTreeSet<Marker> {
    (from / marker::BLOCK..to / marker::BLOCK)
        .map(|b| (write, b as u32))
        .collect()
}

struct World {
    recording: Arc<RecordingMedium<MemMedium>>,
    vault: Arc<RecordingVault>,
    provider: Arc<dyn CryptoProvider>,
}

impl World {
    fn seize(&self, all_keys: bool) -> (BTreeSet<Marker>, Vec<Vec<u8>>) {
        let adv = Adversary::seize(&self.recording);
        assert!(
            adv.plaintext_markers().is_empty(),
            "plaintext on the medium"
        );
        let keys = if all_keys {
            self.vault.history()
        } else {
            vec![oubli_core::Vault::load(&*self.vault).unwrap()]
        };
        let markers = adv.recovered_markers(&keys, self.provider.clone());
        let meta = metadata_plaintexts(&adv, &keys, &*self.provider);
        (markers, meta)
    }
}

fn write_file(p: &Path, data: &[u8]) {
    let f = File::create(p).unwrap();
    f.write_all_at(data, 0).unwrap();
    f.sync_all().unwrap();
}

const SECRET_NAMES: &[&str] = &[
    "SECRETNAME-removed-file",
    "SECRETNAME-replaced-target",
    "SECRETNAME-renamed-away",
    "SECRETNAME-link-one",
    "SECRETNAME-link-two",
    "SECRETNAME-dir-top",
    "SECRETNAME-dir-sub",
    "SECRETNAME-deep-file",
];

#[test]
fn deleted_content_names_and_metadata_do_not_open_after_purge() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(31);
    let mut m = Mounted::new(store.clone(), default_options());
    let p = |n: &str| m.path(n);
    const N: usize = 40_000;

    write_file(&p("SECRETNAME-removed-file"), &marker::data(1, N));
    write_file(&p("overwritten"), &marker::data(2, N));
    write_file(&p("truncated"), &marker::data(4, N));
    write_file(&p("punched"), &marker::data(10, N));
    write_file(&p("SECRETNAME-replaced-target"), &marker::data(5, N));
    write_file(&p("SECRETNAME-renamed-away"), &marker::data(6, N));
    write_file(&p("SECRETNAME-link-one"), &marker::data(7, N));
    fs::hard_link(p("SECRETNAME-link-one"), p("SECRETNAME-link-two")).unwrap();
    fs::hard_link(p("SECRETNAME-link-one"), p("last-link")).unwrap();
    fs::create_dir_all(p("SECRETNAME-dir-top/SECRETNAME-dir-sub")).unwrap();
    write_file(
        &p("SECRETNAME-dir-top/SECRETNAME-dir-sub/SECRETNAME-deep-file"),
        &marker::data(8, N),
    );
    write_file(&p("KEPTNAME-file"), &marker::data(9, N));
    let xattr = |path: &Path, value: &[u8]| {
        setxattr(path, "user.tag", value, 0).unwrap();
    };
    xattr(&p("KEPTNAME-file"), b"SECRETXATTR-old-value");
    let doomed_oids: Vec<u64> = [
        "SECRETNAME-removed-file",
        "SECRETNAME-replaced-target",
        "SECRETNAME-dir-top",
    ]
    .iter()
    .map(|n| fs::metadata(p(n)).unwrap().ino())
    .collect();
    m.session().purge().unwrap();

    // Before the deletions everything opens: the adversary is not blind.
    let (markers, meta) = world.seize(false);
    for w in [1, 2, 4, 5, 6, 7, 8, 9, 10] {
        assert!(
            blocks(w, 0, N).is_subset(&markers),
            "write {w} not readable"
        );
    }
    for name in SECRET_NAMES {
        assert!(
            contains(&meta, name.as_bytes()),
            "{name} not readable before deletion"
        );
    }

    // The deletions, each through the mount.
    fs::remove_file(p("SECRETNAME-removed-file")).unwrap();
    OpenOptions::new()
        .write(true)
        .open(p("overwritten"))
        .unwrap()
        .write_all_at(&marker::data(3, N), 0)
        .unwrap();
    OpenOptions::new()
        .write(true)
        .open(p("truncated"))
        .unwrap()
        .set_len(8192)
        .unwrap();
    {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new().write(true).open(p("punched")).unwrap();
        // SAFETY: FFI on an open descriptor.
        check(unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                4096,
                8192,
            )
        })
        .unwrap();
    }
    fs::rename(
        p("SECRETNAME-renamed-away"),
        p("SECRETNAME-replaced-target"),
    )
    .unwrap();
    fs::rename(p("SECRETNAME-replaced-target"), p("moved-here")).unwrap();
    fs::remove_file(p("SECRETNAME-link-one")).unwrap();
    fs::remove_file(p("SECRETNAME-link-two")).unwrap();
    fs::remove_dir_all(p("SECRETNAME-dir-top")).unwrap();
    xattr(&p("KEPTNAME-file"), b"new-value");
    File::open(p("KEPTNAME-file")).unwrap().sync_all().unwrap();

    // Still pending before the purge: the current key opens them (as promised, until the epoch ends).
    let (markers, _) = world.seize(false);
    assert!(markers.contains(&(1, 0)), "deletion pending until purge");

    m.session().purge().unwrap();
    let (markers, meta) = world.seize(false);
    let mut erased = BTreeSet::new();
    for w in [1, 2, 5, 8] {
        erased.extend(blocks(w, 0, N));
    }
    erased.extend(blocks(4, 8192, N));
    erased.extend(blocks(10, 4096, 4096 + 8192));
    let leaked: Vec<_> = markers.intersection(&erased).take(5).collect();
    assert!(
        leaked.is_empty(),
        "deleted data opens after purge: {leaked:?}"
    );
    let mut live = BTreeSet::new();
    for w in [3, 6, 7, 9] {
        live.extend(blocks(w, 0, N));
    }
    live.extend(blocks(4, 0, 8192));
    live.extend(blocks(10, 0, 4096));
    live.extend(blocks(10, 4096 + 8192, N));
    assert!(live.is_subset(&markers), "kept data must open");
    for name in SECRET_NAMES {
        assert!(
            !contains(&meta, name.as_bytes()),
            "deleted name {name} opens after purge"
        );
    }
    assert!(
        !contains(&meta, b"SECRETXATTR-old-value"),
        "old metadata opens after purge"
    );
    assert!(contains(&meta, b"KEPTNAME-file") && contains(&meta, b"last-link"));
    let records = objects_in(&meta);
    for oid in &doomed_oids {
        assert!(
            !records.contains(oid),
            "record (size, times) of deleted object {oid} opens"
        );
    }

    // The last of the hard links.
    let oid = fs::metadata(p("last-link")).unwrap().ino();
    fs::remove_file(p("last-link")).unwrap();
    m.session().purge().unwrap();
    let (markers, meta) = world.seize(false);
    assert!(
        blocks(7, 0, N).is_disjoint(&markers),
        "last link gone: data erased"
    );
    assert!(!objects_in(&meta).contains(&oid));
    assert!(!contains(&meta, b"last-link"));

    // Kept files read back intact through the mount, and after remounting.
    assert_eq!(fs::read(p("KEPTNAME-file")).unwrap(), marker::data(9, N));
    assert_eq!(fs::read(p("moved-here")).unwrap(), marker::data(6, N));
    m.unmount();
    let m2 = Mounted::new(store, default_options());
    assert_eq!(
        fs::read(m2.path("overwritten")).unwrap(),
        marker::data(3, N)
    );
    assert_eq!(
        fs::read(m2.path("truncated")).unwrap(),
        marker::data(4, 8192)
    );
    drop(m2);

    // Control: an adversary that kept every old vault key recovers what was
    // deleted — so the checks above can fail, and the vault overwrite is what matters.
    let (markers, meta) = world.seize(true);
    assert!(blocks(1, 0, N).is_subset(&markers));
    assert!(contains(&meta, b"SECRETNAME-removed-file"));
    assert!(contains(&meta, b"SECRETXATTR-old-value"));
}

/// Sensitive files: deleting or overwriting one commits at once, without a purge.
#[test]
fn sensitive_files_are_erased_at_once() {
    if !fuse_available() {
        return;
    }
    let options = harness::options(32);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create(recording.clone() as Arc<dyn Medium>, &options);
    let world = World {
        recording,
        vault,
        provider: options.provider.clone(),
    };
    let m = Mounted::new(Arc::new(store), default_options());
    let dir = m.path("vault-dir");
    fs::create_dir(&dir).unwrap();
    let (c, n) = (
        cpath(&dir),
        std::ffi::CString::new(oubli_fuse::SENSITIVE_XATTR).unwrap(),
    );
    // SAFETY: FFI with valid strings and buffer.
    check(unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), b"1".as_ptr().cast(), 1, 0) }).unwrap();
    const N: usize = 20_000;
    write_file(&dir.join("SECRETNAME-sensitive"), &marker::data(21, N));
    write_file(&dir.join("overwritten"), &marker::data(22, N));
    write_file(&m.path("ordinary"), &marker::data(23, N));
    m.session().purge().unwrap();
    // Inherited by new children.
    let child = cpath(&dir.join("overwritten"));
    let mut buf = [0u8; 4];
    // SAFETY: FFI with valid strings and a writable buffer.
    let got = unsafe { libc::getxattr(child.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 4) };
    assert_eq!(got, 1, "sensitivity inherited");

    fs::remove_file(dir.join("SECRETNAME-sensitive")).unwrap();
    OpenOptions::new()
        .write(true)
        .open(dir.join("overwritten"))
        .unwrap()
        .write_all_at(&marker::data(24, N), 0)
        .unwrap();
    fs::remove_file(m.path("ordinary")).unwrap();
    // No purge: the sensitive deletions committed on their own.
    let (markers, meta) = world.seize(false);
    assert!(
        blocks(21, 0, N).is_disjoint(&markers),
        "sensitive file erased at once"
    );
    assert!(
        blocks(22, 0, N).is_disjoint(&markers),
        "sensitive overwrite erased at once"
    );
    assert!(!contains(&meta, b"SECRETNAME-sensitive"));
    assert!(blocks(24, 0, N).is_subset(&markers));
}

/// With the kernel's writeback cache an overwrite stays in the kernel's
/// dirty pages until writeback, fsync or close. A purge writes them back
/// first: after it the overwritten bytes do not open, and the new ones are
/// in the store — with the file still open and never synced.
#[test]
fn a_purge_erases_what_dirty_pages_overwrote() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(37);
    let m = Mounted::new(store, default_options());
    const N: usize = 40_000;
    write_file(&m.path("overwritten-in-cache"), &marker::data(51, N));
    m.session().purge().unwrap();
    let held = OpenOptions::new()
        .write(true)
        .open(m.path("overwritten-in-cache"))
        .unwrap();
    held.write_all_at(&marker::data(52, N), 0).unwrap();
    m.session().purge().unwrap();
    let (markers, _) = world.seize(false);
    let leaked: Vec<_> = blocks(51, 0, N)
        .intersection(&markers)
        .take(5)
        .copied()
        .collect();
    assert!(
        leaked.is_empty(),
        "overwritten bytes open after the purge: {leaked:?}"
    );
    assert!(
        blocks(52, 0, N).is_subset(&markers),
        "the overwrite is in the store after the purge"
    );
    drop(held);
}

/// The writes a purge must wait for: an overwrite through a handle still
/// open sits in the kernel's writeback cache, and `syncfs` returns while the
/// WRITE requests it started are still queued or being served (FUSE.md,
/// "The writeback cache"). The store must hold the overwrite the moment
/// `Session::purge` returns, in every one of many rounds (before the write
/// barrier, 3 rounds in 12 found the old data).
#[test]
fn a_purge_waits_for_writes_the_kernel_has_in_flight() {
    if !fuse_available() {
        return;
    }
    let options = harness::options(41);
    let (store, _vault) = harness::create(
        Arc::new(MemMedium::with_segment_capacity(harness::TEST_SEGMENT)) as Arc<dyn Medium>,
        &options,
    );
    let m = Mounted::new(Arc::new(store), default_options());
    // Several WRITE requests of 1 MiB each: served in parallel, for
    // milliseconds, while the purge begins.
    const N: usize = 4 << 20;
    const ROUNDS: u64 = 20;
    let mut stale = Vec::new();
    for round in 0..ROUNDS {
        let path = m.path(&format!("in-flight-{round}"));
        write_file(&path, &marker::data(1000 + 2 * round, N));
        let oid = fs::metadata(&path).unwrap().ino();
        m.session().purge().unwrap();
        let held = OpenOptions::new().write(true).open(&path).unwrap();
        let new = marker::data(1001 + 2 * round, N);
        held.write_all_at(&new, 0).unwrap();
        m.session().purge().unwrap();
        if m.store.read(oid, 0, N).unwrap() != new {
            stale.push(round);
        }
        drop(held);
    }
    assert!(
        stale.is_empty(),
        "the store lacked the overwrite right after the purge in rounds {stale:?} of {ROUNDS}"
    );
}

/// A file removed while the kernel still holds its dirty pages: the pages
/// reach the mount (the purge's writeback, or the last close's) while the
/// object is an orphan, go with it at the last close, and nothing of them
/// or of its name opens after the next purge. The open handle still reads
/// what it wrote.
#[test]
fn a_file_removed_with_dirty_pages_does_not_open_after_purge() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(39);
    let m = Mounted::new(store.clone(), default_options());
    const N: usize = 40_000;
    for purge_while_open in [false, true] {
        let name = format!("SECRETNAME-dirty-{purge_while_open}");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(m.path(&name))
            .unwrap();
        let w = 53 + purge_while_open as u64;
        f.write_all_at(&marker::data(w, N), 0).unwrap();
        let oid = f.metadata().unwrap().ino();
        fs::remove_file(m.path(&name)).unwrap();
        if purge_while_open {
            m.session().purge().unwrap();
        }
        let mut back = vec![0u8; N];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == marker::data(w, N), "the open handle reads its data");
        drop(f);
        // The kernel releases the handle after close returns: wait for the object to go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.exists(oid).unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the orphan outlived its last close"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        m.session().purge().unwrap();
        let (markers, meta) = world.seize(false);
        assert!(
            blocks(w, 0, N).is_disjoint(&markers),
            "dirty pages of a removed file open after the purge"
        );
        assert!(!contains(&meta, name.as_bytes()));
        assert!(!objects_in(&meta).contains(&oid));
    }
}

fn recording_world(seed: u64) -> (World, Arc<oubli_core::Store>) {
    let options = harness::options(seed);
    let recording = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
        harness::TEST_SEGMENT,
    )));
    let (store, vault) = harness::create(recording.clone() as Arc<dyn Medium>, &options);
    let world = World {
        recording,
        vault,
        provider: options.provider.clone(),
    };
    (world, Arc::new(store))
}

/// Unmounting ends the epoch: what was deleted through the mount is gone without an explicit purge.
#[test]
fn unmount_commits() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(33);
    let mut m = Mounted::new(store, default_options());
    write_file(
        &m.path("SECRETNAME-until-unmount"),
        &marker::data(41, 20_000),
    );
    m.session().purge().unwrap();
    fs::remove_file(m.path("SECRETNAME-until-unmount")).unwrap();
    m.unmount();
    let (markers, meta) = world.seize(false);
    assert!(blocks(41, 0, 20_000).is_disjoint(&markers));
    assert!(!contains(&meta, b"SECRETNAME-until-unmount"));
}

/// An unmount while a file is still open fails with EBUSY: the session
/// then unmounts from outside (lazily, at last) instead of waiting for
/// ever for its request loops, and ends, with its commit, once the file
/// is closed.
#[test]
fn unmount_with_a_file_still_open_ends_once_it_is_closed() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(35);
    let mut m = Mounted::new(store, default_options());
    write_file(&m.path("SECRETNAME-open"), &marker::data(43, 20_000));
    m.session().purge().unwrap();
    fs::remove_file(m.path("SECRETNAME-open")).unwrap();
    let held = File::create(m.path("held-open")).unwrap();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(3));
        drop(held);
    });
    let session = m.session.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(session.unmount());
    });
    let outcome = rx.recv_timeout(std::time::Duration::from_secs(60));
    closer.join().unwrap();
    outcome
        .expect("the unmount waited for ever with a file open")
        .expect("unmount");
    assert!(!m.mnt.join("held-open").exists(), "still mounted");
    let (markers, meta) = world.seize(false);
    assert!(blocks(43, 0, 20_000).is_disjoint(&markers));
    assert!(!contains(&meta, b"SECRETNAME-open"));
}

/// The unmount's commit refused by the vault (a token unplugged): the
/// unmount reports it as `Error::Unfinished` — the commit's error, the
/// deletions still pending, the paths removed (by unlink, rmdir and a
/// rename over a name, a directory's too once it is gone) — instead of
/// `Ok`; whether the session unmounts or the kernel's unmount ends it.
/// A commit once the vault is back erases them.
#[test]
fn unmount_reports_a_commit_the_vault_refused() {
    if !fuse_available() {
        return;
    }
    for from_outside in [false, true] {
        let flaky = Arc::new(oubli_vault::FlakyVault::new(
            oubli_vault::MemoryVault::empty(),
        ));
        let handle = flaky.clone();
        let store = Arc::new(
            oubli_core::Store::create(
                Arc::new(MemMedium::new()),
                move |first| {
                    handle.inner().store(first)?;
                    Ok(handle)
                },
                harness::front_end_create_options(),
                store_options(),
            )
            .unwrap(),
        );
        let mut m = Mounted::new(store.clone(), default_options());
        fs::create_dir(m.path("dir")).unwrap();
        write_file(&m.path("dir/gone"), b"in a directory");
        write_file(&m.path("victim"), b"replaced");
        write_file(&m.path("kept"), b"kept");
        for i in 0..25 {
            write_file(&m.path(&format!("many{i}")), b"one of many");
        }
        m.session().purge().unwrap();
        fs::remove_file(m.path("dir/gone")).unwrap();
        fs::remove_dir(m.path("dir")).unwrap();
        write_file(&m.path("new"), b"new");
        fs::rename(m.path("new"), m.path("victim")).unwrap();
        for i in 0..25 {
            fs::remove_file(m.path(&format!("many{i}"))).unwrap();
        }
        flaky.unavailable(true);
        let session = m.session.take().unwrap();
        let outcome = if from_outside {
            // A file closed a moment before keeps the mount busy until the
            // kernel's release reaches it: a few tries.
            let ok = (0..50).any(|_| {
                let ok = std::process::Command::new("fusermount3")
                    .arg("-u")
                    .arg(&m.mnt)
                    .status()
                    .unwrap()
                    .success();
                if !ok {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                ok
            });
            assert!(ok, "fusermount3 -u");
            session.wait()
        } else {
            session.unmount()
        };
        let Err(oubli_fuse::Error::Unfinished(u)) = outcome else {
            panic!("from outside {from_outside}: {outcome:?}");
        };
        // A vault that did not answer leaves its state unknown: the engine
        // then stores nothing more either (the flush fails too), and says so.
        assert!(u.commit.is_some() && u.flush.is_some(), "{u:?}");
        assert_eq!(u.attributes_unwritten, 0);
        assert!(u.pending_deletions >= 3, "{u:?}");
        // The first 20 removals are named, the rest counted.
        assert_eq!(u.removed[..4], ["/dir/gone", "/dir", "/victim", "/many0"]);
        assert_eq!((u.removed.len(), u.removed_more), (20, 8), "{u:?}");
        let said = u.to_string();
        assert!(
            said.contains("writes since the last flush were not stored")
                && said.contains("deletions were not committed")
                && said.contains("/dir/gone, /dir, /victim, /many0")
                && said.contains("/many16 and 8 more"),
            "{said}"
        );
        flaky.unavailable(false);
        store.commit().unwrap();
        assert_eq!(store.status().unwrap().pending_deletions, 0);
    }
}

/// The mount's epoch policy (`-o epoch_deletions=1`) commits without being asked.
#[test]
fn mount_policy_commits_on_its_own() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(34);
    let mut opts = default_options();
    opts.parse("epoch_deletions=1").unwrap();
    opts.tick = std::time::Duration::from_millis(50);
    let m = Mounted::new(store.clone(), opts);
    write_file(&m.path("SECRETNAME-timer"), &marker::data(42, 20_000));
    m.session().purge().unwrap();
    let epoch = store.epoch();
    let objects = store.objects().unwrap().len();
    fs::remove_file(m.path("SECRETNAME-timer")).unwrap();
    // The store was opened with a manual policy: only the mount's can
    // commit. It may commit twice: the kernel's release of the handle that
    // wrote the file is asynchronous, and when it comes after the unlink the
    // name's removal is one deletion (and commit) and the object's erasure at
    // the release the next. So: wait for the object gone and every deletion
    // committed, not for the first new epoch.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let status = store.status().unwrap();
        if status.epoch != epoch
            && status.pending_deletions == 0
            && store.objects().unwrap().len() < objects
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy never committed the deletion: {status:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (markers, meta) = world.seize(false);
    assert!(blocks(42, 0, 20_000).is_disjoint(&markers));
    assert!(!contains(&meta, b"SECRETNAME-timer"));
}

/// `oubli redact` through the mount: a directory tree erased from the live
/// tree and from two snapshots (one holding a file already deleted live) —
/// after the purge the adversary with every past medium state and the
/// current vault opens none of it, and opens everything else the snapshots
/// and the live tree hold (the control).
#[test]
fn redacted_files_do_not_open_from_any_snapshot_after_purge() {
    if !fuse_available() {
        return;
    }
    let (world, store) = recording_world(32);
    let m = Mounted::new(store.clone(), default_options());
    let p = |n: &str| m.path(n);
    const N: usize = 40_000;
    fs::create_dir_all(p("case/docs")).unwrap();
    write_file(&p("case/docs/report"), &marker::data(21, N));
    write_file(&p("case/summary"), &marker::data(22, N));
    write_file(&p("kept-live"), &marker::data(23, N));
    write_file(&p("kept-in-snapshot"), &marker::data(24, N));
    let handle = m.session().handle();
    handle.quiesced(|s| s.snapshot_create("s1", None)).unwrap();
    fs::remove_file(p("case/docs/report")).unwrap();
    fs::remove_file(p("kept-in-snapshot")).unwrap();
    handle.quiesced(|s| s.snapshot_create("s2", None)).unwrap();
    m.session().purge().unwrap();
    let (markers, _) = world.seize(false);
    assert!(
        blocks(21, 0, N).is_subset(&markers),
        "a file deleted live but held by a snapshot opens (not yet redacted)"
    );

    let r = handle.redact(Path::new("case")).unwrap();
    assert_eq!(r.snapshots, vec!["s1".to_string(), "s2".to_string()]);
    m.session().purge().unwrap();
    let (markers, _) = world.seize(false);
    let mut erased = blocks(21, 0, N);
    erased.extend(blocks(22, 0, N));
    let leaked: Vec<_> = markers.intersection(&erased).take(5).collect();
    assert!(leaked.is_empty(), "redacted data opens: {leaked:?}");
    let mut kept = blocks(23, 0, N);
    kept.extend(blocks(24, 0, N));
    assert!(kept.is_subset(&markers), "kept data must open");
    assert_eq!(
        fs::read(p(".snapshots/s1/kept-in-snapshot")).unwrap(),
        marker::data(24, N)
    );
}
