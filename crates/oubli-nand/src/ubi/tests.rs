//! Tests of the UBI layer: attach after cuts, atomic change, wear levelling.

use super::*;
use crate::chip::{is_power_cut, Geometry};
use std::collections::HashMap;

fn geometry() -> Geometry {
    Geometry {
        page_size: 512,
        pages_per_block: 16,
        blocks: 48,
        oob_bytes: 32,
    }
}

fn fresh(config: UbiConfig) -> Ubi {
    let chip = Arc::new(NandChip::in_memory(geometry(), &[3], None).unwrap());
    Ubi::attach(chip, config).unwrap()
}

fn reattach(ubi: &Ubi) -> Ubi {
    let chip = NandChip::from_image(ubi.chip().image().unwrap()).unwrap();
    Ubi::attach(Arc::new(chip), UbiConfig::default()).unwrap()
}

fn content(ubi: &Ubi, lnum: Lnum) -> Option<Vec<u8>> {
    ubi.copies(lnum).unwrap().into_iter().next()
}

/// Tiny deterministic generator (tests only).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn attach_rebuilds_the_mapping() {
    let ubi = fresh(UbiConfig::default());
    ubi.append_page(20, b"one").unwrap();
    ubi.append_page(20, b"two").unwrap();
    ubi.change(0, &[7u8; 1500]).unwrap();
    ubi.change(0, &[8u8; 700]).unwrap();
    ubi.append_page(21, b"gone").unwrap();
    ubi.unmap(21).unwrap();
    let again = reattach(&ubi);
    assert_eq!(again.lebs(), vec![0, 20]);
    assert_eq!(again.pages(20).unwrap(), vec![3, 3]);
    assert_eq!(again.read_page(20, 1).unwrap(), b"two");
    assert_eq!(content(&again, 0).unwrap(), vec![8u8; 700]);
    // Every block is either mapped or free (bad block 3 aside).
    assert_eq!(again.free_blocks(), 48 - 1 - 2);
}

/// A random mix of appends, atomic changes and unmaps, cut at every
/// operation (torn or not): after re-attach, an atomically changed LEB holds
/// its old or its new content — never a mix or nothing — and an appended
/// LEB a prefix of its pages (a torn page counts as empty).
#[test]
fn attach_after_random_cuts_never_shows_a_half_written_leb() {
    let mut cuts = 0;
    let mut moves = 0;
    for seed in 0..60u64 {
        let mut rng = Rng(seed);
        // Each run: count the operations, then cut at a random one.
        let plan: Vec<(u64, Lnum, usize)> = (0..40)
            .map(|_| (rng.below(3), rng.below(4), 1 + rng.below(1400) as usize))
            .collect();
        let torn = if seed % 2 == 0 {
            Some(rng.below(544) as usize)
        } else {
            None
        };
        let ubi = fresh(UbiConfig {
            // Every third run levels wear at the least spread: moves get cut too.
            wl_threshold: if seed % 3 == 0 { 0 } else { 16 },
            reserve: 4,
        });
        let cut_at = rng.below(60);
        ubi.chip().arm_cut(cut_at, torn);
        // What each LEB may hold after the cut: the acknowledged content
        // and, for the operation in flight, its outcome.
        let mut atomic: HashMap<Lnum, Vec<u8>> = HashMap::new();
        let mut appended: HashMap<Lnum, Vec<Vec<u8>>> = HashMap::new();
        let mut in_flight = None;
        for (i, &(op, l, len)) in plan.iter().enumerate() {
            let fill = vec![i as u8; len];
            let result = match op {
                0 => {
                    let lnum = 10 + l; // atomic LEBs 10..14
                    in_flight = Some((lnum, Some(fill.clone())));
                    ubi.change(lnum, &fill).map(|()| {
                        atomic.insert(lnum, fill);
                    })
                }
                1 => {
                    let lnum = 20 + l; // appended LEBs 20..24
                    let page = &fill[..len.min(512)];
                    if appended.get(&lnum).is_some_and(|p| p.len() >= 16) {
                        continue;
                    }
                    in_flight = None;
                    ubi.append_page(lnum, page).map(|()| {
                        appended.entry(lnum).or_default().push(page.to_vec());
                    })
                }
                _ => {
                    let lnum = 10 + l;
                    in_flight = Some((lnum, None));
                    ubi.unmap(lnum).map(|()| {
                        atomic.remove(&lnum);
                    })
                }
            };
            if let Err(e) = result {
                assert!(is_power_cut(&e), "{e}");
                cuts += 1;
                break;
            }
            in_flight = None;
        }
        moves += ubi.moves();
        let again = reattach(&ubi);
        for lnum in 10..14 {
            let got = content(&again, lnum);
            let acked = atomic.get(&lnum).cloned();
            let ok =
                got == acked || matches!(&in_flight, Some((l, new)) if *l == lnum && got == *new);
            assert!(
                ok,
                "seed {seed}: LEB {lnum} holds {:?} bytes",
                got.map(|g| g.len())
            );
        }
        for lnum in 20..24 {
            let acked = appended.get(&lnum).cloned().unwrap_or_default();
            let pages = again.pages(lnum).unwrap_or_default();
            assert!(
                pages.len() >= acked.len() && pages.len() <= acked.len() + 1,
                "seed {seed}"
            );
            for (i, page) in acked.iter().enumerate() {
                assert_eq!(&again.read_page(lnum, i).unwrap(), page, "seed {seed}");
            }
            if pages.len() > acked.len() {
                // The page in flight: complete, or torn and empty.
                let last = again.read_page(lnum, acked.len()).unwrap();
                assert!(last.is_empty() || last.iter().all(|&b| b == last[0]));
            }
        }
    }
    assert!(cuts > 40, "the cuts must strike: {cuts}");
    assert!(
        moves > 10,
        "wear-levelling moves must happen among the cuts: {moves}"
    );
}

/// A hot LEB rewritten over and over next to cold ones: static wear
/// levelling keeps the spread of erase counts near the threshold; without
/// it (threshold out of reach) the cold blocks never wear and the spread grows.
#[test]
fn wear_levelling_bounds_the_spread_under_a_hot_workload() {
    let spread = |threshold: u32| {
        let ubi = fresh(UbiConfig {
            wl_threshold: threshold,
            reserve: 4,
        });
        for cold in 100..130 {
            ubi.append_page(cold, b"cold data").unwrap();
        }
        for i in 0..3000u32 {
            ubi.change(0, &i.to_le_bytes()).unwrap();
        }
        let counts: Vec<u32> = (0..48)
            .filter(|&b| !ubi.chip().is_bad(b))
            .map(|b| ubi.chip().erase_count(b))
            .collect();
        for cold in 100..130 {
            assert_eq!(ubi.read_page(cold, 0).unwrap(), b"cold data");
        }
        (
            counts.iter().max().unwrap() - counts.iter().min().unwrap(),
            ubi.moves(),
        )
    };
    let (levelled, moves) = spread(8);
    assert!(moves > 0);
    assert!(levelled <= 8 + 2, "spread {levelled} with wear levelling");
    let (unlevelled, moves) = spread(u32::MAX - 1);
    assert_eq!(moves, 0);
    assert!(
        unlevelled > 100,
        "spread {unlevelled} without wear levelling"
    );
}

#[test]
fn appends_stop_at_the_reserve_but_atomic_changes_may_use_it() {
    let ubi = fresh(UbiConfig::default());
    let mut lnum = 100;
    let err = loop {
        match ubi.append_page(lnum, b"x") {
            Ok(()) => lnum += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), ErrorKind::StorageFull);
    assert_eq!(ubi.free_blocks(), 4);
    ubi.change(0, b"superblock").unwrap();
    assert_eq!(content(&ubi, 0).unwrap(), b"superblock");
}

/// Blocks that wear out leave the pool one by one; the data survives each
/// retirement, and the end is a clean `StorageFull`, never a lost LEB.
#[test]
fn worn_out_blocks_are_retired_without_losing_data() {
    let chip = Arc::new(NandChip::in_memory(geometry(), &[3], Some(20)).unwrap());
    let ubi = Ubi::attach(chip.clone(), UbiConfig::default()).unwrap();
    ubi.append_page(100, b"cold").unwrap();
    let mut last = Vec::new();
    let err = (0u32..)
        .find_map(|i| {
            let data = i.to_le_bytes().to_vec();
            match ubi.change(0, &data) {
                Ok(()) => {
                    last = data;
                    None
                }
                Err(e) => Some(e),
            }
        })
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    let bad = (0..48).filter(|&b| chip.is_bad(b)).count();
    assert!(bad > 40, "only {bad} blocks went bad");
    assert_eq!(content(&ubi, 0).unwrap(), last);
    assert_eq!(ubi.read_page(100, 0).unwrap(), b"cold");
    let again = reattach(&ubi);
    assert_eq!(content(&again, 0).unwrap(), last);
    assert_eq!(again.read_page(100, 0).unwrap(), b"cold");
}
