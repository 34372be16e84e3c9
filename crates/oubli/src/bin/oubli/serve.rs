//! `oubli serve`: an export of the store as an NBD block device (oubli-nbd), in the foreground, on which TRIM and discard erase at the next commit.
//!
//! The process holds the store open: it commits on the epoch policy
//! (checked every second), at once on SIGUSR1 or `oubli commit` (through the
//! store's control socket), and on SIGTERM / SIGINT after closing every
//! connection, before it exits.

use crate::failure::Failure;
use crate::session::{self, Access, Global};
use crate::ui;
use oubli::control::Frontend;
use oubli::{EpochPolicy, Store};
use oubli_nbd::{Endpoint, ServerConfig, Tls, TlsCredentials, TlsMode};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `oubli serve`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").multiple(true).args(["socket", "listen"])))]
pub struct ServeArgs {
    /// The export to serve (created with --size if missing; also the default export)
    #[arg(long, value_name = "NAME")]
    export: String,
    /// Export size, e.g. 1G, 512M, 4096 (needed to create it; may grow it, never shrinks it)
    #[arg(long, value_name = "SIZE", value_parser = ui::parse_size)]
    size: Option<u64>,
    /// Listen on a Unix socket at PATH (mode 0600)
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Listen on TCP at HOST:PORT: needs --tls-certificates, or --tls=off on a loopback address
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// TLS: require (the default on TCP), on (for clients that ask), off (loopback TCP only). Applies to --socket too when given [default on --socket: off]
    #[arg(long, value_name = "MODE", value_enum)]
    tls: Option<TlsArg>,
    /// Directory with ca-cert.pem, server-cert.pem and server-key.pem; clients must present a certificate signed by that CA (make them with scripts/nbd-certs, see docs/NBD.md)
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// Take an automatic snapshot this often (e.g. 1h, 1d): named auto-YYYYMMDD-HHMMSS
    #[arg(long, value_name = "DURATION", value_parser = crate::ui::parse_duration)]
    snapshot_every: Option<u64>,
    /// Write the store's figures in Prometheus' text format to PATH at every commit
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
    /// Keep at most N automatic snapshots (the oldest are removed, and erased at the next commit)
    #[arg(long, value_name = "N")]
    snapshot_keep: Option<usize>,
    /// Commit at most this many seconds after a change (0: never on time)
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    epoch_interval: u64,
    /// Commit once this many bytes were written in the epoch (0: never on volume)
    #[arg(long, value_name = "SIZE", value_parser = ui::parse_size, default_value = "1G")]
    epoch_bytes: u64,
    /// Commit after this many deletions (trims, overwrites...) in the epoch (0: never on count)
    #[arg(long, value_name = "N", default_value_t = 1000)]
    epoch_deletions: u64,
    /// Erase what the file system frees without TRIM: ext4 (follow its journal's committed block bitmaps), or off. Stored with the export: later runs keep it (docs/NBD.md, "Implicit deletes")
    #[arg(long, value_name = "FS", value_enum)]
    infer_deletes: Option<InferArg>,
}

/// `--infer-deletes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InferArg {
    /// ext4 with its internal jbd2 journal
    Ext4,
    /// Only TRIM, discard and write-zeroes erase
    Off,
}

/// `--tls`: nbdkit's modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsArg {
    /// Every client must start TLS and present a certificate from the CA
    Require,
    /// TLS for clients that ask; others are served in the clear
    On,
    /// No TLS
    Off,
}

impl From<TlsArg> for TlsMode {
    fn from(a: TlsArg) -> TlsMode {
        match a {
            TlsArg::Require => TlsMode::Require,
            TlsArg::On => TlsMode::On,
            TlsArg::Off => TlsMode::Off,
        }
    }
}

/// How to get certificates, for the messages that ask for them.
const HOW_TO_CERTIFY: &str = "give --tls-certificates DIR holding ca-cert.pem, \
server-cert.pem and server-key.pem; clients then need a certificate signed by that CA. Make \
them with certtool (Debian gnutls-bin) by running `scripts/nbd-certs DIR` from the oubli \
sources (DIR/server for oubli, DIR/client for the clients), or with openssl as docs/NBD.md \
(\"TLS\") shows";

/// The TLS modes of the TCP and the Unix endpoints, or why the options are refused.
/// Plain TCP is allowed only on a loopback address and only when asked for.
fn tls_modes(
    tls: Option<TlsArg>,
    certificates: bool,
    listen: Option<&SocketAddr>,
) -> Result<(TlsMode, TlsMode), Failure> {
    let usage = |message: String, hint: &str| Failure::new(oubli::exit::USAGE, message, hint);
    if let (Some(mode @ (TlsArg::Require | TlsArg::On)), false) = (tls, certificates) {
        return Err(usage(
            format!("--tls={} needs certificates", mode_name(mode)),
            HOW_TO_CERTIFY,
        ));
    }
    let unix = tls.map_or(TlsMode::Off, TlsMode::from);
    let tcp = match (tls, certificates) {
        (Some(mode), _) => TlsMode::from(mode),
        (None, true) => TlsMode::Require,
        (None, false) => match listen {
            Some(addr) => {
                return Err(usage(
                    format!(
                        "--listen {addr} without TLS: anyone who can reach the port would read \
                         and write the device"
                    ),
                    &format!("{HOW_TO_CERTIFY}; or, on a loopback address only, --tls=off"),
                ))
            }
            None => TlsMode::Off,
        },
    };
    if let Some(addr) = listen {
        if tcp.allows_plain() && !addr.ip().is_loopback() {
            return Err(usage(
                format!(
                    "--listen {addr} with --tls={}: plain NBD on an address other machines \
                     can reach would let them read and write the device",
                    if tcp == TlsMode::On { "on" } else { "off" }
                ),
                &format!(
                    "use --tls=require (the default with --tls-certificates); {HOW_TO_CERTIFY}; \
                     or listen on a loopback address (127.0.0.1, ::1)"
                ),
            ));
        }
    }
    Ok((tcp, unix))
}

fn mode_name(mode: TlsArg) -> &'static str {
    match mode {
        TlsArg::Require => "require",
        TlsArg::On => "on",
        TlsArg::Off => "off",
    }
}

/// Loads the certificate directory; an unusable one is a usage error, a
/// private key other users can read a warning.
fn load_credentials(dir: &Path) -> Result<TlsCredentials, Failure> {
    let key = session::absolute(dir).join(oubli_nbd::tls::SERVER_KEY);
    if let Some(warning) = std::fs::metadata(&key)
        .ok()
        .and_then(|meta| crate::privacy::secret_file_warning("TLS private key", &key, &meta))
    {
        log(&warning);
    }
    TlsCredentials::load(&session::absolute(dir)).map_err(|e| {
        Failure::new(
            oubli::exit::USAGE,
            format!("--tls-certificates: {e}"),
            HOW_TO_CERTIFY,
        )
    })
}

/// The cell size that matches a file system's block: a write of one block seals one cell.
const BLOCK_DEVICE_CELL: u32 = 4096;

fn log(line: &str) {
    eprintln!("oubli serve: {line}");
}

/// `oubli serve`.
pub fn serve(g: &Global, a: ServeArgs) -> Result<String, Failure> {
    let nonzero = |v: u64| (v > 0).then_some(v);
    let policy = EpochPolicy {
        interval: nonzero(a.epoch_interval).map(Duration::from_secs),
        bytes: nonzero(a.epoch_bytes),
        deletions: nonzero(a.epoch_deletions),
    };
    let mut endpoints = Vec::new();
    if let Some(p) = &a.socket {
        endpoints.push(Endpoint::Unix(session::absolute(p)));
    }
    let listen = match &a.listen {
        Some(l) => Some(
            l.to_socket_addrs()
                .ok()
                .and_then(|mut it| it.next())
                .ok_or_else(|| Failure::usage(format!("--listen {l:?} is not HOST:PORT")))?,
        ),
        None => None,
    };
    if let Some(addr) = listen {
        endpoints.push(Endpoint::Tcp(addr));
    }
    // Sockets from systemd (socket activation): a TCP one follows --listen's rules.
    let mut listen = listen;
    for fd in oubli_nbd::socket::systemd_listeners() {
        if let Some(addr) = oubli_nbd::socket::tcp_address_of(fd) {
            if listen.is_some() {
                return Err(Failure::usage(
                    "one TCP address at most: --listen, or one TCP socket from systemd",
                ));
            }
            listen = Some(addr);
        }
        endpoints.push(Endpoint::Inherited(fd));
    }
    if endpoints.is_empty() {
        return Err(Failure::usage(
            "nowhere to listen: give --socket PATH or --listen HOST:PORT, or start oubli serve from a systemd socket unit",
        ));
    }
    // Refused before the password is asked for and the store opened.
    let (tcp_tls, unix_tls) = tls_modes(a.tls, a.tls_certificates.is_some(), listen.as_ref())?;
    let tls = match &a.tls_certificates {
        Some(dir) if tcp_tls != TlsMode::Off || unix_tls != TlsMode::Off => Some(Tls {
            credentials: load_credentials(dir)?,
            tcp: tcp_tls,
            unix: unix_tls,
        }),
        _ => None,
    };

    // `NAME@SNAP`: the export as it was in a snapshot, read-only.
    let (export_name, snapshot) = match a.export.split_once('@') {
        Some((name, snap)) => (name.to_string(), Some(snap.to_string())),
        None => (a.export.clone(), None),
    };
    if snapshot.is_some() && a.size.is_some() {
        return Err(Failure::usage(format!(
            "--export {} serves a snapshot, read-only: --size cannot create or grow it",
            a.export
        )));
    }
    let retention = oubli::retention::Retention {
        every: a.snapshot_every.map(Duration::from_secs),
        keep: a.snapshot_keep,
        protected: snapshot.clone(),
    };

    // As `Global::open`, with the epoch policy of the command line.
    g.require_store()?;
    let _lock = g.lock(Access::Write)?;
    let provider = session::provider();
    let password = g.password()?;
    let vault = Arc::new(g.open_vault_at(&g.vault, &password, &provider)?);
    let shares = g.share_opener(&password, &provider);
    drop(password);
    let medium = g
        .open_medium(session::Access::Write)
        .map_err(|e| g.fail(e))?;
    let options = g.long_running_options(&provider, policy);
    let store = Arc::new(Store::open(medium, vault, options).map_err(|e| g.fail(e))?);
    store.set_share_opener(shares);
    g.collect_orphans(&store);

    // What the clients see: the live store, or a snapshot's read-only view.
    let served = match &snapshot {
        Some(snap) => Arc::new(store.snapshot(snap).map_err(|e| g.fail(e))?),
        None => store.clone(),
    };
    let export = match oubli_nbd::lookup_export(&served, &export_name).map_err(|e| g.fail(e))? {
        None if snapshot.is_some() => {
            return Err(g.fail(oubli::Error::NoName(format!(
                "export {export_name} in snapshot {}",
                snapshot.as_deref().unwrap_or_default()
            ))))
        }
        None => {
            let size = a.size.ok_or_else(|| {
                Failure::usage(format!(
                    "export {:?} does not exist: give --size to create it",
                    export_name
                ))
            })?;
            oubli_nbd::create_export(&store, &export_name, size).map_err(|e| g.fail(e))?
        }
        Some(e) => match a.size {
            Some(size) if size > e.size => {
                oubli_nbd::resize_export(&store, &export_name, size).map_err(|e| g.fail(e))?
            }
            Some(size) if size < e.size => {
                return Err(Failure::usage(format!(
                    "export {:?} is {} bytes; --size {size} would shrink it (and erase its tail)",
                    export_name, e.size
                )))
            }
            _ => e,
        },
    };
    // Delete inference: the export's stored setting, changed by --infer-deletes.
    let mut settings = oubli_nbd::export_settings(&served, export.oid).map_err(|e| g.fail(e))?;
    if let Some(arg) = a.infer_deletes {
        if snapshot.is_some() && arg == InferArg::Ext4 {
            return Err(Failure::usage(
                "--infer-deletes: a snapshot is served read-only, nothing is deleted on it",
            ));
        }
        settings.infer_ext4 = arg == InferArg::Ext4;
    }
    let liveness = if settings.infer_ext4 && snapshot.is_none() {
        oubli_nbd::Liveness::ext4(&store, &export.name, export.oid).map_err(|u| {
            Failure::new(
                oubli::exit::USAGE,
                format!(
                    "--infer-deletes ext4: export {:?} holds a file system whose deletions cannot be inferred: {u}",
                    export.name
                ),
                "serve it with --infer-deletes off (TRIM, discard and fstrim still erase), or make an ext4 \
                 with its internal journal and without fast_commit or bigalloc",
            )
        })?
    } else {
        oubli_nbd::Liveness::plain(&export.name, export.oid)
    };
    if snapshot.is_none() && a.infer_deletes.is_some() {
        oubli_nbd::set_export_settings(&store, export.oid, &settings).map_err(|e| g.fail(e))?;
    }
    let liveness = Arc::new(liveness);
    store.flush().map_err(|e| g.fail(e))?;

    // Signals: TERM/INT stop (a second INT exits at once), USR1 commits.
    let stop = Arc::new(AtomicBool::new(false));
    let purge = Arc::new(AtomicBool::new(false));
    let register = || -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, stop.clone())?;
        signal_hook::flag::register(SIGINT, stop.clone())?;
        signal_hook::flag::register(SIGTERM, stop.clone())?;
        signal_hook::flag::register(SIGUSR1, purge.clone())?;
        Ok(())
    };
    register().map_err(|e| Failure::file("installing signal handlers", e))?;

    // Writes acknowledged before they are carried out (oubli_nbd::WriteBehind):
    // every commit asked for from outside waits for them, so an overwrite
    // acknowledged before `oubli commit` is erased by it.
    let behind = Arc::new(oubli_nbd::WriteBehind::new());
    // `oubli commit` / `purge` / `status` reach this process through the store's control socket.
    let control_path = oubli::control::socket_path(&g.store);
    let control = oubli::control::ControlServer::start(
        &control_path,
        store.clone(),
        served_status(g.store.clone(), liveness.clone()),
        Some(match snapshot.clone() {
            Some(s) => Arc::new(ServedSnapshot(s)) as Arc<dyn Frontend>,
            None => Arc::new(ServedLive(behind.clone())),
        }),
    )
    .map_err(|e| Failure::file(format!("control socket {}", control_path.display()), e))?;

    let server = oubli_nbd::serve(
        served.clone(),
        &endpoints,
        ServerConfig {
            // A snapshot is served read-only; commits are the live store's (below).
            read_only: snapshot.is_some(),
            commit_on_shutdown: snapshot.is_none(),
            default_export: Some(export.name.clone()),
            // Only the export asked for: the store's others stay out of reach.
            exports: Some(vec![export.name.clone()]),
            tls,
            log: Arc::new(log),
            // The ext4 tracker's journal and written ranges are held
            // within the same cap as request data (DESIGN.md, "Memory is
            // bounded"): 256 MiB in all.
            max_inflight_bytes: ServerConfig::default()
                .max_inflight_bytes
                .saturating_sub(liveness.tracker_budget()),
            liveness: vec![liveness.clone()],
            write_behind: Some(behind.clone()),
            ..ServerConfig::default()
        },
    )
    .map_err(|e| Failure::file("starting the NBD server", e))?;
    if settings.infer_ext4 && snapshot.is_none() {
        log(&format!(
            "export {:?}: deletions are inferred from its ext4 journal (--infer-deletes ext4): \
             blocks a committed transaction frees are erased at the next commit, without TRIM",
            export.name
        ));
    }
    log(&format!(
        "serving export {:?}{} ({} bytes) at epoch {}; SIGUSR1 commits, SIGTERM/SIGINT commit and stop",
        export.name,
        snapshot
            .as_ref()
            .map_or(String::new(), |s| format!(" as of snapshot {s}, read-only")),
        export.size,
        store.epoch()
    ));
    if let Ok(cells) = store.cell_size_of(export.oid) {
        if cells > BLOCK_DEVICE_CELL {
            // Each 4 KiB write then re-encrypts a whole cell (docs/NBD.md, Performance).
            log(&format!(
                "note: this export's cells are {cells} bytes (it was made before exports \
                 got 4 KiB cells); a file system on the device writes 4 KiB blocks, so \
                 random writes rewrite whole cells. A new export avoids it"
            ));
        }
    }

    let mut last_tick = Instant::now();
    let mut metrics = a
        .metrics_file
        .as_deref()
        .map(|p| oubli::metrics::MetricsFile::new(&session::absolute(p), &g.store));
    if let Some(Err(e)) = metrics.as_mut().map(|m| m.tick(&store)) {
        log(&e);
    }
    let mut logged_epoch = store.epoch();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        if purge.swap(false, Ordering::SeqCst) {
            behind.settle();
            match store.commit() {
                Ok(()) => {
                    logged_epoch = store.epoch();
                    log(&format!("committed epoch {logged_epoch} (SIGUSR1)"));
                }
                Err(e) => log(&format!("commit failed: {e}")),
            }
        }
        if last_tick.elapsed() >= Duration::from_secs(1) {
            last_tick = Instant::now();
            if let Some(Err(e)) = metrics.as_mut().map(|m| m.tick(&store)) {
                log(&e);
            }
            store.tick();
            // The commits since the last tick: the tick's, those the
            // committer thread made after a change, and those asked for on
            // the control socket (`oubli commit`).
            let epoch = store.epoch();
            if epoch != logged_epoch {
                log(&format!(
                    "committed epoch {epoch} (policy or control socket)"
                ));
                logged_epoch = epoch;
            }
            match oubli::retention::tick(&store, &retention, ui::now()) {
                Ok(events) => {
                    for event in events {
                        log(&event.to_string());
                    }
                }
                Err(e) => log(&format!("snapshot retention failed: {e}")),
            }
        }
    }
    log("stopping: closing connections and committing");
    let mut last = server.shutdown();
    if snapshot.is_some() && last.is_ok() {
        last = store.commit();
    }
    drop(control);
    if let Err(e) = last {
        return Err(unfinished(g, &store, e));
    }
    Ok(format!(
        "stopped; epoch {} committed: everything trimmed or deleted before is unrecoverable\n",
        store.epoch()
    ))
}

/// The failure of a stop whose last commit failed: the exit code of the
/// cause (6 when the vault refused it), the deletions still recoverable,
/// and whether the writes reached the intent log at least.
fn unfinished(g: &Global, store: &Store, commit: oubli::Error) -> Failure {
    let flush = store.flush().err();
    let pending = store
        .status()
        .map(|s| s.pending_deletions)
        .unwrap_or_default();
    let mut message = format!("stopped, but the last commit failed: {commit}");
    if let Some(e) = &flush {
        message.push_str(&format!(
            "; writes since the last flush were not stored: {e}"
        ));
    }
    if pending > 0 {
        let what = "deletions (TRIMs, discards, overwrites)";
        message.push_str(&match flush {
            None if pending == 1 => {
                "; 1 deletion (TRIM, discard, overwrite) is still recoverable".into()
            }
            None => format!("; {pending} {what} are still recoverable"),
            // Those in the intent log stay pending; the others were never stored.
            Some(_) if pending == 1 => "; 1 deletion (TRIM, discard, overwrite) was not committed: if it was flushed before, it stays recoverable, otherwise it is undone".into(),
            Some(_) => format!(
                "; {pending} {what} were not committed: those flushed before stay recoverable, the others are undone"
            ),
        });
    }
    let code = oubli::exit_code(flush.as_ref().unwrap_or(&commit));
    let hint = crate::mount::finish_hint(g, true, flush.is_some());
    Failure::new(code, message, hint)
}

/// The control socket's status: the store's, plus the served export's
/// TRIMs and inferred deletions.
fn served_status(
    store_path: PathBuf,
    liveness: Arc<oubli_nbd::Liveness>,
) -> Arc<oubli::control::StatusRenderer> {
    Arc::new(move |store: &Store| {
        let mut report =
            oubli::report::status_report(store, &store_path, true).map_err(|e| e.to_string())?;
        let r = liveness.report();
        report.nbd_exports = vec![oubli::report::NbdExportReport {
            name: r.export,
            trims_received: r.trims_received,
            infer_deletes: r.infer_deletes,
            deletions_inferred_blocks: r.counters.freed_inferred,
            deletions_inferred_bytes: r.inferred_bytes,
            suspicious_kept: r.counters.suspicious_kept,
            suspicious_now: r.counters.suspicious_now,
            commits_seen: r.counters.commits,
            inference_stopped: r.stopped,
        }];
        Ok(serde_json::to_string(&report).expect("plain data"))
    })
}

/// The live store's front-end: a control request runs once every write
/// acknowledged before it is in the store.
struct ServedLive(Arc<oubli_nbd::WriteBehind>);

impl Frontend for ServedLive {
    fn quiesced(&self, f: &mut dyn FnMut()) {
        self.0.settle();
        f()
    }

    fn answer(&self, _line: &str) -> Option<Result<String, oubli::control::Refusal>> {
        None
    }
}

/// Keeps the snapshot this process serves from being removed under its
/// clients: they read through a view that holds its keys, so a removal
/// would not erase what they can still read.
struct ServedSnapshot(String);

impl Frontend for ServedSnapshot {
    fn quiesced(&self, f: &mut dyn FnMut()) {
        f()
    }

    fn answer(&self, line: &str) -> Option<Result<String, oubli::control::Refusal>> {
        let (_, name) = line.strip_prefix("snapshot-rm ")?.split_once(' ')?;
        (name == self.0).then(|| {
            Err(oubli::control::Refusal::new(
                oubli::exit::BUSY,
                format!(
                    "snapshot {name} is being served by this process (oubli serve --export ...@{name}): stop the server first"
                ),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{tls_modes, TlsArg};
    use crate::ui::parse_size;
    use oubli_nbd::TlsMode;

    #[test]
    fn tls_options() {
        let lo: std::net::SocketAddr = "127.0.0.1:10809".parse().unwrap();
        let lo6: std::net::SocketAddr = "[::1]:10809".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:10809".parse().unwrap();
        let modes = |tls, certs, listen| tls_modes(tls, certs, listen).map_err(|f| f.code);
        use TlsMode::*;
        // Certificates: TCP requires TLS, the Unix socket stays plain unless told.
        assert_eq!(modes(None, true, Some(&any)), Ok((Require, Off)));
        assert_eq!(
            modes(Some(TlsArg::Require), true, None),
            Ok((Require, Require))
        );
        assert_eq!(modes(Some(TlsArg::On), true, Some(&lo)), Ok((On, On)));
        // Plain TCP: only on loopback, only when asked.
        assert_eq!(modes(Some(TlsArg::Off), false, Some(&lo)), Ok((Off, Off)));
        assert_eq!(modes(Some(TlsArg::Off), false, Some(&lo6)), Ok((Off, Off)));
        assert_eq!(modes(None, false, None), Ok((Off, Off)));
        for refused in [
            modes(None, false, Some(&lo)),
            modes(Some(TlsArg::Off), true, Some(&any)),
            modes(Some(TlsArg::On), true, Some(&any)),
            modes(Some(TlsArg::Require), false, None),
            modes(Some(TlsArg::On), false, Some(&lo)),
        ] {
            assert_eq!(refused, Err(2));
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2tb"), Ok(2 << 40));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
