//! Seeded random workloads of puts, overwrites, truncates, punches, deletes, flushes and commits, run against a store and the model.

use crate::marker::{self, Marker, BLOCK};
use crate::model::Model;
use oubli_core::{Error, Store, Vault, ROOT_DIR};
use oubli_crypto::SecretKey;
use oubli_media::SplitMix64;
use oubli_vault::{FlakyVault, MemoryVault};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// One operation. Objects are picked by index among the live ones at run time,
/// so a workload is meaningful whatever ids the store hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Create,
    Write {
        pick: u32,
        off: u64,
        len: u32,
    },
    Truncate {
        pick: u32,
        size: u64,
    },
    Punch {
        pick: u32,
        off: u64,
        len: u64,
    },
    Delete {
        pick: u32,
    },
    Flush,
    Commit,
    /// Run the cleaner (which commits twice).
    Gc,
    /// Take a snapshot of the whole store (flushes).
    SnapshotCreate,
    /// Remove a snapshot, picked among the existing ones (flushes).
    SnapshotRemove {
        pick: u32,
    },
    /// Erase an object from the live store and from every snapshot (flushes).
    Redact {
        pick: u32,
    },
    /// Create a key share in a vault of its own (flushes).
    ShareCreate,
    /// Create an object placed under a share picked among the live ones.
    CreateShared {
        pick: u32,
    },
    /// Destroy a share picked among the live ones (commits).
    ShareDestroy {
        pick: u32,
    },
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub steps: Vec<Step>,
}

impl Workload {
    /// `n` steps over objects of at most `max_size` bytes, with commits about
    /// every `commit_every` steps and flushes more often.
    pub fn generate(seed: u64, n: usize, max_size: u64, commit_every: u64) -> Workload {
        Self::make(seed, n, max_size, commit_every, false, false)
    }

    /// [`generate`](Self::generate) with snapshots taken, removed and
    /// redacted among the other steps (about 8 steps in 100).
    pub fn with_snapshots(seed: u64, n: usize, max_size: u64, commit_every: u64) -> Workload {
        Self::make(seed, n, max_size, commit_every, true, false)
    }

    /// [`with_snapshots`](Self::with_snapshots) with key shares created,
    /// objects placed under them and shares destroyed (about 7 steps in 100).
    pub fn with_shares(seed: u64, n: usize, max_size: u64, commit_every: u64) -> Workload {
        Self::make(seed, n, max_size, commit_every, true, true)
    }

    /// [`generate`](Self::generate) where about one write in three is a
    /// stream from the object's start over half its size or more: objects
    /// get the store's cells, the random writes after split them and the
    /// next stream puts them back whole (DESIGN §3, "Split cells"). The
    /// other steps are those of `generate` with the same seed.
    pub fn with_streams(seed: u64, n: usize, max_size: u64, commit_every: u64) -> Workload {
        let mut workload = Self::make(seed, n, max_size, commit_every, false, false);
        // Its own generator: the steps drawn are those of `generate`.
        let mut rng = SplitMix64::new(seed ^ 0x5354_5245_414d);
        for step in &mut workload.steps {
            if let Step::Write { len, off, .. } = step {
                if rng.below(3) == 0 {
                    *off = 0;
                    *len = (max_size / 2 + rng.below(max_size / 2)) as u32;
                }
            }
        }
        workload
    }

    fn make(
        seed: u64,
        n: usize,
        max_size: u64,
        commit_every: u64,
        snapshots: bool,
        shares: bool,
    ) -> Workload {
        let mut rng = SplitMix64::new(seed);
        let mut steps = vec![Step::Create, Step::Create];
        while steps.len() < n {
            let pick = rng.next_u64() as u32;
            if rng.below(commit_every.max(1)) == 0 {
                steps.push(Step::Commit);
                continue;
            }
            if shares {
                let step = match rng.below(100) {
                    0..=1 => Some(Step::ShareCreate),
                    2..=5 => Some(Step::CreateShared { pick }),
                    6 => Some(Step::ShareDestroy { pick }),
                    _ => None,
                };
                if let Some(step) = step {
                    steps.push(step);
                    continue;
                }
            }
            if snapshots {
                let step = match rng.below(100) {
                    0..=3 => Some(Step::SnapshotCreate),
                    4..=5 => Some(Step::SnapshotRemove { pick }),
                    6..=7 => Some(Step::Redact { pick }),
                    _ => None,
                };
                if let Some(step) = step {
                    steps.push(step);
                    continue;
                }
            }
            let step = match rng.below(100) {
                0..=9 => Step::Create,
                10..=44 => {
                    let len = 1 + rng.below(max_size / 4) as u32;
                    Step::Write {
                        pick,
                        off: rng.below(max_size - len as u64),
                        len,
                    }
                }
                45..=54 => Step::Truncate {
                    pick,
                    size: rng.below(max_size),
                },
                55..=62 => Step::Punch {
                    pick,
                    off: rng.below(max_size),
                    len: rng.below(max_size / 2),
                },
                63..=72 => Step::Delete { pick },
                73..=97 => Step::Flush,
                _ => Step::Gc,
            };
            steps.push(step);
        }
        steps.push(Step::Flush);
        Workload { steps }
    }

    pub fn count(&self, what: fn(&Step) -> bool) -> usize {
        self.steps.iter().filter(|s| what(s)).count()
    }
}

/// A share vault of a workload: in memory, with failures a test can inject
/// (the crash sweep cuts its rotations).
pub type ShareVault = FlakyVault<MemoryVault>;

/// Share vaults by address, shared with the stores' openers.
type ShareVaults = Arc<Mutex<Vec<(String, Arc<ShareVault>)>>>;

/// Runs steps against a store while keeping the model and the two halves of
/// the guarantee: what was acknowledged (by a flush or commit) and which
/// markers were deleted before the last successful commit.
pub struct Runner {
    pub model: Model,
    /// The model as of the last successful flush or commit.
    pub acked: Model,
    /// Every complete marker block ever written.
    pub written: BTreeSet<Marker>,
    /// Markers deleted before the last successful commit: must never be recoverable.
    pub erased: BTreeSet<Marker>,
    pub commits: usize,
    next_write: u64,
    next_snapshot: u64,
    /// Every share created (name, its vault, destroyed?), in id order.
    pub shares: Vec<(String, Arc<ShareVault>, bool)>,
    /// The share vaults the store's opener reaches, by address.
    share_vaults: ShareVaults,
}

impl Default for Runner {
    fn default() -> Self {
        Runner {
            model: Model::default(),
            acked: Model::default(),
            written: BTreeSet::new(),
            erased: BTreeSet::new(),
            commits: 0,
            next_write: 1,
            next_snapshot: 1,
            shares: Vec::new(),
            share_vaults: Arc::default(),
        }
    }
}

impl Runner {
    /// An object picked among the live ones whose data can still change
    /// (not under a destroyed share).
    fn pick(&self, pick: u32) -> Option<u64> {
        let ids: Vec<u64> = self
            .model
            .objects
            .keys()
            .copied()
            .filter(|&id| id != ROOT_DIR && !self.model.destroyed.contains(&id))
            .collect();
        (!ids.is_empty()).then(|| ids[pick as usize % ids.len()])
    }

    /// How a store (re)opened for this workload reaches its share vaults.
    pub fn share_opener(&self) -> Arc<oubli_core::ShareOpener> {
        let vaults = self.share_vaults.clone();
        Arc::new(move |share: &oubli_core::ShareRecord| {
            let vaults = vaults.lock().unwrap_or_else(|p| p.into_inner());
            let (_, vault) = vaults
                .iter()
                .find(|(address, _)| *address == share.vault)
                .ok_or_else(|| format!("no vault at {}", share.vault))?;
            Ok(Box::new(vault.clone()) as Box<dyn Vault>)
        })
    }

    /// What every share vault holds now, as `(share id, key)`: what an
    /// adversary seizing them gets (a destroyed share's is random).
    pub fn share_keys(&self) -> Vec<(u32, SecretKey)> {
        self.shares
            .iter()
            .enumerate()
            .filter_map(|(i, (_, vault, _))| Some((i as u32 + 1, vault.load().ok()?.key)))
            .collect()
    }

    fn live_share(&self, pick: u32) -> Option<usize> {
        let live: Vec<usize> = (0..self.shares.len())
            .filter(|&i| !self.shares[i].2)
            .collect();
        (!live.is_empty()).then(|| live[pick as usize % live.len()])
    }

    /// Runs one step; the model changes only if the store accepted it.
    pub fn step(&mut self, store: &Store, step: &Step) -> Result<(), Error> {
        match step {
            Step::Create => {
                let oid = store.create_object(b"")?;
                self.model.objects.insert(oid, Vec::new());
                // The workload's writes land anywhere, which gives a new
                // object small cells (its first write is past its start):
                // every other object is started with a byte at 0 instead,
                // so it keeps the store's cells and both kinds live side
                // by side.
                if oid % 2 == 1 {
                    store.write(oid, 0, &[0])?;
                    self.model.write(oid, 0, &[0]);
                }
            }
            Step::Write { pick, off, len } => {
                let Some(oid) = self.pick(*pick) else {
                    return Ok(());
                };
                let id = self.next_write;
                self.next_write += 1;
                let data = marker::data(id, *len as usize);
                store.write(oid, *off, &data)?;
                self.model.write(oid, *off, &data);
                for b in 0..(*len as usize / BLOCK) as u32 {
                    self.written.insert((id, b));
                }
            }
            Step::Truncate { pick, size } => {
                let Some(oid) = self.pick(*pick) else {
                    return Ok(());
                };
                store.truncate(oid, *size)?;
                self.model.truncate(oid, *size);
            }
            Step::Punch { pick, off, len } => {
                let Some(oid) = self.pick(*pick) else {
                    return Ok(());
                };
                store.punch_hole(oid, *off, *len)?;
                self.model.punch(oid, *off, *len);
            }
            Step::Delete { pick } => {
                let Some(oid) = self.pick(*pick) else {
                    return Ok(());
                };
                store.delete(oid)?;
                self.model.objects.remove(&oid);
            }
            Step::Flush => {
                store.flush()?;
                self.acked = self.model.clone();
            }
            Step::Commit => {
                store.commit()?;
                self.acked = self.model.clone();
                self.note_commit();
            }
            Step::Gc => {
                store.gc(0.5)?;
                self.acked = self.model.clone();
                self.note_commit();
            }
            Step::SnapshotCreate => {
                let name = format!("s{}", self.next_snapshot);
                self.next_snapshot += 1;
                // In the model first: the call ends with a flush, and a cut
                // there leaves either the acknowledged state or this one.
                let copy = self.model.objects.clone();
                self.model.snapshots.insert(name.clone(), copy);
                store.snapshot_create(&name, None)?;
                self.acked = self.model.clone();
            }
            Step::SnapshotRemove { pick } => {
                let names: Vec<String> = self.model.snapshots.keys().cloned().collect();
                if names.is_empty() {
                    return Ok(());
                }
                let name = &names[*pick as usize % names.len()];
                self.model.snapshots.remove(name);
                store.snapshot_remove(name)?;
                self.acked = self.model.clone();
            }
            Step::ShareCreate => {
                let name = format!("t{}", self.shares.len() + 1);
                let address = format!("mem:{name}");
                let vault = Arc::new(FlakyVault::new(MemoryVault::empty()));
                let v = vault.clone();
                // Reachable before the store records it: a cut in the
                // flush may leave the share recorded.
                self.share_vaults
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((address.clone(), vault.clone()));
                store.set_share_opener(self.share_opener());
                store.share_create(&name, &address, move |record| {
                    v.store(record)?;
                    Ok(v)
                })?;
                self.shares.push((name, vault, false));
                self.acked = self.model.clone();
            }
            Step::CreateShared { pick } => {
                let Some(share) = self.live_share(*pick) else {
                    return Ok(());
                };
                let oid = store.create_object(b"")?;
                self.model.objects.insert(oid, Vec::new());
                store.set_share(oid, &self.shares[share].0)?;
                self.model.share_of.insert(oid, share);
            }
            Step::ShareDestroy { pick } => {
                let Some(share) = self.live_share(*pick) else {
                    return Ok(());
                };
                // The share vault's key goes first, and for good: whatever
                // the store's commit does, the data is gone (acknowledged).
                let doomed: Vec<u64> = self
                    .model
                    .share_of
                    .iter()
                    .filter(|(_, s)| **s == share)
                    .map(|(oid, _)| *oid)
                    .collect();
                self.model.destroyed.extend(&doomed);
                self.acked.destroyed.extend(&doomed);
                self.shares[share].2 = true;
                let (name, vault) = (self.shares[share].0.clone(), self.shares[share].1.clone());
                store.share_destroy(&name, &*vault)?;
                self.acked = self.model.clone();
                self.note_commit();
            }
            Step::Redact { pick } => {
                let Some(oid) = self.pick(*pick) else {
                    return Ok(());
                };
                // Each change enters the model once the store took it, so
                // that a cut in the final flush finds the in-flight state.
                store.delete(oid)?;
                self.model.objects.remove(&oid);
                for objects in self.model.snapshots.values_mut() {
                    objects.remove(&oid);
                }
                store.redact_snapshots(&[oid])?;
                store.flush()?;
                self.acked = self.model.clone();
            }
        }
        Ok(())
    }

    /// The marker blocks the store holds (live or in a snapshot) that some
    /// write put down whole: what the adversary must open. A scan of the
    /// model alone can also find a write's partial last block completed by
    /// the bytes after it (the zeros of a hole, when the block's last check
    /// bytes are zero: simulator seed 200536), which no write ever stored
    /// whole and which the adversary, who sees the stored bytes, need not
    /// find.
    pub fn live_markers(&self) -> BTreeSet<Marker> {
        self.model
            .live_markers()
            .intersection(&self.written)
            .copied()
            .collect()
    }

    /// Records that everything deleted so far is now covered by the guarantee.
    pub fn note_commit(&mut self) {
        let live = self.model.live_markers();
        self.erased = self.written.difference(&live).copied().collect();
        self.commits += 1;
    }
}
