//! oubli's vaults: where the epoch key lives — a password-protected file, a TPM 2.0, a PKCS#11 token, plus test vaults.
//!
//! The whole store's secure deletion rests on the epoch key: when the vault
//! replaces it, everything sealed under the previous epoch becomes
//! unreadable. Every vault keeps the key in the same password-sealed record
//! (Argon2id, see docs/FORMAT-vault.md) and differs only in where it lives:
//!
//! * [`FileVault`] — the default, needs no hardware, but a file on an SSD or
//!   a journaling file system may keep old copies of the key;
//! * [`TpmVault`] — NV indices of a TPM 2.0 (`tpm:device:/dev/tpmrm0`);
//! * [`Pkcs11Vault`] — a data object on a smart card or HSM
//!   (`pkcs11:token=...`).
//!
//! [`open_vault`] and [`create_vault`] dispatch on the location string.
//! Hardware wears out: [`projected_lifetime`] and [`wear_warning`] turn a
//! vault's endurance and an epoch policy into a figure for `status`.
//! [`MemoryVault`] and [`FlakyVault`] are for tests of the engine.

mod file;
mod flaky;
mod format;
mod kdf;
mod memory;
pub mod pkcs11;
mod pkcs11_uri;
mod sealed;
pub mod sealing;
mod slow;
#[cfg(feature = "tpm")]
pub mod tpm;
pub mod tpm_attest;
mod wear;
mod worker;

pub use file::FileVault;
pub use flaky::FlakyVault;
pub use kdf::{KdfParams, SALT_LEN};
pub use memory::MemoryVault;
#[cfg(not(feature = "tpm"))]
pub use no_tpm::{TpmLocation, TpmOptions, TpmVault};
pub use oubli_core::{StoreId, Vault, VaultError, VaultInfo, VaultRecord};
pub use pkcs11::{Pkcs11Options, Pkcs11Vault, TokenSigner};
pub use pkcs11_uri::Pkcs11Uri;
pub use slow::SlowVault;
#[cfg(feature = "tpm")]
pub use tpm::{TpmLocation, TpmOptions, TpmVault};

/// What a `tpm:` location gets in a build without TPM support.
pub const NO_TPM_SUPPORT: &str = "this build of oubli has no TPM support: rebuild it with the `tpm` feature (`cargo install --path crates/oubli --features tpm`, which needs the libtss2-dev and pkg-config packages)";

/// Stand-ins when the crate is built without the `tpm` feature: the API
/// keeps its shape and every TPM location is refused as unavailable.
#[cfg(not(feature = "tpm"))]
mod no_tpm {
    use super::*;

    fn unsupported() -> VaultError {
        VaultError::Unavailable(NO_TPM_SUPPORT.into())
    }

    /// See the `tpm` feature's `TpmLocation`; never constructed here.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct TpmLocation {
        pub tcti: String,
        pub index: u32,
    }

    impl TpmLocation {
        pub fn parse(_spec: &str) -> Result<TpmLocation, VaultError> {
            Err(unsupported())
        }
    }

    /// See the `tpm` feature's `TpmOptions`.
    #[derive(Debug, Clone, Default)]
    pub struct TpmOptions {
        pub timeout: std::time::Duration,
        pub owner_auth: Option<SecretBytes>,
    }

    /// See the `tpm` feature's `TpmVault`; never constructed.
    pub enum TpmVault {}

    impl TpmVault {
        pub fn create(
            _: &TpmLocation,
            _: &SecretBytes,
            _: KdfParams,
            _: &VaultRecord,
            _: Arc<dyn CryptoProvider>,
            _: TpmOptions,
        ) -> Result<TpmVault, VaultError> {
            Err(unsupported())
        }

        pub fn open(
            _: &TpmLocation,
            _: &SecretBytes,
            _: Arc<dyn CryptoProvider>,
            _: TpmOptions,
        ) -> Result<TpmVault, VaultError> {
            Err(unsupported())
        }

        pub fn destroy(self, _: &TpmOptions) -> Result<(), VaultError> {
            match self {}
        }
    }

    impl Vault for TpmVault {
        fn info(&self) -> VaultInfo {
            match *self {}
        }
        fn load(&self) -> Result<VaultRecord, VaultError> {
            match *self {}
        }
        fn store(&self, _: &VaultRecord) -> Result<(), VaultError> {
            match *self {}
        }
        fn write_count(&self) -> Result<u64, VaultError> {
            match *self {}
        }
        fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
            match *self {}
        }
        fn erase_leftovers(&self) -> Result<(), VaultError> {
            match *self {}
        }
    }
}
pub use wear::{commits_per_day, projected_lifetime, wear_warning, WEAR_HORIZON};

use oubli_crypto::{CryptoProvider, SecretBytes};
use std::path::PathBuf;
use std::sync::Arc;

/// A step of a hardware vault's rotation (`store`), for crash tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotationStep {
    /// The current record has been read; nothing is written yet.
    Start,
    /// The new record is durable on the device; the old one is still there.
    NewRecordWritten,
    /// The old record has been overwritten or destroyed; `store` is about to return.
    OldRecordCleared,
}

/// Called by [`TpmVault`] and [`Pkcs11Vault`] at each [`RotationStep`]. An
/// `Err` stops the rotation at that point and is returned by `store`, as if
/// the process or the device had died there. Tests use it to kill the TPM
/// simulator or pull the token at the worst moment.
pub type RotationHook = Arc<dyn Fn(RotationStep) -> Result<(), VaultError> + Send + Sync>;

/// A vault location as the user writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VaultLocation {
    /// `file:PATH`, or any string without a recognized prefix.
    File(PathBuf),
    /// `tpm:...` or `tpm2:...` (the part after the prefix).
    Tpm(String),
    /// `pkcs11:...` (the whole token URI).
    Pkcs11(String),
}

impl VaultLocation {
    /// Parses a location. Only the prefixes `file:`, `tpm:`, `tpm2:` and
    /// `pkcs11:` are special, so an ordinary path containing a colon is still
    /// a path.
    pub fn parse(location: &str) -> Result<Self, VaultError> {
        let loc = if let Some(path) = location.strip_prefix("file:") {
            VaultLocation::File(PathBuf::from(path))
        } else if let Some(rest) = location
            .strip_prefix("tpm:")
            .or_else(|| location.strip_prefix("tpm2:"))
        {
            VaultLocation::Tpm(rest.to_string())
        } else if location.starts_with("pkcs11:") {
            VaultLocation::Pkcs11(location.to_string())
        } else {
            VaultLocation::File(PathBuf::from(location))
        };
        if matches!(&loc, VaultLocation::File(p) if p.as_os_str().is_empty()) {
            return Err(VaultError::Missing("(empty vault path)".into()));
        }
        Ok(loc)
    }
}

/// Options for [`open_vault_with`] and [`create_vault_with`]: one per vault kind.
#[derive(Debug, Clone, Default)]
pub struct VaultOptions {
    pub tpm: TpmOptions,
    pub pkcs11: Pkcs11Options,
}

impl VaultOptions {
    /// Defaults, with the TPM owner authorization taken from
    /// `$OUBLI_TPM_OWNER_AUTH` if set (it is needed only to create or destroy
    /// a TPM vault, and is empty on most machines).
    pub fn from_env() -> VaultOptions {
        let mut options = VaultOptions::default();
        if let Some(auth) = std::env::var_os("OUBLI_TPM_OWNER_AUTH") {
            options.tpm.owner_auth = Some(SecretBytes::new(auth.into_encoded_bytes()));
        }
        options
    }
}

/// Opens the vault at `location` (see [`VaultLocation::parse`]) with
/// [`VaultOptions::from_env`].
///
/// `file:PATH` opens a [`FileVault`], `tpm:TCTI[;index=N]` a [`TpmVault`],
/// `pkcs11:URI` a [`Pkcs11Vault`] (PIN from the URI's `pin-value`, else
/// `$OUBLI_PIN`, else `password`).
pub fn open_vault(
    location: &str,
    password: &SecretBytes,
    provider: Arc<dyn CryptoProvider>,
) -> Result<Box<dyn Vault>, VaultError> {
    open_vault_with(location, password, provider, &VaultOptions::from_env())
}

/// [`open_vault`] with explicit options.
pub fn open_vault_with(
    location: &str,
    password: &SecretBytes,
    provider: Arc<dyn CryptoProvider>,
    options: &VaultOptions,
) -> Result<Box<dyn Vault>, VaultError> {
    Ok(match VaultLocation::parse(location)? {
        VaultLocation::File(path) => Box::new(FileVault::open(path, password, provider)?),
        VaultLocation::Tpm(spec) => Box::new(TpmVault::open(
            &TpmLocation::parse(&spec)?,
            password,
            provider,
            options.tpm.clone(),
        )?),
        VaultLocation::Pkcs11(uri) => Box::new(Pkcs11Vault::open(
            &Pkcs11Uri::parse(&uri)?,
            password,
            provider,
            options.pkcs11.clone(),
        )?),
    })
}

/// Creates a vault at `location` holding `record` (the first epoch key),
/// with [`VaultOptions::from_env`]. Fails if a vault already exists there.
pub fn create_vault(
    location: &str,
    password: &SecretBytes,
    params: KdfParams,
    record: &VaultRecord,
    provider: Arc<dyn CryptoProvider>,
) -> Result<Box<dyn Vault>, VaultError> {
    create_vault_with(
        location,
        password,
        params,
        record,
        provider,
        &VaultOptions::from_env(),
    )
}

/// [`create_vault`] with explicit options.
pub fn create_vault_with(
    location: &str,
    password: &SecretBytes,
    params: KdfParams,
    record: &VaultRecord,
    provider: Arc<dyn CryptoProvider>,
    options: &VaultOptions,
) -> Result<Box<dyn Vault>, VaultError> {
    Ok(match VaultLocation::parse(location)? {
        VaultLocation::File(path) => {
            Box::new(FileVault::create(path, password, params, record, provider)?)
        }
        VaultLocation::Tpm(spec) => Box::new(TpmVault::create(
            &TpmLocation::parse(&spec)?,
            password,
            params,
            record,
            provider,
            options.tpm.clone(),
        )?),
        VaultLocation::Pkcs11(uri) => Box::new(Pkcs11Vault::create(
            &Pkcs11Uri::parse(&uri)?,
            password,
            params,
            record,
            provider,
            options.pkcs11.clone(),
        )?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_crypto::{RingProvider, SecretKey};

    /// A build without TPM support says which feature to enable and what it needs.
    #[test]
    fn no_tpm_message_names_the_feature() {
        assert!(NO_TPM_SUPPORT.contains("--features tpm"));
        assert!(NO_TPM_SUPPORT.contains("libtss2-dev"));
    }

    #[test]
    fn parse_locations() {
        assert_eq!(
            VaultLocation::parse("/a/b").unwrap(),
            VaultLocation::File("/a/b".into())
        );
        assert_eq!(
            VaultLocation::parse("file:rel/v").unwrap(),
            VaultLocation::File("rel/v".into())
        );
        assert_eq!(
            VaultLocation::parse("./odd:name").unwrap(),
            VaultLocation::File("./odd:name".into())
        );
        assert_eq!(
            VaultLocation::parse("tpm2:0x1500016").unwrap(),
            VaultLocation::Tpm("0x1500016".into())
        );
        assert_eq!(
            VaultLocation::parse("pkcs11:token=x").unwrap(),
            VaultLocation::Pkcs11("pkcs11:token=x".into())
        );
        assert!(VaultLocation::parse("").is_err());
        assert!(VaultLocation::parse("file:").is_err());
    }

    #[test]
    fn open_vault_dispatch() {
        let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
        let pw = SecretBytes::new(b"pw".to_vec());
        // Malformed hardware locations are refused before touching anything.
        for loc in ["tpm:owner", "tpm2:swtpm;index=0x1", "pkcs11:tokn=oubli"] {
            let err = open_vault(loc, &pw, provider.clone()).err().unwrap();
            assert!(
                matches!(&err, VaultError::Io(e) if e.kind() == std::io::ErrorKind::InvalidInput),
                "{loc}: {err}"
            );
        }
        // Well-formed ones whose device is not there are unavailable (the
        // engine would retry), not missing.
        let err = open_vault(
            "pkcs11:token=x?module-path=/nonexistent/module.so",
            &pw,
            provider.clone(),
        )
        .err()
        .unwrap();
        assert!(matches!(&err, VaultError::Unavailable(_)), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vault");
        let loc = format!("file:{}", path.display());
        assert!(matches!(
            open_vault(&loc, &pw, provider.clone()),
            Err(VaultError::Missing(_))
        ));
        let record = VaultRecord {
            store_id: [1; 16],
            epoch: 3,
            key: SecretKey::from_bytes([7; 32]),
        };
        FileVault::create(&path, &pw, KdfParams::testing(), &record, provider.clone()).unwrap();
        for loc in [loc.as_str(), path.to_str().unwrap()] {
            let v = open_vault(loc, &pw, provider.clone()).unwrap();
            assert_eq!(v.load().unwrap(), record);
            assert_eq!(v.info().kind, "file");
        }
    }
}
