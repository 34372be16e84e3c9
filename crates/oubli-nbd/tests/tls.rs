//! TLS on the NBD server with real clients (nbdinfo, nbdcopy, qemu-img, qemu-io; certificates by scripts/nbd-certs with certtool): a client with a certificate from the CA gets in, a plain client, one without a certificate and one with another CA's certificate do not.

mod common;

use common::*;
use oubli_nbd::exports::create_export;
use oubli_nbd::{serve, Endpoint, ServerConfig, ServerHandle, Tls, TlsMode};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(120);

/// A server on TCP (loopback, any port) and on `dir/nbd.sock`.
fn start(dir: &Path, certs: &Path, tcp: TlsMode, unix: TlsMode) -> (ServerHandle, Captured) {
    start_with(dir, certs, tcp, unix, ServerConfig::default())
}

fn start_with(
    dir: &Path,
    certs: &Path,
    tcp: TlsMode,
    unix: TlsMode,
    config: ServerConfig,
) -> (ServerHandle, Captured) {
    let store = dir_store(dir);
    create_export(&store, "disk", 64 * MIB).unwrap();
    let log = Captured::default();
    let server = serve(
        store,
        &[
            Endpoint::Tcp("127.0.0.1:0".parse().unwrap()),
            Endpoint::Unix(dir.join("nbd.sock")),
        ],
        ServerConfig {
            default_export: Some("disk".into()),
            tls: Some(Tls {
                credentials: server_credentials(certs),
                tcp,
                unix,
            }),
            log: log.log(),
            ..config
        },
    )
    .expect("start server");
    (server, log)
}

/// A client certificate directory: the server's CA to check the server,
/// and the client certificate and key of `from` (another CA's, or none).
fn client_dir(dir: &Path, name: &str, ca: &Path, from: Option<&Path>) -> String {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(ca.join("client/ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
    if let Some(from) = from {
        for f in ["client-cert.pem", "client-key.pem"] {
            std::fs::copy(from.join("client").join(f), d.join(f)).unwrap();
        }
    }
    d.display().to_string()
}

#[test]
fn only_clients_with_a_certificate_from_the_ca_get_in() {
    let Some(t) = tools(&[
        ("nbdinfo", "libnbd-bin"),
        ("nbdcopy", "libnbd-bin"),
        ("qemu-img", "qemu-utils"),
        ("qemu-io", "qemu-utils"),
    ]) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let Some(certs) = make_certs(dir) else {
        return;
    };
    let (server, log) = start(dir, &certs, TlsMode::Require, TlsMode::Require);
    let port = server.tcp_addr().unwrap().port();
    let good = certs.join("client").display().to_string();
    let tls_uri = |creds: &str| format!("nbds://localhost:{port}/disk?tls-certificates={creds}");
    let size = |uri: &str| run(Command::new(&t[0]).arg("--size").arg(uri), LIMIT);

    // nbdinfo with the client certificate.
    let o = size(&tls_uri(&good));
    assert!(o.status.success(), "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), (64 * MIB).to_string());
    assert!(
        log.contains("client certificate verified"),
        "{:?}",
        log.lines()
    );

    // A plain connection is refused (NBD_REP_ERR_TLS_REQD).
    let o = size(&format!("nbd://localhost:{port}/disk"));
    assert!(!o.status.success(), "a plain client got in: {}", o.stdout);
    assert!(o.stderr.contains("TLS"), "{}", o.stderr);

    // A client without a certificate, or with another CA's, fails the TLS handshake.
    let none = client_dir(dir, "no-cert", &certs, None);
    let other_certs = make_certs(&dir.join("other")).unwrap();
    let foreign = client_dir(dir, "foreign", &certs, Some(&other_certs));
    for creds in [none, foreign] {
        let before = log.lines().len();
        let o = size(&tls_uri(&creds));
        assert!(!o.status.success(), "{creds}: got in: {}", o.stdout);
        wait_until("the refusal in the log", || {
            log.lines()[before..]
                .iter()
                .any(|l| l.contains("TLS handshake failed"))
        });
    }

    // qemu-img and qemu-io with qemu's x509 credentials object.
    let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={good}");
    let image = format!("driver=nbd,host=localhost,port={port},export=disk,tls-creds=tls0");
    let out = run_ok(
        Command::new(&t[2]).args(["info", "--object", &object, "--image-opts", &image]),
        LIMIT,
    );
    assert!(out.contains("64 MiB"), "{out}");
    run_ok(
        Command::new(&t[3]).args([
            "--object",
            &object,
            "--image-opts",
            &image,
            "-c",
            "write -P 0x5a 1M 3M",
            "-c",
            "read -P 0x5a 1M 3M",
            "-c",
            "discard 1M 1M",
            "-c",
            "read -P 0 1M 1M",
        ]),
        LIMIT,
    );
    // Without credentials qemu gets nowhere.
    let o = run(
        Command::new(&t[2]).args([
            "info",
            "--image-opts",
            &format!("driver=nbd,host=localhost,port={port},export=disk"),
        ]),
        LIMIT,
    );
    assert!(!o.status.success(), "{}", o.stdout);

    // nbdcopy: 4 connections, many requests in flight each, both ways.
    let src = dir.join("src.img");
    random_file(&src, 24 * MIB, 7);
    run_ok(Command::new(&t[1]).arg(&src).arg(tls_uri(&good)), LIMIT);
    let back = dir.join("back.img");
    run_ok(Command::new(&t[1]).arg(tls_uri(&good)).arg(&back), LIMIT);
    let back = std::fs::read(&back).unwrap();
    assert!(std::fs::read(&src).unwrap() == back[..24 * MIB as usize]);

    // The Unix socket, when asked to, requires TLS too.
    let sock = dir.join("nbd.sock").display().to_string();
    let o = size(&format!(
        "nbds+unix:///disk?socket={sock}&tls-certificates={good}"
    ));
    assert!(o.status.success(), "{}{}", o.stdout, o.stderr);
    let o = size(&format!("nbd+unix:///disk?socket={sock}"));
    assert!(!o.status.success(), "{}", o.stdout);
    assert!(
        server
            .stats()
            .tls_sessions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 5
    );
    server.shutdown().unwrap();
}

/// `--tls=on`: plain and TLS clients both get in.
#[test]
fn tls_on_serves_plain_and_tls_clients() {
    let Some(t) = tools(&[("nbdinfo", "libnbd-bin")]) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let Some(certs) = make_certs(dir) else {
        return;
    };
    let (server, _log) = start(dir, &certs, TlsMode::On, TlsMode::Off);
    let port = server.tcp_addr().unwrap().port();
    let good = certs.join("client").display().to_string();
    for uri in [
        format!("nbd://localhost:{port}/disk"),
        format!("nbds://localhost:{port}/disk?tls-certificates={good}"),
    ] {
        let out = run_ok(Command::new(&t[0]).arg("--size").arg(&uri), LIMIT);
        assert_eq!(out.trim(), (64 * MIB).to_string(), "{uri}");
    }
    // TLS is off on the Unix socket: a TLS client is told so and gives up.
    let sock = dir.join("nbd.sock").display().to_string();
    let o = run(
        Command::new(&t[0]).arg("--size").arg(format!(
            "nbds+unix:///disk?socket={sock}&tls-certificates={good}"
        )),
        LIMIT,
    );
    assert!(!o.status.success(), "{}", o.stdout);
    server.shutdown().unwrap();
}

/// Unusable certificate directories are refused with the file at fault.
#[test]
fn bad_certificate_directories_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let Some(certs) = make_certs(dir) else {
        return;
    };
    let Some(other) = make_certs(&dir.join("other")) else {
        return;
    };
    let load = |d: &Path| oubli_nbd::TlsCredentials::load(d).unwrap_err().to_string();
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(load(&empty).contains("ca-cert.pem"), "{}", load(&empty));
    // A key that is not the certificate's.
    let mixed = dir.join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    for (from, f) in [
        (&certs, "ca-cert.pem"),
        (&certs, "server-cert.pem"),
        (&other, "server-key.pem"),
    ] {
        std::fs::copy(from.join("server").join(f), mixed.join(f)).unwrap();
    }
    assert!(load(&mixed).contains("does not match"), "{}", load(&mixed));
    // Garbage instead of a key; the message does not quote the file.
    std::fs::write(mixed.join("server-key.pem"), "not a key SECRETISH").unwrap();
    let e = load(&mixed);
    assert!(
        e.contains("server-key.pem") && !e.contains("SECRETISH"),
        "{e}"
    );
}

/// A server that requires TLS on both sockets and cuts a handshake at 1 s.
fn start_with_1s_handshake(dir: &Path, certs: &Path) -> (ServerHandle, Captured) {
    start_with(
        dir,
        certs,
        TlsMode::Require,
        TlsMode::Require,
        ServerConfig {
            handshake_timeout: Duration::from_secs(1),
            ..ServerConfig::default()
        },
    )
}

/// A client that asks for TLS and then says nothing is dropped at the
/// handshake timeout like any other.
#[test]
fn a_client_that_stalls_in_the_tls_handshake_is_dropped() {
    use oubli_nbd::proto::*;
    use std::io::{Read, Write};
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let Some(certs) = make_certs(dir) else {
        return;
    };
    let (server, _log) = start_with_1s_handshake(dir, &certs);
    let socket = dir.join("nbd.sock");
    let mut s = RawClient::greet(&socket);
    s.write_all(&3u32.to_be_bytes()).unwrap();
    RawClient::send_option(&mut s, OPT_GO, &RawClient::go_data("disk"));
    assert_eq!(RawClient::option_reply(&mut s).1, REP_ERR_TLS_REQD);
    RawClient::send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(RawClient::option_reply(&mut s).1, REP_ACK);
    // No ClientHello follows.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).expect("closed by the server");
    assert!(rest.is_empty());
    let timeouts = &server.stats().handshake_timeouts;
    assert_eq!(timeouts.load(std::sync::atomic::Ordering::Relaxed), 1);
    server.shutdown().unwrap();
}

/// Issue 40 item 2: the handshake deadline is absolute. A client that
/// sends a byte every 300 ms — inside its TLS handshake, or in the plain
/// option haggling before it — is cut at the 1 s deadline although each
/// of its reads makes progress (a socket timeout restarted by every read
/// never fired: a ClientHello trickled a byte every 4 s outlived a 10 s
/// limit).
#[test]
fn a_client_that_trickles_is_cut_at_the_handshake_deadline() {
    use oubli_nbd::proto::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let Some(certs) = make_certs(dir) else {
        return;
    };
    let (server, log) = start_with_1s_handshake(dir, &certs);
    let socket = dir.join("nbd.sock");
    // Sends `bytes` one every 300 ms; returns how many went out before the
    // server closed the connection (all of them: it never did).
    let trickle = |mut s: UnixStream, bytes: Vec<u8>| {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        for (sent, b) in bytes.iter().enumerate() {
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(0) => return sent,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return sent,
            }
            if s.write_all(&[*b]).is_err() {
                return sent;
            }
        }
        bytes.len()
    };
    // Forty bytes take 12 s: a connection still open by then was not cut.
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    hello.resize(40, 0);
    let in_tls = {
        let mut s = RawClient::greet(&socket);
        s.write_all(&3u32.to_be_bytes()).unwrap();
        RawClient::send_option(&mut s, OPT_STARTTLS, &[]);
        assert_eq!(RawClient::option_reply(&mut s).1, REP_ACK);
        std::thread::spawn(move || trickle(s, hello))
    };
    let mut haggling = 3u32.to_be_bytes().to_vec();
    haggling.extend_from_slice(&IHAVEOPT.to_be_bytes());
    haggling.extend_from_slice(&OPT_GO.to_be_bytes());
    haggling.extend_from_slice(&28u32.to_be_bytes());
    haggling.resize(40, 0);
    let plain = {
        let s = RawClient::greet(&socket);
        std::thread::spawn(move || trickle(s, haggling))
    };
    let (in_tls, plain) = (in_tls.join().unwrap(), plain.join().unwrap());
    assert!(
        in_tls < 40,
        "a trickled ClientHello held its connection past 12 s: {:?}",
        log.lines()
    );
    assert!(
        plain < 40,
        "trickled options held their connection past 12 s: {:?}",
        log.lines()
    );
    let timeouts = &server.stats().handshake_timeouts;
    assert_eq!(
        timeouts.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "{:?}",
        log.lines()
    );
    server.shutdown().unwrap();
}
