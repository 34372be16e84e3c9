//! Opening the store for one command: default paths, vault addresses, the store lock, the password, the vault.

use crate::failure::{Failure, Places};
use crate::password::{self, Purpose};
use oubli::crates::core::VaultFailurePolicy;
use oubli::crates::vault::Pkcs11Uri;
use oubli::{
    CryptoProvider, EpochPolicy, Error, Options, RingProvider, SecretBytes, Store, Vault,
    VaultError, VaultLocation, DIR_MARKER,
};
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Name of the lock file inside the store directory.
pub const LOCK_FILE: &str = "lock";

/// Whether a command changes the store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Shared lock, store opened read-only: get, ls, status, audit, fsck.
    Read,
    /// Exclusive lock: everything else.
    Write,
}

/// The global options, resolved.
#[derive(Clone)]
pub struct Global {
    /// The store directory; for a store on S3 its local state directory
    /// (the lock file and the control socket of the process holding it).
    pub store: PathBuf,
    /// A store on S3 (`--store s3://BUCKET/PREFIX`).
    pub remote: Option<oubli_s3::S3Location>,
    /// Its URL (or `nand:IMAGE`), as messages show it.
    remote_shown: Option<PathBuf>,
    /// The chip image of a store on simulated raw NAND (`--store nand:IMAGE`);
    /// `store` is then its state directory `IMAGE.state`.
    pub nand: Option<PathBuf>,
    /// The vault's address: an absolute path for a file vault, else the
    /// `tpm:` or `pkcs11:` address as given (it may hold a PIN).
    pub vault: PathBuf,
    /// The address as it may be printed: without `pin-value`.
    pub vault_shown: PathBuf,
    pub password_file: Option<PathBuf>,
    /// What long-running commands (mount, serve) do when the vault fails a commit.
    pub vault_failure: VaultFailurePolicy,
    /// `--log-tally`.
    pub log_tally: oubli::TallyCadence,
}

/// `--log-tally`: `every-flush` (a tally record, and a second sync, with
/// every flush) or whole seconds (at most that long behind the frames).
pub fn parse_log_tally(text: &str) -> Result<oubli::TallyCadence, String> {
    if text == "every-flush" {
        return Ok(oubli::TallyCadence::EveryFlush);
    }
    match text.parse::<u64>() {
        Ok(0) => Ok(oubli::TallyCadence::EveryFlush),
        Ok(secs) => Ok(oubli::TallyCadence::Every(std::time::Duration::from_secs(
            secs,
        ))),
        Err(_) => Err(format!(
            "{text:?}: expected `every-flush` or a number of seconds"
        )),
    }
}

/// `--on-vault-failure`: what a long-running command does when the vault
/// cannot take a commit (see `VaultFailurePolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnVaultFailure {
    /// Keep the epoch open, go on writing, retry the commit later
    KeepOpen,
    /// Refuse changes until a commit succeeds
    RefuseWrites,
}

impl From<OnVaultFailure> for VaultFailurePolicy {
    fn from(v: OnVaultFailure) -> Self {
        match v {
            OnVaultFailure::KeepOpen => VaultFailurePolicy::KeepEpochOpen,
            OnVaultFailure::RefuseWrites => VaultFailurePolicy::RefuseWrites,
        }
    }
}

/// Resolves `--vault` / `OUBLI_VAULT`: a file vault's path is made absolute
/// (after an optional `file:`), hardware addresses are kept as given.
pub fn vault_address(given: Option<PathBuf>) -> PathBuf {
    let given = given.unwrap_or_else(default_vault);
    if crate::nand::is_nand_vault(&given) {
        return given;
    }
    match given.to_str().map(VaultLocation::parse) {
        Some(Ok(VaultLocation::File(path))) => absolute(&path),
        Some(Ok(_)) => given,
        // Not UTF-8 (only a path can be) or empty: let opening report it.
        _ => absolute(&given),
    }
}

/// A vault address fit for messages: a PKCS#11 URI loses its `pin-value`.
pub fn shown(address: &Path) -> String {
    let text = address.to_string_lossy();
    match VaultLocation::parse(&text) {
        Ok(VaultLocation::Pkcs11(uri)) => match Pkcs11Uri::parse(&uri) {
            Ok(parsed) => parsed.redacted(),
            Err(_) => "pkcs11:(unreadable URI)".into(),
        },
        _ => text.into_owned(),
    }
}

/// Whether `address` names a file vault.
pub fn is_file_vault(address: &Path) -> bool {
    !crate::nand::is_nand_vault(address)
        && matches!(
            address.to_str().map(VaultLocation::parse),
            Some(Ok(VaultLocation::File(_))) | None
        )
}

/// An open store with what the commands need beside it.
pub struct Session {
    pub store: Store,
    /// The vault's epoch before the store was opened: if the store's epoch is
    /// higher now, opening replayed an intent log and committed it.
    pub vault_epoch_at_open: u64,
    /// The store's password: it also opens share vaults (wiped on drop).
    pub password: SecretBytes,
    /// Objects no name reached that the open deleted ([`Global::collect_orphans`]).
    pub orphans_collected: usize,
    /// Held (and so the lock kept) until the session is dropped.
    _lock: Option<File>,
}

/// `$XDG_DATA_HOME/oubli/store`, else `~/.local/share/oubli/store`.
pub fn default_store() -> PathBuf {
    xdg_dir("XDG_DATA_HOME", ".local/share").join("oubli/store")
}

/// `$XDG_CONFIG_HOME/oubli/vault`, else `~/.config/oubli/vault`.
pub fn default_vault() -> PathBuf {
    xdg_dir("XDG_CONFIG_HOME", ".config").join("oubli/vault")
}

fn xdg_dir(var: &str, fallback: &str) -> PathBuf {
    // The XDG spec says relative values are invalid and must be ignored.
    match std::env::var_os(var).map(PathBuf::from) {
        Some(dir) if dir.is_absolute() => dir,
        _ => std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."))
            .join(fallback),
    }
}

/// The production provider; the CLI never runs with a test-only one.
pub fn provider() -> Arc<dyn CryptoProvider> {
    let provider: Arc<dyn CryptoProvider> = Arc::new(RingProvider::new());
    assert!(
        provider.is_secure(),
        "the CLI must use a secure crypto provider"
    );
    provider
}

impl Global {
    /// Resolves the global options.
    pub fn new(
        store: Option<PathBuf>,
        vault: Option<PathBuf>,
        password_file: Option<PathBuf>,
        on_vault_failure: OnVaultFailure,
        log_tally: oubli::TallyCadence,
    ) -> Result<Global, Failure> {
        let vault = vault_address(vault);
        let (store, remote, nand) = resolve_store(&store.unwrap_or_else(default_store))?;
        Ok(Global {
            store,
            remote_shown: shown_store(&remote, &nand),
            remote,
            nand,
            vault_shown: PathBuf::from(shown(&vault)),
            vault,
            password_file,
            vault_failure: on_vault_failure.into(),
            log_tally,
        })
    }

    /// These options with `store` (a directory or an `s3://` URL) in place of `--store`.
    pub fn with_store(&self, store: &Path) -> Result<Global, Failure> {
        let (store, remote, nand) = resolve_store(store)?;
        Ok(Global {
            store,
            remote_shown: shown_store(&remote, &nand),
            remote,
            nand,
            ..self.clone()
        })
    }

    /// The store as users name it: its directory, or its `s3://` URL.
    pub fn store_shown(&self) -> &Path {
        self.remote_shown.as_deref().unwrap_or(&self.store)
    }

    /// Opens the store's medium: its directory (locked as `access` says)
    /// or its bucket.
    pub fn open_medium(&self, access: Access) -> Result<Arc<dyn oubli::Medium>, Error> {
        if let Some(at) = &self.remote {
            // A writer takes the store's lock object; readers need none.
            let open = match access {
                Access::Write => oubli_s3::S3Medium::open_writer,
                Access::Read => oubli_s3::S3Medium::open,
            };
            let medium = open(at).map_err(|e| Error::Io {
                context: format!("opening store {at}"),
                source: e,
            })?;
            return Ok(Arc::new(medium));
        }
        if let Some(image) = &self.nand {
            return crate::nand::open_medium(image);
        }
        Ok(match access {
            Access::Write => Arc::new(oubli::open_dir_medium(&self.store)?),
            Access::Read => Arc::new(oubli::open_dir_medium_read_only(&self.store)?),
        })
    }

    /// These options with the store of the `oubli mount` at `mountpoint`
    /// (read from the mount table) in place of `--store`; unchanged for `None`.
    pub fn at_mount(&self, mountpoint: Option<&Path>) -> Result<Global, Failure> {
        let Some(at) = mountpoint else {
            return Ok(self.clone());
        };
        match crate::mount::store_of_mount(at)? {
            Some(store) => self.with_store(&store),
            None => Err(Failure::usage(format!(
                "nothing is mounted at {}",
                absolute(at).display()
            ))),
        }
    }

    pub fn places(&self) -> Places<'_> {
        Places {
            store: self.store_shown(),
            vault: &self.vault_shown,
        }
    }

    pub fn fail(&self, error: Error) -> Failure {
        self.places().fail(error)
    }

    /// Takes the store lock: exclusive to write, shared to read. Other
    /// oubli processes are refused at once rather than left waiting.
    pub fn lock(&self, access: Access) -> Result<Option<File>, Failure> {
        if self.remote.is_some() || self.nand.is_some() {
            // The state directory of a remote or NAND store is ours to make,
            // and the owner's only: it holds the lock and the control socket.
            oubli::create_private_dir(&self.store).map_err(|e| {
                self.fail(Error::Io {
                    context: format!("creating {}", self.store.display()),
                    source: e,
                })
            })?;
        }
        let path = self.store.join(LOCK_FILE);
        // 0600 from the moment it exists: another user who could open the
        // lock file could hold it and keep every commit off.
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => f,
            // A reader of a store it may not write (a read-only mount, another
            // user's store) still locks if the file exists, and goes without
            // if it does not: nobody can be writing such a store through us.
            Err(_) if access == Access::Read => match File::open(&path) {
                Ok(f) => f,
                Err(_) => return Ok(None),
            },
            Err(e) => {
                return Err(self.fail(Error::Io {
                    context: format!("creating the lock file {}", path.display()),
                    source: e,
                }))
            }
        };
        let locked = match access {
            Access::Write => file.try_lock(),
            Access::Read => file.try_lock_shared(),
        };
        match locked {
            Ok(()) => Ok(Some(file)),
            Err(TryLockError::WouldBlock) => Err(Failure::busy(&self.store)),
            Err(TryLockError::Error(e)) => Err(self.fail(Error::Io {
                context: format!("locking {}", path.display()),
                source: e,
            })),
        }
    }

    /// Sends `what` to the control socket of the process (mount or server)
    /// holding the store open; `None` when no such process runs.
    pub fn control(
        &self,
        what: &str,
    ) -> Result<Option<Result<String, oubli::control::Refusal>>, Failure> {
        oubli::control::request(&self.store, what).map_err(|e| {
            Failure::new(
                oubli::exit::BUSY,
                format!(
                    "the process holding store {} does not answer: {e}",
                    self.store.display()
                ),
                "check that the mount or server is healthy (its log), or stop it and retry",
            )
        })
    }

    /// The process holding the store refused or failed a request.
    pub fn control_failure(&self, refusal: impl Into<oubli::control::Refusal>) -> Failure {
        let refusal = refusal.into();
        Failure::new(
            refusal.code,
            format!(
                "the process holding store {} reports: {}",
                self.store.display(),
                refusal.message
            ),
            "see that process's log; `oubli status` shows whether the epoch is still open",
        )
    }

    /// Fails with exit 8 unless `--store` names a store directory. Checked
    /// before anything else so that no lock file lands in a stranger's directory.
    pub fn require_store(&self) -> Result<(), Failure> {
        // A bucket is checked when opened (no superblocks: not a store).
        if self.remote.is_some()
            || self.store.join(DIR_MARKER).is_file()
            || self.nand.as_ref().is_some_and(|image| image.is_file())
        {
            Ok(())
        } else {
            Err(self.fail(Error::NotInitialized(self.store.display().to_string())))
        }
    }

    /// Gets the password, once a file vault is known to exist: a missing
    /// vault is reported as such rather than after a useless prompt.
    /// (Whether a TPM or token holds a vault is known only once opened.)
    pub fn password(&self) -> Result<SecretBytes, Failure> {
        if is_file_vault(&self.vault) && !self.vault.exists() {
            return Err(self.fail(Error::Vault(VaultError::Missing(
                self.vault_shown.display().to_string(),
            ))));
        }
        password::obtain(
            self.password_file.as_deref(),
            &self.vault_shown,
            Purpose::Open,
        )
    }

    /// Opens the vault at `address` (the store's, or an old copy of a file
    /// vault): a file path, `tpm:...` or `pkcs11:...`.
    pub fn open_vault_at(
        &self,
        address: &Path,
        password: &SecretBytes,
        provider: &Arc<dyn CryptoProvider>,
    ) -> Result<Box<dyn Vault>, Failure> {
        let shown = PathBuf::from(shown(address));
        let places = Places {
            store: self.remote_shown.as_deref().unwrap_or(&self.store),
            vault: &shown,
        };
        if crate::nand::is_nand_vault(address) {
            return crate::nand::open_vault(self.nand.as_deref(), password, provider)
                .map_err(|e| places.fail(Error::Vault(e)));
        }
        let Some(text) = address.to_str() else {
            // Only a path can be non-UTF-8.
            return oubli::FileVault::open(address, password, provider.clone())
                .map(|v| Box::new(v) as Box<dyn Vault>)
                .map_err(|e| places.fail(Error::Vault(e)));
        };
        let location = if is_file_vault(address) && !text.starts_with("file:") {
            // A path such as `tpm:x` relative to the working directory was
            // made absolute by `vault_address`; keep it a path.
            format!("file:{text}")
        } else {
            text.to_string()
        };
        oubli::open_vault(&location, password, provider.clone())
            .map_err(|e| places.fail(Error::Vault(e)))
    }

    /// Options for a long-running command (mount, serve): `policy`, the
    /// `--on-vault-failure` choice, and the policy's commits on a thread of
    /// their own (no file operation or NBD request waits for a rotation).
    pub fn long_running_options(
        &self,
        provider: &Arc<dyn CryptoProvider>,
        policy: EpochPolicy,
    ) -> Options {
        Options {
            provider: provider.clone(),
            policy,
            vault_failure: self.vault_failure,
            background_commits: true,
            tally: self.log_tally,
            ..Options::default()
        }
    }

    /// Locks and opens the store for one command. The epoch policy is
    /// manual: a one-shot command ends the epoch only when asked to.
    pub fn open(&self, access: Access) -> Result<Session, Failure> {
        self.require_store()?;
        let lock = self.lock(access)?;
        let password = self.password()?;
        self.open_with(access, lock, password)
    }

    /// [`open`](Self::open) under a lock the caller took already, with the
    /// password it read (`--certificate` looks at the store read-only first,
    /// under the same exclusive lock, without asking twice).
    pub fn open_with(
        &self,
        access: Access,
        lock: Option<File>,
        password: SecretBytes,
    ) -> Result<Session, Failure> {
        let provider = provider();
        let vault = Arc::new(self.open_vault_at(&self.vault, &password, &provider)?);
        let vault_epoch_at_open = vault.load().map_err(|e| self.fail(Error::Vault(e)))?.epoch;
        let store = self
            .open_store(vault.clone(), access, &provider)
            .map_err(|e| self.fail(e))?;
        store.set_share_opener(self.share_opener(&password, &provider));
        let orphans_collected = if access == Access::Write {
            self.collect_orphans(&store)
        } else {
            0
        };
        Ok(Session {
            store,
            vault_epoch_at_open,
            password,
            orphans_collected,
            _lock: lock,
        })
    }

    /// Deletes every object no name reaches and commits, so that they are
    /// erased now: a command that died half-way leaves one — an `oubli put`
    /// killed after the engine's own flushes (every 2^17 changes) made part
    /// of its input durable, with no name and no warning. Run at every
    /// writable open (one-shot commands, mount, serve), while this process
    /// holds the store lock, so nothing else can be holding such an object
    /// (issue 39). Returns how many; a failure only delays them to the
    /// next open (or `oubli gc`), it never stops the command.
    pub fn collect_orphans(&self, store: &Store) -> usize {
        match oubli::orphans::delete_orphans(store) {
            Ok(0) => 0,
            Ok(n) => {
                match store.commit() {
                    Ok(()) => eprintln!(
                        "oubli: erased {n} object(s) that no name reached (left by a command that did not finish)"
                    ),
                    Err(e) => eprintln!(
                        "oubli: deleted {n} object(s) that no name reached; erased at the next commit ({e})"
                    ),
                }
                n
            }
            Err(e) => {
                eprintln!("oubli: objects that no name reaches were not collected: {e}");
                0
            }
        }
    }

    /// Opens a share's vault the first time data under it is used, with the
    /// store's password (kept in memory, wiped on drop, while the store is open).
    pub fn share_opener(
        &self,
        password: &SecretBytes,
        provider: &Arc<dyn CryptoProvider>,
    ) -> Arc<oubli::ShareOpener> {
        let (g, password, provider) = (self.clone(), password.clone(), provider.clone());
        Arc::new(move |share: &oubli::ShareRecord| {
            g.open_vault_at(Path::new(&share.vault), &password, &provider)
                .map_err(|f| f.message)
        })
    }

    /// Opens the store itself with an already opened vault.
    pub fn open_store(
        &self,
        vault: Arc<dyn Vault>,
        access: Access,
        provider: &Arc<dyn CryptoProvider>,
    ) -> Result<Store, Error> {
        let medium = self.open_medium(access)?;
        Store::open(medium, vault, options(access, provider))
    }
}

/// Lowers the number of queued changes past which the engine flushes by
/// itself (`Options::pending_ops_max`), for the tests that kill a command
/// after such a flush without feeding it gigabytes.
pub const PENDING_OPS_MAX_ENV: &str = "OUBLI_TEST_PENDING_OPS_MAX";

/// Options for a one-shot command.
pub fn options(access: Access, provider: &Arc<dyn CryptoProvider>) -> Options {
    let defaults = Options::default();
    Options {
        provider: provider.clone(),
        policy: EpochPolicy::manual(),
        read_only: access == Access::Read,
        pending_ops_max: std::env::var(PENDING_OPS_MAX_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(defaults.pending_ops_max),
        ..defaults
    }
}

impl Session {
    /// Whether opening the store already committed a new epoch (it replays
    /// the intent log of the previous command and commits it when writable).
    pub fn committed_on_open(&self) -> bool {
        self.store.epoch() > self.vault_epoch_at_open
    }
}

/// How messages name a remote or NAND store.
fn shown_store(remote: &Option<oubli_s3::S3Location>, nand: &Option<PathBuf>) -> Option<PathBuf> {
    match (remote, nand) {
        (Some(r), _) => Some(PathBuf::from(r.to_string())),
        (None, Some(image)) => Some(PathBuf::from(format!("nand:{}", image.display()))),
        (None, None) => None,
    }
}

/// The store location resolved: its directory, its S3 location, its NAND image.
type Resolved = (PathBuf, Option<oubli_s3::S3Location>, Option<PathBuf>);

/// `--store` resolved: a directory made absolute; an `s3://` URL and the
/// local state directory kept for it (`$XDG_STATE_HOME/oubli/s3/BUCKET/PREFIX`);
/// or `nand:IMAGE` and its state directory `IMAGE.state`.
fn resolve_store(store: &Path) -> Result<Resolved, Failure> {
    if let Some(image) = crate::nand::image_of(store) {
        return Ok((crate::nand::state_dir(&image), None, Some(image)));
    }
    // The media's location syntax (oubli_media::location): `dir:PATH` is a
    // directory; `file:PATH`, a store inside one file or block device, is
    // a library medium the commands do not open yet. Without this check it
    // would become a directory named `file:...`.
    if let Some(text) = store.to_str() {
        if let Some(dir) = text.strip_prefix("dir:") {
            return Ok((absolute(Path::new(dir)), None, None));
        }
        if text.starts_with("file:") {
            return Err(Failure::usage(format!(
                "--store {text}: a store inside one file or block device (FileMedium) is \
                 not available from the command line; give a directory, s3://BUCKET/PREFIX \
                 or nand:IMAGE"
            )));
        }
    }
    let Some(parsed) = store.to_str().and_then(oubli_s3::S3Location::parse) else {
        return Ok((absolute(store), None, None));
    };
    let at = parsed.map_err(|e| Failure::usage(format!("--store: {e}")))?;
    let state = xdg_dir("XDG_STATE_HOME", ".local/state")
        .join("oubli/s3")
        .join(&at.bucket)
        .join(at.prefix.trim_end_matches('/'));
    Ok((state, Some(at), None))
}

/// Turns a path given relative to the working directory into one that stays
/// valid (and prints well) whatever the command does next.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
