//! Key schemes: where a unit's key comes from and what its parent pointer stores.

use crate::provider::CryptoProvider;
use crate::secret::{SecretKey, KEY_LEN};
use zeroize::{Zeroize, ZeroizeOnDrop};

mod khf;
mod ksa;
pub use khf::{KeyedHashForest, FANOUTS};
pub use ksa::{KeyStorageArea, BLOCK_KEYS};

/// Bytes of key reference an index scheme (forest leaf, KSA position)
/// needs; the rest of the 32-byte slot is zero.
pub(crate) const INDEX_BYTES: usize = 8;

/// The index a reference of an index scheme holds.
pub(crate) fn index_of(key_ref: &KeyRef) -> Result<u64, SchemeError> {
    let (index, rest) = key_ref.0.split_at(INDEX_BYTES);
    if rest.iter().any(|&b| b != 0) {
        return Err(SchemeError("not an index key reference".into()));
    }
    Ok(u64::from_le_bytes(index.try_into().expect("8 bytes")))
}

/// The reference an index scheme stores for `index`.
pub(crate) fn index_ref(index: u64) -> KeyRef {
    let mut bytes = [0u8; KEY_REF_LEN];
    bytes[..INDEX_BYTES].copy_from_slice(&index.to_le_bytes());
    KeyRef(bytes)
}

/// What an index scheme keeps between commits besides its state: detached
/// allocations not yet placed (a sweep keeps them) and journal records not
/// yet logged.
pub(crate) struct Pending<R> {
    pub(crate) unplaced: std::collections::BTreeSet<u64>,
    pub(crate) journal: Vec<R>,
    /// Records at the front of `journal` that the last `commit_state` holds.
    pub(crate) in_state: usize,
}

impl<R> Default for Pending<R> {
    fn default() -> Self {
        Pending {
            unplaced: Default::default(),
            journal: Vec::new(),
            in_state: 0,
        }
    }
}

impl<R> Pending<R> {
    pub(crate) fn detach(&mut self, key_ref: &KeyRef) {
        self.unplaced
            .insert(index_of(key_ref).expect("the scheme's own reference"));
    }
    pub(crate) fn place(&mut self, key_ref: &KeyRef) {
        if let Ok(index) = index_of(key_ref) {
            self.unplaced.remove(&index);
        }
    }
    pub(crate) fn logged(&mut self, count: usize) {
        let n = count.min(self.journal.len());
        self.journal.drain(..n);
        self.in_state = self.in_state.saturating_sub(n);
    }
    /// The committed state holds the records up to `in_state`.
    pub(crate) fn committed(&mut self) {
        let n = std::mem::take(&mut self.in_state).min(self.journal.len());
        self.journal.drain(..n);
    }
}

/// Reads a scheme's state or log record front to back.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Cursor { bytes, at: 0, what }
    }
    pub(crate) fn bad(&self) -> SchemeError {
        SchemeError(format!("{} is malformed", self.what))
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], SchemeError> {
        let piece = self
            .bytes
            .get(self.at..self.at + n)
            .ok_or_else(|| self.bad())?;
        self.at += n;
        Ok(piece)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, SchemeError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u64(&mut self) -> Result<u64, SchemeError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn key(&mut self) -> Result<SecretKey, SchemeError> {
        let bytes = self.take(KEY_LEN)?;
        SecretKey::from_slice(bytes).ok_or_else(|| self.bad())
    }
    /// Everything was read.
    pub(crate) fn end(&self) -> Result<(), SchemeError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(self.bad())
        }
    }
}

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

/// Scheme ids as the superblock records them.
pub const SCHEME_PARENT_POINTER: u8 = 0;
pub const SCHEME_KEYED_HASH_FOREST: u8 = 1;
pub const SCHEME_KEY_STORAGE_AREA: u8 = 2;

/// A key reference the scheme cannot turn into a key (revoked, malformed,
/// or state that cannot be read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemeError(pub String);

impl std::fmt::Display for SchemeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SchemeError {}

/// What `status` shows about a scheme's own state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchemeStats {
    /// Bytes of the scheme's committed state (0 when every key is in the tree).
    pub state_bytes: u64,
    /// Bytes of key reference each unit's parent needs (the rest of the
    /// 32-byte slot is zero).
    pub key_ref_bytes: u32,
    /// Roots of a keyed hash forest (its fragmentation).
    pub roots: Option<u64>,
    /// Keys held in a key storage area (its used positions).
    pub keys: Option<u64>,
}

/// Where unit keys come from.
///
/// The engine asks the scheme for a key whenever it writes a unit, stores the
/// returned [`KeyRef`] in the unit's parent and resolves it when reading.
///
/// A scheme whose keys live outside the tree ([`keeps_keys_outside_tree`](Self::keeps_keys_outside_tree))
/// is also told, at every commit, which references some retained root still
/// reaches ([`sweep`](Self::sweep)): every other key it can still produce
/// must become underivable from the state it then hands over
/// ([`commit_state`](Self::commit_state)), which the engine seals under the
/// new epoch's key. Keys it creates between commits that a crash must not
/// lose go to the intent log ([`journal`](Self::journal), replayed by
/// [`replay`](Self::replay)).
pub trait KeyScheme: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// The id the superblock records.
    fn id(&self) -> u8;
    /// A key for a new unit and the reference its parent will store.
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef);
    /// [`allocate`](Self::allocate) for a unit sealed outside the engine
    /// lock: until [`placed`](Self::placed), a commit's sweep keeps its key.
    fn allocate_detached(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        self.allocate(provider)
    }
    /// `n` [`allocate_detached`](Self::allocate_detached) calls at once (the
    /// whole cells of one write): a scheme may draw their randomness in one go.
    fn allocate_detached_many(
        &self,
        provider: &dyn CryptoProvider,
        n: usize,
    ) -> Vec<(SecretKey, KeyRef)> {
        (0..n).map(|_| self.allocate_detached(provider)).collect()
    }
    /// The unit of a detached allocation is in the tree (or never will be).
    fn placed(&self, _key_ref: &KeyRef) {}
    /// The key a stored reference stands for.
    fn resolve(&self, key_ref: &KeyRef) -> Result<SecretKey, SchemeError>;
    /// False when dropping the parent pointer drops the only copy of the key.
    fn keeps_keys_outside_tree(&self) -> bool {
        false
    }
    /// Every reference in `live` is reached by a retained root; make every
    /// other key allocated so far underivable (from the next committed state).
    fn sweep(&self, _live: &[KeyRef]) -> Result<(), SchemeError> {
        Ok(())
    }
    /// The state to commit with the next epoch (`None`: the scheme has none).
    fn commit_state(&self) -> Option<Vec<u8>> {
        None
    }
    /// Records the next flush must log before the ops that need them.
    fn journal(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// The first `count` records of [`journal`](Self::journal) are durable.
    fn journal_logged(&self, _count: usize) {}
    /// The state last returned by [`commit_state`](Self::commit_state) is
    /// committed: the journal records it already holds need no logging.
    fn committed(&self) {}
    /// Re-applies one journal record during log replay.
    fn replay(&self, _record: &[u8]) -> Result<(), SchemeError> {
        Err(SchemeError("this key scheme logs no records".into()))
    }
    fn stats(&self) -> SchemeStats {
        SchemeStats {
            state_bytes: 0,
            key_ref_bytes: KEY_REF_LEN as u32,
            roots: None,
            keys: None,
        }
    }
}

/// The scheme a superblock names, with the state it committed.
pub fn load_scheme(
    id: u8,
    state: Option<&[u8]>,
    provider: std::sync::Arc<dyn CryptoProvider>,
) -> Result<std::sync::Arc<dyn KeyScheme>, SchemeError> {
    match (id, state) {
        (SCHEME_PARENT_POINTER, None) => Ok(std::sync::Arc::new(ParentPointerScheme)),
        (SCHEME_KEYED_HASH_FOREST, state) => Ok(std::sync::Arc::new(match state {
            Some(bytes) => KeyedHashForest::decode(provider, bytes)?,
            None => KeyedHashForest::new(provider),
        })),
        (SCHEME_KEY_STORAGE_AREA, state) => Ok(std::sync::Arc::new(match state {
            Some(bytes) => KeyStorageArea::decode(bytes)?,
            None => KeyStorageArea::default(),
        })),
        (id, _) => Err(SchemeError(format!("unknown key scheme {id}"))),
    }
}

/// A scheme id's name (`None`: unknown).
pub fn scheme_name(id: u8) -> Option<&'static str> {
    SCHEME_NAMES
        .iter()
        .find(|(_, i)| *i == id)
        .map(|(name, _)| *name)
}

/// The names `oubli init --key-scheme` takes, by id.
pub const SCHEME_NAMES: [(&str, u8); 3] = [
    ("parent-pointer", SCHEME_PARENT_POINTER),
    ("keyed-hash-forest", SCHEME_KEYED_HASH_FOREST),
    ("key-storage-area", SCHEME_KEY_STORAGE_AREA),
];

/// The default scheme: each unit gets a fresh random key, kept only in its
/// parent pointer (ERASER's file key tree, extended to every unit).
#[derive(Default, Clone, Copy)]
pub struct ParentPointerScheme;

impl KeyScheme for ParentPointerScheme {
    fn name(&self) -> &'static str {
        "parent-pointer"
    }
    fn id(&self) -> u8 {
        SCHEME_PARENT_POINTER
    }
    fn allocate(&self, provider: &dyn CryptoProvider) -> (SecretKey, KeyRef) {
        let key = provider.random_key();
        let key_ref = KeyRef(*key.expose());
        (key, key_ref)
    }
    /// One draw from the RNG for all `n` keys: one system call for the 256
    /// cells of a 1 MiB write instead of 256.
    fn allocate_detached_many(
        &self,
        provider: &dyn CryptoProvider,
        n: usize,
    ) -> Vec<(SecretKey, KeyRef)> {
        let mut draw = zeroize::Zeroizing::new(vec![0u8; n * KEY_LEN]);
        provider.fill_random(&mut draw);
        draw.chunks_exact(KEY_LEN)
            .map(|bytes| {
                let bytes: [u8; KEY_LEN] = bytes.try_into().expect("KEY_LEN bytes");
                (SecretKey::from_bytes(bytes), KeyRef(bytes))
            })
            .collect()
    }
    fn resolve(&self, key_ref: &KeyRef) -> Result<SecretKey, SchemeError> {
        let bytes: [u8; KEY_LEN] = key_ref.0;
        Ok(SecretKey::from_bytes(bytes))
    }
}
