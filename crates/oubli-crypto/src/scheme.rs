//! Key schemes: where a unit's key comes from and what its parent pointer stores.

use crate::provider::CryptoProvider;
use crate::secret::{SecretKey, KEY_LEN};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Bytes of key reference stored in every parent pointer.
pub const KEY_REF_LEN: usize = 32;

/// What a parent pointer stores about its child's key. For the default
/// scheme this *is* the key, so it is treated as a secret.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct KeyRef(pub(crate) [u8; KEY_REF_LEN]);

impl KeyRef {
    pub fn from_bytes(bytes: [u8; KEY_REF_LEN]) -> Self {
        KeyRef(bytes)
    }
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        Some(KeyRef(bytes.try_into().ok()?))
    }
    /// For serialization inside an encrypted parent only.
    pub fn expose(&self) -> &[u8; KEY_REF_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for KeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyRef(<redacted>)")
    }
}

/// Where unit keys come from.
///
/// The engine asks the scheme for a key whenever it writes a unit, stores the
/// returned [`KeyRef`] in the unit's parent, resolves it when reading, and
/// calls [`release`](Self::release) when the unit dies so that schemes whose
/// keys live outside the tree (the keyed hash forest of Lethe, the key storage
/// area of DNEFS) can make the key underivable at the next commit.
pub trait KeyScheme: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// A key for a new unit and the reference its parent will store.
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef);
    /// The key a stored reference stands for.
    fn resolve(&self, key_ref: &KeyRef) -> SecretKey;
    /// The unit behind `key_ref` is dead. Default: nothing to do, because
    /// dropping the parent pointer already dropped the only copy of the key.
    fn release(&self, _key_ref: &KeyRef) {}
}

/// The default scheme: each unit gets a fresh random key, kept only in its
/// parent pointer (ERASER's file key tree, extended to every unit).
#[derive(Default, Clone, Copy)]
pub struct ParentPointerScheme;

impl KeyScheme for ParentPointerScheme {
    fn name(&self) -> &'static str {
        "parent-pointer"
    }
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        let key = provider.random_key();
        let key_ref = KeyRef(*key.expose());
        (key, key_ref)
    }
    fn resolve(&self, key_ref: &KeyRef) -> SecretKey {
        let bytes: [u8; KEY_LEN] = key_ref.0;
        SecretKey::from_bytes(bytes)
    }
}
