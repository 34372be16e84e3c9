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
    fn equality_compares_contents() {
        let a = SecretKey::from_bytes([1; KEY_LEN]);
        let mut b_bytes = [1; KEY_LEN];
        assert_eq!(a, SecretKey::from_bytes(b_bytes));
        b_bytes[31] = 2;
        assert_ne!(a, SecretKey::from_bytes(b_bytes));
    }
}
