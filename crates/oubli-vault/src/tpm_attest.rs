//! Checks a TPM2_NV_Certify of a TPM vault's slot indices without a TPM: the TPMS_ATTEST, the AK and its signature.
//!
//! [`crate::TpmVault::certify_slots`] (the `tpm` feature) asks the TPM to
//! sign, with a restricted attestation key (AK), the SHA-256 of what each of
//! the vault's two slot indices holds (the digest form of TPM2_NV_Certify,
//! `TPMS_NV_DIGEST_CERTIFY_INFO`, TPM 2.0 library rev 1.59): never the slot
//! itself, which is the sealed epoch key. This module checks such a
//! certification with nothing but `ring`, so a certificate can be verified on
//! a machine without a TPM and in a build without the `tpm` feature.
//!
//! What it proves, and what it cannot (docs/CERTIFICATE.md, "TPM
//! attestation"): a restricted signing key signs only TPMS_ATTEST structures
//! the TPM itself produced, so *if the AK is a key of that TPM* the digests
//! are what the NV indices held at the TPM's clock. Nothing here ties the
//! AK to a TPM: that needs the TPM's endorsement-key certificate and a
//! TPM2_MakeCredential/ActivateCredential round, which this module does not
//! do. The AK is a primary key of the endorsement hierarchy, re-created
//! identically on every call, so an auditor who has established it once
//! can pin its name ([`NvCertifiedState::ak_name`]).

use std::fmt;

/// `TPM_GENERATED_VALUE`: the TPM puts it at the head of every structure it
/// signs, and a restricted key refuses to sign data that starts with it.
const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_NV_DIGEST`.
const TPM_ST_ATTEST_NV_DIGEST: u16 = 0x801c;
const TPM_ALG_ECC: u16 = 0x0023;
const TPM_ALG_SHA256: u16 = 0x000b;
const TPM_ALG_NULL: u16 = 0x0010;
const TPM_ALG_ECDSA: u16 = 0x0018;
const TPM_ECC_NIST_P256: u16 = 0x0003;
/// `TPM_RH_ENDORSEMENT`: the hierarchy the AK is a primary key of.
const TPM_RH_ENDORSEMENT: u32 = 0x4000_000b;

// TPMA_OBJECT bits an attestation key must have (and `decrypt` it must not).
const OBJ_FIXED_TPM: u32 = 1 << 1;
const OBJ_FIXED_PARENT: u32 = 1 << 4;
const OBJ_SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
const OBJ_RESTRICTED: u32 = 1 << 16;
const OBJ_DECRYPT: u32 = 1 << 17;
const OBJ_SIGN: u32 = 1 << 18;

/// TPMA_NV of a vault slot index once written: read and write with the
/// slot's authorization value only (`AUTHREAD | AUTHWRITE`), an ordinary
/// index, and `WRITTEN`. The NV index's name hashes these, so a slot index
/// defined with other rules (say, readable by the owner) has another name
/// and fails [`verify_nv_certification`].
pub const SLOT_NV_ATTRIBUTES: u32 = (1 << 2) | (1 << 18) | (1 << 29);

/// Bytes of one slot index (docs/FORMAT-vault.md).
pub const SLOT_NV_SIZE: u16 = crate::format::SLOT_LEN as u16;

/// A TPM2_NV_Certify (digest form) of one NV index, as the TPM returned it.
///
/// Holds no secret: the index's contents are not in it, only their SHA-256
/// inside `attest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvCertification {
    /// The attestation key's public area, a marshalled `TPM2B_PUBLIC`
    /// (ECC P-256, ECDSA with SHA-256, restricted signing).
    pub ak_public: Vec<u8>,
    /// The certified NV index.
    pub nv_index: u32,
    /// The `TPMS_ATTEST` the TPM signed (the contents of the `TPM2B_ATTEST`
    /// it returns, without the size).
    pub attest: Vec<u8>,
    /// The signature, a marshalled `TPMT_SIGNATURE`.
    pub signature: Vec<u8>,
    /// The caller's qualifying data (`extraData`): binds the attestation to
    /// one certificate, so it cannot be replayed into another.
    pub qualifying_data: Vec<u8>,
}

/// What a certification that verified says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvCertifiedState {
    pub nv_index: u32,
    /// SHA-256 of the index's contents when the TPM certified it.
    pub digest: [u8; 32],
    /// The AK's TPM name (`0x000b` || SHA-256 of its public area): the
    /// fingerprint to pin.
    pub ak_name: Vec<u8>,
    /// The TPM's clock (milliseconds powered on, `TPMS_CLOCK_INFO.clock`),
    /// and its reset and restart counts.
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    pub firmware_version: u64,
}

/// The two slot indices of a TPM vault, certified together: one holds the
/// current record, the other was overwritten with zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCertifications {
    /// The slot holding the current record.
    pub current: NvCertification,
    /// The other slot, which a rotation blanks.
    pub other: NvCertification,
}

/// What [`verify_slot_certifications`] established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotsCertifiedState {
    pub current: NvCertifiedState,
    pub other: NvCertifiedState,
}

/// Why a certification does not verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestationError(pub String);

impl fmt::Display for AttestationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TPM attestation: {}", self.0)
    }
}

impl std::error::Error for AttestationError {}

fn fail<T>(why: impl Into<String>) -> Result<T, AttestationError> {
    Err(AttestationError(why.into()))
}

/// SHA-256 of a blank (all-zero) slot: what the slot a rotation cleared holds.
pub fn blank_slot_digest() -> [u8; 32] {
    sha256(&[0u8; crate::format::SLOT_LEN])
}

/// SHA-256 of one sealed slot's bytes (what NV_Certify digests).
pub fn slot_digest(slot: &[u8]) -> [u8; 32] {
    sha256(slot)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// The TPM name of a vault slot index: `0x000b` || SHA-256 of its
/// `TPMS_NV_PUBLIC` (index, name algorithm, [`SLOT_NV_ATTRIBUTES`], empty
/// policy, [`SLOT_NV_SIZE`]).
pub fn slot_nv_name(nv_index: u32) -> Vec<u8> {
    let mut public = Vec::with_capacity(14);
    public.extend_from_slice(&nv_index.to_be_bytes());
    public.extend_from_slice(&TPM_ALG_SHA256.to_be_bytes());
    public.extend_from_slice(&SLOT_NV_ATTRIBUTES.to_be_bytes());
    public.extend_from_slice(&0u16.to_be_bytes());
    public.extend_from_slice(&SLOT_NV_SIZE.to_be_bytes());
    name_of(&public)
}

fn name_of(public: &[u8]) -> Vec<u8> {
    let mut name = TPM_ALG_SHA256.to_be_bytes().to_vec();
    name.extend_from_slice(&sha256(public));
    name
}

/// Big-endian reader over a TPM structure; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], AttestationError> {
        if self.bytes.len() < n {
            return fail(format!("{} is truncated", self.what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, AttestationError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }

    fn u32(&mut self) -> Result<u32, AttestationError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u64(&mut self) -> Result<u64, AttestationError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// A `TPM2B_*`: a 16-bit size, then that many bytes.
    fn sized(&mut self) -> Result<&'a [u8], AttestationError> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    fn end(&self) -> Result<(), AttestationError> {
        if !self.bytes.is_empty() {
            return fail(format!(
                "{} has {} trailing bytes",
                self.what,
                self.bytes.len()
            ));
        }
        Ok(())
    }
}

/// The AK's public key as an uncompressed P-256 point, and its name.
struct AkPublic {
    point: Vec<u8>,
    name: Vec<u8>,
}

/// Parses a marshalled `TPM2B_PUBLIC` and accepts only what an AK made by
/// the vault is: ECC P-256, ECDSA/SHA-256, a restricted signing key fixed
/// to its TPM that the TPM generated.
fn parse_ak_public(bytes: &[u8]) -> Result<AkPublic, AttestationError> {
    let mut outer = Reader::new(bytes, "the AK public area");
    let tpmt = outer.sized()?;
    outer.end()?;
    let mut r = Reader::new(tpmt, "the AK public area");
    if r.u16()? != TPM_ALG_ECC {
        return fail("the AK is not an ECC key");
    }
    if r.u16()? != TPM_ALG_SHA256 {
        return fail("the AK's name algorithm is not SHA-256");
    }
    let attributes = r.u32()?;
    let need =
        OBJ_FIXED_TPM | OBJ_FIXED_PARENT | OBJ_SENSITIVE_DATA_ORIGIN | OBJ_RESTRICTED | OBJ_SIGN;
    if attributes & need != need || attributes & OBJ_DECRYPT != 0 {
        return fail(format!(
            "the AK is not a restricted signing key generated in and fixed to its TPM (attributes {attributes:#010x})"
        ));
    }
    r.sized()?; // authPolicy: any
    if r.u16()? != TPM_ALG_NULL {
        return fail("the AK has a symmetric algorithm (a signing key has none)");
    }
    if r.u16()? != TPM_ALG_ECDSA || r.u16()? != TPM_ALG_SHA256 {
        return fail("the AK's scheme is not ECDSA with SHA-256");
    }
    if r.u16()? != TPM_ECC_NIST_P256 {
        return fail("the AK's curve is not NIST P-256");
    }
    if r.u16()? != TPM_ALG_NULL {
        return fail("the AK has a KDF scheme");
    }
    let x = r.sized()?;
    let y = r.sized()?;
    r.end()?;
    if x.len() != 32 || y.len() != 32 {
        return fail("the AK's public point is not 32+32 bytes");
    }
    let mut point = vec![0x04];
    point.extend_from_slice(x);
    point.extend_from_slice(y);
    Ok(AkPublic {
        point,
        name: name_of(tpmt),
    })
}

/// Parses a marshalled `TPMT_SIGNATURE` (ECDSA/SHA-256) into `r || s`.
fn parse_signature(bytes: &[u8]) -> Result<Vec<u8>, AttestationError> {
    let mut r = Reader::new(bytes, "the signature");
    if r.u16()? != TPM_ALG_ECDSA || r.u16()? != TPM_ALG_SHA256 {
        return fail("the signature is not ECDSA with SHA-256");
    }
    let mut fixed = Vec::with_capacity(64);
    for part in [r.sized()?, r.sized()?] {
        // Big-endian integers; a TPM may drop leading zero bytes.
        let part = &part[part.iter().take_while(|&&b| b == 0).count()..];
        if part.len() > 32 {
            return fail("the signature's r or s is longer than 32 bytes");
        }
        fixed.extend(std::iter::repeat_n(0u8, 32 - part.len()));
        fixed.extend_from_slice(part);
    }
    r.end()?;
    Ok(fixed)
}

/// Checks one NV_Certify: the AK's signature over `attest`, that `attest`
/// is a TPM-generated `TPMS_NV_DIGEST_CERTIFY_INFO` for `c.nv_index` as a
/// vault slot index ([`slot_nv_name`]), signed by that AK as a primary key
/// of the endorsement hierarchy, that its `extraData` is `qualifying_data`
/// (the caller's, not the one stored in `c`), and, if given, that the digest
/// is `expected_digest`.
pub fn verify_nv_certification(
    c: &NvCertification,
    expected_digest: Option<[u8; 32]>,
    qualifying_data: &[u8],
) -> Result<NvCertifiedState, AttestationError> {
    let ak = parse_ak_public(&c.ak_public)?;
    let signature = parse_signature(&c.signature)?;
    // The signature first: nothing in `attest` is believed before it.
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &ak.point)
        .verify(&c.attest, &signature)
        .or_else(|_| fail("the signature does not match the attestation and the AK"))?;

    let mut r = Reader::new(&c.attest, "the attestation");
    if r.u32()? != TPM_GENERATED_VALUE {
        return fail("the attestation was not generated by a TPM (bad magic)");
    }
    let kind = r.u16()?;
    if kind != TPM_ST_ATTEST_NV_DIGEST {
        return fail(format!(
            "the attestation is of type {kind:#06x}, not an NV digest certification (0x801c)"
        ));
    }
    let signer = r.sized()?;
    let extra = r.sized()?;
    let clock = r.u64()?;
    let reset_count = r.u32()?;
    let restart_count = r.u32()?;
    let _safe = r.take(1)?;
    let firmware_version = r.u64()?;
    let index_name = r.sized()?;
    let digest = r.sized()?;
    r.end()?;

    // The qualified name of a primary key of the endorsement hierarchy:
    // nameAlg || H(hierarchy handle || AK name).
    let mut qualified = TPM_RH_ENDORSEMENT.to_be_bytes().to_vec();
    qualified.extend_from_slice(&ak.name);
    if signer != name_of(&qualified) {
        return fail(
            "the attestation's signer is not the AK as a primary key of the endorsement hierarchy",
        );
    }
    if extra != qualifying_data {
        return fail("the attestation's qualifying data is not this certificate's");
    }
    if c.qualifying_data != qualifying_data {
        return fail("the certification's stored qualifying data is not this certificate's");
    }
    if index_name != slot_nv_name(c.nv_index) {
        return fail(format!(
            "the attestation is not of NV index {:#010x} as a vault slot (its NV name differs)",
            c.nv_index
        ));
    }
    let digest: [u8; 32] = digest
        .try_into()
        .or_else(|_| fail("the certified digest is not SHA-256"))?;
    if let Some(expected) = expected_digest {
        if digest != expected {
            return fail(format!(
                "NV index {:#010x} held content with SHA-256 {}, not the expected {}",
                c.nv_index,
                hex(&digest),
                hex(&expected)
            ));
        }
    }
    Ok(NvCertifiedState {
        nv_index: c.nv_index,
        digest,
        ak_name: ak.name,
        clock,
        reset_count,
        restart_count,
        firmware_version,
    })
}

/// Checks both slots of a vault: each certification verifies
/// ([`verify_nv_certification`]) under the same AK and qualifying data, they
/// cover the vault's two adjacent slot indices, the other slot is blank, and
/// the current one holds `new_digest` (if given) and neither holds
/// `old_digest` (if given): the record of the erased epoch is in no slot.
pub fn verify_slot_certifications(
    c: &SlotCertifications,
    new_digest: Option<[u8; 32]>,
    old_digest: Option<[u8; 32]>,
    qualifying_data: &[u8],
) -> Result<SlotsCertifiedState, AttestationError> {
    if c.current.ak_public != c.other.ak_public {
        return fail("the two slots were certified by different AKs");
    }
    if c.current.nv_index.abs_diff(c.other.nv_index) != 1 {
        return fail(format!(
            "NV indices {:#010x} and {:#010x} are not a vault's two slots",
            c.current.nv_index, c.other.nv_index
        ));
    }
    let current = verify_nv_certification(&c.current, new_digest, qualifying_data)?;
    let other = verify_nv_certification(&c.other, None, qualifying_data)
        .map_err(|e| AttestationError(format!("{} (the cleared slot)", e.0)))?;
    if other.digest != blank_slot_digest() {
        return fail(format!(
            "the vault's other slot {:#010x} is not blank",
            c.other.nv_index
        ));
    }
    if let Some(old) = old_digest {
        if current.digest == old {
            return fail(format!(
                "slot {:#010x} still holds the erased epoch's record",
                c.current.nv_index
            ));
        }
    }
    Ok(SlotsCertifiedState { current, other })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What [`verify_rotation`] established: the slot holding the record
/// before, and both slots after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationCertifiedState {
    pub before: NvCertifiedState,
    pub after: SlotsCertifiedState,
}

/// Checks a rotation certified on both sides: `before` (the slot holding
/// the old record, certified before the rotation under `before_data`) and
/// `after` (both slots, under `after_data`), by one AK, in that order on the
/// TPM's clock; after it, no slot holds what `before` certified and the
/// other slot is blank ([`verify_slot_certifications`]).
pub fn verify_rotation(
    before: &NvCertification,
    before_data: &[u8],
    after: &SlotCertifications,
    after_data: &[u8],
) -> Result<RotationCertifiedState, AttestationError> {
    if before.ak_public != after.current.ak_public {
        return fail("the certifications before and after were made by different AKs");
    }
    if before.nv_index != after.current.nv_index && before.nv_index != after.other.nv_index {
        return fail(format!(
            "the certification before is of NV index {:#010x}, not one of the vault's slots",
            before.nv_index
        ));
    }
    let b = verify_nv_certification(before, None, before_data)
        .map_err(|e| AttestationError(format!("{} (before the commit)", e.0)))?;
    let a = verify_slot_certifications(after, None, Some(b.digest), after_data)?;
    // The TPM's clock counts milliseconds powered on and only moves on
    // (within one reset it never goes back): "after" must not precede "before".
    let (bt, at) = (
        (b.reset_count, b.clock),
        (a.current.reset_count, a.current.clock),
    );
    if at < bt {
        return fail(format!(
            "the certification after the commit (TPM reset {}, clock {} ms) precedes the one before it (reset {}, clock {} ms)",
            at.0, at.1, bt.0, bt.1
        ));
    }
    Ok(RotationCertifiedState {
        before: b,
        after: a,
    })
}
