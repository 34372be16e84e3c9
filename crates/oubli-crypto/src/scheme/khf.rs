//! Lethe's keyed hash forest: unit keys derived down trees of keyed hashes.
//!
//! Leaves are numbered `0, 1, 2, …` and never handed out twice by one
//! forest. Tree *t* covers leaves `[t·S, (t+1)·S)` with `S` the product of
//! [`FANOUTS`]; its root key is random. A node at height *h* (leaves are
//! height 0) covering leaves from `start` has the key
//! `HKDF(parent key, "oubli/khf/v1", h ‖ start)`. A unit's key reference is
//! its leaf index (8 bytes; the rest of the 32-byte slot is zero).
//!
//! The *forest* is the set of keys kept: disjoint subtrees, each a
//! `(start, height, key)` root. A leaf's key is derivable iff a root covers
//! it. Revoking leaves is *deletion by addition*: a root covering a revoked
//! leaf is replaced by the roots of its children that still cover a needed
//! leaf, recursively (at most `fanout − 1` new roots per level per revoked
//! leaf); a subtree with no needed leaf is simply dropped. [`sweep`] does
//! this for every leaf below the allocation point that no retained root
//! reaches, so the forest is always the minimal cover of the needed leaves.
//!
//! Crash safety: each writable session allocates from a tree of its own,
//! started at the first allocation with a fresh random root key, and put in
//! the journal (the intent log carries it before any op naming one of its
//! leaves). A session that crashed before logging anything loses its tree's
//! key with it, so the next session, which may start a tree at the same
//! leaf numbers, derives different keys: a key never seals two messages.
//!
//! [`sweep`]: KeyScheme::sweep

use super::{
    index_of, index_ref, Cursor, KeyRef, KeyScheme, Pending, SchemeError, SchemeStats, INDEX_BYTES,
    SCHEME_KEYED_HASH_FOREST,
};
use crate::provider::CryptoProvider;
use crate::secret::{SecretKey, KEY_LEN};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Children per node from the root down (Lethe's setup).
pub const FANOUTS: [u64; 3] = [16, 32, 8];
const HEIGHT: u8 = FANOUTS.len() as u8;
const LABEL: &[u8] = b"oubli/khf/v1";
const STATE_VERSION: u8 = 1;
const RECORD_TREE: u8 = 1;

/// Leaves under a node of height `h`.
fn span(h: u8) -> u64 {
    FANOUTS[(HEIGHT - h) as usize..].iter().product()
}

/// Leaves per tree.
fn tree_span() -> u64 {
    span(HEIGHT)
}

struct Root {
    height: u8,
    key: SecretKey,
}

#[derive(Default)]
struct Forest {
    roots: BTreeMap<u64, Root>,
    /// Every leaf below has been handed out (or skipped); none is again.
    next_leaf: u64,
    /// End of the tree this session allocates from (0: none started yet).
    session_end: u64,
    /// Detached allocations, and trees started since the last flush that
    /// logged them: `(start, key)`.
    pending: Pending<(u64, SecretKey)>,
}

/// The keyed hash forest scheme (issue 11).
pub struct KeyedHashForest {
    provider: Arc<dyn CryptoProvider>,
    forest: Mutex<Forest>,
}

impl KeyedHashForest {
    /// An empty forest (a new store).
    pub fn new(provider: Arc<dyn CryptoProvider>) -> Self {
        KeyedHashForest {
            provider,
            forest: Mutex::new(Forest::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Forest> {
        self.forest.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn child_key(&self, parent: &SecretKey, height: u8, start: u64) -> SecretKey {
        let mut context = [0u8; 9];
        context[0] = height;
        context[1..].copy_from_slice(&start.to_le_bytes());
        self.provider.derive(parent, LABEL, &context)
    }

    fn derive_leaf(&self, f: &Forest, leaf: u64) -> Result<SecretKey, SchemeError> {
        let revoked = || SchemeError(format!("key of forest leaf {leaf} is revoked"));
        let (&start, root) = f.roots.range(..=leaf).next_back().ok_or_else(revoked)?;
        if leaf - start >= span(root.height) {
            return Err(revoked());
        }
        let (mut start, mut height, mut key) = (start, root.height, root.key.clone());
        while height > 0 {
            let child = span(height - 1);
            start += (leaf - start) / child * child;
            height -= 1;
            key = self.child_key(&key, height, start);
        }
        Ok(key)
    }

    /// Replaces the subtree `(start, height, key)` by the minimal set of
    /// subtrees covering its needed leaves: those in `needed` (sorted) and
    /// every leaf at or above `frontier` (not handed out yet).
    fn prune(
        &self,
        start: u64,
        height: u8,
        key: SecretKey,
        needed: &[u64],
        frontier: u64,
        out: &mut Vec<(u64, Root)>,
    ) {
        let end = start + span(height);
        let below = end.min(frontier).max(start);
        let lo = needed.partition_point(|&l| l < start);
        let hi = needed.partition_point(|&l| l < below);
        let count = (hi - lo) as u64;
        if count == 0 && below == end {
            return; // nothing needed: the subtree goes
        }
        if count == below - start {
            out.push((start, Root { height, key })); // all needed: kept whole
            return;
        }
        let child = span(height - 1);
        for c in 0..FANOUTS[(HEIGHT - height) as usize] {
            let s = start + c * child;
            let k = self.child_key(&key, height - 1, s);
            self.prune(s, height - 1, k, &needed[lo..], frontier, out);
        }
    }

    /// The next leaf and its key, with `f` locked.
    fn allocate_in(&self, f: &mut Forest, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        if f.next_leaf >= f.session_end {
            // A tree of this session's own, under a fresh random key.
            let start = f.next_leaf.div_ceil(tree_span()) * tree_span();
            let key = provider.random_key();
            f.roots.insert(
                start,
                Root {
                    height: HEIGHT,
                    key: key.clone(),
                },
            );
            f.pending.journal.push((start, key));
            f.next_leaf = start;
            f.session_end = start + tree_span();
        }
        let leaf = f.next_leaf;
        f.next_leaf += 1;
        let key = self
            .derive_leaf(f, leaf)
            .expect("the session's tree covers its unallocated leaves");
        (key, index_ref(leaf))
    }

    /// The committed state of a store.
    pub fn decode(provider: Arc<dyn CryptoProvider>, bytes: &[u8]) -> Result<Self, SchemeError> {
        let mut r = Cursor::new(bytes, "keyed hash forest state");
        if r.u8()? != STATE_VERSION {
            return Err(r.bad());
        }
        let next_leaf = r.u64()?;
        let count = r.u64()?;
        let mut roots = BTreeMap::new();
        let mut last_end = 0u64;
        for _ in 0..count {
            let start = r.u64()?;
            let height = r.u8()?;
            let key = r.key()?;
            // Roots are sorted, disjoint and aligned to their span.
            if height > HEIGHT || start % span(height) != 0 || start < last_end {
                return Err(r.bad());
            }
            last_end = start + span(height);
            roots.insert(start, Root { height, key });
        }
        r.end()?;
        Ok(KeyedHashForest {
            provider,
            forest: Mutex::new(Forest {
                roots,
                next_leaf,
                ..Forest::default()
            }),
        })
    }
}

impl KeyScheme for KeyedHashForest {
    fn name(&self) -> &'static str {
        "keyed-hash-forest"
    }
    fn id(&self) -> u8 {
        SCHEME_KEYED_HASH_FOREST
    }
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        self.allocate_in(&mut self.lock(), provider)
    }
    fn allocate_detached(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        // Under one lock: a sweep between the allocation and the marking
        // would revoke the leaf before its cell is placed.
        let mut f = self.lock();
        let (key, key_ref) = self.allocate_in(&mut f, provider);
        f.pending.detach(&key_ref);
        (key, key_ref)
    }
    fn placed(&self, key_ref: &KeyRef) {
        self.lock().pending.place(key_ref);
    }
    fn resolve(&self, key_ref: &KeyRef) -> Result<SecretKey, SchemeError> {
        let leaf = index_of(key_ref)?;
        self.derive_leaf(&self.lock(), leaf)
    }
    fn keeps_keys_outside_tree(&self) -> bool {
        true
    }
    fn sweep(&self, live: &[KeyRef]) -> Result<(), SchemeError> {
        let mut f = self.lock();
        let mut needed = Vec::with_capacity(live.len() + f.pending.unplaced.len());
        for r in live {
            needed.push(index_of(r)?);
        }
        needed.extend(f.pending.unplaced.iter().copied());
        needed.sort_unstable();
        needed.dedup();
        let frontier = f.next_leaf;
        let mut out = Vec::new();
        for (start, root) in std::mem::take(&mut f.roots) {
            self.prune(start, root.height, root.key, &needed, frontier, &mut out);
        }
        f.roots = out.into_iter().collect();
        Ok(())
    }
    fn commit_state(&self) -> Option<Vec<u8>> {
        let mut f = self.lock();
        f.pending.in_state = f.pending.journal.len();
        let mut out = Vec::with_capacity(17 + f.roots.len() * (9 + KEY_LEN));
        out.push(STATE_VERSION);
        out.extend_from_slice(&f.next_leaf.to_le_bytes());
        out.extend_from_slice(&(f.roots.len() as u64).to_le_bytes());
        for (start, root) in &f.roots {
            out.extend_from_slice(&start.to_le_bytes());
            out.push(root.height);
            out.extend_from_slice(root.key.expose());
        }
        Some(out)
    }
    fn journal(&self) -> Vec<Vec<u8>> {
        self.lock()
            .pending
            .journal
            .iter()
            .map(|(start, key)| {
                let mut rec = vec![RECORD_TREE];
                rec.extend_from_slice(&start.to_le_bytes());
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
        let mut r = Cursor::new(record, "keyed hash forest log record");
        if r.u8()? != RECORD_TREE {
            return Err(r.bad());
        }
        let start = r.u64()?;
        let key = r.key()?;
        r.end()?;
        if start % tree_span() != 0 {
            return Err(r.bad());
        }
        let mut f = self.lock();
        // A tree the committed state already has (logged again after a
        // commit) is not restored: its revoked leaves stay revoked.
        if start < f.next_leaf {
            return Ok(());
        }
        f.roots.insert(
            start,
            Root {
                height: HEIGHT,
                key,
            },
        );
        // Its session is over: nothing more is allocated from it, and its
        // leaves that no root reaches go at the next sweep.
        f.next_leaf = start + tree_span();
        Ok(())
    }
    fn stats(&self) -> SchemeStats {
        let f = self.lock();
        SchemeStats {
            state_bytes: 17 + f.roots.len() as u64 * (9 + KEY_LEN as u64),
            key_ref_bytes: INDEX_BYTES as u32,
            roots: Some(f.roots.len() as u64),
            keys: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::RingProvider;

    fn forest() -> (KeyedHashForest, RingProvider) {
        (
            KeyedHashForest::new(Arc::new(RingProvider::new())),
            RingProvider::new(),
        )
    }

    /// The reference model: a leaf's key computed straight from its tree's
    /// root key and the path, without the forest.
    fn model_key(p: &RingProvider, tree_key: &SecretKey, leaf: u64) -> SecretKey {
        let mut key = tree_key.clone();
        let mut start = leaf / tree_span() * tree_span();
        for h in (0..HEIGHT).rev() {
            let child = span(h);
            start += (leaf - start) / child * child;
            let mut ctx = [0u8; 9];
            ctx[0] = h;
            ctx[1..].copy_from_slice(&start.to_le_bytes());
            key = p.derive(&key, LABEL, &ctx);
        }
        key
    }

    #[test]
    fn every_allocated_key_is_distinct_and_matches_the_model() {
        let (f, p) = forest();
        let mut seen = std::collections::HashSet::new();
        let mut refs = Vec::new();
        for _ in 0..(tree_span() + 100) {
            let (k, r) = f.allocate(&p);
            assert!(seen.insert(*k.expose()), "a key was handed out twice");
            assert_eq!(f.resolve(&r).unwrap(), k);
            refs.push((index_of(&r).unwrap(), k));
        }
        let trees = f.journal();
        assert_eq!(trees.len(), 2, "a second tree past the first's span");
        for (leaf, k) in refs.iter().step_by(37) {
            let rec = &trees[(*leaf / tree_span()) as usize];
            let tree_key = SecretKey::from_slice(&rec[9..]).unwrap();
            assert_eq!(&model_key(&p, &tree_key, *leaf), k, "leaf {leaf}");
        }
    }

    #[test]
    fn sweep_revokes_exactly_the_unneeded_leaves_and_state_round_trips() {
        let (f, p) = forest();
        let refs: Vec<_> = (0..1000).map(|_| f.allocate(&p)).collect();
        let live: Vec<KeyRef> = refs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 7 == 3 || (300..700).contains(i))
            .map(|(_, (_, r))| r.clone())
            .collect();
        f.sweep(&live).unwrap();
        let state = f.commit_state().unwrap();
        let g = KeyedHashForest::decode(Arc::new(RingProvider::new()), &state).unwrap();
        for (i, (k, r)) in refs.iter().enumerate() {
            let keep = i % 7 == 3 || (300..700).contains(&i);
            for s in [&f, &g] {
                match s.resolve(r) {
                    Ok(got) => assert!(keep && &got == k, "leaf {i} still derivable"),
                    Err(_) => assert!(!keep, "live leaf {i} was revoked"),
                }
            }
        }
        // Leaves not handed out yet stay derivable: the session goes on.
        let (k, r) = f.allocate(&p);
        assert_eq!(f.resolve(&r).unwrap(), k);
        // Deletion by addition, bounded: one root per run of live leaves
        // at most fanout-1 per level.
        let roots = f.stats().roots.unwrap();
        assert!(roots < 200, "{roots} roots");
    }

    #[test]
    fn a_detached_allocation_survives_a_sweep_until_placed() {
        let (f, p) = forest();
        let (k, r) = f.allocate_detached(&p);
        f.allocate(&p);
        f.sweep(&[]).unwrap();
        assert_eq!(f.resolve(&r).unwrap(), k);
        f.placed(&r);
        f.sweep(&[]).unwrap();
        assert!(f.resolve(&r).is_err());
    }

    #[test]
    fn a_new_session_never_rederives_a_key_of_a_crashed_one() {
        let (f, p) = forest();
        f.allocate(&p);
        let state = f.commit_state().unwrap();
        // Session 1: allocates past the commit, never logs, crashes.
        let s1 = KeyedHashForest::decode(Arc::new(RingProvider::new()), &state).unwrap();
        let lost: Vec<_> = (0..10).map(|_| s1.allocate(&p).0).collect();
        // Session 2 starts again from the same committed state.
        let s2 = KeyedHashForest::decode(Arc::new(RingProvider::new()), &state).unwrap();
        for _ in 0..10 {
            let (k, _) = s2.allocate(&p);
            assert!(!lost.contains(&k), "a key sealed two messages");
        }
    }

    #[test]
    fn replay_restores_a_logged_tree_once() {
        let (f, p) = forest();
        f.allocate(&p);
        let state = f.commit_state().unwrap();
        let s1 = KeyedHashForest::decode(Arc::new(RingProvider::new()), &state).unwrap();
        let (k, r) = s1.allocate(&p);
        let journal = s1.journal();
        assert_eq!(journal.len(), 1);
        let s2 = KeyedHashForest::decode(Arc::new(RingProvider::new()), &state).unwrap();
        assert!(s2.resolve(&r).is_err());
        s2.replay(&journal[0]).unwrap();
        assert_eq!(s2.resolve(&r).unwrap(), k);
        // After a commit that revoked it, a repeated record restores nothing.
        s2.sweep(&[]).unwrap();
        s2.replay(&journal[0]).unwrap();
        assert!(s2.resolve(&r).is_err());
        // New allocations start past the replayed tree.
        let (_, r2) = s2.allocate(&p);
        assert!(index_of(&r2).unwrap() >= 2 * tree_span());
    }
}
