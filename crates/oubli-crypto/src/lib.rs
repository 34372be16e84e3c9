//! The crypto provider seam of oubli: secret key types, AEAD/KDF/RNG providers and key schemes.
//!
//! Everything the engine does with cryptography goes through [`CryptoProvider`]
//! (one AEAD, one KDF, one RNG) and [`KeyScheme`] (where a unit's key comes
//! from). The production provider is [`RingProvider`] (AES-256-GCM, HKDF-SHA256
//! and the operating system's RNG, from `ring`). A deterministic provider for
//! fuzzing and test vectors exists behind the `insecure-deterministic` feature
//! and reports itself as insecure; the CLI never enables that feature.
//!
//! Discipline: every key seals exactly one message, so the AEAD nonce is the
//! constant zero. Keys that must seal several messages (a log key, a vault
//! key-encryption key) never seal anything themselves: a one-message key is
//! derived from them per message with [`CryptoProvider::derive`].

mod provider;
mod scheme;
mod secret;

#[cfg(feature = "insecure-deterministic")]
mod deterministic;

#[cfg(feature = "insecure-deterministic")]
pub use deterministic::DeterministicProvider;
pub use provider::{AuthError, CryptoProvider, RingProvider, TAG_LEN};
pub use scheme::{
    load_scheme, scheme_name, KeyRef, KeyScheme, KeyStorageArea, KeyedHashForest,
    ParentPointerScheme, SchemeError, SchemeStats, BLOCK_KEYS, FANOUTS, KEY_REF_LEN,
    SCHEME_KEYED_HASH_FOREST, SCHEME_KEY_STORAGE_AREA, SCHEME_NAMES, SCHEME_PARENT_POINTER,
};
pub use secret::{wipe, PlainBuf, SecretBytes, SecretKey, KEY_LEN};
