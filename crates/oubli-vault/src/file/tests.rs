//! FileVault tests: round trips, the replace protocol under simulated power cuts, and damage.

use super::*;
use crate::format::{HEADER_LEN, OFF_CHECKSUM, SLOT_LEN};
use crate::kdf::KdfParams;
use oubli_crypto::{RingProvider, SecretKey};

const M_COST_OFFSET: usize = 28;

fn provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn pw(s: &str) -> SecretBytes {
    SecretBytes::new(s.as_bytes().to_vec())
}

fn rec(epoch: u64) -> VaultRecord {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&epoch.to_le_bytes());
    key[8..].fill(0xC3);
    VaultRecord {
        store_id: [0xA5; 16],
        epoch,
        key: SecretKey::from_bytes(key),
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epoch.vault");
        Fixture { _dir: dir, path }
    }

    fn create(&self, record: &VaultRecord) -> FileVault {
        FileVault::create(
            &self.path,
            &pw("hunter2"),
            KdfParams::testing(),
            record,
            provider(),
        )
        .unwrap()
    }

    fn open(&self, password: &str) -> Result<FileVault, VaultError> {
        FileVault::open(&self.path, &pw(password), provider())
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    fn write(&self, bytes: &[u8]) {
        std::fs::write(&self.path, bytes).unwrap();
    }
}

fn region(bytes: &[u8], index: usize) -> &[u8] {
    &bytes[index * SLOT_STRIDE..(index + 1) * SLOT_STRIDE]
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Rewrites a slot's checksum after a deliberate edit, as a forger would.
fn fix_checksum(bytes: &mut [u8], index: usize) {
    let base = index * SLOT_STRIDE;
    let sum = ring::digest::digest(&ring::digest::SHA256, &bytes[base..base + OFF_CHECKSUM]);
    bytes[base + OFF_CHECKSUM..base + SLOT_LEN].copy_from_slice(&sum.as_ref()[..16]);
}

#[test]
fn create_open_load_round_trip() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.write_count().unwrap(), 1);
    assert_eq!(v.generation().unwrap(), 1);
    assert_eq!(v.kdf_params(), KdfParams::testing());
    let info = v.info();
    assert_eq!(info.kind, "file");
    assert_eq!(info.location, fx.path.display().to_string());
    assert_eq!(info.endurance_writes, None);
    assert!(!info.overwrite_is_erasure);

    let bytes = fx.bytes();
    assert_eq!(bytes.len(), FILE_LEN);
    assert_eq!(&bytes[..8], b"OUBLIVLT");
    assert!(is_zero(region(&bytes, 1)), "slot B starts erased");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&fx.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let reopened = fx.open("hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(1));
    assert_eq!(reopened.write_count().unwrap(), 1);
}

#[test]
fn create_refuses_existing_file_and_bad_params() {
    let fx = Fixture::new();
    fx.create(&rec(1));
    let before = fx.bytes();
    let err = FileVault::create(
        &fx.path,
        &pw("other"),
        KdfParams::testing(),
        &rec(9),
        provider(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, VaultError::Io(e) if e.kind() == io::ErrorKind::AlreadyExists),
        "{err}"
    );
    assert_eq!(fx.bytes(), before, "existing vault untouched");

    let fx2 = Fixture::new();
    let weak = KdfParams {
        m_cost_kib: 8,
        t_cost: 1,
        p_cost: 1,
    };
    let err = FileVault::create(&fx2.path, &pw("x"), weak, &rec(1), provider()).unwrap_err();
    assert!(matches!(&err, VaultError::Io(e) if e.kind() == io::ErrorKind::InvalidInput));
    assert!(!fx2.path.exists());
}

#[test]
fn store_replaces_and_alternates_slots() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    v.store(&rec(2)).unwrap();
    assert_eq!(v.load().unwrap(), rec(2));
    assert_eq!(v.write_count().unwrap(), 2);
    assert_eq!(v.generation().unwrap(), 2);
    let bytes = fx.bytes();
    assert!(is_zero(region(&bytes, 0)) && !is_zero(region(&bytes, 1)));

    v.store(&rec(3)).unwrap();
    assert_eq!(v.generation().unwrap(), 3);
    let bytes = fx.bytes();
    assert!(!is_zero(region(&bytes, 0)) && is_zero(region(&bytes, 1)));

    let reopened = fx.open("hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(3));
    assert_eq!(reopened.write_count().unwrap(), 3);
}

#[test]
fn old_slot_is_zeroed_after_store() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let before = fx.bytes();
    let old_sealed = &region(&before, 0)[HEADER_LEN..OFF_CHECKSUM];
    let old_nonce = &region(&before, 0)[HEADER_LEN - 32..HEADER_LEN];

    v.store(&rec(2)).unwrap();
    let after = fx.bytes();
    assert!(is_zero(region(&after, 0)), "old slot region fully zeroed");
    assert!(
        !after.windows(old_sealed.len()).any(|w| w == old_sealed),
        "old sealed key gone from the file"
    );
    assert!(
        !after.windows(old_nonce.len()).any(|w| w == old_nonce),
        "old record nonce gone from the file"
    );
    for key in [rec(1).key, rec(2).key] {
        assert!(!after.windows(32).any(|w| w == key.expose()));
    }
}

#[test]
fn store_refuses_another_store_id() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let before = fx.bytes();
    let foreign = VaultRecord {
        store_id: [0x11; 16],
        ..rec(2)
    };
    let err = v.store(&foreign).unwrap_err();
    assert!(matches!(&err, VaultError::Corrupt(m) if m.contains("belongs to store")));
    assert_eq!(fx.bytes(), before);
}

#[test]
fn wrong_password() {
    let fx = Fixture::new();
    fx.create(&rec(1));
    assert!(matches!(fx.open("hunter3"), Err(VaultError::WrongPassword)));
    assert!(matches!(fx.open(""), Err(VaultError::WrongPassword)));
}

#[test]
fn missing_file() {
    let fx = Fixture::new();
    assert!(matches!(fx.open("hunter2"), Err(VaultError::Missing(_))));
    let v = fx.create(&rec(1));
    std::fs::remove_file(&fx.path).unwrap();
    assert!(matches!(v.load(), Err(VaultError::Missing(_))));
    assert!(matches!(v.store(&rec(2)), Err(VaultError::Missing(_))));
    assert!(matches!(v.write_count(), Err(VaultError::Missing(_))));
    assert!(!fx.path.exists(), "store must not recreate a deleted vault");
}

#[test]
fn truncated_or_extended_file_is_corrupt() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let bytes = fx.bytes();
    for len in [0, 100, SLOT_STRIDE, FILE_LEN - 1] {
        fx.write(&bytes[..len]);
        assert!(matches!(v.load(), Err(VaultError::Corrupt(_))), "{len}");
        assert!(matches!(fx.open("hunter2"), Err(VaultError::Corrupt(_))));
    }
    let mut longer = bytes.clone();
    longer.push(0);
    fx.write(&longer);
    assert!(matches!(v.load(), Err(VaultError::Corrupt(_))));
}

#[test]
fn flipped_bit_in_only_slot_is_corrupt() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    v.store(&rec(2)).unwrap(); // now in slot B, A erased
    let good = fx.bytes();
    for offset in [3, 20, 100, OFF_CHECKSUM + 2] {
        let mut bad = good.clone();
        bad[SLOT_STRIDE + offset] ^= 0x04;
        fx.write(&bad);
        let err = v.load().unwrap_err();
        assert!(
            matches!(&err, VaultError::Corrupt(m) if m.contains("bad checksum")),
            "{offset}: {err}"
        );
        assert!(matches!(fx.open("hunter2"), Err(VaultError::Corrupt(_))));
    }
    // Garbage in the erased slot does not hide the good one.
    let mut noisy = good.clone();
    noisy[10] = 0xFF;
    fx.write(&noisy);
    assert_eq!(v.load().unwrap(), rec(2));
}

#[test]
fn flipped_bit_falls_back_to_other_valid_slot() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    // Both slots valid: new (gen 2) in B, old (gen 1) still in A.
    assert!(v.store_inner(&rec(2), Crash::BeforeErase).is_err());
    let mut bytes = fx.bytes();
    bytes[SLOT_STRIDE + 120] ^= 0x80;
    fx.write(&bytes);
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(fx.open("hunter2").unwrap().load().unwrap(), rec(1));
}

#[test]
fn crash_before_erase_loads_new_record() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    assert!(v.store_inner(&rec(2), Crash::BeforeErase).is_err());
    let bytes = fx.bytes();
    assert!(!is_zero(region(&bytes, 0)) && !is_zero(region(&bytes, 1)));

    let reopened = fx.open("hunter2").unwrap();
    assert_eq!(reopened.load().unwrap(), rec(2));
    assert_eq!(reopened.generation().unwrap(), 2);
    // The next replace goes on from the new record and erases the leftover.
    reopened.store(&rec(3)).unwrap();
    let bytes = fx.bytes();
    assert!(
        is_zero(region(&bytes, 1)),
        "slot B held gen 2 and is erased"
    );
    assert_eq!(reopened.load().unwrap(), rec(3));
    assert_eq!(reopened.generation().unwrap(), 3);
    assert_eq!(reopened.write_count().unwrap(), 3);
}

/// Issue 9 item 1, vault side: a rotation cut between its two steps (by
/// the hook, as a pulled disk or a power cut would) leaves the old key
/// readable — on this handle and on any later open — until
/// `erase_leftovers` zeroes it.
#[test]
fn rotation_cut_between_the_steps_leaves_a_leftover_until_erased() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    v.set_rotation_hook(Some(Arc::new(|step| {
        if step == RotationStep::NewRecordWritten {
            return Err(VaultError::Unavailable("cut".into()));
        }
        Ok(())
    })));
    assert!(v.store(&rec(2)).is_err());
    v.set_rotation_hook(None);
    assert_eq!(v.load().unwrap(), rec(2));
    assert_eq!(v.readable_records().unwrap(), vec![rec(2), rec(1)]);
    let reopened = fx.open("hunter2").unwrap();
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(2), rec(1)]);
    reopened.erase_leftovers().unwrap();
    assert_eq!(reopened.readable_records().unwrap(), vec![rec(2)]);
    assert_eq!(v.readable_records().unwrap(), vec![rec(2)]);
    let bytes = fx.bytes();
    assert!(is_zero(region(&bytes, 0)), "slot A held the old key");
    assert_eq!(reopened.load().unwrap(), rec(2));
}

/// Erasing a clean vault writes nothing (a write is wear on hardware, and
/// every open calls it).
#[test]
fn erase_leftovers_on_a_clean_vault_writes_nothing() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    v.store(&rec(2)).unwrap();
    let before = (
        fx.bytes(),
        std::fs::metadata(&fx.path).unwrap().modified().unwrap(),
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    v.erase_leftovers().unwrap();
    let after = (
        fx.bytes(),
        std::fs::metadata(&fx.path).unwrap().modified().unwrap(),
    );
    assert_eq!(before, after);
    assert_eq!(v.write_count().unwrap(), 2);
}

/// A record sealed under an older password (a password change cut short)
/// is a leftover too: not readable by a handle with the new password, but
/// destroyed by its `erase_leftovers`, after which the old password opens
/// nothing.
#[test]
fn erase_leftovers_destroys_an_old_password_record() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    assert!(v
        .change_password_inner(&pw("new"), KdfParams::testing(), Crash::BeforeErase)
        .is_err());
    let with_new = fx.open("new").unwrap();
    assert_eq!(with_new.readable_records().unwrap(), vec![rec(1)]);
    assert!(fx.open("hunter2").is_ok(), "the old password still opens");
    // A handle with the old password cannot tell whether the newer slot is
    // the real current record: it refuses, and destroys nothing.
    let with_old = fx.open("hunter2").unwrap();
    assert!(matches!(
        with_old.erase_leftovers(),
        Err(VaultError::Corrupt(_))
    ));
    assert_eq!(fx.open("new").unwrap().load().unwrap(), rec(1));
    with_new.erase_leftovers().unwrap();
    assert!(matches!(fx.open("hunter2"), Err(VaultError::WrongPassword)));
    assert_eq!(fx.open("new").unwrap().load().unwrap(), rec(1));
}

#[test]
fn torn_new_slot_loads_old_record() {
    for torn_len in [1, 40, HEADER_LEN + 10, SLOT_LEN - 1] {
        let fx = Fixture::new();
        let v = fx.create(&rec(1));
        v.store(&rec(2)).unwrap(); // record in B; the next replace targets A
        let pre = fx.bytes();
        assert!(v
            .store_inner(&rec(3), Crash::TornNewSlot(torn_len))
            .is_err());
        assert_eq!(region(&fx.bytes(), 1), region(&pre, 1), "old slot intact");

        let reopened = fx.open("hunter2").unwrap();
        assert_eq!(reopened.load().unwrap(), rec(2), "torn at {torn_len}");
        reopened.store(&rec(3)).unwrap();
        assert_eq!(fx.open("hunter2").unwrap().load().unwrap(), rec(3));
    }
}

#[test]
fn change_password() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let stronger = KdfParams {
        m_cost_kib: 128,
        t_cost: 2,
        p_cost: 1,
    };
    v.change_password(&pw("correct horse"), stronger).unwrap();
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.kdf_params(), stronger);
    assert_eq!(v.write_count().unwrap(), 2);
    assert!(
        is_zero(region(&fx.bytes(), 0)),
        "slot under old password erased"
    );

    assert!(matches!(fx.open("hunter2"), Err(VaultError::WrongPassword)));
    let reopened = fx.open("correct horse").unwrap();
    assert_eq!(reopened.kdf_params(), stronger);
    assert_eq!(reopened.load().unwrap(), rec(1));

    // The same handle keeps working under the new password.
    v.store(&rec(2)).unwrap();
    assert_eq!(reopened.load().unwrap(), rec(2));

    let err = v
        .change_password(
            &pw("x"),
            KdfParams {
                t_cost: 0,
                ..stronger
            },
        )
        .unwrap_err();
    assert!(matches!(&err, VaultError::Io(e) if e.kind() == io::ErrorKind::InvalidInput));
}

#[test]
fn change_password_cut_short_opens_with_either_password() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    assert!(v
        .change_password_inner(&pw("new"), KdfParams::testing(), Crash::BeforeErase)
        .is_err());
    // The handle follows the durable new slot.
    assert_eq!(v.load().unwrap(), rec(1));
    assert_eq!(v.generation().unwrap(), 2);

    let with_new = fx.open("new").unwrap();
    assert_eq!(with_new.load().unwrap(), rec(1));
    let with_old = fx.open("hunter2").unwrap();
    assert_eq!(with_old.load().unwrap(), rec(1));
    assert!(matches!(fx.open("neither"), Err(VaultError::WrongPassword)));

    // A store through the old password outranks and overwrites the new slot.
    with_old.store(&rec(2)).unwrap();
    assert_eq!(with_old.generation().unwrap(), 3);
    assert!(matches!(fx.open("new"), Err(VaultError::WrongPassword)));
    assert!(matches!(with_new.load(), Err(VaultError::WrongPassword)));
    assert_eq!(fx.open("hunter2").unwrap().load().unwrap(), rec(2));
}

#[test]
fn absurd_params_in_header_are_corrupt() {
    let fx = Fixture::new();
    fx.create(&rec(1));
    let mut bytes = fx.bytes();
    // 8 GiB of memory, with a checksum fixed up as a tamperer would.
    bytes[M_COST_OFFSET..M_COST_OFFSET + 4].copy_from_slice(&(8u32 << 20).to_le_bytes());
    fix_checksum(&mut bytes, 0);
    fx.write(&bytes);
    let err = fx.open("hunter2").unwrap_err();
    assert!(
        matches!(&err, VaultError::Corrupt(m) if m.contains("bad header")),
        "{err}"
    );
}

#[test]
fn forged_body_with_fixed_checksum_never_returns_data() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let mut bytes = fx.bytes();
    bytes[HEADER_LEN + 30] ^= 1;
    fix_checksum(&mut bytes, 0);
    fx.write(&bytes);
    // The AEAD cannot tell a forgery from a wrong password.
    assert!(matches!(v.load(), Err(VaultError::WrongPassword)));
    assert!(matches!(fx.open("hunter2"), Err(VaultError::WrongPassword)));
}

#[test]
fn debug_does_not_leak_secrets() {
    let fx = Fixture::new();
    let v = fx.create(&rec(1));
    let shown = format!("{v:?}");
    assert!(
        shown.contains("redacted") && !shown.contains("hunter2"),
        "{shown}"
    );
    assert!(
        !shown.contains("c3, c3") && !shown.contains("195"),
        "{shown}"
    );
}

#[test]
fn concurrent_stores_through_one_handle() {
    let fx = Fixture::new();
    let v = Arc::new(fx.create(&rec(0)));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let v = Arc::clone(&v);
            std::thread::spawn(move || {
                for i in 0..5 {
                    v.store(&rec(t * 100 + i)).unwrap();
                    v.load().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(v.write_count().unwrap(), 21);
    assert_eq!(v.generation().unwrap(), 21);
    let bytes = fx.bytes();
    assert!(is_zero(region(&bytes, 0)) != is_zero(region(&bytes, 1)));
}

#[test]
fn vanished_devices_are_unavailable_other_errors_are_io() {
    for (errno, transient) in [(5, true), (19, true), (6, true), (13, false), (28, false)] {
        let mapped = io_error(io::Error::from_raw_os_error(errno));
        assert_eq!(
            matches!(mapped, VaultError::Unavailable(_)),
            transient,
            "errno {errno}: {mapped}"
        );
    }
}
