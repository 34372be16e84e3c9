//! `oubli-bench-nand`: DNEFS Table 2 on the simulated chip — a phone-like workload in simulated time, once per purge period, reporting erasures per hour, wear inequality (Hoover) and projected lifetime.
//!
//! Usage: `oubli-bench-nand [--hours H] [--periods none,60,30,15,5,1]
//! [--blocks N] [--seed S]`. Every result is one JSON line on stdout;
//! lines starting with `# ` are the same for people. `bench/nand/run`
//! turns them into `bench/out/nand.{txt,tsv,png}`.
//!
//! Simulated time: nothing sleeps. A simulated minute is a batch of
//! operations followed by a flush; a purge (an oubli commit) ends every
//! period's last minute. DNEFS drove UBIFSec with a trace of an Android
//! phone's writes; that trace is not public, so the workload here is a
//! synthetic one of the same kind (databases updated in place, a cache of
//! files created and evicted, an appended log), described in
//! bench/README.md, and its volume is printed with the results.

use oubli_core::{CreateOptions, EpochPolicy, Options, Store};
use oubli_crypto::SecretBytes;
use oubli_media::SplitMix64;
use oubli_nand::{Geometry, NandChip, NandMedium, NandVault, Ubi, UbiConfig, Wear, RATED_CYCLES};
use oubli_vault::KdfParams;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::Arc;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

const HELP: &str = "\
usage: oubli-bench-nand [options]

  --hours H          simulated hours measured per purge period       [168]
  --warmup-hours H   at most this many simulated hours of filling before
                     measuring; filling stops earlier, at the cleaner's
                     first run (as DNEFS: until the file system began
                     garbage collection)                               [400]
  --periods LIST     purge periods in minutes, `none` = no purge      [none,60,30,15,5,1]
  --schemes LIST     key schemes, each run on every period
                     [parent-pointer,keyed-hash-forest,key-storage-area]
  --blocks N         erase blocks of the chip (128 KiB each)         [1571]
  --rated-cycles N   program/erase cycles per block, for the lifetime [10000]
  --seed N           workload seed                                   [1]
";

struct Config {
    hours: u64,
    warmup_hours: u64,
    periods: Vec<Option<u64>>,
    schemes: Vec<u8>,
    blocks: u32,
    rated_cycles: u64,
    seed: u64,
}

fn parse_args(args: Vec<String>) -> Result<Config, String> {
    let mut c = Config {
        hours: 168,
        warmup_hours: 400,
        periods: vec![None, Some(60), Some(30), Some(15), Some(5), Some(1)],
        schemes: oubli_crypto::SCHEME_NAMES
            .iter()
            .map(|&(_, id)| id)
            .collect(),
        blocks: 1571,
        rated_cycles: RATED_CYCLES,
        seed: 1,
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|_| format!("bad number {v:?}"));
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--hours" => c.hours = number(value()?)?.max(1),
            "--warmup-hours" => c.warmup_hours = number(value()?)?,
            "--blocks" => c.blocks = number(value()?)? as u32,
            "--seed" => c.seed = number(value()?)?,
            "--rated-cycles" => c.rated_cycles = number(value()?)?.max(1),
            "--schemes" => {
                c.schemes = value()?
                    .split(',')
                    .map(|name| {
                        oubli_crypto::SCHEME_NAMES
                            .iter()
                            .find(|(n, _)| *n == name.trim())
                            .map(|&(_, id)| id)
                            .ok_or_else(|| format!("unknown key scheme {name:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--periods" => {
                c.periods = value()?
                    .split(',')
                    .map(|p| match p.trim() {
                        "none" => Ok(None),
                        m => number(m.to_string()).map(|m| Some(m.max(1))),
                    })
                    .collect::<Result<_, _>>()?
            }
            f => return Err(format!("unknown option {f}")),
        }
    }
    Ok(c)
}

/// The phone-like workload: what one simulated minute does.
struct Phone {
    rng: SplitMix64,
    /// Database files updated in place, 4 KiB pages, a few of them hot.
    databases: Vec<u64>,
    /// Cache files, oldest first, with their sizes.
    cache: VecDeque<(u64, u64)>,
    cache_bytes: u64,
    log: u64,
    log_len: u64,
    block: Vec<u8>,
    /// Bytes the workload wrote.
    written: u64,
    deleted_files: u64,
}

const DATABASES: usize = 8;
const DATABASE_BYTES: u64 = 2 << 20;
const CACHE_CAP: u64 = 40 << 20;
const LOG_CAP: u64 = 4 << 20;

impl Phone {
    fn new(store: &Store, seed: u64) -> BoxResult<Phone> {
        let mut p = Phone {
            rng: SplitMix64::new(seed),
            databases: Vec::new(),
            cache: VecDeque::new(),
            cache_bytes: 0,
            log: store.create_object(b"log")?,
            log_len: 0,
            block: vec![0u8; 4096],
            written: 0,
            deleted_files: 0,
        };
        for _ in 0..DATABASES {
            let oid = store.create_object(b"db")?;
            for at in (0..DATABASE_BYTES).step_by(1 << 20) {
                let chunk: Vec<u8> = (0..1 << 20).map(|i| (i as u64 ^ at) as u8).collect();
                store.write(oid, at, &chunk)?;
            }
            p.databases.push(oid);
        }
        Ok(p)
    }

    fn fill_block(&mut self) {
        let x = self.rng.next_u64();
        for (i, b) in self.block.iter_mut().enumerate() {
            *b = (x >> (i % 8 * 8)) as u8 ^ i as u8;
        }
    }

    /// One simulated minute: six 4 KiB database page updates (the first two
    /// databases take most), a 1 KiB log append, and with probability 0.3 a
    /// new cache file of 16–512 KiB (the oldest evicted past 40 MiB): about
    /// 3 MiB an hour, the order of DNEFS's trace (21 erasures of 128 KiB an
    /// hour on plain UBIFS).
    fn minute(&mut self, store: &Store) -> BoxResult<()> {
        for _ in 0..6 {
            let hot = self.rng.below(4) != 0;
            let db = if hot {
                self.rng.below(2)
            } else {
                self.rng.below(DATABASES as u64)
            } as usize;
            let page = self.rng.below(DATABASE_BYTES / 4096) * 4096;
            self.fill_block();
            store.write(self.databases[db], page, &self.block)?;
            self.written += 4096;
        }
        self.fill_block();
        store.write(self.log, self.log_len, &self.block[..1024])?;
        self.log_len += 1024;
        self.written += 1024;
        if self.log_len >= LOG_CAP {
            store.truncate(self.log, 0)?;
            self.log_len = 0;
        }
        if self.rng.below(10) == 0 {
            let size = (16 + self.rng.below(497)) << 10;
            let oid = store.create_object(b"cache")?;
            let mut at = 0;
            while at < size {
                self.fill_block();
                let n = (size - at).min(4096);
                store.write(oid, at, &self.block[..n as usize])?;
                at += n;
            }
            self.cache.push_back((oid, size));
            self.cache_bytes += size;
            self.written += size;
            while self.cache_bytes > CACHE_CAP {
                let (old, len) = self.cache.pop_front().expect("cache not empty");
                store.delete(old)?;
                self.cache_bytes -= len;
                self.deleted_files += 1;
            }
        }
        store.flush()?;
        Ok(())
    }
}

/// What one purge period measured.
struct Outcome {
    warmup_hours: f64,
    erases: u64,
    erases_per_hour: f64,
    commits: u64,
    cleaner_runs: u64,
    hoover: f64,
    lifetime_years: f64,
    written: u64,
    deleted_files: u64,
}

fn geometry(blocks: u32) -> Geometry {
    Geometry {
        page_size: 2048,
        pages_per_block: 64,
        blocks,
        oob_bytes: 64,
    }
}

fn run_period(c: &Config, scheme: u8, period: Option<u64>) -> BoxResult<Outcome> {
    let chip = Arc::new(NandChip::in_memory(geometry(c.blocks), &[], None)?);
    let ubi = Arc::new(Ubi::attach(chip.clone(), UbiConfig::default())?);
    let medium = Arc::new(NandMedium::new(ubi.clone())?);
    let password = SecretBytes::new(b"bench".to_vec());
    let provider: Arc<dyn oubli_crypto::CryptoProvider> =
        Arc::new(oubli_crypto::RingProvider::new());
    let u = ubi.clone();
    let p = provider.clone();
    let store = Store::create(
        medium,
        move |record| {
            let v = NandVault::create(u, &password, KdfParams::testing(), record, p)?;
            Ok(Arc::new(v))
        },
        // 4 KiB cells: a key per 4 KiB data node, as UBIFSec has.
        CreateOptions {
            cell_size: 4096,
            key_scheme: scheme,
        },
        Options {
            provider,
            // Commits only where this benchmark says (and when the intent
            // log fills up, which is the "none" row's only commit).
            policy: EpochPolicy::manual(),
            ..Options::default()
        },
    )?;
    let mut phone = Phone::new(&store, c.seed)?;
    let free_floor = c.blocks as usize / 5;
    // One simulated minute: the workload, the purge at the end of each
    // period, and the cleaner as a flash file system's garbage collector —
    // only when free erase blocks run short (it commits first). Returns
    // whether the cleaner ran.
    let step = |phone: &mut Phone, minute: u64| -> BoxResult<bool> {
        phone.minute(&store)?;
        if period.is_some_and(|p| (minute + 1).is_multiple_of(p)) {
            store.commit()?;
        }
        let clean = minute % 10 == 9 && ubi.free_blocks() < free_floor;
        if clean {
            store.gc(0.5)?;
        }
        Ok(clean)
    };
    // Filling: until the cleaner first has to run, or the warm-up cap.
    let mut minute = 0;
    while minute < c.warmup_hours * 60 {
        let cleaned = step(&mut phone, minute)?;
        minute += 1;
        if cleaned {
            break;
        }
    }
    let warmup_minutes = minute;
    let (start_counts, epoch_at_start, written_at_start, deleted_at_start) = (
        chip.erase_counts(),
        store.epoch(),
        phone.written,
        phone.deleted_files,
    );
    let mut cleaner_runs = 0;
    for minute in warmup_minutes..warmup_minutes + c.hours * 60 {
        cleaner_runs += step(&mut phone, minute)? as u64;
    }
    let end_counts = chip.erase_counts();
    let delta: Vec<u32> = end_counts
        .iter()
        .zip(&start_counts)
        .map(|(e, s)| e - s)
        .collect();
    let erases: u64 = delta.iter().map(|&d| d as u64).sum();
    let rate = erases as f64 / c.hours as f64;
    let spread = Wear::of(&delta, 0, c.rated_cycles, None);
    let projected = Wear::of(&end_counts, 0, c.rated_cycles, Some(rate));
    Ok(Outcome {
        warmup_hours: warmup_minutes as f64 / 60.0,
        erases,
        erases_per_hour: rate,
        commits: store.epoch() - epoch_at_start,
        cleaner_runs,
        hoover: spread.hoover,
        lifetime_years: projected.lifetime_years.unwrap_or(f64::INFINITY),
        written: phone.written - written_at_start,
        deleted_files: phone.deleted_files - deleted_at_start,
    })
}

fn run(c: &Config) -> BoxResult<()> {
    println!(
        "# simulated chip: {} erase blocks of 128 KiB (2 KiB pages, 64 per block), rated {} cycles; \
         {} simulated hours measured after filling (at most {} h); workload seed {}",
        c.blocks, c.rated_cycles, c.hours, c.warmup_hours, c.seed
    );
    for (&scheme, &period) in c
        .schemes
        .iter()
        .flat_map(|s| c.periods.iter().map(move |p| (s, p)))
    {
        let name = oubli_crypto::scheme_name(scheme).unwrap_or("?");
        let label = period.map_or("none".to_string(), |m| format!("{m} min"));
        let started = std::time::Instant::now();
        let o = run_period(c, scheme, period)?;
        println!(
            "# {name}, purge {label}: {:.1} erasures/h ({} in {} h), {} commits, {} cleaner runs, \
             Hoover {:.1} %, lifetime {:.0} years; workload wrote {:.1} MiB/h, deleted {} files; \
             filled for {:.0} h ({:.1} s of real time)",
            o.erases_per_hour,
            o.erases,
            c.hours,
            o.commits,
            o.cleaner_runs,
            o.hoover * 100.0,
            o.lifetime_years,
            o.written as f64 / c.hours as f64 / (1 << 20) as f64,
            o.deleted_files,
            o.warmup_hours,
            started.elapsed().as_secs_f64()
        );
        println!(
            "{{\"bench\":\"nand_wear\",\"scheme\":\"{name}\",\"purge_minutes\":{},\"hours\":{},\"erases\":{},\"erases_per_hour\":{:.3},\
             \"commits\":{},\"cleaner_runs\":{},\"hoover\":{:.5},\"lifetime_years\":{:.1},\"written_bytes\":{},\
             \"deleted_files\":{},\"warmup_hours\":{:.1},\"blocks\":{},\"rated_cycles\":{}}}",
            period.map_or("null".to_string(), |m| m.to_string()),
            c.hours,
            o.erases,
            o.erases_per_hour,
            o.commits,
            o.cleaner_runs,
            o.hoover,
            o.lifetime_years,
            o.written,
            o.deleted_files,
            o.warmup_hours,
            c.blocks,
            c.rated_cycles
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    oubli_bench_engine::main_of("oubli-bench-nand", HELP, parse_args, run)
}
