//! oubli-bench-snapshots: snapshot create/remove time against store size, erasing a snapshot's unique data against `shred -n1`, write throughput with retained snapshots, and space after removing them (bench/README.md, "bench/snapshots").

use oubli_core::{CreateOptions, EpochPolicy, Medium, Options, Store};
use oubli_crypto::{RingProvider, SecretBytes};
use oubli_media::{DirMedium, SplitMix64};
use oubli_vault::{FileVault, KdfParams};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: u64 = 1 << 20;
/// Objects are at most this large (a store is many objects, as a real one).
const OBJECT: u64 = 256 * MIB;

struct Args {
    work: PathBuf,
    small: u64,
    big: u64,
    erase: u64,
    write: u64,
    snapshots: usize,
    runs: usize,
    erase_runs: usize,
}

fn size(s: &str) -> Result<u64, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("bad size {s:?}"))?;
    Ok(n * match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => MIB,
        "G" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?} (K, M or G)")),
    })
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        work: PathBuf::from(it.next().ok_or("usage: oubli-bench-snapshots WORKDIR [--small 100M] [--big 4G] [--erase 1G] [--write 256M] [--snapshots 10] [--runs 7] [--erase-runs 3]")?),
        small: 100 * MIB,
        big: 4 << 30,
        erase: 1 << 30,
        write: 256 * MIB,
        snapshots: 10,
        runs: 7,
        erase_runs: 3,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--small" => a.small = size(&value)?,
            "--big" => a.big = size(&value)?,
            "--erase" => a.erase = size(&value)?,
            "--write" => a.write = size(&value)?,
            "--snapshots" => a.snapshots = value.parse().map_err(|_| "--snapshots N")?,
            "--runs" => a.runs = value.parse().map_err(|_| "--runs N")?,
            "--erase-runs" => a.erase_runs = value.parse().map_err(|_| "--erase-runs N")?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn say(line: String) {
    println!("# {line}");
}

/// A store as `oubli init` makes it: a directory medium, a password-sealed
/// file vault (light KDF: unlocking is not measured), commits on demand.
fn create_store(dir: &Path) -> BoxResult<Store> {
    let provider = Arc::new(RingProvider::new());
    let vault_path = dir.with_extension("vault");
    let medium = Arc::new(DirMedium::create(dir)?);
    let vault_provider = provider.clone();
    let store = Store::create(
        medium as Arc<dyn Medium>,
        |r| {
            FileVault::create(
                &vault_path,
                &SecretBytes::new(b"bench".to_vec()),
                KdfParams::testing(),
                r,
                vault_provider,
            )
            .map_err(Into::into)
        },
        CreateOptions::default(),
        Options {
            policy: EpochPolicy::manual(),
            provider,
            ..Options::default()
        },
    )?;
    Ok(store)
}

fn remove_store(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(dir.with_extension("vault"));
}

/// Bytes of every file under `dir` (the medium as the host sees it).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Pseudo-random 1 MiB chunks, each different (its index in the first bytes).
struct Payload(Vec<u8>);

impl Payload {
    fn new(seed: u64) -> Payload {
        let mut rng = SplitMix64::new(seed);
        let mut buf = vec![0u8; MIB as usize];
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        Payload(buf)
    }

    fn chunk(&mut self, index: u64) -> &[u8] {
        self.0[..8].copy_from_slice(&index.to_le_bytes());
        &self.0
    }
}

/// Writes `bytes` into new objects of at most [`OBJECT`] bytes; returns them.
fn fill(store: &Store, bytes: u64, payload: &mut Payload) -> BoxResult<Vec<u64>> {
    let mut oids = Vec::new();
    let mut left = bytes;
    let mut index = 0;
    while left > 0 {
        let oid = store.create_object(b"")?;
        let len = left.min(OBJECT);
        for i in 0..len.div_ceil(MIB) {
            store.write(oid, i * MIB, payload.chunk(index))?;
            index += 1;
        }
        oids.push(oid);
        left -= len;
    }
    store.commit()?;
    Ok(oids)
}

/// Snapshot create, and remove + commit, on a store of `bytes`; medians in seconds.
fn create_remove(a: &Args, bytes: u64, payload: &mut Payload) -> BoxResult<(f64, f64)> {
    let dir = a.work.join(format!("size-{bytes}"));
    let store = create_store(&dir)?;
    let start = Instant::now();
    let oids = fill(&store, bytes, payload)?;
    say(format!(
        "store of {} MiB filled in {:.1} s",
        bytes / MIB,
        start.elapsed().as_secs_f64()
    ));
    let (mut creates, mut removes) = (Vec::new(), Vec::new());
    for run in 0..a.runs {
        // The same change before every snapshot, whatever the store's size.
        store.write(oids[0], 0, payload.chunk(run as u64))?;
        let t = Instant::now();
        store.snapshot_create(&format!("s{run}"), None)?;
        creates.push(t.elapsed().as_secs_f64());
        store.write(oids[0], MIB, payload.chunk(run as u64 + 1))?;
        store.commit()?;
        let t = Instant::now();
        store.snapshot_remove_and_commit(&format!("s{run}"))?;
        removes.push(t.elapsed().as_secs_f64());
    }
    drop(store);
    remove_store(&dir);
    let (c, r) = (median(creates), median(removes));
    say(format!(
        "{} MiB: snapshot create {:.3} ms, remove + commit {:.3} ms (medians of {})",
        bytes / MIB,
        c * 1e3,
        r * 1e3,
        a.runs
    ));
    Ok((c, r))
}

/// Erasing a snapshot that alone holds `a.erase` bytes (remove + commit)
/// against `shred -n1` of a plain file of the same size; medians in seconds.
fn erase_vs_shred(a: &Args, payload: &mut Payload) -> BoxResult<(f64, f64)> {
    let (mut erase, mut shred) = (Vec::new(), Vec::new());
    for run in 0..a.erase_runs {
        let dir = a.work.join(format!("erase-{run}"));
        let store = create_store(&dir)?;
        let oids = fill(&store, a.erase, payload)?;
        store.snapshot_create("version", None)?;
        for oid in oids {
            store.delete(oid)?;
        }
        store.commit()?; // the live store no longer holds the data: only the snapshot does
        let usage = store.snapshot_usage()?;
        let t = Instant::now();
        store.snapshot_remove_and_commit("version")?; // `oubli snapshot rm --purge`
        erase.push(t.elapsed().as_secs_f64());
        say(format!(
            "run {run}: snapshot holding {} MiB alone erased in {:.3} ms",
            usage[0].unique_bytes / MIB,
            erase.last().unwrap() * 1e3
        ));
        drop(store);
        remove_store(&dir);

        let file = a.work.join(format!("plain-{run}"));
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&file)?;
            for i in 0..a.erase / MIB {
                f.write_all(payload.chunk(i))?;
            }
            f.sync_all()?;
        }
        let t = Instant::now();
        let status = Command::new("shred").arg("-n1").arg(&file).status()?;
        if !status.success() {
            return Err(format!("shred -n1 {} failed: {status}", file.display()).into());
        }
        shred.push(t.elapsed().as_secs_f64());
        say(format!(
            "run {run}: shred -n1 of {} MiB took {:.2} s",
            a.erase / MIB,
            shred.last().unwrap()
        ));
        std::fs::remove_file(&file)?;
    }
    Ok((median(erase), median(shred)))
}

/// Two stores with the same history of `a.snapshots` overwrite rounds, one
/// keeping a snapshot after each: write throughput (MB/s, medians) over the
/// same overwrites, then the medium's size after every snapshot is removed
/// and both are cleaned.
fn with_snapshots(a: &Args, payload: &mut Payload) -> BoxResult<[(f64, u64); 2]> {
    let mut stores = Vec::new();
    for keep in [false, true] {
        let dir = a.work.join(format!("history-{keep}"));
        let store = create_store(&dir)?;
        let oids = fill(&store, a.write, payload)?;
        let mut rng = SplitMix64::new(7);
        let chunks = a.write / MIB;
        for round in 0..a.snapshots {
            // A tenth of the data changes between versions.
            for _ in 0..chunks.div_ceil(10) {
                let c = rng.next_u64() % chunks;
                let (oid, at) = (oids[(c * MIB / OBJECT) as usize], c * MIB % OBJECT);
                store.write(oid, at, payload.chunk(c + round as u64))?;
            }
            if keep {
                store.snapshot_create(&format!("v{round}"), None)?;
            }
            store.commit()?;
        }
        stores.push((dir, store, oids));
    }
    let mut speed = [Vec::new(), Vec::new()];
    for run in 0..a.runs {
        // Alternating, so that both see the same disk and load.
        for (i, (_, store, oids)) in stores.iter().enumerate() {
            let t = Instant::now();
            for (n, &oid) in oids.iter().enumerate() {
                let len = (a.write - n as u64 * OBJECT).min(OBJECT);
                for c in 0..len / MIB {
                    store.write(oid, c * MIB, payload.chunk(c + run as u64))?;
                }
            }
            store.commit()?;
            speed[i].push(a.write as f64 / 1e6 / t.elapsed().as_secs_f64());
        }
    }
    let mut out = [(0.0, 0), (0.0, 0)];
    for (i, (dir, store, _)) in stores.iter().enumerate() {
        for s in store.snapshots() {
            store.snapshot_remove(&s.name)?;
        }
        store.commit()?;
        store.gc(0.5)?;
        store.flush()?;
        out[i] = (median(std::mem::take(&mut speed[i])), dir_bytes(dir));
    }
    for (dir, store, _) in stores {
        drop(store);
        remove_store(&dir);
    }
    say(format!(
        "overwriting {} MiB: {:.0} MB/s without snapshots, {:.0} MB/s with {} retained (medians of {})",
        a.write / MIB,
        out[0].0,
        out[1].0,
        a.snapshots,
        a.runs
    ));
    say(format!(
        "medium after removing every snapshot, commit and gc: {} MiB, against {} MiB for the store that never had one",
        out[1].1 / MIB,
        out[0].1 / MIB
    ));
    Ok(out)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "MISSED"
    }
}

fn main() -> BoxResult<()> {
    let a = parse_args()?;
    std::fs::create_dir_all(&a.work)?;
    let mut payload = Payload::new(42);
    let (small_c, small_r) = create_remove(&a, a.small, &mut payload)?;
    let (big_c, big_r) = create_remove(&a, a.big, &mut payload)?;
    let (erase, shred) = erase_vs_shred(&a, &mut payload)?;
    let [(plain_speed, plain_bytes), (snap_speed, snap_bytes)] = with_snapshots(&a, &mut payload)?;

    let create_ratio = big_c / small_c;
    let remove_ratio = big_r / small_r;
    let erase_ratio = shred / erase;
    let write_ratio = snap_speed / plain_speed;
    let space_ratio = snap_bytes as f64 / plain_bytes as f64;
    println!();
    println!("| figure | oubli | reference | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| snapshot create, {} MiB vs {} MiB store | {:.3} ms | {:.3} ms | {:.2}× | ≤ 2× ({}) |",
        a.big / MIB,
        a.small / MIB,
        big_c * 1e3,
        small_c * 1e3,
        create_ratio,
        verdict(create_ratio <= 2.0)
    );
    println!(
        "| snapshot remove + commit, {} MiB vs {} MiB store | {:.3} ms | {:.3} ms | {:.2}× | ≤ 2× ({}) |",
        a.big / MIB,
        a.small / MIB,
        big_r * 1e3,
        small_r * 1e3,
        remove_ratio,
        verdict(remove_ratio <= 2.0)
    );
    println!(
        "| erase a snapshot's {} MiB (rm + commit) vs shred -n1 | {:.3} ms | {:.2} s | {:.0}× faster | ≥ 1000× ({}) |",
        a.erase / MIB,
        erase * 1e3,
        shred,
        erase_ratio,
        verdict(erase_ratio >= 1000.0)
    );
    println!(
        "| overwrite throughput, {} snapshots retained vs none | {:.0} MB/s | {:.0} MB/s | {:.2}× | ≥ 0.9× ({}) |",
        a.snapshots,
        snap_speed,
        plain_speed,
        write_ratio,
        verdict(write_ratio >= 0.9)
    );
    println!(
        "| medium after removing every snapshot + gc vs never had one | {} MiB | {} MiB | {:.3}× | within 10% ({}) |",
        snap_bytes / MIB,
        plain_bytes / MIB,
        space_ratio,
        verdict((space_ratio - 1.0).abs() <= 0.10)
    );
    Ok(())
}
