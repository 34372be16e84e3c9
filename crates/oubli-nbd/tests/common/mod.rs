//! Shared fixtures of the NBD tests: a store in a tempdir served on a Unix socket, external tools with timeouts, a raw protocol client.
#![allow(dead_code)]

use oubli_core::{EpochPolicy, Medium, Options, Store};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_media::DirMedium;
use oubli_nbd::proto::*;
use oubli_nbd::{serve, Endpoint, Log, ServerConfig, ServerHandle};
use oubli_testkit::RecordingVault;
use oubli_vault::{FileVault, KdfParams};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether tests that need external tools may skip when a tool is missing.
pub fn skip_external() -> bool {
    std::env::var("OUBLI_SKIP_EXTERNAL").is_ok_and(|v| v == "1")
}

/// The path of `tool` on `$PATH`. A missing tool fails the test, naming the
/// Debian package to install (see scripts/apt-packages) — unless
/// OUBLI_SKIP_EXTERNAL=1, where the caller skips (returns `None`).
pub fn tool(tool: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p),
        None if skip_external() => {
            eprintln!("SKIPPED (OUBLI_SKIP_EXTERNAL=1): `{tool}` is missing (Debian package {package})");
            None
        }
        None => panic!(
            "`{tool}` is not installed: install the Debian package `{package}` \
             (`apt-get install -y {package}`; scripts/apt-packages lists every package the tests need), \
             or set OUBLI_SKIP_EXTERNAL=1 to skip tests that need it"
        ),
    }
}

/// Every tool in the list, or `None` (skip) if one is missing and skipping is allowed.
pub fn tools(list: &[(&str, &str)]) -> Option<Vec<PathBuf>> {
    list.iter().map(|(t, p)| tool(t, p)).collect()
}

/// Output of a finished command.
pub struct Output {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a command with a time limit (a safety net against hangs, not a
/// timing assertion); panics if it does not finish in time.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{shown} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// Runs a command that must succeed; returns its stdout.
pub fn run_ok(cmd: &mut Command, limit: Duration) -> String {
    let shown = format!("{cmd:?}");
    let o = run(cmd, limit);
    assert!(
        o.status.success(),
        "{shown} failed ({}):\nstdout: {}\nstderr: {}",
        o.status,
        o.stdout,
        o.stderr
    );
    o.stdout
}

/// Log lines captured from the server.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<String>>>);

impl Captured {
    pub fn log(&self) -> Log {
        let lines = self.0.clone();
        Arc::new(move |line: &str| {
            lines.lock().unwrap().push(line.to_string());
        })
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
    pub fn contains(&self, needle: &str) -> bool {
        self.lines().iter().any(|l| l.contains(needle))
    }
}

pub fn password() -> SecretBytes {
    SecretBytes::new(b"nbd test password".to_vec())
}

pub fn manual() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    }
}

/// A store on a directory medium in a tempdir, with a file vault (testing KDF).
pub fn dir_store(dir: &Path) -> Arc<Store> {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    let medium = DirMedium::create(dir.join("store")).expect("create dir medium");
    let vault = dir.join("vault");
    let store = Store::create(
        Arc::new(medium),
        |first| {
            FileVault::create(
                &vault,
                &password(),
                KdfParams::testing(),
                first,
                provider.clone(),
            )
            .map_err(oubli_core::Error::from)
        },
        oubli_testkit::harness::front_end_create_options(),
        Options {
            provider: provider.clone(),
            ..manual()
        },
    )
    .expect("create store");
    Arc::new(store)
}

/// Reopens the store of [`dir_store`] (after the server is gone).
pub fn reopen_dir_store(dir: &Path) -> Store {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    let medium = DirMedium::open(dir.join("store")).expect("open dir medium");
    let vault =
        FileVault::open(dir.join("vault"), &password(), provider.clone()).expect("open vault");
    Store::open(
        Arc::new(medium),
        Arc::new(vault),
        Options {
            provider,
            ..manual()
        },
    )
    .expect("reopen store")
}

/// A store on any medium with a recording vault (the adversary tests).
pub fn store_on(medium: Arc<dyn Medium>, options: &Options) -> (Arc<Store>, Arc<RecordingVault>) {
    let mut vault = None;
    let store = Store::create(
        medium,
        |record| {
            let v = Arc::new(RecordingVault::new(record.clone()));
            vault = Some(v.clone());
            Ok(v)
        },
        oubli_testkit::harness::front_end_create_options(),
        options.clone(),
    )
    .expect("create store");
    (Arc::new(store), vault.expect("vault"))
}

/// A running server on a Unix socket in `dir`.
pub struct Served {
    pub handle: Option<ServerHandle>,
    pub socket: PathBuf,
    pub log: Captured,
}

impl Served {
    pub fn start(store: Arc<Store>, dir: &Path, config: ServerConfig) -> Served {
        let socket = dir.join("nbd.sock");
        let log = Captured::default();
        let handle = serve(
            store,
            &[Endpoint::Unix(socket.clone())],
            ServerConfig {
                log: log.log(),
                ..config
            },
        )
        .expect("start server");
        Served {
            handle: Some(handle),
            socket,
            log,
        }
    }

    pub fn handle(&self) -> &ServerHandle {
        self.handle.as_ref().unwrap()
    }

    /// `nbd+unix:///EXPORT?socket=PATH`.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    pub fn shutdown(&mut self) {
        self.handle
            .take()
            .unwrap()
            .shutdown()
            .expect("shutdown commits");
    }
}

/// Deterministic pseudo-random bytes (xorshift), fast enough for a gigabyte.
pub fn fill_random(seed: u64, buf: &mut [u8]) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Writes a file of `len` pseudo-random bytes.
pub fn random_file(path: &Path, len: u64, seed: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut buf = vec![0u8; 4 << 20];
    let mut left = len;
    let mut s = seed;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill_random(s, &mut buf[..n]);
        s = s.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

/// A reply read by [`RawClient`].
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
}

/// A minimal NBD client over a Unix socket, for tests that must send what
/// no real client would.
pub struct RawClient {
    pub s: UnixStream,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    cookie: u64,
}

impl RawClient {
    /// Connects and reads the greeting; returns the raw stream.
    pub fn greet(socket: &Path) -> UnixStream {
        let mut s = UnixStream::connect(socket).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).expect("greeting");
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        s
    }

    pub fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        s.write_all(&v).unwrap();
    }

    /// Reads one option reply: (option, type, data).
    pub fn option_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).expect("option reply");
        assert_eq!(&h[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut d = vec![0u8; len];
        s.read_exact(&mut d).unwrap();
        (
            u32::from_be_bytes(h[8..12].try_into().unwrap()),
            u32::from_be_bytes(h[12..16].try_into().unwrap()),
            d,
        )
    }

    pub fn go_data(name: &str) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    }

    /// Connects with NBD_OPT_GO to `export`.
    pub fn connect(socket: &Path, export: &str, structured: bool) -> RawClient {
        let mut s = Self::greet(socket);
        s.write_all(&3u32.to_be_bytes()).unwrap();
        if structured {
            Self::send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(Self::option_reply(&mut s).1, REP_ACK);
        }
        Self::send_option(&mut s, OPT_GO, &Self::go_data(export));
        let (mut size, mut flags) = (0, 0);
        loop {
            let (_, t, d) = Self::option_reply(&mut s);
            match t {
                REP_INFO if d[..2] == [0, 0] => {
                    size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
                }
                REP_INFO => {}
                REP_ACK => break,
                other => panic!(
                    "GO {export:?} refused: {other:#x} {:?}",
                    String::from_utf8_lossy(&d)
                ),
            }
        }
        RawClient {
            s,
            size,
            flags,
            structured,
            cookie: 1,
        }
    }

    pub fn send(&mut self, kind: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        self.send_burst(&[(kind, flags, offset, len, payload)])[0]
    }

    /// Sends `(kind, flags, offset, len, payload)` requests in one `write`, so
    /// the server finds them in its buffer together; returns their cookies.
    pub fn send_burst(&mut self, reqs: &[(u16, u16, u64, u32, &[u8])]) -> Vec<u64> {
        let mut wire = Vec::new();
        let mut cookies = Vec::new();
        for &(kind, flags, offset, len, payload) in reqs {
            self.cookie += 1;
            let req = oubli_nbd::Request {
                flags,
                kind,
                cookie: self.cookie,
                offset,
                len,
            };
            wire.extend_from_slice(&req.encode());
            wire.extend_from_slice(payload);
            cookies.push(self.cookie);
        }
        self.s.write_all(&wire).unwrap();
        cookies
    }

    /// Reads one reply; `read_len` is the data length expected on success of a READ.
    pub fn reply(&mut self, read_len: Option<u32>) -> Reply {
        if self.structured {
            return self.structured_reply();
        }
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).expect("reply header");
        assert_eq!(&h[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut data = Vec::new();
        if error == 0 {
            if let Some(n) = read_len {
                data = vec![0u8; n as usize];
                self.s.read_exact(&mut data).unwrap();
            }
        }
        Reply {
            cookie,
            error,
            data,
        }
    }

    fn structured_reply(&mut self) -> Reply {
        let mut data = Vec::new();
        let mut error = 0;
        loop {
            let mut h = [0u8; 4];
            self.s.read_exact(&mut h).expect("reply magic");
            let magic = u32::from_be_bytes(h);
            if magic == SIMPLE_REPLY_MAGIC {
                let mut rest = [0u8; 12];
                self.s.read_exact(&mut rest).unwrap();
                return Reply {
                    cookie: u64::from_be_bytes(rest[4..12].try_into().unwrap()),
                    error: u32::from_be_bytes(rest[0..4].try_into().unwrap()),
                    data,
                };
            }
            assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
            let mut rest = [0u8; 16];
            self.s.read_exact(&mut rest).unwrap();
            let flags = u16::from_be_bytes(rest[0..2].try_into().unwrap());
            let kind = u16::from_be_bytes(rest[2..4].try_into().unwrap());
            let cookie = u64::from_be_bytes(rest[4..12].try_into().unwrap());
            let len = u32::from_be_bytes(rest[12..16].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            self.s.read_exact(&mut payload).unwrap();
            match kind {
                REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&payload[8..]),
                REPLY_TYPE_ERROR => {
                    // The error number, then the message: kept in `data`.
                    error = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                    data.extend_from_slice(&payload[6..]);
                }
                REPLY_TYPE_NONE => {}
                other => panic!("unexpected chunk type {other}"),
            }
            if flags & REPLY_FLAG_DONE != 0 {
                return Reply {
                    cookie,
                    error,
                    data,
                };
            }
        }
    }

    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        self.send(CMD_READ, 0, offset, len, &[]);
        let r = self.reply(Some(len));
        if r.error == 0 {
            Ok(r.data)
        } else {
            Err(r.error)
        }
    }

    pub fn cmd(&mut self, kind: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> u32 {
        let cookie = self.send(kind, flags, offset, len, payload);
        let r = self.reply(None);
        assert_eq!(r.cookie, cookie);
        r.error
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.cmd(CMD_WRITE, 0, offset, data.len() as u32, data)
    }

    pub fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, 0, &[]);
        let mut b = [0u8; 1];
        // The server closes without a reply.
        assert_eq!(self.s.read(&mut b).unwrap_or(0), 0);
    }
}

/// A CA, a server and a client certificate made by `scripts/nbd-certs` (the
/// recipe docs/NBD.md gives users) under `dir/certs`: `server/` for the
/// server, `client/` for libnbd and qemu. `None` to skip without certtool.
pub fn make_certs(dir: &Path) -> Option<PathBuf> {
    tool("certtool", "gnutls-bin")?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nbd-certs");
    let out = dir.join("certs");
    run_ok(Command::new(script).arg(&out), Duration::from_secs(60));
    Some(out)
}

/// The server's TLS credentials from [`make_certs`].
pub fn server_credentials(certs: &Path) -> oubli_nbd::TlsCredentials {
    oubli_nbd::TlsCredentials::load(&certs.join("server")).expect("load the server certificates")
}

/// Waits until `cond` holds; a minute without it fails the test (a safety
/// net against hangs, not a timing assertion).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A store in `dir` with one export, "disk", of `size` bytes, served on a
/// Unix socket as the default export with `config`.
pub fn serve_disk(dir: &Path, size: u64, config: ServerConfig) -> Served {
    let store = dir_store(dir);
    oubli_nbd::create_export(&store, "disk", size).unwrap();
    Served::start(
        store,
        dir,
        ServerConfig {
            default_export: Some("disk".into()),
            ..config
        },
    )
}
