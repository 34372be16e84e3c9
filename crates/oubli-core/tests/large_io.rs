//! Large reads and writes give back exactly what a byte model holds, for both cell sizes, at any alignment, with buffered cells and holes inside their range, whether a read is opened in place (whole cells back to back) or piece by piece, into a fresh buffer or a reused one.

mod common;

use oubli_core::{CreateOptions, Store};

/// Bytes that differ at every position and for every seed (a multiplicative
/// hash of the index), so that a byte read from the wrong place shows.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((i + seed * 1_000_003).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

fn write(s: &Store, model: &mut Vec<u8>, oid: u64, at: usize, data: &[u8]) {
    s.write(oid, at as u64, data).unwrap();
    if model.len() < at + data.len() {
        model.resize(at + data.len(), 0);
    }
    model[at..at + data.len()].copy_from_slice(data);
}

fn check(s: &Store, model: &[u8], oid: u64) {
    // Whole cells (read in place when they lie back to back on the medium),
    // whole, and cut at unaligned ends so that units are cut by the read.
    let cs = s.cell_size_of(oid).unwrap() as usize;
    // One buffer kept from read to read, as a server keeps it: larger than
    // any read here and full of bytes no read may return.
    let mut kept = vec![0xa5u8; 5 << 20];
    for (at, len) in [
        (cs, 64 * cs),
        (0, model.len() / cs * cs),
        (2 * cs, cs),
        (0, model.len()),
        (1, model.len() - 1),
        (4095, 3 << 20),
        (32_769, (5 << 19) + 12_345),
        (model.len() - (1 << 20) - 7, 1 << 20),
    ] {
        let got = s.read(oid, at as u64, len).unwrap();
        let end = (at + len).min(model.len());
        assert!(got == model[at..end], "read of {len} bytes at {at}");
        let n = s.read_into(oid, at as u64, len, &mut kept).unwrap();
        assert!(
            kept[..n] == model[at..end],
            "read_into of {len} bytes at {at}"
        );
    }
}

#[test]
fn large_reads_and_writes_match_a_byte_model_on_either_cell_size() {
    let s = common::store(CreateOptions::default());
    for small_cells in [false, true] {
        let oid = s.create_object(b"").unwrap();
        if small_cells {
            assert!(s.use_small_cells(oid).unwrap());
        }
        let mut model = Vec::new();
        // A large write, unaligned at both ends.
        write(&s, &mut model, oid, 0, &bytes(1, 7));
        write(&s, &mut model, oid, 7, &bytes(2, (4 << 20) + 1001));
        s.flush().unwrap();
        check(&s, &model, oid);
        // Small writes left buffered inside the range, and punched holes.
        for (k, at) in [5_000usize, 700_123, 2 << 20, (3 << 20) + 17]
            .into_iter()
            .enumerate()
        {
            write(&s, &mut model, oid, at, &bytes(10 + k as u64, 3000));
        }
        s.punch_hole(oid, 1 << 20, 300_000).unwrap();
        model[1 << 20..(1 << 20) + 300_000].fill(0);
        check(&s, &model, oid);
        // A second large overwrite across all of that, then a commit.
        write(&s, &mut model, oid, 65_537, &bytes(3, 3 << 20));
        check(&s, &model, oid);
        s.commit().unwrap();
        check(&s, &model, oid);
    }
}
