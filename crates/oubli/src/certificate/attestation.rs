//! A certificate's TPM attestation: TPM2_NV_Certify of the vault's slot indices before and after the commit, bound to the certificate, and its checks.
//!
//! At issue ([`TpmEvidence`]): before the commit, the TPM certifies the
//! slot holding epoch N's record (under a random nonce); after it, both
//! slots ([`oubli_vault::TpmVault::certify_slots`]) with qualifying data
//! that hashes the rest of the certificate ([`qualifying_data`]), so the
//! attestation cannot be lifted into another certificate. At verification
//! ([`check`]), without a TPM: one AK signed all three, in that order on the
//! TPM's clock, and after the commit no slot holds what the slot held
//! before, the other slot being blank. With the store's TPM at hand
//! ([`check_now`]): a fresh certification by the same AK, which says
//! whether the TPM's NV memory holds epoch N's record again (a rolled-back
//! simulator, or a vault restored by hand).
//!
//! Limits (docs/CERTIFICATE.md, "TPM attestation"): the AK is not
//! certified by the TPM's endorsement-key certificate, so the attestation
//! proves only that the holder of this AK signed it; and that the record
//! certified before the commit was epoch N's is the issuing host's word.

use super::{Certificate, VaultAttestation};
use base64::Engine as _;
use oubli_vault::tpm_attest::{
    verify_rotation, NvCertification, RotationCertifiedState, SlotCertifications,
};

/// Domain separation of [`qualifying_data`].
const QUALIFYING_DOMAIN: &[u8] = b"oubli certificate tpm qualifying data v1\0";

/// The TPM's `extraData` for `c`: SHA-256 of the certificate's signed bytes
/// with no attestation in it. It covers the id, the time and every fact the
/// certificate states, so an attestation verifies only with its own
/// certificate.
pub fn qualifying_data(c: &Certificate) -> [u8; 32] {
    let mut bare = c.clone();
    bare.vault_attestation = None;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(QUALIFYING_DOMAIN);
    ctx.update(&bare.signed_bytes());
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// The TPM's certifications around one commit, as the certificate carries
/// them: `before` (under the nonce `before_data`) of the slot holding epoch
/// N's record, `after` of both slots (under [`qualifying_data`]).
pub struct Rotation {
    pub before: NvCertification,
    pub after: SlotCertifications,
}

/// The attestation as the certificate carries it.
pub fn to_model(r: &Rotation, sealed_before: [u8; 32]) -> VaultAttestation {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    VaultAttestation::TpmNvCertify {
        ak_public: b64(&r.after.current.ak_public),
        attest: b64(&r.after.current.attest),
        signature: b64(&r.after.current.signature),
        nv_index: r.after.current.nv_index,
        qualifying_data: hex::encode(&r.after.current.qualifying_data),
        other_nv_index: r.after.other.nv_index,
        other_attest: b64(&r.after.other.attest),
        other_signature: b64(&r.after.other.signature),
        sealed_record_before: hex::encode(sealed_before),
        before_nv_index: r.before.nv_index,
        before_attest: b64(&r.before.attest),
        before_signature: b64(&r.before.signature),
        before_qualifying_data: hex::encode(&r.before.qualifying_data),
    }
}

/// The certifications and the sealed digest of epoch N's record, decoded.
fn from_model(a: &VaultAttestation) -> Result<(Rotation, [u8; 32]), String> {
    let VaultAttestation::TpmNvCertify {
        ak_public,
        attest,
        signature,
        nv_index,
        qualifying_data,
        other_nv_index,
        other_attest,
        other_signature,
        sealed_record_before,
        before_nv_index,
        before_attest,
        before_signature,
        before_qualifying_data,
    } = a;
    let b64 = |what: &str, s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| format!("the TPM attestation's {what} is not base64"))
    };
    let hex = |what: &str, s: &str| {
        hex::decode(s).map_err(|_| format!("the TPM attestation's {what} is not hex"))
    };
    let after_data = hex("qualifying_data", qualifying_data)?;
    let before: [u8; 32] = hex("sealed_record_before", sealed_record_before)?
        .try_into()
        .map_err(|_| "the TPM attestation's sealed_record_before is not a SHA-256".to_string())?;
    let ak_public = b64("ak_public", ak_public)?;
    let cert = |index: u32, attest: Vec<u8>, signature: Vec<u8>, data: &[u8]| NvCertification {
        ak_public: ak_public.clone(),
        nv_index: index,
        attest,
        signature,
        qualifying_data: data.to_vec(),
    };
    Ok((
        Rotation {
            before: cert(
                *before_nv_index,
                b64("before_attest", before_attest)?,
                b64("before_signature", before_signature)?,
                &hex("before_qualifying_data", before_qualifying_data)?,
            ),
            after: SlotCertifications {
                current: cert(
                    *nv_index,
                    b64("attest", attest)?,
                    b64("signature", signature)?,
                    &after_data,
                ),
                other: cert(
                    *other_nv_index,
                    b64("other_attest", other_attest)?,
                    b64("other_signature", other_signature)?,
                    &after_data,
                ),
            },
        },
        before,
    ))
}

/// The slot indices of the TPM vault the certificate names
/// (`method.vault_location`, `tpm:TCTI;index=0x...`): base + 1 and + 2.
fn slot_indices(c: &Certificate) -> Result<[u32; 2], String> {
    let location = &c.method.vault_location;
    let base = location
        .rsplit_once(";index=")
        .and_then(|(_, index)| {
            let index = index.trim();
            match index.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => index.parse().ok(),
            }
        })
        .ok_or_else(|| {
            format!("the certificate's vault location {location:?} names no TPM NV index")
        })?;
    Ok([base + 1, base + 2])
}

/// Checks the certificate's attestation, with no TPM: see [`check_model`].
/// `Ok(None)` if it has none; `Ok(Some(summary))` if it verifies.
pub fn check(c: &Certificate) -> Result<Option<String>, String> {
    let Some(a) = &c.vault_attestation else {
        return Ok(None);
    };
    let state = check_model(c, a)?;
    let (before, after) = (&state.before, &state.after);
    Ok(Some(format!(
        "TPM attestation valid: before the commit NV index {:#010x} held epoch {}'s record \
         (SHA-256 {}, TPM clock {} ms); after it, index {:#010x} holds another record \
         (SHA-256 {}, TPM clock {} ms) and index {:#010x} is blank. Signed by TPM attestation \
         key {}, which no endorsement certificate ties to a TPM: pin it (docs/CERTIFICATE.md)",
        before.nv_index,
        c.store.epoch_before,
        hex::encode(before.digest),
        before.clock,
        after.current.nv_index,
        hex::encode(after.current.digest),
        after.current.clock,
        after.other.nv_index,
        hex::encode(&after.current.ak_name),
    )))
}

/// The attestation is of a TPM vault, of its two slots (the location the
/// certificate names), signed by one AK: before the commit, over a nonce,
/// the slot holding a record of `sealed_record_before`; after it, over this
/// certificate's [`qualifying_data`], the current slot holding another
/// record and the other slot blank, later on the TPM's clock.
fn check_model(c: &Certificate, a: &VaultAttestation) -> Result<RotationCertifiedState, String> {
    if c.method.vault_kind != "tpm2" {
        return Err(format!(
            "it carries a TPM attestation but its vault is of kind {:?}",
            c.method.vault_kind
        ));
    }
    let (r, sealed_before) = from_model(a)?;
    let mut slots = [r.after.current.nv_index, r.after.other.nv_index];
    slots.sort_unstable();
    if slots != slot_indices(c)? {
        return Err(format!(
            "the TPM attestation is of NV indices {:#010x}/{:#010x}, not the slots of the vault {}",
            slots[0], slots[1], c.method.vault_location
        ));
    }
    let state = verify_rotation(
        &r.before,
        &r.before.qualifying_data,
        &r.after,
        &qualifying_data(c),
    )
    .map_err(|e| e.to_string())?;
    if state.before.digest != sealed_before {
        return Err(
            "the TPM attestation's sealed_record_before is not what the TPM certified before the commit"
                .into(),
        );
    }
    Ok(state)
}

#[cfg(feature = "tpm")]
pub use with_tpm::*;

#[cfg(feature = "tpm")]
mod with_tpm {
    use super::*;
    use oubli_crypto::{CryptoProvider, SecretBytes};
    use oubli_vault::tpm_attest::verify_slot_certifications;
    use oubli_vault::{TpmLocation, TpmVault, VaultError, VaultLocation};
    use std::sync::Arc;

    /// What a command that certifies an erasure on a TPM vault keeps across
    /// its commit: a handle on the vault and the TPM's certification of
    /// the slot holding epoch N's record.
    pub struct TpmEvidence {
        vault: TpmVault,
        before: NvCertification,
        sealed_before: [u8; 32],
    }

    impl TpmEvidence {
        /// Before the commit: opens the vault at `location` (as the user
        /// wrote it) if it is a TPM vault, and has the TPM certify the slot
        /// holding the current record (under a random nonce). `Ok(None)`
        /// for any other kind of vault.
        pub fn before_commit(
            location: &str,
            password: &SecretBytes,
            provider: Arc<dyn CryptoProvider>,
        ) -> Result<Option<TpmEvidence>, VaultError> {
            let Some(vault) = open_tpm(location, password, provider)? else {
                return Ok(None);
            };
            let nonce = super::super::random_bytes::<32>();
            let before = vault.certify_slots(&nonce)?.current;
            let state = oubli_vault::tpm_attest::verify_nv_certification(&before, None, &nonce)
                .map_err(|e| VaultError::Corrupt(e.to_string()))?;
            Ok(Some(TpmEvidence {
                vault,
                before,
                sealed_before: state.digest,
            }))
        }

        /// After the commit, with every other field of `c` filled in: the
        /// TPM certifies both slots, bound to `c`.
        pub fn attest(&self, c: &Certificate) -> Result<VaultAttestation, VaultError> {
            let after = self.vault.certify_slots(&qualifying_data(c))?;
            let rotation = Rotation {
                before: self.before.clone(),
                after,
            };
            Ok(to_model(&rotation, self.sealed_before))
        }
    }

    /// Opens `location` if it is a TPM vault (`tpm:...`), else `Ok(None)`.
    pub fn open_tpm(
        location: &str,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<Option<TpmVault>, VaultError> {
        let VaultLocation::Tpm(spec) = VaultLocation::parse(location)? else {
            return Ok(None);
        };
        let options = oubli_vault::VaultOptions::from_env().tpm;
        TpmVault::open(&TpmLocation::parse(&spec)?, password, provider, options).map(Some)
    }

    /// `verify --store` on a TPM vault: the TPM certifies its slots again
    /// now, under a fresh nonce; what is wrong, if anything. The AK must be
    /// the certificate's (the same TPM), the current slot must not hold
    /// epoch N's sealed record, the other must be blank.
    pub fn check_now(vault: &TpmVault, c: &Certificate) -> Result<Vec<String>, VaultError> {
        let Some(a) = &c.vault_attestation else {
            return Ok(vec![
                "the vault is in a TPM but the certificate carries no TPM attestation".into(),
            ]);
        };
        let (then, before) = match from_model(a) {
            Ok(decoded) => decoded,
            Err(e) => return Ok(vec![e]),
        };
        let then = then.after;
        let nonce = super::super::random_bytes::<32>();
        let now = vault.certify_slots(&nonce)?;
        let mut problems = Vec::new();
        if now.current.ak_public != then.current.ak_public {
            problems.push(
                "the TPM's attestation key now is not the certificate's: another TPM, or its endorsement hierarchy was reset"
                    .to_string(),
            );
        }
        if let Err(e) = verify_slot_certifications(&now, None, Some(before), &nonce) {
            problems.push(format!("the TPM now: {}", e.0));
        }
        Ok(problems)
    }

    /// `verify --store` when the vault at `location` (as the user wrote
    /// it) is a TPM vault: opens it and runs [`check_now`]; `Ok(None)` for
    /// any other kind of vault.
    pub fn check_now_at(
        location: &str,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
        c: &Certificate,
    ) -> Result<Option<Vec<String>>, VaultError> {
        match open_tpm(location, password, provider)? {
            Some(vault) => check_now(&vault, c).map(Some),
            None => Ok(None),
        }
    }
}

/// Stand-ins in a build without TPM support: no vault is a TPM vault (the
/// store itself refuses `tpm:` locations there), so there is no evidence
/// to take; a certificate's attestation is still checked by [`check`].
#[cfg(not(feature = "tpm"))]
mod without_tpm {
    use super::*;
    use oubli_crypto::{CryptoProvider, SecretBytes};
    use oubli_vault::VaultError;
    use std::sync::Arc;

    /// Never made in a build without TPM support.
    pub enum TpmEvidence {}

    impl TpmEvidence {
        pub fn before_commit(
            _location: &str,
            _password: &SecretBytes,
            _provider: Arc<dyn CryptoProvider>,
        ) -> Result<Option<TpmEvidence>, VaultError> {
            Ok(None)
        }

        pub fn attest(&self, _c: &Certificate) -> Result<VaultAttestation, VaultError> {
            match *self {}
        }
    }

    pub fn check_now_at(
        _location: &str,
        _password: &SecretBytes,
        _provider: Arc<dyn CryptoProvider>,
        _c: &Certificate,
    ) -> Result<Option<Vec<String>>, VaultError> {
        Ok(None)
    }
}

#[cfg(not(feature = "tpm"))]
pub use without_tpm::*;
