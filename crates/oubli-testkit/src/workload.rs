//! Seeded random workloads of puts, overwrites, truncates, punches, deletes, flushes and commits, run against a store and the model.

use crate::marker::{self, Marker, BLOCK};
use crate::model::Model;
use oubli_core::{Error, Store, ROOT_DIR};
use oubli_media::SplitMix64;
use std::collections::BTreeSet;

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
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub steps: Vec<Step>,
}

impl Workload {
    /// `n` steps over objects of at most `max_size` bytes, with commits about
    /// every `commit_every` steps and flushes more often.
    pub fn generate(seed: u64, n: usize, max_size: u64, commit_every: u64) -> Workload {
        let mut rng = SplitMix64::new(seed);
        let mut steps = vec![Step::Create, Step::Create];
        while steps.len() < n {
            let pick = rng.next_u64() as u32;
            if rng.below(commit_every.max(1)) == 0 {
                steps.push(Step::Commit);
                continue;
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
        }
    }
}

impl Runner {
    fn pick(&self, pick: u32) -> Option<u64> {
        let ids: Vec<u64> = self
            .model
            .objects
            .keys()
            .copied()
            .filter(|&id| id != ROOT_DIR)
            .collect();
        (!ids.is_empty()).then(|| ids[pick as usize % ids.len()])
    }

    /// Runs one step; the model changes only if the store accepted it.
    pub fn step(&mut self, store: &Store, step: &Step) -> Result<(), Error> {
        match step {
            Step::Create => {
                let oid = store.create_object(b"")?;
                self.model.objects.insert(oid, Vec::new());
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
        }
        Ok(())
    }

    /// Records that everything deleted so far is now covered by the guarantee.
    pub fn note_commit(&mut self) {
        let live = self.model.live_markers();
        self.erased = self.written.difference(&live).copied().collect();
        self.commits += 1;
    }
}
