//! Signing certificates with the organisation's Ed25519 key (`--sign-key FILE`, PKCS#8 PEM).

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
