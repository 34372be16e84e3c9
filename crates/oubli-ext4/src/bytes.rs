//! Checked little- and big-endian field access and CRC32C: every read of untrusted bytes goes through here and returns `None` out of bounds.

pub(crate) fn le16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
pub(crate) fn le32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
pub(crate) fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}
pub(crate) fn be32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}
pub(crate) fn u8_at(b: &[u8], off: usize) -> Option<u8> {
    b.get(off).copied()
}

const fn crc_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82F6_3B78
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}
static CRC_TABLE: [u32; 256] = crc_table();

/// CRC32C as the kernel's `crc32c(crc, p, len)` computes it: reflected,
/// no inversion in or out (jbd2 seeds it with `~0` itself).
pub fn crc32c_raw(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC_TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn crc32c_check_value() {
        // The standard CRC-32C check value (with the usual inversions).
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
    }
    #[test]
    fn out_of_bounds_is_none() {
        let b = [1u8, 2, 3];
        assert_eq!(le16(&b, 1), Some(0x0302));
        assert_eq!(le16(&b, 2), None);
        assert_eq!(le32(&b, usize::MAX - 1), None);
        assert_eq!(be32(&b, 0), None);
    }
}
