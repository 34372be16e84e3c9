//! A certificate's TPM attestation: TPM2_NV_Certify of the vault's two slot indices, bound to the certificate, and its checks.
//!
//! At issue ([`TpmEvidence`]): before the commit, the SHA-256 of the sealed
//! slot holding epoch N's record; after it, the TPM's signed digests of both
//! slots ([`oubli_vault::TpmVault::certify_slots`]) with qualifying data
//! that hashes the rest of the certificate ([`qualifying_data`]), so the
//! attestation cannot be lifted into another certificate. At verification
//! ([`check`]), without a TPM: the AK's signature, the binding, that the
//! current slot does not hold epoch N's record and the other slot is blank.
//! With the store's TPM at hand ([`check_now`]): a fresh certification by
//! the same AK, which says whether the TPM's NV memory holds epoch N's
//! record again (a rolled-back simulator, or a vault restored by hand).
//!
//! Limits (docs/CERTIFICATE.md, "TPM attestation"): the AK is not
//! certified by the TPM's endorsement-key certificate, so the attestation
//! proves only that the holder of this AK signed it.

use super::{Certificate, VaultAttestation};
use base64::Engine as _;
use oubli_vault::tpm_attest::{
    verify_slot_certifications, NvCertification, SlotCertifications, SlotsCertifiedState,
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

/// The attestation as the certificate carries it.
pub fn to_model(certs: &SlotCertifications, sealed_before: [u8; 32]) -> VaultAttestation {
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    VaultAttestation::TpmNvCertify {
        ak_public: b64(&certs.current.ak_public),
        attest: b64(&certs.current.attest),
        signature: b64(&certs.current.signature),
        nv_index: certs.current.nv_index,
        qualifying_data: hex::encode(&certs.current.qualifying_data),
        other_nv_index: certs.other.nv_index,
        other_attest: b64(&certs.other.attest),
        other_signature: b64(&certs.other.signature),
        sealed_record_before: hex::encode(sealed_before),
    }
}

/// The certifications and the sealed digest of epoch N's record, decoded.
fn from_model(a: &VaultAttestation) -> Result<(SlotCertifications, [u8; 32]), String> {
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
    } = a;
    let b64 = |what: &str, s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| format!("the TPM attestation's {what} is not base64"))
    };
    let qualifying_data = hex::decode(qualifying_data)
        .map_err(|_| "the TPM attestation's qualifying data is not hex".to_string())?;
    let before: [u8; 32] = hex::decode(sealed_record_before)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or("the TPM attestation's sealed_record_before is not a hex SHA-256")?;
    let ak_public = b64("ak_public", ak_public)?;
    Ok((
        SlotCertifications {
            current: NvCertification {
                ak_public: ak_public.clone(),
                nv_index: *nv_index,
                attest: b64("attest", attest)?,
                signature: b64("signature", signature)?,
                qualifying_data: qualifying_data.clone(),
            },
            other: NvCertification {
                ak_public,
                nv_index: *other_nv_index,
                attest: b64("other_attest", other_attest)?,
                signature: b64("other_signature", other_signature)?,
                qualifying_data,
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
    Ok(Some(format!(
        "TPM attestation valid: NV index {:#010x} holds a record of SHA-256 {}, not epoch {}'s; \
         the other slot {:#010x} is blank; signed by TPM attestation key {} at TPM clock {} ms \
         (reset {}, restart {}). The key is not tied to a TPM by an endorsement certificate: \
         pin it (docs/CERTIFICATE.md)",
        state.current.nv_index,
        hex::encode(state.current.digest),
        c.store.epoch_before,
        state.other.nv_index,
        hex::encode(&state.current.ak_name),
        state.current.clock,
        state.current.reset_count,
        state.current.restart_count,
    )))
}

/// The attestation is of a TPM vault, of its two slots (the location the
/// certificate names), signed by the AK over this certificate's
/// [`qualifying_data`]; the current slot does not hold epoch N's sealed
/// record and the other is blank.
fn check_model(c: &Certificate, a: &VaultAttestation) -> Result<SlotsCertifiedState, String> {
    if c.method.vault_kind != "tpm2" {
        return Err(format!(
            "it carries a TPM attestation but its vault is of kind {:?}",
            c.method.vault_kind
        ));
    }
    let (certs, before) = from_model(a)?;
    let mut slots = [certs.current.nv_index, certs.other.nv_index];
    slots.sort_unstable();
    if slots != slot_indices(c)? {
        return Err(format!(
            "the TPM attestation is of NV indices {:#010x}/{:#010x}, not the slots of the vault {}",
            slots[0], slots[1], c.method.vault_location
        ));
    }
    verify_slot_certifications(&certs, None, Some(before), &qualifying_data(c))
        .map_err(|e| e.to_string())
}

#[cfg(feature = "tpm")]
pub use with_tpm::*;

#[cfg(feature = "tpm")]
mod with_tpm {
    use super::*;
    use oubli_crypto::{CryptoProvider, SecretBytes};
    use oubli_vault::{TpmLocation, TpmVault, VaultError, VaultLocation};
    use std::sync::Arc;

    /// What a command that certifies an erasure on a TPM vault keeps across
    /// its commit: a handle on the vault and the SHA-256 of the sealed slot
    /// that held epoch N's record.
    pub struct TpmEvidence {
        vault: TpmVault,
        sealed_before: [u8; 32],
    }

    impl TpmEvidence {
        /// Before the commit: opens the vault at `location` (as the user
        /// wrote it) if it is a TPM vault, and records the sealed digest of
        /// the current record. `Ok(None)` for any other kind of vault.
        pub fn before_commit(
            location: &str,
            password: &SecretBytes,
            provider: Arc<dyn CryptoProvider>,
        ) -> Result<Option<TpmEvidence>, VaultError> {
            let Some(vault) = open_tpm(location, password, provider)? else {
                return Ok(None);
            };
            let sealed_before = vault.current_record_digest()?;
            Ok(Some(TpmEvidence {
                vault,
                sealed_before,
            }))
        }

        /// After the commit, with every other field of `c` filled in: the
        /// TPM certifies both slots, bound to `c`.
        pub fn attest(&self, c: &Certificate) -> Result<VaultAttestation, VaultError> {
            let certs = self.vault.certify_slots(&qualifying_data(c))?;
            Ok(to_model(&certs, self.sealed_before))
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
}
