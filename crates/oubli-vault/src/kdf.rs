//! Password -> key-encryption key: Argon2id with parameters stored in each vault slot.

use crate::VaultError;
use oubli_crypto::{SecretBytes, SecretKey, KEY_LEN};
use zeroize::Zeroizing;

/// Length of the Argon2id salt stored in each slot header.
pub const SALT_LEN: usize = 16;

/// Argon2id cost parameters (algorithm version 0x13, 32-byte output).
///
/// They are stored in clear in every slot header, so that a vault created with
/// one strength can still be opened after the defaults change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KdfParams {
    /// Memory, in KiB.
    pub m_cost_kib: u32,
    /// Passes over the memory.
    pub t_cost: u32,
    /// Lanes (degree of parallelism; computed sequentially by this build).
    pub p_cost: u32,
}

impl KdfParams {
    /// Smallest memory accepted: the same as [`KdfParams::testing`]. Below
    /// that a header is not a vault this crate wrote.
    pub const MIN_M_COST_KIB: u32 = 64;
    /// Largest memory accepted (4 GiB). A tampered header asking for more
    /// would only make `open` exhaust memory, so it is refused as corrupt.
    pub const MAX_M_COST_KIB: u32 = 4 * 1024 * 1024;
    /// Largest number of passes accepted (same reason: bound the work a
    /// tampered header can ask for).
    pub const MAX_T_COST: u32 = 64;
    /// Largest number of lanes accepted.
    pub const MAX_P_COST: u32 = 64;

    /// Cheap parameters **for tests only** (64 KiB, 1 pass, 1 lane): they
    /// offer next to no resistance to password guessing. Never use them for
    /// a real vault.
    pub const fn testing() -> Self {
        KdfParams {
            m_cost_kib: 64,
            t_cost: 1,
            p_cost: 1,
        }
    }

    /// Checks the parameters against the bounds above and Argon2's own rules.
    pub fn validate(&self) -> Result<(), String> {
        let KdfParams {
            m_cost_kib: m,
            t_cost: t,
            p_cost: p,
        } = *self;
        if !(Self::MIN_M_COST_KIB..=Self::MAX_M_COST_KIB).contains(&m) {
            return Err(format!(
                "Argon2 memory {m} KiB outside {}..={} KiB",
                Self::MIN_M_COST_KIB,
                Self::MAX_M_COST_KIB
            ));
        }
        if !(1..=Self::MAX_T_COST).contains(&t) {
            return Err(format!(
                "Argon2 passes {t} outside 1..={}",
                Self::MAX_T_COST
            ));
        }
        if !(1..=Self::MAX_P_COST).contains(&p) {
            return Err(format!("Argon2 lanes {p} outside 1..={}", Self::MAX_P_COST));
        }
        // Argon2 needs at least 8 blocks of 1 KiB per lane.
        if u64::from(m) < 8 * u64::from(p) {
            return Err(format!("Argon2 memory {m} KiB too small for {p} lanes"));
        }
        Ok(())
    }
}

impl Default for KdfParams {
    /// Interactive strength: 64 MiB, 3 passes, 1 lane (about a few hundred
    /// milliseconds on a desktop CPU; above OWASP's Argon2id minimum of
    /// 19 MiB / 2 passes).
    fn default() -> Self {
        KdfParams {
            m_cost_kib: 64 * 1024,
            t_cost: 3,
            p_cost: 1,
        }
    }
}

/// KEK = Argon2id(password, salt, params).
pub(crate) fn derive_kek(
    password: &SecretBytes,
    salt: &[u8; SALT_LEN],
    params: KdfParams,
) -> Result<SecretKey, VaultError> {
    params
        .validate()
        .map_err(|e| VaultError::Corrupt(format!("bad key derivation parameters: {e}")))?;
    let argon_params = argon2::Params::new(
        params.m_cost_kib,
        params.t_cost,
        params.p_cost,
        Some(KEY_LEN),
    )
    .map_err(|e| VaultError::Corrupt(format!("bad key derivation parameters: {e}")))?;
    let argon = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        argon_params,
    );
    let mut out = Zeroizing::new([0u8; KEY_LEN]);
    argon
        .hash_password_into(password.expose(), salt, &mut out[..])
        // Inputs were validated above; what is left is running out of memory.
        .map_err(|e| VaultError::Unavailable(format!("password key derivation failed: {e}")))?;
    Ok(SecretKey::from_bytes(*out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_bounds_enforced() {
        KdfParams::default().validate().unwrap();
        KdfParams::testing().validate().unwrap();
        let too_big = KdfParams {
            m_cost_kib: KdfParams::MAX_M_COST_KIB + 1,
            ..KdfParams::testing()
        };
        assert!(too_big.validate().is_err());
        let no_pass = KdfParams {
            t_cost: 0,
            ..KdfParams::testing()
        };
        assert!(no_pass.validate().is_err());
        let starved = KdfParams {
            m_cost_kib: 64,
            t_cost: 1,
            p_cost: 9,
        };
        assert!(starved.validate().is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Known answers from the reference implementation (the `argon2` CLI of
    /// the P-H-C code: `printf password | argon2 saltsaltsaltsalt -id -t T
    /// -k M -p P -l 32 -r`). Pins the KEK so a dependency upgrade cannot
    /// silently lock users out of their vaults.
    #[test]
    fn kek_matches_reference_vectors() {
        let pw = SecretBytes::new(b"password".to_vec());
        let salt = *b"saltsaltsaltsalt";
        let cases = [
            (
                KdfParams::testing(),
                "59bf4338b29483094be5f8da77db5f08f534481028d0f118fdebc9461c2d511d",
            ),
            (
                KdfParams {
                    m_cost_kib: 128,
                    t_cost: 2,
                    p_cost: 2,
                },
                "df9b9ef1e4681d1d526a59b7c760344afaeaf65b58a7bda7d465e123832a6761",
            ),
        ];
        for (params, want) in cases {
            assert_eq!(hex(derive_kek(&pw, &salt, params).unwrap().expose()), want);
        }
    }

    /// The interactive default really runs (64 MiB must be allocatable).
    #[test]
    fn default_strength_derives() {
        let pw = SecretBytes::new(b"pw".to_vec());
        derive_kek(&pw, &[0; SALT_LEN], KdfParams::default()).unwrap();
    }

    #[test]
    fn kek_depends_on_password_salt_and_params() {
        let pw = SecretBytes::new(b"correct horse".to_vec());
        let salt = [1u8; SALT_LEN];
        let p = KdfParams::testing();
        let k = derive_kek(&pw, &salt, p).unwrap();
        assert_eq!(k, derive_kek(&pw, &salt, p).unwrap());
        assert_ne!(
            k,
            derive_kek(&SecretBytes::new(b"correct horsf".to_vec()), &salt, p).unwrap()
        );
        assert_ne!(k, derive_kek(&pw, &[2u8; SALT_LEN], p).unwrap());
        let p2 = KdfParams { t_cost: 2, ..p };
        assert_ne!(k, derive_kek(&pw, &salt, p2).unwrap());
    }
}
