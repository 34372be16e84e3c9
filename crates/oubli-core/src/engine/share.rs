//! Key shares in the engine: create (the key goes to its own vault), open lazily, place an object under one, destroy; and the cell keys that depend on them.

use super::*;
use crate::share::{bind, check_name, ShareRecord};
use crate::tree::KIND_SHARE;

/// The epoch field of the record a destroyed share's vault holds: its key
/// is random and the record says so, so that a share destroyed in its vault
/// reads as destroyed even if the store never recorded it (a crash between
/// the two).
pub const SHARE_DESTROYED: u64 = u64::MAX;

/// Opens a share's vault (the front-end knows how to reach a vault address
/// and which password to use). The engine loads its record, checks that it
/// belongs to this store and share, and erases every older record the
/// vault still holds (a rotation or a destruction cut between its steps).
pub type ShareOpener =
    dyn Fn(&ShareRecord) -> std::result::Result<Box<dyn Vault>, String> + Send + Sync;

/// A share vault that still holds a record older than its current one and
/// could not destroy it: after a destruction cut between its two steps,
/// the share's key, which opens everything placed under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareLeftover {
    pub name: String,
    pub vault: String,
    /// Why the vault could not destroy it (retried at every open of the
    /// share's vault and by `share_destroy`).
    pub why: String,
}

/// A share as `oubli share ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareInfo {
    pub id: u32,
    pub name: String,
    pub vault: String,
    pub created_at: u64,
    pub destroyed_at: Option<u64>,
    /// Whether its key is open in this process.
    pub open: bool,
}

impl Store {
    /// Creates share `name`: a fresh random key, handed to `make_vault`
    /// (which must create the vault at `vault_address` holding it) and kept
    /// nowhere else. Durable when this returns.
    pub fn share_create<V, F>(
        &self,
        name: &str,
        vault_address: &str,
        make_vault: F,
    ) -> Result<ShareInfo>
    where
        V: Vault + 'static,
        F: FnOnce(&VaultRecord) -> Result<V>,
    {
        check_name(name).map_err(Error::Invalid)?;
        let mut e = self.lock();
        e.mutable()?;
        if e.shares.values().any(|s| s.name == name) {
            return Err(Error::Exists(format!("share {name}")));
        }
        let id = e.shares.keys().next_back().map_or(1, |last| last + 1);
        let record = VaultRecord {
            store_id: e.store_id,
            epoch: id as u64,
            key: e.ctx.provider.random_key(),
        };
        make_vault(&record)?;
        let share = ShareRecord {
            id,
            name: name.to_string(),
            vault: vault_address.to_string(),
            created_at: now_secs(),
            destroyed_at: None,
        };
        e.share_keys.borrow_mut().insert(id, record.key.clone());
        if let Err(err) = e.apply_durably(Op::PutShare {
            share: share.clone(),
        }) {
            // Not recorded: the vault made above holds a key of no share.
            if !e.shares.contains_key(&id) {
                e.share_keys.borrow_mut().remove(&id);
            }
            return Err(err);
        }
        Ok(e.share_info(&share))
    }

    /// Every share, in id order (destroyed ones included).
    pub fn shares(&self) -> Vec<ShareInfo> {
        let e = self.lock();
        e.shares.values().map(|s| e.share_info(s)).collect()
    }

    /// How the engine opens a share's vault the first time data under it
    /// is read or written (until then, and when it fails, that data gives
    /// [`Error::ShareUnavailable`]; everything else works).
    pub fn set_share_opener(&self, opener: Arc<ShareOpener>) {
        self.lock().share_opener = Some(opener);
    }

    /// Places the empty object `oid` under share `name`: every cell written
    /// to it from now on depends on the share's key too. Data written
    /// before cannot be placed (its cells were sealed without it).
    pub fn set_share(&self, oid: u64, name: &str) -> Result<()> {
        let mut e = self.lock();
        e.mutable()?;
        e.record(oid)?;
        let share = e.share_named(name)?;
        e.share_key(share)?;
        let has_data = !e
            .keys_in(cell_key(oid, 0), Key::new(oid, KIND_CELL + 1, 0))?
            .is_empty()
            || e.dirty.range((oid, 0)..(oid + 1, 0)).next().is_some();
        if has_data {
            return Err(Error::Invalid(format!(
                "object {oid} already holds data: only an empty object can be placed under share {name} (its existing cells were sealed without it)"
            )));
        }
        e.apply(Op::SetShare { oid, share }, true)
    }

    /// The share object `oid` is placed under, by name.
    pub fn share_of(&self, oid: u64) -> Result<Option<String>> {
        let e = self.lock();
        Ok(match e.tree.get(&Key::new(oid, KIND_SHARE, 0), &e.ctx)? {
            Some(Value::Share(id)) => e.shares.get(&id).map(|s| s.name.clone()),
            _ => None,
        })
    }

    /// Destroys share `name`: its key in `vault` is replaced by a random
    /// one and the old record erased (the vault's own overwrite), then the
    /// store records the destruction and commits. Everything ever written
    /// under the share is unrecoverable from then on — in the live store,
    /// every snapshot and every old copy of the medium.
    ///
    /// Idempotent: a destruction cut after the vault took the random key
    /// (before the old record was erased, or before the store recorded
    /// it) is finished by calling this again. Until the old record is
    /// erased, it fails and [`Store::share_leftovers`] lists the share.
    pub fn share_destroy(&self, name: &str, vault: &dyn Vault) -> Result<()> {
        let mut e = self.lock();
        e.mutable()?;
        let id = e.share_named(name)?;
        // Buffered data under the share is sealed with its key while it
        // exists (the commit below could not seal it afterwards).
        e.write_out_all()?;
        let current = vault.load()?;
        let already = current.epoch == SHARE_DESTROYED;
        if current.store_id != e.store_id || !(current.epoch == id as u64 || already) {
            return Err(Error::Invalid(format!(
                "the vault at {} does not hold share {name} of this store",
                e.shares[&id].vault
            )));
        }
        if !already {
            let stored = vault.store(&VaultRecord {
                store_id: e.store_id,
                epoch: SHARE_DESTROYED,
                key: e.ctx.provider.random_key(),
            });
            if let Err(err) = stored {
                // Cut between its two steps (the random key in, the old
                // record not erased): finished below. Else nothing changed.
                match vault.load() {
                    Ok(now) if now.store_id == e.store_id && now.epoch == SHARE_DESTROYED => {}
                    _ => return Err(err.into()),
                }
            }
        }
        // The old record goes for good before the store says so: a retry
        // after a failure here finds the random key and comes back here.
        e.erase_share_leftovers(id, vault)?;
        e.share_keys.borrow_mut().remove(&id);
        let mut share = e.shares[&id].clone();
        share.destroyed_at = Some(now_secs());
        e.apply(Op::PutShare { share }, true)?;
        // Past the vault's wipe the share is gone, whatever the commit
        // does: a full medium only delays recording it (DESIGN §7).
        e.commit().map_err(|err| match err {
            Error::NoSpace(why) => Error::NoSpace(format!(
                "share {name} is destroyed (its vault no longer holds its key), \
                 but the commit that records it found no room: {why}"
            )),
            other => other,
        })
    }
}

impl Store {
    /// Opens the vault of every share the store has not recorded as
    /// destroyed (through the opener, as data under it would), which
    /// erases the older records it holds, and returns the shares whose
    /// vault still holds one it could not destroy — those seen by this
    /// process, these included. A vault that cannot be reached is left
    /// out (its data reports it when used).
    pub fn share_leftovers(&self) -> Vec<ShareLeftover> {
        let e = self.lock();
        let live: Vec<ShareRecord> = e
            .shares
            .values()
            .filter(|s| s.destroyed_at.is_none())
            .cloned()
            .collect();
        for share in &live {
            let _ = e.open_share_vault(share);
        }
        e.known_share_leftovers()
    }
}

impl Engine {
    /// The share leftovers this process has seen and not erased since.
    pub(super) fn known_share_leftovers(&self) -> Vec<ShareLeftover> {
        self.share_leftovers
            .borrow()
            .iter()
            .filter_map(|(id, why)| {
                let s = self.shares.get(id)?;
                Some(ShareLeftover {
                    name: s.name.clone(),
                    vault: s.vault.clone(),
                    why: why.clone(),
                })
            })
            .collect()
    }

    /// Opens share `share`'s vault through the opener and returns its
    /// current record, after erasing every older one it holds (step 1 of
    /// the store's open, for a share vault). A failure to erase is noted
    /// for `status` and `audit`; the record is still returned.
    fn open_share_vault(&self, share: &ShareRecord) -> std::result::Result<VaultRecord, String> {
        let opener = self
            .share_opener
            .as_ref()
            .ok_or_else(|| "its vault has not been opened in this process".to_string())?;
        let vault = opener(share)?;
        let record = vault.load().map_err(|e| e.to_string())?;
        let _ = self.erase_share_leftovers(share.id, &*vault);
        Ok(record)
    }

    /// Destroys every record `vault` (share `id`'s) holds besides the current one.
    fn erase_share_leftovers(&self, id: u32, vault: &dyn Vault) -> Result<()> {
        match vault.erase_leftovers() {
            Ok(()) => {
                self.share_leftovers.borrow_mut().remove(&id);
                Ok(())
            }
            Err(e) => {
                self.share_leftovers.borrow_mut().insert(id, e.to_string());
                Err(Error::Vault(e))
            }
        }
    }

    fn share_info(&self, s: &ShareRecord) -> ShareInfo {
        ShareInfo {
            id: s.id,
            name: s.name.clone(),
            vault: s.vault.clone(),
            created_at: s.created_at,
            destroyed_at: s.destroyed_at,
            open: self.share_keys.borrow().contains_key(&s.id),
        }
    }

    /// The id of the live (not destroyed) share `name`.
    fn share_named(&self, name: &str) -> Result<u32> {
        self.shares
            .values()
            .find(|s| s.name == name && s.destroyed_at.is_none())
            .map(|s| s.id)
            .ok_or_else(|| Error::NoShare(name.to_string()))
    }

    /// The key of share `id`, opening its vault the first time.
    pub(super) fn share_key(&self, id: u32) -> Result<SecretKey> {
        let share = self.shares.get(&id).ok_or_else(|| {
            Error::Corrupt(format!(
                "an object names share {id}, which the catalog does not list"
            ))
        })?;
        if share.destroyed_at.is_some() {
            return Err(Error::ShareDestroyed(share.name.clone()));
        }
        if let Some(key) = self.share_keys.borrow().get(&id) {
            return Ok(key.clone());
        }
        let unavailable = |why: String| Error::ShareUnavailable {
            name: share.name.clone(),
            vault: share.vault.clone(),
            why,
        };
        let record = self.open_share_vault(share).map_err(unavailable)?;
        if record.store_id == self.store_id && record.epoch == SHARE_DESTROYED {
            return Err(Error::ShareDestroyed(share.name.clone()));
        }
        if record.store_id != self.store_id || record.epoch != id as u64 {
            return Err(unavailable(
                "that vault holds another share or store's key".into(),
            ));
        }
        self.share_keys.borrow_mut().insert(id, record.key.clone());
        Ok(record.key)
    }

    /// The share key cells of `oid` in `tree` depend on, if any.
    pub(super) fn share_key_in(&self, tree: &Tree, oid: u64) -> Result<Option<SecretKey>> {
        match self.share_id_in(tree, oid)? {
            Some(id) => self.share_key(id).map(Some),
            None => Ok(None),
        }
    }

    /// The share `oid` is placed under in `tree`, if any.
    pub(super) fn share_id_in(&self, tree: &Tree, oid: u64) -> Result<Option<u32>> {
        if self.shares.is_empty() {
            return Ok(None);
        }
        match tree.get(&Key::new(oid, KIND_SHARE, 0), &self.ctx)? {
            Some(Value::Share(id)) => Ok(Some(id)),
            _ => Ok(None),
        }
    }

    /// A cell's AEAD key from its key-tree key and its object's share key.
    pub(super) fn bind_share(&self, share: Option<&SecretKey>, key: SecretKey) -> SecretKey {
        match share {
            Some(s) => bind(&*self.ctx.provider, s, &key),
            None => key,
        }
    }

    /// Applies a share op (from a front-end call or the intent log).
    pub(super) fn apply_share_op(&mut self, op: &Op) -> Result<()> {
        match op {
            Op::PutShare { share } => {
                if share.destroyed_at.is_some() {
                    self.share_keys.borrow_mut().remove(&share.id);
                }
                self.shares.insert(share.id, share.clone());
            }
            Op::SetShare { oid, share } => {
                self.tree_insert(Key::new(*oid, KIND_SHARE, 0), Value::Share(*share))?;
            }
            _ => unreachable!("not a share op"),
        }
        Ok(())
    }
}
