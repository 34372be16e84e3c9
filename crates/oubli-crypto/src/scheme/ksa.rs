//! DNEFS's key storage area: unit keys kept in a flat array of positions, in fixed-size key blocks.
//!
//! A unit's key reference is its *position* (8 bytes; the rest of the
//! 32-byte slot is zero). The area is cut into key blocks of
//! [`BLOCK_KEYS`] positions (4 KiB of keys). A position is *used* (it holds
//! the key of a unit some retained root reaches, or one written since the
//! last commit) or *free* (it holds no key). Deleting is marking: at every
//! commit the sweep turns every used position that no retained root
//! reaches into a free one and the purge writes the key blocks without
//! those keys (DNEFS: "a purge rewrites every key block holding a deleted
//! key"). Free positions are handed out again — lowest first, as DNEFS
//! keeps the KSA compact — each time with a key drawn at allocation, so a
//! position never carries the same key for two units.
//!
//! On a medium that does not erase, the purge's erasure comes from the
//! epoch rotation: the area is committed under the new epoch's key, and the
//! old one, holding the deleted keys, is sealed under a key the vault no
//! longer has (DNEFS on a non-flash medium). On raw NAND the old key blocks
//! would be erased in place instead (docs/BACKLOG.md, "Key schemes").
//!
//! Crash safety: a key drawn since the last commit exists only in memory
//! until the intent log carries it ([`journal`](KeyScheme::journal):
//! sequence number, position, key), ahead of the ops naming it. Replay
//! skips records whose sequence number the committed state already
//! covers, so a key the state dropped is never brought back. A session
//! that crashed before logging lost its drawn keys with it; the next one
//! may hand out the same positions, under new keys.

use super::{
    index_of, index_ref, Cursor, KeyRef, KeyScheme, Pending, SchemeError, SchemeStats, INDEX_BYTES,
    SCHEME_KEY_STORAGE_AREA,
};
use crate::provider::CryptoProvider;
use crate::secret::{SecretKey, KEY_LEN};
use std::collections::{BTreeSet, HashSet};
use std::sync::{Mutex, MutexGuard};

/// Positions per key block (4 KiB of keys).
pub const BLOCK_KEYS: u64 = 128;
const STATE_VERSION: u8 = 1;
const RECORD_KEY: u8 = 1;
const BITMAP: usize = (BLOCK_KEYS / 8) as usize;

#[derive(Default)]
struct Area {
    /// The key at each position (`None`: free).
    keys: Vec<Option<SecretKey>>,
    /// Free positions below `keys.len()`.
    free: BTreeSet<u64>,
    /// Sequence number of the next key drawn.
    next_seq: u64,
    /// Detached allocations, and keys drawn since the last flush that
    /// logged them: `(seq, position, key)`.
    pending: Pending<(u64, u64, SecretKey)>,
}

impl Area {
    fn set(&mut self, pos: u64, key: Option<SecretKey>) {
        while self.keys.len() as u64 <= pos {
            self.free.insert(self.keys.len() as u64);
            self.keys.push(None);
        }
        if key.is_some() {
            self.free.remove(&pos);
        } else {
            self.free.insert(pos);
        }
        self.keys[pos as usize] = key;
    }
    /// The lowest free position, under a key drawn now (journaled).
    fn allocate(&mut self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        let pos = match self.free.pop_first() {
            Some(p) => p,
            None => self.keys.len() as u64,
        };
        let key = provider.random_key();
        self.set(pos, Some(key.clone()));
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.journal.push((seq, pos, key.clone()));
        (key, index_ref(pos))
    }
    fn blocks(&self) -> u64 {
        (self.keys.len() as u64).div_ceil(BLOCK_KEYS)
    }
}

/// The key storage area scheme (issue 11).
#[derive(Default)]
pub struct KeyStorageArea {
    area: Mutex<Area>,
}

impl KeyStorageArea {
    fn lock(&self) -> MutexGuard<'_, Area> {
        self.area.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The committed state of a store.
    pub fn decode(bytes: &[u8]) -> Result<Self, SchemeError> {
        let mut r = Cursor::new(bytes, "key storage area state");
        if r.u8()? != STATE_VERSION {
            return Err(r.bad());
        }
        let mut area = Area {
            next_seq: r.u64()?,
            ..Area::default()
        };
        let blocks = r.u64()?;
        for block in 0..blocks {
            let bitmap = r.take(BITMAP)?;
            for slot in 0..BLOCK_KEYS {
                let key = r.key()?;
                let used = bitmap[(slot / 8) as usize] & (1 << (slot % 8)) != 0;
                area.set(block * BLOCK_KEYS + slot, used.then_some(key));
            }
        }
        r.end()?;
        Ok(KeyStorageArea {
            area: Mutex::new(area),
        })
    }
}

impl KeyScheme for KeyStorageArea {
    fn name(&self) -> &'static str {
        "key-storage-area"
    }
    fn id(&self) -> u8 {
        SCHEME_KEY_STORAGE_AREA
    }
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        self.lock().allocate(provider)
    }
    fn allocate_detached(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        // Under one lock: a sweep between the allocation and the marking
        // would free the position before its cell is placed.
        let mut a = self.lock();
        let (key, key_ref) = a.allocate(provider);
        a.pending.detach(&key_ref);
        (key, key_ref)
    }
    fn placed(&self, key_ref: &KeyRef) {
        self.lock().pending.place(key_ref);
    }
    fn resolve(&self, key_ref: &KeyRef) -> Result<SecretKey, SchemeError> {
        let pos = index_of(key_ref)?;
        self.lock()
            .keys
            .get(pos as usize)
            .cloned()
            .flatten()
            .ok_or_else(|| SchemeError(format!("key storage area position {pos} is deleted")))
    }
    fn keeps_keys_outside_tree(&self) -> bool {
        true
    }
    fn sweep(&self, live: &[KeyRef]) -> Result<(), SchemeError> {
        let mut a = self.lock();
        let mut needed: HashSet<u64> = a.pending.unplaced.iter().copied().collect();
        for r in live {
            needed.insert(index_of(r)?);
        }
        let doomed: Vec<u64> = (0..a.keys.len() as u64)
            .filter(|p| a.keys[*p as usize].is_some() && !needed.contains(p))
            .collect();
        for pos in doomed {
            a.set(pos, None);
        }
        Ok(())
    }
    fn commit_state(&self) -> Option<Vec<u8>> {
        let mut a = self.lock();
        a.pending.in_state = a.pending.journal.len();
        let blocks = a.blocks();
        let mut out = Vec::with_capacity(17 + blocks as usize * (BITMAP + KEY_LEN * 128));
        out.push(STATE_VERSION);
        out.extend_from_slice(&a.next_seq.to_le_bytes());
        out.extend_from_slice(&blocks.to_le_bytes());
        for block in 0..blocks {
            let slots = block * BLOCK_KEYS..(block + 1) * BLOCK_KEYS;
            let key_at = |p: u64| a.keys.get(p as usize).and_then(|k| k.as_ref());
            let mut bitmap = [0u8; BITMAP];
            for p in slots.clone() {
                if key_at(p).is_some() {
                    let slot = p % BLOCK_KEYS;
                    bitmap[(slot / 8) as usize] |= 1 << (slot % 8);
                }
            }
            out.extend_from_slice(&bitmap);
            // A free position's slot holds zeros: the purged key is gone.
            for p in slots {
                match key_at(p) {
                    Some(k) => out.extend_from_slice(k.expose()),
                    None => out.extend_from_slice(&[0u8; KEY_LEN]),
                }
            }
        }
        Some(out)
    }
    fn journal(&self) -> Vec<Vec<u8>> {
        self.lock()
            .pending
            .journal
            .iter()
            .map(|(seq, pos, key)| {
                let mut rec = vec![RECORD_KEY];
                rec.extend_from_slice(&seq.to_le_bytes());
                rec.extend_from_slice(&pos.to_le_bytes());
                rec.extend_from_slice(key.expose());
                rec
            })
            .collect()
    }
    fn journal_logged(&self, count: usize) {
        self.lock().pending.logged(count);
    }
    fn committed(&self) {
        self.lock().pending.committed();
    }
    fn replay(&self, record: &[u8]) -> Result<(), SchemeError> {
        let mut r = Cursor::new(record, "key storage area log record");
        if r.u8()? != RECORD_KEY {
            return Err(r.bad());
        }
        let (seq, pos, key) = (r.u64()?, r.u64()?, r.key()?);
        r.end()?;
        let mut a = self.lock();
        // Drawn before the committed state was taken: it holds the key, or
        // dropped it since (deleted) — never bring it back.
        if seq < a.next_seq {
            return Ok(());
        }
        a.set(pos, Some(key));
        a.next_seq = seq + 1;
        Ok(())
    }
    fn stats(&self) -> SchemeStats {
        let a = self.lock();
        SchemeStats {
            state_bytes: 17 + a.blocks() * (BITMAP as u64 + KEY_LEN as u64 * BLOCK_KEYS),
            key_ref_bytes: INDEX_BYTES as u32,
            roots: None,
            keys: Some(a.keys.len() as u64 - a.free.len() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::RingProvider;

    #[test]
    fn sweep_deletes_exactly_the_unneeded_positions_and_state_round_trips() {
        let (a, p) = (KeyStorageArea::default(), RingProvider::new());
        let refs: Vec<_> = (0..300).map(|_| a.allocate(&p)).collect();
        let keep = |i: usize| i % 5 == 1 || (100..150).contains(&i);
        let live: Vec<KeyRef> = (0..300)
            .filter(|&i| keep(i))
            .map(|i| refs[i].1.clone())
            .collect();
        a.sweep(&live).unwrap();
        let b = KeyStorageArea::decode(&a.commit_state().unwrap()).unwrap();
        for (i, (k, r)) in refs.iter().enumerate() {
            for s in [&a, &b] {
                match s.resolve(r) {
                    Ok(got) => assert!(keep(i) && &got == k, "position {i} still holds its key"),
                    Err(_) => assert!(!keep(i), "live position {i} was deleted"),
                }
            }
        }
        assert_eq!(b.stats().keys, Some(live.len() as u64));
    }

    #[test]
    fn a_freed_position_is_handed_out_again_under_a_new_key() {
        let (a, p) = (KeyStorageArea::default(), RingProvider::new());
        let (k0, r0) = a.allocate(&p);
        a.sweep(&[]).unwrap();
        let (k1, r1) = a.allocate(&p);
        assert_eq!(r0, r1, "the lowest free position first");
        assert_ne!(k0, k1, "a position never carries one key twice");
    }

    #[test]
    fn a_new_session_never_reuses_a_key_of_a_crashed_one() {
        let (a, p) = (KeyStorageArea::default(), RingProvider::new());
        a.allocate(&p);
        let state = a.commit_state().unwrap();
        let s1 = KeyStorageArea::decode(&state).unwrap();
        let lost: Vec<_> = (0..10).map(|_| s1.allocate(&p).0).collect();
        let s2 = KeyStorageArea::decode(&state).unwrap();
        for _ in 0..10 {
            assert!(
                !lost.contains(&s2.allocate(&p).0),
                "a key sealed two messages"
            );
        }
    }

    #[test]
    fn replay_restores_logged_keys_but_never_a_deleted_one() {
        let (a, p) = (KeyStorageArea::default(), RingProvider::new());
        a.allocate(&p);
        let state = a.commit_state().unwrap();
        let s1 = KeyStorageArea::decode(&state).unwrap();
        let (k, r) = s1.allocate(&p);
        let journal = s1.journal();
        let s2 = KeyStorageArea::decode(&state).unwrap();
        assert!(s2.resolve(&r).is_err());
        s2.replay(&journal[0]).unwrap();
        assert_eq!(s2.resolve(&r).unwrap(), k);
        // Committed, then deleted by a sweep: a repeated record restores nothing.
        let s3 = KeyStorageArea::decode(&s2.commit_state().unwrap()).unwrap();
        s3.sweep(&[]).unwrap();
        s3.replay(&journal[0]).unwrap();
        assert!(s3.resolve(&r).is_err());
    }

    #[test]
    fn a_detached_allocation_survives_a_sweep_until_placed() {
        let (a, p) = (KeyStorageArea::default(), RingProvider::new());
        let (k, r) = a.allocate_detached(&p);
        a.sweep(&[]).unwrap();
        assert_eq!(a.resolve(&r).unwrap(), k);
        a.placed(&r);
        a.sweep(&[]).unwrap();
        assert!(a.resolve(&r).is_err());
    }
}
