//! A certificate's TPM attestation against swtpm: bound to its certificate, checked without the TPM, and again with it after a rollback.

#![cfg(feature = "tpm")]

#[path = "../../oubli-vault/tests/common/mod.rs"]
#[macro_use]
mod hw;

use hw::{skip_hw, Swtpm};
use oubli::certificate::attestation::{check, check_now, open_tpm, TpmEvidence};
use oubli::certificate::{Certificate, VaultAttestation};
use oubli::crates::crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli::crates::vault::{KdfParams, TpmOptions, TpmVault, Vault, VaultRecord};
use std::sync::Arc;

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn password() -> SecretBytes {
    SecretBytes::new(b"certificate tpm".to_vec())
}

fn rec(epoch: u64) -> VaultRecord {
    hw::record(0x33, 0x44, epoch)
}

fn address(tpm: &Swtpm) -> String {
    format!("tpm:{}", tpm.location())
}

fn create(tpm: &Swtpm) -> TpmVault {
    TpmVault::create(
        &tpm.tpm_location(),
        &password(),
        KdfParams::testing(),
        &rec(1),
        provider(),
        TpmOptions::default(),
    )
    .unwrap()
}

/// The vault on `tpm`, opened as `certificate verify --store` opens it.
fn opened(tpm: &Swtpm) -> TpmVault {
    open_tpm(&address(tpm), &password(), provider())
        .unwrap()
        .unwrap()
}

/// Fails the test unless one of the TPM's `problems` contains `what`.
fn assert_a_problem_says(problems: &[String], what: &str) {
    assert!(problems.iter().any(|p| p.contains(what)), "{problems:?}");
}

/// A certificate of an erasure on the vault `v`, everything but the attestation.
fn certificate(v: &TpmVault) -> Certificate {
    let info = v.info();
    serde_json::from_value(serde_json::json!({
        "format": "oubli-certificate-of-sanitization",
        "version": 1,
        "id": "00112233445566778899aabbccddeeff",
        "issued_at": "2026-12-07T12:00:00Z",
        "command": "oubli rm --purge",
        "erased": {
            "names": {"form": "plain"},
            "items": [{"kind": "name", "name": "payroll-2025.csv", "object_ids": [7],
                       "bytes": 4096, "from_snapshots": []}],
            "retained": [],
            "epoch_totals": {"deletions": 1, "sealed_bytes": 4200, "units": 1}
        },
        "store": {"id": "44444444444444444444444444444444", "medium": "directory",
                  "location": "/srv/store", "epoch_before": 1, "epoch_after": 2},
        "method": {"technique": "cryptographic erase", "category": "clear",
                   "vault_kind": info.kind, "vault_location": info.location,
                   "vault_overwrite_erases": info.overwrite_is_erasure, "statement": "..."},
        "verification": {"method": "oubli audit", "coverage": {"kind": "full"},
                         "erased_units_before": 1, "units_opened_after": 0,
                         "leaked_units_after": 0, "vault_leftover_epochs": [],
                         "outcome": "pass", "limits": []},
        "tool": {"name": "oubli", "version": "test", "features": ["+tpm"],
                 "crypto_provider": "ring"},
        "vault_records": {"algorithm": "sha-256", "before": "00", "after": "11"},
        "vault_attestation": null
    }))
    .unwrap()
}

/// Epoch 1 -> 2 on a fresh vault, certified as the CLI does it; and the
/// SHA-256 of the sealed slot now current.
fn certified(tpm: &Swtpm) -> (Certificate, [u8; 32]) {
    let v = create(tpm);
    let evidence = TpmEvidence::before_commit(&address(tpm), &password(), provider())
        .unwrap()
        .expect("a tpm: location");
    v.store(&rec(2)).unwrap();
    let mut c = certificate(&v);
    c.vault_attestation = Some(evidence.attest(&c).unwrap());
    (c, v.current_record_digest().unwrap())
}

#[test]
fn the_attestation_verifies_only_with_its_own_certificate() {
    hw!();
    let tpm = Swtpm::start();
    let (c, current) = certified(&tpm);
    let summary = check(&c).unwrap().unwrap();
    assert!(summary.contains("TPM attestation valid"), "{summary}");
    assert!(summary.contains("held epoch 1's record"), "{summary}");
    assert!(summary.contains("is blank"), "{summary}");

    // Any fact changed breaks the binding, even under a fresh signature.
    let mut edits: Vec<(&str, Certificate)> = Vec::new();
    let mut e = c.clone();
    e.issued_at = "2026-12-08T12:00:00Z".into();
    edits.push(("issued_at", e));
    let mut e = c.clone();
    e.erased.items[0].name = "payroll-2024.csv".into();
    edits.push(("item name", e));
    let mut e = c.clone();
    e.store.epoch_before = 0;
    edits.push(("epoch_before", e));
    let mut e = c.clone();
    e.id = "ffeeddccbbaa99887766554433221100".into();
    edits.push(("id", e));
    for (what, edited) in edits {
        let err = check(&edited).unwrap_err();
        assert!(err.contains("qualifying data"), "{what}: {err}");
    }

    // The attestation's own fields.
    let Some(VaultAttestation::TpmNvCertify { .. }) = &c.vault_attestation else {
        panic!("a TPM attestation");
    };
    let edit = |f: &dyn Fn(&mut VaultAttestation)| {
        let mut e = c.clone();
        f(e.vault_attestation.as_mut().unwrap());
        check(&e).unwrap_err()
    };
    // The "before" digest must be what the TPM certified before the commit.
    for digest in [hex::encode(current), "00".repeat(32)] {
        let err = edit(&|a| {
            let VaultAttestation::TpmNvCertify {
                sealed_record_before,
                ..
            } = a;
            *sealed_record_before = digest.clone();
        });
        assert!(err.contains("not what the TPM certified"), "{err}");
    }
    // The certification before the commit is checked like the others.
    let err = edit(&|a| {
        let VaultAttestation::TpmNvCertify {
            before_qualifying_data,
            ..
        } = a;
        *before_qualifying_data = "00".repeat(32);
    });
    assert!(err.contains("qualifying data"), "{err}");
    // "Before" taken from after the commit (the current slot's statement) is
    // a record that is still there.
    let err = edit(&|a| {
        let VaultAttestation::TpmNvCertify {
            attest,
            signature,
            nv_index,
            qualifying_data,
            before_attest,
            before_signature,
            before_nv_index,
            before_qualifying_data,
            sealed_record_before,
            ..
        } = a;
        *before_attest = attest.clone();
        *before_signature = signature.clone();
        *before_nv_index = *nv_index;
        *before_qualifying_data = qualifying_data.clone();
        *sealed_record_before = hex::encode(current);
    });
    assert!(err.contains("still holds the erased"), "{err}");
    let err2 = edit(&|a| {
        let VaultAttestation::TpmNvCertify { nv_index, .. } = a;
        *nv_index += 7;
    });
    assert!(err2.contains("not the slots of the vault"), "{err2}");
    let err3 = edit(&|a| {
        let VaultAttestation::TpmNvCertify {
            other_attest,
            attest,
            ..
        } = a;
        std::mem::swap(other_attest, attest);
    });
    assert!(err3.contains("TPM attestation"), "{err3}");
}

#[test]
fn a_tpm_rolled_back_to_epoch_n_fails_the_check_with_the_tpm() {
    hw!();
    let mut tpm = Swtpm::start();
    let saved = {
        // The simulator's NV state with epoch 1's record, taken right after create.
        let _v = create(&tpm);
        tpm.nv_files()
    };
    let v = opened(&tpm);
    let evidence = TpmEvidence::before_commit(&address(&tpm), &password(), provider())
        .unwrap()
        .unwrap();
    v.store(&rec(2)).unwrap();
    let mut c = certificate(&v);
    c.vault_attestation = Some(evidence.attest(&c).unwrap());
    drop((v, evidence));
    let v = opened(&tpm);
    assert_eq!(check_now(&v, &c).unwrap(), Vec::<String>::new());
    drop(v);

    tpm.roll_back(&saved);
    let v = opened(&tpm);
    assert_eq!(v.load().unwrap().epoch, 1);
    // The certificate alone still verifies (it says what was true then) ...
    check(&c).unwrap().unwrap();
    // ... the TPM now says epoch 1's record is back.
    let problems = check_now(&v, &c).unwrap();
    assert_a_problem_says(&problems, "still holds the erased");
}

#[test]
fn another_tpm_has_another_attestation_key() {
    hw!();
    let tpm = Swtpm::start();
    let (c, _) = certified(&tpm);
    let other = Swtpm::start();
    let _v = create(&other);
    let v = opened(&other);
    let problems = check_now(&v, &c).unwrap();
    assert_a_problem_says(&problems, "attestation key now is not");
}
