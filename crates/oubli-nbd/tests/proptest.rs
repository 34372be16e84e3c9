//! Random bytes at the request parser, the request checker and the handshake state machine (the stable-toolchain stand-in for `fuzz/`), and at a live server.

mod common;

use common::*;
use oubli_nbd::exports::create_export;
use oubli_nbd::handshake::{
    Catalog, CloseReason, ExportInfo, Handshake, HandshakeConfig, Progress, TlsMode,
};
use oubli_nbd::proto::*;
use oubli_nbd::{check, parse_request, Action, Limits, Request, ServerConfig};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use std::io::Write;

/// Deterministic runs: a fixed seed, no regression files.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x0b11_04bd),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

struct Fixed;

impl Catalog for Fixed {
    fn lookup(&self, name: &str) -> Result<Option<ExportInfo>, String> {
        match name {
            "" | "a" => Ok(Some(ExportInfo {
                name: "a".into(),
                size: 1 << 20,
                read_only: false,
                description: "d".into(),
                id: 2,
            })),
            "ro" => Ok(Some(ExportInfo {
                name: "ro".into(),
                size: 512,
                read_only: true,
                description: String::new(),
                id: 3,
            })),
            "err" => Err("broken".into()),
            _ => Ok(None),
        }
    }
    fn list(&self) -> Result<Vec<String>, String> {
        Ok(vec!["a".into(), "ro".into()])
    }
}

/// Feeds `input` in the pieces given by `cuts`, as the connection loop does
/// (a pending buffer drained by what was consumed). TLS is taken as
/// transparent: at `StartTls` the bytes that follow are the decrypted ones.
/// The last field: whether the handshake ended inside TLS.
fn drive(
    input: &[u8],
    cuts: &[usize],
    config: HandshakeConfig,
) -> (usize, Progress, Vec<u8>, bool) {
    let mut hs = Handshake::new(config);
    let mut out = Vec::new();
    let mut pending = Vec::new();
    let mut consumed = 0;
    let mut fed = 0;
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.push(input.len());
    points.sort_unstable();
    let mut progress = Progress::Continue;
    for p in points {
        pending.extend_from_slice(&input[fed..p]);
        fed = p;
        let before = pending.len();
        let (mut n, mut pr) = hs.advance(&pending, &Fixed, &mut out);
        while pr == Progress::StartTls {
            // Nothing moves until TLS is up.
            assert_eq!(hs.advance(&pending[n..], &Fixed, &mut Vec::new()).0, 0);
            hs.tls_started();
            let (more, next) = hs.advance(&pending[n..], &Fixed, &mut out);
            n += more;
            pr = next;
        }
        assert!(n <= before, "consumed more than it was given");
        pending.drain(..n);
        consumed += n;
        progress = pr;
        if hs.finished() {
            // Once finished, nothing more is consumed.
            let (again, pr2) = hs.advance(&pending, &Fixed, &mut out);
            assert_eq!((again, &pr2), (0, &progress));
            break;
        }
    }
    (consumed, progress, out, hs.in_tls())
}

fn tls_mode(i: u8) -> TlsMode {
    [TlsMode::Off, TlsMode::On, TlsMode::Require][i as usize % 3]
}

/// Checks that the output is a sequence of well-formed option replies,
/// except for the final reply to a successful NBD_OPT_EXPORT_NAME.
fn check_framing(mut out: &[u8], progress: &Progress) {
    while out.len() >= 20 && out[..8] == OPTION_REPLY_MAGIC.to_be_bytes() {
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(out.len() >= 20 + len, "truncated option reply");
        let ty = u32::from_be_bytes(out[12..16].try_into().unwrap());
        if ty & REP_FLAG_ERROR != 0 {
            assert!(len <= MAX_STRING);
            assert!(std::str::from_utf8(&out[20..20 + len]).is_ok());
        }
        out = &out[20 + len..];
    }
    match progress {
        Progress::Transmission(n) if !out.is_empty() => {
            // EXPORT_NAME: size, flags, and maybe 124 zeroes.
            assert!(
                out.len() == 10 || out.len() == 134,
                "{} stray bytes",
                out.len()
            );
            assert_eq!(
                u64::from_be_bytes(out[..8].try_into().unwrap()),
                n.export.size
            );
        }
        _ => assert!(out.is_empty(), "{} stray bytes", out.len()),
    }
}

fn option_strategy() -> impl Strategy<Value = Vec<u8>> {
    let code = prop_oneof![
        Just(OPT_EXPORT_NAME),
        Just(OPT_ABORT),
        Just(OPT_LIST),
        Just(OPT_STARTTLS),
        Just(OPT_INFO),
        Just(OPT_GO),
        Just(OPT_STRUCTURED_REPLY),
        Just(OPT_SET_META_CONTEXT),
        any::<u32>(),
    ];
    let name = prop_oneof![
        Just(b"a".to_vec()),
        Just(b"ro".to_vec()),
        Just(b"err".to_vec()),
        Just(Vec::new()),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    let data = prop_oneof![
        // Well-formed INFO/GO data.
        (name.clone(), proptest::collection::vec(0u16..6, 0..5)).prop_map(|(n, infos)| {
            let mut d = (n.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(&n);
            d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
            for i in infos {
                d.extend_from_slice(&i.to_be_bytes());
            }
            d
        }),
        name,
        proptest::collection::vec(any::<u8>(), 0..40),
    ];
    (
        code,
        data,
        prop_oneof![8 => Just(None), 1 => any::<u32>().prop_map(Some)],
        prop_oneof![12 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(code, data, bad_len, good_magic)| {
            let mut v = if good_magic {
                IHAVEOPT.to_be_bytes().to_vec()
            } else {
                b"IHAVEOPX".to_vec()
            };
            v.extend_from_slice(&code.to_be_bytes());
            v.extend_from_slice(&bad_len.unwrap_or(data.len() as u32).to_be_bytes());
            v.extend_from_slice(&data);
            v
        })
}

fn session_strategy() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(3u32), Just(1), Just(0), Just(2), any::<u32>()],
        proptest::collection::vec(option_strategy(), 0..8),
        proptest::collection::vec(any::<u8>(), 0..32),
    )
        .prop_map(|(flags, options, tail)| {
            let mut v = flags.to_be_bytes().to_vec();
            for o in options {
                v.extend(o);
            }
            v.extend(tail);
            v
        })
}

proptest! {
    #![proptest_config(config(2000))]

    /// Random bytes never panic the parser; what parses re-encodes to the same bytes.
    #[test]
    fn request_parser_total(bytes in proptest::collection::vec(any::<u8>(), 0..64), magic in any::<bool>()) {
        let mut bytes = bytes;
        if magic && bytes.len() >= 4 {
            bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        match parse_request(&bytes) {
            Ok(Some(r)) => prop_assert_eq!(&r.encode()[..], &bytes[..REQUEST_LEN]),
            Ok(None) => prop_assert!(bytes.len() < REQUEST_LEN),
            Err(_) => prop_assert!(bytes.len() >= REQUEST_LEN),
        }
    }

    /// Whatever the request, a request the checker accepts stays inside the
    /// export and inside the payload limit, and never writes a read-only export.
    #[test]
    fn checker_keeps_requests_in_bounds(
        flags in any::<u16>(), kind in 0u16..10, offset in any::<u64>(), len in any::<u32>(),
        size in prop_oneof![Just(0u64), Just(1 << 20), any::<u64>()],
        read_only in any::<bool>(), structured in any::<bool>(),
    ) {
        let req = Request { flags, kind, cookie: 1, offset, len };
        let limits = Limits { size, read_only, structured, max_payload: MAX_PAYLOAD };
        let in_bounds = |o: u64, l: u32| o.checked_add(l as u64).is_some_and(|e| e <= size);
        match check(&req, &limits) {
            Ok(Action::Read { offset, len }) => {
                prop_assert!(in_bounds(offset, len) && len <= MAX_PAYLOAD);
            }
            Ok(Action::Write { offset, len, .. }) => {
                prop_assert!(in_bounds(offset, len) && len <= MAX_PAYLOAD && !read_only);
            }
            Ok(Action::Trim { offset, len, .. }) | Ok(Action::WriteZeroes { offset, len, .. }) => {
                prop_assert!(in_bounds(offset, len) && !read_only);
            }
            Ok(_) => {}
            Err(e) => prop_assert!(e != Errno::NoMem && e != Errno::Shutdown),
        }
    }

    /// Random bytes at the handshake: no panic, never more consumed than
    /// given, well-framed output, and the same result however the input is split.
    #[test]
    fn handshake_on_random_bytes(input in proptest::collection::vec(any::<u8>(), 0..200),
                                 cuts in proptest::collection::vec(any::<usize>(), 0..6),
                                 tls in any::<u8>()) {
        let config = HandshakeConfig { tls: tls_mode(tls), ..HandshakeConfig::default() };
        let whole = drive(&input, &[], config);
        let split = drive(&input, &cuts, config);
        prop_assert_eq!(&whole, &split);
        prop_assert!(whole.0 <= input.len());
        check_framing(&whole.2, &whole.1);
    }

    /// Plausible sessions (valid and broken options mixed) reach every state.
    #[test]
    fn handshake_on_plausible_sessions(input in session_strategy(),
                                       cuts in proptest::collection::vec(any::<usize>(), 0..6),
                                       structured in any::<bool>(),
                                       tls in any::<u8>()) {
        let tls = tls_mode(tls);
        let config = HandshakeConfig { structured_replies: structured, tls, ..HandshakeConfig::default() };
        let whole = drive(&input, &[], config);
        let split = drive(&input, &cuts, config);
        prop_assert_eq!(&whole, &split);
        check_framing(&whole.2, &whole.1);
        match &whole.1 {
            Progress::Transmission(n) => {
                // No export without TLS where it is required, none inside TLS where it is off.
                prop_assert!(tls.allows_plain() || whole.3);
                prop_assert!(tls != TlsMode::Off || !whole.3);
                prop_assert!(n.flags & FLAG_HAS_FLAGS != 0);
                prop_assert_eq!(n.export.read_only, n.flags & FLAG_READ_ONLY != 0);
                prop_assert!(!n.structured || structured);
                prop_assert!(n.structured == (n.flags & FLAG_SEND_DF != 0));
            }
            Progress::Close(CloseReason::Abort) => {
                // The ACK to ABORT is the last thing sent.
                let ack = &whole.2[whole.2.len() - 20..];
                prop_assert_eq!(&ack[8..16], &[0, 0, 0, 2, 0, 0, 0, 1]);
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Random bytes after a successful GO, at a live server: it answers or
    /// closes, and goes on serving other clients with their data intact.
    #[test]
    fn live_server_survives_random_transmission_bytes(
        garbage in proptest::collection::vec(any::<u8>(), 0..300),
        with_magic in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = dir_store(dir.path());
        create_export(&store, "a", 1 << 20).unwrap();
        let served = Served::start(store, dir.path(), ServerConfig::default());
        let mut keeper = RawClient::connect(&served.socket, "a", false);
        prop_assert_eq!(keeper.write(100, b"precious"), 0);
        let mut c = RawClient::connect(&served.socket, "a", with_magic);
        let mut g = garbage;
        if with_magic && g.len() >= 4 {
            g[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        let _ = c.s.write_all(&g);
        drop(c);
        prop_assert_eq!(keeper.read(100, 8).unwrap(), b"precious".to_vec());
        keeper.disconnect();
        let mut fresh = RawClient::connect(&served.socket, "a", false);
        prop_assert_eq!(fresh.read(100, 8).unwrap(), b"precious".to_vec());
        fresh.disconnect();
    }
}
