//! INSECURE deterministic provider for fuzzing, test vectors and reproducible crash sweeps.

use crate::provider::{
    gcm_hkdf_methods, gcm_open, gcm_open_detached, gcm_open_within, gcm_seal, hkdf_derive,
    AuthError, CryptoProvider, TAG_LEN,
};
use crate::secret::{SecretKey, KEY_LEN};
use std::sync::atomic::{AtomicU64, Ordering};

/// Randomness is HKDF(seed, counter): every run with the same seed produces
/// the same keys. **Insecure by design**: [`is_secure`](CryptoProvider::is_secure)
/// returns false and the CLI refuses it. AEAD and KDF are the real ones.
pub struct DeterministicProvider {
    seed: SecretKey,
    counter: AtomicU64,
}

impl DeterministicProvider {
    pub fn new(seed: u64) -> Self {
        let mut bytes = [0u8; KEY_LEN];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        DeterministicProvider {
            seed: SecretKey::from_bytes(bytes),
            counter: AtomicU64::new(0),
        }
    }
}

impl CryptoProvider for DeterministicProvider {
    fn name(&self) -> &'static str {
        "INSECURE-deterministic"
    }
    fn is_secure(&self) -> bool {
        false
    }
    fn fill_random(&self, out: &mut [u8]) {
        for chunk in out.chunks_mut(KEY_LEN) {
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let block = hkdf_derive(&self.seed, b"deterministic-rng", &n.to_le_bytes());
            chunk.copy_from_slice(&block.expose()[..chunk.len()]);
        }
    }
    gcm_hkdf_methods!();
}
