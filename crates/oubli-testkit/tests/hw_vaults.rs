//! The deletion guarantee and crash safety with every real vault kind: file, TPM 2.0 (swtpm), PKCS#11 (SoftHSM2).
//!
//! The engine runs over an in-memory recording medium; the vault is the
//! real thing. After each checked commit the adversary gets every byte the
//! medium ever held plus what the vault holds now, and must not open
//! anything deleted before that commit. Then the vault is made to fail at
//! commit time — an error, a hang, garbage, and the TPM killed between
//! writing the new record and clearing the old — and no acknowledged write
//! may be lost.
//!
//! Needs `swtpm` and `softhsm2` (scripts/apt-packages); fails with the
//! install command if they are missing, unless OUBLI_SKIP_HW=1.

#[path = "../../oubli-vault/tests/common/mod.rs"]
mod common;

use common::{skip_hw, SoftHsm, Swtpm, SOFTHSM_MODULE};
use oubli_core::{Error, Medium, Options, Store, Vault, VaultError};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes};
use oubli_media::{MemMedium, RecordingMedium, TearMode};
use oubli_testkit::workload::{Runner, Step, Workload};
use oubli_testkit::{harness, Adversary};
use oubli_vault::{
    FileVault, FlakyVault, KdfParams, Pkcs11Options, Pkcs11Uri, Pkcs11Vault, RotationStep,
    TpmLocation, TpmOptions, TpmVault,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

fn vault_provider() -> Arc<dyn CryptoProvider> {
    Arc::new(RingProvider::new())
}

fn pw() -> SecretBytes {
    SecretBytes::new(b"correct horse".to_vec())
}

/// A device a vault kind needs, kept alive for the test.
enum Device {
    None(tempfile::TempDir),
    Tpm(Arc<Mutex<Swtpm>>),
    Token,
}

/// SoftHSM reads its configuration once per process: one for all tests here.
fn softhsm() -> &'static SoftHsm {
    static HSM: OnceLock<SoftHsm> = OnceLock::new();
    HSM.get_or_init(|| {
        let hsm = SoftHsm::new();
        hsm.init_token("hw-vaults", "1234");
        std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
        hsm
    })
}

/// Generous: the adversary tests load both cores, and a slow answer is not
/// what these tests are about (`tpm_hung_at_commit_time` uses a short one).
fn tpm_options() -> TpmOptions {
    TpmOptions {
        timeout: TPM_TIMEOUT.with(|t| t.get()),
        owner_auth: None,
    }
}

thread_local! {
    static TPM_TIMEOUT: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::from_secs(30)) };
}

fn token_uri(object: &str) -> Pkcs11Uri {
    softhsm();
    Pkcs11Uri::parse(&format!(
        "pkcs11:token=hw-vaults;object={object}?module-path={SOFTHSM_MODULE}&pin-value=1234"
    ))
    .unwrap()
}

/// The vault as the engine sees it, and the same vault concretely typed.
type Made = (
    Arc<dyn Vault>,
    Option<Arc<FileVault>>,
    Option<Arc<TpmVault>>,
    Option<Arc<Pkcs11Vault>>,
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Tpm,
    Pkcs11,
}

/// A store over a recording medium, with a vault of `kind` made by the
/// engine's create (so the first epoch key goes straight into it).
struct Setup {
    kind: Kind,
    medium: Arc<RecordingMedium<MemMedium>>,
    vault: Arc<dyn Vault>,
    /// Same vault, concretely typed, for hooks and reopening.
    file: Option<Arc<FileVault>>,
    tpm: Option<Arc<TpmVault>>,
    token: Option<Arc<Pkcs11Vault>>,
    device: Device,
    options: Options,
    label: String,
}

impl Setup {
    fn new(kind: Kind, seed: u64, label: &str) -> (Setup, Store) {
        let options = harness::options(seed);
        let medium = Arc::new(RecordingMedium::new(MemMedium::with_segment_capacity(
            harness::TEST_SEGMENT,
        )));
        let device = match kind {
            Kind::File => Device::None(tempfile::tempdir().unwrap()),
            Kind::Tpm => Device::Tpm(Arc::new(Mutex::new(Swtpm::start()))),
            Kind::Pkcs11 => {
                softhsm();
                Device::Token
            }
        };
        let mut made: Option<Made> = None;
        let store = Store::create(
            medium.clone() as Arc<dyn Medium>,
            |record| {
                let made_now: Made = match &device {
                    Device::None(dir) => {
                        let v = Arc::new(FileVault::create(
                            dir.path().join("vault"),
                            &pw(),
                            KdfParams::testing(),
                            record,
                            vault_provider(),
                        )?);
                        (v.clone(), Some(v), None, None)
                    }
                    Device::Tpm(tpm) => {
                        let loc = TpmLocation::parse(&tpm.lock().unwrap().location()).unwrap();
                        let v = Arc::new(TpmVault::create(
                            &loc,
                            &pw(),
                            KdfParams::testing(),
                            record,
                            vault_provider(),
                            tpm_options(),
                        )?);
                        (v.clone(), None, Some(v), None)
                    }
                    Device::Token => {
                        let v = Arc::new(Pkcs11Vault::create(
                            &token_uri(label),
                            &pw(),
                            KdfParams::testing(),
                            record,
                            vault_provider(),
                            Pkcs11Options {
                                timeout: Duration::from_secs(30),
                            },
                        )?);
                        (v.clone(), None, None, Some(v))
                    }
                };
                let vault = made_now.0.clone();
                made = Some(made_now);
                Ok(vault)
            },
            oubli_core::CreateOptions {
                cell_size: harness::TEST_CELL,
                ..Default::default()
            },
            options.clone(),
        )
        .unwrap();
        let (vault, file, tpm, token) = made.unwrap();
        (
            Setup {
                kind,
                medium,
                vault,
                file,
                tpm,
                token,
                device,
                options,
                label: label.to_string(),
            },
            store,
        )
    }

    fn swtpm(&self) -> Arc<Mutex<Swtpm>> {
        match &self.device {
            Device::Tpm(t) => t.clone(),
            _ => panic!("not a TPM setup"),
        }
    }

    /// Opens the vault afresh from the device (as after a reboot).
    fn reopen_vault(&self) -> Arc<dyn Vault> {
        match &self.device {
            Device::None(dir) => Arc::new(
                FileVault::open(dir.path().join("vault"), &pw(), vault_provider()).unwrap(),
            ),
            Device::Tpm(tpm) => {
                let loc = TpmLocation::parse(&tpm.lock().unwrap().location()).unwrap();
                Arc::new(TpmVault::open(&loc, &pw(), vault_provider(), tpm_options()).unwrap())
            }
            Device::Token => Arc::new(
                Pkcs11Vault::open(
                    &token_uri(&self.label),
                    &pw(),
                    vault_provider(),
                    Pkcs11Options::default(),
                )
                .unwrap(),
            ),
        }
    }

    /// Cuts the medium's power now (unsynced writes dropped) and reopens
    /// the store with a freshly opened vault; checks the acknowledged state.
    fn crash_and_reopen(&self, runner: &Runner) -> Store {
        let crashed = Arc::new(self.medium.inner().crash(TearMode::DropUnsynced, 1));
        let store = Store::open(
            crashed as Arc<dyn Medium>,
            self.reopen_vault(),
            self.options.clone(),
        )
        .unwrap();
        assert_eq!(runner.acked.diff(&store), None, "{:?}", self.kind);
        store
    }

    /// The adversary with everything the medium ever held and the vault's
    /// current record: nothing erased opens, everything live does.
    fn assert_erased(&self, runner: &Runner, check_live: bool) {
        let adversary = Adversary::seize(&self.medium);
        assert!(adversary.plaintext_markers().is_empty());
        // Everything the vault holds, read afresh from the device.
        let held = self.reopen_vault().readable_records().unwrap();
        assert_eq!(
            held.len(),
            1,
            "{:?}: the vault still holds an older key",
            self.kind
        );
        let recovered = adversary.recovered_markers(&held, self.options.provider.clone());
        let leaked: Vec<_> = recovered.intersection(&runner.erased).take(5).collect();
        assert!(
            leaked.is_empty(),
            "{:?}: deleted data recovered: {leaked:?}",
            self.kind
        );
        if check_live {
            assert!(
                runner.live_markers().is_subset(&recovered),
                "{:?}: adversary failed to read live data",
                self.kind
            );
        }
        if let Device::Tpm(tpm) = &self.device {
            // The TPM's own NV memory holds exactly one sealed record: the
            // adversary who reads the chip gets no older epoch key either.
            let image = tpm.lock().unwrap().state_bytes();
            let records = image.windows(8).filter(|w| w == b"OUBLIVLT").count();
            assert_eq!(records, 1, "old records left in the TPM's NV memory");
        }
    }
}

fn hw(kind: Kind) -> bool {
    kind == Kind::File || !skip_hw()
}

/// ≥ 20 epochs with the real vault; the adversary is checked every third commit.
fn adversary_run(kind: Kind, seed: u64) {
    if !hw(kind) {
        return;
    }
    let (s, store) = Setup::new(kind, seed, &format!("adversary-{seed}"));
    let first_epoch = store.epoch();
    let first_writes = s.vault.write_count().unwrap();
    let workload = Workload::generate(seed, 700, 64 * 1024, 25);
    let mut runner = Runner::default();
    let mut checked = 0;
    for step in &workload.steps {
        runner.step(&store, step).expect("step");
        if *step == Step::Commit && runner.commits % 3 == 0 {
            s.assert_erased(&runner, true);
            checked += 1;
        }
    }
    store.commit().unwrap();
    runner.note_commit();
    s.assert_erased(&runner, true);
    assert!(runner.commits >= 20, "only {} epochs", runner.commits);
    assert!(checked >= 5);
    assert!(
        runner.erased.len() > 300,
        "erased too little: {}",
        runner.erased.len()
    );
    // Exactly one vault write per commit.
    let epochs = store.epoch() - first_epoch;
    assert_eq!(
        s.vault.write_count().unwrap() - first_writes,
        epochs,
        "{kind:?}"
    );
    assert_eq!(runner.model.diff(&store), None);
}

#[test]
fn adversary_with_file_vault() {
    adversary_run(Kind::File, 21);
}

#[test]
fn adversary_with_tpm_vault() {
    adversary_run(Kind::Tpm, 22);
}

#[test]
fn adversary_with_pkcs11_vault() {
    adversary_run(Kind::Pkcs11, 23);
}

/// Puts data in, commits, deletes half, flushes: a deletion is pending.
fn pending_deletion(store: &Store) -> Runner {
    let mut runner = Runner::default();
    for step in [
        Step::Create,
        Step::Write {
            pick: 0,
            off: 0,
            len: 30_000,
        },
        Step::Create,
        Step::Write {
            pick: 1,
            off: 0,
            len: 30_000,
        },
        Step::Commit,
        Step::Delete { pick: 0 },
        Step::Write {
            pick: 0,
            off: 5_000,
            len: 10_000,
        },
        Step::Flush,
    ] {
        runner.step(store, &step).unwrap();
    }
    runner
}

/// A failing, then garbage-returning vault of each kind (the failure
/// injected around the real device) keeps the epoch open and loses nothing.
fn failures_with(kind: Kind, seed: u64) {
    if !hw(kind) {
        return;
    }
    let (s, store) = Setup::new(kind, seed, &format!("failures-{seed}"));
    drop(store);
    // Reopen the same store through a FlakyVault around the real one.
    let flaky = Arc::new(FlakyVault::new(s.vault.clone()));
    let store = Store::open(
        s.medium.clone() as Arc<dyn Medium>,
        flaky.clone(),
        s.options.clone(),
    )
    .unwrap();
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    let writes = s.vault.write_count().unwrap();

    // The device refuses the write: the epoch stays open, nothing is written.
    flaky.fail_next_stores(1);
    assert!(matches!(store.commit(), Err(Error::Vault(_))));
    assert_eq!(store.epoch(), epoch);
    assert_eq!(s.vault.write_count().unwrap(), writes);
    runner
        .step(
            &store,
            &Step::Write {
                pick: 0,
                off: 0,
                len: 4_000,
            },
        )
        .unwrap();
    runner.step(&store, &Step::Flush).unwrap();
    drop(s.crash_and_reopen(&runner));

    // The device writes, then the confirmation is lost: counts as committed.
    flaky.fail_after_write_next_store();
    runner.step(&store, &Step::Commit).unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    s.assert_erased(&runner, false);
    let reopened = s.crash_and_reopen(&runner);
    assert_eq!(reopened.epoch(), epoch + 1);
    drop(reopened);

    // Garbage from the vault is an integrity error, never data.
    flaky.garbage_on_next_load();
    let crashed = Arc::new(s.medium.inner().crash(TearMode::DropUnsynced, 1));
    assert!(matches!(
        Store::open(crashed as Arc<dyn Medium>, flaky.clone(), s.options.clone()),
        Err(Error::Corrupt(_))
    ));
    drop(s.crash_and_reopen(&runner));
}

#[test]
fn failures_with_file_vault() {
    failures_with(Kind::File, 31);
}

#[test]
fn failures_with_tpm_vault() {
    failures_with(Kind::Tpm, 32);
}

#[test]
fn failures_with_pkcs11_vault() {
    failures_with(Kind::Pkcs11, 33);
}

/// The TPM dies between writing the new record and clearing the old one:
/// the rotation's outcome is unknown to the engine, which refuses to
/// acknowledge anything until the TPM answers. After the TPM comes back
/// (and after a power cut of the medium) the store opens at the new epoch
/// with every acknowledged write, and the deletion is erased.
#[test]
fn tpm_killed_between_vault_write_and_confirmation() {
    if skip_hw() {
        return;
    }
    let (s, store) = Setup::new(Kind::Tpm, 41, "kill");
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    let swtpm = s.swtpm();
    let killer = swtpm.clone();
    s.tpm
        .as_ref()
        .unwrap()
        .set_rotation_hook(Some(Arc::new(move |step| {
            if step == RotationStep::NewRecordWritten {
                killer.lock().unwrap().kill();
            }
            Ok(())
        })));
    match store.commit() {
        Err(Error::VaultStateUnknown(_)) => {}
        other => panic!("expected VaultStateUnknown, got {other:?}"),
    }
    // (It will turn out to have happened: what was deleted before it is
    // what must be erased once the TPM answers.)
    runner.note_commit();
    s.tpm.as_ref().unwrap().set_rotation_hook(None);
    // Nothing can be acknowledged while the vault's state is unknown.
    runner
        .step(
            &store,
            &Step::Write {
                pick: 0,
                off: 0,
                len: 100,
            },
        )
        .unwrap();
    assert!(matches!(store.flush(), Err(Error::VaultStateUnknown(_))));
    swtpm.lock().unwrap().restart();
    // The TPM answers again: it holds the new record, so the commit happened
    // (the write made meanwhile now belongs to the new epoch), and the
    // engine destroys the old record the dead TPM could not — no further
    // rotation needed.
    runner.step(&store, &Step::Flush).unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    assert_eq!(s.vault.load().unwrap().epoch, epoch + 1);
    s.assert_erased(&runner, true);
    // The reopen replays that flush (logged in the new epoch) and commits it.
    let reopened = s.crash_and_reopen(&runner);
    assert_eq!(reopened.epoch(), epoch + 2);
}

/// The TPM dies before the new record is written: the store stays at the
/// old epoch and loses nothing; the retry after the TPM is back commits.
#[test]
fn tpm_killed_before_the_vault_write() {
    if skip_hw() {
        return;
    }
    let (s, store) = Setup::new(Kind::Tpm, 42, "kill-early");
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    let swtpm = s.swtpm();
    let killer = swtpm.clone();
    s.tpm
        .as_ref()
        .unwrap()
        .set_rotation_hook(Some(Arc::new(move |step| {
            if step == RotationStep::Start {
                killer.lock().unwrap().kill();
            }
            Ok(())
        })));
    assert!(store.commit().is_err());
    s.tpm.as_ref().unwrap().set_rotation_hook(None);
    swtpm.lock().unwrap().restart();
    assert_eq!(
        s.vault.load().unwrap().epoch,
        epoch,
        "no new record was written"
    );
    // The retry commits. (Reopening a crashed copy first would commit that
    // copy's replayed log into the same vault, so the power cut comes last.)
    runner.step(&store, &Step::Commit).unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    s.assert_erased(&runner, true);
    drop(s.crash_and_reopen(&runner));
}

/// A hung TPM (stopped, not dead) at commit time: the call times out, the
/// engine keeps the epoch open, and once the TPM resumes work goes on.
#[test]
fn tpm_hung_at_commit_time() {
    if skip_hw() {
        return;
    }
    TPM_TIMEOUT.with(|t| t.set(Duration::from_secs(3)));
    let (s, store) = Setup::new(Kind::Tpm, 43, "hang");
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    let swtpm = s.swtpm();
    swtpm.lock().unwrap().pause();
    let started = std::time::Instant::now();
    assert!(store.commit().is_err());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a hang must time out"
    );
    assert!(
        store.flush().is_err(),
        "nothing acknowledged while the vault is silent"
    );
    swtpm.lock().unwrap().resume();
    // Wait for the device thread to drain the calls that timed out.
    std::thread::sleep(Duration::from_secs(1));
    runner.step(&store, &Step::Flush).unwrap();
    runner.step(&store, &Step::Commit).unwrap();
    assert!(store.epoch() > epoch);
    s.assert_erased(&runner, false);
    drop(s.crash_and_reopen(&runner));
}

/// The token "crashes" between creating the new object and destroying the
/// old one: two records on the token; the newer wins and the next rotation
/// removes the leftover.
#[test]
fn token_cut_between_create_and_destroy() {
    if skip_hw() {
        return;
    }
    let (s, store) = Setup::new(Kind::Pkcs11, 44, "cut");
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    s.token
        .as_ref()
        .unwrap()
        .set_rotation_hook(Some(Arc::new(|step| {
            if step == RotationStep::NewRecordWritten {
                return Err(VaultError::Unavailable("token pulled".into()));
            }
            Ok(())
        })));
    // The engine asks the token what it holds: the new record, so committed;
    // it then destroys the leftover itself before reporting the commit done.
    runner.step(&store, &Step::Commit).unwrap();
    assert_eq!(store.epoch(), epoch + 1);
    s.token.as_ref().unwrap().set_rotation_hook(None);
    s.assert_erased(&runner, false);
    let reopened = s.crash_and_reopen(&runner);
    assert_eq!(reopened.epoch(), epoch + 1);
}

/// The file vault's rotation cut between its two steps by a power cut: the
/// process dies right after the new slot is durable, before the old one is
/// zeroed. The reopen destroys the old key before anything else, so the
/// adversary holding the vault file and the password finds only the new one.
#[test]
fn file_vault_rotation_cut_by_a_power_cut_between_its_steps() {
    let (s, store) = Setup::new(Kind::File, 45, "file-cut");
    let mut runner = pending_deletion(&store);
    let epoch = store.epoch();
    s.file
        .as_ref()
        .unwrap()
        .set_rotation_hook(Some(Arc::new(|step| {
            if step == RotationStep::NewRecordWritten {
                panic!("power cut between the two steps");
            }
            Ok(())
        })));
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.commit()));
    assert!(died.is_err(), "the hook cuts the rotation");
    // The process is gone: nothing more of it reaches the medium.
    std::mem::forget(store);
    runner.acked = runner.model.clone();
    runner.note_commit();
    let fresh = s.reopen_vault();
    assert_eq!(
        fresh.readable_records().unwrap().len(),
        2,
        "the cut left the old key in the file"
    );
    let reopened = s.crash_and_reopen(&runner);
    assert_eq!(reopened.epoch(), epoch + 1);
    s.assert_erased(&runner, true);
}
