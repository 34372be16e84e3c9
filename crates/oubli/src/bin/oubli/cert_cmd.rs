//! `--certificate FILE` on the commands that end an erasure, and `oubli certificate verify|show` (docs/CERTIFICATE.md).
//!
//! A command given `--certificate` measures what is pending erasure before
//! its commit (the epoch, a commitment to the vault's record, the audit's
//! count of units deleted but still open), commits, runs the audit again
//! with the vault's new content, and writes the certificate signed with
//! `--sign-key`. The file is created (exclusively) and the key read before
//! anything is erased: a bad path or key fails the command with nothing
//! lost.

use crate::failure::Failure;
use crate::session::{self, Access, Global, Session};
use clap::Subcommand;
use oubli::certificate::measure::{Measure, Statement, VaultFacts};
use oubli::certificate::sign::{public_key_from_pem, Signer, SigningKey, TokenKey};
use oubli::certificate::verify::{check_against_store, check_signature, StoreNow};
use oubli::certificate::{
    self as cert, EpochTotals, ErasedItem, ItemKind, MediumKind, NameForm, Outcome, RetainedItem,
    SignedCertificate, Tool,
};
use oubli::{exit, Error, Store};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The options every erasing command takes.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct CertArgs {
    /// Write a signed certificate of sanitization of what this erasure made unrecoverable to FILE (JSON, see docs/CERTIFICATE.md; FILE must not exist)
    #[arg(long, value_name = "FILE", requires = "sign_key")]
    pub certificate: Option<PathBuf>,
    /// In the certificate, salted SHA-256 hashes instead of names (for names that are personal data)
    #[arg(long, requires = "certificate")]
    pub hash_names: bool,
    /// The organisation's Ed25519 key that signs the certificate: a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519` writes it, or `pkcs11:URI` naming an Ed25519 key inside a PKCS#11 token (its label in object=, the PIN in pin-value= or $OUBLI_PIN)
    #[arg(long, value_name = "KEY", requires = "certificate")]
    pub sign_key: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum CertificateCommand {
    /// Check a certificate's signature and, with --store, that its erasure still holds (exit 10 if not)
    Verify {
        file: PathBuf,
        /// The organisation's Ed25519 public key (SPKI PEM, `openssl pkey -pubout`) the certificate must be signed by
        #[arg(long, value_name = "FILE")]
        public_key: Option<PathBuf>,
    },
    /// Show a certificate as text, or as a printable HTML page
    Show {
        file: PathBuf,
        /// A self-contained HTML page (print it, or save it as PDF from a browser)
        #[arg(long)]
        html: bool,
    },
}

/// A certificate asked for: its file (created, empty), the key, the name form.
pub struct Request {
    path: PathBuf,
    file: Option<File>,
    /// `share destroy`: the share's vault, whose overwrite erases the data
    /// under the share (the certificate's method depends on it too).
    share_vault: Option<VaultFacts>,
    key: Signer,
    names: NameForm,
    /// Erased names a mount removed past those it listed.
    items_unlisted: u64,
}

impl Drop for Request {
    /// A command that fails before the certificate is written leaves no
    /// empty file behind.
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Request {
    /// `share destroy`: the vault of the share destroyed.
    pub fn share_vault(&mut self, info: &oubli::VaultInfo) {
        self.share_vault = Some(VaultFacts::from(info));
    }

    /// A name as the certificate shows it: in clear, or salted and hashed.
    pub fn name(&self, name: &str) -> String {
        self.names.show(name).expect("the salt was made here")
    }

    /// Adds what a mount removed since its last commit (its measure before
    /// the commit says) to the command's items: the commit erases it too.
    fn add_removed(
        &mut self,
        before: &Measure,
        items: &mut Vec<ErasedItem>,
        retained: &mut Vec<RetainedItem>,
    ) {
        let Some(removed) = &before.removed else {
            return;
        };
        let (erased, kept) = oubli::certificate::measure::removal_items(removed, |n| self.name(n));
        // A path the command names itself (`redact`, whose removal went
        // through the mount's own calls) is listed once, with the objects.
        for item in erased {
            match find_oids(items, retained, item.kind, &item.name) {
                Some(oids) => merge(oids, &item.object_ids),
                None => items.push(item),
            }
        }
        for item in kept {
            match find_oids(items, retained, item.kind, &item.name) {
                Some(oids) => merge(oids, &item.object_ids),
                None => retained.push(item),
            }
        }
        self.items_unlisted = removed.more;
    }
}

/// The object ids of the item (erased or retained) of this kind and name
/// already listed, if any.
fn find_oids<'a>(
    items: &'a mut [ErasedItem],
    retained: &'a mut [RetainedItem],
    kind: ItemKind,
    name: &str,
) -> Option<&'a mut Vec<u64>> {
    if let Some(i) = items.iter_mut().find(|i| i.kind == kind && i.name == name) {
        return Some(&mut i.object_ids);
    }
    retained
        .iter_mut()
        .find(|i| i.kind == kind && i.name == name)
        .map(|i| &mut i.object_ids)
}

/// Adds `more` to `oids`, each once.
fn merge(oids: &mut Vec<u64>, more: &[u64]) {
    for &oid in more {
        if !oids.contains(&oid) {
            oids.push(oid);
        }
    }
}

/// Reads the key and creates the file, before anything is erased. `erases`
/// is false for a command that would not erase (no `--purge`).
pub fn prepare(args: &CertArgs, erases: bool) -> Result<Option<Request>, Failure> {
    let Some(path) = &args.certificate else {
        return Ok(None);
    };
    if !erases {
        return Err(Failure::usage(
            "--certificate needs --purge: without it nothing is erased when the command returns, so there is nothing to certify",
        ));
    }
    let key_path = args
        .sign_key
        .as_ref()
        .ok_or_else(|| Failure::usage("--certificate needs --sign-key FILE"))?;
    let key = match key_path.to_str().filter(|k| k.starts_with("pkcs11:")) {
        Some(uri) => Signer::Token(token_key(uri)?),
        None => {
            let pem = std::fs::read_to_string(key_path)
                .map_err(|e| Failure::file(format!("cannot read {}", key_path.display()), e))?;
            let key = SigningKey::from_pkcs8_pem(&pem)
                .map_err(|e| Failure::usage(format!("{}: {e}", key_path.display())))?;
            drop(zeroize::Zeroizing::new(pem));
            Signer::File(key)
        }
    };
    let names = if args.hash_names {
        NameForm::SaltedSha256 {
            salt: hex::encode(cert::random_bytes::<16>()),
        }
    } else {
        NameForm::Plain
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Names of erased data may be personal data: the owner decides
        // who else reads the certificate.
        options.mode(0o600);
    }
    let file = options.open(path).map_err(|e| {
        Failure::new(
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                exit::EXISTS
            } else {
                exit::UNEXPECTED
            },
            format!("cannot create the certificate {}: {e}", path.display()),
            "give --certificate a new file in a writable directory (nothing was erased)",
        )
    })?;
    Ok(Some(Request {
        path: path.clone(),
        file: Some(file),
        share_vault: None,
        key,
        names,
        items_unlisted: 0,
    }))
}

#[cfg(feature = "tpm")]
use oubli::certificate::attestation::TpmEvidence;
/// Without TPM support no vault is a TPM's: there is no evidence to take.
#[cfg(not(feature = "tpm"))]
pub enum TpmEvidence {}

/// With a TPM vault (`tpm:...`): the TPM's certification of the slot that
/// holds epoch N's record, before the commit (docs/CERTIFICATE.md, "TPM
/// attestation"); `None` for any other vault.
fn tpm_evidence(
    g: &Global,
    password: Option<&oubli::SecretBytes>,
) -> Result<Option<TpmEvidence>, Failure> {
    #[cfg(feature = "tpm")]
    {
        let Some(location) = g.vault.to_str().filter(|v| v.starts_with("tpm:")) else {
            return Ok(None);
        };
        let asked;
        let password = match password {
            Some(p) => p,
            None => {
                asked = g.password()?;
                &asked
            }
        };
        TpmEvidence::before_commit(location, password, session::provider())
            .map_err(|e| g.fail(Error::Vault(e)))
    }
    #[cfg(not(feature = "tpm"))]
    {
        let _ = (g, password);
        Ok(None)
    }
}

/// `--sign-key pkcs11:URI`: the key in the token, opened now so that a
/// missing key, no PIN or a wrong one fails before anything is erased. The
/// URI is shown without its PIN.
fn token_key(uri: &str) -> Result<TokenKey, Failure> {
    let shown = oubli::crates::vault::Pkcs11Uri::parse(uri)
        .map(|u| u.redacted())
        .unwrap_or_else(|_| "the pkcs11: URI".into());
    TokenKey::open(uri).map_err(|e| {
        let message = format!("--sign-key {shown}: {e}");
        let code = match e {
            oubli::VaultError::Io(ref io) if io.kind() == std::io::ErrorKind::InvalidInput => {
                exit::USAGE
            }
            e => exit::exit_code(&Error::Vault(e)),
        };
        Failure::new(
            code,
            message,
            "nothing was erased; the key must be an Ed25519 key pair in the token, labelled as object= says",
        )
    })
}

/// What was pending erasure before the command's commit(s).
pub struct Tally {
    /// The store before anything: its epoch and vault record are the ones
    /// the certificate says ended.
    before: Measure,
    /// Everything the commit(s) erase, measured as late as possible.
    totals: EpochTotals,
    tpm: Option<TpmEvidence>,
}

fn measure(g: &Global, store: &Store) -> Result<Measure, Failure> {
    cert::measure::measure(store).map_err(|e| g.fail(e))
}

/// Opens the store for an erasing command. With a certificate asked for,
/// it first looks at the store read-only under the same exclusive lock:
/// opening for writing commits the intent log an earlier command left, and
/// what that commit erases belongs in the certificate too.
pub fn open(g: &Global, certify: bool) -> Result<(Session, Option<Tally>), Failure> {
    if !certify {
        return Ok((g.open(Access::Write)?, None));
    }
    g.require_store()?;
    let lock = g.lock(Access::Write)?;
    let password = g.password()?;
    let look = g.open_with(Access::Read, None, password.clone())?;
    let before = measure(g, &look.store)?;
    drop(look);
    let tpm = tpm_evidence(g, Some(&password))?;
    let session = g.open_with(Access::Write, lock, password)?;
    let tally = Tally {
        totals: before.pending.clone(),
        before,
        tpm,
    };
    Ok((session, Some(tally)))
}

impl Tally {
    /// Measures again right before the command's own commit. If opening
    /// committed, what it erased was measured before the open and adds up;
    /// otherwise this measure includes it.
    pub fn before_commit(&mut self, g: &Global, session: &Session) -> Result<(), Failure> {
        let now = measure(g, &session.store)?;
        self.totals = if session.committed_on_open() {
            cert::measure::add(&self.before.pending, &now.pending)
        } else {
            now.pending
        };
        Ok(())
    }
}

/// The features of this build and its crypto provider, as `oubli --version` shows them.
pub fn tool() -> Tool {
    Tool {
        name: "oubli".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        features: crate::features(),
        crypto_provider: session::provider().name().to_string(),
    }
}

fn medium(g: &Global) -> MediumKind {
    if g.remote.is_some() {
        MediumKind::S3
    } else if g.nand.is_some() {
        MediumKind::Nand
    } else {
        MediumKind::Directory
    }
}

/// After the command's commit: audits, then [`write`]s the certificate.
pub fn finish(
    request: Request,
    g: &Global,
    session: &Session,
    tally: Tally,
    command: &str,
    items: Vec<ErasedItem>,
    retained: Vec<RetainedItem>,
) -> Result<String, Failure> {
    let after = measure(g, &session.store)?;
    write(
        request,
        g,
        (&tally.before, tally.totals, &after, tally.tpm.as_ref()),
        command,
        items,
        retained,
    )
}

/// Builds the certificate of what happened between `before` and `after`
/// (erasing `totals`), signs it and writes it. Returns the line to print.
/// A failed audit still writes the certificate (its outcome says `fail`),
/// then fails with exit 10.
pub fn write(
    mut request: Request,
    g: &Global,
    (before, totals, after, tpm): (&Measure, EpochTotals, &Measure, Option<&TpmEvidence>),
    command: &str,
    items: Vec<ErasedItem>,
    retained: Vec<RetainedItem>,
) -> Result<String, Failure> {
    let statement = Statement {
        command: command.into(),
        names: request.names.clone(),
        items,
        items_unlisted: request.items_unlisted,
        retained,
        totals,
        medium: medium(g),
        location: g.store_shown().display().to_string(),
        tool: tool(),
        share_vault: request.share_vault.clone(),
    };
    // Mutable for the TPM's attestation (a build without TPM support has none).
    #[cfg_attr(not(feature = "tpm"), allow(unused_mut))]
    let mut certificate = cert::measure::build(before, after, statement);
    if let Some(evidence) = tpm {
        // Last: the TPM's attestation is bound to every other field.
        #[cfg(feature = "tpm")]
        {
            certificate.vault_attestation = Some(
                evidence
                    .attest(&certificate)
                    .map_err(|e| g.fail(Error::Vault(e)))?,
            );
        }
        #[cfg(not(feature = "tpm"))]
        match *evidence {}
    }
    let outcome = certificate.verification.outcome;
    let signed = request.key.sign(certificate).map_err(|e| {
        Failure::new(
            exit::VAULT,
            format!("the erasure is done, but the token could not sign the certificate: {e}"),
            "the certificate was not written; see `oubli audit` for the erasure itself",
        )
    })?;
    let mut file = request.file.take().expect("written once");
    let written = file
        .write_all(signed.to_json().as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        request.file = Some(file);
        return Err(Failure::file(
            format!(
                "the erasure is done, but writing the certificate {} failed",
                request.path.display()
            ),
            e,
        ));
    }
    let c = &signed.certificate;
    let category = match c.method.category {
        cert::Category::Purge => "cryptographic erase, a Purge".to_string(),
        cert::Category::Clear => format!(
            "cryptographic erase, NOT a Purge (a {} vault may keep old copies of the key)",
            c.method.vault_kind
        ),
    };
    let shown = request.path.display().to_string();
    if outcome == Outcome::Fail {
        return Err(Failure::new(
            exit::LEAKED,
            format!(
                "wrote the certificate {shown}, but its verification FAILED: {} deleted unit(s) still open, older vault key(s) of epoch(s) {:?}, vault at epoch {} (was {})",
                after.leaked_units, after.vault_leftover_epochs, after.vault_epoch, before.vault_epoch
            ),
            "run `oubli audit` for the details; the certificate records the failure",
        ));
    }
    Ok(format!(
        "wrote the certificate {shown}: {category}; audit passed\n"
    ))
}

/// A measure by the process (mount) holding the store, through its control
/// socket; `None` when no process holds it.
pub fn measure_live(g: &Global) -> Result<Option<Measure>, Failure> {
    let Some(reply) = g.control("certify-measure")? else {
        return Ok(None);
    };
    let text = reply.map_err(|e| g.control_failure(e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| g.control_failure(format!("unreadable measure ({e}): {text}")))
}

/// A certified commit by the process holding the store: measure, `purge`,
/// measure, write. Hands the request back when no process holds the store.
/// A mount's measure names what it removed since its last commit: those
/// paths join the command's items (the commit erases them).
pub fn purge_live(
    mut request: Request,
    g: &Global,
    command: &str,
    mut items: Vec<ErasedItem>,
    mut retained: Vec<RetainedItem>,
) -> Result<Result<String, Request>, Failure> {
    let Some(before) = measure_live(g)? else {
        return Ok(Err(request));
    };
    request.add_removed(&before, &mut items, &mut retained);
    let tpm = tpm_evidence(g, None)?;
    let reply = g.control("purge")?.ok_or_else(|| gone(g))?;
    reply.map_err(|e| g.control_failure(e))?;
    let after = measure_live_required(g)?;
    let totals = before.pending.clone();
    let measures = (&before, totals, &after, tpm.as_ref());
    write(request, g, measures, command, items, retained).map(Ok)
}

fn gone(g: &Global) -> Failure {
    Failure::usage(format!(
        "the process holding {} went away before the certificate was complete",
        g.store_shown().display()
    ))
}

/// `oubli umount --certificate`, after the mount process's final commit
/// and exit: opens the store (so the password is needed), commits if that
/// final commit did not (nothing had changed), and measures the erasure
/// against `before`, taken through the control socket before unmounting.
/// The paths the mount removed since its last commit (in `before`) are the
/// certificate's items.
pub fn after_unmount(
    mut request: Request,
    g: &Global,
    before: &Unmounting,
) -> Result<String, Failure> {
    let session = g.open(Access::Write)?;
    if session.store.epoch() <= before.measure.epoch {
        session.store.commit().map_err(|e| g.fail(e))?;
    }
    let after = measure(g, &session.store)?;
    let totals = before.measure.pending.clone();
    let measures = (&before.measure, totals, &after, before.tpm.as_ref());
    let (mut items, mut retained) = (Vec::new(), Vec::new());
    request.add_removed(&before.measure, &mut items, &mut retained);
    write(request, g, measures, "oubli umount", items, retained)
}

/// What `oubli umount --certificate` takes before unmounting.
pub struct Unmounting {
    measure: Measure,
    tpm: Option<TpmEvidence>,
}

/// Before `oubli umount` unmounts: the mount's measure (and the TPM's
/// evidence). `None` when no mount process answers.
pub fn before_unmount(g: &Global) -> Result<Option<Unmounting>, Failure> {
    let Some(measure) = measure_live(g)? else {
        return Ok(None);
    };
    let tpm = tpm_evidence(g, None)?;
    Ok(Some(Unmounting { measure, tpm }))
}

/// [`measure_live`] where a live process is required.
pub fn measure_live_required(g: &Global) -> Result<Measure, Failure> {
    measure_live(g)?.ok_or_else(|| gone(g))
}

/// The objects whose data `store` holds in the live tree or any snapshot
/// for `oids`: the sizes the certificate states (before they go).
pub fn object_bytes(store: &Store, oids: &[u64]) -> u64 {
    let mut total = 0;
    for &oid in oids {
        if let Ok(size) = store.size(oid) {
            total += size;
            continue;
        }
        // Only in a snapshot: the first that holds it tells its size.
        for name in store.snapshots().into_iter().map(|s| s.name) {
            if let Ok(size) = store.snapshot(&name).and_then(|view| view.size(oid)) {
                total += size;
                break;
            }
        }
    }
    total
}

/// The bytes of the regular files at or under `path` (not following
/// symbolic links): what a redaction of `path` in a live mount erases.
pub fn path_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| path_bytes(&entry.path()))
                .sum()
        })
        .unwrap_or(0)
}

/// `oubli certificate verify|show`.
pub fn run(g: &Global, store_given: bool, command: CertificateCommand) -> Result<String, Failure> {
    match command {
        CertificateCommand::Verify { file, public_key } => {
            verify(g, store_given, &file, public_key.as_deref())
        }
        CertificateCommand::Show { file, html } => {
            let signed = read(&file)?;
            Ok(if html {
                cert::render::html(&signed)
            } else {
                cert::render::text(&signed)
            })
        }
    }
}

fn not_verified(file: &Path, why: impl std::fmt::Display) -> Failure {
    Failure::new(
        exit::LEAKED,
        format!("certificate {} does not verify: {why}", file.display()),
        "do not rely on it; see docs/CERTIFICATE.md for what each check means",
    )
}

fn read(file: &Path) -> Result<SignedCertificate, Failure> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::file(format!("cannot read {}", file.display()), e))?;
    SignedCertificate::from_json(&text).map_err(|e| not_verified(file, e))
}

/// The TPM's attestation, where there is one: checked by the TPM code,
/// without the TPM (the attestation key's public part is in it).
fn check_attestation(signed: &SignedCertificate) -> Result<Option<String>, String> {
    cert::attestation::check(&signed.certificate)
}

fn verify(
    g: &Global,
    store_given: bool,
    file: &Path,
    public_key: Option<&Path>,
) -> Result<String, Failure> {
    let trusted = match public_key {
        None => None,
        Some(path) => {
            let pem = std::fs::read_to_string(path)
                .map_err(|e| Failure::file(format!("cannot read {}", path.display()), e))?;
            Some(
                public_key_from_pem(&pem)
                    .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
            )
        }
    };
    let signed = read(file)?;
    let signer = check_signature(&signed, trusted.as_ref()).map_err(|e| not_verified(file, e))?;
    let attested = check_attestation(&signed).map_err(|e| not_verified(file, e))?;
    let c = &signed.certificate;
    let mut out = format!(
        "certificate {}: signature valid, by key SHA-256 {signer}{}\n",
        file.display(),
        if trusted.is_some() {
            " (the key given with --public-key)"
        } else {
            " (NOT checked against a key you trust: give --public-key)"
        }
    );
    if let Some(attested) = attested {
        out += &format!("{attested}\n");
    }
    if c.verification.outcome == Outcome::Fail {
        return Err(not_verified(file, "it records that its own audit failed"));
    }
    if store_given {
        let now = store_now(g, &signed)?;
        let problems = check_against_store(&signed, &now);
        if !problems.is_empty() {
            crate::emit(&out)?;
            return Err(not_verified(file, problems.join("; ")));
        }
        out += &format!(
            "store {}: at epoch {}, past epoch {}; the vault's record is not epoch {}'s; nothing erased is back; the audit opens no deleted unit\n",
            g.store_shown().display(),
            now.store_epoch.unwrap_or(now.vault_epoch),
            c.store.epoch_before,
            c.store.epoch_before
        );
    }
    Ok(out)
}

/// The store and its vault as they are now.
fn store_now(g: &Global, signed: &SignedCertificate) -> Result<StoreNow, Failure> {
    g.require_store()?;
    let _lock = g.lock(Access::Read)?;
    let provider = session::provider();
    let password = g.password()?;
    let vault = std::sync::Arc::new(g.open_vault_at(&g.vault, &password, &provider)?);
    let record = vault.load().map_err(|e| g.fail(Error::Vault(e)))?;
    let mut now = StoreNow {
        store_id: hex::encode(record.store_id),
        vault_epoch: record.epoch,
        vault_record_digest: hex::encode(cert::record_digest(&record)),
        ..StoreNow::default()
    };
    // A TPM vault certifies its NV indices again, now: does any hold epoch
    // N's record (a TPM whose NV memory was rolled back)? Asked before the
    // store is opened: a rolled-back vault does not open it.
    #[cfg(feature = "tpm")]
    if let Some(location) = g.vault.to_str().filter(|v| v.starts_with("tpm:")) {
        use oubli::certificate::attestation::{check_now, open_tpm};
        let failed = |e| g.fail(Error::Vault(e));
        if let Some(tpm) = open_tpm(location, &password, provider.clone()).map_err(failed)? {
            now.attestation_problems = check_now(&tpm, &signed.certificate).map_err(failed)?;
        }
    }
    let store = match g.open_store(vault.clone(), Access::Read, &provider) {
        Ok(store) => store,
        // A vault older than the store: the rollback the check reports.
        Err(Error::VaultBehind { .. } | Error::Rollback { .. }) => return Ok(now),
        Err(e) => return Err(g.fail(e)),
    };
    store.set_share_opener(g.share_opener(&password, &provider));
    now.store_id = hex::encode(store.store_id());
    now.store_epoch = Some(store.epoch());
    let c = &signed.certificate;
    // Removed objects must be gone; a destroyed share's objects stay,
    // unreadable without its key, and the audit below speaks for them.
    let removed = c.erased.items.iter().filter(|i| i.kind != ItemKind::Share);
    for item in removed {
        for &oid in &item.object_ids {
            if store.exists(oid).map_err(|e| g.fail(e))? {
                now.objects_present.push(oid);
            }
        }
    }
    // Names may be used again: only a snapshot taken by epoch N, or a live
    // share made before the certificate, can be the one it says is gone.
    now.snapshots = store
        .snapshots()
        .into_iter()
        .filter(|s| s.epoch <= c.store.epoch_before)
        .map(|s| s.name)
        .collect();
    let issued = c
        .issued_at
        .parse::<jiff::Timestamp>()
        .map_or(u64::MAX, |t| t.as_second().max(0) as u64);
    now.live_shares = store
        .shares()
        .into_iter()
        .filter(|s| s.destroyed_at.is_none() && s.created_at <= issued)
        .map(|s| s.name)
        .collect();
    let audit = store.audit().map_err(|e| g.fail(e))?;
    now.leaked_units = audit.leaked_units as u64;
    now.vault_leftover_epochs = audit.vault_leftover_epochs;
    Ok(now)
}
