//! The commands on the store as a whole: init, commit, status, gc, fsck.

use crate::failure::Failure;
use crate::password::{self, Purpose};
use crate::session::{self, Access, Global};
use crate::ui;
use oubli::report::StatusReport;
use oubli::{exit, CreateOptions, Error, KdfParams, DIR_MARKER};
use serde::Serialize;

/// `oubli init`.
pub fn init(
    g: &Global,
    create: CreateOptions,
    kdf_memory_mib: u32,
    kdf_iterations: u32,
    nand_geometry: oubli_nand::Geometry,
) -> Result<String, Failure> {
    let kdf = KdfParams {
        m_cost_kib: kdf_memory_mib.saturating_mul(1024),
        t_cost: kdf_iterations,
        p_cost: 1,
    };
    kdf.validate()
        .map_err(|why| Failure::usage(format!("bad --kdf-memory / --kdf-iterations: {why}")))?;
    if crate::nand::is_nand_vault(&g.vault) && g.nand.is_none() {
        return Err(Failure::usage(
            "--vault nand keeps the vault in the store's NAND chip: it needs --store nand:IMAGE",
        ));
    }
    // Refuse before asking for a password: nothing is overwritten, ever.
    for (exists, what) in [
        (
            g.store.join(DIR_MARKER).exists() || g.nand.as_ref().is_some_and(|i| i.exists()),
            format!("a store at {}", g.store_shown().display()),
        ),
        (
            session::is_file_vault(&g.vault) && g.vault.exists(),
            format!("a vault at {}", g.vault_shown.display()),
        ),
    ] {
        if exists {
            return Err(g.fail(Error::AlreadyInitialized(what)));
        }
    }
    let password = password::obtain(g.password_file.as_deref(), &g.vault_shown, Purpose::Create)?;
    let existed = g.store.exists();
    // The directory must exist for its lock file; create_dir_store then
    // fills it (an empty directory is fine). It and the parents made for it
    // are the owner's only from the start: no other user may take the lock.
    oubli::create_private_dir(&g.store).map_err(|e| {
        g.fail(Error::Io {
            context: format!("creating directory {}", g.store.display()),
            source: e,
        })
    })?;
    let lock = g.lock(Access::Write);
    let created = lock.and_then(|_lock| {
        let provider = session::provider();
        crate::vault_cmd::create_store(
            g,
            &password,
            kdf,
            create,
            session::options(Access::Write, &provider),
            nand_geometry,
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
    // A directory that was there before (a mount point, say) keeps its mode.
    crate::privacy::warn_about_store(&g.store);
    let info = store.status().map(|s| s.vault).ok();
    let note = match info {
        Some(i) if i.overwrite_is_erasure => String::new(),
        Some(i) if i.kind != "file" => format!(
            "Note: this {} vault is a simulator or software token: its memory is a file on the host,\n\
             so its overwrites may not erase (docs/THREAT_MODEL.md).\n",
            i.kind
        ),
        _ => "Note: the file vault is a stand-in. On an SSD or a copy-on-write or journaling file\n\
              system, old copies of the vault file may survive its overwrites (docs/THREAT_MODEL.md).\n"
            .to_string(),
    };
    Ok(format!(
        "created store {} (cell size {}, key scheme {}) at epoch {}\n\
         created vault {} (Argon2id, {} MiB, {} passes)\n\
         Keep the password and the vault: without both, nothing in the store can be read.\n{note}",
        g.store_shown().display(),
        ui::size(u64::from(create.cell_size)),
        ui::key_scheme_name(create.key_scheme),
        store.epoch(),
        g.vault_shown.display(),
        kdf_memory_mib,
        kdf_iterations,
    ))
}

/// `oubli commit` (alias `purge`).
pub fn commit(g: &Global, cert: &crate::cert_cmd::CertArgs) -> Result<String, Failure> {
    if let Some(request) = crate::cert_cmd::prepare(cert, true)? {
        return commit_certified(g, request);
    }
    // A mount or server holding the store open commits for us.
    if let Some(reply) = g.control("purge")? {
        let epoch = reply.map_err(|e| g.control_failure(e))?;
        return Ok(format!(
            "committed (by the process holding the store): epoch {epoch} began; everything deleted before it is now unrecoverable\n"
        ));
    }
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

/// `oubli commit --certificate FILE`: names no item (the store does not
/// keep the names of what was deleted); the certificate states the epoch's
/// totals.
fn commit_certified(g: &Global, request: crate::cert_cmd::Request) -> Result<String, Failure> {
    // A mount or server holding the store open commits for us.
    let request =
        match crate::cert_cmd::purge_live(request, g, "oubli commit", Vec::new(), Vec::new())? {
            Ok(written) => {
                return Ok(format!(
                    "committed (by the process holding the store): everything deleted before it is now unrecoverable\n{written}"
                ))
            }
            Err(request) => request,
        };
    let (session, tally) = crate::cert_cmd::open(g, true)?;
    let mut tally = tally.expect("a certificate was asked for");
    // Opening a store whose last command left an intent log commits it
    // already; a second commit would only cost a vault write.
    if !session.committed_on_open() {
        tally.before_commit(g, &session)?;
        session.store.commit().map_err(|e| g.fail(e))?;
    }
    let written = crate::cert_cmd::finish(
        request,
        g,
        &session,
        tally,
        "oubli commit",
        Vec::new(),
        Vec::new(),
    )?;
    Ok(format!(
        "committed: epoch {} began; everything deleted before it is now unrecoverable\n{written}",
        session.store.epoch()
    ))
}

/// `oubli status [--json]`.
pub fn status(g: &Global, json: bool) -> Result<String, Failure> {
    crate::privacy::warn_about_store(&g.store);
    let report = crate::vault_cmd::report(g)?;
    if json {
        return Ok(serde_json::to_string_pretty(&report).expect("plain data") + "\n");
    }
    Ok(render_status(&report))
}

/// `oubli status --watch`: the status again every `interval` seconds, in
/// place on a terminal (appended, separated by a blank line, otherwise),
/// with the write rate between refreshes. Runs until interrupted. A store
/// no process holds is opened (and its password checked) at every refresh.
pub fn watch(g: &Global, interval: u64) -> Result<String, Failure> {
    use std::io::{IsTerminal, Write};
    let interval = std::time::Duration::from_secs(interval.max(1));
    let terminal = std::io::stdout().is_terminal();
    let mut last: Option<(std::time::Instant, u64, u64)> = None;
    loop {
        let report = crate::vault_cmd::report(g)?;
        let now = std::time::Instant::now();
        let rate = match last {
            Some((at, epoch, bytes)) => {
                // A commit in between starts the epoch's count again.
                let written = if epoch == report.epoch {
                    report.bytes_written_this_epoch.saturating_sub(bytes)
                } else {
                    report.bytes_written_this_epoch
                };
                format!(
                    "{}/s",
                    ui::size((written as f64 / (now - at).as_secs_f64()) as u64)
                )
            }
            None => "(after the next refresh)".to_string(),
        };
        last = Some((now, report.epoch, report.bytes_written_this_epoch));
        let text = format!(
            "{}write rate   {rate}\nrefreshed    {} UTC, every {} s (Ctrl-C stops)\n",
            render_status(&report),
            ui::date(ui::now()),
            interval.as_secs()
        );
        let mut out = std::io::stdout().lock();
        let shown = if terminal {
            // Home, clear the screen, draw.
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            writeln!(out, "{text}")
        };
        if shown.and_then(|()| out.flush()).is_err() {
            // The reader went away (`| head`): done.
            return Ok(String::new());
        }
        drop(out);
        std::thread::sleep(interval);
    }
}

fn render_status_base(r: &StatusReport) -> String {
    let mut pending = match (r.pending_deletions, r.pending_erasure_bytes) {
        (0, 0) => "none".to_string(),
        (n, bytes) => format!(
            "{n} deletion(s), {} of sealed data: erased at the next commit (`oubli commit`)",
            ui::size(bytes)
        ),
    };
    if r.snapshots > 0 {
        pending = format!(
            "{pending}; {} snapshot(s) keep what they hold until removed (`oubli snapshot ls`, `rm --all-snapshots`)",
            r.snapshots
        );
    }
    if !r.vault_leftover_epochs.is_empty() {
        pending = format!(
            "{}; {pending} in this epoch",
            ui::erasure_incomplete(&r.vault_leftover_epochs, r.vault_leftover_error.as_deref())
        );
    }
    for l in &r.share_leftovers {
        pending = format!(
            "{}; {pending}",
            ui::share_leftover(&l.share, &l.vault, &l.why)
        );
    }
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
    let policy = if r.policy.mode == "manual" {
        "manual: epochs end on `oubli commit` or `oubli rm --purge`".to_string()
    } else {
        let mut parts = Vec::new();
        if let Some(i) = r.policy.interval_seconds {
            parts.push(format!("every {}", ui::duration(i)));
        }
        if let Some(b) = r.policy.bytes {
            parts.push(format!("after {} written", ui::size(b)));
        }
        if let Some(d) = r.policy.deletions {
            parts.push(format!("after {d} deletions"));
        }
        let mut text = format!("automatic: {}", parts.join(", "));
        if let Some(n) = r.next_commit_in {
            text.push_str(&format!("; next commit in {}", ui::duration(n)));
        }
        text
    };
    let mut out = format!(
        "store        {}{}\n\
         medium       {} ({} segments, {} on disk)\n\
         epoch        {} (committed {} ago, at {} UTC)\n\
         pending      {}\n\
         live         {}\n\
         dead         {} ({})\n\
         written      {} this epoch\n\
         vault        {} at {} ({writes} writes, {endurance}; {honest})\n\
         cell size    {}\n\
         key scheme   {}\n\
         provider     {}\n\
         policy       {}\n",
        r.store,
        if r.live {
            " (open in a running mount or server)"
        } else {
            ""
        },
        r.medium,
        r.segments,
        ui::size(r.medium_bytes),
        r.epoch,
        ui::duration(r.seconds_since_commit),
        ui::date(r.committed_at),
        pending,
        ui::size(r.live_bytes),
        ui::size(r.dead_bytes),
        if r.live {
            "the running mount or server reclaims it by itself"
        } else {
            "reclaimable with `oubli gc`"
        },
        ui::size(r.bytes_written_this_epoch),
        r.vault.kind,
        r.vault.location,
        ui::size(u64::from(r.cell_size)),
        scheme_line(r),
        r.provider,
        policy,
    );
    if let Some(c) = &r.cleaner {
        out.push_str(&format!(
            "cleaner      emptying {} segments: {} of {} moved\n",
            c.victims,
            ui::size(c.bytes_moved),
            ui::size(c.bytes_to_move)
        ));
    }
    if r.segments_awaiting_commit > 0 {
        out.push_str(&format!(
            "             {} emptied segments go at the next commit\n",
            r.segments_awaiting_commit
        ));
    }
    if let Some(sp) = &r.space {
        out.push_str(&format!(
            "space        {} free of {}; {} for data ({} kept for deleting, committing and cleaning)\n",
            ui::size(sp.free),
            ui::size(sp.total),
            ui::size(sp.available),
            ui::size(sp.reserve),
        ));
        if sp.nearly_full {
            out.push_str(
                "WARNING      the medium is nearly full: new data is refused (exit 9, ENOSPC) once only the reserve is left; delete data and commit (`oubli rm`, `oubli commit`, `oubli gc`)\n",
            );
        }
    }
    if let Some(w) = &r.wear {
        out.push_str(&crate::vault_cmd::render_wear(w));
    }
    if let Some(w) = &r.nand_wear {
        out.push_str(&crate::nand::render(w));
    }
    if let Some(e) = &r.last_commit_error {
        out.push_str(&format!(
            "WARNING      the last automatic commit failed ({e}); the epoch stays open and erasure is delayed until a commit succeeds\n"
        ));
    }
    out
}

fn render_status(r: &StatusReport) -> String {
    let mut out = render_status_base(r);
    for e in &r.nbd_exports {
        let inferred = match (&e.infer_deletes, &e.inference_stopped) {
            (None, _) => "deletions not inferred (only TRIM/discard erase)".to_string(),
            (Some(fs), stopped) => format!(
                "deletions inferred ({fs}): {} blocks ({}), {} kept as suspicious ({} now){}",
                e.deletions_inferred_blocks,
                ui::size(e.deletions_inferred_bytes),
                e.suspicious_kept,
                e.suspicious_now,
                stopped
                    .as_ref()
                    .map_or(String::new(), |w| format!("; STOPPED: {w}"))
            ),
        };
        out.push_str(&format!(
            "export       {} (served): {} trims received; {inferred}\n",
            e.name, e.trims_received
        ));
    }
    out
}

/// `oubli gc [--threshold F] [--purge-versions]`.
/// The key scheme and, for one with keys outside the tree, its state.
fn scheme_line(r: &StatusReport) -> String {
    let detail = match (r.key_forest_roots, r.key_area_keys) {
        (Some(roots), _) => format!("{roots} forest roots"),
        (_, Some(keys)) => format!("{keys} keys"),
        _ => return r.key_scheme.clone(),
    };
    format!(
        "{} ({detail}, {} of state, {}-byte key references)",
        r.key_scheme,
        ui::size(r.key_scheme_state_bytes),
        r.key_ref_bytes
    )
}

pub fn gc(
    g: &Global,
    threshold: f64,
    purge_versions: bool,
    consolidate_keys: bool,
) -> Result<String, Failure> {
    if purge_versions && g.remote.is_none() {
        return Err(Failure::usage(
            "--purge-versions is for a store in a versioned S3 bucket (--store s3://...)",
        ));
    }
    if !(0.0..=1.0).contains(&threshold) {
        return Err(Failure::usage(format!(
            "--threshold {threshold} must lie between 0 and 1"
        )));
    }
    let session = g.open(Access::Write)?;
    // Objects nothing reaches (a command that died half-way) hold data no
    // command can delete: gone now, erased by the cleaner's commit.
    let orphans = session.orphans_collected
        + oubli::orphans::delete_orphans(&session.store).map_err(|e| g.fail(e))?;
    let mut out = String::new();
    if consolidate_keys {
        let spinner = ui::spinner("re-keying");
        let c = session.store.consolidate_keys();
        drop(spinner);
        let c = c.map_err(|e| g.fail(e))?;
        out.push_str(&format!(
            "consolidated: {} cell(s), {} re-sealed under fresh keys{}{}\n",
            c.cells_rekeyed,
            ui::size(c.bytes_resealed),
            match (c.roots_before, c.roots_after) {
                (Some(b), Some(a)) => format!("; key forest roots {b} -> {a}"),
                _ => String::new(),
            },
            if c.cells_skipped > 0 {
                format!(
                    "; {} cell(s) under an unavailable share left as they were",
                    c.cells_skipped
                )
            } else {
                String::new()
            },
        ));
    }
    let spinner = ui::spinner("cleaning");
    let report = session.store.gc(threshold);
    drop(spinner);
    let report = report.map_err(|e| g.fail(e))?;
    out += &format!(
        "gc: {orphans} orphan object(s) deleted and erased, {} segment(s) freed, {} reclaimed, {} of live data moved; epoch {}\n",
        report.segments_deleted,
        ui::size(report.bytes_reclaimed),
        ui::size(report.bytes_moved),
        session.store.epoch()
    );
    // Under the store's lock (the session holds it): no other writer
    // deletes meanwhile, so no object it deletes comes back.
    if let (true, Some(at)) = (purge_versions, &g.remote) {
        let purged = purge_old_versions(at).map_err(|e| {
            g.fail(Error::Io {
                context: format!("purging old versions in {at}"),
                source: e,
            })
        })?;
        out.push_str(&format!(
            "gc: {purged} old version(s) and delete marker(s) removed from the bucket\n"
        ));
    }
    drop(session);
    Ok(out)
}

/// Deletes every version of the store's objects that is not the current
/// one (older versions, delete markers that are no longer current) from a
/// versioned bucket. A current delete marker stays: deleting it would make
/// the version under it current again, bringing a deleted object back to
/// any listing made before that version is purged (or for good, should
/// the purge stop there).
fn purge_old_versions(at: &oubli_s3::S3Location) -> std::io::Result<usize> {
    let admin = oubli_s3::Admin::new(&oubli_s3::S3Config::from_env()?)?;
    let versions = admin.versions(&at.bucket, &at.prefix)?;
    let mut purged = 0;
    for v in versions.iter().filter(|v| !v.is_latest) {
        admin.delete_version(&at.bucket, &v.key, &v.version_id)?;
        purged += 1;
    }
    Ok(purged)
}

#[derive(Serialize)]
struct FsckJson {
    objects: u64,
    cells: u64,
    nodes: u64,
    bytes_checked: u64,
    /// Objects no name and no front-end reaches (`oubli gc` deletes them).
    orphans: Vec<u64>,
    problems: Vec<String>,
}

/// `oubli fsck [--json]`: prints the report; problems fail with exit 7.
pub fn fsck(g: &Global, json: bool) -> Result<String, Failure> {
    crate::privacy::warn_about_store(&g.store);
    let session = g.open(Access::Read)?;
    let store = &session.store;
    let o = store.overhead().map_err(|e| g.fail(e))?;
    let total = o.data_bytes + o.tag_bytes;
    let bar = ui::bytes_bar(Some(total), "fsck");
    let report = store.fsck(&mut |n| bar.inc(n));
    bar.finish_and_clear();
    let mut report = report.map_err(|e| g.fail(e))?;
    let orphans = oubli::orphans::orphans(store).map_err(|e| g.fail(e))?;
    for oid in &orphans {
        report.problems.push(format!(
            "object {oid} is an orphan: no name and no front-end reaches it (`oubli gc` deletes it)"
        ));
    }
    let out = if json {
        serde_json::to_string_pretty(&FsckJson {
            objects: report.objects,
            cells: report.cells,
            nodes: report.nodes,
            bytes_checked: report.bytes_checked,
            orphans: orphans.clone(),
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
    let only_orphans = report.problems.len() == orphans.len();
    Err(Failure::new(
        exit::INTEGRITY,
        format!(
            "fsck found {} problem(s) in store {}",
            report.problems.len(),
            g.store.display()
        ),
        if only_orphans {
            "objects that nothing reaches were left by a command that failed half-way: `oubli gc` deletes them (erased at its commit)"
        } else {
            "the medium was damaged or tampered with; restore the store from a backup (the listed data cannot be trusted)"
        },
    ))
}
