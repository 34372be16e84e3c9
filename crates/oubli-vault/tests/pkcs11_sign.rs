//! TokenSigner against SoftHSM2: an Ed25519 key generated inside the token signs, and its signatures verify with ring.

#[macro_use]
mod common;

use common::{skip_hw, SoftHsm, SOFTHSM_MODULE};
use oubli_crypto::SecretBytes;
use oubli_vault::{Pkcs11Options, Pkcs11Uri, TokenSigner, VaultError};
use ring::signature::{UnparsedPublicKey, ED25519};
use std::sync::OnceLock;

/// SoftHSM reads its configuration once per process: one token directory
/// for every test here, kept apart by key label.
fn hsm() -> &'static SoftHsm {
    static HSM: OnceLock<SoftHsm> = OnceLock::new();
    HSM.get_or_init(|| {
        let hsm = SoftHsm::new();
        hsm.init_token("oubli-sign", "1234");
        hsm.init_token("oubli-sign-pin", "1234");
        std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
        hsm
    })
}

fn uri(label: &str, pin: Option<&str>) -> Pkcs11Uri {
    hsm();
    let mut s = format!("pkcs11:token=oubli-sign;object={label}?module-path={SOFTHSM_MODULE}");
    if let Some(pin) = pin {
        s.push_str(&format!("&pin-value={pin}"));
    }
    Pkcs11Uri::parse(&s).unwrap()
}

fn signer(label: &str, pin: Option<&str>) -> TokenSigner {
    TokenSigner::open(
        &uri(label, pin),
        &SecretBytes::new(Vec::new()),
        Pkcs11Options::default(),
    )
    .unwrap()
}

#[test]
fn a_key_generated_in_the_token_signs_and_the_signature_verifies() {
    hw!();
    let s = signer("cert-key", Some("1234"));
    let public = s.generate().unwrap();
    assert_eq!(s.public_key().unwrap(), public);
    let (by, signature) = s.sign(b"certificate body").unwrap();
    assert_eq!(by, public);
    UnparsedPublicKey::new(&ED25519, public)
        .verify(b"certificate body", &signature)
        .unwrap();
    assert!(UnparsedPublicKey::new(&ED25519, public)
        .verify(b"certificate bodY", &signature)
        .is_err());
    // Another handle (another process, later) finds the same key.
    let again = signer("cert-key", Some("1234"));
    assert_eq!(again.public_key().unwrap(), public);
    // Generating twice under one label is refused: the old key stays.
    match s.generate() {
        Err(VaultError::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => panic!("second generate: {other:?}"),
    }
    assert_eq!(s.public_key().unwrap(), public);
    assert!(!format!("{s:?}").contains("1234"));
}

#[test]
fn the_pin_comes_from_the_caller_when_the_uri_has_none_and_a_wrong_one_is_refused() {
    hw!();
    hsm();
    let on_pin_token = |pin: &str| {
        let uri = Pkcs11Uri::parse(&format!(
            "pkcs11:token=oubli-sign-pin;object=pin-key?module-path={SOFTHSM_MODULE}"
        ))
        .unwrap();
        TokenSigner::open(
            &uri,
            &SecretBytes::new(pin.as_bytes().to_vec()),
            Pkcs11Options::default(),
        )
        .unwrap()
    };
    // Before any login to this token in this process (login state is per
    // token and process), a wrong PIN is the vault's WrongPassword.
    match on_pin_token("9999").generate() {
        Err(VaultError::WrongPassword) => {}
        other => panic!("wrong PIN: {other:?}"),
    }
    let s = on_pin_token("1234");
    let public = s.generate().unwrap();
    assert_eq!(s.sign(b"x").unwrap().0, public);
    match signer("no-such-key", Some("1234")).sign(b"x") {
        Err(VaultError::Missing(what)) => assert!(what.contains("no-such-key"), "{what}"),
        other => panic!("missing key: {other:?}"),
    }
}
