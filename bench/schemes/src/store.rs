//! A store under a chosen key scheme as `oubli init` makes it (directory medium, password-sealed file vault), and its key-metadata figures.

use oubli_bench_engine::report::Rec;
use oubli_bench_engine::store::BoxResult;
use oubli_core::{CleanerPolicy, CreateOptions, EpochPolicy, Medium, Options, Store};
use oubli_crypto::{RingProvider, SecretBytes};
use oubli_media::DirMedium;
use oubli_vault::{FileVault, KdfParams};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The schemes in the order of every table: the reference first.
pub const SCHEMES: [(&str, u8); 3] = oubli_crypto::SCHEME_NAMES;

/// An open store and where it lives. Dropping it flushes the store; `remove` deletes its files.
pub struct SchemeStore {
    pub store: Store,
    pub scheme: &'static str,
    dir: PathBuf,
}

impl SchemeStore {
    /// A new store in `dir` under key scheme `id`, committing by `policy`.
    /// The cleaner is off in every phase: it runs only after commits the
    /// policy triggers, so in the epoch comparison it would be charged to
    /// the epochs and not to the scheme.
    pub fn create(
        dir: &Path,
        (scheme, id): (&'static str, u8),
        policy: EpochPolicy,
    ) -> BoxResult<SchemeStore> {
        remove_files(dir);
        let provider = Arc::new(RingProvider::new());
        let vault_provider = provider.clone();
        let vault_path = vault_path(dir);
        let medium = Arc::new(DirMedium::create(dir)?);
        let store = Store::create(
            medium as Arc<dyn Medium>,
            |record| {
                // A light KDF: unlocking is not measured, the vault's rotation at each commit is.
                FileVault::create(
                    &vault_path,
                    &SecretBytes::new(b"bench".to_vec()),
                    KdfParams::testing(),
                    record,
                    vault_provider,
                )
                .map_err(Into::into)
            },
            CreateOptions {
                key_scheme: id,
                ..CreateOptions::default()
            },
            Options {
                policy,
                provider,
                cleaner: CleanerPolicy::off(),
                ..Options::default()
            },
        )?;
        Ok(SchemeStore {
            store,
            scheme,
            dir: dir.to_path_buf(),
        })
    }

    /// A store of phase `phase` under `scheme` in `work`, committed only by hand (the stores of a phase stay open side by side).
    pub fn create_manual(
        work: &Path,
        phase: &str,
        scheme: (&'static str, u8),
    ) -> BoxResult<SchemeStore> {
        SchemeStore::create(
            &work.join(format!("{phase}-{}", scheme.0)),
            scheme,
            EpochPolicy::manual(),
        )
    }

    /// Closes the store and deletes its medium and vault.
    pub fn remove(self) {
        let SchemeStore { store, dir, .. } = self;
        drop(store);
        remove_files(&dir);
    }

    /// The scheme's key metadata now (call it after a commit: the state is the committed one).
    pub fn key_metadata(&self) -> BoxResult<KeyMetadata> {
        let stats = self.store.status()?.key_scheme_stats;
        let overhead = self.store.overhead()?;
        Ok(KeyMetadata {
            units: overhead.nodes + overhead.cells,
            key_ref_bytes: stats.key_ref_bytes as u64,
            state_bytes: stats.state_bytes,
            roots: stats.roots,
            keys: stats.keys,
        })
    }
}

fn vault_path(dir: &Path) -> PathBuf {
    dir.with_extension("vault")
}

fn remove_files(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(vault_path(dir));
}

/// Where a scheme keeps the keys of a store's units: a key reference in
/// each unit's parent (the key itself, or an index) and a state outside
/// the tree (the forest's roots, the area's key blocks).
#[derive(Debug, Clone, Copy)]
pub struct KeyMetadata {
    /// Cells and tree nodes: every unit the tree seals under a key of its own.
    pub units: u64,
    /// Bytes of key reference a unit's parent needs (the node format keeps a 32-byte slot either way).
    pub key_ref_bytes: u64,
    pub state_bytes: u64,
    pub roots: Option<u64>,
    pub keys: Option<u64>,
}

impl KeyMetadata {
    /// Key references of every unit plus the scheme's state.
    pub fn total_bytes(&self) -> u64 {
        self.units * self.key_ref_bytes + self.state_bytes
    }

    pub fn bytes_per_unit(&self) -> f64 {
        self.total_bytes() as f64 / self.units.max(1) as f64
    }

    /// Adds the figures to a JSON line (`roots` / `keys` only where the scheme has them).
    pub fn record(&self, rec: Rec) -> Rec {
        let mut rec = rec
            .int("units", self.units)
            .int("key_ref_bytes", self.key_ref_bytes)
            .int("state_bytes", self.state_bytes)
            .int("key_metadata_bytes", self.total_bytes())
            .num("key_metadata_bytes_per_unit", self.bytes_per_unit());
        if let Some(r) = self.roots {
            rec = rec.int("roots", r);
        }
        if let Some(k) = self.keys {
            rec = rec.int("keys", k);
        }
        rec
    }
}
