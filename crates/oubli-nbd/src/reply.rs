//! Encoding of what the server sends, sans-IO: option replies, simple replies and structured reply chunks.

use crate::proto::*;

/// Appends an option reply (fixed newstyle): magic, option, reply type, length, data.
pub fn option_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an option error reply with a human-readable message (cut to the protocol's string limit).
pub fn option_error(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    option_reply(out, option, reply, truncate_str(message, MAX_STRING));
}

/// The header of a simple reply (`error` 0 for success; a READ's data follows it).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// The header of a structured reply chunk carrying `len` payload bytes.
pub fn chunk_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
    out
}

/// A final `NBD_REPLY_TYPE_NONE` chunk: success without payload.
pub fn chunk_done(cookie: u64) -> [u8; 20] {
    chunk_header(cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)
}

/// The header of a final `NBD_REPLY_TYPE_OFFSET_DATA` chunk; `len` data bytes follow it.
pub fn chunk_data_header(cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut out = [0u8; 28];
    out[..20].copy_from_slice(&chunk_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        len + 8,
    ));
    out[20..28].copy_from_slice(&offset.to_be_bytes());
    out
}

/// A final `NBD_REPLY_TYPE_ERROR` chunk with a message.
pub fn chunk_error(cookie: u64, error: Errno, message: &str) -> Vec<u8> {
    let msg = truncate_str(message, MAX_STRING);
    let mut out = Vec::with_capacity(26 + msg.len());
    out.extend_from_slice(&chunk_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        6 + msg.len() as u32,
    ));
    out.extend_from_slice(&error.code().to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// The first at most `max` bytes of `s`, cut at a character boundary.
fn truncate_str(s: &str, max: usize) -> &[u8] {
    if s.len() <= max {
        return s.as_bytes();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let r = simple_reply(0x0102, 22);
        assert_eq!(&r[..4], &[0x67, 0x44, 0x66, 0x98]);
        assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 22);
        let e = chunk_error(9, Errno::Io, "bad");
        assert_eq!(e.len(), 20 + 6 + 3);
        assert_eq!(
            u16::from_be_bytes(e[6..8].try_into().unwrap()),
            REPLY_TYPE_ERROR
        );
        let mut out = Vec::new();
        option_error(&mut out, 7, REP_ERR_UNSUP, &"é".repeat(3000));
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(len <= MAX_STRING);
        assert!(std::str::from_utf8(&out[20..]).is_ok());
    }
}
