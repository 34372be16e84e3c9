//! The server's own promises: concurrent connections, a flush that covers every connection (multi-conn), clean shutdown that commits, export management.

mod common;

use common::*;
use oubli_core::{Error, Store};
use oubli_nbd::exports::*;
use oubli_nbd::proto::*;
use oubli_nbd::{serve, Endpoint, ServerConfig};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// Eight clients write their own regions at once; every write is visible
/// to every connection, and to the store after shutdown.
#[test]
fn concurrent_connections_share_the_export() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 8 * MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let socket = served.socket.clone();
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = RawClient::connect(&socket, "disk", i % 2 == 0);
                let mut data = vec![0u8; 64 * 1024];
                for round in 0..16u64 {
                    fill_random(i * 1000 + round, &mut data);
                    let off = i * MIB + round * 64 * 1024;
                    assert_eq!(c.write(off, &data), 0);
                    assert!(c.read(off, data.len() as u32).unwrap() == data);
                }
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = RawClient::connect(&socket, "disk", false);
    let mut data = vec![0u8; 64 * 1024];
    for i in 0..8u64 {
        for round in 0..16u64 {
            fill_random(i * 1000 + round, &mut data);
            let off = i * MIB + round * 64 * 1024;
            assert!(c.read(off, data.len() as u32).unwrap() == data);
        }
    }
    c.disconnect();
    served.shutdown();
}

/// CAN_MULTI_CONN is honest: writes acknowledged on one connection are made
/// durable by a FLUSH sent on another. The server is then stopped without
/// committing and the store reopened from the medium (the intent log).
#[test]
fn flush_on_one_connection_covers_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (store, served, mut a, mut b) = served_without_commit(dir.path(), 4 * MIB);
    assert!(a.flags & FLAG_CAN_MULTI_CONN != 0);
    let data = vec![0x3cu8; 3 * 32 * 1024 + 100]; // whole and partial cells
    assert_eq!(a.write(12345, &data), 0);
    assert_eq!(b.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    // FUA on a write covers that write.
    assert_eq!(b.cmd(CMD_WRITE, CMD_FLAG_FUA, 2 * MIB, 5, b"fua!!"), 0);
    let (store, e) = power_cut(dir.path(), store, served, a, b);
    assert!(store.read(e.oid, 12345, data.len()).unwrap() == data);
    assert_eq!(store.read(e.oid, 2 * MIB, 5).unwrap(), b"fua!!");
}

/// Shutdown with clients in every state (idle in transmission, mid
/// handshake, never spoke): it returns, the clients see the connection
/// close, the epoch is committed, and the socket file is removed.
#[test]
fn shutdown_closes_connections_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", MIB).unwrap();
    let served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut idle = RawClient::connect(&served.socket, "disk", false);
    assert_eq!(idle.write(0, b"last words"), 0);
    let mut greeted = RawClient::greet(&served.socket);
    let mut silent = std::os::unix::net::UnixStream::connect(&served.socket).unwrap();
    while served.handle().active_connections() < 3 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let epoch = store.epoch();
    let socket = served.socket.clone();
    let mut served = served;
    served.shutdown();
    assert!(store.epoch() > epoch, "shutdown commits");
    assert!(!socket.exists());
    let mut b = [0u8; 64];
    assert_eq!(idle.s.read(&mut b).unwrap_or(0), 0);
    assert_eq!(greeted.read(&mut b).unwrap_or(0), 0);
    let mut total = 0;
    while let Ok(n) = silent.read(&mut b) {
        if n == 0 {
            break;
        }
        total += n; // the greeting, then the close
    }
    assert!(total <= 18);
    let e = lookup_export(&store, "disk").unwrap().unwrap();
    assert_eq!(store.read(e.oid, 0, 10).unwrap(), b"last words");
}

/// A client that never reads its replies cannot hold shutdown forever.
#[test]
fn shutdown_cuts_off_a_client_that_does_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 64 * MIB).unwrap();
    let served = Served::start(
        store,
        dir.path(),
        ServerConfig {
            shutdown_grace: std::time::Duration::from_millis(200),
            ..ServerConfig::default()
        },
    );
    let mut c = RawClient::connect(&served.socket, "disk", false);
    // Ask for far more reply data than socket buffers hold, and never read it.
    for _ in 0..8 {
        c.send(CMD_READ, 0, 0, 32 << 20, &[]);
    }
    let mut served = served;
    served.shutdown();
    drop(c);
}

#[test]
fn a_second_server_on_a_live_socket_is_refused_and_a_stale_one_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let err = serve(
        store.clone(),
        &[Endpoint::Unix(served.socket.clone())],
        ServerConfig::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    // A stale socket file (no listener) is replaced.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let second = serve(
        store.clone(),
        &[Endpoint::Unix(stale.clone())],
        ServerConfig {
            log: Captured::default().log(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    second.shutdown().unwrap();
    // Something that is not a socket is never removed.
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(serve(
        store,
        &[Endpoint::Unix(file.clone())],
        ServerConfig::default()
    )
    .is_err());
    assert!(file.exists());
}

#[test]
fn export_management() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    assert!(list_exports(&store).unwrap().is_empty());
    let a = create_export(&store, "alpha", 10 * MIB).unwrap();
    create_export(&store, "beta", 0).unwrap();
    assert!(matches!(
        create_export(&store, "alpha", 1),
        Err(Error::Exists(_))
    ));
    assert!(matches!(
        create_export(&store, "", 1),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        create_export(&store, "x", u64::MAX),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        create_export(&store, &"n".repeat(4097), 1),
        Err(Error::Invalid(_))
    ));
    let names: Vec<_> = list_exports(&store)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.size))
        .collect();
    assert_eq!(names, [("alpha".into(), 10 * MIB), ("beta".into(), 0)]);
    assert_eq!(lookup_export(&store, "alpha").unwrap(), Some(a.clone()));
    assert_eq!(resize_export(&store, "beta", 4096).unwrap().size, 4096);
    assert!(matches!(
        resize_export(&store, "gamma", 1),
        Err(Error::NoName(_))
    ));
    delete_export(&store, "alpha").unwrap();
    assert!(!store.exists(a.oid).unwrap());
    assert_eq!(lookup_export(&store, "alpha").unwrap(), None);
    assert!(matches!(
        delete_export(&store, "alpha"),
        Err(Error::NoName(_))
    ));
    // The exports survive a reopen.
    store.commit().unwrap();
    drop(store);
    let store = reopen_dir_store(dir.path());
    assert_eq!(list_exports(&store).unwrap().len(), 1);
}

/// A `.nbd-exports` name in the root that is not an exports directory (say,
/// a file stored under that name) is never taken for one.
#[test]
fn a_foreign_object_is_not_an_exports_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let file = store.create_object(b"{}").unwrap();
    store.link(oubli_core::ROOT_DIR, EXPORTS_DIR, file).unwrap();
    assert!(matches!(
        create_export(&store, "a", 1),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(list_exports(&store), Err(Error::Invalid(_))));
    let served = Served::start(store, dir.path(), ServerConfig::default());
    let mut s = RawClient::greet(&served.socket);
    std::io::Write::write_all(&mut s, &3u32.to_be_bytes()).unwrap();
    RawClient::send_option(&mut s, OPT_GO, &RawClient::go_data("a"));
    assert_eq!(RawClient::option_reply(&mut s).1, REP_ERR_UNKNOWN);
    assert!(served.log.contains("not an NBD exports directory"));
}

/// An export resized while a client is connected: the client keeps the size
/// it was told, and requests past the new end are refused, never extend it.
#[test]
fn shrinking_under_a_connected_client() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 2 * MIB).unwrap();
    let served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    // A request first, so that the server knows the size before the shrink.
    assert_eq!(c.write(MIB + 10, b"x"), 0);
    resize_export(&store, "disk", MIB).unwrap();
    assert_eq!(c.write(MIB + 10, b"x"), Errno::NoSpc.code());
    assert_eq!(c.read(MIB, 1), Err(Errno::Inval.code()));
    assert_eq!(c.write(MIB - 1, b"y"), 0);
    c.disconnect();
    assert_eq!(lookup_export(&store, "disk").unwrap().unwrap().size, MIB);
    // Deleted under the client: EIO, not a crash.
    let mut c = RawClient::connect(&served.socket, "disk", false);
    delete_export(&store, "disk").unwrap();
    assert!(c.read(0, 1).is_err());
    c.disconnect();
}

/// An export shrunk while writes past its new end wait in the write-behind
/// queue (acknowledged, checked against the old size): they are not
/// written, the export is not extended again, and the next FLUSH says so
/// (`ENOSPC`). 40 MiB are queued faster than they are sealed, and the
/// export is shrunk the moment the last reply is in.
#[test]
fn writes_queued_past_a_shrunk_end_do_not_extend_the_export() {
    const W: u64 = 4 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 64 * MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let mut data = vec![0u8; W as usize];
    fill_random(77, &mut data);
    for i in 0..10 {
        assert_eq!(c.write(24 * MIB + i * W, &data), 0);
    }
    resize_export(&store, "disk", 32 * MIB).unwrap();
    let flush = c.cmd(CMD_FLUSH, 0, 0, 0, &[]);
    assert_eq!(
        lookup_export(&store, "disk").unwrap().unwrap().size,
        32 * MIB,
        "a queued write extended the shrunk export again"
    );
    let refused = served.log.contains("past the object's end");
    assert!(refused, "nothing was still queued: the test proved nothing");
    assert_eq!(flush, Errno::NoSpc.code());
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0, "reported once");
    c.disconnect();
    served.shutdown();
}

/// A client with many requests in flight (queue depth 32, as fio and qemu
/// use): every request gets exactly one reply, matched by cookie, reads see
/// the writes acknowledged before them, and a DISC sent right behind a burst
/// of writes still lets every one of them finish.
#[test]
fn pipelined_requests_each_get_their_reply_and_disc_waits_for_them() {
    const DEPTH: u64 = 32;
    const LEN: u32 = 12 * 1024; // not a multiple of the cell: exercises merges
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 8 * MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let data = |i: u64| {
        let mut d = vec![0u8; LEN as usize];
        fill_random(7000 + i, &mut d);
        d
    };
    // Disjoint regions at odd offsets, most of them straddling two cells.
    let at = |i: u64| i * 100_003;
    let mut c = RawClient::connect(&served.socket, "disk", true);
    let writes: Vec<u64> = (0..DEPTH)
        .map(|i| c.send(CMD_WRITE, 0, at(i), LEN, &data(i)))
        .collect();
    let mut replied = std::collections::HashSet::new();
    for _ in 0..DEPTH {
        let r = c.reply(None);
        assert_eq!(r.error, 0);
        assert!(writes.contains(&r.cookie) && replied.insert(r.cookie));
    }
    // Reads of regions whose writes were all acknowledged, all in flight at once.
    let reads: std::collections::HashMap<u64, u64> = (0..DEPTH)
        .map(|i| (c.send(CMD_READ, 0, at(i), LEN, &[]), i))
        .collect();
    for _ in 0..DEPTH {
        let r = c.reply(None);
        assert_eq!(r.error, 0);
        let i = reads[&r.cookie];
        assert!(r.data == data(i), "read {i} does not show its write");
    }
    c.disconnect();
    // A burst of writes, then DISC at once: the server finishes them before it closes.
    let mut c2 = RawClient::connect(&served.socket, "disk", false);
    for i in 0..DEPTH {
        c2.send(CMD_WRITE, 0, i * u64::from(LEN), LEN, &data(100 + i));
    }
    c2.send(CMD_DISC, 0, 0, 0, &[]);
    let mut rest = Vec::new();
    c2.s.read_to_end(&mut rest).unwrap();
    assert_eq!(
        rest.len(),
        DEPTH as usize * 16,
        "one simple reply per write"
    );
    let mut c3 = RawClient::connect(&served.socket, "disk", false);
    for i in 0..DEPTH {
        assert!(c3.read(i * u64::from(LEN), LEN).unwrap() == data(100 + i));
    }
    c3.disconnect();
    served.shutdown();
}

/// A client with 16 reads in flight has 16 reads in the medium's queue at
/// once (the default `workers_per_connection`): a read that waits for the
/// disk holds up none of the others. With 4 workers, random 4 KiB reads at
/// queue depth 16 ran at 45,000-52,000 IOPS by hand where 16 workers ran
/// at 59,000-75,000 (docs/NBD.md, "Server").
#[test]
fn a_connection_puts_as_many_reads_in_the_medium_queue_as_the_client_has_in_flight() {
    const DEPTH: usize = 16;
    const BLOCK: u32 = 4096;
    use oubli_media::{GateMedium, Gated, MemMedium};
    let medium = Arc::new(GateMedium::new(MemMedium::new(), Gated::Reads));
    let (store, _vault) = store_on(medium.clone(), &manual());
    create_export(&store, "disk", 8 * MIB).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", true);
    let block = |i: usize| {
        let mut d = vec![0u8; BLOCK as usize];
        fill_random(9100 + i as u64, &mut d);
        d
    };
    // Blocks 64 KiB apart, sealed and on the medium: each read is a medium read of its own.
    let at = |i: usize| i as u64 * 65536;
    for i in 0..DEPTH {
        assert_eq!(c.write(at(i), &block(i)), 0);
    }
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    store.commit().unwrap();
    // Reads wait at the gate until all DEPTH are there (or 3 s pass).
    medium.hold();
    let reqs: Vec<(u16, u16, u64, u32, &[u8])> = (0..DEPTH)
        .map(|i| (CMD_READ, 0, at(i), BLOCK, &[][..]))
        .collect();
    let cookies = c.send_burst(&reqs);
    let together = medium.wait_for_waiting(DEPTH, std::time::Duration::from_secs(3));
    medium.release();
    for _ in 0..DEPTH {
        let r = c.reply(Some(BLOCK));
        assert_eq!(r.error, 0);
        let i = cookies
            .iter()
            .position(|&k| k == r.cookie)
            .expect("a cookie sent");
        assert!(r.data == block(i), "read {i} does not show its write");
    }
    assert_eq!(
        together, DEPTH,
        "reads in the medium's queue at once, with {DEPTH} in flight on the connection"
    );
    c.disconnect();
    served.shutdown();
}

/// Small writes in a burst are carried out by the reader, which sends their
/// replies in one batch before it waits for input again. Every reply must
/// still arrive while the client sends nothing more, whatever the burst
/// mixes in: refusals, a large write and a FLUSH (both go to workers), a
/// payload split across two sends, and an inline write last of all.
#[test]
fn a_burst_of_small_writes_gets_every_reply_while_the_client_waits() {
    const SMALL: u32 = 4096;
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 8 * MIB).unwrap();
    let data = |i: u64, len: u32| {
        let mut d = vec![0u8; len as usize];
        fill_random(9000 + i, &mut d);
        d
    };
    let small: Vec<Vec<u8>> = (0..48).map(|i| data(i, SMALL)).collect();
    let large = data(99, 256 * 1024);
    let at = |i: u64| i * 37 * 4096; // scattered, inside the first 8 MiB
                                     // With the write-behind queue (the default) the reader replies to the
                                     // writes it queues; without it, it carries the small ones out itself.
    for (structured, write_behind) in [(false, true), (true, true), (false, false)] {
        let mut served = Served::start(
            store.clone(),
            dir.path(),
            ServerConfig {
                write_behind: write_behind.then(Default::default),
                ..ServerConfig::default()
            },
        );
        let mut c = RawClient::connect(&served.socket, "disk", structured);
        // A server that keeps a reply back makes the client wait here, not hang.
        c.s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut burst: Vec<(u16, u16, u64, u32, &[u8])> = Vec::new();
        for i in 0..24 {
            burst.push((CMD_WRITE, 0, at(i), SMALL, &small[i as usize]));
        }
        burst.push((CMD_WRITE, 0, 8 * MIB, SMALL, &small[0])); // past the end: refused
        burst.push((CMD_WRITE, 0, 7 * MIB, large.len() as u32, &large));
        burst.push((CMD_FLUSH, 0, 0, 0, &[]));
        for i in 24..48 {
            burst.push((CMD_WRITE, 0, at(i), SMALL, &small[i as usize]));
        }
        let mut cookies = c.send_burst(&burst);
        let refused = cookies[24];
        // Then one more small write whose payload comes in two sends: the
        // reader waits for the second half with replies in its buffer.
        let last = data(100, SMALL);
        let split = c.send_burst(&[(CMD_WRITE, 0, at(48), SMALL, &last[..1000])])[0];
        // Every reply sent so far but the split write's arrives before its rest is sent.
        let mut replied = std::collections::HashSet::new();
        for _ in 0..cookies.len() {
            let r = c.reply(None);
            assert_eq!(r.error != 0, r.cookie == refused, "reply {r:?}");
            assert!(cookies.contains(&r.cookie) && replied.insert(r.cookie));
        }
        c.s.write_all(&last[1000..]).unwrap();
        let r = c.reply(None);
        assert_eq!((r.cookie, r.error), (split, 0));
        cookies.push(split);
        for i in 0..48 {
            assert!(
                c.read(at(i), SMALL).unwrap() == small[i as usize],
                "write {i}"
            );
        }
        assert!(c.read(at(48), SMALL).unwrap() == last);
        assert!(c.read(7 * MIB, large.len() as u32).unwrap() == large);
        c.disconnect();
        served.shutdown();
    }
}

/// Writes are acknowledged once queued (`oubli_nbd::WriteBehind`). A read
/// sent after a write's reply sees that write, on the writer's connection
/// and on any other, and a FLUSH on any connection makes it durable. Each
/// round queues 40 MiB of writes faster than they are sealed, so the queue
/// is still being carried out when the read arrives: without the read's wait
/// for the queue it returns the old bytes.
#[test]
fn reads_and_flushes_see_every_write_acknowledged_before_them() {
    const W: u64 = 4 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let (store, served, mut a, mut b) = served_without_commit(dir.path(), 40 * MIB);
    let block = |seed: u64| {
        let mut d = vec![0u8; W as usize];
        fill_random(seed, &mut d);
        d
    };
    for round in 0..4u64 {
        for i in 0..10 {
            assert_eq!(a.write(i * W, &block(round * 100 + i)), 0);
        }
        // The newest write, read on the other connection in even rounds and
        // on the writer's own in odd ones.
        let reader = if round % 2 == 0 { &mut b } else { &mut a };
        let got = reader.read(9 * W, W as u32).unwrap();
        assert!(
            got == block(round * 100 + 9),
            "round {round}: a read after the write's reply returned other bytes"
        );
    }
    // Queued writes, then a FLUSH on the other connection, then a power cut
    // (no commit, the store dropped): the intent log holds all of them.
    for i in 0..10 {
        assert_eq!(a.write(i * W, &block(1000 + i)), 0);
    }
    assert_eq!(b.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    let (store, e) = power_cut(dir.path(), store, served, a, b);
    for i in 0..10 {
        assert!(
            store.read(e.oid, i * W, W as usize).unwrap() == block(1000 + i),
            "write {i} acknowledged before the FLUSH was lost"
        );
    }
}

/// A queued write that fails when carried out (here the medium refuses its
/// append) was acknowledged already: the next FLUSH or FUA request of every
/// connection open at the time says so, and it is logged. (The failed
/// append also poisons the store, so later requests fail too; that each
/// connection is told once is `behind`'s unit test.)
#[test]
fn a_queued_write_that_fails_is_reported_by_the_next_flush_of_each_connection() {
    use oubli_media::{Fault, FaultMedium, MemMedium};
    let medium = Arc::new(FaultMedium::new(MemMedium::new()));
    let (store, _vault) = store_on(medium.clone(), &manual());
    create_export(&store, "disk", 8 * MIB).unwrap();
    store.commit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut a = RawClient::connect(&served.socket, "disk", true);
    let mut b = RawClient::connect(&served.socket, "disk", true);
    assert_eq!(a.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    // The next mutating call on the medium fails once: the write's append.
    medium.arm(medium.points(), Fault::FailOnce);
    assert_eq!(
        a.write(0, &vec![7u8; MIB as usize]),
        0,
        "acknowledged once queued"
    );
    let told = |c: &mut RawClient, flags: u16, len: u32, payload: &[u8]| {
        let kind = if len > 0 { CMD_WRITE } else { CMD_FLUSH };
        let cookie = c.send(kind, flags, MIB, len, payload);
        let r = c.reply(None);
        assert_eq!((r.cookie, r.error), (cookie, Errno::Io.code()));
        let msg = String::from_utf8_lossy(&r.data).into_owned();
        assert!(
            msg.contains("acknowledged before this request failed"),
            "{msg}"
        );
    };
    told(&mut b, 0, 0, &[]); // the other connection's FLUSH
    told(&mut a, CMD_FLAG_FUA, 4, b"fua!"); // the writer's FUA write
    assert!(
        served
            .log
            .contains("acknowledged before it was carried out"),
        "{:?}",
        served.log.lines()
    );
    let c = RawClient::connect(&served.socket, "disk", false);
    for client in [a, b, c] {
        client.disconnect();
    }
    // The store is poisoned: the shutdown commit fails, and says so.
    assert!(served.handle.take().unwrap().shutdown().is_err());
}

/// Issue 9 item 8: a client that connects and says nothing is cut off
/// after the handshake timeout, and does not keep others out meanwhile.
#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", MIB).unwrap();
    let served = Served::start(
        store,
        dir.path(),
        ServerConfig {
            handshake_timeout: std::time::Duration::from_millis(300),
            ..ServerConfig::default()
        },
    );
    let mut silent = RawClient::greet(&served.socket);
    // Another client gets through while the silent one waits.
    let mut other = RawClient::connect(&served.socket, "disk", false);
    assert_eq!(other.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    other.disconnect();
    // The server closes the silent one (our own limit is far longer).
    silent
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = silent.read_to_end(&mut rest);
    assert!(
        closed.is_ok(),
        "the server did not close the silent client: {closed:?}"
    );
    assert!(
        served.log.contains("handshake ended"),
        "{:?}",
        served.log.lines()
    );
}

/// Issue 9 item 8: write payloads held for requests in flight stay under
/// the server's cap whatever many clients pipeline at once.
#[test]
fn payload_memory_in_flight_is_capped_per_server() {
    const CAP: u64 = 2 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let served = served_capped(dir.path(), CAP, (0, 0), ServerConfig::default());
    let socket = served.socket.clone();
    let writers: Vec<_> = (0..4u64)
        .map(|c| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut client = RawClient::connect(&socket, "disk", false);
                let chunk = vec![c as u8 + 1; 512 * 1024];
                // Pipelined: 24 writes sent before any reply is read.
                for i in 0..24u64 {
                    client.send(
                        CMD_WRITE,
                        0,
                        (c * 16 + (i % 16)) * MIB / 2,
                        chunk.len() as u32,
                        &chunk,
                    );
                }
                for _ in 0..24 {
                    assert_eq!(client.reply(None).error, 0);
                }
                client.disconnect();
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let stats = served.handle().stats();
    assert!(stats.requests.load(std::sync::atomic::Ordering::Relaxed) >= 4 * 24);
    let peak = stats
        .peak_inflight_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(peak > 0 && peak <= CAP, "peak {peak} over the cap {CAP}");
}

/// A 64 MiB export whose first `filled.0` bytes are `filled.1`, served
/// with `max_inflight_bytes: cap` and four workers per connection.
fn served_capped(dir: &Path, cap: u64, filled: (u64, u8), config: ServerConfig) -> Served {
    let store = dir_store(dir);
    let e = create_export(&store, "disk", 64 * MIB).unwrap();
    store
        .write(e.oid, 0, &vec![filled.1; filled.0 as usize])
        .unwrap();
    Served::start(
        store,
        dir,
        ServerConfig {
            max_inflight_bytes: cap,
            workers_per_connection: 4,
            ..config
        },
    )
}

/// The replies of reads are request data in memory like write payloads:
/// four clients pipelining large reads (each connection's four workers
/// could hold a reply each) stay under the server's cap.
#[test]
fn read_replies_in_flight_are_capped_per_server() {
    const CAP: u64 = 2 * MIB;
    const LEN: u32 = 512 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let served = served_capped(dir.path(), CAP, (64 * MIB, 7), ServerConfig::default());
    let readers: Vec<_> = (0..4u64)
        .map(|c| {
            let socket = served.socket.clone();
            std::thread::spawn(move || {
                let mut client = RawClient::connect(&socket, "disk", c % 2 == 1);
                // Pipelined: every read sent before any reply is read, so
                // replies pile up in the server while the client sends.
                for i in 0..24u64 {
                    client.send(CMD_READ, 0, (c * 16 + i % 16) * MIB / 2, LEN, &[]);
                }
                for _ in 0..24 {
                    let r = client.reply(Some(LEN));
                    assert_eq!(r.error, 0);
                    assert!(r.data.len() == LEN as usize && r.data.iter().all(|&b| b == 7));
                }
                client.disconnect();
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let stats = served.handle().stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let (held, replies) = (
        load(&stats.peak_inflight_bytes),
        load(&stats.peak_reply_bytes),
    );
    assert!(replies >= u64::from(LEN), "no reply was counted: {replies}");
    assert!(held <= CAP, "budget peak {held} over the cap {CAP}");
    assert!(
        replies <= CAP,
        "{replies} bytes of replies at once, over the cap {CAP}"
    );
}

/// A client that stops reading its replies holds the budget of its reads
/// only until `reply_timeout`: then it is cut off, and a client waiting
/// for that budget is served.
#[test]
fn a_client_that_stops_reading_replies_is_cut_off() {
    const CAP: u64 = 2 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let timeout = Some(std::time::Duration::from_millis(500));
    let served = served_capped(
        dir.path(),
        CAP,
        (4 * MIB, 3),
        ServerConfig {
            reply_timeout: timeout,
            ..ServerConfig::default()
        },
    );
    // Sixteen 1 MiB reads, never a reply read: the socket's buffer fills
    // and the stalled replies hold at least 1 MiB of the budget (2 MiB
    // when workers took them; 1 MiB when the reader carries out the first
    // itself and stalls in its send).
    let mut stalled = RawClient::connect(&served.socket, "disk", false);
    let reads: Vec<_> = (0..16u64)
        .map(|i| (CMD_READ, 0, i % 4 * MIB, MIB as u32, &[][..]))
        .collect();
    stalled.send_burst(&reads);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let socket = served.socket.clone();
    let (done, served_read) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The whole cap: it fits only once the stalled replies are gone.
        let mut client = RawClient::connect(&socket, "disk", true);
        let data = client.read(0, CAP as u32);
        let _ = done.send(data);
    });
    let data = served_read
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the second client was not served: the stalled one still holds the budget");
    assert_eq!(data.expect("read"), vec![3u8; CAP as usize]);
    let stats = served.handle().stats();
    assert!(
        stats
            .reply_timeouts
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // The connection logs why it closed once its workers are done, which
    // may be just after the other client was served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !served.log.contains("took no reply bytes") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        served.log.contains("took no reply bytes"),
        "{:?}",
        served.log.lines()
    );
    drop(stalled);
}

/// A committed export of `size` bytes, served without a commit at
/// shutdown, and two clients (simple and structured replies).
fn served_without_commit(dir: &Path, size: u64) -> (Arc<Store>, Served, RawClient, RawClient) {
    let store = dir_store(dir);
    create_export(&store, "disk", size).unwrap();
    store.commit().unwrap();
    let served = Served::start(
        store.clone(),
        dir,
        ServerConfig {
            commit_on_shutdown: false,
            ..ServerConfig::default()
        },
    );
    let a = RawClient::connect(&served.socket, "disk", false);
    let b = RawClient::connect(&served.socket, "disk", true);
    (store, served, a, b)
}

/// A power cut after the clients' last FLUSH: they leave, the server stops,
/// the store is dropped without a commit and reopened from its medium, where
/// only the intent log has the writes. Returns it and the export.
fn power_cut(
    dir: &Path,
    store: Arc<Store>,
    mut served: Served,
    a: RawClient,
    b: RawClient,
) -> (Store, Export) {
    let epoch = store.epoch();
    a.disconnect();
    b.disconnect();
    served.shutdown();
    assert_eq!(store.epoch(), epoch, "no commit was asked for");
    drop(served);
    drop(store);
    let store = reopen_dir_store(dir);
    let e = lookup_export(&store, "disk").unwrap().unwrap();
    (store, e)
}

/// Issue 40 item 4: an export served with ext4 inference reports the
/// tracker's memory budget, which `oubli serve` takes out of its cap on
/// request data; without inference it is 0. A blank export's tracker
/// holds nothing yet.
#[test]
fn the_ext4_trackers_budget_is_reported_for_the_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let e = create_export(&store, "disk", 64 * MIB).unwrap();
    let inferred = oubli_nbd::Liveness::ext4(&store, "disk", e.oid).unwrap();
    assert_eq!(
        inferred.tracker_budget(),
        oubli_ext4::Budget::default().total()
    );
    assert_eq!(inferred.tracker_memory(), 0);
    let plain = oubli_nbd::Liveness::plain("disk", e.oid);
    assert_eq!((plain.tracker_budget(), plain.tracker_memory()), (0, 0));
}
