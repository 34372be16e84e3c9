//! Holes inside a cell's stored range: byte ranges that read as zeros because they were never written or were punched.
//!
//! A cell stores one contiguous range `[start, start+len)` (one sealed
//! unit). A write beyond that range widens it (the gap between is zeros)
//! and a punch strictly inside it zeroes bytes in place; those zeros are
//! sealed with the rest, but they are not data: `SEEK_DATA`/`SEEK_HOLE`
//! and `st_blocks` must not count them. A cell therefore carries the list
//! of its holes, cell-relative `[from, to)` ranges inside its stored range,
//! sorted and disjoint. At most [`MAX_HOLES`] are kept (the smallest are
//! forgotten first): a forgotten hole reads the same and is reported as
//! data, which is always allowed.

/// Holes of one cell: sorted, disjoint, non-empty, cell-relative `[from, to)` ranges.
pub type Holes = Vec<(u32, u32)>;

/// How many holes a cell keeps track of.
pub const MAX_HOLES: usize = 16;

/// Marks `[from, to)` as a hole, merging with neighbours.
pub fn add(holes: &mut Holes, from: u32, to: u32) {
    if from >= to {
        return;
    }
    let (mut lo, mut hi) = (from, to);
    holes.retain(|&(a, b)| {
        if b < lo || a > hi {
            return true;
        }
        lo = lo.min(a);
        hi = hi.max(b);
        false
    });
    let at = holes.partition_point(|&(a, _)| a < lo);
    holes.insert(at, (lo, hi));
    while holes.len() > MAX_HOLES {
        let smallest = (0..holes.len())
            .min_by_key(|&i| holes[i].1 - holes[i].0)
            .expect("not empty");
        holes.remove(smallest);
    }
}

/// Marks `[from, to)` as data (written): cuts it out of every hole.
pub fn remove(holes: &mut Holes, from: u32, to: u32) {
    if from >= to {
        return;
    }
    let mut out = Holes::with_capacity(holes.len() + 1);
    for &(a, b) in holes.iter() {
        if b <= from || a >= to {
            out.push((a, b));
            continue;
        }
        if a < from {
            out.push((a, from));
        }
        if b > to {
            out.push((to, b));
        }
    }
    *holes = out;
}

/// Keeps only the parts of the holes inside `[from, to)`.
pub fn clip(holes: &mut Holes, from: u32, to: u32) {
    holes.retain_mut(|h| {
        h.0 = h.0.max(from);
        h.1 = h.1.min(to);
        h.0 < h.1
    });
}

/// The data ranges of a stored range `[start, end)` with these holes, in order.
pub fn data_ranges(start: u32, end: u32, holes: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::with_capacity(holes.len() + 1);
    let mut at = start;
    for &(a, b) in holes {
        let (a, b) = (a.clamp(start, end), b.clamp(start, end));
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Shrinks a stored range `[start, end)` past holes at either end (they
/// need not be stored), returning the new range; the holes left are inside it.
pub fn trim(start: u32, end: u32, holes: &mut Holes) -> (u32, u32) {
    clip(holes, start, end);
    let (mut s, mut e) = (start, end);
    if let Some(&(a, b)) = holes.first() {
        if a <= s {
            s = b;
            holes.remove(0);
        }
    }
    if let Some(&(a, b)) = holes.last() {
        if b >= e && a < e {
            e = a.max(s);
            holes.pop();
        }
    }
    (s, e.max(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_merges_and_remove_splits() {
        let mut h = Holes::new();
        add(&mut h, 10, 20);
        add(&mut h, 30, 40);
        add(&mut h, 20, 30);
        assert_eq!(h, vec![(10, 40)]);
        remove(&mut h, 15, 25);
        assert_eq!(h, vec![(10, 15), (25, 40)]);
        remove(&mut h, 0, 100);
        assert!(h.is_empty());
    }

    #[test]
    fn at_most_max_holes_keeping_the_largest() {
        let mut h = Holes::new();
        for i in 0..(MAX_HOLES as u32 + 4) {
            add(&mut h, i * 100, i * 100 + 1 + i);
        }
        assert_eq!(h.len(), MAX_HOLES);
        assert!(!h.contains(&(0, 1)), "the smallest hole goes first");
        assert!(h.windows(2).all(|w| w[0].1 < w[1].0));
    }

    #[test]
    fn data_ranges_skip_holes_and_trim_cuts_the_ends() {
        assert_eq!(
            data_ranges(0, 100, &[(10, 20), (90, 100)]),
            vec![(0, 10), (20, 90)]
        );
        let mut h = vec![(0, 5), (40, 50), (90, 120)];
        assert_eq!(trim(0, 100, &mut h), (5, 90));
        assert_eq!(h, vec![(40, 50)]);
        let mut all = vec![(0, 100)];
        assert_eq!(trim(0, 100, &mut all), (100, 100));
    }
}
