//! Certificates of sanitization (issue 42): what one commit made unrecoverable, signed, checkable later.
//!
//! A certificate is a JSON file (schema in docs/CERTIFICATE.md):
//! `{"certificate": {...}, "signature": {...}}`. The signature is Ed25519
//! over the compact serialisation of the `certificate` member, members in
//! the order of this module's structs, which is also the order in which
//! they appear in the file ([`Certificate::signed_bytes`]). Every struct
//! refuses unknown members, so what a verifier reads is exactly what was
//! signed.
//!
//! The commands that end an erasure build one ([`sign`] signs it, [`render`]
//! shows it as text or HTML, [`verify`] checks it, alone or against the
//! store as it is now).

pub mod attestation;
pub mod measure;
pub mod render;
pub mod sign;
pub mod verify;

use serde::{Deserialize, Serialize};

/// The `format` member: what the file is.
pub const FORMAT: &str = "oubli-certificate-of-sanitization";
/// The `version` member: the schema version this build writes and reads.
pub const VERSION: u32 = 1;
/// Domain separation of the vault-record commitments ([`record_digest`]).
pub const RECORD_DIGEST_DOMAIN: &str = "oubli vault record v1";

/// The file: the certificate and its signature.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SignedCertificate {
    pub certificate: Certificate,
    pub signature: Signature,
}

/// What one erasure did, where, how, and how it was checked.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// 128 random bits, hex: names this certificate.
    pub id: String,
    /// When the erasure was done and checked, RFC 3339 in UTC.
    pub issued_at: String,
    /// The command that erased (`oubli rm --purge`, ...).
    pub command: String,
    pub erased: Erased,
    pub store: StoreFacts,
    pub method: Method,
    pub verification: Verification,
    pub tool: Tool,
    /// Commitments to the vault's record before and after.
    pub vault_records: VaultRecords,
    /// A TPM's signed statement about the vault's NV index (TPM vaults).
    pub vault_attestation: Option<VaultAttestation>,
}

/// What was erased.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Erased {
    /// How names appear in `items` and `retained`.
    pub names: NameForm,
    /// What the command erased, as the user named it.
    pub items: Vec<ErasedItem>,
    /// Names a mount removed that the commit erased past those listed in
    /// `items` (a mount keeps 100,000 a commit); absent when 0, so that
    /// certificates without it sign the same bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub items_unlisted: u64,
    /// What the command removed but did NOT erase, and why (a snapshot
    /// still holds the data): listed so that nobody takes it for erased.
    pub retained: Vec<RetainedItem>,
    /// Everything the commit made unrecoverable, these items included.
    pub epoch_totals: EpochTotals,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Names in clear, or salted hashes (`--hash-names`), for when the names
/// themselves are personal data.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "form", rename_all = "snake_case", deny_unknown_fields)]
pub enum NameForm {
    Plain,
    /// Each name is hex SHA-256(salt ‖ UTF-8 name); `salt` is 16 random bytes, hex.
    SaltedSha256 {
        salt: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A name of the store (`oubli rm`).
    Name,
    /// A path in a mount (`oubli redact`).
    Path,
    /// A snapshot (`oubli snapshot rm`).
    Snapshot,
    /// A key share (`oubli share destroy`).
    Share,
}

impl ItemKind {
    pub fn label(self) -> &'static str {
        match self {
            ItemKind::Name => "name",
            ItemKind::Path => "path",
            ItemKind::Snapshot => "snapshot",
            ItemKind::Share => "share",
        }
    }
}

/// One thing the command erased.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ErasedItem {
    pub kind: ItemKind,
    /// The name, or its salted hash.
    pub name: String,
    /// The store's objects whose data went (object ids are never reused).
    pub object_ids: Vec<u64>,
    /// Their size in bytes (for a snapshot: the sealed bytes only it held).
    pub bytes: u64,
    /// Snapshots the data was also removed from (names or salted hashes).
    pub from_snapshots: Vec<String>,
}

/// Something the command removed without erasing it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RetainedItem {
    pub kind: ItemKind,
    pub name: String,
    pub object_ids: Vec<u64>,
    /// The snapshots that still hold its data (names or salted hashes).
    pub kept_in: Vec<String>,
}

/// Everything pending erasure that the commit made unrecoverable: the
/// command's items and any deletion made since the previous commit.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EpochTotals {
    /// Deletions (removals, truncations, overwrites) since the previous commit.
    pub deletions: u64,
    /// Sealed bytes they freed.
    pub sealed_bytes: u64,
    /// Units (data cells) the audit opened before the commit that no tree
    /// or snapshot held any more: what the commit erased.
    pub units: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MediumKind {
    Directory,
    S3,
    Nand,
}

/// The store.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StoreFacts {
    /// The store id, hex.
    pub id: String,
    pub medium: MediumKind,
    /// Directory path, `s3://BUCKET/PREFIX`, or the NAND image's path.
    pub location: String,
    /// Epoch N: the one whose key the commit destroyed.
    pub epoch_before: u64,
    /// The epoch the commit began.
    pub epoch_after: u64,
}

/// NIST SP 800-88 sanitization categories.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The key's destruction resists laboratory attack (the vault's overwrite erases).
    Purge,
    /// Not a Purge: the vault's medium may keep old copies of the key.
    Clear,
}

/// How the data was made unrecoverable.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Method {
    /// Always "cryptographic erase".
    pub technique: String,
    pub category: Category,
    /// `file`, `tpm2`, `pkcs11`, `nand`, ...
    pub vault_kind: String,
    /// Where the vault is (no PIN).
    pub vault_location: String,
    /// Whether the vault's overwrite destroys the old key on its device.
    pub vault_overwrite_erases: bool,
    /// The method in one paragraph, for the reader of the certificate.
    pub statement: String,
}

/// How much of the store the audit covered.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Coverage {
    /// Every unit reachable from the store's medium with the vault's keys.
    Full,
    /// A random sample of the erased units.
    Sample { size: u64, of: u64 },
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
}

/// The audit run right after the commit: the adversary of docs/DESIGN.md
/// with the vault's whole content against the store's medium.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    /// Always "oubli audit".
    pub method: String,
    pub coverage: Coverage,
    /// Erased units the audit opened before the commit (with epoch N's key).
    pub erased_units_before: u64,
    /// Units the audit opened after the commit, with the vault's content.
    pub units_opened_after: u64,
    /// Units deleted before the commit that still opened after it (0 to pass).
    pub leaked_units_after: u64,
    /// Epochs whose key the vault still held besides the current one (none to pass).
    pub vault_leftover_epochs: Vec<u64>,
    pub outcome: Outcome,
    /// What the audit cannot see.
    pub limits: Vec<String>,
}

/// The program that erased.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    pub name: String,
    pub version: String,
    /// Features of the build, `+tpm`, `-tpm`, ...
    pub features: Vec<String>,
    pub crypto_provider: String,
}

/// Commitments to the vault's record ([`record_digest`]): before (epoch
/// N's key, gone) and after. `oubli certificate verify --store` compares
/// the vault's record now with `before` to detect a vault rolled back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VaultRecords {
    /// Always "sha-256".
    pub algorithm: String,
    /// Hex digest of epoch N's record.
    pub before: String,
    /// Hex digest of the record that replaced it.
    pub after: String,
}

/// Attestation of the vault's state by the vault's hardware.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VaultAttestation {
    /// TPM2_NV_Certify (digest form) of the vault's NV index, signed by a
    /// TPM attestation key: the index holds a record of this SHA-256.
    /// A TPM vault has two slot indices; both are certified (`attestation`).
    TpmNvCertify {
        /// Base64 TPM2B_PUBLIC of the attestation key.
        ak_public: String,
        /// Base64 TPMS_ATTEST (the bytes the TPM signed) of the slot holding
        /// the current record.
        attest: String,
        /// Base64 TPMT_SIGNATURE.
        signature: String,
        nv_index: u32,
        /// Hex qualifying data (binds the attestation to this certificate:
        /// `attestation::qualifying_data`).
        qualifying_data: String,
        /// The vault's other slot index, which the rotation blanked, and
        /// its certification (same AK, same qualifying data).
        other_nv_index: u32,
        other_attest: String,
        other_signature: String,
        /// Hex SHA-256 of the sealed slot that held epoch N's record (what
        /// NV_Certify would report for it): no slot may hold it again.
        sealed_record_before: String,
        /// The TPM's certification, before the commit, of the slot holding
        /// epoch N's record (same AK; hex qualifying data: a random nonce):
        /// `sealed_record_before` is what the TPM said, not what the host says.
        before_nv_index: u32,
        before_attest: String,
        before_signature: String,
        before_qualifying_data: String,
    },
}

/// The signature over [`Certificate::signed_bytes`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// Always "ed25519".
    pub algorithm: String,
    /// Base64 of the 32-byte public key.
    pub public_key: String,
    /// Base64 of the 64-byte signature.
    pub value: String,
}

impl Certificate {
    /// The bytes the signature covers: the compact JSON of this
    /// certificate, members in declaration order (as in the file).
    pub fn signed_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data serialises")
    }
}

impl SignedCertificate {
    /// The file's content: pretty JSON and a final newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data serialises") + "\n"
    }

    /// Parses a certificate file; any member unknown to this version, or
    /// missing, is an error.
    pub fn from_json(text: &str) -> Result<SignedCertificate, String> {
        let parsed: SignedCertificate =
            serde_json::from_str(text).map_err(|e| format!("not a certificate: {e}"))?;
        let c = &parsed.certificate;
        if c.format != FORMAT {
            return Err(format!("not a certificate: format {:?}", c.format));
        }
        if c.version != VERSION {
            return Err(format!(
                "certificate version {} (this oubli reads version {VERSION})",
                c.version
            ));
        }
        Ok(parsed)
    }
}

/// SHA-256 of the domain-separated record (`RECORD_DIGEST_DOMAIN`, NUL,
/// store id, epoch big-endian, key). Committing to a key reveals nothing of
/// it (SHA-256 is one-way on 256 random bits), and once the key is gone the
/// digest only lets a verifier recognise the record if it comes back.
pub fn record_digest(record: &oubli_core::VaultRecord) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(RECORD_DIGEST_DOMAIN.as_bytes());
    ctx.update(&[0]);
    ctx.update(&record.store_id);
    ctx.update(&record.epoch.to_be_bytes());
    ctx.update(record.key.expose());
    ctx.finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// `--hash-names`: hex SHA-256(salt ‖ name).
pub fn hash_name(salt: &[u8], name: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(salt);
    ctx.update(name.as_bytes());
    hex::encode(ctx.finish().as_ref())
}

impl NameForm {
    /// A name as the certificate shows it under this form.
    pub fn show(&self, name: &str) -> Result<String, String> {
        match self {
            NameForm::Plain => Ok(name.to_string()),
            NameForm::SaltedSha256 { salt } => {
                let salt = hex::decode(salt).map_err(|e| format!("unreadable salt: {e}"))?;
                Ok(hash_name(&salt, name))
            }
        }
    }
}

/// What the audit cannot see, stated in every certificate.
pub fn audit_limits() -> Vec<String> {
    vec![
        "The audit opens what the store's own medium and the vault hold now; it cannot see copies made elsewhere (backups, replicas, what an SSD or the S3 provider keeps): those are unrecoverable only because epoch N's key is gone from the vault.".into(),
        "It cannot see copies of the vault itself: with a file vault, an old copy of the vault file (a backup, a journal, a flash translation layer) still opens epoch N.".into(),
        "It cannot see plaintext outside the store: copies a program or a person made, caches, swap.".into(),
        "Data still open in a running program (a mount's open file) is erased at its last close, not by this commit.".into(),
    ]
}

/// The method paragraph and category for a vault.
pub fn method_for(info: &oubli_core::VaultInfo) -> Method {
    // A `nand` vault erases its blocks on a real chip, but every chip this
    // build drives is simulated in an image file (`--store nand:IMAGE`).
    let simulated_chip = info.kind == "nand";
    let category = if info.overwrite_is_erasure && !simulated_chip {
        Category::Purge
    } else {
        Category::Clear
    };
    let statement = match category {
        Category::Purge => format!(
            "Cryptographic Erase (NIST SP 800-88 Purge): every erased unit was sealed under keys derived from epoch N's key, which was replaced in a vault of kind {} whose overwrite destroys the old value on the device.",
            info.kind
        ),
        Category::Clear => {
            // A TPM simulator or a software token (SoftHSM) keeps its
            // objects in host files: the same caveat as a file vault.
            let medium = match info.kind.as_str() {
                "file" => "a file, whose medium",
                "pkcs11" => "a software token (such as SoftHSM) whose objects are host files; their medium",
                "tpm2" => "a TPM simulator whose NV memory is a host file; its medium",
                "nand" => "a simulated NAND chip whose image is a host file; its medium",
                _ => "a medium that",
            };
            format!(
                "Cryptographic Erase, NOT a Purge (Clear at best): epoch N's key was replaced in a vault of kind {}, {medium} may keep old copies of it (file system journal, snapshots, SSD remapping, backups). Whoever holds such a copy and the password can still read the erased data. Keep the vault in a hardware TPM or PKCS#11 token for a Purge.",
                info.kind
            )
        }
    };
    Method {
        technique: "cryptographic erase".into(),
        category,
        vault_kind: info.kind.clone(),
        vault_location: info.location.clone(),
        vault_overwrite_erases: info.overwrite_is_erasure,
        statement,
    }
}

/// Now, RFC 3339 in UTC (seconds).
pub fn now_utc() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| jiff::Timestamp::now().to_string())
}

/// 128 random bits, hex.
pub fn random_id() -> String {
    hex::encode(random_bytes::<16>())
}

/// Random bytes from the system's generator.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system's random generator works");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(kind: &str, overwrite_is_erasure: bool) -> oubli_core::VaultInfo {
        oubli_core::VaultInfo {
            kind: kind.into(),
            location: "x".into(),
            endurance_writes: None,
            overwrite_is_erasure,
        }
    }

    #[test]
    fn only_a_vault_whose_overwrite_erases_makes_a_purge() {
        for kind in ["tpm2", "pkcs11"] {
            let m = method_for(&info(kind, true));
            assert_eq!(m.category, Category::Purge, "{kind}");
            assert!(m.statement.contains("Purge"), "{}", m.statement);
            let m = method_for(&info(kind, false));
            assert_eq!(m.category, Category::Clear, "{kind}");
            assert!(m.statement.contains("NOT a Purge"), "{}", m.statement);
            assert!(m.statement.contains("host file"), "{}", m.statement);
        }
        let m = method_for(&info("nand", true));
        assert_eq!(m.category, Category::Clear);
        assert!(m.statement.contains("simulated NAND"), "{}", m.statement);
        let m = method_for(&info("file", false));
        assert_eq!(m.category, Category::Clear);
        assert!(m.statement.contains("NOT a Purge"), "{}", m.statement);
    }

    #[test]
    fn hashed_names_depend_on_the_salt() {
        let a = NameForm::SaltedSha256 {
            salt: hex::encode([1u8; 16]),
        };
        let b = NameForm::SaltedSha256 {
            salt: hex::encode([2u8; 16]),
        };
        assert_ne!(a.show("x").unwrap(), b.show("x").unwrap());
        assert_eq!(a.show("x").unwrap().len(), 64);
        assert_eq!(NameForm::Plain.show("x").unwrap(), "x");
    }
}
