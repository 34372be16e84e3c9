//! oubli: storage in which deleting data makes it cryptographically unrecoverable — the library facade.
//!
//! Every unit of data is encrypted under its own key; keys live in a
//! copy-on-write key tree whose root is sealed by an *epoch key* held in a
//! [`Vault`]. Deleting data removes its keys from the tree, and
//! [`Store::commit`] replaces the epoch key in the vault: from then on every
//! deleted unit is ciphertext nobody can open — including the stale copies an
//! SSD controller, a snapshot or a backup kept of the medium. Between two
//! commits, deleted data stays recoverable by whoever holds the vault's
//! current key and the password; [`Store::audit`] reports it as *pending*.
//!
//! This crate gathers the pieces under one name: the engine ([`Store`] and
//! its types, from `oubli-core`), the media (where ciphertext goes, from
//! `oubli-media`) and the vaults (where the epoch key lives, from
//! `oubli-vault`), plus conveniences for the embedded default: a store in a
//! local directory ([`DirMedium`]) with a password-protected [`FileVault`]
//! ([`create_dir_store`], [`open_dir_store`]).
//!
//! What oubli does not protect against: an attacker present while the store
//! is open (memory, swap), copies that applications made elsewhere, and a
//! vault medium that keeps old copies — a file vault on an SSD is a stand-in
//! for a real vault (TPM, token); see docs/THREAT_MODEL.md.
//!
//! # Example: write, flush, delete, commit
//!
//! ```
//! use oubli::{CreateOptions, EpochPolicy, MemMedium, MemoryVault, Options, Store, ROOT_DIR};
//! use std::sync::Arc;
//!
//! // An in-memory medium and vault; see `create_dir_store` for the real thing.
//! let options = Options { policy: EpochPolicy::manual(), ..Options::default() };
//! let store = Store::create(
//!     Arc::new(MemMedium::new()),
//!     |first| Ok(MemoryVault::new(first.clone())),
//!     CreateOptions::default(),
//!     options,
//! )?;
//!
//! let plan = store.create_object(b"")?;
//! store.write(plan, 0, b"attack at dawn")?;
//! store.link(ROOT_DIR, b"plan", plan)?;
//! store.flush()?; // durable now (intent log), without ending the epoch
//! assert_eq!(store.read(plan, 0, 64)?, b"attack at dawn");
//!
//! store.unlink(ROOT_DIR, b"plan")?;
//! store.delete(plan)?;
//! // Deleted, but until the epoch ends the current vault key still opens it.
//! assert!(store.audit()?.pending_units > 0);
//!
//! store.commit()?; // new epoch key in the vault: the old one is gone
//! let verdict = store.audit()?;
//! assert_eq!((verdict.pending_units, verdict.leaked_units), (0, 0));
//! # Ok::<(), oubli::Error>(())
//! ```
//!
//! # Example: a store in a directory with a file vault
//!
//! ```
//! use oubli::{CreateOptions, KdfParams, Options, SecretBytes, ROOT_DIR};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let password = SecretBytes::new(b"correct horse".to_vec());
//! let store = oubli::create_dir_store(
//!     dir.path().join("store"),
//!     dir.path().join("vault"),
//!     &password,
//!     KdfParams::testing(), // tests only: use KdfParams::default() for real vaults
//!     CreateOptions::default(),
//!     Options::default(),
//! )?;
//! let note = store.create_object(b"")?;
//! store.write(note, 0, b"kept")?;
//! store.link(ROOT_DIR, b"note", note)?;
//! store.commit()?;
//! drop(store);
//!
//! let store = oubli::open_dir_store(dir.path().join("store"), dir.path().join("vault"), &password)?;
//! let note = store.lookup(ROOT_DIR, b"note")?.expect("linked above");
//! assert_eq!(store.read(note, 0, 16)?, b"kept");
//! # Ok::<(), oubli::Error>(())
//! ```

pub use oubli_core::audit;
pub use oubli_core::{
    name_hash, AuditReport, CreateOptions, EpochPolicy, Error, FsckReport, GcReport, Medium,
    ObjectRecord, Options, Overhead, Recovered, Recovery, Result, SegmentId, ShareInfo,
    ShareLeftover, ShareOpener, ShareRecord, Slot, SnapshotInfo, SnapshotUsage, Status, Store,
    StoreId, TallyCadence, Vault, VaultError, VaultInfo, VaultRecord, DEFAULT_CELL_SIZE, ROOT_DIR,
    SMALL_CELL_SIZE,
};
pub use oubli_crypto::{
    CryptoProvider, KeyScheme, ParentPointerScheme, RingProvider, SecretBytes, SecretKey,
    SCHEME_KEYED_HASH_FOREST, SCHEME_NAMES, SCHEME_PARENT_POINTER,
};
pub use oubli_media::{
    create_medium, open_medium, DirMedium, FaultMedium, FileMedium, MemMedium, RecordingMedium,
    DIR_MARKER,
};
pub use oubli_vault::{open_vault, FileVault, FlakyVault, KdfParams, MemoryVault, VaultLocation};

/// The component crates, for what the re-exports above leave out.
pub mod crates {
    pub use oubli_core as core;
    pub use oubli_crypto as crypto;
    pub use oubli_media as media;
    pub use oubli_vault as vault;
}

pub mod certificate;
pub mod clock;
pub mod control;
pub mod exit;
pub mod metrics;
pub mod orphans;
pub mod report;
pub mod retention;
pub use exit::exit_code;

use std::io;
use std::path::Path;
use std::sync::Arc;

/// Opens the directory medium at `path`, translating its I/O errors into the
/// engine's: a missing directory or one that is not a store becomes
/// [`Error::NotInitialized`], a directory held by another handle an
/// [`Error::Io`] of kind `WouldBlock` (exit code 11, "store busy").
pub fn open_dir_medium(path: impl AsRef<Path>) -> Result<DirMedium> {
    let path = path.as_ref();
    DirMedium::open(path).map_err(|e| dir_medium_error(path, e))
}

/// [`open_dir_medium`] for reading only, under a shared lock: several
/// readers at once, none while a writer holds the store.
pub fn open_dir_medium_read_only(path: impl AsRef<Path>) -> Result<DirMedium> {
    let path = path.as_ref();
    DirMedium::open_read_only(path).map_err(|e| dir_medium_error(path, e))
}

fn dir_medium_error(path: &Path, e: io::Error) -> Error {
    let shown = path.display().to_string();
    match e.kind() {
        io::ErrorKind::NotFound => Error::NotInitialized(shown),
        // No marker: a directory, but not a store. With a marker the store
        // is there but damaged or of an unknown version: an integrity matter.
        io::ErrorKind::InvalidData if !path.join(DIR_MARKER).exists() => {
            Error::NotInitialized(shown)
        }
        io::ErrorKind::InvalidData => Error::Corrupt(format!("store {shown}: {e}")),
        _ => Error::Io {
            context: format!("opening store {shown}"),
            source: e,
        },
    }
}

/// Creates a store in directory `store_dir` (created if missing; an existing
/// empty directory is fine) with a new password-protected [`FileVault`] at
/// `vault_path`, and returns it open.
///
/// Nothing is created if either already exists ([`Error::AlreadyInitialized`]).
/// If creation fails half-way, a directory this call created is removed
/// again, so that a retry starts clean.
pub fn create_dir_store(
    store_dir: impl AsRef<Path>,
    vault_path: impl AsRef<Path>,
    password: &SecretBytes,
    kdf: KdfParams,
    create: CreateOptions,
    options: Options,
) -> Result<Store> {
    let (store_dir, vault_path) = (store_dir.as_ref(), vault_path.as_ref());
    if vault_path.exists() {
        return Err(Error::AlreadyInitialized(format!(
            "{} (a vault file is already there)",
            vault_path.display()
        )));
    }
    kdf.validate().map_err(Error::Invalid)?;
    if let Some(parent) = vault_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent).map_err(|e| Error::Io {
            context: format!("creating the vault's directory {}", parent.display()),
            source: e,
        })?;
    }
    let existed = store_dir.exists();
    let result = (|| {
        let medium = DirMedium::create(store_dir).map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => {
                Error::AlreadyInitialized(store_dir.display().to_string())
            }
            _ => Error::Io {
                context: format!("creating store {}", store_dir.display()),
                source: e,
            },
        })?;
        let provider = options.provider.clone();
        Store::create(
            Arc::new(medium),
            |first| {
                FileVault::create(vault_path, password, kdf, first, provider.clone())
                    .map_err(Error::from)
            },
            create,
            options,
        )
    })();
    if result.is_err() && !existed {
        // Only what this call made: a store without its vault is useless,
        // and it would make the retry fail with "already exists".
        let _ = std::fs::remove_dir_all(store_dir);
    }
    result
}

/// Opens the store in `store_dir` with the [`FileVault`] at `vault_path`,
/// with [`Options::default`] (automatic epochs: see [`EpochPolicy`]).
pub fn open_dir_store(
    store_dir: impl AsRef<Path>,
    vault_path: impl AsRef<Path>,
    password: &SecretBytes,
) -> Result<Store> {
    open_dir_store_with(store_dir, vault_path, password, Options::default())
}

/// [`open_dir_store`] with explicit [`Options`] (read-only, epoch policy, ...).
pub fn open_dir_store_with(
    store_dir: impl AsRef<Path>,
    vault_path: impl AsRef<Path>,
    password: &SecretBytes,
    options: Options,
) -> Result<Store> {
    let medium = open_dir_medium(store_dir)?;
    let vault = FileVault::open(vault_path, password, options.provider.clone())?;
    Store::open(Arc::new(medium), Arc::new(vault), options)
}

/// `mkdir -p` with mode 0700 for the directories it creates, from the moment
/// they exist: they hold keys, and a store's lock that another user must not
/// be able to take (docs/THREAT_MODEL.md).
pub fn create_private_dir(path: &Path) -> io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn password() -> SecretBytes {
        SecretBytes::new(b"pw".to_vec())
    }

    #[test]
    fn create_refuses_existing_vault_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let vault = dir.path().join("vault");
        std::fs::write(&vault, b"something").unwrap();
        let err = create_dir_store(
            dir.path().join("store"),
            &vault,
            &password(),
            KdfParams::testing(),
            CreateOptions::default(),
            Options::default(),
        )
        .err()
        .unwrap();
        assert!(matches!(err, Error::AlreadyInitialized(_)), "{err}");
        assert!(!dir.path().join("store").exists());
    }

    #[test]
    fn failed_create_removes_the_directory_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let err = create_dir_store(
            &store,
            dir.path().join("vault"),
            &password(),
            KdfParams::testing(),
            CreateOptions {
                cell_size: 1000,
                ..CreateOptions::default()
            },
            Options::default(),
        )
        .err()
        .unwrap();
        assert!(matches!(err, Error::Invalid(_)), "{err}");
        assert!(!store.exists());
        assert!(!dir.path().join("vault").exists());
    }

    #[test]
    fn open_maps_missing_and_foreign_directories() {
        let dir = tempfile::tempdir().unwrap();
        for path in [dir.path().join("missing"), dir.path().to_path_buf()] {
            let err = open_dir_medium(&path).err().unwrap();
            assert!(matches!(err, Error::NotInitialized(_)), "{err}");
            assert_eq!(exit_code(&err), exit::NO_STORE);
        }
    }

    #[test]
    fn second_handle_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let (store, vault) = (dir.path().join("s"), dir.path().join("v"));
        let _open = create_dir_store(
            &store,
            &vault,
            &password(),
            KdfParams::testing(),
            CreateOptions::default(),
            Options::default(),
        )
        .unwrap();
        let err = open_dir_store(&store, &vault, &password()).err().unwrap();
        assert_eq!(exit_code(&err), exit::BUSY, "{err}");
    }
}
