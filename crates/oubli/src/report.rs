//! Serializable reports: what `oubli status --json` prints and what a live mount or server answers on its control socket.

use oubli_core::{Error, Store};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `oubli status --json` prints, and what a live process's control
/// socket answers to `status`.
#[derive(Serialize, Deserialize)]
pub struct StatusReport {
    pub store: String,
    pub medium: String,
    pub epoch: u64,
    pub committed_at: u64,
    pub seconds_since_commit: u64,
    pub pending_deletions: u64,
    pub pending_erasure_bytes: u64,
    pub bytes_written_this_epoch: u64,
    pub live_bytes: u64,
    pub dead_bytes: u64,
    pub medium_bytes: u64,
    pub segments: usize,
    pub cell_size: u32,
    pub key_scheme: String,
    /// Bytes of the key scheme's committed state (0: every key is in the tree).
    #[serde(default)]
    pub key_scheme_state_bytes: u64,
    /// Bytes of key reference each unit's parent stores.
    #[serde(default)]
    pub key_ref_bytes: u32,
    /// Roots of the keyed hash forest (its fragmentation).
    #[serde(default)]
    pub key_forest_roots: Option<u64>,
    /// Keys held in the key storage area.
    #[serde(default)]
    pub key_area_keys: Option<u64>,
    pub provider: String,
    pub vault: VaultReport,
    pub policy: PolicyReport,
    /// Seconds until the epoch policy's interval commits (live processes).
    pub next_commit_in: Option<u64>,
    /// Why the last automatic commit failed (the epoch stays open, retried).
    pub last_commit_error: Option<String>,
    /// Epochs whose key the vault still holds besides the current one (a
    /// rotation cut between its two steps): "erasure incomplete" — what was
    /// deleted in them is recoverable until the vault destroys them.
    #[serde(default)]
    pub vault_leftover_epochs: Vec<u64>,
    /// Why the vault could not destroy them (retried at every commit and open).
    #[serde(default)]
    pub vault_leftover_error: Option<String>,
    /// Share vaults that still hold an older record they could not destroy
    /// (a `share destroy` cut short leaves the share's key there).
    #[serde(default)]
    pub share_leftovers: Vec<ShareLeftoverReport>,
    /// Snapshots the store keeps: what they hold is not erased by `rm`.
    #[serde(default)]
    pub snapshots: usize,
    /// The automatic cleaner's run in progress (live processes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaner: Option<CleanerReport>,
    /// Segments the cleaner emptied, deleted when the next commit lands.
    #[serde(default)]
    pub segments_awaiting_commit: usize,
    /// Units written over in place since the store was opened (live
    /// processes): overwrites that put no new version on the medium.
    #[serde(default)]
    pub units_rewritten: u64,
    /// Large cells split into small ones by writes at random, and split
    /// cells put back whole by writes over all of them, since the store
    /// was opened (live processes; DESIGN §3, "Split cells").
    #[serde(default)]
    pub cells_split: u64,
    #[serde(default)]
    pub cells_rejoined: u64,
    /// The medium's size, free space and reserve (`None`: it cannot tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceReport>,
    /// True when the figures come from the process holding the store open.
    pub live: bool,
    /// Vault wear projected at an epoch policy; filled in by the `oubli`
    /// command (a live process leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wear: Option<WearReport>,
    /// Exports served by the process holding the store (`oubli serve`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nbd_exports: Vec<NbdExportReport>,
    /// Wear of the chip of a store on simulated raw NAND (`--store nand:IMAGE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nand_wear: Option<NandWearReport>,
}

/// Room on the medium: new data is refused once only the reserve is left
/// (kept for deleting, committing, cleaning and opening).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SpaceReport {
    pub total: u64,
    pub free: u64,
    pub reserve: u64,
    /// What new data may still take.
    pub available: u64,
    /// Less than the reserve (or a tenth of the medium) left for data:
    /// `status` warns.
    pub nearly_full: bool,
}

/// How far the automatic cleaner's run has got.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CleanerReport {
    /// Segments it empties.
    pub victims: usize,
    pub bytes_moved: u64,
    /// Live bytes the victims held when the run started.
    pub bytes_to_move: u64,
}

/// How worn a NAND store's chip is, and how long it lasts at an epoch
/// policy (the figures DNEFS reports: erase counts, Hoover index, lifetime).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NandWearReport {
    pub blocks: u32,
    pub bad_blocks: u32,
    pub erase_count_min: u32,
    pub erase_count_mean: f64,
    pub erase_count_max: u32,
    /// 0 = perfectly even wear; near 1 = one block took every erasure.
    pub hoover_index: f64,
    pub rated_cycles: u64,
    /// Erasures per commit so far (every erasure since the chip was made
    /// over the store's epochs).
    pub erases_per_commit: f64,
    pub commits_per_day: f64,
    /// At that commit rate; `None` when nothing is erased at all.
    pub projected_lifetime_years: Option<f64>,
}

/// One export served by `oubli serve`: TRIMs received and inferred deletions.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct NbdExportReport {
    pub name: String,
    pub trims_received: u64,
    /// `"ext4"` with `--infer-deletes ext4`.
    pub infer_deletes: Option<String>,
    /// Blocks the ext4 journal showed freed and that were dropped.
    pub deletions_inferred_blocks: u64,
    pub deletions_inferred_bytes: u64,
    /// Keep decisions on blocks a commit showed free but that could not be
    /// proven dead yet (written since the previous commit), cumulative.
    pub suspicious_kept: u64,
    /// Blocks kept at the last commit, examined again at the next one.
    pub suspicious_now: u64,
    pub commits_seen: u64,
    /// Why inference stopped on this export, if it did.
    pub inference_stopped: Option<String>,
}

/// How long the vault lasts at an epoch policy's commit rate.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct WearReport {
    /// The interval the projection assumes, in seconds.
    pub interval_seconds: u64,
    /// Whose policy that is: `live` (the running mount or server) or
    /// `default` (the default interval of mount and serve).
    pub policy_source: String,
    pub commits_per_day: f64,
    /// The endurance the projection uses (`null`: the vault does not wear).
    pub endurance_writes: Option<u64>,
    /// Seconds until the rated writes are spent; `null` if never.
    pub projected_lifetime_seconds: Option<u64>,
    /// Set when that is within five years.
    pub warning: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub struct VaultReport {
    pub kind: String,
    pub location: String,
    pub writes: Option<u64>,
    pub endurance_writes: Option<u64>,
    pub overwrite_is_erasure: bool,
}

/// A share vault that still holds an older record ([`oubli_core::ShareLeftover`]).
#[derive(Serialize, Deserialize)]
pub struct ShareLeftoverReport {
    pub share: String,
    pub vault: String,
    /// Why the vault could not destroy it.
    pub why: String,
}

#[derive(Serialize, Deserialize)]
pub struct PolicyReport {
    /// "manual" (commits only when asked) or "automatic".
    pub mode: String,
    pub interval_seconds: Option<u64>,
    pub bytes: Option<u64>,
    pub deletions: Option<u64>,
}

/// The status of an open store (used by `status` and by the control socket).
pub fn status_report(store: &Store, store_path: &Path, live: bool) -> Result<StatusReport, Error> {
    let s = store.status()?;
    let manual =
        s.policy.interval.is_none() && s.policy.bytes.is_none() && s.policy.deletions.is_none();
    Ok(StatusReport {
        store: store_path.display().to_string(),
        medium: s.medium.clone(),
        epoch: s.epoch,
        committed_at: s.committed_at,
        seconds_since_commit: s.seconds_since_commit,
        pending_deletions: s.pending_deletions,
        pending_erasure_bytes: s.pending_erasure_bytes,
        bytes_written_this_epoch: s.bytes_written_this_epoch,
        live_bytes: s.live_bytes,
        dead_bytes: s.dead_bytes,
        medium_bytes: s.medium_bytes,
        segments: s.segments,
        cell_size: s.cell_size,
        key_scheme: s.key_scheme.to_string(),
        key_scheme_state_bytes: s.key_scheme_stats.state_bytes,
        key_ref_bytes: s.key_scheme_stats.key_ref_bytes,
        key_forest_roots: s.key_scheme_stats.roots,
        key_area_keys: s.key_scheme_stats.keys,
        provider: s.provider.to_string(),
        vault: VaultReport {
            kind: s.vault.kind.clone(),
            location: s.vault.location.clone(),
            writes: s.vault_writes,
            endurance_writes: s.vault.endurance_writes,
            overwrite_is_erasure: s.vault.overwrite_is_erasure,
        },
        policy: PolicyReport {
            mode: if manual { "manual" } else { "automatic" }.to_string(),
            interval_seconds: s.policy.interval.map(|d| d.as_secs()),
            bytes: s.policy.bytes,
            deletions: s.policy.deletions,
        },
        next_commit_in: s.next_commit_in,
        last_commit_error: s.last_commit_error,
        vault_leftover_epochs: s.vault_leftover_epochs,
        vault_leftover_error: s.vault_leftover_error,
        share_leftovers: s
            .share_leftovers
            .into_iter()
            .map(|l| ShareLeftoverReport {
                share: l.name,
                vault: l.vault,
                why: l.why,
            })
            .collect(),
        snapshots: s.snapshots,
        cleaner: s.cleaner.map(|c| CleanerReport {
            victims: c.victims,
            bytes_moved: c.bytes_moved,
            bytes_to_move: c.bytes_to_move,
        }),
        segments_awaiting_commit: s.segments_awaiting_commit,
        units_rewritten: s.units_rewritten,
        cells_split: s.cells_split,
        cells_rejoined: s.cells_rejoined,
        space: s.space.map(|sp| SpaceReport {
            total: sp.total,
            free: sp.free,
            reserve: sp.reserve,
            available: sp.available,
            nearly_full: sp.nearly_full(),
        }),
        live,
        wear: None,
        nbd_exports: Vec::new(),
        nand_wear: None,
    })
}

/// The renderer a mount or server hands to its control socket.
pub fn control_status(store_path: PathBuf) -> Arc<crate::control::StatusRenderer> {
    Arc::new(move |store: &Store| {
        status_report(store, &store_path, true)
            .map_err(|e| e.to_string())
            .map(|r| serde_json::to_string(&r).expect("plain data"))
    })
}

/// One snapshot as `oubli snapshot ls --json` prints it and the control
/// socket answers `snapshot-ls`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SnapshotReport {
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    pub epoch: u64,
    pub expires_at: Option<u64>,
    /// Sealed bytes only this snapshot reaches: what removing it erases and frees.
    pub unique_bytes: u64,
    /// Sealed bytes it shares with the live store or other snapshots.
    pub shared_bytes: u64,
}

/// Every snapshot of `store` with the space it holds.
pub fn snapshot_reports(store: &Store) -> Result<Vec<SnapshotReport>, Error> {
    let usage = store.snapshot_usage()?;
    Ok(store
        .snapshots()
        .into_iter()
        .zip(usage)
        .map(|(s, u)| SnapshotReport {
            name: s.name,
            created_at: s.created_at,
            epoch: s.epoch,
            expires_at: s.expires_at,
            unique_bytes: u.unique_bytes,
            shared_bytes: u.shared_bytes,
        })
        .collect())
}
