//! The NBD server: listeners (Unix socket, TCP), a thread per connection, the handshake and transmission loops over a shared `Store`, clean shutdown.
//!
//! Every byte decision is made by the sans-IO parts ([`crate::handshake`],
//! [`crate::request`], [`crate::reply`]); this module only moves bytes and
//! calls the store. Each connection has a reader that takes requests off the
//! wire and a few workers that carry them out, so a client with a queue
//! depth above one keeps both the cores and the medium busy; replies go out
//! as requests finish (NBD matches them by cookie), and a disconnect waits
//! for the requests in flight. Writes without FUA go to the server's
//! write-behind queue instead ([`crate::behind`]) and are answered at once.
//! Connections run in parallel on the shared store.
//!
//! Deletion semantics: TRIM and WRITE_ZEROES without `NO_HOLE` punch a hole
//! (`Store::punch_hole`), so the old bytes are erased at the next commit;
//! WRITE_ZEROES with `NO_HOLE` overwrites with zeros (the old bytes are
//! erased at the next commit too). FLUSH and FUA make writes durable through
//! the intent log (`Store::flush`) without ending the epoch.

use crate::behind::WriteBehind;
use crate::exports::{list_exports, lookup_export};
use crate::handshake::{
    Catalog, CloseReason, ExportInfo, Handshake, HandshakeConfig, Negotiated, Progress, TlsMode,
};
use crate::liveness::Liveness;
use crate::proto::*;
use crate::reply;
use crate::request::{check, parse_request, Action, Limits, Request};
use crate::spare::SpareBuffers;
use crate::tls::{self, TlsCredentials, TlsReader, TlsWriter};
use oubli_core::{Error, Store};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Cursor, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where log lines go (one line per call, without a trailing newline).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// A log that writes `oubli-nbd: LINE` to standard error.
pub fn stderr_log() -> Log {
    Arc::new(|line: &str| eprintln!("oubli-nbd: {line}"))
}

/// How the server behaves.
#[derive(Clone)]
pub struct ServerConfig {
    /// The export served to clients that ask for the empty name.
    pub default_export: Option<String>,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN`. Correct because every connection
    /// shares one `Store`, whose flush covers all of them.
    pub multi_conn: bool,
    /// Accept `NBD_OPT_STRUCTURED_REPLY`.
    pub structured_replies: bool,
    /// Serve every export read-only (set it when the store is opened read-only).
    pub read_only: bool,
    /// Commit when [`ServerHandle::shutdown`] runs.
    pub commit_on_shutdown: bool,
    /// How long shutdown lets connections finish their current request
    /// before it cuts them off.
    pub shutdown_grace: Duration,
    /// Connections whose client is authenticated: a Unix socket's (only
    /// whom its file mode lets in can connect), and a TCP connection once
    /// its TLS session verified the client's certificate (or, without TLS,
    /// once it entered transmission). Beyond this number they are closed
    /// at once. Unauthenticated connections never count here.
    pub max_connections: usize,
    /// TCP connections whose client has not authenticated yet (before its
    /// TLS handshake ends, or before transmission without TLS). When a new
    /// one arrives with this many held, the oldest is closed to make room,
    /// so clients that hold handshakes open cannot keep a new client out,
    /// nor take the slots of authenticated ones.
    pub max_unauthenticated: usize,
    /// Requests of one connection carried out at the same time (1: strictly
    /// in order). Default 16, the queue depth of a busy client: each read
    /// a worker carries out holds it through its `pread`, so with fewer
    /// workers than requests in flight the disk sees fewer reads than the
    /// client asked for, and a read that waits for the disk holds up the
    /// reads behind it that the page cache could answer. Memory does not
    /// grow with it: payloads and replies in flight are capped by bytes
    /// (`max_inflight_bytes`), not by worker.
    pub workers_per_connection: usize,
    /// The only exports clients may open or list (`None`: every export in
    /// the store). `oubli serve` gives the one it was asked to serve.
    pub exports: Option<Vec<String>>,
    /// TLS: credentials and when to use them. `None`: no TLS anywhere
    /// (`NBD_OPT_STARTTLS` is refused).
    pub tls: Option<Tls>,
    /// A client that has not entered transmission this long after it
    /// connected (TLS handshake included) is disconnected, so that idle
    /// connections cannot hold the server's connection slots. The deadline
    /// is absolute: a client that sends a byte now and then is cut at it
    /// all the same.
    pub handshake_timeout: Duration,
    /// Request data held in memory, over all connections: the payloads of
    /// writes and the replies of reads in flight. Readers wait while it is
    /// reached (a single larger request still goes through, alone).
    pub max_inflight_bytes: u64,
    /// A client that takes no reply bytes for this long is disconnected: a
    /// read's reply holds its share of [`max_inflight_bytes`](Self::max_inflight_bytes)
    /// until it is sent, so a client that stops reading its replies must
    /// not hold it for ever. `None`: wait for ever.
    pub reply_timeout: Option<Duration>,
    /// Per-export counters and, with `--infer-deletes ext4`, the liveness
    /// tracker fed every write (`crate::liveness`). Exports not listed are
    /// served without either.
    pub liveness: Vec<Arc<Liveness>>,
    /// Acknowledge writes without FUA once queued (`crate::behind`); `None`:
    /// once carried out. Give the same queue to whatever else commits the
    /// store meanwhile, which settles it first.
    pub write_behind: Option<Arc<WriteBehind>>,
    pub log: Log,
}

/// TLS for [`ServerConfig::tls`]: the credentials and the mode on each kind
/// of endpoint.
#[derive(Debug, Clone)]
pub struct Tls {
    pub credentials: TlsCredentials,
    /// On TCP endpoints.
    pub tcp: TlsMode,
    /// On Unix sockets (whose file mode already keeps other users out).
    pub unix: TlsMode,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            default_export: None,
            multi_conn: true,
            structured_replies: true,
            read_only: false,
            commit_on_shutdown: true,
            shutdown_grace: Duration::from_secs(5),
            max_connections: 128,
            max_unauthenticated: 16,
            workers_per_connection: 16,
            exports: None,
            tls: None,
            handshake_timeout: Duration::from_secs(10),
            max_inflight_bytes: 256 << 20,
            reply_timeout: Some(Duration::from_secs(30)),
            liveness: Vec::new(),
            write_behind: Some(Arc::new(WriteBehind::new())),
            log: stderr_log(),
        }
    }
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix socket at this path (created mode 0600; a stale socket file is replaced).
    Unix(PathBuf),
    /// A TCP address. Without TLS (client certificates) anyone who reaches
    /// it reads and writes the exports: `oubli serve` allows plain TCP only
    /// on a loopback address.
    Tcp(SocketAddr),
    /// A listening socket this process was given (systemd socket
    /// activation, [`crate::socket::systemd_listeners`]), Unix or TCP. The
    /// server owns the descriptor from then on; the socket's file, if any,
    /// is the service manager's and stays in place at shutdown.
    Inherited(std::os::fd::RawFd),
}

/// A stream of either kind.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
    /// Read and write timeouts of the socket (shared by every handle on it).
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(read)?;
                s.set_write_timeout(write)
            }
        }
    }
}

impl tls::Socket for Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Stream::try_clone(self)
    }
}

/// What a connection reads: the socket, or the plaintext of its TLS session.
enum Input {
    Plain(Stream),
    Tls(TlsReader<Stream>),
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Input::Plain(s) => s.read(buf),
            Input::Tls(t) => t.read(buf),
        }
    }
}

/// What a connection writes to: the socket, or its TLS session.
enum Output {
    Plain(Stream),
    Tls(TlsWriter<Stream>),
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Plain(s) => s.write(buf),
            Output::Tls(t) => t.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Plain(s) => s.flush(),
            Output::Tls(t) => t.flush(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// The TLS mode of this listener's connections.
    fn tls_mode(&self, tls: Option<&Tls>) -> TlsMode {
        match (tls, self) {
            (None, _) => TlsMode::Off,
            (Some(t), Listener::Unix(..)) => t.unix,
            (Some(t), Listener::Tcp(_)) => t.tcp,
        }
    }

    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Unix(l, path) => {
                let (s, _) = l.accept()?;
                Ok((Stream::Unix(s), format!("unix:{}", path.display())))
            }
            Listener::Tcp(l) => {
                let (s, peer) = l.accept()?;
                let _ = s.set_nodelay(true);
                Ok((Stream::Tcp(s), format!("tcp:{peer}")))
            }
        }
    }

    /// Unblocks a thread sitting in `accept` by connecting to it.
    fn wake(&self) -> bool {
        match self {
            Listener::Unix(_, path) => UnixStream::connect(path).is_ok(),
            Listener::Tcp(l) => {
                let Ok(mut addr) = l.local_addr() else {
                    return false;
                };
                if addr.ip().is_unspecified() {
                    addr.set_ip(match addr {
                        SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                        SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                    });
                }
                TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
            }
        }
    }
}

/// Counters for tests and status lines.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub trims: AtomicU64,
    pub flushes: AtomicU64,
    /// The most request data (write payloads, read replies) ever held at
    /// once by the budget (see [`ServerConfig::max_inflight_bytes`]).
    pub peak_inflight_bytes: AtomicU64,
    /// The most read reply bytes ever in memory at once, counted where the
    /// replies are made and dropped (a check on the budget, not part of it).
    pub peak_reply_bytes: AtomicU64,
    /// Connections cut off for taking no reply bytes in
    /// [`ServerConfig::reply_timeout`].
    pub reply_timeouts: AtomicU64,
    /// Connections that entered TLS.
    pub tls_sessions: AtomicU64,
    /// Connections dropped for not finishing the handshake in time.
    pub handshake_timeouts: AtomicU64,
    /// Unauthenticated connections closed to make room for a newer one
    /// ([`ServerConfig::max_unauthenticated`]).
    pub unauthenticated_closed: AtomicU64,
}

/// An open connection as the server keeps track of it.
struct Conn {
    /// A handle on its socket, to cut it off (deadline, shutdown, eviction).
    stream: Stream,
    /// When it is cut off if it has not entered transmission by then.
    deadline: Option<Instant>,
    /// A TCP connection whose client has not authenticated yet.
    unauthenticated: bool,
    /// Counted in [`Stats::handshake_timeouts`] already (by whichever of
    /// the deadline thread and the connection's own socket timeout saw it
    /// first), so that it counts once, and before its socket closes.
    timed_out: bool,
}

struct Shared {
    store: Arc<Store>,
    config: ServerConfig,
    handshake: HandshakeConfig,
    stopping: AtomicBool,
    /// The open connections (a handle on each socket, to close it at
    /// shutdown or at its handshake deadline).
    conns: Mutex<HashMap<u64, Conn>>,
    /// Wakes the thread that enforces the handshake deadlines (a new
    /// connection, or shutdown); waits on `conns`.
    deadlines: Condvar,
    /// Every connection thread not yet joined (finished ones are pruned as new ones start).
    threads: Mutex<Vec<JoinHandle<()>>>,
    ended: Condvar,
    next_id: AtomicU64,
    stats: Stats,
    /// Request data in flight (write payloads, read replies), over every connection.
    budget: PayloadBudget,
    /// Read reply bytes in memory now (for [`Stats::peak_reply_bytes`]).
    reply_bytes: AtomicU64,
    /// `ServerConfig::liveness` by export object.
    liveness: HashMap<u64, Arc<Liveness>>,
    /// Buffers that read replies are made in, given back once sent.
    spare: SpareBuffers,
}

impl Shared {
    fn log(&self, line: &str) {
        (self.config.log)(line)
    }
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Authenticated connections now.
    fn authenticated(conns: &HashMap<u64, Conn>) -> usize {
        conns.values().filter(|c| !c.unauthenticated).count()
    }
    /// Connection `id`'s client authenticated (its certificate verified,
    /// or it entered transmission without TLS): from now on it holds one
    /// of the `max_connections` slots. `false` if none is free (or the
    /// connection was closed meanwhile): the caller closes it.
    fn admit(&self, id: u64) -> bool {
        let mut conns = self.conns();
        let held = Self::authenticated(&conns);
        match conns.get_mut(&id) {
            Some(c) if !c.unauthenticated => true,
            Some(c) if held < self.config.max_connections => {
                c.unauthenticated = false;
                true
            }
            _ => false,
        }
    }
    /// Counts connection `id`'s handshake timeout, once whoever notices it.
    /// Called before its socket is closed, so a client that sees the
    /// close sees the count.
    /// `true` if this call counted it (the caller then logs it).
    fn count_timeout(&self, conns: &mut HashMap<u64, Conn>, id: u64) -> bool {
        let Some(c) = conns.get_mut(&id) else {
            return false;
        };
        if std::mem::replace(&mut c.timed_out, true) {
            return false;
        }
        self.stats
            .handshake_timeouts
            .fetch_add(1, Ordering::Relaxed);
        true
    }
    /// What a connection cut off at its handshake deadline is told in the log.
    fn timeout_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no handshake within {:?}", self.config.handshake_timeout),
        )
    }
    /// Connection `id` entered transmission: no handshake deadline any more.
    fn in_transmission(&self, id: u64) {
        if let Some(c) = self.conns().get_mut(&id) {
            c.deadline = None;
        }
    }
    /// Holds `n` bytes of request data (a write's payload, a read's reply)
    /// from the connection's budget and the server's (waiting while either
    /// is spent).
    fn hold(&self, conn: &PayloadBudget, n: u64) {
        if n == 0 {
            return;
        }
        conn.take(n);
        let held = self.budget.take(n);
        self.stats
            .peak_inflight_bytes
            .fetch_max(held, Ordering::Relaxed);
    }
    fn release(&self, conn: &PayloadBudget, n: u64) {
        if n == 0 {
            return;
        }
        self.budget.give_back(n);
        conn.give_back(n);
    }
    /// Counts a reply's data from when it is ready until it is sent
    /// ([`Stats::peak_reply_bytes`]); returns what to give to [`Self::reply_gone`].
    fn reply_ready(&self, result: &Outcome) -> u64 {
        let n = match result {
            Ok(Some(data)) => data.len() as u64,
            _ => 0,
        };
        let now = self.reply_bytes.fetch_add(n, Ordering::Relaxed) + n;
        self.stats
            .peak_reply_bytes
            .fetch_max(now, Ordering::Relaxed);
        n
    }
    fn reply_gone(&self, n: u64) {
        self.reply_bytes.fetch_sub(n, Ordering::Relaxed);
    }
    fn behind(&self) -> Option<&WriteBehind> {
        self.config.write_behind.as_deref()
    }
}

/// A running server. Dropping it shuts it down (ignoring a failed commit);
/// call [`shutdown`](Self::shutdown) to see the commit's result.
pub struct ServerHandle {
    shared: Arc<Shared>,
    listeners: Vec<Arc<Listener>>,
    acceptors: Vec<JoinHandle<()>>,
    /// The thread that cuts off connections at their handshake deadline.
    reaper: Option<JoinHandle<()>>,
    /// The write-behind thread, if writes are queued.
    applier: Option<JoinHandle<()>>,
    addrs: Vec<Endpoint>,
    down: bool,
}

/// Starts serving the exports of `store` on `endpoints`. Each endpoint gets
/// an accepting thread, each connection a thread of its own.
pub fn serve(
    store: Arc<Store>,
    endpoints: &[Endpoint],
    config: ServerConfig,
) -> io::Result<ServerHandle> {
    if endpoints.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no endpoint to listen on",
        ));
    }
    let max_inflight_bytes = config.max_inflight_bytes;
    // Exports have small cells (those made before format 5 may not).
    let cell = store.status().map_or(oubli_core::SMALL_CELL_SIZE, |s| {
        s.cell_size.min(oubli_core::SMALL_CELL_SIZE)
    });
    let handshake = HandshakeConfig {
        structured_replies: config.structured_replies,
        multi_conn: config.multi_conn,
        preferred_block: cell.clamp(512, MAX_PAYLOAD),
        max_payload: MAX_PAYLOAD,
        tls: TlsMode::Off,
    };
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    for ep in endpoints {
        let l = bind(ep)?;
        addrs.push(match (&l, ep) {
            (_, Endpoint::Inherited(fd)) => Endpoint::Inherited(*fd),
            (Listener::Unix(_, p), _) => Endpoint::Unix(p.clone()),
            (Listener::Tcp(t), _) => Endpoint::Tcp(t.local_addr()?),
        });
        listeners.push(Arc::new(l));
    }
    let liveness = config.liveness.iter().map(|l| (l.oid, l.clone())).collect();
    let shared = Arc::new(Shared {
        liveness,
        store,
        config,
        handshake,
        stopping: AtomicBool::new(false),
        conns: Mutex::new(HashMap::new()),
        deadlines: Condvar::new(),
        threads: Mutex::new(Vec::new()),
        ended: Condvar::new(),
        next_id: AtomicU64::new(1),
        stats: Stats::default(),
        budget: PayloadBudget::new(max_inflight_bytes),
        reply_bytes: AtomicU64::new(0),
        spare: SpareBuffers::new(),
    });
    let applier = match &shared.config.write_behind {
        Some(behind) => {
            behind.start();
            let (s, b) = (shared.clone(), behind.clone());
            let spawned = std::thread::Builder::new()
                .name("nbd-write-behind".into())
                .spawn(move || apply_queued(&s, &b));
            if spawned.is_err() {
                behind.applier_gone();
            }
            Some(spawned?)
        }
        None => None,
    };
    let reaper = {
        let s = shared.clone();
        std::thread::Builder::new()
            .name("nbd-deadlines".into())
            .spawn(move || enforce_deadlines(&s))?
    };
    let mut acceptors = Vec::new();
    for (l, addr) in listeners.iter().zip(&addrs) {
        let (l, s) = (l.clone(), shared.clone());
        let tls = match l.tls_mode(s.config.tls.as_ref()) {
            TlsMode::Off => "",
            TlsMode::On => " (TLS for clients that ask)",
            TlsMode::Require => " (TLS required)",
        };
        s.log(&format!("listening on {}{tls}", show(addr)));
        acceptors.push(
            std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(&l, &s))?,
        );
    }
    Ok(ServerHandle {
        shared,
        listeners,
        acceptors,
        reaper: Some(reaper),
        applier,
        addrs,
        down: false,
    })
}

/// The write-behind thread: carries out the queued writes in order until the
/// server stops (`crate::behind`).
fn apply_queued(shared: &Shared, behind: &WriteBehind) {
    /// Whatever ends the loop, a panic included, nobody may go on waiting for it.
    struct Gone<'a>(&'a WriteBehind);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            self.0.applier_gone();
        }
    }
    let _gone = Gone(behind);
    while let Some(batch) = behind.next_batch() {
        for (q, bytes) in batch {
            let result = execute(shared, q.conn, q.oid, q.action, &q.payload);
            shared.release(&q.budget, q.payload.len() as u64);
            if result.is_err() {
                shared.log(&format!(
                    "connection {}: that WRITE was acknowledged before it was carried out: \
                     the next FLUSH or FUA request of each connection reports the failure",
                    q.conn
                ));
            }
            behind.applied(bytes, result.map(|_| ()));
        }
    }
}

fn show(ep: &Endpoint) -> String {
    match ep {
        Endpoint::Unix(p) => format!("unix:{}", p.display()),
        Endpoint::Tcp(a) => format!("tcp:{a}"),
        Endpoint::Inherited(fd) => format!("the socket passed as descriptor {fd}"),
    }
}

/// Takes over a listening socket passed by the service manager.
fn adopt(fd: std::os::fd::RawFd) -> io::Result<Listener> {
    use std::os::fd::FromRawFd;
    // SAFETY: FFI; getsockname writes at most `len` bytes into `addr`.
    let family = unsafe {
        let mut addr: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockname(fd, (&raw mut addr).cast(), &mut len) != 0 {
            return Err(io::Error::other(format!(
                "descriptor {fd} passed by the service manager is not a socket: {}",
                io::Error::last_os_error()
            )));
        }
        i32::from(addr.ss_family)
    };
    // SAFETY: FFI; marks the descriptor close-on-exec (children must not hold the socket).
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    match family {
        libc::AF_UNIX => {
            // SAFETY: the descriptor is a socket handed to this process
            // once (LISTEN_FDS); nothing else owns it.
            let l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
            l.set_nonblocking(false)?;
            let path = l
                .local_addr()?
                .as_pathname()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            Ok(Listener::Unix(l, path))
        }
        libc::AF_INET | libc::AF_INET6 => {
            // SAFETY: as above.
            let l = unsafe { TcpListener::from_raw_fd(fd) };
            l.set_nonblocking(false)?;
            Ok(Listener::Tcp(l))
        }
        other => Err(io::Error::other(format!(
            "descriptor {fd} passed by the service manager is a socket of family {other}, not Unix or TCP"
        ))),
    }
}

fn bind(ep: &Endpoint) -> io::Result<Listener> {
    match ep {
        Endpoint::Inherited(fd) => adopt(*fd),
        Endpoint::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr)?)),
        Endpoint::Unix(path) => {
            use std::os::unix::fs::FileTypeExt;
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                // Replace a stale socket left by a crashed server, never a live
                // one and never anything that is not a socket.
                if !meta.file_type().is_socket() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                if UnixStream::connect(path).is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a server is already listening on {}", path.display()),
                    ));
                }
                std::fs::remove_file(path)?;
            }
            // Whoever can connect can read and write the device.
            let l = crate::socket::bind_private(path)?;
            Ok(Listener::Unix(l, path.clone()))
        }
    }
}

/// Before a new unauthenticated connection `id` is added: if
/// `max_unauthenticated` are held, closes the oldest of them. Evicting the
/// oldest rather than refusing the newest means that however many
/// connections a client holds open in their handshake, a new client gets
/// in and has the time of `max_unauthenticated` further arrivals to
/// authenticate (a TLS handshake takes milliseconds).
fn make_room(shared: &Shared, conns: &mut HashMap<u64, Conn>, id: u64, peer: &str) {
    let limit = shared.config.max_unauthenticated.max(1);
    let pending = conns.values().filter(|c| c.unauthenticated).count();
    if pending < limit {
        return;
    }
    let oldest = conns
        .iter()
        .filter(|(_, c)| c.unauthenticated)
        .map(|(&old, _)| old)
        .min();
    if let Some(old) = oldest.and_then(|old| conns.remove(&old).map(|c| (old, c))) {
        old.1.stream.shutdown(Shutdown::Both);
        shared
            .stats
            .unauthenticated_closed
            .fetch_add(1, Ordering::Relaxed);
        shared.log(&format!(
            "connection {} closed: {pending} connections have not authenticated yet; \
             connection {id} from {peer} takes its place",
            old.0
        ));
    }
}

/// Cuts off every connection whose handshake deadline has passed, however
/// its reads and writes are going: a socket timeout alone restarts with
/// each read that returns something, so a client that trickles a byte now
/// and then would never meet it. Runs until the server stops.
fn enforce_deadlines(shared: &Shared) {
    let mut conns = shared.conns();
    while !shared.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let late: Vec<u64> = conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            // Counted and logged before the cut, so that a client that
            // sees the close finds both; the connection's thread then sees
            // its socket fail and ends quietly.
            if shared.count_timeout(&mut conns, id) {
                shared.log(&format!(
                    "connection {id}: handshake ended: {}",
                    shared.timeout_error()
                ));
            }
            if let Some(c) = conns.get_mut(&id) {
                c.stream.shutdown(Shutdown::Both);
                c.deadline = None;
            }
        }
        for c in conns.values() {
            if let Some(d) = c.deadline {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        conns = match next {
            Some(d) => {
                shared
                    .deadlines
                    .wait_timeout(conns, d.saturating_duration_since(now))
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => shared
                .deadlines
                .wait(conns)
                .unwrap_or_else(|e| e.into_inner()),
        };
    }
}

fn accept_loop(listener: &Listener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                shared.log(&format!("accept failed: {e}"));
                // Out of descriptors and the like: do not spin.
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        let mut conns = shared.conns();
        // A Unix socket's client is authenticated by the socket's file
        // mode; a TCP client is not until its TLS handshake ends.
        let unauthenticated = matches!(stream, Stream::Tcp(_));
        if unauthenticated {
            make_room(shared, &mut conns, id, &peer);
        } else {
            let held = Shared::authenticated(&conns);
            if held >= shared.config.max_connections {
                shared.log(&format!(
                    "connection {id} from {peer} refused: {held} connections already"
                ));
                continue;
            }
        }
        let Ok(handle) = stream.try_clone() else {
            continue;
        };
        let deadline = Instant::now() + shared.config.handshake_timeout;
        conns.insert(
            id,
            Conn {
                stream: handle,
                deadline: Some(deadline),
                unauthenticated,
                timed_out: false,
            },
        );
        shared.deadlines.notify_all();
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        let s = shared.clone();
        let tls = listener.tls_mode(shared.config.tls.as_ref());
        let spawned = std::thread::Builder::new()
            .name(format!("nbd-conn-{id}"))
            .spawn(move || {
                connection(&s, id, stream, &peer, tls, deadline);
                s.conns().remove(&id);
                s.ended.notify_all();
            });
        match spawned {
            Ok(t) => {
                let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            }
            Err(e) => {
                conns.remove(&id);
                shared.log(&format!("connection {id}: cannot start a thread: {e}"));
            }
        }
    }
}

impl ServerHandle {
    /// The endpoints actually bound (a TCP port 0 is resolved).
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.addrs
    }

    /// The first TCP address bound, if any.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.addrs.iter().find_map(|e| match e {
            Endpoint::Tcp(a) => Some(*a),
            _ => None,
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Connections currently open.
    pub fn active_connections(&self) -> usize {
        self.shared.conns().len()
    }

    /// Stops accepting, lets each connection finish the request it is
    /// serving (up to the configured grace), closes them all, then commits:
    /// everything trimmed or overwritten before this call is unrecoverable
    /// when it returns `Ok`.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), Error> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        let shared = &self.shared;
        shared.stopping.store(true, Ordering::SeqCst);
        for (l, t) in self
            .listeners
            .iter()
            .zip(std::mem::take(&mut self.acceptors))
        {
            if l.wake() {
                let _ = t.join();
            } // else: the acceptor stays blocked; it refuses whatever it accepts later.
        }
        // The deadline thread stops too (it waits on the connections' lock).
        {
            let _conns = shared.conns();
            shared.deadlines.notify_all();
        }
        if let Some(t) = self.reaper.take() {
            let _ = t.join();
        }
        // Half-close: a connection sees end-of-input after its current request.
        for c in shared.conns().values() {
            c.stream.shutdown(Shutdown::Read);
        }
        let deadline = Instant::now() + shared.config.shutdown_grace;
        let mut conns = shared.conns();
        while !conns.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                // Clients that do not read their replies: cut them off.
                for c in conns.values() {
                    c.stream.shutdown(Shutdown::Both);
                }
                break;
            }
            conns = shared
                .ended
                .wait_timeout(conns, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(conns);
        let threads =
            std::mem::take(&mut *shared.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        // Each connection waited for its queued writes; the queue is empty.
        if let Some(behind) = &shared.config.write_behind {
            behind.stop();
        }
        if let Some(t) = self.applier.take() {
            let _ = t.join();
        }
        for ep in &self.addrs {
            if let Endpoint::Unix(p) = ep {
                let _ = std::fs::remove_file(p);
            }
        }
        if shared.config.commit_on_shutdown && !shared.config.read_only {
            shared.store.commit().inspect_err(|e| {
                shared.log(&format!("commit at shutdown failed: {e}"));
            })?;
            shared.log("shut down; committed");
        } else {
            shared.log("shut down");
        }
        Ok(())
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The store seen as a catalog of exports.
struct StoreCatalog<'a> {
    shared: &'a Shared,
}

impl StoreCatalog<'_> {
    /// Whether clients may see export `name` (the store may hold others).
    fn served(&self, name: &str) -> bool {
        match &self.shared.config.exports {
            Some(allowed) => allowed.iter().any(|a| a == name),
            None => true,
        }
    }
}

impl Catalog for StoreCatalog<'_> {
    fn lookup(&self, name: &str) -> Result<Option<ExportInfo>, String> {
        let name = match (name, &self.shared.config.default_export) {
            ("", Some(default)) => default.as_str(),
            ("", None) => return Ok(None),
            (n, _) => n,
        };
        if !self.served(name) {
            return Ok(None);
        }
        match lookup_export(&self.shared.store, name) {
            Ok(Some(e)) => Ok(Some(ExportInfo {
                description: format!(
                    "oubli export {}: TRIM and write-zeroes erase at the next commit",
                    e.name
                ),
                name: e.name,
                size: e.size,
                read_only: self.shared.config.read_only,
                id: e.oid,
            })),
            Ok(None) => Ok(None),
            Err(e) => {
                self.shared
                    .log(&format!("looking up export {name:?} failed: {e}"));
                Err(e.to_string())
            }
        }
    }

    fn list(&self) -> Result<Vec<String>, String> {
        match list_exports(&self.shared.store) {
            Ok(v) => Ok(v
                .into_iter()
                .map(|e| e.name)
                .filter(|name| self.served(name))
                .collect()),
            Err(e) => {
                self.shared.log(&format!("listing exports failed: {e}"));
                Err(e.to_string())
            }
        }
    }
}

/// One connection, from greeting to close.
fn connection(
    shared: &Shared,
    id: u64,
    stream: Stream,
    peer: &str,
    tls: TlsMode,
    deadline: Instant,
) {
    let (Ok(write_half), Ok(raw)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let mut wire = Wire {
        input: Input::Plain(stream),
        output: BufWriter::with_capacity(64 * 1024, Output::Plain(write_half)),
    };
    match handshake(shared, id, &raw, &mut wire, tls, deadline) {
        Ok(Some((neg, leftover))) => {
            shared.log(&format!(
                "connection {id} ({peer}): export {:?} ({} bytes){}",
                neg.export.name,
                neg.export.size,
                if neg.structured {
                    ", structured replies"
                } else {
                    ""
                }
            ));
            let Wire { input, mut output } = wire;
            let mut input =
                BufReader::with_capacity(256 * 1024, Cursor::new(leftover).chain(input));
            match transmission(shared, id, &neg, &mut input, &mut output) {
                Ok(()) => shared.log(&format!("connection {id}: closed")),
                Err(e) => shared.log(&format!("connection {id}: closed: {e}")),
            }
            wire = Wire {
                input: input.into_inner().into_inner().1,
                output,
            };
        }
        Ok(None) => {}
        Err(e) => shared.log(&format!("connection {id} ({peer}): handshake ended: {e}")),
    }
    let _ = wire.output.flush();
    if let Output::Tls(session) = wire.output.get_ref() {
        // The protocol closes the TLS session before the connection.
        session.close();
    }
}

/// A connection's two directions, plain or inside TLS.
struct Wire {
    input: Input,
    output: BufWriter<Output>,
}

/// Runs the handshake; returns the negotiation and the bytes read past it.
/// The whole handshake, TLS included, must end by `deadline` (the
/// connection's, which [`enforce_deadlines`] holds it to whatever its reads
/// and writes do); `raw` is the socket, on which the timeouts are set.
fn handshake(
    shared: &Shared,
    id: u64,
    raw: &Stream,
    wire: &mut Wire,
    tls: TlsMode,
    deadline: Instant,
) -> io::Result<Option<(Negotiated, Vec<u8>)>> {
    match handshake_until(shared, id, raw, wire, tls, deadline) {
        // Cut off at the deadline: the socket's error says only that it failed.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) || Instant::now() >= deadline =>
        {
            if shared.count_timeout(&mut shared.conns(), id) {
                Err(shared.timeout_error())
            } else {
                // The deadline thread cut it, and said so.
                Ok(None)
            }
        }
        other => other,
    }
}

fn handshake_until(
    shared: &Shared,
    id: u64,
    raw: &Stream,
    wire: &mut Wire,
    tls: TlsMode,
    deadline: Instant,
) -> io::Result<Option<(Negotiated, Vec<u8>)>> {
    let timed_out = || io::Error::from(io::ErrorKind::TimedOut);
    // Every blocking step gets what is left of the time.
    let arm = || -> io::Result<()> {
        match deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => raw.set_timeouts(Some(left), Some(left)),
            _ => Err(timed_out()),
        }
    };
    let late = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => e,
    };
    arm()?;
    wire.output
        .write_all(&Handshake::greeting())
        .map_err(late)?;
    wire.output.flush().map_err(late)?;
    let mut hs = Handshake::new(HandshakeConfig {
        tls,
        ..shared.handshake
    });
    let catalog = StoreCatalog { shared };
    let mut pending = Vec::new();
    let mut buf = [0u8; 8192];
    let mut out = Vec::new();
    loop {
        let (used, progress) = hs.advance(&pending, &catalog, &mut out);
        pending.drain(..used);
        arm()?;
        wire.output.write_all(&out).map_err(late)?;
        wire.output.flush().map_err(late)?;
        out.clear();
        match progress {
            Progress::Continue => {}
            Progress::StartTls => {
                let credentials = &shared
                    .config
                    .tls
                    .as_ref()
                    .expect("TLS is offered only with credentials")
                    .credentials;
                let (reader, writer) =
                    tls::accept(credentials, raw.try_clone()?, std::mem::take(&mut pending))
                        .map_err(|e| match e.kind() {
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
                            _ => io::Error::new(e.kind(), format!("TLS handshake failed: {e}")),
                        })?;
                if !shared.admit(id) {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!(
                            "refused after TLS: {} authenticated connections already",
                            shared.config.max_connections
                        ),
                    ));
                }
                shared.stats.tls_sessions.fetch_add(1, Ordering::Relaxed);
                shared.log(&format!(
                    "connection {id}: TLS ({}), client certificate verified",
                    reader.describe()
                ));
                wire.input = Input::Tls(reader);
                wire.output = BufWriter::with_capacity(64 * 1024, Output::Tls(writer));
                hs.tls_started();
                continue;
            }
            Progress::Transmission(neg) => {
                // A plain TCP client counts as authenticated from here (the
                // server let it in without TLS).
                if !shared.admit(id) {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!(
                            "refused: {} authenticated connections already",
                            shared.config.max_connections
                        ),
                    ));
                }
                shared.in_transmission(id);
                // A client may be idle for as long as it likes between
                // requests, but must take its replies (`reply_timeout`).
                raw.set_timeouts(None, shared.config.reply_timeout)?;
                return Ok(Some((neg, pending)));
            }
            Progress::Close(CloseReason::Abort) => return Ok(None),
            Progress::Close(CloseReason::TlsRequired) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the client asked for an export without TLS, which this server requires",
                ))
            }
            Progress::Close(why) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{why:?}"),
                ))
            }
        }
        arm()?;
        let n = loop {
            match wire.input.read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other.map_err(late)?,
            }
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn truncated(what: &str, got: usize, want: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("client went away in the middle of {what} ({got} of {want} bytes)"),
    )
}

/// What a store error becomes on the wire.
fn errno_of(e: &Error) -> Errno {
    match e {
        // A write past an export's end, as the protocol asks.
        Error::NoSpace(_) | Error::PastEnd(_) => Errno::NoSpc,
        Error::ReadOnly => Errno::Perm,
        Error::Invalid(_) => Errno::Inval,
        // Integrity failures, I/O errors, a vanished export, an unknown vault
        // state: the client only learns that the I/O failed.
        _ => Errno::Io,
    }
}

/// Write payload bytes one connection may hold in flight before the reader
/// waits (a single larger request still goes through, alone).
const INFLIGHT_PAYLOAD: u64 = 64 << 20;

/// A valid request taken off the wire, waiting for a worker.
struct Job {
    req: Request,
    action: Action,
    payload: Vec<u8>,
    /// The budget held for its reply (a read's length), released once sent.
    reply_bytes: u64,
    /// The writes queued before it arrived ([`WriteBehind::mark`]).
    mark: u64,
}

/// An acknowledged write waiting in the write-behind queue.
pub struct Queued {
    conn: u64,
    oid: u64,
    action: Action,
    payload: Vec<u8>,
    /// The connection's budget, which the payload holds until it is applied.
    budget: Arc<PayloadBudget>,
}

/// Counts the request data in flight (write payloads, read replies); the
/// reader waits while there is too much.
///
/// Taken and given back on every read and write, so the common case is two
/// atomic operations: the mutex and condition variable are only for a
/// reader that must wait (a condition variable's notify is a system call
/// whether anyone waits or not, and cost random reads about a sixth of
/// their rate when every reply took and gave back through one).
pub struct PayloadBudget {
    used: AtomicU64,
    /// Readers waiting in [`take`](Self::take) (changed under `wait`).
    waiting: AtomicU64,
    wait: Mutex<()>,
    freed: Condvar,
    cap: u64,
}

impl PayloadBudget {
    fn new(cap: u64) -> Self {
        PayloadBudget {
            used: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            wait: Mutex::new(()),
            freed: Condvar::new(),
            cap,
        }
    }

    /// Takes `n` bytes if they fit (or nothing is held: a single larger
    /// request goes through alone); returns the bytes then held.
    fn try_take(&self, n: u64) -> Option<u64> {
        let fits = |used: u64| (used == 0 || used + n <= self.cap).then_some(used + n);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, fits)
            .ok()
            .map(|used| used + n)
    }

    /// Waits until `n` more bytes fit; returns the bytes then held.
    fn take(&self, n: u64) -> u64 {
        if let Some(held) = self.try_take(n) {
            return held;
        }
        let mut guard = self.wait.lock().unwrap_or_else(|e| e.into_inner());
        // Counted before the second try: a `give_back` after it sees the
        // waiter and notifies under the mutex, which this thread holds
        // until it waits, so no wake-up is lost.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let held = loop {
            if let Some(held) = self.try_take(n) {
                break held;
            }
            guard = self.freed.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        held
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _guard = self.wait.lock().unwrap_or_else(|e| e.into_inner());
            self.freed.notify_all();
        }
    }
}

/// The largest write the reader carries out itself (see [`runs_inline`]).
const INLINE_WRITE_MAX: u32 = 64 << 10;

/// The transmission phase until DISC or end of input: this thread reads and
/// checks requests; `workers_per_connection` threads carry them out and reply.
///
/// Replies from workers are sent at once. Replies from the reader (refusals,
/// requests it carries out itself) are written to the buffer and sent in one
/// batch before the reader next waits for input, so a burst of small writes
/// costs one `send` rather than one each, and no reply waits on a client that
/// is itself waiting for it.
fn transmission(
    shared: &Shared,
    id: u64,
    neg: &Negotiated,
    input: &mut BufReader<impl Read>,
    out: &mut BufWriter<Output>,
) -> io::Result<()> {
    let workers = shared.config.workers_per_connection.max(1);
    let out = Mutex::new(out);
    // One connection holds at most its own share of the server's budget
    // (so a client that stops reading replies cannot starve the others).
    let budget = Arc::new(PayloadBudget::new(INFLIGHT_PAYLOAD));
    // Write-behind failures before this connection started are not its to report.
    let seen_failures = AtomicU64::new(shared.behind().map_or(0, |b| b.failures()));
    // The first reply that could not be sent: the connection is over.
    let broken: Mutex<Option<io::Error>> = Mutex::new(None);
    let note_broken = |sent: io::Result<()>| {
        let Err(mut e) = sent else {
            return;
        };
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            let limit = shared.config.reply_timeout.unwrap_or_default();
            shared.stats.reply_timeouts.fetch_add(1, Ordering::Relaxed);
            e = io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no reply bytes for {limit:?}"),
            );
        }
        let mut broken = broken.lock().unwrap_or_else(|e| e.into_inner());
        if broken.is_none() {
            // The reader may be waiting for the client's next request: end
            // its wait too, so that the connection (and what it holds of
            // the server's budget) goes at once.
            if let Some(c) = shared.conns().get(&id) {
                c.stream.shutdown(Shutdown::Both);
            }
            *broken = Some(e);
        }
    };
    let reply = |req: &Request, result: Outcome, flush: bool| {
        // Counted before the wait for the output: a reply waiting its turn
        // is in memory too.
        let counted = shared.reply_ready(&result);
        let mut out = out.lock().unwrap_or_else(|e| e.into_inner());
        let sent = send_reply(shared, req, neg.structured, &result, &mut out);
        note_broken(sent.and_then(|()| if flush { out.flush() } else { Ok(()) }));
        drop(out);
        shared.reply_gone(counted);
        if let Ok(Some(data)) = result {
            shared.spare.give_back(data);
        }
    };
    let flush_replies = || note_broken(out.lock().unwrap_or_else(|e| e.into_inner()).flush());
    let (jobs, queue) = mpsc::sync_channel::<Job>(workers);
    let queue = Mutex::new(queue);
    let read_result = std::thread::scope(|scope| {
        for _ in 0..workers {
            let (queue, budget, reply, seen) = (&queue, &budget, &reply, &seen_failures);
            scope.spawn(move || loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(job) = next else {
                    return; // the reader is done and the queue is empty
                };
                let result = carry_out(
                    shared,
                    id,
                    neg.export.id,
                    job.action,
                    &job.payload,
                    job.mark,
                    seen,
                );
                // Released before the reply: a client that does not read its
                // replies must not keep payload memory held.
                shared.release(budget, job.payload.len() as u64);
                drop(job.payload);
                reply(&job.req, result, true);
                shared.release(budget, job.reply_bytes);
            });
        }
        // Dropping `jobs` on return lets the workers finish the queue and stop.
        read_requests(
            shared,
            id,
            neg,
            input,
            &budget,
            &reply,
            &flush_replies,
            &broken,
            &seen_failures,
            jobs,
        )
    });
    // The connection's acknowledged writes are in the store before it ends.
    if let Some(behind) = shared.behind() {
        behind.settle();
    }
    // Every worker has finished and replied by now.
    if let Some(e) = broken.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(e);
    }
    read_result?;
    out.into_inner().unwrap_or_else(|e| e.into_inner()).flush()
}

/// The reader of [`transmission`]: takes requests off the wire, answers the
/// invalid ones itself and queues the rest; returns at DISC or end of input.
#[allow(clippy::too_many_arguments)]
fn read_requests(
    shared: &Shared,
    id: u64,
    neg: &Negotiated,
    input: &mut BufReader<impl Read>,
    budget: &Arc<PayloadBudget>,
    reply: &(dyn Fn(&Request, Outcome, bool) + Sync),
    flush_replies: &dyn Fn(),
    broken: &Mutex<Option<io::Error>>,
    seen_failures: &AtomicU64,
    jobs: mpsc::SyncSender<Job>,
) -> io::Result<()> {
    let oid = neg.export.id;
    let store = &shared.store;
    let mut header = [0u8; REQUEST_LEN];
    // The export's size and the store's shrink count it was read at: asked
    // again only when something may have shrunk it (`Store::size` waits for
    // the engine lock, which the write-behind thread holds through each
    // write: asking on every request held up the replies).
    let mut known_size: Option<(u64, u64)> = None;
    loop {
        if broken.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return Ok(()); // the reply side failed; transmission reports it
        }
        if input.buffer().len() < REQUEST_LEN {
            flush_replies(); // the next read may wait for the client
        }
        let got = read_full(input, &mut header)?;
        if got == 0 {
            return Ok(()); // the client closed between requests
        }
        if got < REQUEST_LEN {
            return Err(truncated("a request header", got, REQUEST_LEN));
        }
        let req = match parse_request(&header) {
            Ok(Some(r)) => r,
            Ok(None) => unreachable!("a full header was read"),
            Err(e) => {
                return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        };
        shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        // The payload of a WRITE follows whatever is wrong with it: take it off the wire first.
        let plen = req.payload_len();
        let mut payload = Vec::new();
        if plen > 0 {
            if plen <= MAX_PAYLOAD {
                shared.hold(budget, plen as u64);
                if input.buffer().len() < plen as usize {
                    flush_replies();
                }
                payload.resize(plen as usize, 0);
                let got = read_full(input, &mut payload);
                let short = match got {
                    Ok(n) if n == plen as usize => None,
                    Ok(n) => Some(truncated("a write's data", n, plen as usize)),
                    Err(e) => Some(e),
                };
                if let Some(e) = short {
                    shared.release(budget, plen as u64);
                    return Err(e);
                }
            } else {
                let got = io::copy(&mut input.take(plen as u64), &mut io::sink())?;
                if got < plen as u64 {
                    return Err(truncated("a write's data", got as usize, plen as usize));
                }
            }
        }
        // The export may have shrunk since the handshake: honour the smaller size.
        let shrinks = store.shrink_generation();
        let size = match known_size {
            Some((at, size)) if at == shrinks => size,
            _ => {
                let size = match store.size(oid) {
                    Ok(s) => s.min(neg.export.size),
                    Err(e) => {
                        shared.log(&format!("connection {id}: export unavailable: {e}"));
                        0
                    }
                };
                known_size = Some((shrinks, size));
                size
            }
        };
        let limits = Limits {
            size,
            read_only: neg.export.read_only,
            structured: neg.structured,
            max_payload: MAX_PAYLOAD,
        };
        // What a request that is not queued must see: the writes
        // acknowledged before it arrived.
        let mark = || shared.behind().map_or(0, |b| b.mark());
        let checked = check(&req, &limits);
        // A read's reply is request data in memory like a write's payload:
        // held from now until it is sent (a client that stops reading its
        // replies is cut off after `reply_timeout`, which releases it).
        let reply_bytes = match checked {
            Ok(Action::Read { len, .. }) => u64::from(len),
            _ => 0,
        };
        shared.hold(budget, reply_bytes);
        match checked {
            // The caller waits for the requests in flight before it closes.
            Ok(Action::Disconnect) => return Ok(()),
            Ok(action @ Action::Write { fua: false, .. }) if shared.behind().is_some() => {
                let queued = Queued {
                    conn: id,
                    oid,
                    action,
                    payload,
                    budget: budget.clone(),
                };
                let behind = shared.behind().expect("checked above");
                let bytes = queued.payload.len() as u64;
                match behind.push(queued, bytes) {
                    Ok(()) => reply(&req, Ok(None), false),
                    // The applier is gone (only after a panic): carry it out here.
                    Err(q) => {
                        let result = execute(shared, id, oid, q.action, &q.payload);
                        shared.release(budget, q.payload.len() as u64);
                        reply(&req, result, false);
                    }
                }
            }
            // Nothing more has arrived (the client waits for this reply: queue
            // depth one), or a small write: the reader carries it out itself
            // and spares two thread switches.
            Ok(action) if input.buffer().is_empty() || runs_inline(&action) => {
                let result = carry_out(shared, id, oid, action, &payload, mark(), seen_failures);
                shared.release(budget, payload.len() as u64);
                reply(&req, result, false);
                shared.release(budget, reply_bytes);
            }
            Ok(action) => {
                let job = Job {
                    req,
                    action,
                    payload,
                    reply_bytes,
                    mark: mark(),
                };
                if let Err(mpsc::SendError(job)) = jobs.send(job) {
                    // No worker left (only after a panic).
                    shared.release(budget, job.payload.len() as u64);
                    shared.release(budget, job.reply_bytes);
                    return Ok(());
                }
            }
            Err(errno) => {
                shared.release(budget, payload.len() as u64);
                shared.log(&format!(
                    "connection {id}: refused {} ({}): {errno}",
                    describe(&req),
                    reason(&req, &limits, errno)
                ));
                reply(
                    &req,
                    Err((errno, format!("request refused: {errno}"))),
                    false,
                );
            }
        }
    }
}

/// A short description of a request for the log.
fn describe(req: &Request) -> String {
    let name = match req.kind {
        CMD_READ => "READ".to_string(),
        CMD_WRITE => "WRITE".to_string(),
        CMD_DISC => "DISC".to_string(),
        CMD_FLUSH => "FLUSH".to_string(),
        CMD_TRIM => "TRIM".to_string(),
        CMD_CACHE => "CACHE".to_string(),
        CMD_WRITE_ZEROES => "WRITE_ZEROES".to_string(),
        CMD_BLOCK_STATUS => "BLOCK_STATUS".to_string(),
        k => format!("command {k}"),
    };
    format!(
        "{name} flags {:#x} offset {} length {}",
        req.flags, req.offset, req.len
    )
}

fn reason(req: &Request, limits: &Limits, errno: Errno) -> &'static str {
    match errno {
        Errno::Perm => "read-only export",
        Errno::Overflow => "length over the maximum payload",
        Errno::NotSup => "fast zero cannot avoid writing",
        Errno::NoSpc => "past the end of the export",
        Errno::Inval if req.len > limits.max_payload && req.kind == CMD_WRITE => {
            "length over the maximum payload"
        }
        Errno::Inval
            if req
                .offset
                .checked_add(req.len as u64)
                .is_none_or(|e| e > limits.size) =>
        {
            "past the end of the export"
        }
        _ => "unknown command or flag",
    }
}

type Outcome = Result<Option<Vec<u8>>, (Errno, String)>;

/// Carries out a request that does not go to the write-behind queue: after
/// the queued writes it must see (`mark`), and reporting to a request that
/// flushes the queued writes that failed since the connection last heard.
fn carry_out(
    shared: &Shared,
    id: u64,
    oid: u64,
    action: Action,
    payload: &[u8],
    mark: u64,
    seen_failures: &AtomicU64,
) -> Outcome {
    let Some(behind) = shared.behind() else {
        return execute(shared, id, oid, action, payload);
    };
    behind.wait_for(mark);
    let flushes = matches!(
        action,
        Action::Flush
            | Action::Write { fua: true, .. }
            | Action::Trim { fua: true, .. }
            | Action::WriteZeroes { fua: true, .. }
    );
    let result = execute(shared, id, oid, action, payload);
    match flushes.then(|| behind.unreported(seen_failures)).flatten() {
        Some((errno, msg)) => {
            shared.log(&format!("connection {id}: replied {errno}: {msg}"));
            Err((errno, msg))
        }
        None => result,
    }
}

/// Carries out a valid request on the store.
fn execute(shared: &Shared, id: u64, oid: u64, action: Action, payload: &[u8]) -> Outcome {
    let store = &shared.store;
    let fail = |what: String, e: Error| {
        let errno = errno_of(&e);
        let kind = if matches!(e, Error::Corrupt(_)) {
            "INTEGRITY FAILURE"
        } else {
            "error"
        };
        shared.log(&format!(
            "connection {id}: {kind} in {what}: {e} (replied {errno})"
        ));
        (errno, format!("{what} failed: {errno}"))
    };
    let flush_if = |fua: bool, what: &str| -> Result<(), (Errno, String)> {
        if fua {
            shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
            store
                .flush()
                .map_err(|e| fail(format!("{what} with FUA (flush)"), e))?;
        }
        Ok(())
    };
    match action {
        Action::Read { offset, len } => {
            let mut data = shared.spare.take();
            let n = store
                .read_into(oid, offset, len as usize, &mut data)
                .map_err(|e| fail(format!("READ at {offset} length {len}"), e))?;
            // Short only if the export shrank under us: the rest reads as
            // zeros. (Shortening keeps the buffer's memory for its next use.)
            data.truncate(n);
            data.resize(len as usize, 0);
            Ok(Some(data))
        }
        Action::Write { offset, len, fua } => {
            if len > 0 {
                let data = &payload[..len as usize];
                let live = shared.liveness.get(&oid);
                let log = |l: &str| shared.log(l);
                let relearn = match live {
                    Some(l) => l
                        .before_write(store, offset, Some(data), len as u64, &log)
                        .map_err(|e| {
                            fail(
                                format!("WRITE at {offset} length {len} (inferred frees)"),
                                e,
                            )
                        })?,
                    None => false,
                };
                // Checked against the size under the engine lock too: the
                // export may have shrunk since the reader checked it (a
                // queued write is carried out later), and a write must not
                // grow it back.
                store
                    .write_inside(oid, offset, data)
                    .map_err(|e| fail(format!("WRITE at {offset} length {len}"), e))?;
                if let (Some(l), true) = (live, relearn) {
                    l.relearn(store, &log);
                }
            }
            flush_if(fua, "WRITE")?;
            Ok(None)
        }
        Action::Flush => {
            shared.stats.flushes.fetch_add(1, Ordering::Relaxed);
            store.flush().map_err(|e| fail("FLUSH".into(), e))?;
            Ok(None)
        }
        Action::Trim { offset, len, fua } => {
            shared.stats.trims.fetch_add(1, Ordering::Relaxed);
            let live = shared.liveness.get(&oid);
            if let Some(l) = live {
                l.trimmed();
            }
            if len > 0 && live.is_none_or(|l| l.trim_needed(offset, len as u64)) {
                store
                    .punch_hole(oid, offset, len as u64)
                    .map_err(|e| fail(format!("TRIM at {offset} length {len}"), e))?;
            }
            flush_if(fua, "TRIM")?;
            Ok(None)
        }
        Action::WriteZeroes {
            offset,
            len,
            fua,
            punch,
        } => {
            let what = || format!("WRITE_ZEROES at {offset} length {len}");
            if punch {
                shared.stats.trims.fetch_add(1, Ordering::Relaxed);
                let live = shared.liveness.get(&oid);
                if let Some(l) = live {
                    l.trimmed();
                }
                if len > 0 && live.is_none_or(|l| l.trim_needed(offset, len as u64)) {
                    store
                        .punch_hole(oid, offset, len as u64)
                        .map_err(|e| fail(what(), e))?;
                }
            } else {
                let live = shared.liveness.get(&oid);
                let log = |l: &str| shared.log(l);
                let relearn = match live {
                    Some(l) => l
                        .before_write(store, offset, None, len as u64, &log)
                        .map_err(|e| fail(what(), e))?,
                    None => false,
                };
                let zeros = vec![0u8; (len as usize).min(1 << 20)];
                let end = offset + len as u64;
                let mut pos = offset;
                while pos < end {
                    let n = (end - pos).min(zeros.len() as u64) as usize;
                    store
                        .write_inside(oid, pos, &zeros[..n])
                        .map_err(|e| fail(what(), e))?;
                    pos += n as u64;
                }
                if let (Some(l), true) = (live, relearn) {
                    l.relearn(store, &log);
                }
            }
            flush_if(fua, "WRITE_ZEROES")?;
            Ok(None)
        }
        Action::Cache => Ok(None),
        Action::Disconnect => Ok(None),
    }
}

fn send_reply(
    shared: &Shared,
    req: &Request,
    structured: bool,
    result: &Outcome,
    out: &mut BufWriter<Output>,
) -> io::Result<()> {
    match (result, structured) {
        (Ok(data), false) => {
            out.write_all(&reply::simple_reply(req.cookie, 0))?;
            if let Some(d) = data {
                out.write_all(d)?;
            }
        }
        (Ok(Some(d)), true) if !d.is_empty() => {
            out.write_all(&reply::chunk_data_header(
                req.cookie,
                req.offset,
                d.len() as u32,
            ))?;
            out.write_all(d)?;
        }
        (Ok(_), true) => out.write_all(&reply::chunk_done(req.cookie))?,
        (Err((errno, _)), false) => {
            shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            out.write_all(&reply::simple_reply(req.cookie, errno.code()))?;
        }
        (Err((errno, msg)), true) => {
            shared.stats.errors.fetch_add(1, Ordering::Relaxed);
            out.write_all(&reply::chunk_error(req.cookie, *errno, msg))?;
        }
    }
    Ok(())
}

/// Whether the reader carries out a request itself even though more are
/// waiting behind it: writes of at most [`INLINE_WRITE_MAX`] bytes without FUA.
///
/// A small write is sealed in microseconds and the rest of its work is under
/// the engine lock, so handing it to a worker buys no overlap: it costs two
/// thread switches, and at queue depth 16 the workers queue on the engine
/// lock (futex waits were over half of the server's time in a profile of fio
/// random 4 KiB writes). Reads and large writes still go to the workers,
/// which overlap their I/O and crypto; FUA writes and flushes wait for a
/// sync, which must not hold up the requests behind them.
fn runs_inline(action: &Action) -> bool {
    matches!(action, Action::Write { len, fua: false, .. } if *len <= INLINE_WRITE_MAX)
}
