//! Pkcs11Vault against SoftHSM2: round trips, counting, PIN and password, missing, a pulled token, crashes mid-rotation.
//!
//! SoftHSM reads its configuration once per process (at `C_Initialize`), so
//! every test here shares one private configuration and token directory,
//! made before the first use; tests keep apart by object label.

#[macro_use]
mod common;

use common::{skip_hw, SoftHsm, SOFTHSM_MODULE};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_vault::{
    KdfParams, Pkcs11Options, Pkcs11Uri, Pkcs11Vault, RotationStep, Vault, VaultError, VaultRecord,
};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn hsm() -> &'static SoftHsm {
    static HSM: OnceLock<SoftHsm> = OnceLock::new();
    HSM.get_or_init(|| {
        let hsm = SoftHsm::new();
        hsm.init_token("oubli-test", "1234");
        hsm.init_token("oubli-pin", "1234");
        // Before any test loads the module (OnceLock: exactly once).
        std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
        hsm
    })
}

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn pw(s: &str) -> SecretBytes {
    SecretBytes::new(s.as_bytes().to_vec())
}

fn rec(epoch: u64) -> VaultRecord {
    common::record(0x3C, 0x5A, epoch)
}

fn uri(token: &str, object: &str, pin: Option<&str>) -> Pkcs11Uri {
    hsm();
    let mut s = format!("pkcs11:token={token};object={object}?module-path={SOFTHSM_MODULE}");
    if let Some(pin) = pin {
        s.push_str(&format!("&pin-value={pin}"));
    }
    Pkcs11Uri::parse(&s).unwrap()
}

/// Calls into one module are serialized (see `module_lock`), so a test
/// that hangs the token delays the others: they get a generous deadline,
/// the hang test a short one.
fn options() -> Pkcs11Options {
    Pkcs11Options {
        timeout: Duration::from_secs(30),
    }
}

fn create(u: &Pkcs11Uri, record: &VaultRecord) -> Pkcs11Vault {
    Pkcs11Vault::create(
        u,
        &pw("hunter2"),
        KdfParams::testing(),
        record,
        provider(),
        options(),
    )
    .unwrap()
}

fn open(u: &Pkcs11Uri, password: &str) -> Result<Pkcs11Vault, VaultError> {
    Pkcs11Vault::open(u, &pw(password), provider(), options())
}

#[test]
fn create_load_store_round_trip_and_counting() {
    hw!();
    let u = uri("oubli-test", "round-trip", Some("1234"));
    let v = create(&u, &rec(1));
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.write_count().unwrap(), 1);
    let info = v.info();
    assert_eq!(info.kind, "pkcs11");
    assert!(
        !info.location.contains("1234"),
        "PIN leaked: {}",
        info.location
    );
    assert!(
        info.location.contains("object=round-trip"),
        "{}",
        info.location
    );
    // SoftHSM keeps objects in host files: no real erasure, no wear.
    assert!(!info.overwrite_is_erasure && info.endurance_writes.is_none());
    assert!(!format!("{v:?}").contains("1234"));
    for e in 2..=5 {
        v.store(&rec(e)).unwrap();
        assert_eq!(v.load().unwrap(), rec(e));
    }
    assert_eq!(v.write_count().unwrap(), 5);
    drop(v);
    let reopened = open(&u, "hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(5));
    assert_eq!(reopened.write_count().unwrap(), 5);
}

#[test]
fn wrong_pin_and_wrong_password() {
    hw!();
    // A token of its own: a login is shared by every session of the
    // process on a token, so another test's open session would let a wrong
    // PIN through (PKCS#11 semantics, not a bypass: the process is logged in).
    let u = uri("oubli-pin", "wrong", Some("1234"));
    create(&u, &rec(1));
    // Wrong PIN: the token refuses the login.
    let bad_pin = uri("oubli-pin", "wrong", Some("9999"));
    assert!(matches!(
        open(&bad_pin, "hunter2"),
        Err(VaultError::WrongPassword)
    ));
    // Right PIN, wrong password: the record does not open.
    assert!(matches!(
        open(&u, "hunter3"),
        Err(VaultError::WrongPassword)
    ));
    assert_eq!(open(&u, "hunter2").unwrap().load().unwrap(), rec(1));
}

#[test]
fn pin_defaults_to_the_password() {
    hw!();
    // Without pin-value (and without OUBLI_PIN) the password is the PIN.
    let u = uri("oubli-test", "pin-is-password", None);
    let v = Pkcs11Vault::create(
        &u,
        &pw("1234"),
        KdfParams::testing(),
        &rec(1),
        provider(),
        options(),
    )
    .unwrap();
    assert_eq!(v.load().unwrap(), rec(1));
    assert!(matches!(
        Pkcs11Vault::open(&u, &pw("12345"), provider(), options()),
        Err(VaultError::WrongPassword)
    ));
}

#[test]
fn missing_vault_and_missing_token() {
    hw!();
    let u = uri("oubli-test", "never-created", Some("1234"));
    assert!(matches!(open(&u, "hunter2"), Err(VaultError::Missing(_))));
    let u = uri("no-such-token", "x", Some("1234"));
    assert!(matches!(
        open(&u, "hunter2"),
        Err(VaultError::Unavailable(_))
    ));
}

#[test]
fn create_refuses_an_existing_vault() {
    hw!();
    let u = uri("oubli-test", "exists", Some("1234"));
    create(&u, &rec(1));
    let err = Pkcs11Vault::create(
        &u,
        &pw("x"),
        KdfParams::testing(),
        &rec(9),
        provider(),
        options(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, VaultError::Io(e) if e.kind() == std::io::ErrorKind::AlreadyExists),
        "{err}"
    );
    assert_eq!(open(&u, "hunter2").unwrap().load().unwrap(), rec(1));
}

#[test]
fn crash_between_create_and_destroy_loads_new_record() {
    hw!();
    let u = uri("oubli-test", "crash", Some("1234"));
    let v = create(&u, &rec(1));
    v.set_rotation_hook(Some(Arc::new(|step| {
        if step == RotationStep::NewRecordWritten {
            return Err(VaultError::Unavailable("simulated crash".into()));
        }
        Ok(())
    })));
    assert!(v.store(&rec(2)).is_err());
    v.set_rotation_hook(None);
    let reopened = open(&u, "hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(2));
    reopened.store(&rec(3)).unwrap();
    assert_eq!(reopened.load().unwrap(), rec(3));
    assert_eq!(reopened.write_count().unwrap(), 3);
}

/// How many vault objects labelled `object` the token lists (after login,
/// so private ones included), asked through the module itself.
fn count_objects(token: &str, object: &str) -> usize {
    use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
    use cryptoki::error::{Error, RvError};
    use cryptoki::object::{Attribute, ObjectClass};
    use cryptoki::session::UserType;
    // Never dropped: the module stays initialized for the vaults (the
    // vault crate initializes it once per process and never finalizes).
    static MODULE: OnceLock<Pkcs11> = OnceLock::new();
    let m = MODULE.get_or_init(|| {
        let m = Pkcs11::new(SOFTHSM_MODULE).unwrap();
        match m.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
            Ok(()) | Err(Error::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => m,
            Err(e) => panic!("initialize {SOFTHSM_MODULE}: {e}"),
        }
    });
    let slot = m
        .get_slots_with_token()
        .unwrap()
        .into_iter()
        .find(|s| m.get_token_info(*s).unwrap().label().trim_end() == token)
        .unwrap();
    let session = m.open_ro_session(slot).unwrap();
    let pin = cryptoki::types::RawAuthPin::new(Box::new(b"1234".to_vec()));
    match session.login_with_raw(UserType::User, &pin) {
        Ok(()) | Err(Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
        Err(e) => panic!("log in: {e}"),
    }
    let template = [
        Attribute::Class(ObjectClass::DATA),
        Attribute::Token(true),
        Attribute::Label(object.as_bytes().to_vec()),
    ];
    session.find_objects(&template).unwrap().len()
}

#[test]
fn rotations_cut_between_their_steps_leave_leftovers_until_erased() {
    hw!();
    let u = uri("oubli-test", "leftovers", Some("1234"));
    let v = create(&u, &rec(1));
    assert_eq!(count_objects("oubli-test", "leftovers"), 1);
    v.set_rotation_hook(Some(Arc::new(|step| match step {
        RotationStep::NewRecordWritten => Err(VaultError::Unavailable("token pulled".into())),
        _ => Ok(()),
    })));
    assert!(v.store(&rec(2)).is_err());
    assert_eq!(v.readable_records().unwrap(), vec![rec(2), rec(1)]);
    assert_eq!(count_objects("oubli-test", "leftovers"), 2);
    // A second rotation cut short: two leftovers.
    assert!(v.store(&rec(3)).is_err());
    v.set_rotation_hook(None);
    assert_eq!(v.readable_records().unwrap(), vec![rec(3), rec(2), rec(1)]);
    assert_eq!(count_objects("oubli-test", "leftovers"), 3);
    drop(v);

    // As the engine does on open: a fresh handle sees them and erases them.
    let reopened = open(&u, "hunter2").unwrap();
    assert_eq!(
        reopened.readable_records().unwrap(),
        vec![rec(3), rec(2), rec(1)]
    );
    reopened.erase_leftovers().unwrap();
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(3)]);
    assert_eq!(count_objects("oubli-test", "leftovers"), 1);
    assert_eq!(reopened.load().unwrap(), rec(3));
    assert_eq!(reopened.write_count().unwrap(), 3);
    reopened.erase_leftovers().unwrap();
    assert_eq!(count_objects("oubli-test", "leftovers"), 1);
}

#[test]
fn hung_token_times_out() {
    hw!();
    let u = uri("oubli-test", "hang", Some("1234"));
    let v = Pkcs11Vault::create(
        &u,
        &pw("hunter2"),
        KdfParams::testing(),
        &rec(1),
        provider(),
        Pkcs11Options {
            timeout: Duration::from_secs(2),
        },
    )
    .unwrap();
    v.set_rotation_hook(Some(Arc::new(|step| {
        if step == RotationStep::NewRecordWritten {
            std::thread::sleep(Duration::from_secs(5));
        }
        Ok(())
    })));
    let t = Instant::now();
    let err = v.store(&rec(2)).unwrap_err();
    assert!(
        matches!(&err, VaultError::Unavailable(m) if m.contains("may still complete")),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(4));
    // The load waits behind the hung store: it too is unavailable, never
    // the stale old record while the new one is being written.
    let err = v.load().unwrap_err();
    assert!(
        matches!(&err, VaultError::Unavailable(m) if m.contains("busy")),
        "{err}"
    );
    v.set_rotation_hook(None);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(v.load().unwrap(), rec(2));
    assert_eq!(v.write_count().unwrap(), 2);
}

#[test]
fn destroy_removes_the_record() {
    hw!();
    let u = uri("oubli-test", "destroy", Some("1234"));
    create(&u, &rec(1)).destroy().unwrap();
    assert!(matches!(open(&u, "hunter2"), Err(VaultError::Missing(_))));
}

#[test]
fn token_failing_at_commit_time_is_unavailable_and_changes_nothing() {
    hw!();
    let u = uri("oubli-test", "fail-at-start", Some("1234"));
    let v = create(&u, &rec(1));
    // The token answers the read, then fails before anything is written
    // (as a card pulled between two commands).
    v.set_rotation_hook(Some(Arc::new(|step| match step {
        RotationStep::Start => Err(VaultError::Unavailable("token removed".into())),
        _ => Ok(()),
    })));
    assert!(matches!(v.store(&rec(2)), Err(VaultError::Unavailable(_))));
    v.set_rotation_hook(None);
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.write_count().unwrap(), 1);
    v.store(&rec(2)).unwrap();
    assert_eq!(v.load().unwrap(), rec(2));
}
