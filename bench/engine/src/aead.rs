//! In-process AEAD rates of the engine's own provider (ring AES-256-GCM), to tell cipher cost from engine cost.

use crate::report::{mb_per_s, say, Rec};
use oubli_crypto::{CryptoProvider, RingProvider, TAG_LEN};
use std::time::Instant;
use zeroize::Zeroize;

const AAD: &[u8] = b"oubli/cell/v1 + 24 bytes of position";

/// Seals `total` bytes as `unit`-byte messages in place (no copy), each
/// under a fresh random key as the engine does for cells; returns seconds.
fn seal_rate(p: &RingProvider, unit: usize, total: u64) -> f64 {
    let mut buf = vec![0x5au8; unit];
    buf.reserve(TAG_LEN);
    let start = Instant::now();
    for _ in 0..total / unit as u64 {
        let key = p.random_key();
        buf.truncate(unit);
        p.seal(&key, AAD, &mut buf);
    }
    start.elapsed().as_secs_f64()
}

/// Opens `total` bytes of `unit`-byte messages in place (the same message
/// re-sealed each time, outside the clock); returns seconds.
fn open_rate(p: &RingProvider, unit: usize, total: u64) -> f64 {
    let key = p.random_key();
    let mut buf = vec![0x5au8; unit];
    buf.reserve(TAG_LEN);
    let mut secs = 0.0;
    for _ in 0..total / unit as u64 {
        buf.truncate(unit);
        p.seal(&key, AAD, &mut buf);
        let start = Instant::now();
        p.open(&key, AAD, &mut buf).expect("authentic");
        secs += start.elapsed().as_secs_f64();
    }
    secs
}

/// Copies `total` bytes in `unit`-byte `extend_from_slice` calls (what the
/// engine does to stage a cell); returns seconds.
fn copy_rate(unit: usize, total: u64) -> f64 {
    let src = vec![0x5au8; unit];
    let mut dst: Vec<u8> = Vec::with_capacity(unit);
    let start = Instant::now();
    for _ in 0..total / unit as u64 {
        dst.clear();
        dst.extend_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
    }
    start.elapsed().as_secs_f64()
}

/// Zeroizes `total` bytes as `unit`-byte `Zeroizing<Vec<u8>>` drops (the
/// engine wipes every plaintext cell buffer this way); returns seconds.
fn zeroize_rate(unit: usize, total: u64) -> f64 {
    let mut buf = vec![0x5au8; unit];
    let start = Instant::now();
    for _ in 0..total / unit as u64 {
        buf.zeroize();
        // zeroize() clears the Vec; restore its length without touching the bytes again.
        // SAFETY: the capacity is at least `unit` and every byte is initialised (zero).
        unsafe { buf.set_len(unit) };
        std::hint::black_box(&buf);
    }
    start.elapsed().as_secs_f64()
}

/// Measures and reports seal/open rates on 1 MiB and on 32 KiB (cell-sized)
/// messages, and the memory operations the engine adds per cell.
pub fn run(total: u64) {
    let p = RingProvider::new();
    // Warm up (CPU frequency, page faults of the buffers).
    seal_rate(&p, 1 << 20, 64 << 20);
    for (op, unit) in [
        ("seal", 1usize << 20),
        ("seal", 32 << 10),
        ("open", 1 << 20),
        ("open", 32 << 10),
    ] {
        let secs = if op == "seal" {
            seal_rate(&p, unit, total)
        } else {
            open_rate(&p, unit, total)
        };
        let rate = mb_per_s(total, secs);
        say(format!(
            "ring AES-256-GCM {op} in-process, in place, {unit} B messages{}: {rate:.1} MB/s (one core)",
            if op == "seal" {
                ", fresh random key each"
            } else {
                ""
            }
        ));
        Rec::new("aead_inprocess")
            .str("op", op)
            .int("unit", unit as u64)
            .int("bytes", total)
            .num("secs", secs)
            .num("mb_s", rate)
            .emit();
    }
    for (op, unit) in [("memcpy", 32usize << 10), ("zeroize", 32 << 10)] {
        let secs = if op == "memcpy" {
            copy_rate(unit, total)
        } else {
            zeroize_rate(unit, total)
        };
        let rate = mb_per_s(total, secs);
        say(format!(
            "{op} in-process, {unit} B buffers: {rate:.1} MB/s (one core; the engine copies and wipes every cell)"
        ));
        Rec::new("mem_inprocess")
            .str("op", op)
            .int("unit", unit as u64)
            .int("bytes", total)
            .num("secs", secs)
            .num("mb_s", rate)
            .emit();
    }
}
