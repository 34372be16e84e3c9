//! The reference model: what every object should contain, as plain byte vectors.

use crate::marker::{self, Marker};
use oubli_core::{Store, ROOT_DIR};
use std::collections::{BTreeMap, BTreeSet};

/// Objects by id, with their exact contents; and the snapshots, each a
/// copy of the objects as they were when it was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub objects: BTreeMap<u64, Vec<u8>>,
    pub snapshots: BTreeMap<String, BTreeMap<u64, Vec<u8>>>,
    /// Objects whose key share was destroyed: listed, unreadable, erased.
    pub destroyed: BTreeSet<u64>,
    /// Object → the share it is under (an index in the runner's list of
    /// shares). Part of the model, so that a crash that loses an object
    /// also loses its placement (its id may be given to a new object).
    pub share_of: BTreeMap<u64, usize>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            objects: [(ROOT_DIR, Vec::new())].into_iter().collect(),
            snapshots: BTreeMap::new(),
            destroyed: BTreeSet::new(),
            share_of: BTreeMap::new(),
        }
    }
}

impl Model {
    pub fn write(&mut self, oid: u64, off: u64, data: &[u8]) {
        let obj = self.objects.get_mut(&oid).expect("model object");
        let end = off as usize + data.len();
        if obj.len() < end {
            obj.resize(end, 0);
        }
        obj[off as usize..end].copy_from_slice(data);
    }

    pub fn truncate(&mut self, oid: u64, size: u64) {
        self.objects
            .get_mut(&oid)
            .expect("model object")
            .resize(size as usize, 0);
    }

    pub fn punch(&mut self, oid: u64, off: u64, len: u64) {
        let obj = self.objects.get_mut(&oid).expect("model object");
        let end = (off + len).min(obj.len() as u64) as usize;
        if (off as usize) < end {
            obj[off as usize..end].fill(0);
        }
    }

    /// Every marker block still present in some object of the live store
    /// or of a snapshot: none of these may be erased.
    pub fn live_markers(&self) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        let snapshots = self.snapshots.values().flat_map(|s| s.iter());
        for (oid, data) in self.objects.iter().chain(snapshots) {
            if !self.destroyed.contains(oid) {
                marker::scan(data, &mut out);
                // As the adversary lays an object out (adversary.rs,
                // `markers_of`), it reads on as zeros past its end: a block
                // whose cut-off tail was zeros is as whole here as there
                // (seed 92003035: a truncate cut block (2^40+29, 256)'s last
                // byte, a zero; counted erased here and opened there).
                let tail = &data[data.len().saturating_sub(marker::BLOCK - 1)..];
                let mut padded = tail.to_vec();
                padded.resize(tail.len() + marker::BLOCK - 1, 0);
                marker::scan(&padded, &mut out);
            }
        }
        out
    }

    /// Compares the store (and each of its snapshots) with the model;
    /// returns a description of the first difference.
    pub fn diff(&self, store: &Store) -> Option<String> {
        if let Some(d) = diff_objects(&self.objects, &self.destroyed, store) {
            return Some(d);
        }
        let names: Vec<String> = store.snapshots().into_iter().map(|s| s.name).collect();
        let want: Vec<String> = self.snapshots.keys().cloned().collect();
        if names != want {
            return Some(format!("snapshots differ: store {names:?}, model {want:?}"));
        }
        for (name, objects) in &self.snapshots {
            let view = match store.snapshot(name) {
                Ok(v) => v,
                Err(e) => return Some(format!("snapshot {name}: {e}")),
            };
            if let Some(d) = diff_objects(objects, &self.destroyed, &view) {
                return Some(format!("snapshot {name}: {d}"));
            }
        }
        None
    }
}

/// Compares the objects of `store` (the live store or a snapshot's view) with `model`.
fn diff_objects(
    model: &BTreeMap<u64, Vec<u8>>,
    destroyed: &BTreeSet<u64>,
    store: &Store,
) -> Option<String> {
    let objects = match store.objects() {
        Ok(o) => o,
        Err(e) => return Some(format!("listing objects failed: {e}")),
    };
    let ids: Vec<u64> = objects.iter().map(|(id, _)| *id).collect();
    let want: Vec<u64> = model.keys().copied().collect();
    if ids != want {
        return Some(format!("object ids differ: store {ids:?}, model {want:?}"));
    }
    for (oid, data) in model {
        if destroyed.contains(oid) {
            match store.read(*oid, 0, data.len() + 1) {
                Err(oubli_core::Error::ShareDestroyed(_)) => continue,
                // An object with no cells reads without its share's key.
                Ok(got) if data.iter().all(|&b| b == 0) && got.iter().all(|&b| b == 0) => continue,
                other => {
                    return Some(format!(
                        "object {oid} is under a destroyed share, yet reads {:?}",
                        other.map(|d| d.len())
                    ))
                }
            }
        }
        match store.read(*oid, 0, data.len() + 1) {
            Ok(got) if &got == data => {}
            Ok(got) => {
                let first = got
                    .iter()
                    .zip(data.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(data.len()));
                return Some(format!(
                    "object {oid}: store has {} bytes, model {}; first difference at byte {first}",
                    got.len(),
                    data.len()
                ));
            }
            Err(e) => return Some(format!("object {oid}: read failed: {e}")),
        }
    }
    None
}
