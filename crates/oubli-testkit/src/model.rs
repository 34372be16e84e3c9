//! The reference model: what every object should contain, as plain byte vectors.

use crate::marker::{self, Marker};
use oubli_core::{Store, ROOT_DIR};
use std::collections::{BTreeMap, BTreeSet};

/// Objects by id, with their exact contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    pub objects: BTreeMap<u64, Vec<u8>>,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            objects: [(ROOT_DIR, Vec::new())].into_iter().collect(),
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

    /// Every marker block still present in some object.
    pub fn live_markers(&self) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        for data in self.objects.values() {
            marker::scan(data, &mut out);
        }
        out
    }

    /// Compares the store with the model; returns a description of the first difference.
    pub fn diff(&self, store: &Store) -> Option<String> {
        let objects = match store.objects() {
            Ok(o) => o,
            Err(e) => return Some(format!("listing objects failed: {e}")),
        };
        let ids: Vec<u64> = objects.iter().map(|(id, _)| *id).collect();
        let want: Vec<u64> = self.objects.keys().copied().collect();
        if ids != want {
            return Some(format!("object ids differ: store {ids:?}, model {want:?}"));
        }
        for (oid, data) in &self.objects {
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
}
