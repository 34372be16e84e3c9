//! Signing certificates with the organisation's Ed25519 key (`--sign-key FILE`, PKCS#8 PEM, or `--sign-key pkcs11:URI`, a key inside a token).

use super::{Certificate, Signature, SignedCertificate};
use base64::Engine as _;
use ed25519::pkcs8::{DecodePrivateKey, DecodePublicKey, KeypairBytes, PublicKeyBytes};
use ring::signature::{Ed25519KeyPair, KeyPair};
use zeroize::Zeroizing;

/// The only algorithm of version 1.
pub const ALGORITHM: &str = "ed25519";

/// An Ed25519 private key: the 32-byte seed, wiped on drop. (ring's key
/// pair is made from it for each signature and dropped at once.)
pub struct SigningKey {
    seed: Zeroizing<[u8; 32]>,
    public: [u8; 32],
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &fingerprint(&self.public))
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Reads a PKCS#8 PEM Ed25519 private key, as `openssl genpkey
    /// -algorithm ed25519` writes it (v1, without the public key, or v2
    /// with it: then it must match the private key).
    pub fn from_pkcs8_pem(pem: &str) -> Result<SigningKey, String> {
        let parsed = KeypairBytes::from_pkcs8_pem(pem).map_err(|e| {
            format!("not a PKCS#8 PEM Ed25519 private key ({e}); make one with `openssl genpkey -algorithm ed25519 -out KEY.pem`")
        })?;
        let seed = Zeroizing::new(parsed.secret_key);
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed[..])
            .map_err(|e| format!("not a valid Ed25519 private key: {e}"))?;
        let public: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("Ed25519 public keys are 32 bytes");
        if let Some(stated) = parsed.public_key {
            if stated.to_bytes() != public {
                return Err("the PKCS#8 key's public key does not match its private key".into());
            }
        }
        Ok(SigningKey { seed, public })
    }

    pub fn public_key(&self) -> [u8; 32] {
        self.public
    }

    /// Signs the certificate's [`signed_bytes`](Certificate::signed_bytes).
    pub fn sign(&self, certificate: Certificate) -> SignedCertificate {
        let pair = Ed25519KeyPair::from_seed_unchecked(&self.seed[..])
            .expect("checked when the key was read");
        let value = pair.sign(&certificate.signed_bytes());
        let b64 = base64::engine::general_purpose::STANDARD;
        SignedCertificate {
            certificate,
            signature: Signature {
                algorithm: ALGORITHM.into(),
                public_key: b64.encode(self.public),
                value: b64.encode(value.as_ref()),
            },
        }
    }
}

/// Reads an SPKI PEM Ed25519 public key (`openssl pkey -pubout`).
pub fn public_key_from_pem(pem: &str) -> Result<[u8; 32], String> {
    PublicKeyBytes::from_public_key_pem(pem)
        .map(|k| k.to_bytes())
        .map_err(|e| {
            format!("not an SPKI PEM Ed25519 public key ({e}); make one with `openssl pkey -in KEY.pem -pubout -out PUB.pem`")
        })
}

/// The key's fingerprint as certificates show it: hex SHA-256 of the 32
/// raw public key bytes.
pub fn fingerprint(public: &[u8; 32]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, public).as_ref())
}

/// The key that signs a certificate (`--sign-key`): a PKCS#8 PEM file, or
/// an Ed25519 key inside a PKCS#11 token (`pkcs11:` URI), which signs
/// without the key ever leaving the token. Both make the same `ed25519`
/// signature, checked by the same code.
#[derive(Debug)]
pub enum Signer {
    File(SigningKey),
    Token(TokenKey),
}

/// An Ed25519 key pair inside a PKCS#11 token (SoftHSM2, a smart card, an
/// HSM), named by a token URI whose `object=` is the keys' label. The PIN is
/// the URI's `pin-value` or `$OUBLI_PIN`.
pub struct TokenKey {
    signer: oubli_vault::TokenSigner,
    public: [u8; 32],
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenKey")
            .field("signer", &self.signer)
            .field("public", &fingerprint(&self.public))
            .finish()
    }
}

impl TokenKey {
    /// Opens the key the URI names and reads its public key, so that a
    /// missing key or a wrong PIN fails before anything is erased.
    pub fn open(uri: &str) -> Result<TokenKey, oubli_vault::VaultError> {
        let uri = oubli_vault::Pkcs11Uri::parse(uri)?;
        if uri.pin_value.is_none() && std::env::var_os("OUBLI_PIN").is_none() {
            return Err(oubli_vault::VaultError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{}: give the token's PIN with pin-value= in the URI or in $OUBLI_PIN",
                    uri.redacted()
                ),
            )));
        }
        let signer = oubli_vault::TokenSigner::open(
            &uri,
            &oubli_crypto::SecretBytes::new(Vec::new()),
            oubli_vault::Pkcs11Options::default(),
        )?;
        let public = signer.public_key()?;
        Ok(TokenKey { signer, public })
    }

    pub fn public_key(&self) -> [u8; 32] {
        self.public
    }
}

impl Signer {
    pub fn public_key(&self) -> [u8; 32] {
        match self {
            Signer::File(key) => key.public_key(),
            Signer::Token(key) => key.public_key(),
        }
    }

    /// Signs the certificate's [`signed_bytes`](Certificate::signed_bytes).
    /// A token may fail (pulled, locked): the error says why.
    pub fn sign(
        &self,
        certificate: Certificate,
    ) -> Result<SignedCertificate, oubli_vault::VaultError> {
        let key = match self {
            Signer::File(key) => return Ok(key.sign(certificate)),
            Signer::Token(key) => key,
        };
        let (public, value) = key.signer.sign(&certificate.signed_bytes())?;
        if public != key.public {
            return Err(oubli_vault::VaultError::Corrupt(
                "the token's signing key changed since it was opened".into(),
            ));
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(SignedCertificate {
            certificate,
            signature: Signature {
                algorithm: ALGORITHM.into(),
                public_key: b64.encode(public),
                value: b64.encode(value),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `openssl genpkey -algorithm ed25519` (RFC 8410 section 10.3's key).
    const PEM: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n";
    const PUB: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";

    #[test]
    fn reads_openssl_keys_and_their_public_halves_match() {
        let key = SigningKey::from_pkcs8_pem(PEM).unwrap();
        assert_eq!(key.public_key(), public_key_from_pem(PUB).unwrap());
        assert!(!format!("{key:?}").contains("seed"));
    }

    #[test]
    fn refuses_what_is_not_an_ed25519_key() {
        assert!(SigningKey::from_pkcs8_pem(PUB).is_err());
        assert!(public_key_from_pem(PEM).is_err());
        assert!(SigningKey::from_pkcs8_pem("garbage").is_err());
    }
}
