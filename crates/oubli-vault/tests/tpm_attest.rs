//! TPM2_NV_Certify of a TpmVault's slots against swtpm: what the digests say after a rotation, and tampering caught.

#![cfg(feature = "tpm")]

#[macro_use]
mod common;

use common::{skip_hw, tpm_options, Swtpm};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_vault::tpm_attest::{
    blank_slot_digest, verify_nv_certification, verify_rotation, verify_slot_certifications,
    SlotCertifications,
};
use oubli_vault::{KdfParams, TpmVault, Vault, VaultRecord};
use std::sync::Arc;

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn rec(epoch: u64) -> VaultRecord {
    common::record(0x5A, 0x17, epoch)
}

fn create(tpm: &Swtpm) -> TpmVault {
    TpmVault::create(
        &tpm.tpm_location(),
        &SecretBytes::new(b"hunter2".to_vec()),
        KdfParams::testing(),
        &rec(1),
        provider(),
        tpm_options(),
    )
    .unwrap()
}

const QD: &[u8] = &[0x42; 32];

/// A vault rotated once from epoch 1 to 2, its slots certified with `QD`,
/// and the sealed-record digests before and after.
fn rotated_and_certified(tpm: &Swtpm) -> (TpmVault, SlotCertifications, [u8; 32], [u8; 32]) {
    let v = create(tpm);
    let old = v.current_record_digest().unwrap();
    v.store(&rec(2)).unwrap();
    let new = v.current_record_digest().unwrap();
    let certs = v.certify_slots(QD).unwrap();
    (v, certs, old, new)
}

#[test]
fn after_a_rotation_the_tpm_certifies_the_new_record_and_a_blank_slot() {
    hw!();
    let tpm = Swtpm::start();
    let (v, certs, old, new) = rotated_and_certified(&tpm);
    assert_ne!(old, new);
    let state = verify_slot_certifications(&certs, Some(new), Some(old), QD).unwrap();
    assert_eq!(state.current.digest, new);
    assert_ne!(state.current.digest, old);
    assert_eq!(state.other.digest, blank_slot_digest());
    assert_eq!(state.current.ak_name, state.other.ak_name);
    // The AK is re-created identically: a second certification pins to the same name.
    let again = v.certify_nv(b"another certificate").unwrap();
    let single = verify_nv_certification(&again, Some(new), b"another certificate").unwrap();
    assert_eq!(single.ak_name, state.current.ak_name);
    assert_eq!(single.nv_index, certs.current.nv_index);
    // The record itself is in no part of the certification.
    let record_bytes = rec(2).key.expose().to_vec();
    for part in [
        &certs.current.attest,
        &certs.current.signature,
        &certs.current.ak_public,
    ] {
        assert!(!part.windows(32).any(|w| w == &record_bytes[..]));
    }
    // Claiming the old record is current fails, as does a new digest taken as old.
    let err = verify_slot_certifications(&certs, Some(old), None, QD).unwrap_err();
    assert!(err.to_string().contains("not the expected"), "{err}");
    let err = verify_slot_certifications(&certs, None, Some(new), QD).unwrap_err();
    assert!(err.to_string().contains("still holds the erased"), "{err}");
}

#[test]
fn a_flipped_byte_anywhere_or_other_qualifying_data_fails_verification() {
    hw!();
    let tpm = Swtpm::start();
    let (_v, certs, old, new) = rotated_and_certified(&tpm);
    verify_slot_certifications(&certs, Some(new), Some(old), QD).unwrap();
    for (field, len) in [
        ("attest", certs.current.attest.len()),
        ("signature", certs.current.signature.len()),
        ("ak_public", certs.current.ak_public.len()),
    ] {
        for at in 0..len {
            let mut bad = certs.clone();
            let bytes = match field {
                "attest" => &mut bad.current.attest,
                "signature" => &mut bad.current.signature,
                _ => &mut bad.current.ak_public,
            };
            bytes[at] ^= 0x01;
            assert!(
                verify_slot_certifications(&bad, None, None, QD).is_err(),
                "{field} byte {at} flipped still verifies"
            );
        }
    }
    let mut bad = certs.clone();
    bad.other.signature[10] ^= 0x80;
    assert!(verify_slot_certifications(&bad, None, None, QD).is_err());
    let mut bad = certs.clone();
    bad.current.nv_index += 2;
    let err = verify_slot_certifications(&bad, None, None, QD).unwrap_err();
    assert!(err.to_string().contains("not a vault's two slots"), "{err}");
    // The attestation names the index it certified: another index number fails.
    for index in [certs.current.nv_index + 1, certs.current.nv_index - 1] {
        let mut bad = certs.current.clone();
        bad.nv_index = index;
        let err = verify_nv_certification(&bad, None, QD).unwrap_err();
        assert!(err.to_string().contains("NV name differs"), "{err}");
    }
    let mut swapped = certs.clone();
    std::mem::swap(&mut swapped.current, &mut swapped.other);
    let err = verify_slot_certifications(&swapped, None, None, QD).unwrap_err();
    assert!(err.to_string().contains("not blank"), "{err}");

    let err = verify_slot_certifications(&certs, None, None, &[0x43; 32]).unwrap_err();
    assert!(err.to_string().contains("qualifying data"), "{err}");
    let err = verify_nv_certification(&certs.current, None, b"").unwrap_err();
    assert!(err.to_string().contains("qualifying data"), "{err}");
}

#[test]
fn a_tpm_whose_nv_state_was_rolled_back_is_caught_by_a_fresh_certification() {
    hw!();
    let mut tpm = Swtpm::start();
    let v = create(&tpm);
    let old = v.current_record_digest().unwrap();
    // A copy of the simulator's NV state while epoch 1's record is in it.
    let saved = tpm.nv_files();
    v.store(&rec(2)).unwrap();
    let new = v.current_record_digest().unwrap();
    drop(v);
    tpm.roll_back(&saved);
    let v = TpmVault::open(
        &tpm.tpm_location(),
        &SecretBytes::new(b"hunter2".to_vec()),
        provider(),
        tpm_options(),
    )
    .unwrap();
    assert_eq!(v.load().unwrap(), rec(1));
    let now = v.certify_slots(b"verify now").unwrap();
    let err = verify_slot_certifications(&now, None, Some(old), b"verify now").unwrap_err();
    assert!(err.to_string().contains("still holds the erased"), "{err}");
    let err = verify_slot_certifications(&now, Some(new), None, b"verify now").unwrap_err();
    assert!(err.to_string().contains("not the expected"), "{err}");
}

#[test]
fn a_rotation_certified_before_and_after_verifies_and_its_parts_cannot_be_swapped() {
    hw!();
    let tpm = Swtpm::start();
    let v = create(&tpm);
    let before = v.certify_nv(b"before").unwrap();
    v.store(&rec(2)).unwrap();
    let after = v.certify_slots(QD).unwrap();
    let state = verify_rotation(&before, b"before", &after, QD).unwrap();
    assert_eq!(state.after.other.nv_index, before.nv_index);
    assert!(state.after.current.clock >= state.before.clock);
    assert_eq!(state.after.other.digest, blank_slot_digest());

    // "Before" made after the rotation: it shows the current record, which
    // is still there.
    let late = v.certify_nv(b"before").unwrap();
    let err = verify_rotation(&late, b"before", &after, QD).unwrap_err();
    assert!(err.to_string().contains("still holds"), "{err}");
    // A "before" from another TPM is by another AK.
    let other = Swtpm::start();
    let foreign = create(&other).certify_nv(b"before").unwrap();
    let err = verify_rotation(&foreign, b"before", &after, QD).unwrap_err();
    assert!(err.to_string().contains("different AKs"), "{err}");
    let err = verify_rotation(&before, b"another nonce", &after, QD).unwrap_err();
    assert!(err.to_string().contains("qualifying data"), "{err}");
}
