//! Measuring a store for a certificate, in the process that holds it (a one-shot command, or a mount through `certify-measure` on its control socket), and building the certificate from two measures.

use super::{
    audit_limits, method_for, now_utc, random_id, record_digest, Category, Certificate, Coverage,
    EpochTotals, Erased, ErasedItem, ItemKind, MediumKind, Method, NameForm, Outcome, RetainedItem,
    StoreFacts, Tool, VaultRecords, Verification, FORMAT, VERSION,
};
use crate::{Store, VaultInfo};
use serde::{Deserialize, Serialize};

impl From<&VaultInfo> for VaultFacts {
    fn from(info: &VaultInfo) -> VaultFacts {
        VaultFacts {
            kind: info.kind.clone(),
            location: info.location.clone(),
            overwrite_is_erasure: info.overwrite_is_erasure,
        }
    }
}

/// The vault's static facts (`VaultInfo` on the wire).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct VaultFacts {
    pub kind: String,
    pub location: String,
    pub overwrite_is_erasure: bool,
}

/// A store at one moment: its epoch, the digest of its vault's record,
/// what is pending erasure and what the audit opens.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Measure {
    /// Hex store id.
    pub store_id: String,
    pub epoch: u64,
    pub vault_epoch: u64,
    /// Hex `record_digest` of the vault's record.
    pub record_digest: String,
    /// What is pending erasure (deleted since the last commit).
    pub pending: EpochTotals,
    /// The audit: units it opened, deleted units that opened from before
    /// the last commit, older epochs the vault still holds.
    pub units_opened: u64,
    pub leaked_units: u64,
    pub vault_leftover_epochs: Vec<u64>,
    pub vault: VaultFacts,
    /// A mount's measure: the names it removed since its last commit (what
    /// that commit erases, by name). `None` from a process that does not
    /// know them (a server, a one-shot command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<RemovedNames>,
}

/// The names a mount removed since its last commit (`certify-measure`).
/// The names a mount removed since its last commit, oldest first (at
/// most 100,000), each with the object it named and what still holds that
/// object's data: the mount's own record, as the control socket carries it.
pub use oubli_fuse::Removals as RemovedNames;

/// A mount's removals as certificate items: erased when nothing holds the
/// object any more, otherwise retained with what keeps it. `name` writes a
/// name as the certificate does (`--hash-names`).
pub fn removal_items(
    removed: &RemovedNames,
    name: impl Fn(&str) -> String,
) -> (Vec<ErasedItem>, Vec<RetainedItem>) {
    let mut items = Vec::new();
    let mut retained = Vec::new();
    for r in &removed.paths {
        let mut kept_in: Vec<String> = r.snapshots.iter().map(|s| name(s)).collect();
        if r.still_linked {
            kept_in.push("another name".into());
        }
        if r.still_open {
            kept_in.push("an open file, until its last close".into());
        }
        if kept_in.is_empty() {
            items.push(ErasedItem {
                kind: ItemKind::Path,
                name: name(&r.path),
                object_ids: vec![r.object_id],
                bytes: r.bytes,
                from_snapshots: Vec::new(),
            });
        } else {
            retained.push(RetainedItem {
                kind: ItemKind::Path,
                name: name(&r.path),
                object_ids: vec![r.object_id],
                kept_in,
            });
        }
    }
    (items, retained)
}

/// Measures `store` now. Runs the audit: reads every unit the medium and
/// the vault open (as `oubli audit` does).
pub fn measure(store: &Store) -> crate::Result<Measure> {
    let status = store.status()?;
    let audit = store.audit()?;
    let record = store.vault_record()?;
    Ok(Measure {
        store_id: hex::encode(store.store_id()),
        epoch: store.epoch(),
        vault_epoch: record.epoch,
        record_digest: hex::encode(record_digest(&record)),
        pending: EpochTotals {
            deletions: status.pending_deletions,
            sealed_bytes: status.pending_erasure_bytes,
            units: audit.pending_units as u64,
        },
        units_opened: audit.units_opened as u64,
        leaked_units: audit.leaked_units as u64,
        vault_leftover_epochs: audit.vault_leftover_epochs,
        vault: VaultFacts {
            kind: status.vault.kind,
            location: status.vault.location,
            overwrite_is_erasure: status.vault.overwrite_is_erasure,
        },
        removed: None,
    })
}

impl Measure {
    /// Whether the erasure between `before` and this measure holds: the
    /// vault moved past `before`'s record and the audit opens nothing
    /// deleted before the last commit.
    pub fn outcome_since(&self, before: &Measure) -> Outcome {
        if self.leaked_units == 0
            && self.vault_leftover_epochs.is_empty()
            && self.vault_epoch > before.vault_epoch
            && self.record_digest != before.record_digest
        {
            Outcome::Pass
        } else {
            Outcome::Fail
        }
    }
}

/// What a certificate says beside the two measures.
pub struct Statement {
    pub command: String,
    pub names: NameForm,
    pub items: Vec<ErasedItem>,
    /// Erased names past those in `items` (a mount's list is bounded).
    pub items_unlisted: u64,
    pub retained: Vec<RetainedItem>,
    /// Everything the commit(s) erased (see `EpochTotals`).
    pub totals: EpochTotals,
    pub medium: MediumKind,
    /// The store as users name it (directory, `s3://...`, `nand:IMAGE`).
    pub location: String,
    pub tool: Tool,
    /// `share destroy`: the share's own vault, whose overwrite erased the
    /// data under the share.
    pub share_vault: Option<VaultFacts>,
}

/// The certificate of the erasure between `before` and `after`, unsigned.
pub fn build(before: &Measure, after: &Measure, statement: Statement) -> Certificate {
    let vault = VaultInfo {
        kind: after.vault.kind.clone(),
        location: after.vault.location.clone(),
        endurance_writes: None,
        overwrite_is_erasure: after.vault.overwrite_is_erasure,
    };
    Certificate {
        format: FORMAT.into(),
        version: VERSION,
        id: random_id(),
        issued_at: now_utc(),
        command: statement.command,
        erased: Erased {
            names: statement.names,
            items: statement.items,
            items_unlisted: statement.items_unlisted,
            retained: statement.retained,
            epoch_totals: statement.totals.clone(),
        },
        store: StoreFacts {
            id: after.store_id.clone(),
            medium: statement.medium,
            location: statement.location,
            epoch_before: before.epoch,
            epoch_after: after.epoch,
        },
        method: match &statement.share_vault {
            None => method_for(&vault),
            Some(share) => with_share_vault(method_for(&vault), share),
        },
        verification: Verification {
            method: "oubli audit".into(),
            coverage: Coverage::Full,
            erased_units_before: statement.totals.units,
            units_opened_after: after.units_opened,
            leaked_units_after: after.leaked_units,
            vault_leftover_epochs: after.vault_leftover_epochs.clone(),
            outcome: after.outcome_since(before),
            limits: audit_limits(),
        },
        tool: statement.tool,
        vault_records: VaultRecords {
            algorithm: "sha-256".into(),
            before: before.record_digest.clone(),
            after: after.record_digest.clone(),
        },
        vault_attestation: None,
    }
}

/// The method of a share's destruction: the data under the share needed
/// the share's key, destroyed in the share's own vault; a Purge only if
/// that vault's overwrite erases too.
pub fn with_share_vault(mut method: Method, share: &VaultFacts) -> Method {
    let share_method = method_for(&VaultInfo {
        kind: share.kind.clone(),
        location: share.location.clone(),
        endurance_writes: None,
        overwrite_is_erasure: share.overwrite_is_erasure,
    });
    let erases = share_method.category == Category::Purge;
    if !erases {
        method.category = Category::Clear;
    }
    method.statement += &format!(
        " The data placed under the share was sealed under the share's key as well; that key was destroyed in the share's own vault, of kind {} at {}, {}",
        share.kind,
        share.location,
        if erases {
            "whose overwrite destroys the old value on the device."
        } else {
            "whose medium may keep old copies of it: the share's erasure is NOT a Purge."
        }
    );
    method
}

/// The sum of two totals (an open's commit, then the command's).
pub fn add(a: &EpochTotals, b: &EpochTotals) -> EpochTotals {
    EpochTotals {
        deletions: a.deletions + b.deletions,
        sealed_bytes: a.sealed_bytes + b.sealed_bytes,
        units: a.units + b.units,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(kind: &str, erases: bool) -> VaultFacts {
        VaultFacts {
            kind: kind.into(),
            location: "x".into(),
            overwrite_is_erasure: erases,
        }
    }

    #[test]
    fn a_share_destroyed_in_a_vault_that_keeps_copies_makes_no_purge() {
        let token = VaultInfo {
            kind: "pkcs11".into(),
            location: "t".into(),
            endurance_writes: None,
            overwrite_is_erasure: true,
        };
        let m = with_share_vault(method_for(&token), &facts("file", false));
        assert_eq!(m.category, Category::Clear);
        assert!(
            m.statement.contains("share's erasure is NOT a Purge"),
            "{}",
            m.statement
        );
        let m = with_share_vault(method_for(&token), &facts("tpm2", true));
        assert_eq!(m.category, Category::Purge);
        assert!(
            m.statement.contains("share's own vault, of kind tpm2"),
            "{}",
            m.statement
        );
    }
}
