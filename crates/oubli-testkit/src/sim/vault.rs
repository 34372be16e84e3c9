//! The one seam for every vault write of a simulation (the main vault and each share vault): the seed's failures, cuts and garbage through `FlakyVault`, slow calls and hangs on the simulated clock, plus the history the adversary's control needs.

use super::media::{SimClock, VAULT_CALL};
use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_vault::{FlakyVault, MemoryVault};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the seed can make a vault do on its next use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VaultFault {
    /// The next store fails and changes nothing.
    FailStore,
    /// The next store lands, then reports failure (the answer was lost).
    FailAfterWrite,
    /// The next store is cut between its two steps: the new record is in,
    /// the old one still readable.
    CutBetweenSteps,
    /// A cut between the steps, and the old record cannot be destroyed
    /// until the fault is cleared.
    CutAndEraseFails,
    /// The next load returns a record with a flipped bit.
    Garbage,
}

/// Every vault of a simulation is one of these, whatever it stands for:
/// a new kind of vault is covered by the same faults without new code.
pub struct SimVault {
    inner: FlakyVault<MemoryVault>,
    history: Mutex<Vec<VaultRecord>>,
    /// Mutation check only: every record ever stored stays readable and
    /// `erase_leftovers` destroys nothing (a vault whose wipe was dropped).
    pub keep_records: AtomicBool,
    kept: Mutex<Vec<VaultRecord>>,
    clock: Arc<SimClock>,
    /// What the next call costs on the clock (nanoseconds; 0: an ordinary call).
    delay: AtomicU64,
}

impl SimVault {
    pub fn empty() -> SimVault {
        SimVault::on(Arc::default())
    }

    /// An empty vault whose calls advance `clock`.
    pub fn on(clock: Arc<SimClock>) -> SimVault {
        SimVault {
            inner: FlakyVault::new(MemoryVault::empty()),
            history: Mutex::default(),
            keep_records: AtomicBool::new(false),
            kept: Mutex::default(),
            clock,
            delay: AtomicU64::new(0),
        }
    }

    /// The next call (whatever it is and however it ends) takes `took` of
    /// simulated time: a slow call, or a hang before an armed fault.
    /// `Duration::ZERO` clears it.
    pub fn delay_next(&self, took: Duration) {
        self.delay.store(took.as_nanos() as u64, Ordering::SeqCst);
    }

    fn tick(&self) {
        let delay = self.delay.swap(0, Ordering::SeqCst);
        self.clock.advance(if delay > 0 {
            Duration::from_nanos(delay)
        } else {
            VAULT_CALL
        });
    }

    /// Arms `fault` for the vault's next use.
    pub fn arm(&self, fault: VaultFault) {
        match fault {
            VaultFault::FailStore => self.inner.fail_next_stores(1),
            VaultFault::FailAfterWrite => self.inner.fail_after_write_next_store(),
            VaultFault::CutBetweenSteps => self.inner.cut_between_steps_next_store(),
            VaultFault::CutAndEraseFails => {
                self.inner.cut_between_steps_next_store();
                self.inner.fail_erase(true);
            }
            VaultFault::Garbage => self.inner.garbage_on_next_load(),
        }
    }

    /// Clears every armed fault that has not fired (the erase works again).
    pub fn heal(&self) {
        self.inner.fail_next_stores(0);
        self.inner.fail_erase(false);
        // "Fail after write", "cut" and "garbage" stay armed until a store
        // or load spends them: the simulator arms them only before a step
        // that uses the vault.
    }

    /// Every record this vault was ever given (the control adversary's unfair advantage).
    pub fn history(&self) -> Vec<VaultRecord> {
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Vault for SimVault {
    fn info(&self) -> VaultInfo {
        self.inner.info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        super::sched::point("vault load");
        self.tick();
        self.inner.load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        super::sched::point("vault store");
        self.tick();
        if self.keep_records.load(Ordering::SeqCst) {
            if let Ok(old) = self.inner.inner().load() {
                self.kept
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(old);
            }
        }
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record.clone());
        self.inner.store(record)
    }
    fn write_count(&self) -> Result<u64, VaultError> {
        self.inner.write_count()
    }
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        let mut records = self.inner.readable_records()?;
        records.extend(self.kept.lock().unwrap_or_else(|p| p.into_inner()).clone());
        Ok(records)
    }
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        super::sched::point("vault erase");
        self.tick();
        self.inner.erase_leftovers()
    }
}
