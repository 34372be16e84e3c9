//! oubli's vaults: where the epoch key lives — a password-protected A/B file vault, plus test vaults.
//!
//! The whole store's secure deletion rests on the epoch key: when the vault
//! replaces it, everything sealed under the previous epoch becomes
//! unreadable. [`FileVault`] is the default and needs no hardware, but a file
//! on an SSD or a journaling file system may keep old copies of the key (see
//! docs/FORMAT-vault.md); hardware vaults (TPM, PKCS#11) come later.
//!
//! [`MemoryVault`] and [`FlakyVault`] are for tests of the engine.

mod file;
mod flaky;
mod format;
mod kdf;
mod memory;

pub use file::FileVault;
pub use flaky::FlakyVault;
pub use kdf::{KdfParams, SALT_LEN};
pub use memory::MemoryVault;
pub use oubli_core::{StoreId, Vault, VaultError, VaultInfo, VaultRecord};

use oubli_crypto::{CryptoProvider, SecretBytes};
use std::path::PathBuf;
use std::sync::Arc;

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

/// Opens the vault at `location` (see [`VaultLocation::parse`]).
///
/// Files are opened with [`FileVault::open`]; TPM and PKCS#11 locations fail
/// with [`VaultError::Unavailable`] until those vaults exist.
pub fn open_vault(
    location: &str,
    password: &SecretBytes,
    provider: Arc<dyn CryptoProvider>,
) -> Result<Box<dyn Vault>, VaultError> {
    match VaultLocation::parse(location)? {
        VaultLocation::File(path) => Ok(Box::new(FileVault::open(path, password, provider)?)),
        VaultLocation::Tpm(_) => Err(VaultError::Unavailable(
            "TPM vaults are not supported yet".into(),
        )),
        VaultLocation::Pkcs11(_) => Err(VaultError::Unavailable(
            "PKCS#11 vaults are not supported yet".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_crypto::{RingProvider, SecretKey};

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
        for loc in ["tpm:owner", "tpm2:0x1", "pkcs11:token=oubli"] {
            let err = open_vault(loc, &pw, provider.clone()).err().unwrap();
            assert!(
                matches!(&err, VaultError::Unavailable(m) if m.contains("not supported yet")),
                "{err}"
            );
        }

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
