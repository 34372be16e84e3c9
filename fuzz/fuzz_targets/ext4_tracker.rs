//! Fuzz target: arbitrary writes at the superblock, block bitmap and jbd2 journal of a synthetic ext4, through the liveness tracker (relearning when asked): no panic, no fixed metadata dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oubli_ext4::fuzzing::{run, synth_image};
use oubli_ext4::Ext4Tracker;

fuzz_target!(|data: &[u8]| {
    let mut img = synth_image();
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
