//! The adversary: every byte a recording medium ever held, plus whatever vault records it is handed.

use crate::marker::{self, Marker};
use oubli_core::audit::{self, Recovery};
use oubli_core::{Medium, VaultRecord};
use oubli_crypto::{CryptoProvider, ParentPointerScheme};
use oubli_media::{MemMedium, RecordingMedium};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Every superblock version and every segment byte the medium ever held.
pub struct Adversary {
    pub superblocks: Vec<Vec<u8>>,
    pub medium: Arc<MemMedium>,
}

impl Adversary {
    /// Seizes everything a [`RecordingMedium`] saw (deleted segments and overwritten superblocks included).
    pub fn seize<M: Medium>(recording: &RecordingMedium<M>) -> Adversary {
        let medium = MemMedium::new();
        for (id, bytes) in recording.every_segment() {
            if !bytes.is_empty() {
                medium.append(id, 0, &bytes).expect("in-memory append");
            }
        }
        medium.sync().expect("in-memory sync");
        Adversary {
            superblocks: recording
                .every_superblock()
                .into_iter()
                .map(|(_, b)| b)
                .collect(),
            medium: Arc::new(medium),
        }
    }

    /// Opens everything the given vault records unlock.
    pub fn recover(&self, keys: &[VaultRecord], provider: Arc<dyn CryptoProvider>) -> Recovery {
        audit::recover(
            &self.superblocks,
            self.medium.clone(),
            keys,
            provider,
            Arc::new(ParentPointerScheme),
        )
    }

    /// The marker blocks in everything the given keys open.
    pub fn recovered_markers(
        &self,
        keys: &[VaultRecord],
        provider: Arc<dyn CryptoProvider>,
    ) -> BTreeSet<Marker> {
        let recovery = self.recover(keys, provider);
        let mut out = BTreeSet::new();
        for u in &recovery.units {
            marker::scan(&u.plaintext, &mut out);
        }
        for (_, image) in recovery.images() {
            marker::scan(&image, &mut out);
        }
        out
    }

    /// Marker blocks visible in the raw bytes, without any key (must be none).
    pub fn plaintext_markers(&self) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        for id in self.medium.list_segments().unwrap_or_default() {
            let len = self.medium.segment_len(id).ok().flatten().unwrap_or(0);
            let mut buf = vec![0u8; len as usize];
            if self.medium.read(id, 0, &mut buf).is_ok() {
                marker::scan(&buf, &mut out);
            }
        }
        for sb in &self.superblocks {
            marker::scan(sb, &mut out);
        }
        out
    }
}
