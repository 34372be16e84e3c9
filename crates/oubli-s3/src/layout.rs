//! The names of the S3 medium's objects (runs, packs, the gone list), and the segment bytes any one of them holds.
//!
//! Layout 2 (docs/FORMAT-media.md, "S3"): a sync that carries the bytes of
//! one segment uploads them as a *run* `seg/ID/OFFSET`; a sync that carries
//! several segments uploads them as one *pack*, whose name lists its pieces
//! (`pack/ID.OFFSET.LEN_ID.OFFSET.LEN…`, hexadecimal, bodies concatenated
//! in that order), so that one PUT — atomic — makes them durable together
//! and a listing alone rebuilds every segment. Segments deleted while a
//! pack still carries a live piece of another segment are listed in the
//! one object `gone` until the pack goes (one object however many: a
//! listing stays as long as the store's live objects).

use oubli_core::SegmentId;

/// Most segments one pack carries: its name lists them all and stays within
/// one 255-byte path component, the limit of servers that keep objects as
/// files (versitygw's posix backend, MinIO).
pub const PACK_PIECES: usize = 8;

/// `len` bytes of segment `id` from byte `offset`: what one upload carries
/// of one segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub id: SegmentId,
    pub offset: u64,
    pub len: u64,
}

/// What an object under a store's prefix is, by its name (relative to the prefix).
#[derive(Debug, PartialEq, Eq)]
pub enum Object {
    /// A run of one segment from `offset`; its length is the object's size.
    Run { id: SegmentId, offset: u64 },
    /// A pack: these pieces, bodies concatenated in this order.
    Pack(Vec<Piece>),
    /// The superblocks, the writer's lock, the gone list, or something not ours.
    Other,
}

pub fn run_name(id: SegmentId, offset: u64) -> String {
    format!("seg/{id:08x}/{offset:016x}")
}

pub fn pack_name(pieces: &[Piece]) -> String {
    let listed: Vec<String> = pieces
        .iter()
        .map(|p| format!("{:08x}.{:x}.{:x}", p.id, p.offset, p.len))
        .collect();
    format!("pack/{}", listed.join("_"))
}

/// The name of the list of deleted segments that packs still carry.
pub const GONE: &str = "gone";

const GONE_MAGIC: &str = "oubli-s3 gone v1";

/// The gone list's body: a header line, then one hexadecimal id a line.
pub fn encode_gone(ids: impl IntoIterator<Item = SegmentId>) -> Vec<u8> {
    let mut out = format!("{GONE_MAGIC}\n");
    for id in ids {
        out.push_str(&format!("{id:08x}\n"));
    }
    out.into_bytes()
}

/// The ids a gone list holds (`None`: not a gone list).
pub fn decode_gone(body: &[u8]) -> Option<Vec<SegmentId>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    (lines.next()? == GONE_MAGIC).then_some(())?;
    lines
        .map(|l| SegmentId::from_str_radix(l, 16).ok())
        .collect()
}

/// Parses an object's name relative to the store's prefix.
pub fn parse(name: &str) -> Object {
    let hex64 = |s: &str| u64::from_str_radix(s, 16).ok();
    let hex32 = |s: &str| SegmentId::from_str_radix(s, 16).ok();
    if let Some(rest) = name.strip_prefix("seg/") {
        if let Some((id, offset)) = rest.split_once('/') {
            if let (Some(id), Some(offset)) = (hex32(id), hex64(offset)) {
                return Object::Run { id, offset };
            }
        }
    } else if let Some(rest) = name.strip_prefix("pack/") {
        let pieces: Option<Vec<Piece>> = rest
            .split('_')
            .map(|p| {
                let mut f = p.split('.');
                let piece = Piece {
                    id: hex32(f.next()?)?,
                    offset: hex64(f.next()?)?,
                    len: hex64(f.next()?)?,
                };
                f.next().is_none().then_some(piece)
            })
            .collect();
        if let Some(pieces) = pieces.filter(|p| !p.is_empty() && p.len() <= PACK_PIECES) {
            return Object::Pack(pieces);
        }
    }
    Object::Other
}

/// The segment bytes an object holds, as `(segment, offset, bytes)`: what
/// an adversary holding any version of it reads. A pack whose body does
/// not match its name yields what its body covers.
pub fn pieces_of<'a>(name: &str, body: &'a [u8]) -> Vec<(SegmentId, u64, &'a [u8])> {
    match parse(name) {
        Object::Run { id, offset } => vec![(id, offset, body)],
        Object::Pack(pieces) => {
            let mut out = Vec::new();
            let mut at = 0usize;
            for p in pieces {
                let Some(end) = at.checked_add(p.len as usize).filter(|&e| e <= body.len()) else {
                    break;
                };
                out.push((p.id, p.offset, &body[at..end]));
                at = end;
            }
            out
        }
        Object::Other => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        assert_eq!(
            parse(&run_name(0x2a, 4096)),
            Object::Run {
                id: 0x2a,
                offset: 4096
            }
        );
        let pieces = vec![
            Piece {
                id: 7,
                offset: 0,
                len: 10,
            },
            Piece {
                id: 0xffff_ffff,
                offset: 0x3ff_ffff,
                len: 0x400_0000,
            },
        ];
        assert_eq!(parse(&pack_name(&pieces)), Object::Pack(pieces));
        for other in [
            "superblocks",
            "lock",
            "seg/zz/00",
            "pack/1.2",
            "pack/1.2.3.4",
            "pack/",
            "gone",
        ] {
            assert_eq!(parse(other), Object::Other, "{other}");
        }
    }

    #[test]
    fn gone_lists_read_back() {
        assert_eq!(
            decode_gone(&encode_gone([3, 0xffff_ffff])),
            Some(vec![3, 0xffff_ffff])
        );
        assert_eq!(decode_gone(&encode_gone([])), Some(vec![]));
        assert_eq!(decode_gone(b"something else\n1\n"), None);
        assert_eq!(decode_gone(b"oubli-s3 gone v1\nzz\n"), None);
    }

    #[test]
    fn a_full_pack_name_fits_one_path_component() {
        let widest = Piece {
            id: u32::MAX,
            offset: u64::from(u32::MAX),
            len: u64::from(u32::MAX),
        };
        let name = pack_name(&[widest; PACK_PIECES]);
        assert!(name.len() - "pack/".len() <= 255, "{}", name.len());
    }

    #[test]
    fn pieces_of_a_pack_split_its_body_by_its_name() {
        let pieces = [
            Piece {
                id: 1,
                offset: 5,
                len: 3,
            },
            Piece {
                id: 2,
                offset: 0,
                len: 2,
            },
        ];
        let got = pieces_of(&pack_name(&pieces), b"abcde");
        assert_eq!(got, vec![(1, 5, &b"abc"[..]), (2, 0, &b"de"[..])]);
        // A short body: only what it covers.
        assert_eq!(
            pieces_of(&pack_name(&pieces), b"abcd"),
            vec![(1, 5, &b"abc"[..])]
        );
        assert_eq!(pieces_of(&run_name(3, 8), b"xy"), vec![(3, 8, &b"xy"[..])]);
    }
}
