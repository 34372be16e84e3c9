//! A key scheme's committed state: one unit per epoch, sealed under a key derived from the epoch key.
//!
//! Schemes that keep keys outside the tree (the keyed hash forest) hand the
//! engine their state at every commit. It is sealed under
//! `HKDF(K(e), "oubli/scheme-state", store id ‖ e ‖ salt)` with a fresh
//! random salt (a commit retried after a vault failure seals different
//! state: never twice under one key), and the superblock of epoch *e*
//! names it (address, sealed length, and the salt in the key-reference
//! slot). Once the vault no longer holds K(e) the state of *e* opens
//! nowhere, so a key it could derive is erased with the epoch, on every
//! medium, whether or not the medium overwrites anything.

use crate::error::{Error, Result};
use crate::medium::Medium;
use crate::superblock::Body;
use crate::tree::NodePtr;
use crate::unit::open_unit;
use crate::vault::StoreId;
use oubli_crypto::{load_scheme, CryptoProvider, KeyRef, KeyScheme, SecretKey, KEY_REF_LEN};
use std::sync::Arc;

const LABEL: &[u8] = b"oubli/scheme-state";
const AAD: &[u8] = b"oubli/scheme-state/v1";

fn state_key(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    salt: &KeyRef,
) -> SecretKey {
    let mut context = Vec::with_capacity(16 + 8 + KEY_REF_LEN);
    context.extend_from_slice(store_id);
    context.extend_from_slice(&epoch.to_le_bytes());
    context.extend_from_slice(salt.expose());
    provider.derive(epoch_key, LABEL, &context)
}

/// Seals `plain` for the superblock of `epoch`; returns the sealed bytes
/// and the salt (stored in the pointer's key-reference slot).
pub(crate) fn seal(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    mut plain: Vec<u8>,
) -> (Vec<u8>, KeyRef) {
    let mut salt = [0u8; KEY_REF_LEN];
    provider.fill_random(&mut salt);
    let salt = KeyRef::from_bytes(salt);
    provider.seal(
        &state_key(provider, epoch_key, store_id, epoch, &salt),
        AAD,
        &mut plain,
    );
    (plain, salt)
}

/// The key scheme a superblock names, loaded with its committed state.
pub(crate) fn load(
    medium: &dyn Medium,
    provider: Arc<dyn CryptoProvider>,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    body: &Body,
) -> Result<Arc<dyn KeyScheme>> {
    let plain = match &body.scheme_state {
        None => None,
        Some(p) => Some(open_state(
            medium, &*provider, epoch_key, store_id, epoch, p,
        )?),
    };
    load_scheme(body.key_scheme, plain.as_deref(), provider)
        .map_err(|e| Error::Corrupt(format!("key scheme state of epoch {epoch}: {e}")))
}

fn open_state(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    p: &NodePtr,
) -> Result<oubli_crypto::PlainBuf> {
    open_unit(
        medium,
        provider,
        &state_key(provider, epoch_key, store_id, epoch, &p.key),
        p.addr,
        p.len as u64,
        AAD,
        &|| format!("key scheme state of epoch {epoch}"),
    )
}
