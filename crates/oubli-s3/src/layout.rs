//! The names of the S3 medium's objects (runs, packs, the gone list, seals), and the segment bytes any one of them holds.
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
//!
//! Layout 3 adds the writer's generation ([`crate::lease`]): a run or pack
//! written under generation `G > 0` ends in `-gG` (hexadecimal; names
//! without it are generation 0), the gone list names the generation that
//! wrote it, and `seal/G` (16 hex digits) holds each segment's end, which
//! generation wrote which of its bytes (v2), and the gone list, as
//! generation `G` found them when it took the lock.

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
    /// A run of one segment from `offset`, written under `generation`; its
    /// length is the object's size.
    Run {
        id: SegmentId,
        offset: u64,
        generation: u64,
    },
    /// A pack: these pieces, bodies concatenated in this order; and the
    /// generation that wrote it.
    Pack(Vec<Piece>, u64),
    /// The superblocks, the writer's lock, the gone list, or something not ours.
    Other,
}

/// `-gG` after the name of an object written under generation `G > 0`
/// (characters object_store keeps as they are: it would percent-encode `~`).
fn generation_suffix(generation: u64) -> String {
    if generation == 0 {
        String::new()
    } else {
        format!("-g{generation:x}")
    }
}

pub fn run_name(id: SegmentId, offset: u64, generation: u64) -> String {
    format!(
        "seg/{id:08x}/{offset:016x}{}",
        generation_suffix(generation)
    )
}

pub fn pack_name(pieces: &[Piece], generation: u64) -> String {
    let listed: Vec<String> = pieces
        .iter()
        .map(|p| format!("{:08x}.{:x}.{:x}", p.id, p.offset, p.len))
        .collect();
    format!("pack/{}{}", listed.join("_"), generation_suffix(generation))
}

/// The seal of generation `G`.
pub fn seal_name(generation: u64) -> String {
    format!("seal/{generation:016x}")
}

/// The generation a seal's name gives (`None`: not a seal).
pub fn parse_seal_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seal/")?;
    (hex.len() == 16).then_some(())?;
    u64::from_str_radix(hex, 16).ok()
}

/// Seals written before spans: segment ends only.
const SEAL_MAGIC_V1: &str = "oubli-s3 seal v1";
/// Seals with spans: which generation wrote which bytes of each segment.
const SEAL_MAGIC: &str = "oubli-s3 seal v2";

/// What a generation found when it took the lock: each segment's end, the
/// gone list, and (v2) each segment's spans.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seal {
    pub ends: std::collections::BTreeMap<SegmentId, u64>,
    pub gone: Vec<SegmentId>,
    /// Per segment, `(generation, start, end)`: the bytes `[start, end)`
    /// were read from objects of `generation` when the seal was written.
    /// An older generation's object counts only inside a span of its own
    /// generation: the end alone would let a taken-over holder's late
    /// upload into a segment a later holder created under the same id (or
    /// wrote further) count once a later seal's end covers it. `None`: a
    /// v1 seal, which has ends only.
    pub spans: Option<std::collections::BTreeMap<SegmentId, Vec<Span>>>,
}

/// `[start, end)` of a segment, read from objects of `generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub generation: u64,
    pub start: u64,
    pub end: u64,
}

impl Seal {
    /// Whether an object of an older `generation` holding `[offset,
    /// offset+len)` of segment `id` is one the sealing generation found:
    /// inside a span of its own generation (v2), or ending within the
    /// segment's sealed end (v1).
    pub fn covers(&self, generation: u64, id: SegmentId, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len);
        match &self.spans {
            Some(spans) => spans.get(&id).is_some_and(|spans| {
                spans
                    .iter()
                    .any(|s| s.generation == generation && s.start <= offset && end <= s.end)
            }),
            None => self.ends.get(&id).is_some_and(|&sealed| end <= sealed),
        }
    }

    /// Whether segment `id` was deleted when the seal was written (on its
    /// gone list, not among its segments). An older generation's piece of
    /// it is dead, whatever any later gone list says: it keeps a pack
    /// whole (a live pack may still carry it), never the segment; the
    /// engine never creates that id again. (Counting such pieces let a
    /// taken-over holder's late upload into the segment bring it back
    /// once the pack went and the gone list no longer named it.)
    pub fn gone_then(&self, id: SegmentId) -> bool {
        !self.ends.contains_key(&id) && self.gone.contains(&id)
    }
}

/// A seal's body: a header line, then `end ID END`, `span ID GEN START END`
/// and `gone ID` lines (hexadecimal).
pub fn encode_seal(
    ends: impl IntoIterator<Item = (SegmentId, u64)>,
    spans: impl IntoIterator<Item = (SegmentId, Span)>,
    gone: impl IntoIterator<Item = SegmentId>,
) -> Vec<u8> {
    let mut out = format!("{SEAL_MAGIC}\n");
    for (id, end) in ends {
        out.push_str(&format!("end {id:08x} {end:x}\n"));
    }
    for (id, s) in spans {
        out.push_str(&format!(
            "span {id:08x} {:x} {:x} {:x}\n",
            s.generation, s.start, s.end
        ));
    }
    for id in gone {
        out.push_str(&format!("gone {id:08x}\n"));
    }
    out.into_bytes()
}

pub fn decode_seal(body: &[u8]) -> Option<Seal> {
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    let mut seal = Seal::default();
    match lines.next()? {
        SEAL_MAGIC_V1 => {}
        SEAL_MAGIC => seal.spans = Some(Default::default()),
        _ => return None,
    }
    let hex = |f: &str| u64::from_str_radix(f, 16).ok();
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        match f[..] {
            ["end", id, end] => {
                let id = SegmentId::from_str_radix(id, 16).ok()?;
                seal.ends.insert(id, hex(end)?);
            }
            ["span", id, generation, start, end] => {
                let id = SegmentId::from_str_radix(id, 16).ok()?;
                let span = Span {
                    generation: hex(generation)?,
                    start: hex(start)?,
                    end: hex(end)?,
                };
                seal.spans.as_mut()?.entry(id).or_default().push(span);
            }
            ["gone", id] => seal.gone.push(SegmentId::from_str_radix(id, 16).ok()?),
            _ => return None,
        }
    }
    Some(seal)
}

/// The name of the list of deleted segments that packs still carry.
pub const GONE: &str = "gone";

const GONE_MAGIC: &str = "oubli-s3 gone v1";
/// The header of a gone list written under generation G > 0: `... v2 G`.
const GONE_MAGIC_2: &str = "oubli-s3 gone v2 ";

/// The gone list's body: a header line (naming the generation that wrote
/// it, after generation 0), then one hexadecimal id a line.
pub fn encode_gone(ids: impl IntoIterator<Item = SegmentId>, generation: u64) -> Vec<u8> {
    let mut out = if generation == 0 {
        format!("{GONE_MAGIC}\n")
    } else {
        format!("{GONE_MAGIC_2}{generation:x}\n")
    };
    for id in ids {
        out.push_str(&format!("{id:08x}\n"));
    }
    out.into_bytes()
}

/// The ids a gone list holds (`None`: not a gone list).
pub fn decode_gone(body: &[u8]) -> Option<Vec<SegmentId>> {
    gone_generation(body)?;
    let text = std::str::from_utf8(body).ok()?;
    let mut lines = text.lines();
    lines.next()?;
    lines
        .map(|l| SegmentId::from_str_radix(l, 16).ok())
        .collect()
}

/// The generation that wrote a gone list (`None`: not a gone list).
pub fn gone_generation(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    let first = text.lines().next()?;
    if first == GONE_MAGIC {
        return Some(0);
    }
    u64::from_str_radix(first.strip_prefix(GONE_MAGIC_2)?, 16).ok()
}

/// Parses an object's name relative to the store's prefix.
pub fn parse(name: &str) -> Object {
    let (name, generation) = match name.rsplit_once("-g") {
        Some((base, g)) => match u64::from_str_radix(g, 16) {
            Ok(g) if g > 0 => (base, g),
            _ => return Object::Other,
        },
        None => (name, 0),
    };
    let hex64 = |s: &str| u64::from_str_radix(s, 16).ok();
    let hex32 = |s: &str| SegmentId::from_str_radix(s, 16).ok();
    if let Some(rest) = name.strip_prefix("seg/") {
        if let Some((id, offset)) = rest.split_once('/') {
            if let (Some(id), Some(offset)) = (hex32(id), hex64(offset)) {
                return Object::Run {
                    id,
                    offset,
                    generation,
                };
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
            return Object::Pack(pieces, generation);
        }
    }
    Object::Other
}

/// The segment bytes an object holds, as `(segment, offset, bytes)`: what
/// an adversary holding any version of it reads. A pack whose body does
/// not match its name yields what its body covers.
pub fn pieces_of<'a>(name: &str, body: &'a [u8]) -> Vec<(SegmentId, u64, &'a [u8])> {
    match parse(name) {
        Object::Run { id, offset, .. } => vec![(id, offset, body)],
        Object::Pack(pieces, _) => {
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
        for generation in [0, 1, 0x1f, u64::MAX] {
            assert_eq!(
                parse(&run_name(0x2a, 4096, generation)),
                Object::Run {
                    id: 0x2a,
                    offset: 4096,
                    generation
                }
            );
        }
        assert_eq!(run_name(1, 2, 0), "seg/00000001/0000000000000002");
        assert_eq!(run_name(1, 2, 0x1f), "seg/00000001/0000000000000002-g1f");
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
        assert_eq!(
            parse(&pack_name(&pieces, 0)),
            Object::Pack(pieces.clone(), 0)
        );
        assert_eq!(parse(&pack_name(&pieces, 7)), Object::Pack(pieces, 7));
        for other in [
            "superblocks",
            "lock",
            "seg/zz/00",
            "pack/1.2",
            "pack/1.2.3.4",
            "pack/",
            "gone",
            "seal/0000000000000001",
            "seg/00000001/0000000000000002-g",
            "seg/00000001/0000000000000002-g0",
            "seg/00000001/0000000000000002-gzz",
            "seg/00000001/0000000000000002~1",
        ] {
            assert_eq!(parse(other), Object::Other, "{other}");
        }
    }

    #[test]
    fn gone_lists_read_back() {
        for generation in [0, 5] {
            let body = encode_gone([3, 0xffff_ffff], generation);
            assert_eq!(decode_gone(&body), Some(vec![3, 0xffff_ffff]));
            assert_eq!(gone_generation(&body), Some(generation));
            assert_eq!(decode_gone(&encode_gone([], generation)), Some(vec![]));
        }
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
        let name = pack_name(&[widest; PACK_PIECES], u64::MAX);
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
        let got = pieces_of(&pack_name(&pieces, 3), b"abcde");
        assert_eq!(got, vec![(1, 5, &b"abc"[..]), (2, 0, &b"de"[..])]);
        // A short body: only what it covers.
        assert_eq!(
            pieces_of(&pack_name(&pieces, 0), b"abcd"),
            vec![(1, 5, &b"abc"[..])]
        );
        assert_eq!(
            pieces_of(&run_name(3, 8, 2), b"xy"),
            vec![(3, 8, &b"xy"[..])]
        );
    }

    #[test]
    fn seals_read_back() {
        let span = |generation, start, end| Span {
            generation,
            start,
            end,
        };
        let body = encode_seal(
            [(1, 0x40), (0xffff_ffff, 0)],
            [(1, span(2, 0, 0x10)), (1, span(3, 0x10, 0x40))],
            [7],
        );
        let seal = decode_seal(&body).unwrap();
        assert_eq!(
            seal.ends.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>(),
            vec![(1, 0x40), (0xffff_ffff, 0)]
        );
        assert_eq!(seal.gone, vec![7]);
        assert_eq!(
            seal.spans.as_ref().unwrap()[&1],
            vec![span(2, 0, 0x10), span(3, 0x10, 0x40)]
        );
        // Inside a span of its own generation only.
        assert!(seal.covers(2, 1, 0, 0x10) && seal.covers(3, 1, 0x20, 0x20));
        assert!(!seal.covers(2, 1, 0x10, 8), "generation 2 past its span");
        assert!(!seal.covers(1, 1, 0, 8), "a generation with no span");
        assert!(
            !seal.covers(1, 7, 0, 8) && seal.gone_then(7),
            "a gone segment"
        );
        assert!(!seal.gone_then(1), "a live segment");
        // A v1 seal: the segment's end alone decides.
        let v1 = decode_seal(b"oubli-s3 seal v1\nend 1 40\n").unwrap();
        assert_eq!(v1.spans, None);
        assert!(v1.covers(1, 1, 0, 0x40) && !v1.covers(1, 1, 0x20, 0x21));
        assert_eq!(decode_seal(b"oubli-s3 seal v1\nspan 1 2 0 10\n"), None);
        assert_eq!(decode_seal(b"oubli-s3 seal v1\nend 1\n"), None);
        assert_eq!(parse_seal_name(&seal_name(0x2a)), Some(0x2a));
        assert_eq!(parse_seal_name("seal/2a"), None);
    }
}
