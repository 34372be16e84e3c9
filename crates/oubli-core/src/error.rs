//! The engine's error type: one variant per failure a user must be able to tell apart.

use crate::vault::VaultError;
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("the medium is full ({0}); free space or run `oubli gc`")]
    NoSpace(String),
    #[error(transparent)]
    Vault(#[from] VaultError),
    #[error("this vault belongs to another store")]
    WrongVault,
    #[error("no store here: {0} (run `oubli init` first)")]
    NotInitialized(String),
    #[error("a store already exists here: {0}")]
    AlreadyInitialized(String),
    #[error("superblock rollback: the medium holds epochs {found:?} but the vault is at epoch {vault}; the medium was replaced by an older copy")]
    Rollback { found: Vec<u64>, vault: u64 },
    #[error("the vault is at epoch {vault} but the medium only holds epochs {found:?}: the vault was replaced by an older copy or belongs to a newer copy of the store")]
    VaultBehind { found: Vec<u64>, vault: u64 },
    #[error(
        "integrity failure: {0} does not authenticate (corrupted, truncated or tampered medium)"
    )]
    Corrupt(String),
    #[error("unsupported format version {0}")]
    Version(u16),
    #[error("unknown key scheme {0}: the store was written by a newer oubli")]
    UnknownKeyScheme(u8),
    #[error("no such object: {0}")]
    NoObject(u64),
    #[error("no such name: {0}")]
    NoName(String),
    #[error("no such snapshot: {0}")]
    NoSnapshot(String),
    #[error("no such key share: {0}")]
    NoShare(String),
    #[error("this data is under key share {name}, whose vault {vault} cannot be opened: {why}")]
    ShareUnavailable {
        name: String,
        vault: String,
        why: String,
    },
    #[error("this data was under key share {0}, which was destroyed: it is unrecoverable")]
    ShareDestroyed(String),
    #[error("name already exists: {0}")]
    Exists(String),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A write that would have grown an object of fixed size
    /// ([`Store::write_inside`](crate::Store::write_inside)); nothing was written.
    #[error("past the end: {0}")]
    PastEnd(String),
    #[error("the store is open read-only")]
    ReadOnly,
    #[error("writes refused until the vault takes a commit (policy refuse-writes): {0}")]
    WritesRefused(String),
    #[error("the last commit could not reach the vault and its outcome is unknown; writes cannot be made durable until the vault answers: {0}")]
    VaultStateUnknown(String),
    #[error("erasure incomplete: the vault still holds epoch {epoch}'s key, so what was deleted in it is still recoverable (the vault could not destroy it: {why}); retried at the next commit and every open")]
    ErasureIncomplete { epoch: u64, why: String },
    #[error("integrity failure: {0}")]
    LogDamaged(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        let context = context.into();
        if source.kind() == io::ErrorKind::StorageFull {
            return Error::NoSpace(context);
        }
        Error::Io { context, source }
    }
}

/// Maps a read error of a unit: a short segment is a truncated medium, reported as corruption.
pub(crate) fn read_error(what: &str, source: io::Error) -> Error {
    match source.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::NotFound => {
            Error::Corrupt(format!("{what} (segment missing or truncated: {source})"))
        }
        _ => Error::io(format!("reading {what}"), source),
    }
}
