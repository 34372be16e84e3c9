//! `--metrics-file PATH` of `oubli mount` and `oubli serve`: the store's figures in Prometheus' text format, rewritten at every commit (for node_exporter's textfile collector or any scraper).

use crate::report::StatusReport;
use std::io;
use std::path::Path;

/// One metric: name, type, help, value.
type Metric = (&'static str, &'static str, &'static str, f64);

/// The report in Prometheus' text exposition format, every metric
/// labelled with the store's path.
pub fn render(r: &StatusReport) -> String {
    let metrics: [Metric; 15] = [
        ("oubli_epoch", "gauge", "Current epoch: commits so far, plus one.", r.epoch as f64),
        (
            "oubli_last_commit_timestamp_seconds",
            "gauge",
            "When the last commit ended (Unix time).",
            r.committed_at as f64,
        ),
        (
            "oubli_pending_deletions",
            "gauge",
            "Deletions since the last commit: recoverable until the next one.",
            r.pending_deletions as f64,
        ),
        (
            "oubli_pending_erasure_bytes",
            "gauge",
            "Sealed bytes those deletions freed.",
            r.pending_erasure_bytes as f64,
        ),
        (
            "oubli_bytes_written_this_epoch",
            "gauge",
            "Bytes written since the last commit.",
            r.bytes_written_this_epoch as f64,
        ),
        ("oubli_live_bytes", "gauge", "Bytes of live data.", r.live_bytes as f64),
        ("oubli_dead_bytes", "gauge", "Bytes on the medium no root reaches (reclaimed by gc).", r.dead_bytes as f64),
        ("oubli_medium_bytes", "gauge", "Bytes the medium holds.", r.medium_bytes as f64),
        ("oubli_segments", "gauge", "Segments on the medium.", r.segments as f64),
        ("oubli_snapshots", "gauge", "Snapshots kept.", r.snapshots as f64),
        (
            "oubli_vault_writes_total",
            "counter",
            "Writes to the vault so far (its wear), when the vault counts them.",
            r.vault.writes.map_or(f64::NAN, |w| w as f64),
        ),
        (
            "oubli_erasure_incomplete",
            "gauge",
            "1 while the vault still holds an older epoch's key (a rotation cut between its steps).",
            if r.vault_leftover_epochs.is_empty() { 0.0 } else { 1.0 },
        ),
        (
            "oubli_space_available_bytes",
            "gauge",
            "Bytes new data may still take: free space less the reserve and the write buffer (NaN when the medium cannot tell).",
            r.space.as_ref().map_or(f64::NAN, |s| s.available as f64),
        ),
        (
            "oubli_space_reserve_bytes",
            "gauge",
            "Bytes kept for deleting, committing and cleaning: writes are refused once only these are left.",
            r.space.as_ref().map_or(f64::NAN, |s| s.reserve as f64),
        ),
        (
            "oubli_commit_failing",
            "gauge",
            "1 while the last automatic commit failed (retried).",
            if r.last_commit_error.is_some() { 1.0 } else { 0.0 },
        ),
    ];
    let store = escape(&r.store);
    let mut out = String::new();
    for (name, kind, help, value) in metrics {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        out.push_str(&format!("{name}{{store=\"{store}\"}} {value}\n"));
    }
    out
}

/// A label value with `\`, `"` and newlines escaped as the format asks.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes the metrics to `path` atomically (a scraper never reads half a
/// file): into a new file beside it, `PATH.XXXXXXXX.tmp` under a random
/// name nobody can plant in advance and created with `O_EXCL|O_NOFOLLOW`
/// (never through a link, never into a file someone else made), then
/// renamed over `path`. The file is created 0600; a mode its owner gave the
/// file it replaces is kept (0644 lets a scraper running as another user
/// read it).
pub fn write(path: &Path, r: &StatusReport) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} does not name a file", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // The mode of the file itself, not of whatever a link there points at.
    let mode = std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0o600, |m| m.permissions().mode() & 0o777);
    let mut prefix = name.to_owned();
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .rand_bytes(8)
        .make_in(dir, |p| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(mode)
                .open(p)
        })?;
    tmp.as_file_mut().write_all(render(r).as_bytes())?;
    // Dropped on an error before this, the temporary file is removed.
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Rewrites a metrics file whenever the store's epoch moves (and at start):
/// called from a long-running process's one-second timer.
pub struct MetricsFile {
    path: std::path::PathBuf,
    store_path: std::path::PathBuf,
    written_at_epoch: Option<u64>,
}

impl MetricsFile {
    pub fn new(path: &Path, store_path: &Path) -> MetricsFile {
        MetricsFile {
            path: path.to_path_buf(),
            store_path: store_path.to_path_buf(),
            written_at_epoch: None,
        }
    }

    /// Writes the file if a commit happened since the last write; returns
    /// an error message for the process's log.
    pub fn tick(&mut self, store: &oubli_core::Store) -> Result<(), String> {
        if self.written_at_epoch == Some(store.epoch()) {
            return Ok(());
        }
        let report = crate::report::status_report(store, &self.store_path, true)
            .map_err(|e| format!("metrics: {e}"))?;
        write(&self.path, &report)
            .map_err(|e| format!("writing metrics to {}: {e}", self.path.display()))?;
        self.written_at_epoch = Some(report.epoch);
        Ok(())
    }
}
