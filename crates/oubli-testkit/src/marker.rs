//! Marker blocks: 32-byte self-identifying data blocks that make recovered plaintext traceable.

use std::collections::BTreeSet;

pub const BLOCK: usize = 32;
const MAGIC: &[u8; 8] = b"OUBLImrk";

/// (write id, block index within the write).
pub type Marker = (u64, u32);

fn check(write: u64, block: u32) -> [u8; 12] {
    let mut x = write.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((block as u64) << 17) ^ 0xA5A5;
    let mut out = [0u8; 12];
    for b in out.iter_mut() {
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        *b = (x >> 56) as u8;
    }
    out
}

/// The bytes of write `write`: `len` bytes of marker blocks (the last may be partial).
pub fn data(write: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + BLOCK);
    let mut block = 0u32;
    while out.len() < len {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&write.to_le_bytes());
        out.extend_from_slice(&block.to_le_bytes());
        out.extend_from_slice(&check(write, block));
        block += 1;
    }
    out.truncate(len);
    out
}

/// Every complete marker block found anywhere in `bytes`.
pub fn scan(bytes: &[u8], into: &mut BTreeSet<Marker>) {
    if bytes.len() < BLOCK {
        return;
    }
    let mut i = 0;
    while i + BLOCK <= bytes.len() {
        if &bytes[i..i + 8] == MAGIC {
            let write = u64::from_le_bytes(bytes[i + 8..i + 16].try_into().unwrap());
            let block = u32::from_le_bytes(bytes[i + 16..i + 20].try_into().unwrap());
            if bytes[i + 20..i + 32] == check(write, block) {
                into.insert((write, block));
                i += BLOCK;
                continue;
            }
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_at_any_offset_and_only_whole() {
        let d = data(7, 100);
        let mut buf = vec![0u8; 5];
        buf.extend_from_slice(&d);
        let mut found = BTreeSet::new();
        scan(&buf, &mut found);
        assert_eq!(found, [(7, 0), (7, 1), (7, 2)].into_iter().collect());
        let mut partial = BTreeSet::new();
        scan(&d[1..], &mut partial);
        assert!(!partial.contains(&(7, 0)));
    }
}
