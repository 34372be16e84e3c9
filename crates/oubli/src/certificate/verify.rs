//! Checking a certificate: its signature (and the key it should be by), then, given the store as it is now, that the erasure still holds.

use super::sign::{fingerprint, ALGORITHM};
use super::{ItemKind, SignedCertificate};
use base64::Engine as _;
use ring::signature::{UnparsedPublicKey, ED25519};

/// Checks the signature over the certificate's signed bytes with the public
/// key the certificate names, and, if `trusted` is given, that it is that
/// key. Returns the signer's fingerprint.
pub fn check_signature(
    signed: &SignedCertificate,
    trusted: Option<&[u8; 32]>,
) -> Result<String, String> {
    let s = &signed.signature;
    if s.algorithm != ALGORITHM {
        return Err(format!(
            "signature algorithm {:?} (this oubli checks {ALGORITHM})",
            s.algorithm
        ));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let public: [u8; 32] = b64
        .decode(&s.public_key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or("the signature's public key is not 32 bytes of base64")?;
    let value = b64
        .decode(&s.value)
        .map_err(|_| "the signature is not base64")?;
    if let Some(trusted) = trusted {
        if *trusted != public {
            return Err(format!(
                "signed by key {}, not by the key given with --public-key ({})",
                fingerprint(&public),
                fingerprint(trusted)
            ));
        }
    }
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&signed.certificate.signed_bytes(), &value)
        .map_err(|_| {
            "the signature does not match the certificate: it was altered after signing, or signed by another key".to_string()
        })?;
    Ok(fingerprint(&public))
}

/// The store as it is now, as `verify --store` sees it.
#[derive(Debug, Clone, Default)]
pub struct StoreNow {
    /// Hex store id.
    pub store_id: String,
    /// The vault's record now: its epoch and digest (`record_digest`).
    pub vault_epoch: u64,
    pub vault_record_digest: String,
    /// The store's epoch, if the store opened with the vault (a vault
    /// older than the store does not open it).
    pub store_epoch: Option<u64>,
    /// Of the certificate's erased object ids, those the store still holds.
    pub objects_present: Vec<u64>,
    /// The snapshots taken by epoch N and the shares not destroyed made
    /// before the certificate (names in clear; hashed here when the
    /// certificate hashes names): an erased one among them is back.
    pub snapshots: Vec<String>,
    pub live_shares: Vec<String>,
    /// The audit now: deleted units that still open, and older vault keys.
    pub leaked_units: u64,
    pub vault_leftover_epochs: Vec<u64>,
    /// What the vault's hardware says now against the certificate's
    /// attestation (a TPM certifying its NV indices again).
    pub attestation_problems: Vec<String>,
}

/// What `verify --store` found wrong; empty when the erasure holds.
pub fn check_against_store(signed: &SignedCertificate, now: &StoreNow) -> Vec<String> {
    let c = &signed.certificate;
    let mut problems = Vec::new();
    if now.store_id != c.store.id {
        problems.push(format!(
            "the store's id is {}, the certificate's store is {}",
            now.store_id, c.store.id
        ));
        return problems;
    }
    if now.vault_record_digest == c.vault_records.before {
        problems.push(format!(
            "the vault holds epoch {}'s record again, the one the certificate says was destroyed: the vault was rolled back (restored from a copy)",
            c.store.epoch_before
        ));
    }
    if now.vault_epoch <= c.store.epoch_before {
        problems.push(format!(
            "the vault is at epoch {}, not past epoch {} that the certificate says ended: the vault was rolled back or replaced",
            now.vault_epoch, c.store.epoch_before
        ));
    }
    match now.store_epoch {
        None => problems.push(
            "the store does not open with its vault (the vault is older than the store)".into(),
        ),
        Some(epoch) if epoch <= c.store.epoch_before => problems.push(format!(
            "the store is at epoch {epoch}, not past epoch {}",
            c.store.epoch_before
        )),
        Some(_) => {}
    }
    if !now.objects_present.is_empty() {
        problems.push(format!(
            "the store still holds erased object(s) {:?}",
            now.objects_present
        ));
    }
    let shown = |list: &[String]| -> Vec<String> {
        list.iter()
            .filter_map(|n| c.erased.names.show(n).ok())
            .collect()
    };
    let (snapshots, shares) = (shown(&now.snapshots), shown(&now.live_shares));
    for item in &c.erased.items {
        let (present, what) = match item.kind {
            // A name or path may have been used again for new data; its
            // old objects are checked above. Snapshots and shares are
            // named once.
            ItemKind::Name | ItemKind::Path => (false, ""),
            ItemKind::Snapshot => (snapshots.contains(&item.name), "snapshot"),
            ItemKind::Share => (shares.contains(&item.name), "share (not destroyed)"),
        };
        if present {
            problems.push(format!("the store has a {what} {} again", item.name));
        }
    }
    if now.leaked_units > 0 {
        problems.push(format!(
            "the audit opens {} deleted unit(s) with the vault now",
            now.leaked_units
        ));
    }
    if !now.vault_leftover_epochs.is_empty() {
        problems.push(format!(
            "the vault still holds the key(s) of epoch(s) {:?}",
            now.vault_leftover_epochs
        ));
    }
    problems.extend(now.attestation_problems.iter().cloned());
    if c.erased.names.show("").is_err() {
        problems.push("the certificate's salt is unreadable".into());
    }
    problems
}
