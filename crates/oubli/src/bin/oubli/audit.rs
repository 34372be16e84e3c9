//! `oubli audit`: play the adversary against the store and old copies of it, and give a verdict.
//!
//! The adversary of docs/DESIGN.md holds every byte the medium ever held and,
//! later, the vault's content and the password. `Store::audit` covers the
//! store's own medium. Old copies of the medium (a backup, a snapshot, what
//! an SSD controller kept) are added with `--with-copy DIR`: each copy's
//! superblocks are opened with the vault key(s) the adversary holds, and
//! every data cell that opens is compared with the store's current content.
//! A cell whose bytes are no longer live was deleted — recoverable deleted
//! data. Old copies of the *vault* (`--with-vault-copy FILE`, or `--vault`
//! pointing at one) are the one way such a leak can happen: the control
//! that shows the check can fail.

use crate::failure::Failure;
use crate::session::{self, Access, Global};
use crate::ui;
use oubli::audit::{recover, Recovered, Source};
use oubli::{exit, AuditReport, CryptoProvider, Error, Medium, Slot, Store, Vault, VaultRecord};
use serde::Serialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zeroize::Zeroizing;

#[derive(Serialize, Default)]
struct Counts {
    live_units: usize,
    pending_units: usize,
    leaked_units: usize,
    unreadable_units: usize,
}

#[derive(Serialize)]
struct CopyReport {
    path: String,
    epochs_opened: Vec<u64>,
    units_opened: usize,
    #[serde(flatten)]
    counts: Counts,
}

#[derive(Serialize)]
struct AuditJson {
    store: String,
    /// The store's epoch; `None` when the vault given is older than the store.
    epoch: Option<u64>,
    /// `ok`, `pending` (deleted since the last commit, erased at the next),
    /// `incomplete` (the vault still holds an older key) or `leaked`.
    verdict: &'static str,
    /// Epoch of the vault key(s) the adversary was given.
    vault_epochs: Vec<u64>,
    /// Epochs whose key the vault still holds besides the current one
    /// ("erasure incomplete"): a rotation cut between its two steps.
    vault_leftover_epochs: Vec<u64>,
    /// Share vaults that still hold an older record (a `share destroy`
    /// cut short): "erasure incomplete" too.
    share_leftovers: Vec<oubli::report::ShareLeftoverReport>,
    /// Objects no name reaches (an interrupted `oubli put`), readable with
    /// the vault like live data, and their bytes: erased at the next
    /// writable open.
    unnamed_objects: usize,
    unnamed_bytes: u64,
    /// The store's own medium.
    #[serde(rename = "store_medium")]
    own: Option<OwnReport>,
    copies: Vec<CopyReport>,
    /// Totals over the store and the copies.
    #[serde(flatten)]
    total: Counts,
    /// Set when `--vault` is an old copy: the store cannot be opened with
    /// it, so what opens cannot be told apart into live and deleted.
    stale_vault: Option<String>,
}

#[derive(Serialize)]
struct OwnReport {
    epochs_opened: Vec<u64>,
    units_opened: usize,
    #[serde(flatten)]
    counts: Counts,
}

/// The current state against which recovered cells are judged.
enum Judge {
    /// The store opened with the vault: live means "still the store's content".
    Current { store: Box<Store> },
    /// The vault is older than the store (the error opening it said so):
    /// everything that opens is exposed.
    Stale(Error),
}

#[derive(Clone, Copy)]
enum Class {
    Live,
    Pending,
    Leaked,
}

impl Counts {
    fn add(&mut self, class: Class) {
        match class {
            Class::Live => self.live_units += 1,
            Class::Pending => self.pending_units += 1,
            Class::Leaked => self.leaked_units += 1,
        }
    }
}

impl Judge {
    fn classify(&self, unit: &Recovered) -> oubli::Result<Class> {
        let Judge::Current { store } = self else {
            return Ok(Class::Leaked);
        };
        let epoch = match unit.source {
            Source::Tree(e) | Source::Log(e) | Source::Snapshot(e, _) => e,
        };
        Ok(if still_live(store, unit)? {
            Class::Live
        } else if epoch == store.epoch() {
            // Reached from the current epoch's tree or log: deleted since
            // the last commit, and erased by the next.
            Class::Pending
        } else {
            Class::Leaked
        })
    }
}

/// Whether the store still holds exactly these bytes at this place: then
/// the copy reveals nothing that was deleted. (By content, not address:
/// the cleaner moves live cells, and object ids are never reused.)
fn still_live(store: &Store, unit: &Recovered) -> oubli::Result<bool> {
    if !store.exists(unit.oid)? {
        return Ok(false);
    }
    let now = Zeroizing::new(store.read(unit.oid, unit.offset, unit.plaintext.len())?);
    Ok(now[..] == unit.plaintext[..])
}

fn superblocks(medium: &dyn Medium) -> std::io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for slot in [Slot::A, Slot::B] {
        out.extend(medium.read_superblock(slot)?);
    }
    Ok(out)
}

/// `oubli audit [--with-copy DIR]... [--with-versions] [--with-vault-copy FILE]... [--json]`.
pub fn audit(
    g: &Global,
    copies: &[PathBuf],
    with_versions: bool,
    vault_copies: &[PathBuf],
    json: bool,
) -> Result<String, Failure> {
    let versions_of = match (with_versions, &g.remote) {
        (false, _) => None,
        (true, Some(at)) => Some(at),
        (true, None) => {
            return Err(Failure::usage(
                "--with-versions is for a store in an S3 bucket (--store s3://...)",
            ))
        }
    };
    g.require_store()?;
    let _lock = g.lock(Access::Read)?;
    let provider = session::provider();
    let password = g.password()?;
    let vault = Arc::new(g.open_vault_at(&g.vault, &password, &provider)?);
    let mut old_keys = Vec::new();
    for path in vault_copies {
        let old = g.open_vault_at(path, &password, &provider)?;
        old_keys.extend(old.readable_records().map_err(|e| g.fail(e.into()))?);
    }
    // The share vaults are opened too, to find (and erase) older records.
    let share_opener = g.share_opener(&password, &provider);
    drop(password);

    let working = crate::ui::spinner("auditing: every key the adversary holds against every byte");
    let opened = g.open_store(vault.clone(), Access::Read, &provider);
    // The adversary holds the vault's whole content: the current key and
    // any older one a rotation left behind (read after the open, which
    // destroys such leftovers if it can).
    let mut keys = vault.readable_records().map_err(|e| g.fail(e.into()))?;
    let vault_leftover_epochs: Vec<u64> = keys.iter().skip(1).map(|k| k.epoch).collect();
    keys.extend(old_keys);
    let mut share_leftovers = Vec::new();
    let mut unnamed = (0, 0);
    let (judge, own) = match opened {
        Ok(store) => {
            let own = store.audit().map_err(|e| g.fail(e))?;
            store.set_share_opener(share_opener);
            share_leftovers = store
                .share_leftovers()
                .into_iter()
                .map(|l| oubli::report::ShareLeftoverReport {
                    share: l.name,
                    vault: l.vault,
                    why: l.why,
                })
                .collect();
            for oid in oubli::orphans::orphans(&store).map_err(|e| g.fail(e))? {
                let size = store.object(oid).map_err(|e| g.fail(e))?.size;
                unnamed = (unnamed.0 + 1, unnamed.1 + size);
            }
            (
                Judge::Current {
                    store: Box::new(store),
                },
                Some(own),
            )
        }
        // An old copy of the vault: it cannot open the store, but it may
        // open old copies of the medium — exactly what must be shown.
        Err(e @ Error::VaultBehind { .. }) if !copies.is_empty() || with_versions => {
            (Judge::Stale(e), None)
        }
        Err(e) => return Err(g.fail(e)),
    };

    let mut report = AuditJson {
        store: g.store.display().to_string(),
        epoch: match &judge {
            Judge::Current { store, .. } => Some(store.epoch()),
            Judge::Stale(_) => None,
        },
        verdict: "ok",
        vault_epochs: keys.iter().map(|k| k.epoch).collect(),
        vault_leftover_epochs,
        share_leftovers,
        unnamed_objects: unnamed.0,
        unnamed_bytes: unnamed.1,
        own: own.map(own_report),
        copies: Vec::new(),
        total: Counts::default(),
        stale_vault: match &judge {
            Judge::Stale(why) => Some(why.to_string()),
            Judge::Current { .. } => None,
        },
    };
    // A cell found in several copies is one cell (segments are append-only
    // and never reuse an address, so the address identifies it).
    let mut seen = HashSet::new();
    let mut total_copies = Counts::default();
    let mut sources = Vec::new();
    for path in copies {
        sources.push(dir_copy(path)?);
    }
    if let Some(at) = versions_of {
        sources.push(versions_copy(g, at)?);
    }
    for copy in sources {
        let copy = audit_copy(
            g,
            copy,
            &keys,
            &provider,
            &judge,
            &mut seen,
            &mut total_copies,
        )?;
        report.copies.push(copy);
    }
    let own = report.own.as_ref().map(|o| &o.counts);
    report.total = Counts {
        live_units: own.map_or(0, |c| c.live_units) + total_copies.live_units,
        pending_units: own.map_or(0, |c| c.pending_units) + total_copies.pending_units,
        leaked_units: own.map_or(0, |c| c.leaked_units) + total_copies.leaked_units,
        unreadable_units: own.map_or(0, |c| c.unreadable_units) + total_copies.unreadable_units,
    };
    if let (Judge::Stale(error), 0) = (judge, report.total.leaked_units) {
        // Nothing opened with the old vault: the store itself cannot be
        // audited with it, which is the error to report.
        return Err(g.fail(error));
    }
    report.verdict = if report.total.leaked_units > 0 {
        "leaked"
    } else if !report.vault_leftover_epochs.is_empty() || !report.share_leftovers.is_empty() {
        "incomplete"
    } else if report.total.pending_units > 0 {
        "pending"
    } else if report.unnamed_objects > 0 {
        "unnamed"
    } else {
        "ok"
    };

    drop(working);
    let text = if json {
        serde_json::to_string_pretty(&report).expect("plain data") + "\n"
    } else {
        render(&report)
    };
    if report.total.leaked_units == 0
        && report.vault_leftover_epochs.is_empty()
        && report.share_leftovers.is_empty()
    {
        return Ok(text);
    }
    if report.total.leaked_units == 0 && report.vault_leftover_epochs.is_empty() {
        crate::emit(&text)?;
        let l = &report.share_leftovers[0];
        return Err(Failure::new(
            exit::LEAKED,
            ui::share_leftover(&l.share, &l.vault, &l.why),
            "a share vault could not destroy an older record; make it writable and reachable, then run `oubli share destroy NAME` again (if its destruction was cut short) or any `oubli` command, and audit again",
        ));
    }
    if report.total.leaked_units == 0 {
        crate::emit(&text)?;
        return Err(Failure::new(
            exit::LEAKED,
            ui::erasure_incomplete(&report.vault_leftover_epochs, None),
            "the vault could not destroy an older key after a rotation was cut short; make the vault writable and reachable and run any `oubli` command (each open retries), then audit again",
        ));
    }
    crate::emit(&text)?;
    Err(Failure::new(
        exit::LEAKED,
        format!(
            "erasure failure: {} deleted unit(s) can still be recovered",
            report.total.leaked_units
        ),
        if report.stale_vault.is_some() || !vault_copies.is_empty() {
            "an old copy of the vault opens old copies of the store: keep the vault where overwrites really erase (TPM, token; see docs/THREAT_MODEL.md) and destroy stale vault copies"
        } else {
            "this must not happen: data deleted before the last commit opens with the current vault key; please report it with the output of `oubli audit --json`"
        },
    ))
}

fn own_report(r: AuditReport) -> OwnReport {
    OwnReport {
        epochs_opened: r.epochs_opened,
        units_opened: r.units_opened,
        counts: Counts {
            live_units: r.live_units,
            pending_units: r.pending_units,
            leaked_units: r.leaked_units,
            unreadable_units: r.unreadable_units,
        },
    }
}

/// What the adversary holds besides the store's own medium: a medium and
/// the superblocks to open it with.
struct Copy {
    label: String,
    medium: Arc<dyn Medium>,
    superblocks: Vec<Vec<u8>>,
}

/// `--with-copy DIR`: an old copy of the store directory.
fn dir_copy(path: &Path) -> Result<Copy, Failure> {
    let bad_copy = |e: Error| {
        let code = oubli::exit_code(&e);
        Failure::new(
            code,
            format!("cannot read the copy {}: {e}", path.display()),
            "--with-copy takes a copy of the store directory (a backup or a snapshot of it)",
        )
    };
    let medium = oubli::open_dir_medium(path).map_err(bad_copy)?;
    let blocks = superblocks(&medium).map_err(|e| {
        bad_copy(Error::Io {
            context: "reading its superblocks".into(),
            source: e,
        })
    })?;
    Ok(Copy {
        label: path.display().to_string(),
        medium: Arc::new(medium),
        superblocks: blocks,
    })
}

/// `--with-versions`: every version the store's bucket kept of every
/// object (what the provider, its replicas and its backups hold), as one
/// copy: the segments rebuilt from every run and pack version, opened with
/// every superblock any version held.
fn versions_copy(g: &Global, at: &oubli_s3::S3Location) -> Result<Copy, Failure> {
    let failed = |e: std::io::Error| {
        g.fail(Error::Io {
            context: format!("reading every version of {at}"),
            source: e,
        })
    };
    let config = oubli_s3::S3Config::from_env().map_err(failed)?;
    let history = oubli_s3::Admin::new(&config)
        .and_then(|admin| admin.history(at))
        .map_err(failed)?;
    Ok(Copy {
        label: format!("{at} (every version: {} objects)", history.versions),
        medium: Arc::new(oubli::MemMedium::from_pieces(history.pieces)),
        superblocks: history.superblocks,
    })
}

#[allow(clippy::too_many_arguments)]
fn audit_copy(
    g: &Global,
    copy: Copy,
    keys: &[VaultRecord],
    provider: &Arc<dyn CryptoProvider>,
    judge: &Judge,
    seen: &mut HashSet<u64>,
    total: &mut Counts,
) -> Result<CopyReport, Failure> {
    let recovery = recover(&copy.superblocks, copy.medium, keys, provider.clone());
    let mut counts = Counts {
        unreadable_units: recovery.failures,
        ..Counts::default()
    };
    let mut here = HashSet::new();
    for unit in &recovery.units {
        if !here.insert(unit.addr) {
            continue;
        }
        let class = judge.classify(unit).map_err(|e| g.fail(e))?;
        counts.add(class);
        if seen.insert(unit.addr) {
            total.add(class);
        }
    }
    total.unreadable_units += recovery.failures;
    Ok(CopyReport {
        path: copy.label,
        epochs_opened: recovery.epochs_opened.iter().copied().collect(),
        units_opened: here.len(),
        counts,
    })
}

fn epochs(list: &[u64]) -> String {
    if list.is_empty() {
        "none".into()
    } else {
        list.iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn render(r: &AuditJson) -> String {
    let mut out = String::new();
    let line = |out: &mut String, label: &str, n: usize, what: &str| {
        out.push_str(&format!("  {label:<14}{n:>8}  {what}\n"));
    };
    match (&r.own, r.epoch) {
        (Some(own), Some(epoch)) => {
            out.push_str(&format!(
                "audit of store {} at epoch {epoch}, as an adversary holding its medium, the vault and the password\n",
                r.store
            ));
            out.push_str(&format!(
                "store medium (epochs opened: {}):\n",
                epochs(&own.epochs_opened)
            ));
            counts_lines(&mut out, &own.counts, &line);
        }
        _ => {
            out.push_str(&format!(
                "audit of store {} with a vault at epoch {}: {}\n",
                r.store,
                epochs(&r.vault_epochs),
                r.stale_vault.as_deref().unwrap_or("")
            ));
            out.push_str("this vault is an OLD COPY: everything that opens with it is exposed\n");
        }
    }
    for c in &r.copies {
        out.push_str(&format!(
            "copy {} (epochs opened: {}; {} units opened):\n",
            c.path,
            epochs(&c.epochs_opened),
            c.units_opened
        ));
        counts_lines(&mut out, &c.counts, &line);
    }
    let t = &r.total;
    out.push_str(&match r.verdict {
        "leaked" => format!(
            "verdict: ERASURE FAILURE: {} unit(s) of deleted data can still be recovered\n",
            t.leaked_units
        ),
        "incomplete" if r.vault_leftover_epochs.is_empty() => r
            .share_leftovers
            .iter()
            .map(|l| format!("verdict: {}\n", ui::share_leftover(&l.share, &l.vault, &l.why)))
            .collect(),
        "incomplete" => format!(
            "verdict: {}\n",
            ui::erasure_incomplete(&r.vault_leftover_epochs, None)
        ),
        "unnamed" => format!(
            "verdict: nothing deleted can be recovered, but {} object(s) that no name reaches hold {} readable with the vault, as live data is (an `oubli put` that did not finish): the next command that changes the store erases them, or `oubli gc` now\n",
            r.unnamed_objects,
            ui::size(r.unnamed_bytes)
        ),
        "pending" => format!(
            "verdict: nothing deleted before the last commit can be recovered; {} unit(s) deleted since then stay recoverable until the next commit (run `oubli commit` to erase them now)\n",
            t.pending_units
        ),
        _ => "verdict: nothing deleted can be recovered\n".to_string(),
    });
    out
}

fn counts_lines(out: &mut String, c: &Counts, line: &dyn Fn(&mut String, &str, usize, &str)) {
    line(
        out,
        "live",
        c.live_units,
        "current data (readable by design with the vault and password)",
    );
    line(
        out,
        "pending",
        c.pending_units,
        "deleted since the last commit: erased at the next commit",
    );
    line(
        out,
        "leaked",
        c.leaked_units,
        "deleted before the last commit yet recoverable (erasure failure)",
    );
    line(
        out,
        "unreadable",
        c.unreadable_units,
        "referenced but missing or damaged",
    );
}

/// `--fs`: the file systems whose free blocks `oubli audit` can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FsArg {
    /// ext4 (and ext2/ext3): block bitmaps
    Ext4,
}

#[derive(Serialize)]
struct FsAuditJson {
    export: String,
    block_size: u64,
    fs_free_blocks: u64,
    /// Byte ranges `[start, end)` the file system has free but the store holds.
    held: Vec<(u64, u64)>,
    held_bytes: u64,
    /// Free blocks the store holds as zeros (nothing to recover; `--erase` drops them too).
    held_zero_bytes: u64,
    erased: bool,
    /// The epoch committed after erasing.
    epoch: Option<u64>,
}

/// `oubli audit --fs ext4 --export NAME [--erase]`: what the file system on
/// an export has free but the store still holds readable — deletions no
/// TRIM and no inference reached — and, with `--erase`, drops them and commits.
pub fn fs_audit(
    g: &Global,
    fs: FsArg,
    export: &str,
    erase: bool,
    json: bool,
) -> Result<String, Failure> {
    let FsArg::Ext4 = fs;
    let s = g.open(if erase { Access::Write } else { Access::Read })?;
    let store = &s.store;
    let exp = oubli_nbd::lookup_export(store, export)
        .map_err(|e| g.fail(e))?
        .ok_or_else(|| g.fail(Error::NoName(format!("export {export}"))))?;
    let free = oubli_ext4::free_space(&mut |off, buf: &mut [u8]| {
        let got = store
            .read(exp.oid, off, buf.len())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        buf.fill(0);
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        Ok(())
    }, exp.size)
    .map_err(|u| {
        Failure::new(
            exit::USAGE,
            format!("export {export:?}: {u}"),
            "the export must hold an unmounted ext4 whose journal is replayed (mount it once, or e2fsck)",
        )
    })?
    .ok_or_else(|| Failure::usage(format!("export {export:?} holds no ext4 file system")))?;
    let extents = store.extents(exp.oid, 0, exp.size).map_err(|e| g.fail(e))?;
    let bs = free.block_size;
    let mut held: Vec<(u64, u64)> = Vec::new();
    for (start, len) in extents {
        let end = start + len;
        // Free block ranges overlapping this stored range.
        let first_block = start / bs;
        let i = free.ranges.partition_point(|r| r.1 <= first_block);
        for r in &free.ranges[i..] {
            let (a, b) = ((r.0 * bs).max(start), (r.1 * bs).min(end));
            if r.0 * bs >= end {
                break;
            }
            if a < b {
                match held.last_mut() {
                    Some(l) if l.1 == a => l.1 = b,
                    _ => held.push((a, b)),
                }
            }
        }
    }
    // Blocks the store holds as zeros (written by a page cache's
    // read-modify-write around a neighbour, or zeroed) reveal nothing: only
    // blocks with other bytes are deleted data still readable.
    let mut zero_bytes = 0u64;
    let mut with_data: Vec<(u64, u64)> = Vec::new();
    for &(a, b) in &held {
        let mut pos = a;
        while pos < b {
            let n = (b - pos).min(1 << 20);
            let bytes = store
                .read(exp.oid, pos, n as usize)
                .map_err(|e| g.fail(e))?;
            for (i, chunk) in bytes.chunks(bs as usize).enumerate() {
                let at = pos + i as u64 * bs;
                let end = (at + chunk.len() as u64).min(b);
                if chunk.iter().all(|&x| x == 0) {
                    zero_bytes += end - at;
                    continue;
                }
                match with_data.last_mut() {
                    Some(l) if l.1 == at => l.1 = end,
                    _ => with_data.push((at, end)),
                }
            }
            pos += n;
        }
    }
    let all_held = held;
    let held = with_data;
    let held_bytes: u64 = held.iter().map(|r| r.1 - r.0).sum();
    let mut epoch = None;
    if erase && !all_held.is_empty() {
        for &(a, b) in &all_held {
            store.punch_hole(exp.oid, a, b - a).map_err(|e| g.fail(e))?;
        }
        store.commit().map_err(|e| g.fail(e))?;
        epoch = Some(store.epoch());
    }
    let report = FsAuditJson {
        export: export.to_string(),
        block_size: bs,
        fs_free_blocks: free.free_blocks(),
        held: held.clone(),
        held_bytes,
        held_zero_bytes: zero_bytes,
        erased: erase && !all_held.is_empty(),
        epoch,
    };
    let text = if json {
        serde_json::to_string_pretty(&report).expect("plain data") + "\n"
    } else {
        let mut t = format!(
            "export {export:?}: ext4 with {} free blocks of {} bytes; the store holds {} of them ({}) in {} range(s), and {} more as zeros\n",
            report.fs_free_blocks,
            bs,
            held_bytes / bs,
            ui::size(held_bytes),
            held.len(),
            zero_bytes / bs
        );
        for (a, b) in held.iter().take(50) {
            t.push_str(&format!(
                "  blocks {}-{} (bytes {a}-{})\n",
                a / bs,
                (b - 1) / bs,
                b - 1
            ));
        }
        if held.len() > 50 {
            t.push_str(&format!("  ... {} more ranges\n", held.len() - 50));
        }
        match (erase, epoch) {
            (true, Some(e)) => t.push_str(&format!("erased: dropped and committed (epoch {e}): unrecoverable now\n")),
            (true, None) => t.push_str("nothing to erase\n"),
            (false, _) if held.is_empty() => t.push_str("ok: every block the file system has free is erased\n"),
            (false, _) => t.push_str("LEAKED: deleted data the file system freed is still readable; `--erase` drops it\n"),
        }
        t
    };
    if !erase && !held.is_empty() {
        return Err(Failure::new(exit::LEAKED, text.trim_end().to_string(), ""));
    }
    Ok(text)
}
