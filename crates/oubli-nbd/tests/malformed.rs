//! Malformed protocol over a raw socket: bad magic, unknown options and commands, out-of-range and oversized requests, truncation, disconnects mid-write, integrity failures — an error or a closed connection, never a crash, a hang or a lost acknowledged write.

mod common;

use common::*;
use oubli_core::{Medium, Options};
use oubli_media::{DirMedium, FaultMedium, ReadFault, ReadTarget};
use oubli_nbd::exports::create_export;
use oubli_nbd::proto::*;
use oubli_nbd::{Request, ServerConfig};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn setup(size: u64) -> (tempfile::TempDir, Served) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", size).unwrap();
    let served = Served::start(store, dir.path(), ServerConfig::default());
    (dir, served)
}

/// Reads until the server closes the connection; panics if it sends more
/// than `max` bytes first.
fn expect_closed(s: &mut UnixStream, max: usize) {
    let mut buf = vec![0u8; 4096];
    let mut total = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                total += n;
                assert!(total <= max, "server kept talking ({total} bytes)");
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("expected the server to close the connection: {e}"),
        }
    }
}

/// After whatever a test did, the server still serves a fresh client.
fn still_serves(socket: &Path) {
    let mut c = RawClient::connect(socket, "disk", false);
    assert_eq!(c.read(0, 512).unwrap().len(), 512);
    c.disconnect();
}

#[test]
fn handshake_violations_close_the_connection() {
    let (_d, served) = setup(MIB);
    // Unknown client flags.
    let mut s = RawClient::greet(&served.socket);
    s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    expect_closed(&mut s, 0);
    // Bad option magic.
    let mut s = RawClient::greet(&served.socket);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(&[0x55; 16]).unwrap();
    expect_closed(&mut s, 0);
    // EXPORT_NAME of an unknown export: the protocol can only close.
    let mut s = RawClient::greet(&served.socket);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    RawClient::send_option(&mut s, OPT_EXPORT_NAME, b"nope");
    expect_closed(&mut s, 0);
    // Garbage straight after the greeting, then a hang-up mid-option.
    let mut s = RawClient::greet(&served.socket);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    s.write_all(&[0, 0]).unwrap();
    drop(s);
    still_serves(&served.socket);
}

#[test]
fn options_are_answered_and_the_session_goes_on() {
    let (_d, served) = setup(MIB);
    let mut s = RawClient::greet(&served.socket);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut ask = |option: u32, data: &[u8]| {
        RawClient::send_option(&mut s, option, data);
        RawClient::option_reply(&mut s).1
    };
    assert_eq!(ask(0x4242, b"whatever"), REP_ERR_UNSUP);
    assert_eq!(ask(OPT_STARTTLS, &[]), REP_ERR_UNSUP);
    assert_eq!(ask(OPT_SET_META_CONTEXT, &[0; 8]), REP_ERR_UNSUP);
    assert_eq!(ask(OPT_STRUCTURED_REPLY, b"x"), REP_ERR_INVALID);
    assert_eq!(ask(OPT_GO, b"\x00\x00\x00\x10abc"), REP_ERR_INVALID);
    assert_eq!(
        ask(OPT_INFO, &RawClient::go_data("missing")),
        REP_ERR_UNKNOWN
    );
    assert_eq!(ask(OPT_GO, &RawClient::go_data("")), REP_ERR_UNKNOWN);
    assert_eq!(ask(OPT_LIST, b"junk"), REP_ERR_INVALID);
    // An option far over the limit is skipped without being buffered.
    let big = vec![0u8; 1 << 20];
    assert_eq!(ask(OPT_GO, &big), REP_ERR_TOO_BIG);
    assert_eq!(ask(0x7777, &big), REP_ERR_UNSUP);
    // LIST works: one export, then ACK.
    RawClient::send_option(&mut s, OPT_LIST, &[]);
    let (_, t, d) = RawClient::option_reply(&mut s);
    assert_eq!((t, &d[4..]), (REP_SERVER, &b"disk"[..]));
    assert_eq!(RawClient::option_reply(&mut s).1, REP_ACK);
    // INFO then ABORT: ACK and close.
    RawClient::send_option(&mut s, OPT_INFO, &RawClient::go_data("disk"));
    loop {
        let (_, t, _) = RawClient::option_reply(&mut s);
        if t == REP_ACK {
            break;
        }
        assert_eq!(t, REP_INFO);
    }
    RawClient::send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(RawClient::option_reply(&mut s).1, REP_ACK);
    expect_closed(&mut s, 0);
    still_serves(&served.socket);
}

#[test]
fn bad_requests_get_the_spec_errors() {
    let size = MIB;
    let (_d, served) = setup(size);
    for structured in [false, true] {
        let mut c = RawClient::connect(&served.socket, "disk", structured);
        assert_eq!(c.size, size);
        assert_eq!(c.write(0, b"kept"), 0);
        // Unknown command, unknown flags, BLOCK_STATUS without a context.
        assert_eq!(c.cmd(42, 0, 0, 0, &[]), Errno::Inval.code());
        assert_eq!(c.cmd(CMD_FLUSH, 1 << 9, 0, 0, &[]), Errno::Inval.code());
        assert_eq!(c.cmd(CMD_BLOCK_STATUS, 0, 0, 512, &[]), Errno::Inval.code());
        assert_eq!(
            c.cmd(CMD_TRIM, CMD_FLAG_NO_HOLE, 0, 512, &[]),
            Errno::Inval.code()
        );
        // Out of range.
        assert_eq!(c.read(size - 10, 11), Err(Errno::Inval.code()));
        assert_eq!(c.read(u64::MAX, 1), Err(Errno::Inval.code()));
        assert_eq!(c.cmd(CMD_TRIM, 0, size, 1, &[]), Errno::Inval.code());
        assert_eq!(
            c.cmd(CMD_WRITE_ZEROES, 0, size - 1, 2, &[]),
            Errno::NoSpc.code()
        );
        assert_eq!(c.cmd(CMD_CACHE, 0, size, 1, &[]), Errno::Inval.code());
        // A write past the end: its data is taken off the wire, then refused.
        assert_eq!(
            c.cmd(CMD_WRITE, 0, size - 2, 4, b"XXXX"),
            Errno::NoSpc.code()
        );
        assert_eq!(
            c.cmd(CMD_WRITE, 0, u64::MAX - 1, 4, b"XXXX"),
            Errno::NoSpc.code()
        );
        // Over the maximum payload.
        assert_eq!(c.read(0, MAX_PAYLOAD + 1), Err(Errno::Overflow.code()));
        // Fast zero that would have to write.
        assert_eq!(
            c.cmd(
                CMD_WRITE_ZEROES,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                512,
                &[]
            ),
            Errno::NotSup.code()
        );
        // Zero-length requests are fine.
        assert_eq!(c.read(size, 0), Ok(vec![]));
        assert_eq!(c.cmd(CMD_WRITE, 0, 0, 0, &[]), 0);
        assert_eq!(c.cmd(CMD_TRIM, 0, 0, 0, &[]), 0);
        // FUA on a read is accepted (clients do send it).
        assert_eq!(c.cmd(CMD_CACHE, CMD_FLAG_FUA, 0, 512, &[]), 0);
        // The session is intact and nothing above reached the device.
        assert_eq!(c.read(0, 4).unwrap(), b"kept");
        assert_eq!(c.read(size - 2, 2).unwrap(), [0, 0]);
        c.disconnect();
    }
}

#[test]
fn oversized_write_is_refused_and_its_data_skipped() {
    let (_d, served) = setup(64 * MIB);
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let len = MAX_PAYLOAD + 1;
    let cookie = c.send(CMD_WRITE, 0, 0, len, &[]);
    let chunk = vec![0x5a; 1 << 20];
    let mut left = len as usize;
    while left > 0 {
        let n = left.min(chunk.len());
        c.s.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    let r = c.reply(None);
    assert_eq!((r.cookie, r.error), (cookie, Errno::Inval.code()));
    assert_eq!(c.read(0, 16).unwrap(), [0; 16]);
    c.disconnect();
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let (_d, served) = setup(MIB);
    let mut other = RawClient::connect(&served.socket, "disk", false);
    assert_eq!(other.write(0, b"before"), 0);
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let mut bad = Request {
        flags: 0,
        kind: CMD_READ,
        cookie: 1,
        offset: 0,
        len: 4,
    }
    .encode();
    bad[0] = 0;
    c.s.write_all(&bad).unwrap();
    expect_closed(&mut c.s, 0);
    assert_eq!(other.read(0, 6).unwrap(), b"before");
    other.disconnect();
}

/// A client that hangs up in the middle of a request header or of a write's
/// data: the connection ends, the half-sent write is not applied, and every
/// acknowledged write is still there — for other clients, and after the
/// server's shutdown commit and a reopen.
#[test]
fn disconnect_mid_request_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 4 * MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let acked = vec![0x42u8; 256 * 1024];
    {
        let mut c = RawClient::connect(&served.socket, "disk", false);
        assert_eq!(c.write(0, &acked), 0);
        // Half a header.
        let h = Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: 9,
            offset: 0,
            len: 1000,
        }
        .encode();
        c.s.write_all(&h[..11]).unwrap();
    }
    {
        let mut c = RawClient::connect(&served.socket, "disk", false);
        assert_eq!(c.write(MIB, &acked), 0);
        // A whole header and half of the data, then gone.
        let h = Request {
            flags: 0,
            kind: CMD_WRITE,
            cookie: 9,
            offset: 0,
            len: 8192,
        }
        .encode();
        c.s.write_all(&h).unwrap();
        c.s.write_all(&[0xEE; 4096]).unwrap();
    }
    let mut c = RawClient::connect(&served.socket, "disk", false);
    assert!(c.read(0, acked.len() as u32).unwrap() == acked);
    assert!(c.read(MIB, acked.len() as u32).unwrap() == acked);
    c.disconnect();
    // Wait for the two broken connections to be gone (bounded by the test harness).
    while served.handle().active_connections() > 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        served.log.contains("client went away"),
        "{:?}",
        served.log.lines()
    );
    served.shutdown();
    drop(store);
    let store = reopen_dir_store(dir.path());
    let e = oubli_nbd::lookup_export(&store, "disk").unwrap().unwrap();
    assert!(store.read(e.oid, 0, acked.len()).unwrap() == acked);
    assert!(store.read(e.oid, MIB, acked.len()).unwrap() == acked);
}

/// The medium returns tampered bytes: the read is answered EIO (simple and
/// structured), the failure is logged, no data is sent, and the session
/// goes on.
#[test]
fn integrity_failure_is_eio_and_logged_never_data() {
    let dir = tempfile::tempdir().unwrap();
    let fault = Arc::new(FaultMedium::new(
        DirMedium::create(dir.path().join("store")).unwrap(),
    ));
    let options: Options = manual();
    let (store, _vault) = store_on(fault.clone() as Arc<dyn Medium>, &options);
    create_export(&store, "disk", MIB).unwrap();
    let served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let secret = vec![0x77u8; 64 * 1024];
    assert_eq!(c.write(0, &secret), 0);
    store.commit().unwrap();
    let mut s = RawClient::connect(&served.socket, "disk", true);
    fault.set_read_fault(ReadTarget::Segments, Some(ReadFault::FlipBit));
    assert_eq!(c.read(0, 4096), Err(Errno::Io.code()));
    assert_eq!(s.read(4096, 4096), Err(Errno::Io.code()));
    fault.set_read_fault(ReadTarget::Segments, Some(ReadFault::Fail));
    assert_eq!(c.read(0, 4096), Err(Errno::Io.code()));
    fault.set_read_fault(ReadTarget::Segments, None);
    // Replies stayed framed: the next reads work and return the real bytes.
    assert!(c.read(0, 4096).unwrap() == secret[..4096]);
    assert!(s.read(0, 4096).unwrap() == secret[..4096]);
    assert!(
        served.log.contains("INTEGRITY FAILURE"),
        "{:?}",
        served.log.lines()
    );
    c.disconnect();
    s.disconnect();
}

#[test]
fn read_only_server_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", MIB).unwrap();
    let served = Served::start(
        store,
        dir.path(),
        ServerConfig {
            read_only: true,
            ..ServerConfig::default()
        },
    );
    let mut c = RawClient::connect(&served.socket, "disk", false);
    assert!(c.flags & FLAG_READ_ONLY != 0 && c.flags & FLAG_SEND_TRIM == 0);
    assert_eq!(c.write(0, b"x"), Errno::Perm.code());
    assert_eq!(c.cmd(CMD_TRIM, 0, 0, 512, &[]), Errno::Perm.code());
    assert_eq!(c.cmd(CMD_WRITE_ZEROES, 0, 0, 512, &[]), Errno::Perm.code());
    assert_eq!(c.read(0, 1).unwrap(), [0]);
    c.disconnect();
}
