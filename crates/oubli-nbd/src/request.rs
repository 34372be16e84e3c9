//! Transmission requests, sans-IO: parse a 28-byte header and decide, as a pure function, what it asks of the export.
//!
//! [`parse_request`] only looks at bytes; [`check`] only looks at the request
//! and the export's limits. Neither does I/O, so both are fuzzed and
//! property-tested (`fuzz/fuzz_targets/nbd_request.rs`, `tests/proptest.rs`).

use crate::proto::*;

/// A request header as the client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    /// The command type (`CMD_*`), possibly one this server does not know.
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Bytes of payload that follow the header on the wire: the data of a
    /// `WRITE` (whatever else is wrong with the request), nothing otherwise.
    pub fn payload_len(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.len
        } else {
            0
        }
    }

    /// Encodes the header (for clients and tests).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.to_be_bytes());
        out[6..8].copy_from_slice(&self.kind.to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset.to_be_bytes());
        out[24..28].copy_from_slice(&self.len.to_be_bytes());
        out
    }
}

/// Why a header cannot be parsed. Both end the connection: after a bad magic
/// the stream cannot be resynchronised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    BadMagic(u32),
}

impl std::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderError::BadMagic(m) => write!(f, "bad request magic {m:#010x}"),
        }
    }
}

/// Parses a request header from the start of `buf`. `Ok(None)` if fewer than
/// [`REQUEST_LEN`] bytes are there yet.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, HeaderError> {
    let Some(h) = buf.get(..REQUEST_LEN) else {
        return Ok(None);
    };
    let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
    if magic != REQUEST_MAGIC {
        return Err(HeaderError::BadMagic(magic));
    }
    Ok(Some(Request {
        flags: u16::from_be_bytes(h[4..6].try_into().unwrap()),
        kind: u16::from_be_bytes(h[6..8].try_into().unwrap()),
        cookie: u64::from_be_bytes(h[8..16].try_into().unwrap()),
        offset: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        len: u32::from_be_bytes(h[24..28].try_into().unwrap()),
    }))
}

/// What the connection negotiated and what the export allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes.
    pub size: u64,
    pub read_only: bool,
    /// Structured replies were negotiated (so `CMD_FLAG_DF` is valid on reads).
    pub structured: bool,
    /// Largest READ/WRITE payload.
    pub max_payload: u32,
}

/// What a valid request asks the server to do. Offsets and lengths are
/// checked against the export: `offset + len <= size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read {
        offset: u64,
        len: u32,
    },
    /// The payload (`len` bytes) follows the header.
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    /// Discard: erased at the next commit.
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    /// `punch` true: may deallocate (reads back as zeros); false (`NO_HOLE`): write zeros.
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        punch: bool,
    },
    /// A hint; nothing to do.
    Cache,
    /// `NBD_CMD_DISC`: no reply, close.
    Disconnect,
}

/// Validates a request against the export, as the protocol says:
/// unknown command or flag → `EINVAL`; write past the end → `ENOSPC`; read,
/// trim or cache past the end → `EINVAL`; READ/WRITE payload over the maximum →
/// `EOVERFLOW` (read) / `EINVAL` (write); writes to a read-only export → `EPERM`;
/// `FAST_ZERO` with `NO_HOLE` (which cannot be faster than a write) → `ENOTSUP`.
pub fn check(req: &Request, limits: &Limits) -> Result<Action, Errno> {
    let allowed = match req.kind {
        CMD_READ if limits.structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_DISC | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        // BLOCK_STATUS needs a metadata context, which this server never grants.
        _ => return Err(Errno::Inval),
    };
    if req.flags & !allowed != 0 {
        return Err(Errno::Inval);
    }
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let in_range = req
        .offset
        .checked_add(req.len as u64)
        .is_some_and(|end| end <= limits.size);
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && limits.read_only {
        return Err(Errno::Perm);
    }
    let (offset, len) = (req.offset, req.len);
    match req.kind {
        CMD_READ => {
            if len > limits.max_payload {
                return Err(Errno::Overflow);
            }
            if !in_range {
                return Err(Errno::Inval);
            }
            Ok(Action::Read { offset, len })
        }
        CMD_WRITE => {
            if len > limits.max_payload {
                return Err(Errno::Inval);
            }
            if !in_range {
                return Err(Errno::NoSpc);
            }
            Ok(Action::Write { offset, len, fua })
        }
        CMD_DISC => Ok(Action::Disconnect),
        CMD_FLUSH => Ok(Action::Flush),
        CMD_TRIM => {
            if !in_range {
                return Err(Errno::Inval);
            }
            Ok(Action::Trim { offset, len, fua })
        }
        CMD_CACHE => {
            if !in_range {
                return Err(Errno::Inval);
            }
            Ok(Action::Cache)
        }
        CMD_WRITE_ZEROES => {
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && no_hole {
                return Err(Errno::NotSup);
            }
            if !in_range {
                return Err(Errno::NoSpc);
            }
            Ok(Action::WriteZeroes {
                offset,
                len,
                fua,
                punch: !no_hole,
            })
        }
        _ => Err(Errno::Inval),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(kind: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request {
            flags,
            kind,
            cookie: 7,
            offset,
            len,
        }
    }

    const LIMITS: Limits = Limits {
        size: 1 << 20,
        read_only: false,
        structured: false,
        max_payload: MAX_PAYLOAD,
    };

    #[test]
    fn round_trip_and_short_input() {
        let r = req(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        let bytes = r.encode();
        assert_eq!(parse_request(&bytes), Ok(Some(r)));
        assert_eq!(parse_request(&bytes[..27]), Ok(None));
        let mut bad = bytes;
        bad[0] ^= 1;
        assert!(matches!(parse_request(&bad), Err(HeaderError::BadMagic(_))));
    }

    #[test]
    fn errors_follow_the_spec() {
        let size = LIMITS.size;
        let c = |r: Request| check(&r, &LIMITS);
        assert_eq!(c(req(CMD_READ, 0, size - 1, 2)), Err(Errno::Inval));
        assert_eq!(c(req(CMD_WRITE, 0, size - 1, 2)), Err(Errno::NoSpc));
        assert_eq!(c(req(CMD_WRITE_ZEROES, 0, size, 1)), Err(Errno::NoSpc));
        assert_eq!(c(req(CMD_TRIM, 0, u64::MAX, 1)), Err(Errno::Inval));
        assert_eq!(
            c(req(CMD_READ, 0, 0, MAX_PAYLOAD + 1)),
            Err(Errno::Overflow)
        );
        assert_eq!(c(req(CMD_WRITE, 0, 0, MAX_PAYLOAD + 1)), Err(Errno::Inval));
        assert_eq!(c(req(99, 0, 0, 0)), Err(Errno::Inval));
        assert_eq!(c(req(CMD_BLOCK_STATUS, 0, 0, 512)), Err(Errno::Inval));
        assert_eq!(c(req(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1)), Err(Errno::Inval));
        assert_eq!(c(req(CMD_READ, CMD_FLAG_DF, 0, 1)), Err(Errno::Inval));
        assert_eq!(
            c(req(
                CMD_WRITE_ZEROES,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                1
            )),
            Err(Errno::NotSup)
        );
        let ro = Limits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(check(&req(CMD_TRIM, 0, 0, 1), &ro), Err(Errno::Perm));
        assert_eq!(
            check(&req(CMD_READ, 0, 0, 1), &ro),
            Ok(Action::Read { offset: 0, len: 1 })
        );
    }

    #[test]
    fn valid_requests() {
        let c = |r: Request| check(&r, &LIMITS);
        assert_eq!(
            c(req(CMD_WRITE, CMD_FLAG_FUA, 0, 4096)),
            Ok(Action::Write {
                offset: 0,
                len: 4096,
                fua: true
            })
        );
        assert_eq!(
            c(req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 512, 512)),
            Ok(Action::WriteZeroes {
                offset: 512,
                len: 512,
                fua: false,
                punch: false
            })
        );
        assert_eq!(
            c(req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 512, 512)),
            Ok(Action::WriteZeroes {
                offset: 512,
                len: 512,
                fua: false,
                punch: true
            })
        );
        assert_eq!(c(req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0)), Ok(Action::Flush));
        assert_eq!(c(req(CMD_DISC, 0, 0, 0)), Ok(Action::Disconnect));
        assert_eq!(
            c(req(CMD_READ, 0, LIMITS.size, 0)),
            Ok(Action::Read {
                offset: LIMITS.size,
                len: 0
            })
        );
        let structured = Limits {
            structured: true,
            ..LIMITS
        };
        assert!(check(&req(CMD_READ, CMD_FLAG_DF, 0, 1), &structured).is_ok());
    }
}
