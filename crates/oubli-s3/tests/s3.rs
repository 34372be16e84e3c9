//! The S3 medium against a real server (versitygw on loopback): runs read back after a reopen, two processes are fenced, a lost PUT answer is resolved, old versions stay and can be listed.

use oubli_core::{Medium, Slot};
use oubli_s3::test_server::TestServer;
use oubli_s3::S3Medium;
use std::io::ErrorKind;

fn server(dir: &std::path::Path) -> Option<TestServer> {
    TestServer::start_or_skip(dir)
}

#[test]
fn runs_and_superblocks_survive_a_reopen_and_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("reopen", false, "stores/one");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    m.append(3, 0, b"hello ").unwrap();
    m.sync().unwrap();
    m.append(3, 6, b"world").unwrap();
    // Readable before the upload, and after.
    let mut buf = [0u8; 11];
    m.read(3, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello world");
    m.write_superblock(Slot::A, b"super-a").unwrap();
    m.sync().unwrap();
    m.write_superblock(Slot::B, b"super-b").unwrap();
    drop(m);
    srv.restart();
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert_eq!(m.list_segments().unwrap(), vec![3]);
    assert_eq!(m.segment_len(3).unwrap(), Some(11));
    let mut buf = [0u8; 5];
    m.read(3, 6, &mut buf).unwrap();
    assert_eq!(&buf, b"world");
    assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"super-a");
    assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"super-b");
    m.delete_segment(3).unwrap();
    assert!(m.list_segments().unwrap().is_empty());
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert!(m.list_segments().unwrap().is_empty());
}

#[test]
fn a_second_process_is_fenced_whichever_slot_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("fence", false, "");
    let first = S3Medium::open_with(&at, &srv.config()).unwrap();
    first.write_superblock(Slot::A, b"epoch 1").unwrap();
    let second = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert_eq!(
        second.read_superblock(Slot::A).unwrap().unwrap(),
        b"epoch 1"
    );
    // The first goes on committing (to the other slot)...
    first.write_superblock(Slot::B, b"epoch 2").unwrap();
    // ... so the second, which read before that, cannot write either slot.
    for slot in [Slot::A, Slot::B] {
        let e = second.write_superblock(slot, b"split brain").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
        assert!(e.to_string().contains("in use elsewhere"), "{e}");
    }
    // Nor can it overwrite a run the first wrote.
    first.append(9, 0, b"first's bytes").unwrap();
    first.sync().unwrap();
    let third = S3Medium::open_with(&at, &srv.config()).unwrap();
    // (A process that lists after the first's upload sees the segment...)
    assert_eq!(third.segment_len(9).unwrap(), Some(13));
    // (... and one that raced it collides on the run's name.)
    second.append(9, 0, b"second's, different").unwrap();
    let e = second.sync().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    let mut buf = [0u8; 13];
    third.read(9, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"first's bytes");
    assert_eq!(third.read_superblock(Slot::B).unwrap().unwrap(), b"epoch 2");
}

#[test]
fn a_repeated_put_of_the_same_bytes_is_our_own_and_succeeds() {
    // A retry after a lost answer meets the object its first attempt
    // stored: same name, same bytes. Modelled by a second medium that
    // opened before the first upload and now uploads the same run.
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("ambiguous", false, "");
    let first = S3Medium::open_with(&at, &srv.config()).unwrap();
    let retry = S3Medium::open_with(&at, &srv.config()).unwrap();
    first.append(1, 0, b"the same run").unwrap();
    first.sync().unwrap();
    first.write_superblock(Slot::A, b"sb").unwrap();
    retry.append(1, 0, b"the same run").unwrap();
    retry.sync().unwrap();
    // The superblocks object likewise: the retry's If-None-Match fails on
    // an object that holds exactly what it wanted to write.
    retry.write_superblock(Slot::A, b"sb").unwrap();
    let mut buf = [0u8; 12];
    retry.read(1, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"the same run");
    // Missing segments delete quietly.
    retry.delete_segment(77).unwrap();
}

#[test]
fn a_versioned_bucket_keeps_every_version_and_they_can_be_listed_and_purged() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("versioned", true, "p");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    for epoch in 0..3u8 {
        m.write_superblock(Slot::A, &[epoch; 10]).unwrap();
    }
    m.append(1, 0, b"doomed").unwrap();
    m.sync().unwrap();
    m.delete_segment(1).unwrap();
    let admin = srv.admin();
    let versions = admin.versions("versioned", "p/").unwrap();
    let heads: Vec<_> = versions
        .iter()
        .filter(|v| v.key == "p/superblocks" && !v.delete_marker)
        .collect();
    assert_eq!(heads.len(), 3, "{versions:?}");
    let run = versions
        .iter()
        .find(|v| v.key.starts_with("p/seg/") && !v.delete_marker)
        .expect("the deleted run's version is kept");
    assert_eq!(
        admin
            .get_version("versioned", &run.key, &run.version_id)
            .unwrap(),
        b"doomed"
    );
    for v in &versions {
        admin
            .delete_version("versioned", &v.key, &v.version_id)
            .unwrap();
    }
    let left: Vec<_> = admin.versions("versioned", "p/seg/").unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_second_writer_is_refused_at_open_and_a_dead_holders_lock_is_taken_over() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("locked", false, "s");
    let lease = Duration::from_secs(30);
    let first = S3Medium::open_writer_with(&at, &srv.config(), lease).unwrap();
    let refused = S3Medium::open_writer_with(&at, &srv.config(), lease)
        .err()
        .expect("a second writer must be refused");
    assert_eq!(refused.kind(), ErrorKind::WouldBlock, "{refused}");
    assert!(refused.to_string().contains("in use by pid"), "{refused}");
    // Readers need no lock.
    S3Medium::open_with(&at, &srv.config()).unwrap();
    // Released on drop: the next writer gets in.
    drop(first);
    let second = S3Medium::open_writer_with(&at, &srv.config(), lease).unwrap();
    drop(second);

    // A lock left by a process of this machine that no longer runs (kill -9).
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stale = format!(
        "oubli-s3-lock v1\nhost elsewhere\nboot {}\npid {dead}\nrenewed {now}\n",
        boot.trim()
    );
    put_raw(&srv, &at, "s/lock", stale.as_bytes());
    let taken = S3Medium::open_writer_with(&at, &srv.config(), lease).unwrap();
    drop(taken);

    // A lock of another machine, fresh: refused; not renewed for a lease: taken.
    let other = |renewed: u64| {
        format!("oubli-s3-lock v1\nhost far\nboot other-boot\npid 1\nrenewed {renewed}\n")
    };
    put_raw(&srv, &at, "s/lock", other(now).as_bytes());
    assert!(S3Medium::open_writer_with(&at, &srv.config(), lease).is_err());
    put_raw(&srv, &at, "s/lock", other(now - 31).as_bytes());
    S3Medium::open_writer_with(&at, &srv.config(), lease).unwrap();
}

#[test]
fn a_writer_whose_lock_was_taken_over_refuses_to_write() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("lost", false, "");
    let paused =
        S3Medium::open_writer_with(&at, &srv.config(), Duration::from_millis(600)).unwrap();
    paused.write_superblock(Slot::A, b"mine").unwrap();
    // Another process took the store over while this one was paused.
    put_raw(
        &srv,
        &at,
        "lock",
        b"oubli-s3-lock v1\nhost far\nboot x\npid 1\nrenewed 0\n",
    );
    std::thread::sleep(Duration::from_millis(700));
    let e = paused.append(1, 0, b"late").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "{e}");
    assert!(paused.write_superblock(Slot::B, b"late").is_err());
}

/// A client of the bucket of its own, bypassing the medium (as another
/// process, or a crash that left things half done, would).
fn raw_store(srv: &TestServer, at: &oubli_s3::S3Location) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&at.bucket)
        .with_endpoint(srv.config().endpoint.unwrap())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_access_key_id(srv.config().access_key_id.unwrap())
        .with_secret_access_key(srv.config().secret_access_key.unwrap())
        .build()
        .unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Writes an object directly, bypassing the medium.
fn put_raw(srv: &TestServer, at: &oubli_s3::S3Location, key: &str, bytes: &[u8]) {
    use object_store::ObjectStore;
    let store = raw_store(srv, at);
    block_on(store.put(&key.into(), bytes.to_vec().into())).unwrap();
}

/// The names of the objects in the bucket, sorted.
fn list_raw(srv: &TestServer, at: &oubli_s3::S3Location) -> Vec<String> {
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let store = raw_store(srv, at);
    let metas: Vec<_> = block_on(store.list(None).try_collect::<Vec<_>>()).unwrap();
    let mut names: Vec<String> = metas.into_iter().map(|m| m.location.to_string()).collect();
    names.sort();
    names
}

/// A sync that carries several segments is one PUT (one pack), so the
/// appends it carries land together; deleting one of its segments keeps
/// the others and, on the gone list, stays deleted across a reopen; once
/// every segment of the pack is deleted, the pack goes and the list empties.
#[test]
fn several_segments_in_one_sync_are_one_put_and_delete_independently() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("packs", false, "p");
    let m = S3Medium::open_writer_with(&at, &srv.config(), oubli_s3::LEASE).unwrap();
    m.write_superblock(Slot::A, b"sb").unwrap();
    let (puts, _) = m.requests();
    m.append(1, 0, b"data one").unwrap();
    m.append(2, 0, b"log two").unwrap();
    m.append(1, 8, b"+").unwrap();
    m.append(3, 0, b"tally three").unwrap();
    m.sync().unwrap();
    assert_eq!(
        m.requests().0 - puts,
        1,
        "one sync of three segments: one PUT"
    );
    m.append(1, 9, b" more").unwrap();
    m.sync().unwrap();
    assert_eq!(m.requests().0 - puts, 2, "one segment: one PUT (a run)");
    let names = list_raw(&srv, &at);
    assert!(names.iter().any(|n| n.starts_with("p/pack/")), "{names:?}");
    assert!(
        names.contains(&"p/seg/00000001/0000000000000009".to_string()),
        "{names:?}"
    );
    // The log and the tally go (as at a commit); the data stays.
    m.delete_segment(2).unwrap();
    m.delete_segment(3).unwrap();
    drop(m);
    let m = S3Medium::open_writer_with(&at, &srv.config(), oubli_s3::LEASE).unwrap();
    assert_eq!(m.list_segments().unwrap(), vec![1]);
    let mut buf = [0u8; 14];
    m.read(1, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"data one+ more");
    let gone = oubli_s3::layout::decode_gone(&raw_get(&srv, &at, "p/gone"));
    assert_eq!(gone, Some(vec![2, 3]));
    m.delete_segment(1).unwrap();
    let names = list_raw(&srv, &at);
    assert_eq!(names, ["p/gone", "p/lock", "p/superblocks"]);
    let gone = oubli_s3::layout::decode_gone(&raw_get(&srv, &at, "p/gone"));
    assert_eq!(gone, Some(vec![]));
    drop(m);
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert!(m.list_segments().unwrap().is_empty());
}

/// More segments waiting than one pack carries: several PUTs, in append
/// order, and every byte reads back after a reopen.
#[test]
fn a_sync_of_many_segments_splits_into_packs_in_append_order() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("many", false, "");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    let (puts, _) = m.requests();
    for round in 0..3u64 {
        for id in 0..20u32 {
            m.append(id, round * 4, &[id as u8, round as u8, 0xaa, 0xbb])
                .unwrap();
        }
    }
    m.sync().unwrap();
    let sent = m.requests().0 - puts;
    assert!((3..=10).contains(&sent), "{sent} PUTs for 20 segments");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert_eq!(m.list_segments().unwrap(), (0..20).collect::<Vec<_>>());
    for id in 0..20u32 {
        let mut buf = [0u8; 12];
        m.read(id, 0, &mut buf).unwrap();
        for round in 0..3usize {
            assert_eq!(
                buf[round * 4..round * 4 + 4],
                [id as u8, round as u8, 0xaa, 0xbb]
            );
        }
    }
}

/// What a crash can leave: an upload whose answer was lost and that was
/// sent again with more bytes (two objects from the same offset: the
/// longer wins), and a deletion cut after the gone list named its segments
/// (the next writer deletes the dead pack, then shortens the list).
#[test]
fn overlapping_uploads_and_a_cut_deletion_are_resolved_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("cut", false, "");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    m.append(5, 0, b"0123456789").unwrap();
    m.append(6, 0, b"abc").unwrap();
    m.sync().unwrap();
    drop(m);
    // Segment 5 from 10: once alone (the lost answer), once longer in a pack.
    put_raw(&srv, &at, "seg/00000005/000000000000000a", b"ABCDE");
    put_raw(&srv, &at, "pack/00000005.a.8_00000007.0.2", b"ABCDEFGHxy");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert_eq!(m.segment_len(5).unwrap(), Some(18));
    let mut buf = [0u8; 18];
    m.read(5, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"0123456789ABCDEFGH");
    let mut buf = [0u8; 2];
    m.read(7, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"xy");
    m.append(5, 18, b"!").unwrap();
    m.sync().unwrap();
    m.append(8, 0, b"eight").unwrap();
    m.append(9, 0, b"nine").unwrap();
    m.sync().unwrap();
    drop(m);
    // A deletion of 8 and 9 (one pack) cut after the gone list named them:
    // gone at once, and the next writer deletes the pack, then shortens
    // the list.
    put_raw(&srv, &at, "gone", &oubli_s3::layout::encode_gone([8, 9]));
    let m = S3Medium::open_writer_with(&at, &srv.config(), oubli_s3::LEASE).unwrap();
    assert_eq!(m.list_segments().unwrap(), vec![5, 6, 7]);
    let names = list_raw(&srv, &at);
    assert!(!names.iter().any(|n| n.contains("00000008")), "{names:?}");
    let gone = oubli_s3::layout::decode_gone(&raw_get(&srv, &at, "gone"));
    assert_eq!(gone, Some(vec![]));
    let mut buf = [0u8; 19];
    m.read(5, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"0123456789ABCDEFGH!");
}

#[test]
fn sequential_reads_are_served_by_read_ahead_windows_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("readahead", false, "");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    // 12 MiB in three runs (three syncs), pseudo-random bytes.
    let mut x = 7u64;
    let data: Vec<u8> = (0..12 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for part in data.chunks(4 << 20) {
        let at = m.segment_len(1).unwrap().unwrap_or(0);
        m.append(1, at, part).unwrap();
        m.sync().unwrap();
    }
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    // A stream of 32 KiB + 16 reads (a cell and its tag), across run boundaries.
    let unit = 32768 + 16;
    // Two reads in a row make a stream: the windows ahead of it (the first
    // of the second and third runs) are fetched in the background.
    let mut buf = vec![0u8; 2 * unit];
    m.read(1, 0, &mut buf[..unit]).unwrap();
    m.read(1, unit as u64, &mut buf[unit..2 * unit]).unwrap();
    m.read(1, 2 * unit as u64, &mut buf[..unit]).unwrap();
    let waited = std::time::Instant::now();
    while m.gets() < 4 && waited.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(m.gets(), 4, "one exact read, the first window, two ahead");
    let mut off = 0usize;
    while off < data.len() {
        let n = unit.min(data.len() - off);
        let mut buf = vec![0u8; n];
        m.read(1, off as u64, &mut buf).unwrap();
        assert!(buf == data[off..off + n], "sequential read at {off}");
        off += n;
    }
    // The whole stream: one GET per 4 MiB window, no more.
    assert!(m.gets() <= 1 + 3 + 1, "{} GETs for 12 MiB", m.gets());
    // Random reads after it (some inside cached windows, some not).
    for i in 0..200u64 {
        let off = (i * 7_654_321) as usize % (data.len() - 5000);
        let mut buf = vec![0u8; 5000];
        m.read(1, off as u64, &mut buf).unwrap();
        assert!(buf == data[off..off + 5000], "random read at {off}");
    }
    m.delete_segment(1).unwrap();
    let mut buf = [0u8; 10];
    assert!(
        m.read(1, 0, &mut buf).is_err(),
        "a deleted segment must not read from cache"
    );
}

/// A store of layout 1 (runs only, written by earlier versions) opens and
/// reads; its superblocks announce layout 2 before the first pack is
/// written, so an older version refuses the store instead of missing the
/// packed bytes. A layout this version does not know is refused by name.
#[test]
fn a_layout_1_store_opens_and_is_announced_as_layout_2_before_its_first_pack() {
    let dir = tempfile::tempdir().unwrap();
    let Some(srv) = server(dir.path()) else {
        return;
    };
    let at = srv.bucket("layout", false, "");
    let head = |layout: u8| {
        let mut v = b"OUBLIS3".to_vec();
        v.push(layout);
        v.extend_from_slice(&3u32.to_le_bytes());
        v.extend_from_slice(b"old");
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        v
    };
    put_raw(&srv, &at, "superblocks", &head(0));
    put_raw(&srv, &at, "seg/00000001/0000000000000000", b"layout one");
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"old");
    let mut buf = [0u8; 10];
    m.read(1, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"layout one");
    m.append(1, 10, b"+").unwrap();
    m.sync().unwrap();
    assert!(
        raw_get(&srv, &at, "superblocks") == head(0),
        "a run needs no announcement"
    );
    m.append(1, 11, b"+").unwrap();
    m.append(2, 0, b"two").unwrap();
    m.sync().unwrap();
    assert_eq!(raw_get(&srv, &at, "superblocks"), head(2));
    drop(m);
    let m = S3Medium::open_with(&at, &srv.config()).unwrap();
    let mut buf = [0u8; 12];
    m.read(1, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"layout one++");
    put_raw(&srv, &at, "superblocks", &head(3));
    let e = S3Medium::open_with(&at, &srv.config())
        .unwrap()
        .read_superblock(Slot::A)
        .unwrap_err();
    assert!(e.to_string().contains("newer oubli"), "{e}");
}

fn raw_get(srv: &TestServer, at: &oubli_s3::S3Location, key: &str) -> Vec<u8> {
    use object_store::ObjectStore;
    let store = raw_store(srv, at);
    block_on(async { store.get(&key.into()).await.unwrap().bytes().await.unwrap() }).to_vec()
}
