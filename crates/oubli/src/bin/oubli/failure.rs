//! How the command fails: an exit code, what went wrong, and what to do next — one line on stderr.

use oubli::exit::{self, exit_code};
use oubli::{Error, VaultError};
use std::fmt;
use std::path::Path;

/// A failed command. Printed as `oubli: MESSAGE (exit CODE): HINT`.
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
    pub hint: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oubli: {} (exit {})", self.message, self.code)?;
        if !self.hint.is_empty() {
            write!(f, ": {}", self.hint)?;
        }
        Ok(())
    }
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>, hint: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            hint: hint.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(exit::USAGE, message, "see `oubli --help` and docs/CLI.md")
    }

    pub fn busy(store: &Path) -> Failure {
        Failure::new(
            exit::BUSY,
            format!("store {} is in use by another process", store.display()),
            "wait for the other `oubli` command (or program using the store) to finish, then retry",
        )
    }

    /// A local I/O error outside the store (a source or destination file).
    pub fn file(what: impl fmt::Display, e: std::io::Error) -> Failure {
        Failure::new(
            exit::UNEXPECTED,
            format!("{what}: {e}"),
            "check the path and its permissions",
        )
    }
}

/// Where the command was pointed, so that hints can name the paths.
pub struct Places<'a> {
    pub store: &'a Path,
    pub vault: &'a Path,
}

impl Places<'_> {
    /// Turns an engine error into a failure whose hint says what to do next.
    pub fn fail(&self, error: Error) -> Failure {
        let code = exit_code(&error);
        let store = self.store.display();
        let vault = self.vault.display();
        let (message, hint) = match &error {
            Error::Vault(VaultError::WrongPassword) => (
                format!("wrong password for vault {vault}"),
                "check --password-file / OUBLI_PASSWORD (or retype it)".to_string(),
            ),
            Error::Vault(VaultError::Missing(_)) => (
                format!("no vault at {vault}"),
                "point --vault / OUBLI_VAULT at the vault made by `oubli init` for this store; without it the data cannot be opened".into(),
            ),
            Error::Vault(VaultError::Corrupt(why)) => (
                format!("vault {vault} is corrupted: {why}"),
                "the epoch key cannot be read from it; check that --vault names the right file (an old copy of the vault does not help: it opens only old epochs)".into(),
            ),
            Error::Vault(VaultError::Unavailable(why)) => (
                format!("vault {vault} is unreachable: {why}"),
                "check that the vault device is present and --vault is right, then retry".into(),
            ),
            Error::Vault(VaultError::Io(e)) => (
                format!("cannot read or write vault {vault}: {e}"),
                "check the vault file's path, permissions and disk, then retry".into(),
            ),
            Error::WrongVault => (
                format!("vault {vault} belongs to another store, not to {store}"),
                "point --vault / OUBLI_VAULT at this store's own vault".into(),
            ),
            Error::VaultBehind { found, vault: at } => (
                format!(
                    "vault {vault} holds epoch {at} but store {store} is at epoch {}",
                    found.iter().max().copied().unwrap_or_default()
                ),
                "this vault is an old copy (or belongs to a newer copy of the store): use the store's current vault".into(),
            ),
            Error::VaultStateUnknown(why) => (
                format!("the vault did not confirm the last commit: {why}"),
                "make the vault reachable and run `oubli commit` again; flushed data is safe".into(),
            ),
            Error::WritesRefused(why) => (
                format!("writes are refused until the vault takes a commit: {why}"),
                "make the vault reachable (plug the token in, check the TPM); writes resume once a commit succeeds".into(),
            ),
            Error::ErasureIncomplete { epoch, why } => (
                format!(
                    "erasure incomplete: the vault {vault} still holds epoch {epoch}'s key ({why}); what was deleted in epoch {epoch} is still recoverable"
                ),
                "make the vault writable and reachable; every `oubli` command and every commit retries destroying the old key (`oubli status` shows it)".into(),
            ),
            Error::LogDamaged(what) => (
                format!("integrity failure in store {store}: {what}"),
                "acknowledged writes are missing from the intent log: the medium was truncated or tampered with; restore the store directory from a backup (or a copy made before the damage)".into(),
            ),
            Error::NotInitialized(_) => (
                format!("no store at {store}"),
                "run `oubli init` first, or point --store / OUBLI_STORE at an existing store".into(),
            ),
            Error::AlreadyInitialized(what) => (
                format!("already exists: {what}"),
                "use the existing store, or choose another --store / --vault (remove old ones only if you mean to destroy their data)".into(),
            ),
            Error::Rollback { found, vault: at } => (
                format!(
                    "store {store} was rolled back: it holds epochs {found:?} but the vault is at epoch {at}"
                ),
                "the medium was replaced by an older copy; restore the newest copy of the store directory".into(),
            ),
            Error::Corrupt(what) => (
                format!("integrity failure in store {store}: {what} does not authenticate"),
                "the medium was corrupted, truncated or tampered with; run `oubli fsck` to list the damage and restore the store from a backup".into(),
            ),
            Error::NoName(name) => (
                format!("no such name: {name}"),
                "run `oubli ls` to see the stored names".into(),
            ),
            Error::NoShare(name) => (
                format!("no such key share: {name}"),
                "run `oubli share ls` to see the shares".into(),
            ),
            Error::ShareUnavailable { name, vault, why } => (
                format!("this data is under key share {name}, whose vault {} cannot be opened: {why}", crate::session::shown(std::path::Path::new(vault))),
                "make that vault reachable (plug in the token, check the TPM or the file) and retry; data outside the share is unaffected".into(),
            ),
            Error::ShareDestroyed(name) => (
                format!("this data was under key share {name}, which was destroyed: it is unrecoverable"),
                "remove the names that point at it (`oubli rm`)".into(),
            ),
            Error::NoSnapshot(name) => (
                format!("no such snapshot: {name}"),
                "run `oubli snapshot ls` to see the snapshots".into(),
            ),
            Error::NoObject(oid) => (
                format!("no such object: {oid}"),
                "run `oubli ls` to see the stored names; run `oubli fsck` if a listed name fails".into(),
            ),
            Error::Exists(name) => (
                format!("name already exists: {name}"),
                "choose another name or remove the old one with `oubli rm`".into(),
            ),
            Error::Invalid(why) | Error::PastEnd(why) => (
                format!("invalid argument: {why}"),
                "see `oubli --help` and docs/CLI.md".into(),
            ),
            Error::NoSpace(what) => (
                format!("the medium holding {store} is full ({what})"),
                "delete data with `oubli rm` and `oubli commit` (they still work: the store keeps a reserve for them), run `oubli gc` to reclaim dead segments, or free space on that disk".into(),
            ),
            Error::Io { context, source } if code == exit::BUSY => (
                format!("store {store} is in use by another process ({context}: {source})"),
                "wait for the other `oubli` command (or program using the store) to finish, then retry".into(),
            ),
            Error::Io { context, source } => (
                format!("I/O error on store {store}: {context}: {source}"),
                "check the disk holding the store (permissions, space, hardware), then retry".into(),
            ),
            Error::Version(v) => (
                format!("store {store} uses format version {v}, which this oubli does not know"),
                "use the version of oubli that wrote the store (or a newer one)".into(),
            ),
            Error::UnknownKeyScheme(k) => (
                format!("store {store} uses key scheme {k}, which this oubli does not know"),
                "use the version of oubli that wrote the store (or a newer one)".into(),
            ),
            Error::ReadOnly => (
                "the store is open read-only".to_string(),
                "this is a bug in the oubli command; please report it with the command you ran".into(),
            ),
        };
        Failure::new(code, message, hint)
    }
}
