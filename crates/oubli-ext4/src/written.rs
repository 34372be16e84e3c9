//! The blocks written since the last journal commit, as the tracker's drop rule needs them (a block written since the previous commit is kept).

use std::collections::BTreeMap;

/// Memory a range takes in the map, counted generously: 16 bytes of key
/// and value, and a B-tree node's share (nodes are often half full).
pub(crate) const RANGE_BYTES: usize = 48;

/// Block ranges `[start, end)` written since the last commit, merged as
/// they arrive (an ordered map from start to end: O(log n) a write), within
/// a memory budget.
///
/// Over the budget the set stops being exact and grows coarser: ranges are
/// widened to aligned runs of `2^shift` blocks, so neighbours merge. It then
/// holds a superset of what was written, which the drop rule reads as
/// "written since the previous commit": such blocks are kept at the next
/// commit (counted suspicious) and dropped at a later one, never the other
/// way round.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    ranges: BTreeMap<u64, u64>,
    /// Ranges are rounded out to multiples of `1 << shift` blocks.
    shift: u32,
    max_ranges: usize,
    /// Ranges visited (inserted, merged, rebuilt): the work done, for tests.
    ops: u64,
}

impl Default for Written {
    fn default() -> Self {
        Written::with_budget(crate::Budget::default().written_bytes)
    }
}

impl Written {
    /// A set that holds at most about `bytes` of memory.
    pub(crate) fn with_budget(bytes: usize) -> Written {
        Written {
            ranges: BTreeMap::new(),
            shift: 0,
            max_ranges: (bytes / RANGE_BYTES).max(2),
            ops: 0,
        }
    }

    pub(crate) fn insert(&mut self, b0: u64, b1: u64) {
        if b0 >= b1 {
            return;
        }
        self.ops += 1;
        let (mut a, mut b) = self.round(b0, b1);
        // A range that starts before `a` and reaches it absorbs it.
        if let Some((&s, &e)) = self.ranges.range(..=a).next_back() {
            if e >= a {
                if e >= b {
                    return;
                }
                a = s;
            }
        }
        // Ranges starting inside [a, b] are absorbed (each was inserted once:
        // the removals are paid for by earlier inserts).
        while let Some((&s, &e)) = self.ranges.range(a..=b).next() {
            self.ops += 1;
            b = b.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(a, b);
        if self.ranges.len() > self.max_ranges {
            self.coarsen();
        }
    }

    /// Changes the budget; coarsens at once if the set is over it.
    pub(crate) fn set_budget(&mut self, bytes: usize) {
        self.max_ranges = (bytes / RANGE_BYTES).max(2);
        if self.ranges.len() > self.max_ranges {
            self.coarsen();
        }
    }

    /// `[b0, b1)` widened to the current granularity.
    fn round(&self, b0: u64, b1: u64) -> (u64, u64) {
        if self.shift == 0 {
            return (b0, b1);
        }
        let mask = (1u64 << self.shift) - 1;
        (
            b0 & !mask,
            b1.checked_add(mask).map_or(u64::MAX, |e| e & !mask),
        )
    }

    /// Doubles the granularity until the set holds half its budget at most.
    /// `shift` only grows between commits (at most 64 rebuilds), so the
    /// rebuilds cost O(budget) each and O(1) a write amortised.
    fn coarsen(&mut self) {
        while self.ranges.len() > self.max_ranges / 2 && self.shift < 63 {
            self.shift += 1;
            let old = std::mem::take(&mut self.ranges);
            self.ops += old.len() as u64;
            let mut last: Option<(u64, u64)> = None;
            for (s, e) in old {
                let (s, e) = self.round(s, e);
                match &mut last {
                    Some(l) if s <= l.1 => l.1 = l.1.max(e),
                    _ => {
                        if let Some((ls, le)) = last {
                            self.ranges.insert(ls, le);
                        }
                        last = Some((s, e));
                    }
                }
            }
            if let Some((ls, le)) = last {
                self.ranges.insert(ls, le);
            }
        }
    }

    /// The ranges, sorted and merged; the set is empty (and exact) afterwards.
    pub(crate) fn take(&mut self) -> Vec<(u64, u64)> {
        self.shift = 0;
        std::mem::take(&mut self.ranges).into_iter().collect()
    }

    pub(crate) fn clear(&mut self) {
        self.ranges.clear();
        self.shift = 0;
    }

    /// Ranges held.
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }

    /// The granularity, in blocks, the set has been coarsened to (1: exact).
    pub(crate) fn granularity(&self) -> u64 {
        1 << self.shift
    }

    /// Bytes of memory the set holds (about).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.ranges.len() * RANGE_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40 item 4: a million disjoint writes with no commit between
    /// them made every further write sort the whole list again (quadratic
    /// work) and the list grew without bound. The work per write stays
    /// constant (amortised) and the set within its budget.
    #[test]
    fn a_million_disjoint_writes_cost_constant_work_and_bounded_memory() {
        let mut w = Written::default();
        let writes = (1u64 << 20) + 256;
        for i in 0..writes {
            w.insert(2 * i, 2 * i + 1);
        }
        let per_write = w.ops as f64 / writes as f64;
        eprintln!(
            "{per_write:.2} ranges visited per write, {} ranges ({} bytes) held, granularity {}",
            w.len(),
            w.memory_bytes(),
            w.granularity()
        );
        assert!(
            per_write < 8.0,
            "{per_write:.1} ranges visited per write ({} in all)",
            w.ops
        );
        assert!(
            w.memory_bytes() <= 8 << 20,
            "{} bytes held for {} ranges",
            w.memory_bytes(),
            w.len()
        );
        // Whatever it keeps covers every block written.
        let ranges = w.take();
        let covered = |b: u64| {
            let i = ranges.partition_point(|r| r.1 <= b);
            ranges.get(i).is_some_and(|r| b >= r.0)
        };
        assert!((0..writes).all(|i| covered(2 * i)));
    }

    /// Writes far apart, beyond a small budget: the set grows coarse in a
    /// few rebuilds, still covers every block written, and is exact again
    /// after a commit takes it.
    #[test]
    fn a_coarse_set_covers_every_write_and_is_exact_after_a_commit() {
        let mut w = Written::with_budget(1000 * RANGE_BYTES);
        let writes: Vec<(u64, u64)> = (0..100_000u64)
            .map(|i| {
                let a = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 30;
                (a, a + 1 + i % 3)
            })
            .collect();
        for &(a, b) in &writes {
            w.insert(a, b);
        }
        assert!(w.len() <= 1000, "{} ranges", w.len());
        assert!(w.granularity() > 1);
        assert!(w.ops < 10 * writes.len() as u64, "{} ranges visited", w.ops);
        let ranges = w.take();
        for &(a, b) in &writes {
            let i = ranges.partition_point(|r| r.1 <= a);
            assert!(
                ranges.get(i).is_some_and(|r| r.0 <= a && r.1 >= b),
                "{a}..{b}"
            );
        }
        assert!(ranges.windows(2).all(|p| p[0].1 < p[1].0), "not merged");
        w.insert(10, 11);
        w.insert(12, 13);
        assert_eq!((w.granularity(), w.take()), (1, vec![(10, 11), (12, 13)]));
    }
}
