//! A key scheme's committed state: a few units per epoch, sealed under keys derived from the epoch key.
//!
//! Schemes that keep keys outside the tree (the keyed hash forest, the key
//! storage area) hand the engine their state at every commit. It is cut in
//! chunks small enough for any segment, each sealed under
//! `HKDF(K(e), "oubli/scheme-state", store id ‖ e ‖ salt ‖ chunk number)`
//! with a fresh random salt (a commit retried after a vault failure seals
//! different state: never twice under one key), and an index unit (chunk
//! number `u64::MAX`) lists them; the superblock of epoch *e* names the
//! index (address, sealed length, and the salt in the key-reference
//! slot). Once the vault no longer holds K(e) the state of *e* opens
//! nowhere, so a key it could derive is erased with the epoch, on every
//! medium, whether or not the medium overwrites anything.

use crate::error::{Error, Result};
use crate::medium::Medium;
use crate::superblock::Body;
use crate::tree::NodePtr;
use crate::unit::open_unit;
use crate::vault::StoreId;
use oubli_crypto::{load_scheme, wipe, CryptoProvider, KeyRef, KeyScheme, SecretKey, KEY_REF_LEN};
use std::sync::Arc;

const LABEL: &[u8] = b"oubli/scheme-state";
const AAD: &[u8] = b"oubli/scheme-state/v1";
/// The chunk number of the index unit's key.
const INDEX: u64 = u64::MAX;

fn state_key(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    salt: &KeyRef,
    chunk: u64,
) -> SecretKey {
    let mut context = Vec::with_capacity(16 + 8 + KEY_REF_LEN + 8);
    context.extend_from_slice(store_id);
    context.extend_from_slice(&epoch.to_le_bytes());
    context.extend_from_slice(salt.expose());
    context.extend_from_slice(&chunk.to_le_bytes());
    provider.derive(epoch_key, LABEL, &context)
}

fn aad(chunk: u64) -> Vec<u8> {
    let mut aad = AAD.to_vec();
    aad.extend_from_slice(&chunk.to_le_bytes());
    aad
}

/// Where an epoch's state lies: the units holding its chunks, then the
/// index naming them (what the superblock points at).
pub(crate) struct Written {
    pub(crate) index: NodePtr,
    pub(crate) units: Vec<NodePtr>,
}

/// Seals `plain` for the superblock of `epoch` in chunks of at most
/// `chunk` bytes (a state never outgrows a segment), each appended with
/// `append` (which returns its address), then the index of the chunks.
pub(crate) fn write(
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    plain: &[u8],
    chunk: usize,
    append: &mut dyn FnMut(&[u8]) -> Result<u64>,
) -> Result<Written> {
    let mut salt = [0u8; KEY_REF_LEN];
    provider.fill_random(&mut salt);
    let salt = KeyRef::from_bytes(salt);
    let mut units = Vec::new();
    let mut index = Vec::new();
    index.extend_from_slice(&(plain.len() as u64).to_le_bytes());
    for (n, piece) in plain.chunks(chunk.max(1)).enumerate() {
        let n = n as u64;
        let mut sealed = piece.to_vec();
        let key = state_key(provider, epoch_key, store_id, epoch, &salt, n);
        provider.seal(&key, &aad(n), &mut sealed);
        let addr = append(&sealed)?;
        index.extend_from_slice(&addr.to_le_bytes());
        index.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        units.push(NodePtr {
            addr,
            len: sealed.len() as u32,
            key: salt.clone(),
        });
    }
    let key = state_key(provider, epoch_key, store_id, epoch, &salt, INDEX);
    provider.seal(&key, &aad(INDEX), &mut index);
    let addr = append(&index)?;
    let index = NodePtr {
        addr,
        len: index.len() as u32,
        key: salt,
    };
    units.push(index.clone());
    Ok(Written { index, units })
}

/// The key scheme a superblock names, loaded with its committed state, and
/// the units that hold that state (for the cleaner).
pub(crate) fn load(
    medium: &dyn Medium,
    provider: Arc<dyn CryptoProvider>,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    body: &Body,
) -> Result<(Arc<dyn KeyScheme>, Vec<NodePtr>)> {
    let (plain, units) = match &body.scheme_state {
        None => (None, Vec::new()),
        Some(p) => {
            let (plain, units) = read(medium, &*provider, epoch_key, store_id, epoch, p)?;
            (Some(plain), units)
        }
    };
    let scheme = load_scheme(body.key_scheme, plain.as_deref(), provider);
    if let Some(mut p) = plain {
        wipe(&mut p);
    }
    let scheme =
        scheme.map_err(|e| Error::Corrupt(format!("key scheme state of epoch {epoch}: {e}")))?;
    Ok((scheme, units))
}

fn read(
    medium: &dyn Medium,
    provider: &dyn CryptoProvider,
    epoch_key: &SecretKey,
    store_id: &StoreId,
    epoch: u64,
    index: &NodePtr,
) -> Result<(Vec<u8>, Vec<NodePtr>)> {
    let what = || format!("key scheme state of epoch {epoch}");
    let open = |p: &NodePtr, n: u64| {
        let key = state_key(provider, epoch_key, store_id, epoch, &index.key, n);
        open_unit(medium, provider, &key, p.addr, p.len as u64, &aad(n), &what)
    };
    let table = open(index, INDEX)?;
    let bad = || Error::Corrupt(format!("{} (index)", what()));
    let (total, mut rest) = table.split_at_checked(8).ok_or_else(bad)?;
    let total = u64::from_le_bytes(total.try_into().expect("8 bytes"));
    let mut plain = Vec::new();
    let mut units = Vec::new();
    while !rest.is_empty() {
        let (entry, tail) = rest.split_at_checked(12).ok_or_else(bad)?;
        rest = tail;
        let p = NodePtr {
            addr: u64::from_le_bytes(entry[..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(entry[8..].try_into().expect("4 bytes")),
            key: index.key.clone(),
        };
        match open(&p, units.len() as u64) {
            Ok(piece) => plain.extend_from_slice(&piece),
            Err(e) => {
                wipe(&mut plain);
                return Err(e);
            }
        }
        units.push(p);
    }
    if plain.len() as u64 != total {
        return Err(bad());
    }
    units.push(index.clone());
    Ok((plain, units))
}
