//! Secret types: zeroized on drop, redacted in `Debug`, compared in constant time.

use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

/// Length of every symmetric key in oubli (AES-256).
pub const KEY_LEN: usize = 32;

/// A 256-bit secret key. Zeroized on drop; `Debug` never prints it; equality
/// is constant-time. Cloning is explicit and produces another zeroizing copy.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SecretKey([u8; KEY_LEN]);

impl SecretKey {
    /// Wraps raw key bytes (the caller's copy should itself be zeroized).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        SecretKey(bytes)
    }

    /// Copies a key out of a slice of exactly [`KEY_LEN`] bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let array: [u8; KEY_LEN] = bytes.try_into().ok()?;
        Some(SecretKey(array))
    }

    /// The key bytes, for serialization inside an encrypted container only.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl PartialEq for SecretKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}
impl Eq for SecretKey {}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(<redacted>)")
    }
}

/// A variable-length secret (plaintext of a sealed record, a password).
/// Zeroized on drop, redacted in `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretBytes(Zeroizing<Vec<u8>>);

impl SecretBytes {
    pub fn new(bytes: Vec<u8>) -> Self {
        SecretBytes(Zeroizing::new(bytes))
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
    pub fn expose_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(v: Vec<u8>) -> Self {
        SecretBytes::new(v)
    }
}

impl std::fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretBytes(<{} bytes redacted>)", self.0.len())
    }
}

/// Overwrites `buf` with zeros in a way the compiler may not elide.
///
/// zeroize's slice wipe writes one volatile byte at a time: for a 32 KiB
/// cell that cost more than decrypting it (bench/README.md, the profile of
/// the read path). The aligned middle of the buffer is wiped here with
/// volatile 16-byte words instead; only the unaligned ends go byte by byte.
pub fn wipe(buf: &mut [u8]) {
    let (head, middle, tail) = bytemuck::pod_align_to_mut::<u8, u128>(buf);
    head.zeroize();
    middle.zeroize();
    tail.zeroize();
}

/// Plaintext user data in memory: a cell being merged or opened.
///
/// Its length is fixed at construction (no growth, so no reallocation can
/// leave an unwiped copy behind); it is wiped with [`wipe`] on drop and
/// `Debug` does not print it.
#[derive(Default)]
pub struct PlainBuf(Vec<u8>);

impl PlainBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        PlainBuf(vec![0; len])
    }

    /// A copy of `bytes`.
    pub fn copy_of(bytes: &[u8]) -> Self {
        PlainBuf(bytes.to_vec())
    }

    /// Takes ownership of `bytes` (which is then wiped with the buffer).
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        PlainBuf(bytes)
    }

    /// Shortens the buffer to `len` bytes, wiping the bytes cut off.
    pub fn truncate(&mut self, len: usize) {
        if len < self.0.len() {
            wipe(&mut self.0[len..]);
            self.0.truncate(len);
        }
    }
}

impl std::ops::Deref for PlainBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for PlainBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for PlainBuf {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

impl std::fmt::Debug for PlainBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlainBuf(<{} bytes redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let key = SecretKey::from_bytes([0x41; KEY_LEN]);
        let shown = format!("{key:?}");
        assert!(!shown.contains("41") && !shown.contains("65"), "{shown}");
        let bytes = SecretBytes::new(b"hunter2".to_vec());
        assert!(!format!("{bytes:?}").contains("hunter2"));
    }

    #[test]
    fn wipe_clears_every_byte_whatever_the_alignment() {
        let mut backing = vec![0xa5u8; 4096 + 64];
        for start in 0..17 {
            for len in [0, 1, 15, 16, 17, 100, 4096] {
                backing.fill(0xa5);
                wipe(&mut backing[start..start + len]);
                assert!(backing[start..start + len].iter().all(|&b| b == 0));
                assert!(backing[..start].iter().all(|&b| b == 0xa5));
                assert!(backing[start + len..].iter().all(|&b| b == 0xa5));
            }
        }
        let mut buf = PlainBuf::copy_of(b"attack at dawn");
        buf.truncate(6);
        assert_eq!(&buf[..], b"attack");
        assert!(!format!("{buf:?}").contains("attack"));
    }

    #[test]
    fn equality_compares_contents() {
        let a = SecretKey::from_bytes([1; KEY_LEN]);
        let mut b_bytes = [1; KEY_LEN];
        assert_eq!(a, SecretKey::from_bytes(b_bytes));
        b_bytes[31] = 2;
        assert_ne!(a, SecretKey::from_bytes(b_bytes));
    }
}
