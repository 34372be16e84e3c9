//! `oubli serve`: an export of the store as an NBD block device (oubli-nbd), in the foreground, on which TRIM and discard erase at the next commit.
//!
//! The process holds the store open: it commits on the epoch policy
//! (checked every second), at once on SIGUSR1 or `oubli commit` (through the
//! store's control socket), and on SIGTERM / SIGINT after closing every
//! connection, before it exits.

use crate::failure::Failure;
use crate::session::{self, Access, Global};
use crate::ui;
use oubli::{EpochPolicy, Store};
use oubli_nbd::{Endpoint, ServerConfig};
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `oubli serve`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("endpoint").required(true).multiple(true).args(["socket", "listen"])))]
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
    /// Listen on TCP at HOST:PORT: only on a loopback address, and only with --tls=off (see docs/NBD.md)
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// TLS on the TCP listener. This build serves plain NBD only, so --listen needs an explicit --tls=off and a loopback address
    #[arg(long, value_name = "MODE", value_enum)]
    tls: Option<TlsMode>,
    /// Commit at most this many seconds after a change (0: never on time)
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    epoch_interval: u64,
    /// Commit once this many bytes were written in the epoch (0: never on volume)
    #[arg(long, value_name = "SIZE", value_parser = ui::parse_size, default_value = "1G")]
    epoch_bytes: u64,
    /// Commit after this many deletions (trims, overwrites...) in the epoch (0: never on count)
    #[arg(long, value_name = "N", default_value_t = 1000)]
    epoch_deletions: u64,
}

/// `--tls`: how the TCP listener treats TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// Plain NBD (loopback addresses only).
    Off,
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
    if let Some(l) = &a.listen {
        let addrs: Vec<_> = l
            .to_socket_addrs()
            .map_err(|_| Failure::usage(format!("--listen {l:?} is not HOST:PORT")))?
            .collect();
        let addr = *addrs
            .first()
            .ok_or_else(|| Failure::usage(format!("--listen {l:?} is not HOST:PORT")))?;
        // Whoever reaches a plain NBD port reads and writes the decrypted
        // device: never by accident, never beyond this machine.
        if a.tls != Some(TlsMode::Off) || !addrs.iter().all(|a| a.ip().is_loopback()) {
            return Err(Failure::usage(format!(
                "refusing to serve --listen {l}: plain NBD over TCP has no authentication and no \
                 encryption, so anyone who reaches the port reads and writes the decrypted device. \
                 Serve on a Unix socket instead (--socket PATH, mode 0600), or, if every local user \
                 may connect, on a loopback address with --tls=off (e.g. --listen 127.0.0.1:10809 \
                 --tls=off) and reach it from elsewhere through an authenticated tunnel (ssh -L). \
                 NBD over TLS (client certificates) is not in this version of oubli serve."
            )));
        }
        endpoints.push(Endpoint::Tcp(addr));
    } else if a.tls.is_some() {
        return Err(Failure::usage("--tls applies to --listen only"));
    }

    // As `Global::open`, with the epoch policy of the command line.
    g.require_store()?;
    let _lock = g.lock(Access::Write)?;
    let provider = session::provider();
    let password = g.password()?;
    let vault = Arc::new(g.open_vault_at(&g.vault, &password, &provider)?);
    drop(password);
    let medium = oubli::open_dir_medium(&g.store).map_err(|e| g.fail(e))?;
    let options = g.long_running_options(&provider, policy);
    let store = Arc::new(Store::open(Arc::new(medium), vault, options).map_err(|e| g.fail(e))?);

    let export = match oubli_nbd::lookup_export(&store, &a.export).map_err(|e| g.fail(e))? {
        None => {
            let size = a.size.ok_or_else(|| {
                Failure::usage(format!(
                    "export {:?} does not exist: give --size to create it",
                    a.export
                ))
            })?;
            oubli_nbd::create_export(&store, &a.export, size).map_err(|e| g.fail(e))?
        }
        Some(e) => match a.size {
            Some(size) if size > e.size => {
                oubli_nbd::resize_export(&store, &a.export, size).map_err(|e| g.fail(e))?
            }
            Some(size) if size < e.size => {
                return Err(Failure::usage(format!(
                    "export {:?} is {} bytes; --size {size} would shrink it (and erase its tail)",
                    a.export, e.size
                )))
            }
            _ => e,
        },
    };
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

    // `oubli commit` / `purge` / `status` reach this process through the store's control socket.
    let control_path = oubli::control::socket_path(&g.store);
    let control = oubli::control::ControlServer::start(
        &control_path,
        store.clone(),
        oubli::report::control_status(g.store.clone()),
    )
    .map_err(|e| Failure::file(format!("control socket {}", control_path.display()), e))?;

    let server = oubli_nbd::serve(
        store.clone(),
        &endpoints,
        ServerConfig {
            default_export: Some(export.name.clone()),
            // Only the export asked for, whatever else the store holds.
            exports: Some(vec![export.name.clone()]),
            log: Arc::new(log),
            ..ServerConfig::default()
        },
    )
    .map_err(|e| Failure::file("starting the NBD server", e))?;
    log(&format!(
        "serving export {:?} ({} bytes) at epoch {}; SIGUSR1 commits, SIGTERM/SIGINT commit and stop",
        export.name,
        export.size,
        store.epoch()
    ));
    if let Ok(status) = store.status() {
        if status.cell_size > BLOCK_DEVICE_CELL {
            // Each 4 KiB write then re-encrypts a whole cell (docs/NBD.md, Performance).
            log(&format!(
                "note: this store's cells are {} bytes; a file system on the device writes \
                 4 KiB blocks, so random writes rewrite whole cells. A store made for a \
                 block device (oubli init --cell-size 4K) avoids it",
                status.cell_size
            ));
        }
    }

    let mut last_tick = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        if purge.swap(false, Ordering::SeqCst) {
            match store.commit() {
                Ok(()) => log(&format!("committed epoch {} (SIGUSR1)", store.epoch())),
                Err(e) => log(&format!("commit failed: {e}")),
            }
        }
        if last_tick.elapsed() >= Duration::from_secs(1) {
            last_tick = Instant::now();
            let before = store.epoch();
            store.tick();
            if store.epoch() != before {
                log(&format!("committed epoch {} (policy)", store.epoch()));
            }
        }
    }
    log("stopping: closing connections and committing");
    server.shutdown().map_err(|e| g.fail(e))?;
    drop(control);
    Ok(format!(
        "stopped; epoch {} committed: everything trimmed or deleted before is unrecoverable\n",
        store.epoch()
    ))
}

#[cfg(test)]
mod tests {
    use crate::ui::parse_size;

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
