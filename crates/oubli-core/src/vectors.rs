//! Known-answer test vectors: pin the bytes of every sealed format so a change cannot slip in unnoticed.
//!
//! The vectors live in `tests/vectors/v1.txt` (one `name hex` per line). To
//! regenerate after an intentional format change (with a new version
//! number!), run `OUBLI_WRITE_VECTORS=1 cargo test -p oubli-core vectors`.

use crate::log::{seal_frame, Op};
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
        next_segment: 5,
        log_segment: 4,
        live_bytes: 1234,
        committed_at: 1_700_000_000,
    };
    out.push((
        "superblock",
        hex(&superblock::seal(&p, &key, &header, &body)),
    ));

    let ops = [
        Op::DeleteObject { oid: 7 },
        Op::DropCells {
            oid: 8,
            from: 2,
            to: u64::MAX,
        },
    ];
    out.push((
        "log-frame",
        hex(&seal_frame(&p, &key, &store_id, 9, 0, &ops)),
    ));
    out
}

#[test]
fn vectors_match_the_pinned_bytes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/v1.txt");
    let computed = compute();
    if std::env::var_os("OUBLI_WRITE_VECTORS").is_some() {
        let header = "# oubli format v1 known-answer vectors (key = 0x42 x 32; see crates/oubli-core/src/vectors.rs).\n\
                      # hkdf and cell were cross-checked against Python hmac/hashlib and cryptography.AESGCM.\n";
        let text: String = std::iter::once(header.to_string())
            .chain(computed.iter().map(|(n, h)| format!("{n} {h}\n")))
            .collect();
        std::fs::write(path, text).unwrap();
    }
    let pinned = std::fs::read_to_string(path).expect("tests/vectors/v1.txt");
    let pinned: Vec<(&str, &str)> = pinned
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(' ').expect("name hex"))
        .collect();
    assert_eq!(pinned.len(), computed.len());
    for ((name, want), (cname, got)) in pinned.iter().zip(&computed) {
        assert_eq!(name, cname);
        assert_eq!(
            want, got,
            "vector {name} changed: the on-medium format is not what v1 pins"
        );
    }
}
