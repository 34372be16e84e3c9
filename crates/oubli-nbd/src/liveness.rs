//! Per-export liveness: TRIMs received and, with `--infer-deletes ext4`, the ext4 + jbd2 tracker (oubli-ext4) fed every write, whose inferred frees are dropped exactly as a TRIM would (`punch_holes`, one call per observation).
//!
//! Ordering (docs/NBD.md, "Implicit deletes"): a write is shown to the
//! tracker, and the ranges its observation frees are punched, under the
//! tracker's lock *before* the write reaches the store. A later write is
//! therefore either seen by the tracker before a commit's decision (and its
//! block kept), or applied after the punch — never erased by it.

use crate::dropped::Dropped;
use oubli_core::{Error, Store};
use oubli_ext4::{Counters, Ext4Tracker, Unsupported};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Counters and the tracker of one served export.
pub struct Liveness {
    pub export: String,
    pub oid: u64,
    trims: AtomicU64,
    /// Bytes dropped because the tracker inferred them freed.
    inferred_bytes: AtomicU64,
    tracker: Option<Mutex<Ext4Tracker>>,
    stopped: Mutex<Option<String>>,
    /// What inference dropped and nothing wrote since: with `mount -o
    /// discard`, ext4 then TRIMs the same blocks, which need no second trip
    /// through the engine.
    dropped: Mutex<Dropped>,
}

/// What `oubli status` shows for a served export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LivenessReport {
    pub export: String,
    pub trims_received: u64,
    /// `Some("ext4")` when deletes are inferred.
    pub infer_deletes: Option<String>,
    pub inferred_bytes: u64,
    pub counters: Counters,
    /// Why inference stopped (an unsupported file system was written), if it did.
    pub stopped: Option<String>,
}

fn read_export<'a>(
    store: &'a Store,
    oid: u64,
) -> impl FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a {
    move |off, buf| {
        let got = store
            .read(oid, off, buf.len())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        buf.fill(0);
        let n = got.len().min(buf.len());
        buf[..n].copy_from_slice(&got[..n]);
        Ok(())
    }
}

impl Liveness {
    /// An export served without inference (TRIMs are still counted).
    pub fn plain(export: &str, oid: u64) -> Liveness {
        Liveness {
            export: export.into(),
            oid,
            trims: AtomicU64::new(0),
            inferred_bytes: AtomicU64::new(0),
            tracker: None,
            stopped: Mutex::new(None),
            dropped: Mutex::new(Dropped::default()),
        }
    }

    /// An export whose ext4 deletions are inferred. Refuses a file system
    /// the tracker cannot follow; a device without ext4 yet is accepted
    /// (the tracker learns it when mkfs writes the superblock).
    pub fn ext4(store: &Store, export: &str, oid: u64) -> Result<Liveness, Unsupported> {
        let size = store
            .size(oid)
            .map_err(|e| Unsupported::Io(e.to_string()))?;
        let tracker = Ext4Tracker::load(&mut read_export(store, oid), size)?;
        Ok(Liveness {
            tracker: Some(Mutex::new(tracker)),
            ..Liveness::plain(export, oid)
        })
    }

    fn tracker(&self) -> Option<MutexGuard<'_, Ext4Tracker>> {
        self.tracker
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The memory the export's ext4 tracker may hold beyond its bitmaps
    /// (its [`oubli_ext4::Budget`]; 0 without inference): `oubli serve`
    /// takes it out of its cap on request data in memory.
    pub fn tracker_budget(&self) -> u64 {
        self.tracker().map_or(0, |t| t.budget().total())
    }

    /// The memory the export's ext4 tracker holds now (0 without inference).
    pub fn tracker_memory(&self) -> u64 {
        self.tracker().map_or(0, |t| t.memory_bytes())
    }

    pub fn report(&self) -> LivenessReport {
        LivenessReport {
            export: self.export.clone(),
            trims_received: self.trims.load(Ordering::Relaxed),
            infer_deletes: self.tracker.as_ref().map(|_| "ext4".to_string()),
            inferred_bytes: self.inferred_bytes.load(Ordering::Relaxed),
            counters: self.tracker().map(|t| t.counters()).unwrap_or_default(),
            stopped: self
                .stopped
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    pub(crate) fn trimmed(&self) {
        self.trims.fetch_add(1, Ordering::Relaxed);
    }

    fn dropped(&self) -> MutexGuard<'_, Dropped> {
        self.dropped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a TRIM of `[offset, offset+len)` has anything to erase: not
    /// when inference already dropped all of it and nothing wrote there
    /// since (a write clears the range before it reaches the store).
    pub(crate) fn trim_needed(&self, offset: u64, len: u64) -> bool {
        !self.dropped().covers(offset, offset.saturating_add(len))
    }

    /// Shows a write (`data`, or `len` zeros) to the tracker and drops what
    /// its observation frees. Returns whether the layout must be learnt
    /// again once the write is in the store.
    pub(crate) fn before_write(
        &self,
        store: &Store,
        offset: u64,
        data: Option<&[u8]>,
        len: u64,
        log: &dyn Fn(&str),
    ) -> Result<bool, Error> {
        let Some(mut t) = self.tracker() else {
            return Ok(false);
        };
        self.dropped().remove(offset, offset.saturating_add(len));
        let obs = match data {
            Some(d) => t.observe_write(offset, d),
            None => t.observe_zeroes(offset, len),
        };
        for n in &obs.notes {
            log(&format!("export {}: ext4 inference: {n}", self.export));
        }
        if !obs.freed.is_empty() {
            let ranges: Vec<(u64, u64)> = obs.freed.iter().map(|&(a, b)| (a, b - a)).collect();
            store.punch_holes(self.oid, &ranges)?;
            let mut dropped = self.dropped();
            for &(a, b) in &obs.freed {
                dropped.insert(a, b);
            }
            let bytes: u64 = ranges.iter().map(|&(_, len)| len).sum();
            self.inferred_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        Ok(obs.relearn)
    }

    /// Learns the layout again (the superblock was written).
    pub(crate) fn relearn(&self, store: &Store, log: &dyn Fn(&str)) {
        let Some(mut t) = self.tracker() else { return };
        let was = t.following();
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(size) = store.size(self.oid) {
            t.set_device_size(size);
        }
        match t.relearn(&mut read_export(store, self.oid)) {
            Ok(()) => {
                if t.following() && (!was || stopped.is_some()) {
                    log(&format!(
                        "export {}: following the ext4 on it: deletions are inferred from its journal",
                        self.export
                    ));
                }
                *stopped = None;
            }
            Err(u) => {
                let why = u.to_string();
                if stopped.as_deref() != Some(why.as_str()) {
                    log(&format!(
                        "export {}: stopped inferring deletes: {why} (TRIM and discard still erase)",
                        self.export
                    ));
                }
                *stopped = Some(why);
            }
        }
    }
}
