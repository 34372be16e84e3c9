//! The workloads every scheme runs, identical for each: sequential 1 MiB writes, Zipfian 4 KiB overwrites, small-file create/delete, and the YCSB A/B/F mixes over fixed-size records.

use crate::zipf::ScrambledZipf;
use oubli_bench_engine::report::MIB;
use oubli_bench_engine::store::{BoxResult, Payload};
use oubli_core::{Store, ROOT_DIR};
use std::time::{Duration, Instant};

/// Bytes of a random overwrite and of a small file.
pub const BLOCK: u64 = 4096;
/// Bytes of a key-value record.
pub const RECORD: u64 = 1024;

/// What a timed workload did.
pub struct Measured {
    pub ops: u64,
    pub bytes: u64,
    pub secs: f64,
}

/// Times `work` (returning its op and byte counts) followed by a flush and a
/// commit, so that every figure includes making the work durable and its
/// deletions unrecoverable.
fn timed_to_commit(
    store: &Store,
    work: impl FnOnce() -> BoxResult<(u64, u64)>,
) -> BoxResult<Measured> {
    let start = Instant::now();
    let (ops, bytes) = work()?;
    store.flush()?;
    store.commit()?;
    Ok(Measured {
        ops,
        bytes,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// A new object of `bytes` (whole MiB) written in 1 MiB writes and committed: the preallocated file the overwrites land in.
pub fn preallocated(store: &Store, bytes: u64, seed: u64) -> BoxResult<u64> {
    let oid = store.create_object(b"")?;
    let mut payload = Payload::new(MIB as usize, seed);
    for i in 0..bytes / MIB {
        store.write(oid, i * MIB, payload.chunk(i))?;
    }
    store.commit()?;
    Ok(oid)
}

/// `bytes` in 1 MiB writes into a new object, flush, commit.
pub fn sequential(store: &Store, bytes: u64) -> BoxResult<Measured> {
    let oid = store.create_object(b"")?;
    store.commit()?;
    let mut payload = Payload::new(MIB as usize, 1);
    timed_to_commit(store, || {
        for i in 0..bytes / MIB {
            store.write(oid, i * MIB, payload.chunk(i))?;
        }
        Ok((bytes / MIB, bytes))
    })
}

/// Zipfian 4 KiB overwrites of the blocks of object `oid` (`span` bytes):
/// `count` of them, or as many as fit before `deadline`. Returns the writes done.
pub fn zipf_overwrites(
    store: &Store,
    oid: u64,
    span: u64,
    count: u64,
    deadline: Option<Instant>,
    seed: u64,
) -> BoxResult<u64> {
    let mut zipf = ScrambledZipf::new(span / BLOCK, seed);
    let mut block = Payload::new(BLOCK as usize, seed + 1);
    for i in 0..count {
        // Checking the clock every 64 writes keeps it out of the measurement.
        if i % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(i);
        }
        let at = zipf.next_item() * BLOCK;
        store.write(oid, at, block.chunk(i))?;
    }
    Ok(count)
}

/// `writes` Zipfian 4 KiB overwrites of a committed object of `span` bytes, flush, commit.
pub fn random_overwrites(store: &Store, span: u64, writes: u64, seed: u64) -> BoxResult<Measured> {
    let oid = preallocated(store, span, seed)?;
    timed_to_commit(store, || {
        let n = zipf_overwrites(store, oid, span, writes, None, seed)?;
        Ok((n, n * BLOCK))
    })
}

fn file_name(i: u64) -> Vec<u8> {
    format!("f{i:08}").into_bytes()
}

/// Creates file `i` in the root directory: an object, `len` bytes of data, a name.
pub fn create_file(store: &Store, i: u64, payload: &mut Payload) -> BoxResult<u64> {
    let oid = store.create_object(b"")?;
    store.write(oid, 0, payload.chunk(i))?;
    store.link(ROOT_DIR, &file_name(i), oid)?;
    Ok(oid)
}

/// Removes file `i` and its data (as `unlink` of the last name does).
pub fn delete_file(store: &Store, i: u64) -> BoxResult<()> {
    let oid = store.unlink(ROOT_DIR, &file_name(i))?;
    store.delete(oid)?;
    Ok(())
}

/// `files` small files of `size` bytes created, then flush and commit.
pub fn create_files(store: &Store, files: u64, size: u64) -> BoxResult<Measured> {
    let mut payload = Payload::new(size as usize, 5);
    timed_to_commit(store, || {
        for i in 0..files {
            create_file(store, i, &mut payload)?;
        }
        Ok((files, files * size))
    })
}

/// The files `create_files` made, deleted, then commit (the erasure done).
pub fn delete_files(store: &Store, files: u64, size: u64) -> BoxResult<Measured> {
    timed_to_commit(store, || {
        for i in 0..files {
            delete_file(store, i)?;
        }
        Ok((files, files * size))
    })
}

/// A YCSB core workload's operation mix.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub name: &'static str,
    /// Share of reads; the rest are updates (A, B) or read-modify-writes (F).
    pub read: f64,
    pub read_modify_write: bool,
}

pub const YCSB: [Mix; 3] = [
    Mix {
        name: "ycsb-a",
        read: 0.5,
        read_modify_write: false,
    },
    Mix {
        name: "ycsb-b",
        read: 0.95,
        read_modify_write: false,
    },
    Mix {
        name: "ycsb-f",
        read: 0.5,
        read_modify_write: true,
    },
];

/// `records` records of 1 KiB at fixed offsets of one object (loaded and
/// committed, untimed), then `ops` operations of `mix` on Zipfian keys,
/// flush, commit. An update rewrites the whole record; a read-modify-write
/// reads it, changes it and writes it back.
pub fn ycsb(store: &Store, records: u64, ops: u64, mix: Mix, seed: u64) -> BoxResult<Measured> {
    let oid = preallocated(store, (records * RECORD).div_ceil(MIB) * MIB, seed)?;
    let mut keys = ScrambledZipf::new(records, seed + 2);
    let mut record = Payload::new(RECORD as usize, seed + 3);
    timed_to_commit(store, || {
        let mut bytes = 0;
        for i in 0..ops {
            let at = keys.next_item() * RECORD;
            let read = keys.uniform() < mix.read;
            if read || mix.read_modify_write {
                let got = store.read(oid, at, RECORD as usize)?;
                if got.len() != RECORD as usize {
                    return Err(format!("record at {at}: {} bytes read", got.len()).into());
                }
                bytes += RECORD;
            }
            if !read {
                store.write(oid, at, record.chunk(i))?;
                bytes += RECORD;
            }
        }
        Ok((ops, bytes))
    })
}

/// The 4 KiB Zipfian overwrites of a committed `span`-byte object for
/// `seconds`, committing as the store's epoch policy says (the policy is
/// checked after every write, as in `oubli mount`); then a flush. Returns
/// the writes done, the seconds and the commits the policy made.
pub fn overwrites_for(
    store: &Store,
    span: u64,
    seconds: f64,
    seed: u64,
) -> BoxResult<(Measured, u64)> {
    let oid = preallocated(store, span, seed)?;
    let epoch0 = store.epoch();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let n = zipf_overwrites(store, oid, span, u64::MAX, Some(deadline), seed)?;
    store.flush()?;
    let measured = Measured {
        ops: n,
        bytes: n * BLOCK,
        secs: start.elapsed().as_secs_f64(),
    };
    Ok((measured, store.epoch() - epoch0))
}
