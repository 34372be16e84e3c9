//! Bad input never panics and never drops fixed metadata: thousands of random and mutated writes at the superblock, bitmap and journal of a synthetic ext4 and of a real mkfs image.

mod common;
use oubli_ext4::fuzzing::{run, synth_image, synth_image_with};
use oubli_ext4::Ext4Tracker;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn synthetic_image_loads() {
    let img = synth_image();
    let t = Ext4Tracker::load(&mut common::reader(&img), img.len() as u64).unwrap();
    assert!(t.following());
    assert_eq!(t.journal_sb().unwrap().maxlen, 1024);
}

#[test]
fn random_writes_never_panic_nor_drop_metadata() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut ops = 0;
    for round in 0..300 {
        // Every journal tag format, the one without checksums included.
        let mut img = synth_image_with([0x0, 0x2, 0xA, 0x12][round % 4]);
        let mut t = Ext4Tracker::load(&mut common::reader(&img), img.len() as u64).unwrap();
        let input = rng.bytes(4096 + (round % 7) * 1000);
        let bad = run(&mut img, &mut t, &input);
        assert!(
            bad.is_empty(),
            "round {round}: dropped fixed metadata {bad:?}"
        );
        ops += input.len() / 600;
    }
    eprintln!("about {ops} writes");
}

#[test]
fn mutated_real_traffic_never_panics() {
    // A valid transaction on the synthetic image, then mutations of it.
    let base = synth_image();
    let mut rng = Rng(42);
    for _ in 0..3000 {
        let mut img = base.clone();
        let mut t = Ext4Tracker::load(&mut common::reader(&img), img.len() as u64).unwrap();
        let jbd = common::Jbd {
            bs: 1024,
            incompat: 0x12,
            uuid: *b"oubli-fuzz-uuid!",
        };
        let bm = img[3 * 1024..4 * 1024].to_vec();
        let mut blocks = [
            jbd.descriptor(7, &[(3, &bm, false)]),
            bm.clone(),
            jbd.commit(7),
            jbd.descriptor(8, &[(3, &bm, false)]),
            bm,
            jbd.commit(8),
        ];
        // Flip a few bytes anywhere.
        for _ in 0..(rng.next() % 4 + 1) {
            let k = (rng.next() % blocks.len() as u64) as usize;
            let o = (rng.next() % 1024) as usize;
            blocks[k][o] ^= 1 << (rng.next() % 8);
        }
        for (i, b) in blocks.iter().enumerate() {
            let off = (1024 + 1 + i) as u64 * 1024;
            img[off as usize..off as usize + 1024].copy_from_slice(b);
            let o = t.observe_write(off, b);
            let lay = t.layout().unwrap();
            for &(a, e) in &o.freed {
                assert!(!(a / 1024..e / 1024).any(|blk| lay.is_pinned(blk)));
            }
        }
    }
}

#[test]
fn fuzzer_finding_huge_superblock_is_refused_without_allocating() {
    // Found by the ext4_tracker fuzz target (out of memory): a superblock
    // rewritten to claim billions of blocks made the relearn allocate for
    // all of them. A file system larger than its device is now refused.
    let input = [
        0x2f, 0x4b, 0xc1, 0x5b, 0xc1, 0xc1, 0xbf, 0x3b, 0x39, 0x98, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x4a, 0xe6, 0xe6, 0xe6,
        0xe6, 0xe6,
    ];
    let mut img = synth_image();
    let mut t = Ext4Tracker::load(&mut common::reader(&img), img.len() as u64).unwrap();
    assert!(run(&mut img, &mut t, &input).is_empty());
}
