//! `Dropped`: the byte ranges of an export whose cells the server has dropped itself (inferred frees) and that nothing has written since — a TRIM of them has nothing left to erase.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent `[start, end)` ranges, keyed by start. Past
/// [`Dropped::CAP`] ranges it forgets everything: that costs only the
/// shortcut (a TRIM then reaches the store again), never erasure.
#[derive(Debug, Default)]
pub(crate) struct Dropped {
    ranges: BTreeMap<u64, u64>,
}

impl Dropped {
    /// Ranges kept at most (a few MiB of memory).
    pub(crate) const CAP: usize = 1 << 18;

    /// `[start, end)` was dropped.
    pub(crate) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // Merge with every range that overlaps or touches [start, end).
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.ranges.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            end = end.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(start, end);
        if self.ranges.len() > Self::CAP {
            self.ranges.clear();
        }
    }

    /// `[start, end)` is being written: no longer known to be dropped.
    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e > start {
                self.ranges.insert(s, start);
                if e > end {
                    self.ranges.insert(end, e);
                    return;
                }
            }
        }
        let inside: Vec<(u64, u64)> = self
            .ranges
            .range(start..end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in inside {
            self.ranges.remove(&s);
            if e > end {
                self.ranges.insert(end, e);
            }
        }
    }

    /// Whether all of `[start, end)` is known dropped.
    pub(crate) fn covers(&self, start: u64, end: u64) -> bool {
        start >= end
            || self
                .ranges
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }
}

#[cfg(test)]
mod tests {
    use super::Dropped;

    /// The same operations on a per-byte model over a small space.
    #[test]
    fn agrees_with_a_byte_model() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut set = Dropped::default();
        let mut model = [false; 256];
        for _ in 0..20_000 {
            let a = next(256);
            let b = (a + next(40)).min(256);
            match next(3) {
                0 => {
                    set.insert(a, b);
                    model[a as usize..b as usize].fill(true);
                }
                1 => {
                    set.remove(a, b);
                    model[a as usize..b as usize].fill(false);
                }
                _ => assert_eq!(
                    set.covers(a, b),
                    model[a as usize..b as usize].iter().all(|&d| d),
                    "covers({a}, {b})"
                ),
            }
            // Disjoint and not touching: one range per run of the model.
            let runs = model
                .iter()
                .enumerate()
                .filter(|&(i, &d)| d && (i == 0 || !model[i - 1]))
                .count();
            assert_eq!(set.ranges.len(), runs);
        }
    }
}
