//! `Pkcs11Vault`: the sealed epoch-key record as a private data object on a PKCS#11 token (smart card, HSM).
//!
//! The record is the same 176-byte sealed slot as the file vault's
//! (password-wrapped with Argon2id), stored as the value of a `CKO_DATA`
//! object that is a token object, private (only readable after login with
//! the user PIN) and labelled with the URI's `object=` (default
//! [`DEFAULT_OBJECT_LABEL`]). A rotation creates the new object, then
//! destroys the old one; after a crash in between both exist and the higher
//! generation wins. Layout: docs/FORMAT-vault.md ("PKCS#11 object layout").

use crate::format::{Slot, SlotFault};
use crate::kdf::KdfParams;
use crate::pkcs11_uri::Pkcs11Uri;
use crate::sealed::{self, KekState};
use crate::worker::{Conn, Worker};
use crate::{RotationHook, RotationStep};
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::object::{Attribute, AttributeType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot as CkSlot;
use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Label of the vault's objects when the URI names none.
pub const DEFAULT_OBJECT_LABEL: &str = "oubli-epoch-key";

/// `CKA_APPLICATION` of the vault's objects: tells them apart from other
/// data objects that happen to share the label.
pub const APPLICATION: &str = "oubli";

/// Rated write/erase cycles assumed for a hardware token's EEPROM/flash:
/// smart-card secure elements are commonly specified for 500,000 cycles.
/// One rotation writes one object and frees another.
/// See docs/FORMAT-vault.md ("Endurance").
pub const TOKEN_ENDURANCE_WRITES: u64 = 500_000;

/// Default deadline for one token operation (a login on a smart card can
/// take a second or two; a token pulled mid-command may never answer).
pub const DEFAULT_PKCS11_TIMEOUT: Duration = Duration::from_secs(30);

/// Where modules named by `module-name=` are looked for (p11-kit's and
/// Debian's usual places).
const MODULE_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/pkcs11",
    "/usr/lib/aarch64-linux-gnu/pkcs11",
    "/usr/lib/pkcs11",
    "/usr/lib64/pkcs11",
    "/usr/lib/softhsm",
];

/// Knobs of a PKCS#11 vault handle.
#[derive(Clone, Debug)]
pub struct Pkcs11Options {
    /// Deadline for one token operation (see [`DEFAULT_PKCS11_TIMEOUT`]).
    pub timeout: Duration,
}

impl Default for Pkcs11Options {
    fn default() -> Self {
        Pkcs11Options {
            timeout: DEFAULT_PKCS11_TIMEOUT,
        }
    }
}

/// One loaded module per path, initialized once and kept for the life of
/// the process: `C_Initialize` may be called only once per process, and
/// `C_Finalize` would pull the library from under any other open vault.
fn module(path: &Path) -> Result<Pkcs11, VaultError> {
    static MODULES: OnceLock<Mutex<HashMap<PathBuf, Pkcs11>>> = OnceLock::new();
    let mut modules = MODULES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(m) = modules.get(path) {
        return Ok(m.clone());
    }
    if !path.is_file() {
        return Err(VaultError::Unavailable(format!(
            "PKCS#11 module {} not found",
            path.display()
        )));
    }
    let m = Pkcs11::new(path).map_err(|e| {
        VaultError::Unavailable(format!(
            "cannot load PKCS#11 module {}: {e}",
            path.display()
        ))
    })?;
    match m.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => {
            return Err(VaultError::Unavailable(format!(
                "cannot initialize PKCS#11 module {}: {e}",
                path.display()
            )))
        }
    }
    modules.insert(path.to_path_buf(), m.clone());
    Ok(m)
}

/// One lock per module path: every call into a module is serialized within
/// the process. PKCS#11 modules differ in how well they cope with
/// concurrent sessions (SoftHSM 2.6 fails object creation now and then with
/// CKR_GENERAL_ERROR when two sessions create token objects at once), and a
/// vault makes one small call per commit, so nothing is lost by queuing.
fn module_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path.to_path_buf())
        .or_default()
        .clone()
}

fn module_path(uri: &Pkcs11Uri) -> Result<PathBuf, VaultError> {
    if let Some(p) = &uri.module_path {
        return Ok(p.clone());
    }
    let name = uri.module_name.as_deref().ok_or_else(|| {
        VaultError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{}: name the PKCS#11 module with module-path= or module-name=",
                uri.redacted()
            ),
        ))
    })?;
    for dir in MODULE_DIRS {
        for file in [
            format!("{name}.so"),
            format!("lib{name}.so"),
            name.to_string(),
        ] {
            let p = Path::new(dir).join(file);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(VaultError::Unavailable(format!(
        "PKCS#11 module `{name}` not found in {}",
        MODULE_DIRS.join(", ")
    )))
}

/// The PIN: `pin-value` in the URI, else `$OUBLI_PIN`, else the vault password.
pub fn resolve_pin(uri: &Pkcs11Uri, password: &SecretBytes) -> SecretBytes {
    if let Some(pin) = &uri.pin_value {
        return pin.clone();
    }
    if let Some(pin) = std::env::var_os("OUBLI_PIN") {
        return SecretBytes::new(pin.into_encoded_bytes());
    }
    password.clone()
}

/// What the device thread keeps: an RW session, logged in.
struct TokenConn {
    session: Session,
}

/// The token side of a vault handle: everything a device job needs.
#[derive(Clone)]
struct Target {
    uri: Arc<Pkcs11Uri>,
    module: PathBuf,
    lock: Arc<Mutex<()>>,
    label: String,
    pin: Arc<SecretBytes>,
}

impl Target {
    /// The object the URI names (`default_label` when it names none) and a
    /// device thread that connects to its token; nothing is opened until
    /// the first job. `what` starts the thread's name.
    fn open(
        uri: &Pkcs11Uri,
        pin: &SecretBytes,
        default_label: &str,
        what: &str,
        options: &Pkcs11Options,
    ) -> Result<(Target, Worker<TokenConn>), VaultError> {
        let module = module_path(uri)?;
        let target = Target {
            uri: Arc::new(uri.clone()),
            lock: module_lock(&module),
            module,
            label: uri
                .object
                .clone()
                .unwrap_or_else(|| default_label.to_string()),
            pin: Arc::new(resolve_pin(uri, pin)),
        };
        let t = target.clone();
        let worker = Worker::new(
            format!("{what} {}", uri.token.as_deref().unwrap_or("token")),
            options.timeout,
            true,
            Arc::new(move || t.connect()),
        );
        Ok((target, worker))
    }

    /// Holds the module's lock for one job (see [`module_lock`]).
    fn exclusive(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn place(&self) -> String {
        self.uri.redacted()
    }

    /// Finds the one slot whose token matches the URI.
    fn find_slot(&self, m: &Pkcs11) -> Result<CkSlot, VaultError> {
        let slots = m
            .get_slots_with_token()
            .map_err(|e| map_ck(e, "list slots"))?;
        let mut found = Vec::new();
        for slot in slots {
            if let Some(id) = self.uri.slot_id {
                if slot.id() != id {
                    continue;
                }
            }
            let info = match m.get_token_info(slot) {
                Ok(info) => info,
                // A token that vanished between the two calls.
                Err(_) => continue,
            };
            let matches = |want: &Option<String>, have: &str| {
                want.as_deref().is_none_or(|w| w == have.trim_end())
            };
            if matches(&self.uri.token, info.label())
                && matches(&self.uri.manufacturer, info.manufacturer_id())
                && matches(&self.uri.serial, info.serial_number())
                && matches(&self.uri.model, info.model())
            {
                found.push(slot);
            }
        }
        match found.len() {
            1 => Ok(found[0]),
            // No such token now: unplugged, or a reader without its card.
            0 => Err(VaultError::Unavailable(format!(
                "no token matching {} is present",
                self.place()
            ))),
            n => Err(VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{n} tokens match {}: add serial= or slot-id= to pick one",
                    self.place()
                ),
            ))),
        }
    }

    fn connect(&self) -> Result<TokenConn, VaultError> {
        let m = module(&self.module)?;
        let slot = self.find_slot(&m)?;
        let session = m
            .open_rw_session(slot)
            .map_err(|e| map_ck(e, "open a session"))?;
        let pin = cryptoki::types::RawAuthPin::new(Box::new(self.pin.expose().to_vec()));
        match session.login_with_raw(UserType::User, &pin) {
            // Login state is shared by every session of the process on a
            // token: another handle may have logged in already.
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
            Err(e) => return Err(map_ck(e, "log in")),
        }
        Ok(TokenConn { session })
    }

    fn template(&self) -> Vec<Attribute> {
        vec![
            Attribute::Class(ObjectClass::DATA),
            Attribute::Token(true),
            Attribute::Label(self.label.as_bytes().to_vec()),
            Attribute::Application(APPLICATION.as_bytes().to_vec()),
        ]
    }

    /// Every vault object on the token with its sealed slot.
    fn read_objects(&self, session: &Session) -> Result<Vec<FoundObject>, VaultError> {
        let handles = session
            .find_objects(&self.template())
            .map_err(|e| map_ck(e, "find objects"))?;
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            let attrs = session
                .get_attributes(h, &[AttributeType::Value])
                .map_err(|e| map_ck(e, "read an object"))?;
            let value = attrs.into_iter().find_map(|a| match a {
                Attribute::Value(v) => Some(v),
                _ => None,
            });
            let slot = match value {
                Some(v) => sealed::parse_exact(&v),
                None => Err(SlotFault::BadHeader("object has no value".into())),
            };
            out.push((h, slot));
        }
        Ok(out)
    }

    fn current(
        &self,
        session: &Session,
        state: &KekState,
        provider: &dyn CryptoProvider,
    ) -> Result<(sealed::Current, Vec<ObjectHandle>), VaultError> {
        let objects = self.read_objects(session)?;
        if objects.is_empty() {
            return Err(VaultError::Missing(self.place()));
        }
        let (handles, slots): (Vec<_>, Vec<_>) = objects.into_iter().unzip();
        let current = sealed::current(&self.place(), &slots, &object_name, state, provider)?;
        Ok((current, handles))
    }

    fn create_object(&self, session: &Session, slot: Vec<u8>) -> Result<ObjectHandle, VaultError> {
        let mut template = self.template();
        template.extend([
            // Only readable after login with the user PIN.
            Attribute::Private(true),
            // Never changed in place: a rotation makes a new object.
            Attribute::Modifiable(false),
            Attribute::Value(slot),
        ]);
        session
            .create_object(&template)
            .map_err(|e| map_ck(e, "create the record object"))
    }
}

/// A vault object on the token and what its value parsed to.
type FoundObject = (ObjectHandle, Result<Slot, SlotFault>);

fn object_name(i: usize) -> String {
    format!("object {i}")
}

/// Drops the session after failures that may have broken it, so the next
/// job reconnects (a re-inserted token gets a new session).
fn reset_on_unavailable<T>(
    conn: &mut Conn<TokenConn>,
    result: Result<T, VaultError>,
) -> Result<T, VaultError> {
    if matches!(result, Err(VaultError::Unavailable(_))) {
        conn.reset();
    }
    result
}

/// The epoch key as a private data object on a PKCS#11 token.
pub struct Pkcs11Vault {
    target: Target,
    provider: Arc<dyn CryptoProvider>,
    state: Arc<KekState>,
    worker: Worker<TokenConn>,
    info: VaultInfo,
    hook: Arc<Mutex<Option<RotationHook>>>,
}

impl std::fmt::Debug for Pkcs11Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pkcs11Vault")
            .field("uri", &self.target.place())
            .field("provider", &self.provider.name())
            .field("kek", &"<redacted>")
            .field("pin", &"<redacted>")
            .finish()
    }
}

impl Pkcs11Vault {
    /// Creates the vault's first object on the token named by `uri`.
    ///
    /// Fails with an `AlreadyExists` I/O error if the token already holds
    /// an object with the vault's label. `password` seals the record (and is
    /// the PIN when neither the URI nor `$OUBLI_PIN` gives one).
    pub fn create(
        uri: &Pkcs11Uri,
        password: &SecretBytes,
        params: KdfParams,
        record: &VaultRecord,
        provider: Arc<dyn CryptoProvider>,
        options: Pkcs11Options,
    ) -> Result<Pkcs11Vault, VaultError> {
        let state = Arc::new(KekState::fresh(password, params, &*provider)?);
        let mut vault = Self::handle(uri, password, provider, state, &options)?;
        let header = sealed::first_header(&vault.state, &*vault.provider);
        let slot = sealed::seal(&*vault.provider, &vault.state, &header, record);
        let target = vault.target.clone();
        vault.worker.run(move |conn| {
            let _module = target.exclusive();
            let result = (|| {
                let session = &conn.get()?.session;
                if !session
                    .find_objects(&target.template())
                    .map_err(|e| map_ck(e, "find objects"))?
                    .is_empty()
                {
                    return Err(VaultError::Io(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} already holds a vault object", target.place()),
                    )));
                }
                target.create_object(session, slot)?;
                Ok(())
            })();
            reset_on_unavailable(conn, result)
        })?;
        vault.info = vault.query_info()?;
        vault.load()?;
        Ok(vault)
    }

    /// Opens the vault on the token named by `uri`: logs in (PIN from the
    /// URI, `$OUBLI_PIN` or `password`), reads the record objects and derives
    /// the KEK from `password`.
    pub fn open(
        uri: &Pkcs11Uri,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
        options: Pkcs11Options,
    ) -> Result<Pkcs11Vault, VaultError> {
        // The KEK's salt is in the object: read first, derive after.
        let placeholder = Arc::new(KekState::derive(
            &SecretBytes::new(Vec::new()),
            [0; crate::SALT_LEN],
            KdfParams::testing(),
        )?);
        let probe = Self::handle(uri, password, provider.clone(), placeholder, &options)?;
        let target = probe.target.clone();
        let slots = probe.worker.run(move |conn| {
            let _module = target.exclusive();
            let result = (|| {
                let session = &conn.get()?.session;
                let objects = target.read_objects(session)?;
                if objects.is_empty() {
                    return Err(VaultError::Missing(target.place()));
                }
                Ok(objects.into_iter().map(|(_, s)| s).collect::<Vec<_>>())
            })();
            reset_on_unavailable(conn, result)
        })?;
        let state = sealed::unlock(&uri.redacted(), &slots, &object_name, password, &*provider)?;
        let mut vault = Pkcs11Vault {
            state: Arc::new(state),
            ..probe
        };
        vault.info = vault.query_info()?;
        vault.load()?;
        Ok(vault)
    }

    fn handle(
        uri: &Pkcs11Uri,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
        state: Arc<KekState>,
        options: &Pkcs11Options,
    ) -> Result<Pkcs11Vault, VaultError> {
        let (target, worker) =
            Target::open(uri, password, DEFAULT_OBJECT_LABEL, "pkcs11", options)?;
        Ok(Pkcs11Vault {
            info: VaultInfo {
                kind: "pkcs11".into(),
                location: target.place(),
                endurance_writes: Some(TOKEN_ENDURANCE_WRITES),
                overwrite_is_erasure: true,
            },
            target,
            provider,
            state,
            worker,
            hook: Arc::new(Mutex::new(None)),
        })
    }

    /// Whether the token is a software token (SoftHSM, or a slot the module
    /// does not flag as hardware): its objects are files on the host.
    pub fn is_software_token(&self) -> bool {
        !self.info.overwrite_is_erasure
    }

    /// See [`TpmVault::set_rotation_hook`](crate::TpmVault::set_rotation_hook).
    pub fn set_rotation_hook(&self, hook: Option<RotationHook>) {
        *self.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// Destroys every vault object on the token: the record is gone for good.
    pub fn destroy(self) -> Result<(), VaultError> {
        let target = self.target.clone();
        self.worker.run(move |conn| {
            let _module = target.exclusive();
            let session = &conn.get()?.session;
            for (h, _) in target.read_objects(session)? {
                session
                    .destroy_object(h)
                    .map_err(|e| map_ck(e, "destroy an object"))?;
            }
            Ok(())
        })
    }

    fn query_info(&self) -> Result<VaultInfo, VaultError> {
        let target = self.target.clone();
        let software = self.worker.run(move |_conn| {
            let _module = target.exclusive();
            let m = module(&target.module)?;
            let slot = target.find_slot(&m)?;
            let slot_info = m.get_slot_info(slot).map_err(|e| map_ck(e, "slot info"))?;
            let token = m
                .get_token_info(slot)
                .map_err(|e| map_ck(e, "token info"))?;
            Ok(!slot_info.hardware_slot() || token.manufacturer_id().contains("SoftHSM"))
        })?;
        Ok(VaultInfo {
            kind: "pkcs11".into(),
            location: self.target.place(),
            endurance_writes: (!software).then_some(TOKEN_ENDURANCE_WRITES),
            overwrite_is_erasure: !software,
        })
    }

    /// Runs `job` on the token's thread, holding the module exclusively,
    /// with the session, the target, the KEK and the provider; a transport
    /// failure drops the connection so the next job reconnects.
    fn in_session<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Session, &Target, &KekState, &dyn CryptoProvider) -> Result<T, VaultError>
            + Send
            + 'static,
    ) -> Result<T, VaultError> {
        let target = self.target.clone();
        let state = self.state.clone();
        let provider = self.provider.clone();
        self.worker.run(move |conn| {
            let _module = target.exclusive();
            let result = conn
                .get()
                .and_then(|c| job(&c.session, &target, &state, &*provider));
            reset_on_unavailable(conn, result)
        })
    }

    fn read_current(&self) -> Result<sealed::Current, VaultError> {
        self.in_session(|session, target, state, provider| {
            Ok(target.current(session, state, provider)?.0)
        })
    }
}

impl Vault for Pkcs11Vault {
    fn info(&self) -> VaultInfo {
        self.info.clone()
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        Ok(self.read_current()?.record)
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        let target = self.target.clone();
        let state = self.state.clone();
        let provider = self.provider.clone();
        let hook = self.hook.clone();
        let record = record.clone();
        self.worker.run(move |conn| {
            let _module = target.exclusive();
            let result = (|| {
                let session = &conn.get()?.session;
                let (current, handles) = target.current(session, &state, &*provider)?;
                sealed::check_same_store(&target.place(), &current, &record)?;
                call_hook(&hook, RotationStep::Start)?;
                let header = sealed::next_header(&current, &state, &*provider)?;
                let slot = sealed::seal(&*provider, &state, &header, &record);
                // New object first: until it exists, the old one is the record.
                target.create_object(session, slot)?;
                call_hook(&hook, RotationStep::NewRecordWritten)?;
                // Then every older object, including leftovers of an
                // earlier rotation cut short.
                for h in handles {
                    session
                        .destroy_object(h)
                        .map_err(|e| map_ck(e, "destroy the old record"))?;
                }
                call_hook(&hook, RotationStep::OldRecordCleared)
            })();
            reset_on_unavailable(conn, result)
        })
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        Ok(self.read_current()?.header.write_count)
    }

    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        self.in_session(|session, target, state, provider| {
            let slots: Vec<_> = target
                .read_objects(session)?
                .into_iter()
                .map(|(_, slot)| slot)
                .collect();
            Ok(sealed::readable_records(&slots, state, provider))
        })
    }

    /// Destroys every vault object on the token but the current record's.
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        self.in_session(|session, target, state, provider| {
            let objects = target.read_objects(session)?;
            if objects.is_empty() {
                return Err(VaultError::Missing(target.place()));
            }
            let (handles, slots): (Vec<_>, Vec<_>) = objects.into_iter().unzip();
            let place = target.place();
            let current = sealed::current(&place, &slots, &object_name, state, provider)?;
            // Every object oubli made holds a record: none is blank.
            for i in sealed::leftover_indices(&place, &slots, &current, &|_| false)? {
                session
                    .destroy_object(handles[i])
                    .map_err(|e| map_ck(e, "destroy a leftover record"))?;
            }
            Ok(())
        })
    }
}

fn call_hook(hook: &Mutex<Option<RotationHook>>, step: RotationStep) -> Result<(), VaultError> {
    let hook = hook.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match hook {
        Some(h) => h(step),
        None => Ok(()),
    }
}

/// Maps a PKCS#11 error: a removed or failing token, a lost session or a
/// busy library are `Unavailable` (the engine keeps the epoch open and
/// retries); a refused PIN is `WrongPassword`.
fn map_ck(e: CkError, what: &str) -> VaultError {
    let msg = format!("PKCS#11: {what}: {e}");
    match &e {
        CkError::Pkcs11(rv, _) => match rv {
            RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange => {
                VaultError::WrongPassword
            }
            RvError::PinLocked => VaultError::Unavailable(format!(
                "{msg} (the user PIN is locked after wrong attempts: the token's SO must unlock it)"
            )),
            RvError::DeviceRemoved
            | RvError::DeviceError
            | RvError::DeviceMemory
            | RvError::TokenNotPresent
            | RvError::TokenNotRecognized
            | RvError::SessionClosed
            | RvError::SessionHandleInvalid
            | RvError::SessionCount
            | RvError::UserNotLoggedIn
            | RvError::GeneralError
            | RvError::FunctionFailed
            | RvError::HostMemory
            | RvError::CryptokiNotInitialized
            | RvError::FunctionCanceled
            | RvError::SlotIdInvalid => VaultError::Unavailable(msg),
            _ => VaultError::Corrupt(msg),
        },
        CkError::LibraryLoading(_) | CkError::NullFunctionPointer | CkError::MissingSymbol(_) => {
            VaultError::Unavailable(msg)
        }
        _ => VaultError::Corrupt(msg),
    }
}

// ---- Signing with a key that never leaves the token (certificates) ----

/// Label of the signing key when the URI names none (`object=`).
pub const DEFAULT_SIGNING_KEY_LABEL: &str = "oubli-certificate-key";

/// `CKA_EC_PARAMS` of an Ed25519 key: the DER OID 1.3.101.112 (RFC 8410),
/// the form PKCS#11 3.0 and SoftHSM2 accept.
const ED25519_OID_DER: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];

/// An Ed25519 private key on a PKCS#11 token that signs certificates of
/// sanitization (`--sign-key pkcs11:...`): the key is generated inside the
/// token, not extractable, and used after login with the user PIN.
///
/// The URI names the token as for a vault, and the key pair by its label
/// (`object=`, default [`DEFAULT_SIGNING_KEY_LABEL`]). The PIN is the URI's
/// `pin-value`, else `$OUBLI_PIN`, else the `pin` given to [`open`](Self::open).
pub struct TokenSigner {
    target: Target,
    worker: Worker<TokenConn>,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("uri", &self.target.place())
            .field("label", &self.target.label)
            .field("pin", &"<redacted>")
            .finish()
    }
}

impl TokenSigner {
    /// A handle on the signing key the URI names; nothing is checked until
    /// the first call (use [`public_key`](Self::public_key) to check).
    pub fn open(
        uri: &Pkcs11Uri,
        pin: &SecretBytes,
        options: Pkcs11Options,
    ) -> Result<TokenSigner, VaultError> {
        let (target, worker) = Target::open(
            uri,
            pin,
            DEFAULT_SIGNING_KEY_LABEL,
            "pkcs11 signer",
            &options,
        )?;
        Ok(TokenSigner { target, worker })
    }

    /// Generates the Ed25519 key pair inside the token (private key
    /// sensitive, not extractable, sign only); returns its public key.
    /// Fails with `AlreadyExists` if a key with the label is there.
    pub fn generate(&self) -> Result<[u8; 32], VaultError> {
        let target = self.target.clone();
        self.run(move |session| {
            if !session
                .find_objects(&target.key_template(ObjectClass::PRIVATE_KEY))
                .map_err(|e| map_ck(e, "find keys"))?
                .is_empty()
            {
                return Err(VaultError::Io(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "{} already holds a signing key labelled {:?}",
                        target.place(),
                        target.label
                    ),
                )));
            }
            let label = Attribute::Label(target.label.as_bytes().to_vec());
            let public = [
                Attribute::Token(true),
                Attribute::Verify(true),
                Attribute::EcParams(ED25519_OID_DER.to_vec()),
                label.clone(),
            ];
            let private = [
                Attribute::Token(true),
                Attribute::Private(true),
                Attribute::Sensitive(true),
                Attribute::Extractable(false),
                Attribute::Sign(true),
                label,
            ];
            session
                .generate_key_pair(
                    &cryptoki::mechanism::Mechanism::EccEdwardsKeyPairGen,
                    &public,
                    &private,
                )
                .map_err(|e| map_ck(e, "generate an Ed25519 key pair"))?;
            target.public_key(session)
        })
    }

    /// The public key of the pair (from the token's public-key object).
    pub fn public_key(&self) -> Result<[u8; 32], VaultError> {
        let target = self.target.clone();
        self.run(move |session| target.public_key(session))
    }

    /// Signs `message` with the token's private key (CKM_EDDSA, pure
    /// Ed25519), and checks the signature against the public key before
    /// returning it, so a mismatched key pair is an error, not a bad
    /// certificate. Returns the public key and the signature.
    pub fn sign(&self, message: &[u8]) -> Result<([u8; 32], [u8; 64]), VaultError> {
        let target = self.target.clone();
        let message = message.to_vec();
        self.run(move |session| {
            let public = target.public_key(session)?;
            let key = target.one(session, ObjectClass::PRIVATE_KEY)?;
            let mechanism = cryptoki::mechanism::Mechanism::Eddsa(
                cryptoki::mechanism::eddsa::EddsaParams::new(
                    cryptoki::mechanism::eddsa::EddsaSignatureScheme::Pure,
                ),
            );
            let signature = session
                .sign(&mechanism, key, &message)
                .map_err(|e| map_ck(e, "sign with the token's key"))?;
            let signature: [u8; 64] = signature.try_into().map_err(|s: Vec<u8>| {
                VaultError::Corrupt(format!(
                    "PKCS#11: the token's Ed25519 signature is {} bytes, not 64",
                    s.len()
                ))
            })?;
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
                .verify(&message, &signature)
                .map_err(|_| {
                    VaultError::Corrupt(format!(
                        "PKCS#11: the signature of the key labelled {:?} does not verify with the public key of that label",
                        target.label
                    ))
                })?;
            Ok((public, signature))
        })
    }

    fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Session) -> Result<T, VaultError> + Send + 'static,
    ) -> Result<T, VaultError> {
        let target = self.target.clone();
        self.worker.run(move |conn| {
            let _module = target.exclusive();
            let result = conn.get().and_then(|c| job(&c.session));
            reset_on_unavailable(conn, result)
        })
    }
}

impl Target {
    fn key_template(&self, class: ObjectClass) -> Vec<Attribute> {
        vec![
            Attribute::Class(class),
            Attribute::KeyType(cryptoki::object::KeyType::EC_EDWARDS),
            Attribute::Label(self.label.as_bytes().to_vec()),
        ]
    }

    /// The one key of `class` with the label; `Missing` if none, an error
    /// if several (the URI must name one key).
    fn one(&self, session: &Session, class: ObjectClass) -> Result<ObjectHandle, VaultError> {
        let found = session
            .find_objects(&self.key_template(class))
            .map_err(|e| map_ck(e, "find keys"))?;
        match found[..] {
            [one] => Ok(one),
            [] => Err(VaultError::Missing(format!(
                "{}: no Ed25519 {} labelled {:?}",
                self.place(),
                if class == ObjectClass::PRIVATE_KEY {
                    "private key"
                } else {
                    "public key"
                },
                self.label
            ))),
            _ => Err(VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{}: {} Ed25519 keys labelled {:?}; give each key its own label",
                    self.place(),
                    found.len(),
                    self.label
                ),
            ))),
        }
    }

    /// The 32-byte Ed25519 public key: `CKA_EC_POINT`, which tokens store
    /// as a DER OCTET STRING (`04 20 ...`) or, some, as the raw 32 bytes.
    fn public_key(&self, session: &Session) -> Result<[u8; 32], VaultError> {
        let key = self.one(session, ObjectClass::PUBLIC_KEY)?;
        let point = session
            .get_attributes(key, &[AttributeType::EcPoint])
            .map_err(|e| map_ck(e, "read the public key"))?
            .into_iter()
            .find_map(|a| match a {
                Attribute::EcPoint(p) => Some(p),
                _ => None,
            })
            .unwrap_or_default();
        let raw = match point.as_slice() {
            [0x04, 0x20, rest @ ..] if rest.len() == 32 => rest,
            raw if raw.len() == 32 => raw,
            _ => {
                return Err(VaultError::Corrupt(format!(
                    "PKCS#11: the public key labelled {:?} is not an Ed25519 point ({} bytes)",
                    self.label,
                    point.len()
                )))
            }
        };
        Ok(raw.try_into().expect("32 bytes"))
    }
}
