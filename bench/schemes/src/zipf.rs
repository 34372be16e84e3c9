//! YCSB's scrambled Zipfian generator: item popularity follows Zipf's law (θ = 0.99), the popular items scattered over the key space.

use oubli_media::SplitMix64;

/// YCSB's default skew: the hottest item takes about 1/ζ(n) of all accesses.
pub const YCSB_THETA: f64 = 0.99;

/// Draws item numbers in `0..n` (Gray et al., "Quickly generating
/// billion-record synthetic databases", as YCSB's `ZipfianGenerator`);
/// ranks are then hashed so that the hot items are not all at the start
/// of the object (YCSB's `ScrambledZipfianGenerator`), which would put
/// them in the same few cells.
pub struct ScrambledZipf {
    n: u64,
    theta: f64,
    zeta_n: f64,
    alpha: f64,
    eta: f64,
    rng: SplitMix64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

/// FNV-1a over the 8 bytes of `x` (YCSB scrambles with FNV too).
fn fnv1a(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl ScrambledZipf {
    pub fn new(n: u64, seed: u64) -> ScrambledZipf {
        let n = n.max(2);
        let theta = YCSB_THETA;
        let zeta_n = zeta(n, theta);
        let zeta_2 = zeta(2, theta);
        ScrambledZipf {
            n,
            theta,
            zeta_n,
            alpha: 1.0 / (1.0 - theta),
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n),
            rng: SplitMix64::new(seed),
        }
    }

    /// A uniform number in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The popularity rank of the next access: 0 is the hottest.
    fn rank(&mut self) -> u64 {
        let u = self.uniform();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        ((self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64).min(self.n - 1)
    }

    /// The next item, in `0..n`.
    pub fn next_item(&mut self) -> u64 {
        fnv1a(self.rank()) % self.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skewed_and_in_range() {
        let mut z = ScrambledZipf::new(10_000, 3);
        let mut counts = vec![0u32; 10_000];
        for _ in 0..100_000 {
            counts[z.next_item() as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u32 = counts[..100].iter().sum();
        // Under Zipf(0.99) over 10^4 items the top 1 % take about half the accesses.
        assert!(top > 35_000 && top < 70_000, "top 100 items took {top}");
    }
}
