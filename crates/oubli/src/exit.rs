//! Exit codes of the `oubli` command, and the one mapping from engine errors to them.
//!
//! Scripts rely on these numbers (docs/CLI.md lists them); they never change
//! meaning. Codes 2, 10 and 11 arise in the command itself (usage errors, a
//! failed audit, a store locked by another process) as well as from errors.

use crate::{Error, VaultError};
use std::io;

/// Success.
pub const OK: i32 = 0;
/// Unexpected error (a bug, or a case no other code covers).
pub const UNEXPECTED: i32 = 1;
/// Usage error: bad option, argument or missing password source.
pub const USAGE: i32 = 2;
/// No such name in the store.
pub const NO_NAME: i32 = 3;
/// Already exists: a name, or a store or vault at `init`.
pub const EXISTS: i32 = 4;
/// Wrong password or PIN.
pub const WRONG_PASSWORD: i32 = 5;
/// Vault missing, corrupted, unreachable, stale or belonging to another store.
pub const VAULT: i32 = 6;
/// Integrity failure (corrupted, truncated, tampered or rolled-back medium) or fsck problems.
pub const INTEGRITY: i32 = 7;
/// No store at `--store`.
pub const NO_STORE: i32 = 8;
/// Medium I/O error or out of space.
pub const MEDIUM_IO: i32 = 9;
/// Audit: deleted data is still recoverable.
pub const LEAKED: i32 = 10;
/// The store is in use by another process.
pub const BUSY: i32 = 11;

/// The exit code for an engine error: the single place where errors meet numbers.
pub fn exit_code(error: &Error) -> i32 {
    match error {
        Error::Io { source, .. } if source.kind() == io::ErrorKind::WouldBlock => BUSY,
        Error::Io { .. } | Error::NoSpace(_) => MEDIUM_IO,
        Error::Vault(VaultError::WrongPassword) => WRONG_PASSWORD,
        Error::Vault(
            VaultError::Missing(_)
            | VaultError::Corrupt(_)
            | VaultError::Unavailable(_)
            | VaultError::Io(_),
        )
        | Error::WrongVault
        | Error::VaultBehind { .. }
        | Error::VaultStateUnknown(_)
        | Error::ErasureIncomplete { .. }
        | Error::WritesRefused(_)
        | Error::ShareUnavailable { .. }
        | Error::ShareDestroyed(_) => VAULT,
        Error::NotInitialized(_) => NO_STORE,
        Error::AlreadyInitialized(_) | Error::Exists(_) => EXISTS,
        Error::Rollback { .. } | Error::Corrupt(_) | Error::LogDamaged(_) => INTEGRITY,
        Error::NoName(_) | Error::NoObject(_) | Error::NoSnapshot(_) | Error::NoShare(_) => NO_NAME,
        Error::Invalid(_) | Error::PastEnd(_) => USAGE,
        Error::Version(_) | Error::UnknownKeyScheme(_) | Error::ReadOnly => UNEXPECTED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_reachable_from_some_error() {
        let io = |kind| Error::Io {
            context: "x".into(),
            source: io::Error::from(kind),
        };
        let cases = [
            (Error::ReadOnly, UNEXPECTED),
            (Error::Invalid("x".into()), USAGE),
            (Error::NoName("x".into()), NO_NAME),
            (Error::Exists("x".into()), EXISTS),
            (Error::AlreadyInitialized("x".into()), EXISTS),
            (Error::Vault(VaultError::WrongPassword), WRONG_PASSWORD),
            (Error::Vault(VaultError::Missing("x".into())), VAULT),
            (Error::WrongVault, VAULT),
            (
                Error::VaultBehind {
                    found: vec![3],
                    vault: 1,
                },
                VAULT,
            ),
            (Error::Corrupt("x".into()), INTEGRITY),
            (Error::LogDamaged("x".into()), INTEGRITY),
            (
                Error::ErasureIncomplete {
                    epoch: 3,
                    why: "x".into(),
                },
                VAULT,
            ),
            (
                Error::Rollback {
                    found: vec![1],
                    vault: 3,
                },
                INTEGRITY,
            ),
            (Error::NotInitialized("x".into()), NO_STORE),
            (io(io::ErrorKind::PermissionDenied), MEDIUM_IO),
            (Error::NoSpace("x".into()), MEDIUM_IO),
            (io(io::ErrorKind::WouldBlock), BUSY),
        ];
        for (error, code) in cases {
            assert_eq!(exit_code(&error), code, "{error}");
        }
    }
}
