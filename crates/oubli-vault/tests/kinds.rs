//! The same contract for every vault kind (file, TPM, PKCS#11), through the location-string API the CLI uses.
//!
//! `create_vault` / `open_vault` with `file:`, `tpm:` and `pkcs11:`
//! locations: round trip, write counting, reopen, wrong password, missing
//! vault, a record for another store refused, `info()` filled in.

mod common;

#[cfg(feature = "tpm")]
use common::Swtpm;
use common::{skip_hw, SoftHsm, SOFTHSM_MODULE};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_vault::{
    create_vault_with, open_vault_with, KdfParams, Pkcs11Options, VaultError, VaultOptions,
    VaultRecord,
};
use std::sync::Arc;
use std::time::Duration;

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn pw(s: &str) -> SecretBytes {
    SecretBytes::new(s.as_bytes().to_vec())
}

fn rec(epoch: u64) -> VaultRecord {
    common::record(0x77, 0x11, epoch)
}

fn options() -> VaultOptions {
    VaultOptions {
        tpm: oubli_vault::TpmOptions {
            timeout: Duration::from_secs(20),
            owner_auth: None,
        },
        pkcs11: Pkcs11Options {
            timeout: Duration::from_secs(20),
        },
    }
}

/// The contract, for a location where no vault exists yet.
fn conformance(location: &str, kind: &str) {
    let o = options();
    let open = |p: &str| open_vault_with(location, &pw(p), provider(), &o);
    assert!(
        matches!(open("pw-1"), Err(VaultError::Missing(_))),
        "{kind}: missing vault"
    );
    let v = create_vault_with(
        location,
        &pw("pw-1"),
        KdfParams::testing(),
        &rec(1),
        provider(),
        &o,
    )
    .unwrap();
    let info = v.info();
    assert_eq!(info.kind, kind);
    assert!(!info.location.is_empty());
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.write_count().unwrap(), 1);
    for e in 2..=4 {
        v.store(&rec(e)).unwrap();
    }
    assert_eq!(v.load().unwrap(), rec(4));
    assert_eq!(v.write_count().unwrap(), 4, "{kind}: every record counted");
    let foreign = VaultRecord {
        store_id: [0x22; 16],
        ..rec(5)
    };
    assert!(
        matches!(v.store(&foreign), Err(VaultError::Corrupt(_))),
        "{kind}"
    );
    assert_eq!(
        v.write_count().unwrap(),
        4,
        "{kind}: a refused store writes nothing"
    );
    drop(v);
    let again = open("pw-1").unwrap();
    assert_eq!(again.load().unwrap(), rec(4));
    assert_eq!(again.write_count().unwrap(), 4);
    drop(again);
    assert!(
        matches!(open("pw-2"), Err(VaultError::WrongPassword)),
        "{kind}: wrong password"
    );
    // Creating over an existing vault is refused and leaves it intact.
    let err = create_vault_with(
        location,
        &pw("x"),
        KdfParams::testing(),
        &rec(9),
        provider(),
        &o,
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, VaultError::Io(e) if e.kind() == std::io::ErrorKind::AlreadyExists),
        "{kind}: {err}"
    );
    assert_eq!(open("pw-1").unwrap().load().unwrap(), rec(4));
}

#[test]
fn file_vault() {
    let dir = tempfile::tempdir().unwrap();
    conformance(&format!("file:{}", dir.path().join("v").display()), "file");
}

#[cfg(feature = "tpm")]
#[test]
fn tpm_vault() {
    if skip_hw() {
        return;
    }
    let tpm = Swtpm::start();
    conformance(&format!("tpm:{};index=0x01500100", tpm.location()), "tpm2");
}

#[test]
fn pkcs11_vault() {
    if skip_hw() {
        return;
    }
    let hsm = SoftHsm::new();
    hsm.init_token("kinds", "1234");
    // The only test of this binary that loads the module: set before it does.
    std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
    conformance(
        &format!(
            "pkcs11:token=kinds;object=kinds-vault?module-path={SOFTHSM_MODULE}&pin-value=1234"
        ),
        "pkcs11",
    );
}
