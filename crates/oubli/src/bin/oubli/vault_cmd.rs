//! `oubli vault show|passwd|move`, vault creation for `init`, and the wear projection of `status`.
//!
//! Moving a store to another vault is crash-safe by its order: the new
//! vault is created holding the current record and proven to open the store
//! *before* the old vault's key is destroyed. A crash in between leaves two
//! vaults that both open the store (rerun the command: it resumes); never
//! none.

use crate::failure::{Failure, Places};
use crate::password;
use crate::session::{self, Access, Global};
use crate::ui;
use clap::{Args, Subcommand};
use oubli::crates::vault::{
    commits_per_day, create_vault, projected_lifetime, wear_warning, Pkcs11Uri, Pkcs11Vault,
    TpmLocation, TpmVault, VaultOptions,
};
use oubli::report::{status_report, StatusReport, WearReport};
use oubli::{
    exit, CreateOptions, CryptoProvider, DirMedium, EpochPolicy, Error, FileVault, KdfParams,
    Options, SecretBytes, Store, Vault, VaultError, VaultInfo, VaultLocation, VaultRecord,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Overrides the vault's rated endurance (writes) in wear projections: a
/// device's datasheet figure, or to rehearse the warning on a simulator.
pub const ENDURANCE_ENV: &str = "OUBLI_VAULT_ENDURANCE";

#[derive(Subcommand)]
pub enum VaultCommand {
    /// Show the vault: kind, address, writes so far, endurance, projected lifetime
    Show {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Change the vault password (file vault: in place; TPM or token: by moving to a new vault)
    Passwd(PasswdArgs),
    /// Move the store's epoch key to another vault, then destroy the old vault's key
    Move(MoveArgs),
}

#[derive(Args)]
pub struct NewVaultArgs {
    /// Read the new password from the first line of FILE [else $OUBLI_NEW_PASSWORD, else asked]
    #[arg(long, value_name = "FILE")]
    new_password_file: Option<PathBuf>,
    /// Argon2id memory for the new password key, in MiB [default: 64; passwd on a file vault: unchanged]
    #[arg(long, value_name = "MIB")]
    kdf_memory: Option<u32>,
    /// Argon2id passes for the new password key [default: 3; passwd on a file vault: unchanged]
    #[arg(long, value_name = "N")]
    kdf_iterations: Option<u32>,
}

#[derive(Args)]
pub struct PasswdArgs {
    /// For a TPM or token vault: the new vault's address [default: the next NV index, or the object label with `.2` toggled]
    #[arg(long, value_name = "ADDRESS")]
    to: Option<PathBuf>,
    #[command(flatten)]
    new: NewVaultArgs,
}

#[derive(Args)]
pub struct MoveArgs {
    /// The new vault's address: a file path, tpm:TCTI or a pkcs11: URI
    #[arg(long, value_name = "ADDRESS")]
    to: PathBuf,
    /// Seal the new vault under a new password (asked, or --new-password-file / $OUBLI_NEW_PASSWORD) instead of the current one
    #[arg(long)]
    new_password: bool,
    #[command(flatten)]
    new: NewVaultArgs,
}

pub fn run(g: &Global, command: VaultCommand) -> Result<String, Failure> {
    let nand_involved = match &command {
        VaultCommand::Show { .. } => false,
        VaultCommand::Passwd(args) => {
            crate::nand::is_nand_vault(&g.vault)
                || args.to.as_deref().is_some_and(crate::nand::is_nand_vault)
        }
        VaultCommand::Move(args) => {
            crate::nand::is_nand_vault(&g.vault) || crate::nand::is_nand_vault(&args.to)
        }
    };
    if nand_involved {
        // Not built yet (docs/BACKLOG.md); refused rather than have `nand`
        // taken for a vault file of that name.
        return Err(Failure::usage(
            "`oubli vault passwd` and `oubli vault move` do not handle the NAND vault yet",
        ));
    }
    match command {
        VaultCommand::Show { json } => show(g, json),
        VaultCommand::Passwd(args) => passwd(g, args),
        VaultCommand::Move(args) => {
            let new = args.new_password.then_some(&args.new);
            migrate(g, &args.to, new, &args.new, "moved")
        }
    }
}

// --- status and show ----------------------------------------------------------

/// The status report: from the live process if one holds the store, else
/// from the store opened read-only; with the wear projection filled in.
pub fn report(g: &Global) -> Result<StatusReport, Failure> {
    let mut report: StatusReport = match g.control("status")? {
        Some(reply) => {
            let text = reply.map_err(|e| g.control_failure(e))?;
            serde_json::from_str(&text)
                .map_err(|e| g.control_failure(format!("unreadable status reply: {e}")))?
        }
        None => {
            let session = g.open(Access::Read)?;
            // Every share vault is opened (and its older records erased,
            // as every open does) so that a leftover shows here.
            session.store.share_leftovers();
            // A NAND store is named by its image, not its state directory.
            let at = if g.nand.is_some() {
                g.store_shown()
            } else {
                &g.store
            };
            status_report(&session.store, at, false).map_err(|e| g.fail(e))?
        }
    };
    report.wear = Some(wear(&report));
    crate::nand::add_wear(g, &mut report)?;
    Ok(report)
}

/// The default interval of `oubli mount` and `oubli serve`.
fn default_interval() -> Duration {
    EpochPolicy::default()
        .interval
        .unwrap_or(Duration::from_secs(60))
}

/// Projects the vault's wear at the live process's interval, else at the
/// default interval of mount and serve.
pub fn wear(r: &StatusReport) -> WearReport {
    let (interval, source) = match r.policy.interval_seconds {
        Some(s) if r.live && s > 0 => (Duration::from_secs(s), "live"),
        _ => (default_interval(), "default"),
    };
    let endurance = std::env::var(ENDURANCE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or(r.vault.endurance_writes);
    let writes = r.vault.writes.unwrap_or(0);
    let rate = commits_per_day(interval);
    let info = VaultInfo {
        kind: r.vault.kind.clone(),
        location: r.vault.location.clone(),
        endurance_writes: endurance,
        overwrite_is_erasure: r.vault.overwrite_is_erasure,
    };
    WearReport {
        interval_seconds: interval.as_secs(),
        policy_source: source.into(),
        commits_per_day: rate,
        endurance_writes: endurance,
        projected_lifetime_seconds: projected_lifetime(endurance, writes, rate)
            .map(|d| d.as_secs()),
        warning: wear_warning(&info, writes, rate),
    }
}

/// The wear lines of `status` and `vault show`.
pub fn render_wear(w: &WearReport) -> String {
    let whose = if w.policy_source == "live" {
        "the running process's policy"
    } else {
        "the default policy of mount/serve; this command commits only when asked"
    };
    let lifetime = match (w.endurance_writes, w.projected_lifetime_seconds) {
        (None, _) => "does not wear out (no endurance limit)".to_string(),
        (Some(_), None) => "does not wear out at this rate".to_string(),
        (Some(_), Some(s)) => format!("about {}", human_span(s)),
    };
    let mut out = format!(
        "lifetime     {lifetime} at a commit every {} ({whose})\n",
        ui::duration(w.interval_seconds)
    );
    if let Some(warning) = &w.warning {
        out.push_str(&format!("WARNING      {warning}\n"));
    }
    out
}

fn human_span(secs: u64) -> String {
    let days = secs as f64 / 86_400.0;
    if days >= 365.0 {
        format!("{:.1} years", days / 365.0)
    } else if days >= 1.0 {
        format!("{days:.0} days")
    } else {
        format!("{:.1} hours", secs as f64 / 3600.0)
    }
}

/// `oubli vault show [--json]`.
fn show(g: &Global, json: bool) -> Result<String, Failure> {
    let r = report(g)?;
    let wear = r.wear.clone().expect("filled in by report");
    if json {
        let value = serde_json::json!({
            "kind": r.vault.kind,
            "location": r.vault.location,
            "writes": r.vault.writes,
            "endurance_writes": wear.endurance_writes,
            "overwrite_is_erasure": r.vault.overwrite_is_erasure,
            "leftover_epochs": r.vault_leftover_epochs,
            "wear": wear,
        });
        return Ok(serde_json::to_string_pretty(&value).expect("plain data") + "\n");
    }
    let endurance = wear
        .endurance_writes
        .map_or("unbounded".into(), |e| format!("rated for {e} writes"));
    let leftover = if r.vault_leftover_epochs.is_empty() {
        String::new()
    } else {
        format!(
            "leftover     {}\n",
            ui::erasure_incomplete(&r.vault_leftover_epochs, r.vault_leftover_error.as_deref())
        )
    };
    Ok(format!(
        "{leftover}\
         kind         {}\n\
         location     {}\n\
         writes       {}\n\
         endurance    {endurance}\n\
         erasure      {}\n{}",
        r.vault.kind,
        r.vault.location,
        r.vault.writes.map_or("unknown".into(), |w| w.to_string()),
        if r.vault.overwrite_is_erasure {
            "overwrites erase"
        } else {
            "stand-in: its medium may keep old copies (file, simulator, software token)"
        },
        render_wear(&wear),
    ))
}

// --- init ---------------------------------------------------------------------

/// Creates the store in `g.store` (an existing empty directory is fine)
/// with a new vault at `g.vault`, whatever its kind.
pub fn create_store(
    g: &Global,
    password: &SecretBytes,
    kdf: KdfParams,
    create: CreateOptions,
    options: Options,
    nand_geometry: oubli_nand::Geometry,
) -> Result<Store, Error> {
    if let Some(image) = &g.nand {
        let provider = options.provider.clone();
        let address = g.vault.to_string_lossy().into_owned();
        let elsewhere = |first: &VaultRecord| -> Result<Box<dyn Vault>, Error> {
            let location = if session::is_file_vault(&g.vault) {
                format!("file:{address}")
            } else {
                address.clone()
            };
            create_vault(&location, password, kdf, first, provider.clone())
                .map_err(|e| already_exists(e, &g.vault_shown))
        };
        let in_chip = crate::nand::is_nand_vault(&g.vault);
        return crate::nand::create_store(
            image,
            nand_geometry,
            password,
            kdf,
            create,
            options,
            (!in_chip).then_some(&elsewhere as crate::nand::MakeVault<'_>),
        );
    }
    if let Some(at) = &g.remote {
        return create_remote_store(g, at, password, kdf, create, options);
    }
    if session::is_file_vault(&g.vault) {
        return oubli::create_dir_store(&g.store, &g.vault, password, kdf, create, options);
    }
    kdf.validate().map_err(Error::Invalid)?;
    let address = g.vault.to_string_lossy().into_owned();
    let medium = DirMedium::create(&g.store).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            Error::AlreadyInitialized(g.store.display().to_string())
        }
        _ => Error::Io {
            context: format!("creating store {}", g.store.display()),
            source: e,
        },
    })?;
    let provider = options.provider.clone();
    Store::create(
        Arc::new(medium),
        |first| {
            create_vault(&address, password, kdf, first, provider.clone())
                .map_err(|e| already_exists(e, &g.vault_shown))
        },
        create,
        options,
    )
}

/// [`create_store`] in a bucket: refused if anything of a store is there.
fn create_remote_store(
    g: &Global,
    at: &oubli_s3::S3Location,
    password: &SecretBytes,
    kdf: KdfParams,
    create: CreateOptions,
    options: Options,
) -> Result<Store, Error> {
    kdf.validate().map_err(Error::Invalid)?;
    let medium = g.open_medium(session::Access::Write)?;
    let io = |e: std::io::Error| Error::Io {
        context: format!("looking at {at}"),
        source: e,
    };
    let occupied = medium
        .read_superblock(oubli::Slot::A)
        .map_err(io)?
        .is_some()
        || medium
            .read_superblock(oubli::Slot::B)
            .map_err(io)?
            .is_some()
        || !medium.list_segments().map_err(io)?.is_empty();
    if occupied {
        return Err(Error::AlreadyInitialized(at.to_string()));
    }
    let provider = options.provider.clone();
    let address = g.vault.to_string_lossy().into_owned();
    Store::create(
        medium,
        |first| {
            if session::is_file_vault(&g.vault) {
                oubli::FileVault::create(&g.vault, password, kdf, first, provider.clone())
                    .map(|v| Box::new(v) as Box<dyn oubli::Vault>)
                    .map_err(|e| already_exists(e, &g.vault_shown))
            } else {
                create_vault(&address, password, kdf, first, provider.clone())
                    .map_err(|e| already_exists(e, &g.vault_shown))
            }
        },
        create,
        options,
    )
}

/// A vault that is already there is "already exists" (exit 4), not an I/O error.
fn already_exists(e: VaultError, shown: &Path) -> Error {
    match e {
        VaultError::Io(io) if io.kind() == std::io::ErrorKind::AlreadyExists => {
            Error::AlreadyInitialized(format!("a vault at {} ({io})", shown.display()))
        }
        e => Error::Vault(e),
    }
}

// --- passwd and move ----------------------------------------------------------

/// A vault opened as its own kind, so that it can be destroyed.
enum Held {
    File(FileVault),
    Tpm(TpmVault),
    Pkcs11(Pkcs11Vault),
}

impl Held {
    fn open(
        address: &Path,
        password: &SecretBytes,
        provider: &Arc<dyn CryptoProvider>,
    ) -> Result<Held, VaultError> {
        let text = address.to_string_lossy();
        let options = VaultOptions::from_env();
        Ok(match VaultLocation::parse(&text)? {
            VaultLocation::File(_) => {
                Held::File(FileVault::open(address, password, provider.clone())?)
            }
            VaultLocation::Tpm(spec) => Held::Tpm(TpmVault::open(
                &TpmLocation::parse(&spec)?,
                password,
                provider.clone(),
                options.tpm,
            )?),
            VaultLocation::Pkcs11(uri) => Held::Pkcs11(Pkcs11Vault::open(
                &Pkcs11Uri::parse(&uri)?,
                password,
                provider.clone(),
                options.pkcs11,
            )?),
        })
    }

    fn vault(&self) -> &dyn Vault {
        match self {
            Held::File(v) => v,
            Held::Tpm(v) => v,
            Held::Pkcs11(v) => v,
        }
    }

    /// Destroys the key: a file vault is overwritten with zeros (both
    /// slots), synced and deleted; a TPM or token vault uses its own destroy.
    fn destroy(self) -> Result<(), VaultError> {
        match self {
            Held::File(v) => {
                let path = v.path().to_path_buf();
                drop(v);
                shred(&path).map_err(VaultError::Io)
            }
            Held::Tpm(v) => v.destroy(&VaultOptions::from_env().tpm),
            Held::Pkcs11(v) => v.destroy(),
        }
    }
}

impl Vault for Held {
    fn info(&self) -> VaultInfo {
        self.vault().info()
    }
    fn load(&self) -> Result<VaultRecord, VaultError> {
        self.vault().load()
    }
    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        self.vault().store(record)
    }
    fn write_count(&self) -> Result<u64, VaultError> {
        self.vault().write_count()
    }
    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        self.vault().readable_records()
    }
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        self.vault().erase_leftovers()
    }
}

/// Overwrites the whole file with zeros, syncs, deletes it and syncs its directory.
fn shred(path: &Path) -> std::io::Result<()> {
    let len = std::fs::metadata(path)?.len();
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all(&vec![0u8; usize::try_from(len).unwrap_or(0)])?;
    file.sync_all()?;
    drop(file);
    std::fs::remove_file(path)?;
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn kdf_of(args: &NewVaultArgs, current: Option<KdfParams>) -> Result<KdfParams, Failure> {
    let base = current.unwrap_or_default();
    let kdf = KdfParams {
        m_cost_kib: args
            .kdf_memory
            .map_or(base.m_cost_kib, |m| m.saturating_mul(1024)),
        t_cost: args.kdf_iterations.unwrap_or(base.t_cost),
        p_cost: base.p_cost,
    };
    kdf.validate()
        .map_err(|why| Failure::usage(format!("bad --kdf-memory / --kdf-iterations: {why}")))?;
    Ok(kdf)
}

/// `oubli vault passwd`.
fn passwd(g: &Global, args: PasswdArgs) -> Result<String, Failure> {
    if !session::is_file_vault(&g.vault) {
        let to = match &args.to {
            Some(to) => to.clone(),
            None => sibling(&g.vault)?,
        };
        return migrate(
            g,
            &to,
            Some(&args.new),
            &args.new,
            "re-sealed under the new password",
        );
    }
    if args.to.is_some() {
        return Err(Failure::usage(
            "--to is for TPM and token vaults; a file vault changes its password in place (use `oubli vault move` to move it)",
        ));
    }
    g.require_store()?;
    // No mount or server may rotate the vault meanwhile with the old key.
    let _lock = g.lock(Access::Write)?;
    let provider = session::provider();
    let password = g.password()?;
    let vault =
        FileVault::open(&g.vault, &password, provider).map_err(|e| g.fail(Error::Vault(e)))?;
    drop(password);
    let kdf = kdf_of(&args.new, Some(vault.kdf_params()))?;
    let new = password::obtain_new(args.new.new_password_file.as_deref(), &g.vault_shown)?;
    vault
        .change_password(&new, kdf)
        .map_err(|e| g.fail(Error::Vault(e)))?;
    Ok(format!(
        "changed the password of vault {}; the old password no longer opens it\n",
        g.vault_shown.display()
    ))
}

/// Where `passwd` re-seals a hardware vault by default: the TPM's next
/// free-by-convention base index (+3), or the token object's label with a
/// `.2` suffix toggled.
fn sibling(address: &Path) -> Result<PathBuf, Failure> {
    let text = address.to_string_lossy();
    let bad = |e: VaultError| Failure::usage(format!("bad --vault: {e}"));
    match VaultLocation::parse(&text).map_err(bad)? {
        VaultLocation::File(p) => Ok(p),
        VaultLocation::Tpm(spec) => {
            let loc = TpmLocation::parse(&spec).map_err(bad)?;
            let index = if loc.index + 5 <= 0x01FF_FFFD {
                loc.index + 3
            } else {
                loc.index - 3
            };
            Ok(PathBuf::from(format!(
                "tpm:{};index={index:#010x}",
                loc.tcti
            )))
        }
        VaultLocation::Pkcs11(uri) => {
            let (path, query) = match uri.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (uri.as_str(), None),
            };
            let body = path.strip_prefix("pkcs11:").unwrap_or(path);
            let mut label = oubli::crates::vault::pkcs11::DEFAULT_OBJECT_LABEL.to_string();
            let mut attrs: Vec<&str> = Vec::new();
            for attr in body.split(';').filter(|a| !a.is_empty()) {
                match attr.strip_prefix("object=") {
                    Some(l) => label = l.to_string(),
                    None => attrs.push(attr),
                }
            }
            let label = match label.strip_suffix(".2") {
                Some(l) => l.to_string(),
                None => format!("{label}.2"),
            };
            let object = format!("object={label}");
            attrs.push(&object);
            let mut out = format!("pkcs11:{}", attrs.join(";"));
            if let Some(q) = query {
                out.push('?');
                out.push_str(q);
            }
            Ok(PathBuf::from(out))
        }
    }
}

/// Moves the store's epoch key from `g.vault` to a new vault at `to`, sealed
/// under a new password if `new_password` is given (else the current one).
fn migrate(
    g: &Global,
    to: &Path,
    new_password: Option<&NewVaultArgs>,
    new: &NewVaultArgs,
    done: &str,
) -> Result<String, Failure> {
    let dest = session::vault_address(Some(to.to_path_buf()));
    let dest_shown = PathBuf::from(session::shown(&dest));
    let dest_places = Places {
        store: &g.store,
        vault: &dest_shown,
    };
    if dest == g.vault {
        return Err(Failure::usage(format!(
            "--to {} is the store's current vault",
            dest_shown.display()
        )));
    }
    let kdf = kdf_of(new, None)?;
    g.require_store()?;
    // Held to the end: nobody commits with the old vault meanwhile.
    let _lock = g.lock(Access::Write)?;
    let provider = session::provider();
    let password = g.password()?;
    let dest_password = match new_password {
        Some(args) => password::obtain_new(args.new_password_file.as_deref(), &dest_shown)?,
        None => password.clone(),
    };

    // Passwords were asked above: the spinner starts with the work.
    let _working = crate::ui::spinner("moving the key to the new vault");
    // 1. The current record, with the store opened writable so that an
    //    interrupted command's intent log is committed first.
    let source =
        Arc::new(Held::open(&g.vault, &password, &provider).map_err(|e| g.fail(Error::Vault(e)))?);
    let record = {
        let store = g
            .open_store(source.clone(), Access::Write, &provider)
            .map_err(|e| g.fail(e))?;
        let record = source.load().map_err(|e| g.fail(Error::Vault(e)))?;
        if record.epoch != store.epoch() {
            return Err(Failure::new(
                exit::VAULT,
                format!(
                    "vault {} holds epoch {} but the store is at epoch {}",
                    g.vault_shown.display(),
                    record.epoch,
                    store.epoch()
                ),
                "run `oubli commit` and retry",
            ));
        }
        record
    };

    // 2. The new vault, holding the same record. If it is already there
    //    with this record, an earlier run was interrupted: resume.
    if let Some(parent) = session::is_file_vault(&dest)
        .then(|| dest.parent())
        .flatten()
    {
        let _ = private_dir(parent);
    }
    let mut resumed = false;
    let created = create_vault(
        &dest.to_string_lossy(),
        &dest_password,
        kdf,
        &record,
        provider.clone(),
    );
    match created {
        Ok(v) => drop(v),
        Err(VaultError::Io(e)) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let existing = g.open_vault_at(&dest, &dest_password, &provider);
            match existing.map(|v| v.load()) {
                Ok(Ok(r)) if r == record => resumed = true,
                _ => {
                    return Err(dest_places.fail(Error::AlreadyInitialized(format!(
                        "a vault at {} ({e})",
                        dest_shown.display()
                    ))))
                }
            }
        }
        Err(e) => return Err(dest_places.fail(Error::Vault(e))),
    }

    // 3. Proof: the store opens with the new vault.
    let verified = g
        .open_vault_at(&dest, &dest_password, &provider)
        .and_then(|v| {
            let store = g
                .open_store(Arc::new(v), Access::Read, &provider)
                .map_err(|e| dest_places.fail(e))?;
            if store.epoch() == record.epoch {
                Ok(())
            } else {
                Err(dest_places.fail(Error::VaultStateUnknown(format!(
                    "the new vault opened the store at epoch {} instead of {}",
                    store.epoch(),
                    record.epoch
                ))))
            }
        });
    if let Err(failure) = verified {
        // The old vault is untouched; take the new one away again.
        if !resumed {
            if let Ok(v) = Held::open(&dest, &dest_password, &provider) {
                let _ = v.destroy();
            }
        }
        return Err(failure);
    }

    // 4. Only now destroy the old vault's key.
    let source = Arc::try_unwrap(source).map_err(|_| {
        Failure::new(
            exit::UNEXPECTED,
            "the old vault is still in use by the store",
            "this is a bug in the oubli command; please report it",
        )
    })?;
    let update = format!(
        "The store's vault is now {}: set OUBLI_VAULT (or pass --vault) to it from now on.",
        dest_shown.display()
    );
    if let Err(e) = source.destroy() {
        return Err(Failure::new(
            exit::VAULT,
            format!(
                "the store now opens with the new vault {}, but destroying the old vault {} failed: {e}",
                dest_shown.display(),
                g.vault_shown.display()
            ),
            format!(
                "the old vault still holds the current key: destroy it by hand (overwrite and delete the file, \
                 `tpm2_nvundefine` its three NV indices, or delete the token's oubli object). {update}"
            ),
        ));
    }
    // 5. A new epoch under the new vault: the old vault's key — which a file
    //    vault's medium may still keep — opens nothing current any more.
    let was_file = session::is_file_vault(&g.vault);
    let epoch = g
        .open_vault_at(&dest, &dest_password, &provider)
        .and_then(|v| {
            let store = g
                .open_store(Arc::new(v), Access::Write, &provider)
                .map_err(|e| dest_places.fail(e))?;
            store.commit().map_err(|e| dest_places.fail(e))?;
            Ok(store.epoch())
        })
        .map_err(|f| {
            Failure::new(
                f.code,
                format!(
                    "the key moved to {}, but the commit after the move failed: {}",
                    dest_shown.display(),
                    f.message
                ),
                format!(
                    "run `oubli commit` with the new vault, so that the old vault's key opens nothing current. {update}"
                ),
            )
        })?;
    let honest = if was_file {
        format!(
            "\nNote: the old vault file was overwritten and deleted, but an SSD, a journaling or copy-on-write \
             file system, a snapshot or a backup may still hold its old content. With it and the old password, \
             what was deleted before epoch {epoch} began may be recoverable from old copies of the store; \
             nothing from epoch {epoch} on is.\n"
        )
    } else {
        String::new()
    };
    Ok(format!(
        "{done}: the store's epoch key (epoch {}) moved from {} to {}{}; the old vault's key is destroyed, \
         and epoch {epoch} began under the new vault\n{update}\n{honest}",
        record.epoch,
        g.vault_shown.display(),
        dest_shown.display(),
        if resumed { " (resumed an interrupted move)" } else { "" },
    ))
}

/// `mkdir -p` with mode 0700: the directory of a new vault file.
fn private_dir(path: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path)
}
