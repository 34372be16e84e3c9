//! Vault wear: how long a TPM or token lasts at a given commit rate, and when to warn.
//!
//! Every epoch commit is one vault rotation. A rotation writes one record
//! and clears one (TPM: one NV write to each of the two slot indices every
//! two rotations, i.e. one write per index per rotation on average; token:
//! one object created, one destroyed), so a device rated for `E` writes per
//! cell lasts about `E` rotations, and the vault's `write_count` (records
//! written so far) is the wear already spent.

use oubli_core::VaultInfo;
use std::time::Duration;

/// Warn when the vault would wear out sooner than this (five years).
pub const WEAR_HORIZON: Duration = Duration::from_secs(5 * 365 * 24 * 3600);

const DAY: f64 = 24.0 * 3600.0;

/// Commits per day of an epoch policy that commits every `interval`
/// (its worst case: policies that also commit on bytes written or
/// deletions can only commit more often, so pass the observed rate if known).
pub fn commits_per_day(interval: Duration) -> f64 {
    if interval.is_zero() {
        return f64::INFINITY;
    }
    DAY / interval.as_secs_f64()
}

/// Time until a vault rated for `endurance_writes` wears out, having spent
/// `writes_so_far`, at `commits_per_day` rotations a day.
///
/// `None` when it never wears out: no endurance limit (file vault,
/// simulators) or no commits. `Some(ZERO)` when the rating is already spent.
pub fn projected_lifetime(
    endurance_writes: Option<u64>,
    writes_so_far: u64,
    commits_per_day: f64,
) -> Option<Duration> {
    let endurance = endurance_writes?;
    if commits_per_day.is_nan() || commits_per_day <= 0.0 {
        return None;
    }
    let left = endurance.saturating_sub(writes_so_far) as f64;
    let secs = left / commits_per_day * DAY;
    // Clamp: a huge figure (a tiny rate) must not overflow Duration.
    Some(Duration::from_secs_f64(secs.min(u64::MAX as f64 / 2.0)))
}

/// A warning for `status` when the vault `info` describes would wear out
/// within [`WEAR_HORIZON`] at `commits_per_day`; `None` if it lasts longer.
pub fn wear_warning(info: &VaultInfo, writes_so_far: u64, commits_per_day: f64) -> Option<String> {
    let endurance = info.endurance_writes?;
    let lifetime = projected_lifetime(Some(endurance), writes_so_far, commits_per_day)?;
    if lifetime >= WEAR_HORIZON {
        return None;
    }
    Some(format!(
        "the {} vault at {} is rated for about {endurance} writes and has used {writes_so_far}; \
         at {} commits a day it would wear out in {} — lengthen the epoch (fewer commits) \
         or use another vault",
        info.kind,
        info.location,
        format_rate(commits_per_day),
        human(lifetime)
    ))
}

fn format_rate(per_day: f64) -> String {
    if per_day >= 10.0 {
        format!("{per_day:.0}")
    } else {
        format!("{per_day:.2}")
    }
}

/// "3.2 years", "41 days", "5 hours": rough on purpose, it is a projection.
fn human(d: Duration) -> String {
    let days = d.as_secs_f64() / DAY;
    if days >= 365.0 {
        format!("{:.1} years", days / 365.0)
    } else if days >= 1.0 {
        format!("{days:.0} days")
    } else {
        format!("{:.0} hours", d.as_secs_f64() / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(endurance: Option<u64>) -> VaultInfo {
        VaultInfo {
            kind: "tpm2".into(),
            location: "tpm:device:/dev/tpmrm0;index=0x01500016".into(),
            endurance_writes: endurance,
            overwrite_is_erasure: true,
        }
    }

    #[test]
    fn lifetime_arithmetic() {
        // 100,000 writes at 100 a day: 1,000 days.
        let d = projected_lifetime(Some(100_000), 0, 100.0).unwrap();
        assert_eq!(d.as_secs(), 1000 * 86_400);
        // Writes already spent count.
        let d = projected_lifetime(Some(100_000), 50_000, 100.0).unwrap();
        assert_eq!(d.as_secs(), 500 * 86_400);
        assert_eq!(projected_lifetime(Some(10), 11, 1.0), Some(Duration::ZERO));
        assert_eq!(projected_lifetime(None, 0, 1e6), None);
        assert_eq!(projected_lifetime(Some(10), 0, 0.0), None);
        assert!(projected_lifetime(Some(u64::MAX), 0, 1e-9).is_some());
    }

    #[test]
    fn commit_rates() {
        assert_eq!(commits_per_day(Duration::from_secs(3600)), 24.0);
        assert_eq!(commits_per_day(Duration::from_secs(60)), 1440.0);
        assert!(commits_per_day(Duration::ZERO).is_infinite());
        assert_eq!(
            projected_lifetime(Some(100), 0, commits_per_day(Duration::ZERO)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn warns_only_inside_the_horizon() {
        // A TPM at one commit a minute: 100,000 / 1,440 ≈ 69 days.
        let w = wear_warning(&info(Some(100_000)), 0, 1440.0).unwrap();
        assert!(w.contains("69 days") && w.contains("tpm2"), "{w}");
        // Hourly: 100,000 / 24 ≈ 11.4 years, no warning.
        assert_eq!(wear_warning(&info(Some(100_000)), 0, 24.0), None);
        // ... unless most of the rating is already spent.
        assert!(wear_warning(&info(Some(100_000)), 90_000, 24.0).is_some());
        // No endurance figure, no warning.
        assert_eq!(wear_warning(&info(None), 0, 1e6), None);
    }
}
