//! `Wear`: how worn a NAND chip is — erase counts, the Hoover index of their spread, projected lifetime (as DNEFS reports them).

use crate::medium::NandMedium;

/// Program/erase cycles a block is rated for when nothing else is said
/// (the figure DNEFS uses for its lifetime table).
pub const RATED_CYCLES: u64 = 10_000;

const HOURS_PER_YEAR: f64 = 24.0 * 365.25;

/// The wear figures of a chip (bad blocks left out).
#[derive(Debug, Clone, PartialEq)]
pub struct Wear {
    pub blocks: u32,
    pub bad_blocks: u32,
    pub min: u32,
    pub mean: f64,
    pub max: u32,
    /// Erases ever done on the good blocks.
    pub total_erases: u64,
    /// Hoover index of the erase counts: the share of all erasures that
    /// would have to move to other blocks for perfectly even wear (0 =
    /// even, near 1 = one block took everything).
    pub hoover: f64,
    pub rated_cycles: u64,
    /// The erase rate the projection assumes.
    pub erases_per_hour: Option<f64>,
    /// Years until the good blocks use up `rated_cycles` each at that rate,
    /// assuming wear levelling spreads the erasures (`None` without a rate).
    pub lifetime_years: Option<f64>,
}

impl Wear {
    /// The figures for these erase counts of good blocks.
    pub fn of(
        counts: &[u32],
        bad_blocks: u32,
        rated_cycles: u64,
        erases_per_hour: Option<f64>,
    ) -> Wear {
        let n = counts.len().max(1) as f64;
        let total: u64 = counts.iter().map(|&c| c as u64).sum();
        let mean = total as f64 / n;
        let spread: f64 = counts.iter().map(|&c| (c as f64 - mean).abs()).sum();
        let hoover = if total == 0 {
            0.0
        } else {
            0.5 * spread / total as f64
        };
        let left: u64 = counts
            .iter()
            .map(|&c| rated_cycles.saturating_sub(c as u64))
            .sum();
        let lifetime_years = erases_per_hour
            .filter(|r| r.is_finite() && *r > 0.0)
            .map(|r| left as f64 / r / HOURS_PER_YEAR);
        Wear {
            blocks: counts.len() as u32,
            bad_blocks,
            min: counts.iter().copied().min().unwrap_or(0),
            mean,
            max: counts.iter().copied().max().unwrap_or(0),
            total_erases: total,
            hoover,
            rated_cycles,
            erases_per_hour,
            lifetime_years,
        }
    }
}

impl NandMedium {
    /// The chip's wear, projected at `erases_per_hour` (or, if `None`, at
    /// the rate observed since this medium attached).
    pub fn wear(&self, rated_cycles: u64, erases_per_hour: Option<f64>) -> Wear {
        let chip = self.chip();
        let counts = chip.erase_counts();
        let good: Vec<u32> = (0..counts.len() as u32)
            .filter(|&b| !chip.is_bad(b))
            .map(|b| counts[b as usize])
            .collect();
        let bad = counts.len() as u32 - good.len() as u32;
        let rate = erases_per_hour.or_else(|| Some(self.erase_rate()));
        Wear::of(&good, bad, rated_cycles, rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hoover_and_lifetime() {
        let even = Wear::of(&[5, 5, 5, 5], 0, 100, Some(1.0));
        assert_eq!((even.min, even.max, even.hoover), (5, 5, 0.0));
        // 380 erasures left at one an hour.
        assert!((even.lifetime_years.unwrap() - 380.0 / HOURS_PER_YEAR).abs() < 1e-12);
        let skewed = Wear::of(&[0, 0, 0, 8], 1, 100, None);
        // Mean 2: |−2|·3 + 6 = 12, half of it over 8 erasures.
        assert_eq!(skewed.hoover, 0.75);
        assert_eq!(skewed.lifetime_years, None);
        assert_eq!(Wear::of(&[0, 0], 0, 10, Some(0.0)).hoover, 0.0);
    }
}
