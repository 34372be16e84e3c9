//! The adversary: every byte a recording medium ever held, plus whatever vault records it is handed.

use crate::marker::{self, Marker};
use oubli_core::audit::{self, Recovery};
use oubli_core::{Medium, VaultRecord};
use oubli_crypto::CryptoProvider;
use oubli_media::{MemMedium, RecordingMedium};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Every superblock version and every segment byte the medium ever held.
pub struct Adversary {
    pub superblocks: Vec<Vec<u8>>,
    /// Every segment, each byte as last written.
    pub medium: Arc<MemMedium>,
    /// Where units were rewritten in place: every segment with each byte as
    /// first appended. Whatever the adversary opens is looked for in both,
    /// so a unit something durable named before its bytes were written
    /// over is found too.
    pub as_appended: Option<Arc<MemMedium>>,
}

/// A synced medium holding `segments`, each whole from offset 0.
fn medium_of(segments: std::collections::BTreeMap<oubli_core::SegmentId, Vec<u8>>) -> MemMedium {
    MemMedium::from_pieces(segments.into_iter().map(|(id, bytes)| (id, 0, bytes)))
}

impl Adversary {
    /// Seizes everything a [`RecordingMedium`] saw (deleted segments,
    /// rewritten units and overwritten superblocks included).
    pub fn seize<M: Medium>(recording: &RecordingMedium<M>) -> Adversary {
        let as_appended = recording
            .rewrote()
            .then(|| Arc::new(medium_of(recording.every_segment_as_appended())));
        Adversary {
            superblocks: recording
                .every_superblock()
                .into_iter()
                .map(|(_, b)| b)
                .collect(),
            medium: Arc::new(medium_of(recording.every_segment())),
            as_appended,
        }
    }

    /// The seized media: the bytes as last written, then as first appended.
    fn media(&self) -> impl Iterator<Item = &Arc<MemMedium>> {
        std::iter::once(&self.medium).chain(&self.as_appended)
    }

    /// Everything the given segments (`(id, bytes)`, possibly several
    /// pieces of one id at given offsets) and superblock versions hold.
    pub fn from_parts(
        segments: impl IntoIterator<Item = (oubli_core::SegmentId, u64, Vec<u8>)>,
        superblocks: Vec<Vec<u8>>,
    ) -> Adversary {
        let medium = MemMedium::from_pieces(segments);
        Adversary {
            superblocks,
            medium: Arc::new(medium),
            as_appended: None,
        }
    }

    /// Seizes every version of every object a versioned bucket kept under
    /// `prefix` (what the cloud provider, its backups and its replicas hold).
    pub fn seize_bucket(admin: &oubli_s3::Admin, bucket: &str, prefix: &str) -> Adversary {
        let at = oubli_s3::S3Location {
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        let history = admin.history(&at).expect("every version of the store");
        Adversary::from_parts(history.pieces, history.superblocks)
    }

    /// Opens everything the given vault records unlock.
    pub fn recover(&self, keys: &[VaultRecord], provider: Arc<dyn CryptoProvider>) -> Recovery {
        audit::recover(&self.superblocks, self.medium.clone(), keys, provider)
    }

    /// The marker blocks in everything the given keys open.
    pub fn recovered_markers(
        &self,
        keys: &[VaultRecord],
        provider: Arc<dyn CryptoProvider>,
    ) -> BTreeSet<Marker> {
        self.recovered_markers_with_shares(keys, &[], provider)
    }

    /// [`recovered_markers`](Self::recovered_markers) by an adversary who
    /// also holds these share keys (`(share id, key)`).
    pub fn recovered_markers_with_shares(
        &self,
        keys: &[VaultRecord],
        shares: &[(u32, oubli_crypto::SecretKey)],
        provider: Arc<dyn CryptoProvider>,
    ) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        for medium in self.media() {
            let recovery = audit::recover_with_shares(
                &self.superblocks,
                medium.clone(),
                keys,
                shares,
                provider.clone(),
            );
            out.extend(markers_of(&recovery));
        }
        out
    }

    /// Marker blocks visible in the raw bytes, without any key (must be none).
    pub fn plaintext_markers(&self) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        for medium in self.media() {
            for id in medium.list_segments().unwrap_or_default() {
                let len = medium.segment_len(id).ok().flatten().unwrap_or(0);
                let mut buf = vec![0u8; len as usize];
                if medium.read(id, 0, &mut buf).is_ok() {
                    marker::scan(&buf, &mut out);
                }
            }
        }
        for sb in &self.superblocks {
            marker::scan(sb, &mut out);
        }
        out
    }
}

/// The marker blocks in the units of `recovery` and in the objects they
/// reassemble (a marker block may straddle two cells).
fn markers_of(recovery: &Recovery) -> BTreeSet<Marker> {
    let mut out = BTreeSet::new();
    for u in &recovery.units {
        marker::scan(&u.plaintext, &mut out);
    }
    for (_, mut image) in recovery.images() {
        // An image ends with its last unit, but the object reads on as
        // zeros (a hole, or a tail a punch cut off the cell): a live block
        // whose last bytes are zero is whole in the store while its units
        // end before those bytes (simulator seed 50001554).
        image.resize(image.len() + marker::BLOCK - 1, 0);
        marker::scan(&image, &mut out);
    }
    out
}

impl Adversary {
    /// The marker blocks of every unit `history` (old vault keys) opens
    /// whose key the scheme state of the `held` records still derives
    /// from the unit's reference: [`audit::rederive`], with the units'
    /// identities learned from the old copies.
    pub fn rederived_markers(
        &self,
        history: &[VaultRecord],
        held: &[VaultRecord],
        provider: Arc<dyn CryptoProvider>,
    ) -> BTreeSet<Marker> {
        let mut out = BTreeSet::new();
        for medium in self.media() {
            let known =
                audit::recover(&self.superblocks, medium.clone(), history, provider.clone()).units;
            let recovery = audit::rederive(
                &self.superblocks,
                medium.clone(),
                held,
                &known,
                provider.clone(),
            );
            out.extend(markers_of(&recovery));
        }
        out
    }
}

/// Under a key scheme whose references are not keys (a forest's leaf
/// index), an adversary who also knows every unit's place and reference —
/// learned here by opening the recording with every old vault key,
/// `history` — must still open nothing deleted with what `vault` holds:
/// the scheme's committed state must derive no deleted unit's key.
/// Returns what it opened (callers that know the store's state check that
/// live data is among it: the adversary is not blind). Nothing to check
/// under the parent-pointer scheme, whose references are the keys.
pub fn check_no_rederivation(
    adversary: &Adversary,
    scheme: u8,
    history: &[VaultRecord],
    vault: &dyn oubli_core::Vault,
    runner: &crate::workload::Runner,
    provider: Arc<dyn CryptoProvider>,
) -> BTreeSet<Marker> {
    if scheme == oubli_crypto::SCHEME_PARENT_POINTER {
        return BTreeSet::new();
    }
    let held = vault.readable_records().expect("vault");
    let rederived = adversary.rederived_markers(history, &held, provider);
    let leaked: Vec<_> = rederived.intersection(&runner.erased).take(5).collect();
    assert!(
        leaked.is_empty(),
        "the key scheme still derives the keys of deleted data: {leaked:?}"
    );
    rederived
}

/// [`check_no_rederivation`] against everything `recording` ever held,
/// with every key `vault` ever held as the source of units' identities.
pub fn check_no_rederivation_on(
    recording: &RecordingMedium<MemMedium>,
    scheme: u8,
    vault: &crate::vault::RecordingVault,
    runner: &crate::workload::Runner,
    provider: Arc<dyn CryptoProvider>,
) -> BTreeSet<Marker> {
    let adversary = Adversary::seize(recording);
    check_no_rederivation(
        &adversary,
        scheme,
        &vault.history(),
        vault,
        runner,
        provider,
    )
}

/// Both halves of the promise against everything `recording` ever held and
/// the vault's whole content (its current key and anything older it still
/// holds): no plaintext on the medium, nothing in `runner.erased` opens, and
/// everything the model still holds — live or in a snapshot — does (the
/// adversary is not blind).
pub fn check_promise(
    recording: &RecordingMedium<MemMedium>,
    vault: &dyn oubli_core::Vault,
    runner: &crate::workload::Runner,
    provider: Arc<dyn CryptoProvider>,
) {
    check_promise_against(&Adversary::seize(recording), vault, runner, provider);
}

/// [`check_promise`] against what an adversary already seized (from a
/// recording medium, or every version a bucket kept).
pub fn check_promise_against(
    adversary: &Adversary,
    vault: &dyn oubli_core::Vault,
    runner: &crate::workload::Runner,
    provider: Arc<dyn CryptoProvider>,
) {
    let held = vault.readable_records().expect("vault");
    check_promise_with_keys(adversary, &held, runner, provider);
}

/// [`check_promise_against`] with the vault records the adversary holds
/// given directly (e.g. carved out of a raw NAND image).
pub fn check_promise_with_keys(
    adversary: &Adversary,
    held: &[VaultRecord],
    runner: &crate::workload::Runner,
    provider: Arc<dyn CryptoProvider>,
) {
    assert!(
        adversary.plaintext_markers().is_empty(),
        "plaintext on the medium"
    );
    // Every share vault's content too: a destroyed share's key is random.
    let recovered = adversary.recovered_markers_with_shares(held, &runner.share_keys(), provider);
    let leaked: Vec<_> = recovered.intersection(&runner.erased).take(5).collect();
    assert!(
        leaked.is_empty(),
        "deleted data recovered after commit: {leaked:?}"
    );
    let live = runner.live_markers();
    let missing: Vec<_> = live.difference(&recovered).take(5).collect();
    assert!(
        missing.is_empty(),
        "the adversary failed to read data the store or a snapshot holds: {missing:?}"
    );
}
