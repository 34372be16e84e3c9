//! `TpmVault`: the sealed epoch-key record in TPM 2.0 NV indices (header + A/B slots), through the TSS ESAPI.
//!
//! A TPM's NV memory is inside the chip: an overwrite there is an erasure
//! the host cannot undo, and reads are guarded by an authorization value
//! with the TPM's dictionary-attack lockout, so the sealed record cannot even
//! be copied for offline guessing without the password. Layout and protocol:
//! docs/FORMAT-vault.md ("TPM 2.0 NV layout").
//!
//! Three NV indices from a base handle `N` (default [`DEFAULT_NV_INDEX`]):
//!
//! * `N`   — header: the Argon2id salt and parameters, readable by anyone
//!   (like the file vault's clear header), writable by the owner hierarchy;
//! * `N+1`, `N+2` — slots A and B: one 176-byte sealed slot each, the same
//!   bytes as a file-vault slot, read and written only with an
//!   authorization value derived from the password's key-encryption key.
//!
//! A rotation writes the new slot into the index not holding the current
//! record, then overwrites the other index with zeros.

use crate::format::{Slot, SlotFault, SLOT_LEN};
use crate::kdf::{KdfParams, SALT_LEN};
use crate::sealed::{self, KekState};
use crate::tpm_attest::{NvCertification, SlotCertifications};
use crate::worker::{Conn, Worker};
use crate::{RotationHook, RotationStep};
use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tss_esapi::attributes::{
    NvIndexAttributes, NvIndexAttributesBuilder, SessionAttributesBuilder,
};
use tss_esapi::constants::response_code::{Tss2ResponseCode, Tss2ResponseCodeKind as Kind};
use tss_esapi::constants::{CapabilityType, PropertyTag, SessionType};
use tss_esapi::handles::{NvIndexHandle, NvIndexTpmHandle, ObjectHandle, SessionHandle, TpmHandle};
use tss_esapi::interface_types::algorithm::HashingAlgorithm;
use tss_esapi::interface_types::resource_handles::{NvAuth, Provision};
use tss_esapi::structures::{
    Auth, CapabilityData, MaxNvBuffer, NvPublicBuilder, SymmetricDefinition,
};
use tss_esapi::{Context, TctiNameConf};
use zeroize::Zeroizing;

/// Default base NV index: the header at `0x01500016`, slots A and B at
/// `0x01500017` and `0x01500018`. The handle is the one tpm2-tools' examples
/// use; the TCG's handle registry assigns NV ranges by convention only (the
/// TPM enforces none), so pick another base with `;index=` if it is taken
/// (`tpm2_getcap handles-nv-index` lists the defined ones).
pub const DEFAULT_NV_INDEX: u32 = 0x0150_0016;

/// TCTI used when the location names none: the kernel's resource manager.
pub const DEFAULT_TCTI: &str = "device:/dev/tpmrm0";

/// Rated NV writes per index assumed for a hardware TPM. The TCG library
/// and PC Client specifications set no endurance figure (they only let a
/// TPM throttle NV writes with `TPM_RC_NV_RATE`); vendors rate their NV
/// flash at e.g. 500,000 cycles (STMicroelectronics ST33GTPMI data brief
/// DB4278, 2020). 100,000 is a conservative floor below the figures vendors
/// publish. See docs/FORMAT-vault.md ("Endurance").
pub const TPM_ENDURANCE_WRITES: u64 = 100_000;

/// Default deadline for one TPM operation. NV commands take milliseconds;
/// a TPM that has not answered in this time is treated as unavailable.
pub const DEFAULT_TPM_TIMEOUT: Duration = Duration::from_secs(30);

const HEADER_MAGIC: &[u8; 8] = b"OUBLITPM";
const HEADER_VERSION: u16 = 1;
const HEADER_KDF_ARGON2ID: u16 = 1;
/// Bytes of the header index: fields (48) + truncated SHA-256 (16).
pub(crate) const HEADER_LEN: usize = 64;
const HEADER_BODY: usize = 48;
/// Label of the slots' authorization value, derived from the KEK.
const AUTH_LABEL: &[u8] = b"oubli-tpm-nv-auth";

/// A parsed `tpm:` location: the TCTI (as tpm2-tools write it) and the base NV index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmLocation {
    /// TCTI configuration, e.g. `swtpm:host=127.0.0.1,port=2321` or `device:/dev/tpmrm0`.
    pub tcti: String,
    /// Base NV index (the header); the slots are at `index + 1` and `index + 2`.
    pub index: u32,
}

impl TpmLocation {
    /// Parses what follows `tpm:` (or `tpm2:`): `[TCTI][;index=HANDLE]`.
    ///
    /// The TCTI is `device[:PATH]`, `swtpm[:host=H,port=P]`,
    /// `mssim[:host=H,port=P]` or `tabrmd[:...]`; empty means
    /// [`DEFAULT_TCTI`]. `HANDLE` is hexadecimal with `0x` or decimal, and
    /// the three indices must lie in the NV range `0x01000000..=0x01FFFFFF`.
    pub fn parse(spec: &str) -> Result<TpmLocation, VaultError> {
        let bad = |why: String| {
            VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("bad TPM location `tpm:{spec}`: {why}"),
            ))
        };
        let mut parts = spec.split(';');
        let tcti = parts.next().unwrap_or("").trim();
        let tcti = if tcti.is_empty() { DEFAULT_TCTI } else { tcti };
        TctiNameConf::from_str(tcti).map_err(|_| {
            bad(format!(
                "unknown TCTI `{tcti}` (expected device:PATH, swtpm:host=H,port=P, mssim:... or tabrmd:...)"
            ))
        })?;
        let mut index = None;
        for option in parts {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| bad(format!("option `{option}` is not key=value")))?;
            match key.trim() {
                "index" => {
                    if index.is_some() {
                        return Err(bad("`index` given twice".into()));
                    }
                    let value = value.trim();
                    let parsed = match value
                        .strip_prefix("0x")
                        .or_else(|| value.strip_prefix("0X"))
                    {
                        Some(hex) => u32::from_str_radix(hex, 16),
                        None => value.parse(),
                    }
                    .map_err(|_| bad(format!("index `{value}` is not a number")))?;
                    index = Some(parsed);
                }
                other => return Err(bad(format!("unknown option `{other}` (only `index`)"))),
            }
        }
        let index = index.unwrap_or(DEFAULT_NV_INDEX);
        if !(0x0100_0000..=0x01FF_FFFD).contains(&index) {
            return Err(bad(format!(
                "index {index:#010x} outside the NV range 0x01000000..=0x01fffffd"
            )));
        }
        Ok(TpmLocation {
            tcti: tcti.to_string(),
            index,
        })
    }

    fn header_index(&self) -> u32 {
        self.index
    }

    fn slot_index(&self, slot: usize) -> u32 {
        self.index + 1 + slot as u32
    }

    fn is_simulator_tcti(&self) -> bool {
        self.tcti.starts_with("swtpm") || self.tcti.starts_with("mssim")
    }
}

impl std::fmt::Display for TpmLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tpm:{};index={:#010x}", self.tcti, self.index)
    }
}

/// Knobs of a TPM vault handle.
#[derive(Clone)]
pub struct TpmOptions {
    /// Deadline for one TPM operation (see [`DEFAULT_TPM_TIMEOUT`]).
    pub timeout: Duration,
    /// Authorization of the owner hierarchy, needed to define and undefine
    /// the indices (create, destroy). `None` = empty, the usual setting.
    pub owner_auth: Option<SecretBytes>,
}

impl Default for TpmOptions {
    fn default() -> Self {
        TpmOptions {
            timeout: DEFAULT_TPM_TIMEOUT,
            owner_auth: None,
        }
    }
}

impl std::fmt::Debug for TpmOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmOptions")
            .field("timeout", &self.timeout)
            .field(
                "owner_auth",
                &self.owner_auth.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// The header index's content: what is needed to derive the KEK, in clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TpmHeader {
    pub params: KdfParams,
    pub salt: [u8; SALT_LEN],
    /// The slot indices, repeated so a dump of the header is self-describing.
    pub slots: [u32; 2],
}

impl TpmHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(HEADER_MAGIC);
        h[8..10].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&HEADER_KDF_ARGON2ID.to_le_bytes());
        h[12..16].copy_from_slice(&self.params.m_cost_kib.to_le_bytes());
        h[16..20].copy_from_slice(&self.params.t_cost.to_le_bytes());
        h[20..24].copy_from_slice(&self.params.p_cost.to_le_bytes());
        h[24..40].copy_from_slice(&self.salt);
        h[40..44].copy_from_slice(&self.slots[0].to_le_bytes());
        h[44..48].copy_from_slice(&self.slots[1].to_le_bytes());
        let sum = ring::digest::digest(&ring::digest::SHA256, &h[..HEADER_BODY]);
        h[HEADER_BODY..].copy_from_slice(&sum.as_ref()[..16]);
        h
    }

    pub fn decode(h: &[u8]) -> Result<TpmHeader, String> {
        if h.len() != HEADER_LEN {
            return Err(format!(
                "header is {} bytes, expected {HEADER_LEN}",
                h.len()
            ));
        }
        let sum = ring::digest::digest(&ring::digest::SHA256, &h[..HEADER_BODY]);
        if sum.as_ref()[..16] != h[HEADER_BODY..] {
            return Err("header has a bad checksum".into());
        }
        if &h[..8] != HEADER_MAGIC {
            return Err("header has a bad magic (not an oubli vault)".into());
        }
        let u16_at = |o: usize| u16::from_le_bytes(h[o..o + 2].try_into().unwrap());
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().unwrap());
        if u16_at(8) != HEADER_VERSION {
            return Err(format!("unsupported header version {}", u16_at(8)));
        }
        if u16_at(10) != HEADER_KDF_ARGON2ID {
            return Err(format!("unknown password KDF {}", u16_at(10)));
        }
        let params = KdfParams {
            m_cost_kib: u32_at(12),
            t_cost: u32_at(16),
            p_cost: u32_at(20),
        };
        params.validate()?;
        Ok(TpmHeader {
            params,
            salt: h[24..40].try_into().unwrap(),
            slots: [u32_at(40), u32_at(44)],
        })
    }
}

/// What the device thread keeps between jobs.
struct TpmConn {
    ctx: Context,
}

/// The epoch key in TPM 2.0 NV memory. See the module documentation.
pub struct TpmVault {
    location: TpmLocation,
    provider: Arc<dyn CryptoProvider>,
    state: Arc<KekState>,
    worker: Worker<TpmConn>,
    info: VaultInfo,
    hook: Arc<Mutex<Option<RotationHook>>>,
}

impl std::fmt::Debug for TpmVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmVault")
            .field("location", &self.location.to_string())
            .field("provider", &self.provider.name())
            .field("kek", &"<redacted>")
            .finish()
    }
}

impl TpmVault {
    /// Defines the three NV indices at `location` and writes `record` into
    /// slot A (slot B is written with zeros, so both are initialized).
    ///
    /// Fails with an `AlreadyExists` I/O error if any of the indices is
    /// defined. On any other failure the indices defined so far are
    /// undefined again, so a retry is possible.
    pub fn create(
        location: &TpmLocation,
        password: &SecretBytes,
        params: KdfParams,
        record: &VaultRecord,
        provider: Arc<dyn CryptoProvider>,
        options: TpmOptions,
    ) -> Result<TpmVault, VaultError> {
        let state = Arc::new(KekState::fresh(password, params, &*provider)?);
        let vault = Self::handle(location, provider, state, &options);
        let header = TpmHeader {
            params,
            salt: vault.state.salt,
            slots: [location.slot_index(0), location.slot_index(1)],
        };
        let first = sealed::first_header(&vault.state, &*vault.provider);
        let slot = sealed::seal(&*vault.provider, &vault.state, &first, record);
        let auth = vault.slot_auth();
        let loc = location.clone();
        let owner = owner_auth(&options)?;
        vault.worker.run(move |conn| {
            let ctx = &mut conn.get()?.ctx;
            let defined = create_indices(ctx, &loc, &header, &slot, &auth, &owner);
            if let Err(e) = defined {
                // Leave nothing half-made that would make a retry fail with
                // "already exists" (the same rule as FileVault::create).
                if !is_already_exists(&e) {
                    for i in [loc.header_index(), loc.slot_index(0), loc.slot_index(1)] {
                        let _ = undefine(ctx, i, &owner);
                    }
                }
                return Err(e);
            }
            Ok(())
        })?;
        let mut vault = vault;
        vault.info = vault.query_info()?;
        // Read back: proves the indices hold a record this password opens.
        vault.load()?;
        Ok(vault)
    }

    /// Opens the vault at `location`: reads the header index, derives the
    /// KEK from `password` (one Argon2id run) and checks it by loading the
    /// record. A wrong password is refused by the TPM itself and counts
    /// towards its dictionary-attack lockout.
    pub fn open(
        location: &TpmLocation,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
        options: TpmOptions,
    ) -> Result<TpmVault, VaultError> {
        let probe = Self::handle(
            location,
            provider.clone(),
            // Placeholder until the header is read; never used to seal.
            Arc::new(KekState::derive(
                &SecretBytes::new(Vec::new()),
                [0; SALT_LEN],
                KdfParams::testing(),
            )?),
            &options,
        );
        let loc = location.clone();
        let header = probe.worker.run(move |conn| {
            let ctx = &mut conn.get()?.ctx;
            read_header(ctx, &loc)
        })?;
        if header.slots != [location.slot_index(0), location.slot_index(1)] {
            return Err(VaultError::Corrupt(format!(
                "{location}: header names slots {:#010x}/{:#010x}, expected the two indices after it",
                header.slots[0], header.slots[1]
            )));
        }
        let state = Arc::new(KekState::derive(password, header.salt, header.params)?);
        let mut vault = TpmVault { state, ..probe };
        vault.info = vault.query_info()?;
        vault.load()?;
        Ok(vault)
    }

    fn handle(
        location: &TpmLocation,
        provider: Arc<dyn CryptoProvider>,
        state: Arc<KekState>,
        options: &TpmOptions,
    ) -> TpmVault {
        let tcti = location.tcti.clone();
        let worker = Worker::new(
            format!("tpm {}", location.tcti),
            options.timeout,
            // Simulators serve one connection at a time: let go after each job.
            !location.is_simulator_tcti(),
            Arc::new(move || connect(&tcti)),
        );
        TpmVault {
            location: location.clone(),
            provider,
            state,
            worker,
            info: VaultInfo {
                kind: "tpm2".into(),
                location: location.to_string(),
                endurance_writes: Some(TPM_ENDURANCE_WRITES),
                overwrite_is_erasure: true,
            },
            hook: Arc::new(Mutex::new(None)),
        }
    }

    /// Where the vault is.
    pub fn location(&self) -> &TpmLocation {
        &self.location
    }

    /// Whether the TPM is a simulator (swtpm, the Microsoft/IBM simulator):
    /// its NV memory is a file on the host, so nothing is really erased.
    pub fn is_simulator(&self) -> bool {
        !self.info.overwrite_is_erasure
    }

    /// Calls `hook` at each step of every later rotation, on the device
    /// thread; an `Err` from it stops the rotation there, as a crash would.
    /// For crash tests; production code leaves it unset.
    pub fn set_rotation_hook(&self, hook: Option<RotationHook>) {
        *self.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    /// Erases and undefines the three indices: the record is gone for good.
    /// Needs the owner hierarchy's authorization (`options.owner_auth`).
    pub fn destroy(self, options: &TpmOptions) -> Result<(), VaultError> {
        let auth = self.slot_auth();
        let loc = self.location.clone();
        let owner = owner_auth(options)?;
        self.worker.run(move |conn| {
            let ctx = &mut conn.get()?.ctx;
            // Zeros first: an undefine may only unlink the space inside the
            // TPM, an overwrite reaches the cells.
            for slot in 0..2 {
                write_nv(ctx, loc.slot_index(slot), &auth, &[0u8; SLOT_LEN])?;
            }
            for i in [loc.slot_index(0), loc.slot_index(1), loc.header_index()] {
                undefine(ctx, i, &owner)?;
            }
            Ok(())
        })
    }

    /// What a job on the device thread needs to reach and unlock a slot.
    fn slot_access(&self) -> SlotAccess {
        SlotAccess {
            auth: self.slot_auth(),
            loc: self.location.clone(),
            state: self.state.clone(),
            provider: self.provider.clone(),
        }
    }

    /// The slots' authorization value: derived from the KEK, so only the
    /// password opens them, and never the KEK itself.
    fn slot_auth(&self) -> Zeroizing<Vec<u8>> {
        let key = self.state.derive_subkey(
            &*self.provider,
            AUTH_LABEL,
            &self.location.index.to_be_bytes(),
        );
        Zeroizing::new(key.expose().to_vec())
    }

    fn query_info(&self) -> Result<VaultInfo, VaultError> {
        let simulator_tcti = self.location.is_simulator_tcti();
        let manufacturer = self.worker.run(|conn| {
            let ctx = &mut conn.get()?.ctx;
            ctx.get_tpm_property(PropertyTag::Manufacturer)
                .map_err(|e| map_tss(e, "read TPM properties"))
        })?;
        // "IBM " is libtpms (swtpm) and IBM's simulator, "MSFT" Microsoft's
        // reference simulator: no chip makes either.
        let simulator = simulator_tcti
            || matches!(
                manufacturer.map(u32::to_be_bytes).as_ref().map(|b| &b[..]),
                Some(b"IBM ") | Some(b"IBM\0") | Some(b"MSFT")
            );
        Ok(VaultInfo {
            kind: "tpm2".into(),
            location: self.location.to_string(),
            // A simulator's NV is a host file: no wear, and no real erasure.
            endurance_writes: (!simulator).then_some(TPM_ENDURANCE_WRITES),
            overwrite_is_erasure: !simulator,
        })
    }

    /// Runs `job` on the device thread with what a slot operation needs
    /// (context, location, slot authorization, KEK, provider); a transport
    /// failure drops the connection so the next job reconnects.
    fn on_device<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Context, &SlotAccess) -> Result<T, VaultError> + Send + 'static,
    ) -> Result<T, VaultError> {
        let access = self.slot_access();
        self.worker.run(move |conn| {
            let result = conn.get().and_then(|c| job(&mut c.ctx, &access));
            reset_on_unavailable(conn, result)
        })
    }

    fn read_current(&self) -> Result<sealed::Current, VaultError> {
        self.on_device(|ctx, a| current_in(ctx, &a.loc, &a.auth, &a.state, &*a.provider))
    }
}

fn connect(tcti: &str) -> Result<TpmConn, VaultError> {
    let conf = TctiNameConf::from_str(tcti)
        .map_err(|_| VaultError::Unavailable(format!("bad TCTI `{tcti}`")))?;
    let ctx = Context::new(conf).map_err(|e| match e {
        tss_esapi::Error::Tss2Error(_) => {
            VaultError::Unavailable(format!("cannot reach the TPM through `{tcti}`: {e}"))
        }
        tss_esapi::Error::WrapperError(_) => {
            VaultError::Unavailable(format!("cannot set up the TPM connection `{tcti}`: {e}"))
        }
    })?;
    Ok(TpmConn { ctx })
}

fn owner_auth(options: &TpmOptions) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    Ok(Zeroizing::new(
        options
            .owner_auth
            .as_ref()
            .map(|a| a.expose().to_vec())
            .unwrap_or_default(),
    ))
}

fn auth_value(bytes: &[u8]) -> Result<Auth, VaultError> {
    Auth::try_from(bytes).map_err(|e| {
        VaultError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("authorization value too long for the TPM: {e}"),
        ))
    })
}

/// Runs `f` under a fresh HMAC session with parameter encryption, so that
/// neither authorization values nor NV contents cross the bus in clear
/// (the session is unsalted: its keys come from the authorization value,
/// which for the slots is derived from the password).
fn with_session<T>(
    ctx: &mut Context,
    f: impl FnOnce(&mut Context) -> tss_esapi::Result<T>,
) -> tss_esapi::Result<T> {
    let session = ctx
        .start_auth_session(
            None,
            None,
            None,
            SessionType::Hmac,
            SymmetricDefinition::AES_128_CFB,
            HashingAlgorithm::Sha256,
        )?
        .ok_or(tss_esapi::Error::WrapperError(
            tss_esapi::WrapperErrorKind::WrongValueFromTpm,
        ))?;
    let (attributes, mask) = SessionAttributesBuilder::new()
        .with_decrypt(true)
        .with_encrypt(true)
        .with_continue_session(true)
        .build();
    let result = ctx
        .tr_sess_set_attributes(session, attributes, mask)
        .and_then(|()| ctx.execute_with_session(Some(session), f));
    // Sessions are a scarce TPM resource: always flush ours.
    let _ = ctx.flush_context(ObjectHandle::from(SessionHandle::from(session)));
    result
}

/// Whether the NV index `index` is defined. Asked through the handle list
/// rather than by opening it, so that a missing index (the normal case at
/// create, and for a vault that was never made) logs no TSS error.
fn nv_exists(ctx: &mut Context, index: u32) -> Result<bool, VaultError> {
    let (data, _) = ctx
        .execute_without_session(|c| c.get_capability(CapabilityType::Handles, index, 1))
        .map_err(|e| map_tss(e, "list NV indices"))?;
    Ok(match data {
        CapabilityData::Handles(list) => list
            .iter()
            .any(|h| matches!(h, TpmHandle::NvIndex(nv) if u32::from(*nv) == index)),
        _ => false,
    })
}

/// An ESYS handle for the NV index `index`, with `auth` set on it.
fn nv_handle(ctx: &mut Context, index: u32, auth: &[u8]) -> Result<NvIndexHandle, VaultError> {
    let tpm_handle = NvIndexTpmHandle::new(index).map_err(|e| map_tss(e, "NV handle"))?;
    if !nv_exists(ctx, index)? {
        return Err(VaultError::Missing(format!("TPM NV index {index:#010x}")));
    }
    let object = ctx
        .execute_without_session(|c| c.tr_from_tpm_public(TpmHandle::NvIndex(tpm_handle)))
        .map_err(|e| match kind_of(&e) {
            Some(Kind::Handle) if is_tpm_layer(&e) => {
                VaultError::Missing(format!("TPM NV index {index:#010x}"))
            }
            _ => map_tss(e, &format!("open NV index {index:#010x}")),
        })?;
    if let Err(e) = ctx.tr_set_auth(object, auth_value(auth)?) {
        let mut object = object;
        let _ = ctx.tr_close(&mut object);
        return Err(map_tss(e, "set NV authorization"));
    }
    Ok(NvIndexHandle::from(object))
}

fn close(ctx: &mut Context, handle: NvIndexHandle) {
    let mut object = ObjectHandle::from(handle);
    let _ = ctx.tr_close(&mut object);
}

fn read_nv(ctx: &mut Context, index: u32, auth: &[u8], len: usize) -> Result<Vec<u8>, VaultError> {
    let handle = nv_handle(ctx, index, auth)?;
    let result = with_session(ctx, |c| {
        c.nv_read(NvAuth::NvIndex(handle), handle, len as u16, 0)
    })
    .map(|buf| buf.to_vec())
    .map_err(|e| map_tss(e, &format!("read NV index {index:#010x}")));
    close(ctx, handle);
    result
}

fn write_nv(ctx: &mut Context, index: u32, auth: &[u8], data: &[u8]) -> Result<(), VaultError> {
    let handle = nv_handle(ctx, index, auth)?;
    let buffer = MaxNvBuffer::try_from(data.to_vec()).map_err(|e| map_tss(e, "NV buffer"))?;
    let result = with_session(ctx, |c| {
        c.nv_write(NvAuth::NvIndex(handle), handle, buffer, 0)
    })
    .map_err(|e| map_tss(e, &format!("write NV index {index:#010x}")));
    close(ctx, handle);
    result
}

fn define(
    ctx: &mut Context,
    index: u32,
    attributes: NvIndexAttributes,
    size: usize,
    auth: &[u8],
    owner: &[u8],
) -> Result<(), VaultError> {
    let tpm_handle = NvIndexTpmHandle::new(index).map_err(|e| map_tss(e, "NV handle"))?;
    let public = NvPublicBuilder::new()
        .with_nv_index(tpm_handle)
        .with_index_name_algorithm(HashingAlgorithm::Sha256)
        .with_index_attributes(attributes)
        .with_data_area_size(size)
        .build()
        .map_err(|e| map_tss(e, "NV public area"))?;
    ctx.tr_set_auth(ObjectHandle::Owner, auth_value(owner)?)
        .map_err(|e| map_tss(e, "set owner authorization"))?;
    let auth = auth_value(auth)?;
    let handle = with_session(ctx, |c| {
        c.nv_define_space(Provision::Owner, Some(auth), public)
    })
    .map_err(|e| match kind_of(&e) {
        Some(Kind::NvDefined) => VaultError::Io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("TPM NV index {index:#010x} already exists"),
        )),
        _ => owner_refused(e, &format!("define NV index {index:#010x}")),
    })?;
    close(ctx, handle);
    Ok(())
}

fn undefine(ctx: &mut Context, index: u32, owner: &[u8]) -> Result<(), VaultError> {
    let handle = nv_handle(ctx, index, &[])?;
    ctx.tr_set_auth(ObjectHandle::Owner, auth_value(owner)?)
        .map_err(|e| map_tss(e, "set owner authorization"))?;
    let result = with_session(ctx, |c| c.nv_undefine_space(Provision::Owner, handle))
        .map_err(|e| owner_refused(e, &format!("undefine NV index {index:#010x}")));
    if result.is_err() {
        close(ctx, handle);
    }
    result
}

/// The owner hierarchy refused its authorization: say what to set, rather
/// than blaming the vault password.
fn owner_refused(e: tss_esapi::Error, what: &str) -> VaultError {
    match kind_of(&e) {
        Some(Kind::AuthFail | Kind::BadAuth) if is_tpm_layer(&e) => {
            VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "TPM: {what}: the owner hierarchy's authorization was refused \
                     (set OUBLI_TPM_OWNER_AUTH, or TpmOptions::owner_auth)"
                ),
            ))
        }
        _ => map_tss(e, what),
    }
}

fn is_already_exists(e: &VaultError) -> bool {
    matches!(e, VaultError::Io(io) if io.kind() == std::io::ErrorKind::AlreadyExists)
}

fn create_indices(
    ctx: &mut Context,
    loc: &TpmLocation,
    header: &TpmHeader,
    slot: &[u8],
    auth: &[u8],
    owner: &[u8],
) -> Result<(), VaultError> {
    // Header: public (empty authorization, no lockout on reads), written by the owner only.
    let header_attributes = NvIndexAttributesBuilder::new()
        .with_auth_read(true)
        .with_owner_write(true)
        .with_no_da(true)
        .build()
        .map_err(|e| map_tss(e, "NV attributes"))?;
    // Slots: password-derived authorization for both reading and writing,
    // under the TPM's dictionary-attack protection.
    let slot_attributes = NvIndexAttributesBuilder::new()
        .with_auth_read(true)
        .with_auth_write(true)
        .build()
        .map_err(|e| map_tss(e, "NV attributes"))?;
    // Refuse before defining anything if any index is taken.
    for i in [loc.header_index(), loc.slot_index(0), loc.slot_index(1)] {
        if nv_exists(ctx, i)? {
            return Err(VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("TPM NV index {i:#010x} already exists"),
            )));
        }
    }
    define(
        ctx,
        loc.header_index(),
        header_attributes,
        HEADER_LEN,
        &[],
        owner,
    )?;
    write_header(ctx, loc.header_index(), &header.encode(), owner)?;
    for s in 0..2 {
        define(
            ctx,
            loc.slot_index(s),
            slot_attributes,
            SLOT_LEN,
            auth,
            owner,
        )?;
    }
    write_nv(ctx, loc.slot_index(0), auth, slot)?;
    write_nv(ctx, loc.slot_index(1), auth, &[0u8; SLOT_LEN])?;
    Ok(())
}

fn write_header(
    ctx: &mut Context,
    index: u32,
    bytes: &[u8],
    owner: &[u8],
) -> Result<(), VaultError> {
    let handle = nv_handle(ctx, index, &[])?;
    let result = (|| {
        ctx.tr_set_auth(ObjectHandle::Owner, auth_value(owner)?)
            .map_err(|e| map_tss(e, "set owner authorization"))?;
        let buffer = MaxNvBuffer::try_from(bytes.to_vec()).map_err(|e| map_tss(e, "NV buffer"))?;
        with_session(ctx, |c| c.nv_write(NvAuth::Owner, handle, buffer, 0))
            .map_err(|e| owner_refused(e, &format!("write NV index {index:#010x}")))
    })();
    close(ctx, handle);
    result
}

fn read_header(ctx: &mut Context, loc: &TpmLocation) -> Result<TpmHeader, VaultError> {
    let bytes = read_nv(ctx, loc.header_index(), &[], HEADER_LEN).map_err(|e| match e {
        VaultError::Missing(_) => VaultError::Missing(loc.to_string()),
        other => other,
    })?;
    TpmHeader::decode(&bytes).map_err(|why| VaultError::Corrupt(format!("{loc}: {why}")))
}

fn slot_name(i: usize) -> String {
    format!("slot {}", ['A', 'B'][i])
}

fn read_slots(
    ctx: &mut Context,
    loc: &TpmLocation,
    auth: &[u8],
) -> Result<Vec<Result<Slot, SlotFault>>, VaultError> {
    let mut slots = Vec::with_capacity(2);
    for s in 0..2 {
        let bytes = read_nv(ctx, loc.slot_index(s), auth, SLOT_LEN).map_err(|e| match e {
            // The header is there (we got this far) but a slot is not: someone
            // undefined it.
            VaultError::Missing(what) => VaultError::Corrupt(format!("{loc}: {what} is missing")),
            other => other,
        })?;
        slots.push(sealed::parse_exact(&bytes));
    }
    Ok(slots)
}

fn current_in(
    ctx: &mut Context,
    loc: &TpmLocation,
    auth: &[u8],
    state: &KekState,
    provider: &dyn CryptoProvider,
) -> Result<sealed::Current, VaultError> {
    let slots = read_slots(ctx, loc, auth)?;
    sealed::current(&loc.to_string(), &slots, &slot_name, state, provider)
}

fn call_hook(hook: &Mutex<Option<RotationHook>>, step: RotationStep) -> Result<(), VaultError> {
    let hook = hook.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match hook {
        Some(h) => h(step),
        None => Ok(()),
    }
}

/// Drops the connection after transport failures, so the next job reconnects.
fn reset_on_unavailable<T>(
    conn: &mut Conn<TpmConn>,
    result: Result<T, VaultError>,
) -> Result<T, VaultError> {
    if matches!(result, Err(VaultError::Unavailable(_))) {
        conn.reset();
    }
    result
}

impl Vault for TpmVault {
    fn info(&self) -> VaultInfo {
        self.info.clone()
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        Ok(self.read_current()?.record)
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        let auth = self.slot_auth();
        let loc = self.location.clone();
        let state = self.state.clone();
        let provider = self.provider.clone();
        let hook = self.hook.clone();
        let record = record.clone();
        self.worker.run(move |conn| {
            let result = (|| {
                let ctx = &mut conn.get()?.ctx;
                let current = current_in(ctx, &loc, &auth, &state, &*provider)?;
                sealed::check_same_store(&loc.to_string(), &current, &record)?;
                call_hook(&hook, RotationStep::Start)?;
                let header = sealed::next_header(&current, &state, &*provider)?;
                let slot = sealed::seal(&*provider, &state, &header, &record);
                // The new record goes to the index not holding the current
                // one; its higher generation makes it win from now on.
                let target = 1 - current.index;
                write_nv(ctx, loc.slot_index(target), &auth, &slot)?;
                call_hook(&hook, RotationStep::NewRecordWritten)?;
                // Only now overwrite the old record, inside the TPM.
                write_nv(ctx, loc.slot_index(current.index), &auth, &[0u8; SLOT_LEN])?;
                call_hook(&hook, RotationStep::OldRecordCleared)
            })();
            reset_on_unavailable(conn, result)
        })
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        Ok(self.read_current()?.header.write_count)
    }

    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        self.on_device(|ctx, a| {
            let slots = read_slots(ctx, &a.loc, &a.auth)?;
            Ok(sealed::readable_records(&slots, &a.state, &*a.provider))
        })
    }

    /// Writes zeros to the index not holding the current record, unless it
    /// holds zeros already (an NV write is wear).
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        self.on_device(|ctx, a| {
            let raw: Vec<Vec<u8>> = (0..2)
                .map(|i| read_nv(ctx, a.loc.slot_index(i), &a.auth, SLOT_LEN))
                .collect::<Result<_, _>>()?;
            let slots: Vec<_> = raw.iter().map(|r| sealed::parse_exact(r)).collect();
            let place = a.loc.to_string();
            let current = sealed::current(&place, &slots, &slot_name, &a.state, &*a.provider)?;
            let blank = |i: usize| raw[i].iter().all(|&b| b == 0);
            for other in sealed::leftover_indices(&place, &slots, &current, &blank)? {
                write_nv(ctx, a.loc.slot_index(other), &a.auth, &[0u8; SLOT_LEN])?;
            }
            Ok(())
        })
    }
}

/// What a job on the TPM's device thread needs to reach the slots.
struct SlotAccess {
    auth: Zeroizing<Vec<u8>>,
    loc: TpmLocation,
    state: Arc<KekState>,
    provider: Arc<dyn CryptoProvider>,
}

fn kind_of(e: &tss_esapi::Error) -> Option<Kind> {
    match e {
        tss_esapi::Error::Tss2Error(rc) => rc.kind(),
        tss_esapi::Error::WrapperError(_) => None,
    }
}

fn raw_rc(e: &tss_esapi::Error) -> Option<u32> {
    match e {
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatZero(rc)) => Some(rc.0),
        tss_esapi::Error::Tss2Error(Tss2ResponseCode::FormatOne(rc)) => Some(rc.0),
        _ => None,
    }
}

/// TSS2 return codes carry the layer that produced them in bits 16..24:
/// 0 is the TPM itself, 11 a resource manager forwarding the TPM's answer;
/// anything else (TCTI = 10, ESAPI = 7, ...) is the host side.
fn is_tpm_layer(e: &tss_esapi::Error) -> bool {
    matches!(raw_rc(e).map(|rc| (rc >> 16) & 0xFF), Some(0) | Some(11))
}

/// Maps a TSS error to the vault's error classes: transient conditions
/// (transport, busy, rate-limited, lockout) are `Unavailable` so the engine
/// keeps the epoch open and retries; authorization failures are
/// `WrongPassword`; a TPM that answers something inconsistent is `Corrupt`.
pub(crate) fn map_tss(e: tss_esapi::Error, what: &str) -> VaultError {
    let msg = |why: &str| match raw_rc(&e) {
        Some(rc) => format!("TPM: {what}: {why} (rc {rc:#x}: {e})"),
        None => format!("TPM: {what}: {why} ({e})"),
    };
    if let tss_esapi::Error::WrapperError(kind) = e {
        return match kind {
            tss_esapi::WrapperErrorKind::WrongValueFromTpm => {
                VaultError::Corrupt(msg("unexpected answer"))
            }
            _ => VaultError::Io(std::io::Error::other(msg("TSS wrapper error"))),
        };
    }
    if !is_tpm_layer(&e) {
        // TCTI/ESAPI: the connection broke, timed out or was refused.
        return VaultError::Unavailable(msg("no usable connection to the TPM"));
    }
    match kind_of(&e) {
        Some(Kind::AuthFail) | Some(Kind::BadAuth) => VaultError::WrongPassword,
        Some(Kind::Lockout) => VaultError::Unavailable(msg(
            "the TPM is in dictionary-attack lockout after wrong passwords; \
             wait for its recovery time or clear it with the lockout authorization",
        )),
        Some(
            Kind::NvRate
            | Kind::Retry
            | Kind::Yielded
            | Kind::Testing
            | Kind::Canceled
            | Kind::NvUnavailable
            | Kind::Memory
            | Kind::ObjectMemory
            | Kind::SessionMemory
            | Kind::SessionHandles
            | Kind::ObjectHandles
            | Kind::ContextGap
            | Kind::Locality
            | Kind::NvLocked
            | Kind::Initialize
            | Kind::Failure
            | Kind::Reboot,
        ) => VaultError::Unavailable(msg("the TPM cannot do it now")),
        Some(Kind::Handle) => VaultError::Missing(msg("no such handle")),
        Some(Kind::NvUninitialized) => VaultError::Corrupt(msg("NV index was never written")),
        Some(
            Kind::NvAuthorization | Kind::Attributes | Kind::NvSize | Kind::NvRange | Kind::Size,
        ) => VaultError::Corrupt(msg("NV index does not have the vault's layout")),
        _ => VaultError::Corrupt(msg("TPM refused")),
    }
}

// ---- TPM2_NV_Certify: the attestation of what the slot indices hold ----

/// Label hashed into the attestation key's `unique` field: a primary key is
/// derived from the hierarchy's seed and its template, so this gives oubli
/// its own AK, the same one on every call (nothing to persist), distinct from
/// any other primary of the endorsement hierarchy.
const AK_UNIQUE_LABEL: &[u8] = b"oubli NV attestation key v1";

impl TpmVault {
    /// TPM2_NV_Certify (digest form) of the slot index holding the current
    /// record, with `qualifying_data` as `extraData`. See
    /// [`certify_slots`](Self::certify_slots).
    pub fn certify_nv(&self, qualifying_data: &[u8]) -> Result<NvCertification, VaultError> {
        Ok(self.certify_slots(qualifying_data)?.current)
    }

    /// Asks the TPM to sign, with oubli's attestation key (a restricted
    /// ECC P-256 signing key, primary in the endorsement hierarchy), the
    /// SHA-256 of each slot index's contents: `TPMS_NV_DIGEST_CERTIFY_INFO`,
    /// the digest form of TPM2_NV_Certify (size 0, offset 0; TPM 2.0 library
    /// rev 1.59). The certification carries that digest only, never the
    /// sealed record. Check it with
    /// [`verify_slot_certifications`](crate::tpm_attest::verify_slot_certifications).
    ///
    /// Fails with `Unavailable` if the TPM does not implement the digest
    /// form (it would otherwise return the index's contents).
    pub fn certify_slots(&self, qualifying_data: &[u8]) -> Result<SlotCertifications, VaultError> {
        if qualifying_data.len() > 64 {
            return Err(VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "TPM qualifying data is longer than 64 bytes",
            )));
        }
        let tcti = self.location.tcti.clone();
        let data = qualifying_data.to_vec();
        self.on_device_raw(
            move |ctx, a| {
                // Which slot is current, through the ESAPI wrapper (it opens the
                // record, so the certification is of the vault this password opens).
                let current = current_in(ctx, &a.loc, &a.auth, &a.state, &*a.provider)?.index;
                Ok((
                    current,
                    a.loc.slot_index(current),
                    a.loc.slot_index(1 - current),
                ))
            },
            move |(_, current, other), a| {
                let mut esys = raw::Esys::connect(&tcti)?;
                let ak = esys.create_ak()?;
                let certify = |esys: &mut raw::Esys,
                               index: u32|
                 -> Result<NvCertification, VaultError> {
                    let (attest, signature) = esys.nv_certify_digest(&ak, index, &a.auth, &data)?;
                    Ok(NvCertification {
                        ak_public: ak.public.clone(),
                        nv_index: index,
                        attest,
                        signature,
                        qualifying_data: data.clone(),
                    })
                };
                let result = certify(&mut esys, current).and_then(|current| {
                    Ok(SlotCertifications {
                        current,
                        other: certify(&mut esys, other)?,
                    })
                });
                esys.flush(ak.handle);
                result
            },
        )
    }

    /// SHA-256 of the sealed slot that holds the current record: what
    /// [`certify_slots`](Self::certify_slots) certifies for it. Record it
    /// before a rotation to check afterwards that no slot holds it any more.
    pub fn current_record_digest(&self) -> Result<[u8; 32], VaultError> {
        self.on_device(|ctx, a| {
            let current = current_in(ctx, &a.loc, &a.auth, &a.state, &*a.provider)?.index;
            let bytes = Zeroizing::new(read_nv(ctx, a.loc.slot_index(current), &a.auth, SLOT_LEN)?);
            Ok(crate::tpm_attest::slot_digest(&bytes))
        })
    }

    /// Runs `first` with the wrapper's connection, then drops that
    /// connection (a simulator and a bare `/dev/tpm0` serve one at a time)
    /// and runs `then` on the device thread, which opens its own raw ESAPI
    /// context: tss-esapi 7 has no TPM2_NV_Certify.
    fn on_device_raw<A: Send + 'static, T: Send + 'static>(
        &self,
        first: impl FnOnce(&mut Context, &SlotAccess) -> Result<A, VaultError> + Send + 'static,
        then: impl FnOnce(A, &SlotAccess) -> Result<T, VaultError> + Send + 'static,
    ) -> Result<T, VaultError> {
        let access = self.slot_access();
        self.worker.run(move |conn| {
            let got = conn.get().and_then(|c| first(&mut c.ctx, &access));
            let got = reset_on_unavailable(conn, got)?;
            conn.reset();
            then(got, &access)
        })
    }
}

/// Raw ESAPI calls for what tss-esapi 7 does not wrap (TPM2_NV_Certify).
/// Everything `unsafe` in this file is here, each call at the FFI boundary.
mod raw {
    use super::{map_tss, AK_UNIQUE_LABEL};
    use oubli_core::VaultError;
    use std::ffi::CString;
    use std::ptr::null_mut;
    use tss_esapi::attributes::ObjectAttributesBuilder;
    use tss_esapi::constants::response_code::Tss2ResponseCode;
    use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
    use tss_esapi::interface_types::ecc::EccCurve;
    use tss_esapi::structures::{
        EccParameter, EccPoint, EccScheme, KeyDerivationFunctionScheme, PublicBuilder,
        PublicEccParametersBuilder, SymmetricDefinitionObject,
    };
    use tss_esapi::tss2_esys as sys;

    fn check(rc: sys::TSS2_RC, what: &str) -> Result<(), VaultError> {
        if rc == 0 {
            return Ok(());
        }
        Err(map_tss(
            tss_esapi::Error::Tss2Error(Tss2ResponseCode::from(rc)),
            what,
        ))
    }

    /// An output the ESAPI allocated: freed with `Esys_Free` on drop.
    struct Out<T>(*mut T);

    impl<T> Out<T> {
        fn get(&self) -> Result<&T, VaultError> {
            // SAFETY: the ESAPI either left the pointer null or set it to a
            // structure it allocated, which lives until our drop.
            unsafe { self.0.as_ref() }
                .ok_or_else(|| VaultError::Corrupt("TPM: the ESAPI returned no output".into()))
        }
    }

    impl<T> Drop for Out<T> {
        fn drop(&mut self) {
            if !self.0.is_null() {
                // SAFETY: allocated by the ESAPI, freed once.
                unsafe { sys::Esys_Free(self.0.cast()) };
            }
        }
    }

    /// An ESAPI context on its own TCTI, finalized on drop.
    pub(super) struct Esys {
        tcti: *mut sys::TSS2_TCTI_CONTEXT,
        ctx: *mut sys::ESYS_CONTEXT,
    }

    /// The attestation key, loaded: its ESYS handle and marshalled public area.
    pub(super) struct Ak {
        pub handle: sys::ESYS_TR,
        pub public: Vec<u8>,
    }

    /// A fixed-size TPM2B of the ESAPI's C layout from bytes.
    macro_rules! tpm2b {
        ($ty:ty, $bytes:expr) => {{
            let bytes: &[u8] = $bytes;
            // SAFETY: a plain C struct of integers and byte arrays; all-zero is valid.
            let mut b: $ty = unsafe { std::mem::zeroed() };
            if bytes.len() > b.buffer.len() {
                return Err(VaultError::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "value too long for a TPM buffer",
                )));
            }
            b.size = bytes.len() as u16;
            b.buffer[..bytes.len()].copy_from_slice(bytes);
            b
        }};
    }

    fn marshal<T>(
        value: &T,
        f: unsafe extern "C" fn(*const T, *mut u8, sys::size_t, *mut sys::size_t) -> sys::TSS2_RC,
        what: &str,
    ) -> Result<Vec<u8>, VaultError> {
        // A marshalled structure is never larger than its C form.
        let mut buf = vec![0u8; std::mem::size_of::<T>() + 8];
        let mut offset: sys::size_t = 0;
        // SAFETY: `value` is a valid structure; the buffer and its length match.
        check(
            unsafe {
                f(
                    value,
                    buf.as_mut_ptr(),
                    buf.len() as sys::size_t,
                    &mut offset,
                )
            },
            what,
        )?;
        buf.truncate(offset as usize);
        Ok(buf)
    }

    impl Esys {
        pub fn connect(tcti: &str) -> Result<Esys, VaultError> {
            let conf = CString::new(tcti)
                .map_err(|_| VaultError::Unavailable(format!("bad TCTI `{tcti}`")))?;
            let mut t = null_mut();
            // SAFETY: `conf` is a C string alive for the call; `t` is an out pointer.
            let rc = unsafe { sys::Tss2_TctiLdr_Initialize(conf.as_ptr(), &mut t) };
            if rc != 0 {
                return Err(VaultError::Unavailable(format!(
                    "cannot reach the TPM through `{tcti}` (rc {rc:#x})"
                )));
            }
            let mut ctx = null_mut();
            // SAFETY: `t` is the TCTI just made; `ctx` is an out pointer.
            let rc = unsafe { sys::Esys_Initialize(&mut ctx, t, null_mut()) };
            if rc != 0 {
                // SAFETY: `t` was made above and is not used after this.
                unsafe { sys::Tss2_TctiLdr_Finalize(&mut t) };
                return Err(VaultError::Unavailable(format!(
                    "cannot set up the TPM connection `{tcti}` (rc {rc:#x})"
                )));
            }
            Ok(Esys { tcti: t, ctx })
        }

        /// Creates oubli's attestation key as a primary of the endorsement
        /// hierarchy (its authorization must be empty, the usual setting).
        pub fn create_ak(&mut self) -> Result<Ak, VaultError> {
            let wrap = |e| map_tss(e, "attestation key template");
            let attributes = ObjectAttributesBuilder::new()
                .with_fixed_tpm(true)
                .with_fixed_parent(true)
                .with_sensitive_data_origin(true)
                .with_user_with_auth(true)
                .with_restricted(true)
                .with_sign_encrypt(true)
                .build()
                .map_err(wrap)?;
            let label = ring::digest::digest(&ring::digest::SHA256, AK_UNIQUE_LABEL);
            let public = PublicBuilder::new()
                .with_public_algorithm(PublicAlgorithm::Ecc)
                .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
                .with_object_attributes(attributes)
                .with_ecc_parameters(
                    PublicEccParametersBuilder::new()
                        .with_symmetric(SymmetricDefinitionObject::Null)
                        .with_ecc_scheme(
                            EccScheme::create(
                                tss_esapi::interface_types::algorithm::EccSchemeAlgorithm::EcDsa,
                                Some(HashingAlgorithm::Sha256),
                                None,
                            )
                            .map_err(wrap)?,
                        )
                        .with_curve(EccCurve::NistP256)
                        .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                        .with_is_signing_key(true)
                        .with_is_decryption_key(false)
                        .with_restricted(true)
                        .build()
                        .map_err(wrap)?,
                )
                .with_ecc_unique_identifier(EccPoint::new(
                    EccParameter::try_from(label.as_ref()).map_err(wrap)?,
                    EccParameter::default(),
                ))
                .build()
                .map_err(wrap)?;
            let template = sys::TPM2B_PUBLIC::try_from(public).map_err(wrap)?;
            // SAFETY: plain C structs; all-zero is the empty value.
            let sensitive: sys::TPM2B_SENSITIVE_CREATE = unsafe { std::mem::zeroed() };
            let outside: sys::TPM2B_DATA = unsafe { std::mem::zeroed() };
            let pcrs: sys::TPML_PCR_SELECTION = unsafe { std::mem::zeroed() };
            let mut handle = sys::ESYS_TR_NONE;
            let mut out_public = Out::<sys::TPM2B_PUBLIC>(null_mut());
            let mut creation_data = Out::<sys::TPM2B_CREATION_DATA>(null_mut());
            let mut creation_hash = Out::<sys::TPM2B_DIGEST>(null_mut());
            let mut ticket = Out::<sys::TPMT_TK_CREATION>(null_mut());
            // SAFETY: every input points to a live structure, every output
            // to a pointer the ESAPI fills (freed by `Out`).
            let rc = unsafe {
                sys::Esys_CreatePrimary(
                    self.ctx,
                    sys::ESYS_TR_RH_ENDORSEMENT,
                    sys::ESYS_TR_PASSWORD,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    &sensitive,
                    &template,
                    &outside,
                    &pcrs,
                    &mut handle,
                    &mut out_public.0,
                    &mut creation_data.0,
                    &mut creation_hash.0,
                    &mut ticket.0,
                )
            };
            check(
                rc,
                "create the attestation key in the endorsement hierarchy",
            )?;
            let public = marshal(
                out_public.get()?,
                sys::Tss2_MU_TPM2B_PUBLIC_Marshal,
                "marshal the attestation key",
            );
            match public {
                Ok(public) => Ok(Ak { handle, public }),
                Err(e) => {
                    self.flush(handle);
                    Err(e)
                }
            }
        }

        /// TPM2_NV_Certify of `index` with size 0 and offset 0: the TPM signs
        /// the SHA-256 of the whole index. Returns the `TPMS_ATTEST` bytes
        /// and the marshalled `TPMT_SIGNATURE`.
        pub fn nv_certify_digest(
            &mut self,
            ak: &Ak,
            index: u32,
            auth: &[u8],
            qualifying_data: &[u8],
        ) -> Result<(Vec<u8>, Vec<u8>), VaultError> {
            let what = format!("certify NV index {index:#010x}");
            let mut nv = sys::ESYS_TR_NONE;
            // SAFETY: `nv` is an out handle.
            let rc = unsafe {
                sys::Esys_TR_FromTPMPublic(
                    self.ctx,
                    index,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    &mut nv,
                )
            };
            check(rc, &format!("open NV index {index:#010x}"))?;
            let result = self.certify_open(ak, nv, auth, qualifying_data, &what);
            // SAFETY: `nv` was opened above; closing only forgets the ESYS handle.
            unsafe { sys::Esys_TR_Close(self.ctx, &mut nv) };
            result
        }

        fn certify_open(
            &mut self,
            ak: &Ak,
            nv: sys::ESYS_TR,
            auth: &[u8],
            qualifying_data: &[u8],
            what: &str,
        ) -> Result<(Vec<u8>, Vec<u8>), VaultError> {
            let mut auth = tpm2b!(sys::TPM2B_AUTH, auth);
            // SAFETY: `nv` is a live ESYS handle; the ESAPI copies the value.
            let rc = unsafe { sys::Esys_TR_SetAuth(self.ctx, nv, &auth) };
            zeroize::Zeroize::zeroize(&mut auth.buffer);
            check(rc, what)?;
            // The NV authorization goes through an HMAC session so the
            // slot's authorization value never crosses the bus; the AK's
            // (empty) one through a password session.
            let session = self.hmac_session(what)?;
            let data = tpm2b!(sys::TPM2B_DATA, qualifying_data);
            // SAFETY: a plain C struct; the scheme is set below.
            let mut scheme: sys::TPMT_SIG_SCHEME = unsafe { std::mem::zeroed() };
            scheme.scheme = tss_esapi::constants::tss::TPM2_ALG_NULL;
            let mut attest = Out::<sys::TPM2B_ATTEST>(null_mut());
            let mut signature = Out::<sys::TPMT_SIGNATURE>(null_mut());
            // SAFETY: live handles and inputs; outputs freed by `Out`.
            let rc = unsafe {
                sys::Esys_NV_Certify(
                    self.ctx,
                    ak.handle,
                    nv,
                    nv,
                    sys::ESYS_TR_PASSWORD,
                    session,
                    sys::ESYS_TR_NONE,
                    &data,
                    &scheme,
                    0,
                    0,
                    &mut attest.0,
                    &mut signature.0,
                )
            };
            self.flush(session);
            check(rc, what)?;
            let attest = attest.get()?;
            let bytes = attest.attestationData
                [..(attest.size as usize).min(attest.attestationData.len())]
                .to_vec();
            // A TPM before rev 1.59 answers size 0 with an ordinary NV
            // certification of zero bytes: refuse it rather than ever ask
            // for the contents.
            if bytes.get(4..6) != Some(&0x801cu16.to_be_bytes()[..]) {
                return Err(VaultError::Unavailable(format!(
                    "TPM: {what}: the TPM does not implement the digest form of TPM2_NV_Certify \
                     (TPM 2.0 library rev 1.59); no attestation made"
                )));
            }
            let signature = marshal(
                signature.get()?,
                sys::Tss2_MU_TPMT_SIGNATURE_Marshal,
                "marshal the signature",
            )?;
            Ok((bytes, signature))
        }

        fn hmac_session(&mut self, what: &str) -> Result<sys::ESYS_TR, VaultError> {
            // SAFETY: a plain C struct; NULL algorithm = no parameter encryption.
            let mut symmetric: sys::TPMT_SYM_DEF = unsafe { std::mem::zeroed() };
            symmetric.algorithm = tss_esapi::constants::tss::TPM2_ALG_NULL;
            let mut session = sys::ESYS_TR_NONE;
            // SAFETY: inputs live, `session` an out handle.
            let rc = unsafe {
                sys::Esys_StartAuthSession(
                    self.ctx,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    sys::ESYS_TR_NONE,
                    std::ptr::null(),
                    tss_esapi::constants::tss::TPM2_SE_HMAC,
                    &symmetric,
                    tss_esapi::constants::tss::TPM2_ALG_SHA256,
                    &mut session,
                )
            };
            check(rc, what)?;
            Ok(session)
        }

        /// Flushes a transient object or session; errors are ignored (the
        /// TPM drops them at reset anyway).
        pub fn flush(&mut self, handle: sys::ESYS_TR) {
            // SAFETY: `handle` came from this context.
            unsafe { sys::Esys_FlushContext(self.ctx, handle) };
        }
    }

    impl Drop for Esys {
        fn drop(&mut self) {
            // SAFETY: both were made in `connect` and are not used after.
            unsafe {
                sys::Esys_Finalize(&mut self.ctx);
                sys::Tss2_TctiLdr_Finalize(&mut self.tcti);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_locations() {
        let l = TpmLocation::parse("swtpm:host=127.0.0.1,port=2321").unwrap();
        assert_eq!(l.tcti, "swtpm:host=127.0.0.1,port=2321");
        assert_eq!(l.index, DEFAULT_NV_INDEX);
        let l = TpmLocation::parse("device:/dev/tpmrm0;index=0x1500100").unwrap();
        assert_eq!(
            (l.tcti.as_str(), l.index),
            ("device:/dev/tpmrm0", 0x0150_0100)
        );
        assert_eq!(l.to_string(), "tpm:device:/dev/tpmrm0;index=0x01500100");
        let l = TpmLocation::parse("").unwrap();
        assert_eq!((l.tcti.as_str(), l.index), (DEFAULT_TCTI, DEFAULT_NV_INDEX));
        let l = TpmLocation::parse(";index=22020118").unwrap();
        assert_eq!(l.index, 22_020_118);
        assert_eq!(
            TpmLocation::parse(&l.to_string()["tpm:".len()..]).unwrap(),
            l
        );
        for bad in [
            "bogus:x",
            "swtpm:port=1;index=zz",
            "swtpm;index=0x81000000",
            "swtpm;index=0x01fffffe",
            "swtpm;index=1;index=2",
            "swtpm;colour=blue",
            "swtpm;index",
        ] {
            assert!(TpmLocation::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn header_round_trip_and_damage() {
        let h = TpmHeader {
            params: KdfParams::testing(),
            salt: [9; SALT_LEN],
            slots: [0x0150_0017, 0x0150_0018],
        };
        let bytes = h.encode();
        assert_eq!(&bytes[..8], b"OUBLITPM");
        assert_eq!(TpmHeader::decode(&bytes).unwrap(), h);
        let mut bad = bytes;
        bad[30] ^= 1;
        assert!(TpmHeader::decode(&bad).unwrap_err().contains("checksum"));
        assert!(TpmHeader::decode(&bytes[..60]).is_err());
    }
}
