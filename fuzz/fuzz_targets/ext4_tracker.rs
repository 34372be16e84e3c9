//! Fuzz target: arbitrary writes at the superblock, block bitmap and jbd2 journal of a synthetic ext4, through the liveness tracker (relearning when asked): no panic, no fixed metadata dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oubli_ext4::fuzzing::{run, synth_image_with};
use oubli_ext4::Ext4Tracker;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the journal's tag format: 32-bit tags without
    // checksums (random input can form whole transactions), 64-bit, csum v2, csum v3.
    let Some((&feat, data)) = data.split_first() else {
        return;
    };
    let mut img = synth_image_with([0x0, 0x2, 0x8 | 0x2, 0x10 | 0x2][feat as usize % 4]);
    let im = img.clone();
    let mut t = Ext4Tracker::load(&mut |o, b: &mut [u8]| {
        let o = o as usize;
        b.copy_from_slice(&im[o..o + b.len()]);
        Ok(())
    }, im.len() as u64)
    .expect("the synthetic image loads");
    let bad = run(&mut img, &mut t, data);
    assert!(bad.is_empty(), "dropped fixed metadata: {bad:?}");
});
