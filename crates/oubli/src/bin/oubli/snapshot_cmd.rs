//! `oubli snapshot create|ls|rm`: kept versions of the whole store, directly or through a live mount's or server's control socket.

use crate::failure::Failure;
use crate::session::{Access, Global};
use crate::ui;
use clap::Subcommand;
use oubli::report::{snapshot_reports, SnapshotReport};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Keep the whole store as it is now, read-only, in constant time
    Create {
        /// The snapshot's name (1 to 255 bytes; no '/', '@' or control characters)
        name: String,
        /// Remove the snapshot automatically after this long (e.g. 90m, 12h, 30d, 2w)
        #[arg(long, value_name = "DURATION", value_parser = ui::parse_duration)]
        expire: Option<u64>,
        /// A live `oubli mount`: snapshot the store mounted there (instead of --store)
        mountpoint: Option<PathBuf>,
    },
    /// List snapshots with the space each holds alone ("unique") and shares
    Ls {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// A live `oubli mount`: the store mounted there (instead of --store)
        mountpoint: Option<PathBuf>,
    },
    /// Remove a snapshot: what only it holds is erased at the next commit
    Rm {
        name: String,
        /// Commit at once, so that its data is unrecoverable when the command returns
        #[arg(long)]
        purge: bool,
        /// A live `oubli mount`: the store mounted there (instead of --store)
        mountpoint: Option<PathBuf>,
        #[command(flatten)]
        cert: crate::cert_cmd::CertArgs,
    },
}

pub fn run(g: &Global, command: SnapshotCommand) -> Result<String, Failure> {
    match command {
        SnapshotCommand::Create {
            name,
            expire,
            mountpoint,
        } => create(&g.at_mount(mountpoint.as_deref())?, &name, expire),
        SnapshotCommand::Ls { json, mountpoint } => ls(&g.at_mount(mountpoint.as_deref())?, json),
        SnapshotCommand::Rm {
            name,
            purge,
            mountpoint,
            cert,
        } => {
            let request = crate::cert_cmd::prepare(&cert, purge)?;
            match request {
                None => rm(&g.at_mount(mountpoint.as_deref())?, &name, purge),
                Some(request) => rm_certified(&g.at_mount(mountpoint.as_deref())?, &name, request),
            }
        }
    }
}

fn create(g: &Global, name: &str, expire: Option<u64>) -> Result<String, Failure> {
    oubli::crates::core::snapshot::check_name(name).map_err(Failure::usage)?;
    let expires_at = expire.map(|d| ui::now() + d);
    let until = match expires_at {
        Some(t) => format!(", expires {} UTC", ui::date(t)),
        None => String::new(),
    };
    let at = expires_at.map_or("-".to_string(), |t| t.to_string());
    if let Some(reply) = g.control(&format!("snapshot-create {at} {name}"))? {
        reply.map_err(|e| g.control_failure(e))?;
        return Ok(format!(
            "created snapshot {name} (by the process holding the store){until}\n"
        ));
    }
    let session = g.open(Access::Write)?;
    session
        .store
        .snapshot_create(name, expires_at)
        .map_err(|e| g.fail(e))?;
    Ok(format!("created snapshot {name}{until}\n"))
}

fn ls(g: &Global, json: bool) -> Result<String, Failure> {
    let list: Vec<SnapshotReport> = match g.control("snapshot-ls")? {
        Some(reply) => {
            let text = reply.map_err(|e| g.control_failure(e))?;
            serde_json::from_str(&text)
                .map_err(|e| g.control_failure(format!("unreadable snapshot list ({e}): {text}")))?
        }
        None => {
            let session = g.open(Access::Read)?;
            snapshot_reports(&session.store).map_err(|e| g.fail(e))?
        }
    };
    if json {
        return Ok(serde_json::to_string_pretty(&list).expect("plain data") + "\n");
    }
    if list.is_empty() {
        return Ok(String::new());
    }
    let mut out = format!(
        "{:<24} {:<16} {:>7} {:>10} {:>10}  {}\n",
        "NAME", "CREATED (UTC)", "EPOCH", "UNIQUE", "SHARED", "EXPIRES (UTC)"
    );
    for s in list {
        out.push_str(&format!(
            "{:<24} {:<16} {:>7} {:>10} {:>10}  {}\n",
            s.name,
            ui::date(s.created_at),
            s.epoch,
            ui::size(s.unique_bytes),
            ui::size(s.shared_bytes),
            s.expires_at.map_or("-".to_string(), ui::date)
        ));
    }
    Ok(out)
}

fn rm(g: &Global, name: &str, purge: bool) -> Result<String, Failure> {
    let mode = if purge { "purge" } else { "keep" };
    let by = match g.control(&format!("snapshot-rm {mode} {name}"))? {
        Some(reply) => {
            reply.map_err(|e| g.control_failure(e))?;
            " (by the process holding the store)"
        }
        None => {
            let session = g.open(Access::Write)?;
            let store = &session.store;
            if purge {
                store.snapshot_remove_and_commit(name)
            } else {
                store.snapshot_remove(name)
            }
            .map_err(|e| g.fail(e))?;
            ""
        }
    };
    Ok(if purge {
        format!(
            "removed snapshot {name}{by} and committed: what only it held is now unrecoverable\n"
        )
    } else {
        format!(
            "removed snapshot {name}{by}; what only it held is erased at the next commit (run `oubli commit` to erase it now)\n"
        )
    })
}

/// `oubli snapshot rm --purge --certificate FILE`: the removal and the
/// commit are two steps, so that the certificate measures what only the
/// snapshot held in between.
fn rm_certified(
    g: &Global,
    name: &str,
    request: crate::cert_cmd::Request,
) -> Result<String, Failure> {
    use oubli::certificate::{ErasedItem, ItemKind};
    let item = |request: &crate::cert_cmd::Request, bytes| ErasedItem {
        kind: ItemKind::Snapshot,
        name: request.name(name),
        object_ids: Vec::new(),
        bytes,
        from_snapshots: Vec::new(),
    };
    const COMMAND: &str = "oubli snapshot rm --purge";
    if let Some(reply) = g.control("snapshot-ls")? {
        // Through the process holding the store: remove, then a certified commit.
        let text = reply.map_err(|e| g.control_failure(e))?;
        let list: Vec<SnapshotReport> = serde_json::from_str(&text)
            .map_err(|e| g.control_failure(format!("unreadable snapshot list ({e}): {text}")))?;
        let bytes = list
            .iter()
            .find(|s| s.name == name)
            .map_or(0, |s| s.unique_bytes);
        let removed = g.control(&format!("snapshot-rm keep {name}"))?;
        if let Some(reply) = removed {
            reply.map_err(|e| g.control_failure(e))?;
            let item = item(&request, bytes);
            if let Ok(written) =
                crate::cert_cmd::purge_live(request, g, COMMAND, vec![item], Vec::new())?
            {
                return Ok(format!(
                    "removed snapshot {name} (by the process holding the store) and committed: what only it held is now unrecoverable\n{written}"
                ));
            }
        }
        return Err(Failure::usage(format!(
            "the process holding {} went away during the removal: check with `oubli snapshot ls` and commit",
            g.store_shown().display()
        )));
    }
    let (session, tally) = crate::cert_cmd::open(g, true)?;
    let mut tally = tally.expect("a certificate was asked for");
    let store = &session.store;
    let bytes = store
        .snapshot_usage()
        .map_err(|e| g.fail(e))?
        .into_iter()
        .find(|u| u.name == name)
        .map_or(0, |u| u.unique_bytes);
    store.snapshot_remove(name).map_err(|e| g.fail(e))?;
    tally.before_commit(g, &session)?;
    store.commit().map_err(|e| g.fail(e))?;
    let item = item(&request, bytes);
    let written =
        crate::cert_cmd::finish(request, g, &session, tally, COMMAND, vec![item], Vec::new())?;
    Ok(format!(
        "removed snapshot {name} and committed: what only it held is now unrecoverable\n{written}"
    ))
}

/// The control socket's reply to `redact`: what was erased.
#[derive(Serialize, Deserialize, Debug)]
pub struct RedactReply {
    pub live: bool,
    pub objects: usize,
    pub still_open: usize,
    pub snapshots: Vec<String>,
}

/// The control request for `oubli redact`: `redact <purge|keep> <path relative to the mount>`.
pub fn redact_request(relative: &Path, purge: bool) -> Option<String> {
    let path = relative.to_str()?;
    if path.contains('\n') {
        return None;
    }
    let mode = if purge { "purge" } else { "keep" };
    Some(format!("redact {mode} {path}"))
}

/// The oubli mount that holds `path`: the mount point given, or the
/// nearest ancestor of `path` that is one.
fn mount_holding(path: &Path, mountpoint: Option<&Path>) -> Result<(PathBuf, PathBuf), Failure> {
    let path = crate::session::absolute(path);
    let candidates: Vec<PathBuf> = match mountpoint {
        Some(m) => vec![crate::session::absolute(m)],
        None => path.ancestors().skip(1).map(Path::to_path_buf).collect(),
    };
    for at in candidates {
        let found = match crate::mount::store_of_mount(&at) {
            Ok(found) => found,
            // Searching upwards: other file systems on the way are not it.
            Err(f) if mountpoint.is_none() => {
                drop(f);
                None
            }
            Err(f) => return Err(f),
        };
        if let Some(store) = found {
            let relative = path.strip_prefix(&at).map_err(|_| {
                Failure::usage(format!(
                    "{} is not inside the mount at {}",
                    path.display(),
                    at.display()
                ))
            })?;
            return Ok((store, relative.to_path_buf()));
        }
        if mountpoint.is_some() {
            return Err(Failure::usage(format!(
                "nothing is mounted at {}",
                at.display()
            )));
        }
    }
    Err(Failure::usage(format!(
        "{} is not inside an oubli mount: give the MOUNTPOINT, or erase a name of a store that is not mounted with `oubli rm --all-snapshots NAME`",
        path.display()
    )))
}

/// `oubli redact PATH [MOUNTPOINT] [--purge [--certificate FILE]]`.
pub fn redact(
    g: &Global,
    path: &Path,
    mountpoint: Option<&Path>,
    purge: bool,
    cert: &crate::cert_cmd::CertArgs,
) -> Result<String, Failure> {
    let certificate = crate::cert_cmd::prepare(cert, purge)?;
    let (store, relative) = mount_holding(path, mountpoint)?;
    // With a certificate, the redaction and the commit are two steps, so
    // that the certificate measures what the redaction left pending.
    let bytes = match certificate {
        Some(_) => crate::cert_cmd::path_bytes(path),
        None => 0,
    };
    let purge_now = purge && certificate.is_none();
    let request = redact_request(&relative, purge_now).ok_or_else(|| {
        Failure::usage(format!(
            "{}: only UTF-8 paths without newlines can be redacted through the control socket",
            relative.display()
        ))
    })?;
    let g = g.with_store(&store)?;
    let reply = g.control(&request)?.ok_or_else(|| {
        Failure::usage(format!(
            "the mount of {} does not answer on its control socket (is it an oubli mount of this version?)",
            g.store.display()
        ))
    })?;
    let text = reply.map_err(|e| g.control_failure(e))?;
    let r: RedactReply = serde_json::from_str(&text)
        .map_err(|e| g.control_failure(format!("unreadable reply ({e}): {text}")))?;
    let from = match r.snapshots.len() {
        0 => "no snapshot held it".to_string(),
        n => format!("removed from {n} snapshot(s) ({})", r.snapshots.join(", ")),
    };
    let live = if r.live {
        "removed from the live tree"
    } else {
        "not in the live tree"
    };
    let mut out = format!(
        "redacted {} ({} object(s)): {live}, {from}",
        path.display(),
        r.objects
    );
    if r.still_open > 0 {
        out += &format!(
            "; {} file(s) still open: their data goes at the last close",
            r.still_open
        );
    }
    let written = match certificate {
        None => String::new(),
        Some(certificate) => {
            use oubli::certificate::{ErasedItem, ItemKind, RetainedItem};
            let name = certificate.name(&relative.to_string_lossy());
            let from: Vec<String> = r.snapshots.iter().map(|s| certificate.name(s)).collect();
            // An open file's data goes at its last close, not with this
            // commit: then the path is listed as not erased.
            let (items, retained) = if r.still_open == 0 {
                let item = ErasedItem {
                    kind: ItemKind::Path,
                    name,
                    object_ids: Vec::new(),
                    bytes,
                    from_snapshots: from,
                };
                (vec![item], Vec::new())
            } else {
                let item = RetainedItem {
                    kind: ItemKind::Path,
                    name,
                    object_ids: Vec::new(),
                    kept_in: vec![format!(
                        "{} open file(s), until their last close",
                        r.still_open
                    )],
                };
                (Vec::new(), vec![item])
            };
            crate::cert_cmd::purge_live(certificate, &g, "oubli redact --purge", items, retained)?
                .map_err(|_| {
                    Failure::usage(format!(
                        "the mount of {} went away after the redaction, before its commit: the data is erased at the store's next commit",
                        g.store.display()
                    ))
                })?
        }
    };
    out += if purge {
        "; committed: its data is now unrecoverable\n"
    } else {
        "; erased at the next commit (run `oubli commit MOUNTPOINT` to erase it now)\n"
    };
    Ok(out + &written)
}
