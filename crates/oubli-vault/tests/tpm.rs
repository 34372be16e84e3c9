//! TpmVault against a real TPM 2.0 simulator (swtpm): round trips, counting, passwords, failures, crashes mid-rotation.

#![cfg(feature = "tpm")]

#[macro_use]
mod common;

use common::{skip_hw, tpm_options, Swtpm};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_vault::{KdfParams, RotationStep, TpmOptions, TpmVault, Vault, VaultError, VaultRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn pw(s: &str) -> SecretBytes {
    SecretBytes::new(s.as_bytes().to_vec())
}

fn rec(epoch: u64) -> VaultRecord {
    common::record(0xC3, 0xA5, epoch)
}

fn create(tpm: &Swtpm, record: &VaultRecord) -> TpmVault {
    TpmVault::create(
        &tpm.tpm_location(),
        &pw("hunter2"),
        KdfParams::testing(),
        record,
        provider(),
        tpm_options(),
    )
    .unwrap()
}

fn open(tpm: &Swtpm, password: &str) -> Result<TpmVault, VaultError> {
    TpmVault::open(
        &tpm.tpm_location(),
        &pw(password),
        provider(),
        tpm_options(),
    )
}

#[test]
fn create_load_store_round_trip_and_counting() {
    hw!();
    let tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.write_count().unwrap(), 1);
    let info = v.info();
    assert_eq!(info.kind, "tpm2");
    assert!(info.location.starts_with("tpm:swtpm:"), "{}", info.location);
    assert!(
        info.location.ends_with(";index=0x01500016"),
        "{}",
        info.location
    );
    // A simulator keeps its NV in a host file: no real erasure, no wear.
    assert!(!info.overwrite_is_erasure);
    assert_eq!(info.endurance_writes, None);
    for e in 2..=5 {
        v.store(&rec(e)).unwrap();
        assert_eq!(v.load().unwrap(), rec(e));
    }
    assert_eq!(v.write_count().unwrap(), 5);
    drop(v);
    let reopened = open(&tpm, "hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(5));
    assert_eq!(reopened.write_count().unwrap(), 5);
}

/// The sealed slots (176 bytes from their `OUBLIVLT` magic) found in a NV image.
fn sealed_slots(image: &[u8]) -> Vec<Vec<u8>> {
    image
        .windows(8)
        .enumerate()
        .filter(|(_, w)| w == b"OUBLIVLT")
        .filter_map(|(i, _)| image.get(i..i + 176).map(<[u8]>::to_vec))
        .collect()
}

#[test]
fn old_record_is_overwritten_inside_the_tpm() {
    hw!();
    let tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    // swtpm keeps the TPM's NV memory in its state file: this is what a
    // chip's NV cells would hold.
    let first = sealed_slots(&tpm.state_bytes());
    assert_eq!(first.len(), 1, "one record after create");
    v.store(&rec(2)).unwrap();
    let second = sealed_slots(&tpm.state_bytes());
    assert_eq!(second.len(), 1, "the old slot was overwritten with zeros");
    assert_ne!(first, second);
    v.store(&rec(3)).unwrap();
    let third = sealed_slots(&tpm.state_bytes());
    assert_eq!(third.len(), 1);
    assert!(!third.contains(&first[0]) && !third.contains(&second[0]));
}

#[test]
fn wrong_password_and_missing() {
    hw!();
    let tpm = Swtpm::start();
    assert!(matches!(open(&tpm, "hunter2"), Err(VaultError::Missing(_))));
    create(&tpm, &rec(1));
    assert!(matches!(
        open(&tpm, "hunter3"),
        Err(VaultError::WrongPassword)
    ));
    assert_eq!(open(&tpm, "hunter2").unwrap().load().unwrap(), rec(1));
}

#[test]
fn create_refuses_taken_indices() {
    hw!();
    let tpm = Swtpm::start();
    create(&tpm, &rec(1));
    let err = TpmVault::create(
        &tpm.tpm_location(),
        &pw("x"),
        KdfParams::testing(),
        &rec(9),
        provider(),
        tpm_options(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, VaultError::Io(e) if e.kind() == std::io::ErrorKind::AlreadyExists),
        "{err}"
    );
    assert_eq!(open(&tpm, "hunter2").unwrap().load().unwrap(), rec(1));
}

#[test]
fn killed_tpm_is_unavailable_then_recovers() {
    hw!();
    let mut tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    tpm.kill();
    assert!(matches!(v.store(&rec(2)), Err(VaultError::Unavailable(_))));
    assert!(matches!(v.load(), Err(VaultError::Unavailable(_))));
    tpm.restart();
    assert_eq!(v.load().unwrap(), rec(1));
    v.store(&rec(2)).unwrap();
    assert_eq!(v.load().unwrap(), rec(2));
}

#[test]
fn hung_tpm_times_out() {
    hw!();
    let tpm = Swtpm::start();
    let v = TpmVault::create(
        &tpm.tpm_location(),
        &pw("hunter2"),
        KdfParams::testing(),
        &rec(1),
        provider(),
        TpmOptions {
            timeout: Duration::from_secs(2),
            owner_auth: None,
        },
    )
    .unwrap();
    tpm.pause();
    let t = Instant::now();
    let err = v.store(&rec(2)).unwrap_err();
    assert!(matches!(err, VaultError::Unavailable(_)), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    tpm.resume();
    // The store had started: it may have completed. Either record is fine; never neither.
    let now = v.load().unwrap();
    assert!(now == rec(1) || now == rec(2));
}

#[test]
fn crash_between_write_and_clear_loads_new_record() {
    hw!();
    let mut tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    v.set_rotation_hook(Some(Arc::new(|step| {
        if step == RotationStep::NewRecordWritten {
            return Err(VaultError::Unavailable("simulated crash".into()));
        }
        Ok(())
    })));
    assert!(v.store(&rec(2)).is_err());
    v.set_rotation_hook(None);
    tpm.restart();
    let reopened = open(&tpm, "hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(2));
    reopened.store(&rec(3)).unwrap();
    assert_eq!(reopened.load().unwrap(), rec(3));
    assert_eq!(reopened.write_count().unwrap(), 3);
}

#[test]
fn rotation_cut_between_its_writes_leaves_a_leftover_until_erased() {
    hw!();
    let tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    v.set_rotation_hook(Some(Arc::new(|step| match step {
        RotationStep::NewRecordWritten => Err(VaultError::Unavailable("power cut".into())),
        _ => Ok(()),
    })));
    assert!(v.store(&rec(2)).is_err());
    v.set_rotation_hook(None);
    // The old record survives the rotation in the TPM's NV memory, and the
    // password opens it.
    assert_eq!(v.readable_records().unwrap(), vec![rec(2), rec(1)]);
    assert_eq!(sealed_slots(&tpm.state_bytes()).len(), 2);
    drop(v);

    // As the engine does on open: a fresh handle sees it and erases it.
    let reopened = open(&tpm, "hunter2").unwrap();
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(2), rec(1)]);
    reopened.erase_leftovers().unwrap();
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(2)]);
    assert_eq!(reopened.load().unwrap(), rec(2));
    assert_eq!(
        reopened.write_count().unwrap(),
        2,
        "the erase writes no record"
    );
    let image = tpm.state_bytes();
    assert_eq!(
        sealed_slots(&image).len(),
        1,
        "zeros written over the old slot"
    );

    // Nothing left: the next erase succeeds and changes nothing. (Whether
    // it writes cannot be seen here: the simulator does not persist an NV
    // write of the bytes already there. sealed.rs tests that an erased
    // slot is no leftover, so no write is issued.)
    reopened.erase_leftovers().unwrap();
    assert_eq!(tpm.state_bytes(), image);
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(2)]);
}

#[test]
fn destroy_removes_everything() {
    hw!();
    let tpm = Swtpm::start();
    let v = create(&tpm, &rec(1));
    v.destroy(&tpm_options()).unwrap();
    assert!(matches!(open(&tpm, "hunter2"), Err(VaultError::Missing(_))));
    create(&tpm, &rec(7));
}

#[test]
fn repeated_wrong_passwords_hit_the_tpm_lockout() {
    hw!();
    let tpm = Swtpm::start();
    create(&tpm, &rec(1));
    // The slots are under the TPM's dictionary-attack protection: guessing
    // ends in lockout, which is reported as "unavailable" (wait, or clear
    // it with the lockout authorization), not as yet another wrong password.
    let mut outcomes = Vec::new();
    for _ in 0..64 {
        match open(&tpm, "guess") {
            Err(VaultError::WrongPassword) => outcomes.push('w'),
            Err(VaultError::Unavailable(m)) => {
                assert!(m.contains("lockout"), "{m}");
                outcomes.push('L');
                break;
            }
            other => panic!("unexpected {:?}", other.map(|_| ())),
        }
    }
    assert_eq!(
        outcomes.last(),
        Some(&'L'),
        "no lockout after {} guesses",
        outcomes.len()
    );
    // Even the right password is refused while locked out.
    assert!(matches!(
        open(&tpm, "hunter2"),
        Err(VaultError::Unavailable(_))
    ));
}

#[test]
fn wrong_owner_authorization_is_reported_as_such() {
    hw!();
    let tpm = Swtpm::start();
    let err = TpmVault::create(
        &tpm.tpm_location(),
        &pw("hunter2"),
        KdfParams::testing(),
        &rec(1),
        provider(),
        TpmOptions {
            owner_auth: Some(pw("not the owner password")),
            ..tpm_options()
        },
    )
    .unwrap_err();
    assert!(
        matches!(&err, VaultError::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied),
        "{err}"
    );
    // Nothing was left defined: a create with the right (empty) owner auth works.
    create(&tpm, &rec(1));
}
