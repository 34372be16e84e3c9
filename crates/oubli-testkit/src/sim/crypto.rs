//! The simulator's crypto provider: records which message each one-message key sealed, and holds large writes' sealing at a seeded interleaving point.

use crate::forward::forward_crypto;
use oubli_crypto::{CryptoProvider, SecretKey, TAG_LEN};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An operation the simulator runs on another thread while a write seals
/// its cells outside the engine lock; it reports what happened.
pub type Interleaved = Box<dyn FnOnce() -> String + Send>;

/// How long a sealing call waits for the interleaved operation before going
/// on without it (it is blocked: the caller holds the engine lock, so the
/// operation lands after the call; a safety net, not a schedule).
const INTERLEAVE_WAIT: Duration = Duration::from_secs(5);

/// Wraps the deterministic provider. Every seal is recorded as
/// (fingerprint of the key → fingerprint of aad and plaintext): the
/// engine's keys are one-message keys with a fixed nonce, so one key
/// sealing two different messages is a (key, nonce) pair reused. Only
/// 64-bit fingerprints are kept, never a key.
pub struct SimProvider {
    inner: Arc<dyn CryptoProvider>,
    sealed: Mutex<HashMap<u64, u64>>,
    /// The first reuse seen (a description).
    reuse: Mutex<Option<String>>,
    interleave: Mutex<Option<(Interleaved, mpsc::Sender<String>)>>,
    /// Mutation check only: the random source repeats its output (a stuck
    /// RNG hands out the same key twice).
    pub stuck_random: AtomicBool,
    pub seals: AtomicU64,
    pub interleavings: AtomicU64,
}

fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

impl SimProvider {
    pub fn new(inner: Arc<dyn CryptoProvider>) -> SimProvider {
        SimProvider {
            inner,
            sealed: Mutex::default(),
            reuse: Mutex::default(),
            interleave: Mutex::default(),
            stuck_random: AtomicBool::new(false),
            seals: AtomicU64::new(0),
            interleavings: AtomicU64::new(0),
        }
    }

    /// A key that sealed two different messages, if any did.
    pub fn reuse(&self) -> Option<String> {
        self.reuse.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `op` on another thread at the next `seal_detached` (a whole
    /// cell of a large write, sealed outside the engine lock); its report
    /// comes back on the returned channel.
    pub fn interleave_at_next_seal(&self, op: Interleaved) -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel();
        *self.interleave.lock().unwrap_or_else(|p| p.into_inner()) = Some((op, tx));
        rx
    }

    /// Drops an interleaving that did not fire.
    pub fn disarm(&self) {
        self.interleave
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    fn record(&self, key: &SecretKey, aad: &[u8], plaintext: &[u8]) {
        self.seals.fetch_add(1, Ordering::Relaxed);
        let k = fingerprint(&[key.expose()]);
        let m = fingerprint(&[aad, plaintext]);
        let mut sealed = self.sealed.lock().unwrap_or_else(|p| p.into_inner());
        match sealed.insert(k, m) {
            Some(before) if before != m => {
                self.reuse
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| {
                        format!(
                            "key {k:016x} sealed two different messages ({before:016x}, {m:016x})"
                        )
                    });
            }
            _ => {}
        }
    }

    fn maybe_interleave(&self) {
        let Some((op, tx)) = self
            .interleave
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        self.interleavings.fetch_add(1, Ordering::Relaxed);
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let report = op();
            let _ = tx.send(report);
            let _ = done_tx.send(());
        });
        let _ = done_rx.recv_timeout(INTERLEAVE_WAIT);
    }
}

impl CryptoProvider for SimProvider {
    fn fill_random(&self, out: &mut [u8]) {
        if self.stuck_random.load(Ordering::SeqCst) {
            // The same bytes at every call: nothing kept between calls.
            let mut rng = oubli_media::SplitMix64::new(0x57ac);
            for b in out.iter_mut() {
                *b = rng.next_u64() as u8;
            }
            return;
        }
        self.inner.fill_random(out)
    }
    fn seal_detached(&self, key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        super::sched::point("seal");
        self.maybe_interleave();
        self.record(key, aad, buf);
        self.inner.seal_detached(key, aad, buf)
    }
    fn seal(&self, key: &SecretKey, aad: &[u8], buf: &mut Vec<u8>) {
        super::sched::point("seal");
        self.record(key, aad, buf);
        self.inner.seal(key, aad, buf)
    }
    forward_crypto!(inner: name, is_secure, open_in_place, open_detached, open_within, derive);
}
