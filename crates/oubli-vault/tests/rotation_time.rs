//! How long one rotation (`Vault::store`) takes for each vault kind; prints figures, asserts nothing about speed.
//!
//! Run: `cargo test -p oubli-vault --release --test rotation_time -- --nocapture`
//! (swtpm and SoftHSM2 are simulators: a real TPM or smart card is slower,
//! typically tens of milliseconds per NV write or object creation).

mod common;

#[cfg(feature = "tpm")]
use common::Swtpm;
use common::{skip_hw, SoftHsm, SOFTHSM_MODULE};
use oubli_crypto::{CryptoProvider, RingProvider, SecretBytes, SecretKey};
use oubli_vault::{create_vault_with, KdfParams, Vault, VaultOptions, VaultRecord};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROTATIONS: u64 = 200;

fn rec(epoch: u64) -> VaultRecord {
    VaultRecord {
        store_id: [3; 16],
        epoch,
        key: SecretKey::from_bytes([epoch as u8; 32]),
    }
}

fn measure(kind: &str, location: &str) -> Vec<Duration> {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    let v = create_vault_with(
        location,
        &SecretBytes::new(b"pw".to_vec()),
        KdfParams::testing(),
        &rec(0),
        provider,
        &VaultOptions::default(),
    )
    .unwrap();
    let mut times: Vec<Duration> = (1..=ROTATIONS)
        .map(|e| {
            let t = Instant::now();
            v.store(&rec(e)).unwrap();
            t.elapsed()
        })
        .collect();
    assert_eq!(v.load().unwrap(), rec(ROTATIONS));
    assert_eq!(v.write_count().unwrap(), ROTATIONS + 1);
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    println!(
        "rotation {kind:<7} n={ROTATIONS} median {:>9.3} ms  mean {:>9.3} ms  p95 {:>9.3} ms  max {:>9.3} ms",
        ms(times[times.len() / 2]),
        ms(mean),
        ms(times[times.len() * 95 / 100]),
        ms(*times.last().unwrap())
    );
    times
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
fn rotation_time() {
    let dir = tempfile::tempdir().unwrap();
    measure("file", &format!("file:{}", dir.path().join("v").display()));
    if skip_hw() {
        return;
    }
    #[cfg(feature = "tpm")]
    {
        let tpm = Swtpm::start();
        measure("tpm2", &format!("tpm:{}", tpm.location()));
    }
    let hsm = SoftHsm::new();
    hsm.init_token("timing", "1234");
    std::env::set_var("SOFTHSM2_CONF", &hsm.conf);
    measure(
        "pkcs11",
        &format!("pkcs11:token=timing?module-path={SOFTHSM_MODULE}&pin-value=1234"),
    );
}
