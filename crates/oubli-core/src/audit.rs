//! The adversary of DESIGN.md §7: given medium bytes, superblocks and vault keys, open everything that can be opened.
//!
//! [`recover`] is what an attacker holding old copies of the medium plus the
//! vault's content can read: for every superblock it is handed whose epoch key
//! it holds, it walks the whole tree and the epoch's intent log and opens
//! every unit it reaches. Tests hand it every state a recording medium ever
//! held; `oubli audit` hands it the store's own medium and current vault.

use crate::log;
use crate::medium::Medium;
use crate::superblock;
use crate::tree::{Child, Node, NodePtr, NodeSource, Value};
use crate::unit::{cell_aad, open_unit, Ctx};
use crate::vault::VaultRecord;
use oubli_crypto::PlainBuf;
use oubli_crypto::{CryptoProvider, KeyScheme};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

/// Where a recovered unit was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// Reachable from the tree committed at this epoch.
    Tree(u64),
    /// Named by this epoch's intent log.
    Log(u64),
    /// Reachable from the `n`th snapshot root kept at this epoch (in its
    /// superblock's table, then in its log).
    Snapshot(u64, u32),
}

impl Source {
    /// The epoch whose key opened it.
    pub fn epoch(&self) -> u64 {
        match *self {
            Source::Tree(e) | Source::Log(e) | Source::Snapshot(e, _) => e,
        }
    }
}

/// One data cell the adversary opened.
pub struct Recovered {
    pub oid: u64,
    pub cell: u64,
    pub start: u32,
    /// Where its first byte lies in the object (from the object's cell size).
    pub offset: u64,
    pub addr: u64,
    pub source: Source,
    pub plaintext: PlainBuf,
    /// The unit's key reference: identifies the unit wherever it was copied.
    pub(crate) key: oubli_crypto::KeyRef,
}

/// Everything the adversary could open.
#[derive(Default)]
pub struct Recovery {
    pub epochs_opened: BTreeSet<u64>,
    /// Cell size of the store (from the superblocks opened), 0 if none opened.
    pub cell_size: u32,
    pub nodes_opened: usize,
    pub units: Vec<Recovered>,
    /// Units that were referenced but did not open (missing or corrupt).
    pub failures: usize,
}

impl Recovery {
    /// Each object as the adversary can reassemble it from one source
    /// (the tree or log of one epoch): cells laid out at their offsets, holes
    /// as zeros. Data that spans cells is only visible this way.
    pub fn images(&self) -> Vec<((u64, Source), Vec<u8>)> {
        let mut grouped: std::collections::BTreeMap<(u64, Source), Vec<&Recovered>> =
            Default::default();
        for u in &self.units {
            grouped.entry((u.oid, u.source)).or_default().push(u);
        }
        grouped
            .into_iter()
            .map(|(k, units)| {
                let end = units
                    .iter()
                    .map(|u| u.offset + u.plaintext.len() as u64)
                    .max()
                    .unwrap_or(0);
                let mut image = vec![0u8; end as usize];
                for u in units {
                    let at = u.offset as usize;
                    image[at..at + u.plaintext.len()].copy_from_slice(&u.plaintext);
                }
                (k, image)
            })
            .collect()
    }

    /// Whether any recovered plaintext contains `needle`.
    pub fn contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty()
            && self
                .units
                .iter()
                .any(|u| u.plaintext.windows(needle.len()).any(|w| w == needle))
    }
}

/// What `oubli audit` concludes about a store.
#[derive(Debug, Clone, Default)]
pub struct AuditReport {
    pub epochs_opened: Vec<u64>,
    pub units_opened: usize,
    pub live_units: usize,
    /// Deleted since the last commit: still recoverable until the next commit (expected).
    pub pending_units: usize,
    /// Deleted before the last commit yet still recoverable: an erasure failure.
    pub leaked_units: usize,
    pub unreadable_units: usize,
    /// Epochs whose key the vault still holds besides the current one (a
    /// rotation cut between its two steps that could not be finished): what
    /// was deleted in them is not erased, and `leaked_units` counts it.
    pub vault_leftover_epochs: Vec<u64>,
}

/// Opens every superblock in `superblocks` for which `keys` holds the epoch
/// key, and everything reachable from it. Unit keys come from the key
/// scheme each superblock names, with the state that epoch committed and
/// the records its intent log adds (what an adversary holding that epoch's
/// key can derive).
pub fn recover(
    superblocks: &[Vec<u8>],
    medium: Arc<dyn Medium>,
    keys: &[VaultRecord],
    provider: Arc<dyn CryptoProvider>,
) -> Recovery {
    recover_with_shares(superblocks, medium, keys, &[], provider)
}

/// A cell reached: object, index, pointer, where from, and the key scheme
/// of the epoch that reached it.
type FoundCell = (u64, u64, crate::tree::CellRef, Source, Arc<dyn KeyScheme>);

/// The cells reached, to open once every tree and log has been read (an
/// object's share entry sorts after its cells, and may come from a log).
#[derive(Default)]
struct Found {
    cells: Vec<FoundCell>,
    seen: HashSet<(u64, Source)>,
    /// Object id → the share its cells depend on.
    shares: std::collections::HashMap<u64, u32>,
    /// Object id → its cell size, where not the store's (fixed for the
    /// object's life: any tree or log that names it will do).
    cell_sizes: std::collections::HashMap<u64, u32>,
}

/// [`recover`] by an adversary who also holds these share keys (`(share
/// id, key)`, e.g. a copy of a share's vault): data under a share opens
/// only with its key.
pub fn recover_with_shares(
    superblocks: &[Vec<u8>],
    medium: Arc<dyn Medium>,
    keys: &[VaultRecord],
    share_keys: &[(u32, oubli_crypto::SecretKey)],
    provider: Arc<dyn CryptoProvider>,
) -> Recovery {
    let mut out = Recovery::default();
    let mut found = Found::default();
    let mut seen_sb = HashSet::new();
    for (bytes, header, body, rec) in opened_superblocks(superblocks, keys, &*provider) {
        // The same superblock handed twice (two copies of the medium) is walked once.
        if !seen_sb.insert((header.epoch, bytes)) {
            continue;
        }
        let Some((scheme, ops)) = open_epoch(
            &medium,
            &provider,
            rec,
            (header.version, &body),
            &mut out.failures,
        ) else {
            continue;
        };
        let ctx = &epoch_ctx(&medium, &provider, scheme);
        out.epochs_opened.insert(header.epoch);
        out.cell_size = body.cell_size;
        let source = Source::Tree(header.epoch);
        if let Some((root, level)) = &body.root {
            walk(
                ctx,
                &Child::Disk(root.clone()),
                *level,
                source,
                &mut out,
                &mut found,
            );
        }
        // Every snapshot the epoch kept (in its table, then in its log),
        // each its own source: versions of one object are reassembled apart.
        let mut snapshot_roots = Vec::new();
        if let Some(catalog) = &body.catalog {
            match crate::engine::read_catalog(ctx, catalog) {
                Ok(c) => snapshot_roots.extend(c.snapshots.into_iter().filter_map(|r| r.root)),
                Err(_) => out.failures += 1,
            }
        }
        // The epoch's intent log: every batch that opens, damaged or not.
        for op in ops {
            match op {
                log::Op::PutCell { oid, cell, cref } => found.cells.push((
                    oid,
                    cell,
                    cref,
                    Source::Log(header.epoch),
                    ctx.scheme.clone(),
                )),
                log::Op::SetShare { oid, share } => {
                    found.shares.insert(oid, share);
                }
                log::Op::SetCellSize { oid, cell_size } => {
                    found.cell_sizes.insert(oid, cell_size);
                }
                // A snapshot taken in the epoch: its root is in the log.
                log::Op::PutSnapshot { snapshot } => snapshot_roots.extend(snapshot.root),
                _ => {}
            }
        }
        for (n, (root, level)) in snapshot_roots.into_iter().enumerate() {
            let source = Source::Snapshot(header.epoch, n as u32);
            walk(ctx, &Child::Disk(root), level, source, &mut out, &mut found);
        }
    }
    let cells = std::mem::take(&mut found.cells);
    for (oid, cell, cref, source, scheme) in cells {
        if !found.seen.insert((cref.addr, source)) {
            continue;
        }
        // Under a share whose key the adversary lacks, it tries the tree's
        // key alone (which must not open it).
        let share = found
            .shares
            .get(&oid)
            .and_then(|id| share_keys.iter().find(|(s, _)| s == id))
            .map(|(_, key)| key);
        let ctx = epoch_ctx(&medium, &provider, scheme);
        let cell_size = found.cell_sizes.get(&oid).copied().unwrap_or(out.cell_size);
        let at = (oid, cell, u64::from(cell_size));
        open_cell(&ctx, at, &cref, source, share, &mut out);
    }
    out
}

/// Every superblock of `superblocks` that a record of `keys` opens (its
/// store and epoch, then its key): the bytes, the header and body, and the
/// record. A superblock two records open comes once per record.
fn opened_superblocks<'a>(
    superblocks: &'a [Vec<u8>],
    keys: &'a [VaultRecord],
    provider: &'a dyn CryptoProvider,
) -> impl Iterator<
    Item = (
        &'a [u8],
        superblock::Header,
        superblock::Body,
        &'a VaultRecord,
    ),
> + 'a {
    superblocks.iter().flat_map(move |bytes| {
        let header = superblock::parse_header(bytes)
            .ok()
            .flatten()
            .map(|(h, _)| h);
        keys.iter().filter_map(move |rec| {
            let header = header.as_ref()?;
            if rec.store_id != header.store_id || rec.epoch != header.epoch {
                return None;
            }
            let (_, body) = superblock::open(provider, &rec.key, bytes).ok()?;
            Some((bytes.as_slice(), *header, body, rec))
        })
    })
}

/// The key scheme of the epoch `rec` opens, with the keys its log added,
/// and the log's ops (every batch that opens, damaged or not).
fn open_epoch(
    medium: &Arc<dyn Medium>,
    provider: &Arc<dyn CryptoProvider>,
    rec: &VaultRecord,
    (version, body): (u16, &superblock::Body),
    failures: &mut usize,
) -> Option<(Arc<dyn KeyScheme>, Vec<log::Op>)> {
    let Ok((scheme, _)) = crate::scheme_state::load(
        &**medium,
        provider.clone(),
        &rec.key,
        &rec.store_id,
        rec.epoch,
        body,
    ) else {
        *failures += 1;
        return None;
    };
    let keys = log::LogKeys {
        provider: &**provider,
        epoch_key: &rec.key,
        store_id: &rec.store_id,
        epoch: rec.epoch,
    };
    let read = log::read_log(&**medium, &body.log_place(version), &keys);
    let ops: Vec<log::Op> = read.batches.into_iter().flatten().collect();
    for op in &ops {
        if let log::Op::Scheme(record) = op {
            if scheme.replay(record).is_err() {
                *failures += 1;
            }
        }
    }
    Some((scheme, ops))
}

/// An adversary who learned where units lie and their key references
/// (not secret when a scheme keeps its keys outside the tree: a forest
/// leaf index) — say from old copies opened with old keys, `known` — and
/// holds the vault's `current` records: the units of `known` that open
/// with the key the scheme of an epoch it can open derives from their
/// reference. The scheme must have made every key of a deleted unit
/// underivable, so for those this must be empty. Under the parent-pointer
/// scheme a reference is the key itself, so this adversary does not apply
/// (nothing is returned).
pub fn rederive(
    superblocks: &[Vec<u8>],
    medium: Arc<dyn Medium>,
    current: &[VaultRecord],
    known: &[Recovered],
    provider: Arc<dyn CryptoProvider>,
) -> Recovery {
    let mut out = Recovery::default();
    for (_, header, body, rec) in opened_superblocks(superblocks, current, &*provider) {
        let Some((scheme, _)) = open_epoch(
            &medium,
            &provider,
            rec,
            (header.version, &body),
            &mut out.failures,
        ) else {
            continue;
        };
        if !scheme.keeps_keys_outside_tree() {
            continue;
        }
        out.epochs_opened.insert(header.epoch);
        out.cell_size = body.cell_size;
        for u in known {
            let Ok(key) = scheme.resolve(&u.key) else {
                continue;
            };
            let len = u.plaintext.len() as u32;
            if let Ok(plaintext) = open_unit(
                &*medium,
                &*provider,
                &key,
                u.addr,
                u64::from(len) + oubli_crypto::TAG_LEN as u64,
                &cell_aad(u.oid, u.cell, u.start, len),
                &String::new,
            ) {
                out.units.push(Recovered {
                    plaintext,
                    key: u.key.clone(),
                    ..*u
                });
            }
        }
    }
    out
}

/// A read-only context opening units with one epoch's key scheme.
fn epoch_ctx(
    medium: &Arc<dyn Medium>,
    provider: &Arc<dyn CryptoProvider>,
    scheme: Arc<dyn KeyScheme>,
) -> Ctx {
    Ctx {
        medium: medium.clone(),
        provider: provider.clone(),
        scheme,
        cache: Default::default(),
        io_guard: Default::default(),
    }
}

/// Opens the cell `(oid, index, cell size)` and adds it to `out`.
fn open_cell(
    ctx: &Ctx,
    (oid, cell, cell_size): (u64, u64, u64),
    c: &crate::tree::CellRef,
    source: Source,
    share: Option<&oubli_crypto::SecretKey>,
    out: &mut Recovery,
) {
    let Ok(key) = ctx.scheme.resolve(&c.key) else {
        out.failures += 1;
        return;
    };
    let key = match share {
        Some(s) => crate::share::bind(&*ctx.provider, s, &key),
        None => key,
    };
    match open_unit(
        &*ctx.medium,
        &*ctx.provider,
        &key,
        c.addr,
        c.sealed_len(),
        &cell_aad(oid, cell, c.start, c.len),
        &String::new,
    ) {
        Ok(plaintext) => out.units.push(Recovered {
            oid,
            cell,
            start: c.start,
            offset: crate::unit::cell_span(cell, cell_size as u32).0 + u64::from(c.start),
            addr: c.addr,
            source,
            plaintext,
            key: c.key.clone(),
        }),
        Err(_) => out.failures += 1,
    }
}

fn walk(
    ctx: &Ctx,
    child: &Child,
    level: u8,
    source: Source,
    out: &mut Recovery,
    found: &mut Found,
) {
    let node = match child {
        Child::Mem(n) => n.clone(),
        Child::Disk(p) => match load(ctx, p, level) {
            Some(n) => n,
            None => {
                out.failures += 1;
                return;
            }
        },
    };
    out.nodes_opened += 1;
    match &*node {
        Node::Leaf(entries) => {
            for (k, v) in entries {
                match v {
                    Value::Cell(c) => {
                        found
                            .cells
                            .push((k.oid, k.off, c.clone(), source, ctx.scheme.clone()))
                    }
                    Value::Share(id) => {
                        found.shares.insert(k.oid, *id);
                    }
                    Value::CellSize(size) => {
                        found.cell_sizes.insert(k.oid, *size);
                    }
                    _ => {}
                }
            }
        }
        Node::Inner(level, children) => {
            for (_, c) in children {
                walk(ctx, c, level - 1, source, out, found);
            }
        }
    }
}

fn load(ctx: &Ctx, p: &NodePtr, level: u8) -> Option<Arc<Node>> {
    ctx.load(p, level).ok()
}
