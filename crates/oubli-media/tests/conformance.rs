//! The `Medium` conformance suite: the same properties, checked on every medium (memory, directory, file, S3 on a real server, simulated raw NAND, and the recording and fault-injecting wrappers); a new medium joins by adding one `Subject`.
//!
//! What the engine relies on (oubli-core `Medium`): append-only segments
//! read back byte for byte, errors of the documented kinds, two independent
//! superblock slots of up to `SUPERBLOCK_MAX` bytes, idempotent deletion,
//! and — for media that persist — everything synced present after a reopen.

use oubli_media::{
    DirMedium, FaultMedium, FileMedium, Medium, MemMedium, RecordingMedium, Slot, SUPERBLOCK_MAX,
};
use oubli_s3::test_server::TestServer;
use oubli_s3::S3Medium;
use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Makes or opens a medium in a scratch directory.
type Maker = fn(&std::path::Path) -> Box<dyn Medium>;

/// A medium under test: made fresh, and (for persistent ones) opened again.
struct Subject {
    name: &'static str,
    make: Maker,
    /// Opens what `make` created at the same place (after dropping it).
    reopen: Option<Maker>,
}

const SEGMENT: u64 = 1 << 20;

fn subjects() -> Vec<Subject> {
    vec![
        Subject {
            name: "memory",
            make: |_| Box::new(MemMedium::with_segment_capacity(SEGMENT)),
            reopen: None,
        },
        Subject {
            name: "directory",
            make: |p| Box::new(DirMedium::create(p.join("store")).unwrap()),
            reopen: Some(|p| Box::new(unlocked(|| DirMedium::open(p.join("store"))))),
        },
        Subject {
            name: "file",
            make: |p| Box::new(FileMedium::create(p.join("store.img"), None, SEGMENT).unwrap()),
            reopen: Some(|p| Box::new(unlocked(|| FileMedium::open(p.join("store.img"))))),
        },
        Subject {
            name: "s3 (versitygw, versioned bucket)",
            make: s3_medium,
            reopen: Some(s3_medium),
        },
        Subject {
            name: "recording(memory)",
            make: |_| {
                Box::new(RecordingMedium::new(MemMedium::with_segment_capacity(
                    SEGMENT,
                )))
            },
            reopen: None,
        },
        Subject {
            name: "nand (image file)",
            make: |p| Box::new(nand_medium(p, true)),
            reopen: Some(|p| Box::new(nand_medium(p, false))),
        },
        Subject {
            name: "fault(memory), nothing armed",
            make: |_| Box::new(FaultMedium::new(MemMedium::with_segment_capacity(SEGMENT))),
            reopen: None,
        },
    ]
}

/// A NAND medium on a small chip image in `p` (32 KiB erase blocks, so
/// 256 KiB segments), made or attached again.
fn nand_medium(p: &Path, create: bool) -> oubli_nand::NandMedium {
    let image = p.join("chip.img");
    let ubi = if create {
        let geometry = oubli_nand::parse_geometry("2048x16x128").unwrap();
        oubli_nand::format(&image, geometry).unwrap()
    } else {
        oubli_nand::attach(&image).unwrap()
    };
    oubli_nand::NandMedium::new(ubi).unwrap()
}

/// Opens a medium whose previous handle was just dropped. Its lock (an
/// `flock`) can outlive the drop by a moment: a test running in parallel
/// that forks a child (an S3 server) lends the child every descriptor until
/// its `exec` closes them, the lock's among them.
fn unlocked<M>(open: impl Fn() -> std::io::Result<M>) -> M {
    for _ in 0..100 {
        match open() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
    open().unwrap()
}

/// The S3 servers of the running tests, one per scratch directory: a
/// medium and its reopening share one; [`each`] stops it afterwards.
static SERVERS: Mutex<Option<HashMap<PathBuf, TestServer>>> = Mutex::new(None);

/// An S3 medium on a versitygw server of its own in `p`. Without versitygw
/// (scripts/test installs it), a directory medium stands in, said loudly.
fn s3_medium(p: &Path) -> Box<dyn Medium> {
    let mut servers = SERVERS.lock().unwrap_or_else(|e| e.into_inner());
    let servers = servers.get_or_insert_with(HashMap::new);
    if !servers.contains_key(p) {
        match TestServer::start(p) {
            Some(s) => {
                servers.insert(p.to_path_buf(), s);
            }
            None => {
                // A directory, so that the reopening tests find what was
                // synced (a fresh memory medium would be empty).
                eprintln!("S3 subject skipped: versitygw is not installed (a directory stands in)");
                let dir = p.join("s3-stand-in");
                if dir.exists() {
                    return Box::new(unlocked(|| DirMedium::open(&dir)));
                }
                return Box::new(DirMedium::create(&dir).unwrap());
            }
        }
    }
    let server = &servers[p];
    let at = server.bucket("conformance", true, "store");
    Box::new(
        S3Medium::open_with(&at, &server.config())
            .unwrap()
            .with_segment_capacity(SEGMENT),
    )
}

fn stop_s3_server(p: &Path) {
    if let Some(servers) = SERVERS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        servers.remove(p);
    }
}

/// Runs `check` on every subject, naming the medium in a failure.
fn each(check: impl Fn(&Subject, &dyn Medium, &std::path::Path)) {
    for s in subjects() {
        let dir = tempfile::tempdir().unwrap();
        let m = (s.make)(dir.path());
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&s, &*m, dir.path())));
        drop(m);
        stop_s3_server(dir.path());
        if let Err(panic) = outcome {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("medium {}: {why}", s.name);
        }
    }
}

fn read(m: &dyn Medium, id: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    m.read(id, offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_new_medium_is_empty() {
    each(|_, m, _| {
        assert!(m.list_segments().unwrap().is_empty());
        assert_eq!(m.segment_len(1).unwrap(), None);
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None);
        assert_eq!(m.read_superblock(Slot::B).unwrap(), None);
        assert!(m.segment_capacity() >= 64 * 1024);
        assert!(!m.describe().is_empty());
    });
}

#[test]
fn segments_are_append_only_and_read_back() {
    each(|_, m, _| {
        m.append(5, 0, b"hello").unwrap();
        m.append(5, 5, b", world").unwrap();
        m.append(2, 0, b"two").unwrap();
        assert_eq!(read(m, 5, 0, 12), b"hello, world");
        assert_eq!(read(m, 5, 7, 5), b"world");
        assert_eq!(m.segment_len(5).unwrap(), Some(12));
        assert_eq!(m.list_segments().unwrap(), vec![2, 5]);
        // Appending anywhere but the end is refused and changes nothing.
        assert_eq!(
            m.append(5, 3, b"x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(read(m, 5, 0, 12), b"hello, world");
        // A segment starts at offset 0.
        assert_eq!(
            m.append(9, 4, b"x").unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(m.segment_len(9).unwrap(), None);
    });
}

#[test]
fn reads_past_the_end_or_of_missing_segments_fail() {
    each(|_, m, _| {
        m.append(1, 0, b"abc").unwrap();
        let mut buf = [0u8; 4];
        assert_eq!(
            m.read(1, 0, &mut buf).unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        assert_eq!(
            m.read(1, 3, &mut buf[..1]).unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        assert_eq!(
            m.read(7, 0, &mut buf).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        // An empty read at the end is fine.
        m.read(1, 3, &mut []).unwrap();
    });
}

#[test]
fn a_segment_holds_exactly_its_capacity() {
    each(|_, m, _| {
        let cap = m.segment_capacity();
        if cap > 64 << 20 {
            // A directory's segments are files of up to 4 GiB: not filled here.
            return;
        }
        let big = vec![0xa5u8; cap as usize];
        m.append(3, 0, &big).unwrap();
        assert_eq!(m.segment_len(3).unwrap(), Some(cap));
        assert_eq!(read(m, 3, cap - 4, 4), [0xa5; 4]);
        let over = m.append(3, cap, b"x").unwrap_err().kind();
        assert!(
            matches!(over, ErrorKind::InvalidInput | ErrorKind::StorageFull),
            "appending past the capacity: {over:?}"
        );
        assert_eq!(m.segment_len(3).unwrap(), Some(cap));
    });
}

#[test]
fn deletion_is_idempotent() {
    each(|_, m, _| {
        m.append(4, 0, b"doomed").unwrap();
        m.append(6, 0, b"kept").unwrap();
        m.delete_segment(4).unwrap();
        m.delete_segment(4).unwrap();
        m.delete_segment(40).unwrap();
        assert_eq!(m.segment_len(4).unwrap(), None);
        assert_eq!(m.list_segments().unwrap(), vec![6]);
        let mut buf = [0u8; 1];
        assert_eq!(
            m.read(4, 0, &mut buf).unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(read(m, 6, 0, 4), b"kept");
        // The id may not be reused by the engine, but a medium accepts it.
        m.append(4, 0, b"again").unwrap();
        assert_eq!(read(m, 4, 0, 5), b"again");
    });
}

#[test]
fn superblock_slots_are_independent() {
    each(|_, m, _| {
        m.write_superblock(Slot::A, b"first a").unwrap();
        m.write_superblock(Slot::B, b"b").unwrap();
        m.write_superblock(Slot::A, b"second").unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"second");
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), b"b");
        let max = vec![7u8; SUPERBLOCK_MAX];
        m.write_superblock(Slot::B, &max).unwrap();
        assert_eq!(m.read_superblock(Slot::B).unwrap().unwrap(), max);
        assert!(m
            .write_superblock(Slot::A, &vec![0u8; SUPERBLOCK_MAX + 1])
            .is_err());
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"second");
    });
}

#[test]
fn what_was_synced_is_there_after_reopening() {
    for s in subjects() {
        let Some(reopen) = s.reopen else { continue };
        let dir = tempfile::tempdir().unwrap();
        {
            let m = (s.make)(dir.path());
            m.append(1, 0, b"durable").unwrap();
            m.append(2, 0, b"gone").unwrap();
            m.delete_segment(2).unwrap();
            m.write_superblock(Slot::B, b"sb").unwrap();
            m.sync().unwrap();
        }
        let m = reopen(dir.path());
        assert_eq!(m.list_segments().unwrap(), vec![1], "{}", s.name);
        assert_eq!(read(&*m, 1, 0, 7), b"durable", "{}", s.name);
        assert_eq!(
            m.read_superblock(Slot::B).unwrap().unwrap(),
            b"sb",
            "{}",
            s.name
        );
        assert_eq!(m.read_superblock(Slot::A).unwrap(), None, "{}", s.name);
        // And appends go on where they stopped.
        m.append(1, 7, b"+").unwrap();
        assert_eq!(read(&*m, 1, 0, 8), b"durable+", "{}", s.name);
        drop(m);
        stop_s3_server(dir.path());
    }
}

/// A medium that rewrites ([`Medium::can_rewrite`]: the engine's
/// overwrites in place) does so only inside what it appended, without
/// changing the length, and a sync makes the new bytes durable; one that
/// does not refuses and changes nothing.
#[test]
fn rewrites_stay_inside_what_was_appended_and_sync_like_appends() {
    for s in subjects() {
        let dir = tempfile::tempdir().unwrap();
        let rewrites;
        {
            let m = (s.make)(dir.path());
            m.append(1, 0, b"hello, world").unwrap();
            rewrites = m.can_rewrite();
            if rewrites {
                m.rewrite(1, 7, b"WORLD").unwrap();
                assert_eq!(
                    m.rewrite(1, 10, b"xyz").unwrap_err().kind(),
                    ErrorKind::InvalidInput,
                    "{}",
                    s.name
                );
            } else {
                assert!(m.rewrite(1, 7, b"WORLD").is_err(), "{}", s.name);
            }
            let want: &[u8] = if rewrites {
                b"hello, WORLD"
            } else {
                b"hello, world"
            };
            assert_eq!(read(&*m, 1, 0, 12), want, "{}", s.name);
            assert_eq!(m.segment_len(1).unwrap(), Some(12), "{}", s.name);
            m.sync().unwrap();
        }
        if let Some(reopen) = s.reopen {
            let m = reopen(dir.path());
            let want: &[u8] = if rewrites {
                b"hello, WORLD"
            } else {
                b"hello, world"
            };
            assert_eq!(read(&*m, 1, 0, 12), want, "{} after reopening", s.name);
        }
        stop_s3_server(dir.path());
    }
}

/// Segments made durable by the same sync (on S3: one object) stay
/// independent: one deleted after it is gone after a reopen, the other
/// intact; the deleted one's bytes never come back.
#[test]
fn a_segment_deleted_after_a_shared_sync_stays_deleted_after_reopening() {
    for s in subjects() {
        let Some(reopen) = s.reopen else { continue };
        let dir = tempfile::tempdir().unwrap();
        {
            let m = (s.make)(dir.path());
            m.append(3, 0, b"three").unwrap();
            m.append(5, 0, b"five").unwrap();
            m.append(3, 5, b"+3").unwrap();
            m.sync().unwrap();
            m.append(5, 4, b"+5").unwrap();
            m.append(7, 0, b"seven").unwrap();
            m.sync().unwrap();
            m.delete_segment(3).unwrap();
            m.sync().unwrap();
        }
        let m = reopen(dir.path());
        assert_eq!(m.list_segments().unwrap(), vec![5, 7], "{}", s.name);
        assert_eq!(read(&*m, 5, 0, 6), b"five+5", "{}", s.name);
        assert_eq!(read(&*m, 7, 0, 5), b"seven", "{}", s.name);
        m.delete_segment(5).unwrap();
        m.delete_segment(7).unwrap();
        m.sync().unwrap();
        drop(m);
        let m = reopen(dir.path());
        assert!(m.list_segments().unwrap().is_empty(), "{}", s.name);
        drop(m);
        stop_s3_server(dir.path());
    }
}

#[test]
fn concurrent_appends_to_different_segments_and_reads() {
    each(|_, m, _| {
        let m: Arc<&dyn Medium> = Arc::new(m);
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let m = m.clone();
                scope.spawn(move || {
                    let mut at = 0u64;
                    for i in 0..50u32 {
                        let chunk = [(t * 50 + i) as u8; 100];
                        m.append(10 + t, at, &chunk).unwrap();
                        at += 100;
                        let mut back = [0u8; 100];
                        m.read(10 + t, at - 100, &mut back).unwrap();
                        assert_eq!(back, chunk);
                    }
                });
            }
        });
        for t in 0..4u32 {
            assert_eq!(m.segment_len(10 + t).unwrap(), Some(5000));
        }
    });
}
