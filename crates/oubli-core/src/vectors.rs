//! Known-answer test vectors: pin the bytes of every sealed format so a change cannot slip in unnoticed.
//!
//! The vectors of the current format live in `tests/vectors/v2.txt` (one
//! `name hex` per line). To regenerate after an intentional format change
//! (with a new version number!), run `OUBLI_WRITE_VECTORS=1 cargo test -p
//! oubli-core vectors`. The format-1 vectors (`v1.txt`) are never
//! regenerated: they are bytes an old store holds, and the current code must
//! still open them.

use crate::log::{
    self, seal_frame_with_salt, seal_tally_with_salt, LogFormat, LogKeys, LogPlace, Op,
};
use crate::medium::{Medium, SegmentId, Slot};
use crate::superblock::{self, Body, Header, FORMAT_VERSION};
use crate::tree::{encode_node, CellRef, Key, Node, ObjectRecord, Value, KIND_CELL, KIND_OBJECT};
use crate::unit::{cell_aad, node_aad};
use oubli_crypto::{CryptoProvider, KeyRef, RingProvider, SecretKey};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn compute() -> Vec<(&'static str, String)> {
    let p = RingProvider::new();
    let key = SecretKey::from_bytes([0x42; 32]);
    let store_id = [0x11; 16];
    let mut out = Vec::new();
    out.push(("hkdf", hex(p.derive(&key, b"label", b"context").expose())));

    let mut cell = b"attack at dawn".to_vec();
    p.seal(&key, &cell_aad(7, 3, 100, 14), &mut cell);
    out.push(("cell", hex(&cell)));

    let node = Node::Leaf(vec![
        (
            Key::new(7, KIND_OBJECT, 0),
            Value::Object(ObjectRecord {
                size: 131_072,
                meta: b"m".to_vec(),
            }),
        ),
        (
            Key::new(7, KIND_CELL, 0),
            Value::Cell(CellRef {
                start: 0,
                len: 32768,
                addr: 1 << 32,
                key: KeyRef::from_bytes([1; 32]),
            }),
        ),
        (
            Key::new(7, KIND_CELL, 1),
            Value::Cell(CellRef {
                start: 0,
                len: 32768,
                addr: (1 << 32) + 32784,
                key: KeyRef::from_bytes([2; 32]),
            }),
        ),
    ]);
    let encoded = encode_node(&node);
    out.push(("leaf-plain", hex(&encoded)));
    let mut sealed = encoded;
    p.seal(&key, &node_aad(0), &mut sealed);
    out.push(("leaf-sealed", hex(&sealed)));

    let header = Header {
        version: FORMAT_VERSION,
        store_id,
        epoch: 9,
    };
    let body = Body {
        cell_size: 32768,
        root: None,
        next_oid: 2,
        next_segment: 6,
        log_segment: 4,
        log_tally: Some(5),
        live_bytes: 1234,
        committed_at: 1_700_000_000,
    };
    out.push((
        "superblock",
        hex(&superblock::seal(&p, &key, &header, &body)),
    ));

    let keys = LogKeys {
        provider: &p,
        epoch_key: &key,
        store_id: &store_id,
        epoch: 9,
    };
    out.push((
        "log-frame",
        hex(&seal_frame_with_salt(&keys, 0, &v1_ops(), [0x33; 16])),
    ));
    out.push((
        "log-tally",
        hex(&seal_tally_with_salt(&keys, 1, 80, [0x44; 16])),
    ));
    out
}

/// The batch the log-frame vectors seal.
fn v1_ops() -> Vec<Op> {
    vec![
        Op::DeleteObject { oid: 7 },
        Op::DropCells {
            oid: 8,
            from: 2,
            to: u64::MAX,
        },
    ]
}

fn pinned(name: &str) -> Vec<(String, String)> {
    let path = format!("{}/../../tests/vectors/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (n, h) = l.split_once(' ').expect("name hex");
            (n.to_string(), h.to_string())
        })
        .collect()
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

/// One segment in memory: enough of a medium to read a pinned log frame.
struct OneSegment(Vec<u8>);

impl Medium for OneSegment {
    fn describe(&self) -> String {
        "vector".into()
    }
    fn segment_capacity(&self) -> u64 {
        1 << 20
    }
    fn append(&self, _: SegmentId, _: u64, _: &[u8]) -> std::io::Result<()> {
        unimplemented!("read only")
    }
    fn read(&self, _: SegmentId, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let at = offset as usize;
        let src = self
            .0
            .get(at..at + buf.len())
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn segment_len(&self, _: SegmentId) -> std::io::Result<Option<u64>> {
        Ok(Some(self.0.len() as u64))
    }
    fn list_segments(&self) -> std::io::Result<Vec<SegmentId>> {
        Ok(vec![4])
    }
    fn delete_segment(&self, _: SegmentId) -> std::io::Result<()> {
        Ok(())
    }
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn read_superblock(&self, _: Slot) -> std::io::Result<Option<Vec<u8>>> {
        Ok(None)
    }
    fn write_superblock(&self, _: Slot, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

/// A store of format 1 keeps opening: its superblock and its log frames
/// (no salt, no tally) still open with the current code.
#[test]
fn format_1_vectors_still_open() {
    let p = RingProvider::new();
    let key = SecretKey::from_bytes([0x42; 32]);
    let v1 = pinned("v1.txt");
    let get = |n: &str| unhex(&v1.iter().find(|(k, _)| k == n).expect(n).1);
    let computed = compute();
    // Units whose format did not change are the same bytes.
    for name in ["hkdf", "cell", "leaf-plain", "leaf-sealed"] {
        let now = &computed.iter().find(|(k, _)| *k == name).unwrap().1;
        assert_eq!(&hex(&get(name)), now, "{name}");
    }
    let (header, body) = superblock::open(&p, &key, &get("superblock")).unwrap();
    assert_eq!((header.version, header.epoch), (1, 9));
    assert_eq!(body.log_tally, None);
    assert_eq!(body.log_place().format, LogFormat::V1);
    let keys = LogKeys {
        provider: &p,
        epoch_key: &key,
        store_id: &header.store_id,
        epoch: 9,
    };
    let place = LogPlace {
        segment: 4,
        tally: None,
        format: LogFormat::V1,
    };
    let read = log::read_log(&OneSegment(get("log-frame")), &place, &keys);
    assert!(read.damage.is_none());
    assert_eq!(read.batches, vec![v1_ops()]);
}

#[test]
fn vectors_match_the_pinned_bytes() {
    let computed = compute();
    if std::env::var_os("OUBLI_WRITE_VECTORS").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/v2.txt");
        let header = "# oubli format v2 known-answer vectors (key = 0x42 x 32; see crates/oubli-core/src/vectors.rs).\n\
                      # hkdf and cell were cross-checked against Python hmac/hashlib and cryptography.AESGCM.\n";
        let text: String = std::iter::once(header.to_string())
            .chain(computed.iter().map(|(n, h)| format!("{n} {h}\n")))
            .collect();
        std::fs::write(path, text).unwrap();
    }
    let pinned = pinned("v2.txt");
    assert_eq!(pinned.len(), computed.len());
    for ((name, want), (cname, got)) in pinned.iter().zip(&computed) {
        assert_eq!(name, cname);
        assert_eq!(
            want, got,
            "vector {name} changed: the on-medium format is not what v{FORMAT_VERSION} pins"
        );
    }
}
