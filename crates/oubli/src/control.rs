//! The control socket: lets `oubli purge` and `oubli status` reach the process (mount or server) that holds a store open.
//!
//! A store directory is locked by the process that opens it, so a second
//! `oubli` cannot open it to commit. The long-running front-ends (`oubli
//! mount`, `oubli serve`) therefore listen on a Unix socket next to the store
//! — `<store>/control.sock`, mode 0600 — and answer one-line requests:
//!
//! | request  | reply |
//! |---|---|
//! | `purge`  | `ok <epoch>` after committing (every deletion so far becomes unrecoverable) |
//! | `flush`  | `ok` after making every write durable |
//! | `status` | `ok <json>`: the same object `oubli status --json` prints |
//! | `snapshot-ls` | `ok <json>`: the array `oubli snapshot ls --json` prints |
//! | `certify-measure` | `ok <json>`: epoch, vault record digest, what is pending and the audit's counts, for a certificate of sanitization (`certificate::measure::Measure`); a mount adds `removed`, the paths it removed since its last commit (`RemovedNames`) |
//! | `snapshot-create <expires-at or -> <name>` | `ok <epoch>` once the snapshot is durable |
//! | `snapshot-rm <purge or keep> <name>` | `ok <epoch>` once the removal is durable (and committed with `purge`) |
//! | `redact <purge or keep> <path>` (mounts only) | `ok <json>`: what `oubli redact` reports, once durable (and committed with `purge`) |
//! | `unmount-outcome` (mounts only) | `ok running` until unmounted and committed, then `ok committed`, or `ok failed <json>` (exit code, message, hint) if the last commit failed: what `oubli umount` reports |
//!
//! Errors are `err <exit code> <message>`: the code `oubli` would exit with
//! had it done the work itself (docs/CLI.md, "Exit codes"), so a request
//! through a live process fails the same way as one without. Only the owner
//! of the store can connect. A
//! front-end may add requests and run every request where none of its own
//! operations is half done ([`Frontend`]): a mount takes its snapshots
//! between namespace operations, never inside a rename.

use oubli_core::Store;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// File name of the socket inside a store directory.
pub const SOCKET_NAME: &str = "control.sock";

/// Where the control socket of a store lives: inside a store directory, next to a store file.
pub fn socket_path(store: &Path) -> PathBuf {
    if store.is_dir() {
        store.join(SOCKET_NAME)
    } else {
        let mut name = store.file_name().unwrap_or_default().to_os_string();
        name.push(".");
        name.push(SOCKET_NAME);
        store.with_file_name(name)
    }
}

/// Renders a store's status for `status`; supplied by the CLI so that the
/// socket and `oubli status --json` print the same object.
pub type StatusRenderer = dyn Fn(&Store) -> Result<String, String> + Send + Sync;

/// A request the live process refused: the exit code and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i32,
    pub message: String,
}

impl Refusal {
    pub fn new(code: i32, message: impl Into<String>) -> Refusal {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// A refusal without a more specific code (exit 1).
    pub fn other(message: impl Into<String>) -> Refusal {
        Refusal::new(crate::exit::UNEXPECTED, message)
    }

    /// The wire form: `err <code> <message>`.
    fn reply(&self) -> String {
        format!("err {} {}", self.code, self.message)
    }

    /// Reads the wire form's rest (`<code> <message>`, or only a message
    /// from a process of an older version).
    fn parse(rest: &str) -> Refusal {
        match rest.split_once(' ').map(|(c, m)| (c.parse::<i32>(), m)) {
            Some((Ok(code), message)) => Refusal::new(code, message),
            _ => Refusal::other(rest),
        }
    }
}

impl From<&oubli_core::Error> for Refusal {
    fn from(e: &oubli_core::Error) -> Refusal {
        Refusal::new(crate::exit::exit_code(e), e.to_string())
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal::other(message)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a front-end adds to the control socket.
pub trait Frontend: Send + Sync {
    /// Runs `f` where no operation of the front-end is half done.
    fn quiesced(&self, f: &mut dyn FnMut());
    /// Answers a request only this front-end knows; `None`: not one of them.
    fn answer(&self, line: &str) -> Option<Result<String, Refusal>>;
}

/// A running control server; stops (and removes the socket) when dropped.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Starts listening at `path` for requests against `store`.
    pub fn start(
        path: &Path,
        store: Arc<Store>,
        status: Arc<StatusRenderer>,
        frontend: Option<Arc<dyn Frontend>>,
    ) -> io::Result<ControlServer> {
        // A socket left by a crashed process is stale if nobody answers on it.
        if path.exists() && UnixStream::connect(path).is_err() {
            std::fs::remove_file(path)?;
        }
        let listener = oubli_nbd::socket::bind_private(path)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("oubli-control".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let _ = serve(conn, &store, &*status, frontend.as_deref());
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(
    conn: UnixStream,
    store: &Store,
    status: &StatusRenderer,
    frontend: Option<&dyn Frontend>,
) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    let line = read_request(&conn, Instant::now() + CLIENT_TIME)?;
    let line = line.trim();
    let reply = match frontend {
        None => answer(store, status, line),
        Some(f) => match f.answer(line) {
            Some(Ok(rest)) => format!("ok {rest}"),
            Some(Err(e)) => e.reply(),
            None => {
                let mut reply = String::new();
                f.quiesced(&mut || reply = answer(store, status, line));
                reply
            }
        },
    };
    let reply = format!("{}\n", reply.replace('\n', " "));
    write_by(&conn, reply.as_bytes(), Instant::now() + CLIENT_TIME)
}

/// How long a client of the control socket has to send its request, and
/// then to take the reply, however it trickles the bytes: a socket timeout
/// alone restarts with each read that returns something, and the socket
/// serves one client at a time, so a client sending a byte every few
/// seconds held it (and every `oubli status`, `purge`...) for ever.
const CLIENT_TIME: Duration = Duration::from_secs(10);

/// The time left until `deadline`, or a timeout error.
fn left(deadline: Instant) -> io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
}

/// Reads one request line (at most 4096 bytes) by `deadline`.
fn read_request(mut conn: &UnixStream, deadline: Instant) -> io::Result<String> {
    const MAX: usize = 4096;
    let mut line = Vec::new();
    let mut buf = [0u8; 512];
    while line.len() < MAX && !line.contains(&b'\n') {
        conn.set_read_timeout(Some(left(deadline)?))?;
        let room = (MAX - line.len()).min(buf.len());
        match conn.read(&mut buf[..room]) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(end) = line.iter().position(|&b| b == b'\n') {
        line.truncate(end);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Writes `bytes` by `deadline`.
fn write_by(mut conn: &UnixStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        conn.set_write_timeout(Some(left(deadline)?))?;
        match conn.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The reply to one of the requests every front-end answers.
fn answer(store: &Store, status: &StatusRenderer, line: &str) -> String {
    match line {
        "purge" | "commit" => match store.purge() {
            Ok(()) => format!("ok {}", store.epoch()),
            Err(e) => Refusal::from(&e).reply(),
        },
        "flush" => match store.flush() {
            Ok(()) => "ok".to_string(),
            Err(e) => Refusal::from(&e).reply(),
        },
        "status" => match status(store) {
            Ok(json) => format!("ok {json}"),
            Err(e) => Refusal::other(e).reply(),
        },
        "certify-measure" => match crate::certificate::measure::measure(store) {
            Ok(m) => format!("ok {}", serde_json::to_string(&m).expect("plain data")),
            Err(e) => Refusal::from(&e).reply(),
        },
        "snapshot-ls" => match crate::report::snapshot_reports(store) {
            Ok(list) => format!("ok {}", serde_json::to_string(&list).expect("plain data")),
            Err(e) => Refusal::from(&e).reply(),
        },
        other => match snapshot_request(store, other) {
            Some(Ok(())) => format!("ok {}", store.epoch()),
            Some(Err(e)) => Refusal::from(&e).reply(),
            None => Refusal::new(crate::exit::USAGE, format!("unknown request {other:?}")).reply(),
        },
    }
}

/// `snapshot-create` and `snapshot-rm`; `None` for any other request.
fn snapshot_request(store: &Store, line: &str) -> Option<oubli_core::Result<()>> {
    let (verb, rest) = line.split_once(' ')?;
    let (arg, name) = rest.split_once(' ')?;
    Some(match (verb, arg) {
        ("snapshot-create", "-") => store.snapshot_create(name, None).map(|_| ()),
        ("snapshot-create", at) => match at.parse() {
            Ok(at) => store.snapshot_create(name, Some(at)).map(|_| ()),
            Err(_) => Err(oubli_core::Error::Invalid(format!("expiry {at:?}"))),
        },
        ("snapshot-rm", "purge") => store.snapshot_remove_and_commit(name),
        ("snapshot-rm", "keep") => store.snapshot_remove(name),
        _ => return None,
    })
}

/// The reply of a live process, or `None` if no process holds the store open.
pub fn request(store: &Path, what: &str) -> io::Result<Option<Result<String, Refusal>>> {
    let path = socket_path(store);
    let mut conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    // A purge waits for a commit, which may wait for a slow vault.
    conn.set_read_timeout(Some(Duration::from_secs(120)))?;
    conn.write_all(what.as_bytes())?;
    conn.write_all(b"\n")?;
    let mut reply = String::new();
    BufReader::new(conn).read_line(&mut reply)?;
    let reply = reply.trim_end();
    Ok(Some(match reply.split_once(' ').unwrap_or((reply, "")) {
        ("ok", rest) => Ok(rest.to_string()),
        ("err", rest) => Err(Refusal::parse(rest)),
        _ => Err(Refusal::other(format!(
            "malformed reply from the control socket: {reply:?}"
        ))),
    }))
}
