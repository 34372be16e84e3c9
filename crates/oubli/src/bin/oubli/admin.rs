//! The commands on the store as a whole: init, commit, status, gc, fsck.

use crate::failure::Failure;
use crate::password::{self, Purpose};
use crate::session::{self, Access, Global};
use crate::ui;
use oubli::{exit, CreateOptions, Error, KdfParams, DIR_MARKER};
use serde::Serialize;

/// `oubli init`.
pub fn init(
    g: &Global,
    cell_size: u32,
    kdf_memory_mib: u32,
    kdf_iterations: u32,
) -> Result<String, Failure> {
    let kdf = KdfParams {
        m_cost_kib: kdf_memory_mib.saturating_mul(1024),
        t_cost: kdf_iterations,
        p_cost: 1,
    };
    kdf.validate()
        .map_err(|why| Failure::usage(format!("bad --kdf-memory / --kdf-iterations: {why}")))?;
    // Refuse before asking for a password: nothing is overwritten, ever.
    for (exists, what) in [
        (
            g.store.join(DIR_MARKER).exists(),
            format!("a store at {}", g.store.display()),
        ),
        (
            g.vault.exists(),
            format!("a vault at {}", g.vault.display()),
        ),
    ] {
        if exists {
            return Err(g.fail(Error::AlreadyInitialized(what)));
        }
    }
    let password = password::obtain(g.password_file.as_deref(), &g.vault, Purpose::Create)?;
    let existed = g.store.exists();
    // The directory must exist for its lock file; create_dir_store then
    // fills it (an empty directory is fine).
    std::fs::create_dir_all(&g.store).map_err(|e| {
        g.fail(Error::Io {
            context: format!("creating directory {}", g.store.display()),
            source: e,
        })
    })?;
    let lock = g.lock(Access::Write);
    let created = lock.and_then(|_lock| {
        let provider = session::provider();
        oubli::create_dir_store(
            &g.store,
            &g.vault,
            &password,
            kdf,
            CreateOptions { cell_size },
            session::options(Access::Write, &provider),
        )
        .map_err(|e| g.fail(e))
    });
    let store = match created {
        Ok(store) => store,
        Err(failure) => {
            if !existed {
                let _ = std::fs::remove_dir_all(&g.store);
            }
            return Err(failure);
        }
    };
    Ok(format!(
        "created store {} (cell size {}) at epoch {}\n\
         created vault {} (Argon2id, {} MiB, {} passes)\n\
         Keep the password and the vault: without both, nothing in the store can be read.\n\
         Note: the file vault is a stand-in. On an SSD or a copy-on-write or journaling file\n\
         system, old copies of the vault file may survive its overwrites (docs/THREAT_MODEL.md).\n",
        g.store.display(),
        ui::size(u64::from(cell_size)),
        store.epoch(),
        g.vault.display(),
        kdf_memory_mib,
        kdf_iterations,
    ))
}

/// `oubli commit` (alias `purge`).
pub fn commit(g: &Global) -> Result<String, Failure> {
    let session = g.open(Access::Write)?;
    // Opening a store whose last command left an intent log commits it
    // already; a second commit would only cost a vault write.
    if !session.committed_on_open() {
        session.store.commit().map_err(|e| g.fail(e))?;
    }
    Ok(format!(
        "committed: epoch {} began; everything deleted before it is now unrecoverable\n",
        session.store.epoch()
    ))
}

#[derive(Serialize)]
struct StatusJson {
    store: String,
    medium: String,
    epoch: u64,
    committed_at: u64,
    seconds_since_commit: u64,
    pending_deletions: u64,
    pending_erasure_bytes: u64,
    bytes_written_this_epoch: u64,
    live_bytes: u64,
    dead_bytes: u64,
    medium_bytes: u64,
    segments: usize,
    cell_size: u32,
    key_scheme: &'static str,
    provider: &'static str,
    vault: VaultJson,
    policy: PolicyJson,
}

#[derive(Serialize)]
struct VaultJson {
    kind: String,
    location: String,
    writes: Option<u64>,
    endurance_writes: Option<u64>,
    overwrite_is_erasure: bool,
}

#[derive(Serialize)]
struct PolicyJson {
    /// Always "manual" for the CLI: a one-shot command commits only when asked.
    mode: &'static str,
    interval_seconds: Option<u64>,
    bytes: Option<u64>,
    deletions: Option<u64>,
}

/// `oubli status [--json]`.
pub fn status(g: &Global, json: bool) -> Result<String, Failure> {
    let session = g.open(Access::Read)?;
    let s = session.store.status().map_err(|e| g.fail(e))?;
    // The engine's live-byte counter misses data replayed from an intent
    // log (every CLI `put` ends in a flush, not a commit), so it is
    // measured from the tree instead: nodes only, no data is read.
    let o = session.store.overhead().map_err(|e| g.fail(e))?;
    let live_bytes = o.node_bytes + o.data_bytes + o.tag_bytes;
    let manual =
        s.policy.interval.is_none() && s.policy.bytes.is_none() && s.policy.deletions.is_none();
    let report = StatusJson {
        store: g.store.display().to_string(),
        medium: s.medium.clone(),
        epoch: s.epoch,
        committed_at: s.committed_at,
        // From the superblock's commit time: the store's own clock only
        // started when this process opened it.
        seconds_since_commit: ui::now().saturating_sub(s.committed_at),
        pending_deletions: s.pending_deletions,
        pending_erasure_bytes: s.pending_erasure_bytes,
        bytes_written_this_epoch: s.bytes_written_this_epoch,
        live_bytes,
        dead_bytes: s.medium_bytes.saturating_sub(live_bytes),
        medium_bytes: s.medium_bytes,
        segments: s.segments,
        cell_size: s.cell_size,
        key_scheme: s.key_scheme,
        provider: s.provider,
        vault: VaultJson {
            kind: s.vault.kind.clone(),
            location: s.vault.location.clone(),
            writes: s.vault_writes,
            endurance_writes: s.vault.endurance_writes,
            overwrite_is_erasure: s.vault.overwrite_is_erasure,
        },
        policy: PolicyJson {
            mode: if manual { "manual" } else { "automatic" },
            interval_seconds: s.policy.interval.map(|d| d.as_secs()),
            bytes: s.policy.bytes,
            deletions: s.policy.deletions,
        },
    };
    if json {
        return Ok(serde_json::to_string_pretty(&report).expect("plain data") + "\n");
    }
    let r = &report;
    // Deletions replayed from an intent log free bytes but are not counted
    // by the engine (yet): the bytes are the reliable figure.
    let pending = match (r.pending_deletions, r.pending_erasure_bytes) {
        (0, 0) => "none".to_string(),
        (0, bytes) => format!(
            "{} of sealed data deleted: erased at the next commit (`oubli commit`)",
            ui::size(bytes)
        ),
        (n, bytes) => format!(
            "{n} deletion(s), {} of sealed data: erased at the next commit (`oubli commit`)",
            ui::size(bytes)
        ),
    };
    let writes = r.vault.writes.map_or("unknown".into(), |w| w.to_string());
    let endurance = r
        .vault
        .endurance_writes
        .map_or("unbounded".into(), |e| format!("rated for {e}"));
    let honest = if r.vault.overwrite_is_erasure {
        "overwrites erase"
    } else {
        "stand-in: its medium may keep old copies"
    };
    Ok(format!(
        "store        {}\n\
         medium       {} ({} segments, {} on disk)\n\
         epoch        {} (committed {} ago, at {} UTC)\n\
         pending      {}\n\
         live         {}\n\
         dead         {} (reclaimable with `oubli gc`)\n\
         written      {} this epoch\n\
         vault        {} at {} ({writes} writes, {endurance}; {honest})\n\
         cell size    {}\n\
         key scheme   {}\n\
         provider     {}\n\
         policy       {}\n",
        r.store,
        r.medium,
        r.segments,
        ui::size(r.medium_bytes),
        r.epoch,
        ui::duration(r.seconds_since_commit),
        ui::date(r.committed_at),
        pending,
        ui::size(r.live_bytes),
        ui::size(r.dead_bytes),
        ui::size(r.bytes_written_this_epoch),
        r.vault.kind,
        r.vault.location,
        ui::size(u64::from(r.cell_size)),
        r.key_scheme,
        r.provider,
        if manual {
            "manual: epochs end on `oubli commit` or `oubli rm --purge`".to_string()
        } else {
            format!("{:?}", s.policy)
        },
    ))
}

/// `oubli gc [--threshold F]`.
pub fn gc(g: &Global, threshold: f64) -> Result<String, Failure> {
    if !(0.0..=1.0).contains(&threshold) {
        return Err(Failure::usage(format!(
            "--threshold {threshold} must lie between 0 and 1"
        )));
    }
    let session = g.open(Access::Write)?;
    let spinner = ui::spinner("cleaning");
    let report = session.store.gc(threshold);
    spinner.finish_and_clear();
    let report = report.map_err(|e| g.fail(e))?;
    Ok(format!(
        "gc: {} segment(s) freed, {} reclaimed, {} of live data moved; epoch {}\n",
        report.segments_deleted,
        ui::size(report.bytes_reclaimed),
        ui::size(report.bytes_moved),
        session.store.epoch()
    ))
}

#[derive(Serialize)]
struct FsckJson {
    objects: u64,
    cells: u64,
    nodes: u64,
    bytes_checked: u64,
    problems: Vec<String>,
}

/// `oubli fsck [--json]`: prints the report; problems fail with exit 7.
pub fn fsck(g: &Global, json: bool) -> Result<String, Failure> {
    let session = g.open(Access::Read)?;
    let store = &session.store;
    let o = store.overhead().map_err(|e| g.fail(e))?;
    let total = o.data_bytes + o.tag_bytes;
    let bar = ui::bytes_bar(Some(total), "fsck");
    let report = store.fsck(&mut |n| bar.inc(n));
    bar.finish_and_clear();
    let report = report.map_err(|e| g.fail(e))?;
    let out = if json {
        serde_json::to_string_pretty(&FsckJson {
            objects: report.objects,
            cells: report.cells,
            nodes: report.nodes,
            bytes_checked: report.bytes_checked,
            problems: report.problems.clone(),
        })
        .expect("plain data")
            + "\n"
    } else {
        let mut out = format!(
            "fsck: {} objects, {} cells, {} tree nodes, {} read and authenticated\n",
            report.objects,
            report.cells,
            report.nodes,
            ui::size(report.bytes_checked)
        );
        for p in &report.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        out.push_str(if report.problems.is_empty() {
            "fsck: no problems\n"
        } else {
            "fsck: PROBLEMS FOUND\n"
        });
        out
    };
    if report.problems.is_empty() {
        return Ok(out);
    }
    crate::emit(&out)?;
    Err(Failure::new(
        exit::INTEGRITY,
        format!("fsck found {} problem(s) in store {}", report.problems.len(), g.store.display()),
        "the medium was damaged or tampered with; restore the store from a backup (the listed data cannot be trusted)",
    ))
}
