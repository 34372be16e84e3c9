//! oubli-ext4: a sans-IO ext4 + jbd2 liveness tracker that infers, from the writes a block device receives, which blocks a committed journal transaction freed (FADED's implicit detection), and an audit of an image's free blocks.
//!
//! Feed [`Ext4Tracker::observe_write`] every write in the order the device
//! applies them. When a jbd2 commit block arrives it returns the device byte
//! ranges that are now safe to drop (as a TRIM would). The rule — argued in
//! `docs/NBD.md`, "Implicit deletes (ext4)" — is:
//!
//! > at the commit of transaction *S*, block *B* is dropped iff the tracker
//! > saw every block of *S* (a complete walk of the log from the previous
//! > commit to this one, checksums holding), saw the commit of *S − 1*
//! > itself (or the log restarted after the last commit it saw: a mount),
//! > *B* is free in the latest committed copy of its group's bitmap (every
//! > commit since that copy complete), *B* is not fixed metadata, and no
//! > write to *B* arrived since the commit of *S − 1*.
//!
//! Every other case keeps the block; a kept candidate is counted as
//! *suspicious* and examined again at the next commit, or dropped when the
//! journal is marked empty after the last commit (unmount, flush). Nothing here does
//! I/O: learning the layout takes a reading closure ([`Ext4Tracker::relearn`]),
//! which the caller runs when an observation asks for it.

pub mod audit;
mod bytes;
#[doc(hidden)]
pub mod fuzzing;
pub mod journal;
pub mod layout;
mod written;

pub use audit::{free_space, FreeSpace};
pub use bytes::crc32c_raw;
pub use layout::{Layout, Reader, Unsupported};

pub use journal::JournalSb;
use journal::Tag;
use layout::{bit, SUPERBLOCK_LEN, SUPERBLOCK_OFFSET};
use std::borrow::Cow;
use std::collections::HashMap;

/// What an entry of the journal's indexes (`jlog`, `expect`) costs beyond
/// the block it may hold: key, value and the hash table's share.
const JLOG_ENTRY_BYTES: usize = 64;

/// The memory the tracker may hold beyond its per-block and per-group
/// bitmaps (which the file system's size fixes: [`Ext4Tracker::memory_bytes`]).
/// Past either part it degrades to keeping more, never to dropping more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Journal blocks held between two commits (copies of bitmaps, blocks
    /// whose descriptor has not arrived yet, and the index of the log):
    /// beyond it the transaction is treated as not seen whole, so its
    /// commit drops nothing.
    pub journal_bytes: usize,
    /// Block ranges written since the last commit: beyond it they are kept
    /// coarser (whole aligned runs of blocks), so blocks near those written
    /// are kept at the next commit too, and dropped at a later one.
    pub written_bytes: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            journal_bytes: 64 << 20,
            written_bytes: 8 << 20,
        }
    }
}

impl Budget {
    /// Both parts together.
    pub fn total(&self) -> u64 {
        (self.journal_bytes + self.written_bytes) as u64
    }
}

/// Counters for `oubli status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Blocks reported freed (dropped).
    pub freed_inferred: u64,
    /// Keep decisions: a block free in the committed bitmap but written since
    /// the previous commit (or otherwise not provably dead) was kept.
    pub suspicious_kept: u64,
    /// Blocks kept at the last commit, waiting for the next one.
    pub suspicious_now: u64,
    /// Commit blocks seen (with a valid checksum).
    pub commits: u64,
    /// Commits whose transaction was not seen whole: every bitmap copy forgotten.
    pub commits_incomplete: u64,
    /// Commits that could not drop: first after start, mount or a gap in the sequence.
    pub commits_unanchored: u64,
    /// Bitmap copies forgotten because the bitmap was written in place with
    /// other content (e2fsck, resize2fs, mkfs) or revoked.
    pub bitmaps_forgotten: u64,
    /// Committed bitmaps that called fixed metadata free (garbage): kept.
    pub garbage_kept: u64,
    /// Journal superblocks marking the log empty right after the last commit.
    pub quiesced: u64,
}

/// What one write taught the tracker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Device byte ranges `[start, end)` to drop now, before any later write is applied.
    pub freed: Vec<(u64, u64)>,
    /// The superblock changed: call [`Ext4Tracker::relearn`] once this write is on the device.
    pub relearn: bool,
    /// Things worth a log line (refusals, gaps, garbage).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
enum Mode {
    /// No ext4 on the device yet.
    Waiting,
    Following,
    Refused(Unsupported),
}

#[derive(Debug, Clone)]
enum JBlock {
    /// A block carrying the jbd2 magic (descriptor, revoke, commit).
    Header(Vec<u8>),
    /// A copy, kept whole (its descriptor not seen yet, or it is a bitmap's).
    Copy(Vec<u8>),
    /// A copy of a non-bitmap block of transaction `seq`, content not kept.
    Seen(u32),
}

/// What a walk of one transaction found.
struct Walk {
    bitmaps: Vec<(u32, Vec<u8>)>,
    revoked: Vec<u32>,
}

/// The tracker. See the crate documentation for the rule.
#[derive(Debug, Clone)]
pub struct Ext4Tracker {
    mode: Mode,
    /// The device's size: a file system said to be larger is refused.
    device_size: u64,
    lay: Option<Layout>,
    jsb: Option<JournalSb>,
    /// (sequence, log position) from the last journal superblock written.
    jsb_start: Option<(u32, u64)>,
    last_commit: Option<(u32, u64)>,
    /// A journal superblock restarting the log was written since the last commit.
    jsb_restart: bool,
    /// Since the last commit, something in the journal could not be read as
    /// jbd2 wrote it (a commit block with a bad checksum): a gap in the
    /// sequence is then not explained by a remount.
    doubt: bool,
    jlog: HashMap<u64, JBlock>,
    /// Copies' (sequence, home) by log position, from descriptors seen.
    expect: HashMap<u64, (u32, u64)>,
    /// Bytes `jlog` and `expect` hold (blocks and entries), within `budget.journal_bytes`.
    jlog_bytes: usize,
    jlog_lost: bool,
    budget: Budget,
    /// Latest committed copy of each group's block bitmap (None: unknown).
    shadow: Vec<Option<Vec<u8>>>,
    /// Groups with candidates to examine at the next anchored commit.
    dirty: Vec<bool>,
    /// Per block: may hold data not yet dropped (starts all set).
    may_hold: Vec<u64>,
    /// Block ranges written since the last commit.
    written: written::Written,
    counters: Counters,
}

impl Default for Ext4Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Ext4Tracker {
    /// A tracker that knows nothing yet (for a device of 0 bytes until
    /// [`Self::set_device_size`]): it asks to learn the layout when the
    /// superblock is written.
    pub fn new() -> Self {
        Ext4Tracker {
            mode: Mode::Waiting,
            device_size: 0,
            lay: None,
            jsb: None,
            jsb_start: None,
            last_commit: None,
            jsb_restart: false,
            doubt: false,
            jlog: HashMap::new(),
            expect: HashMap::new(),
            jlog_bytes: 0,
            jlog_lost: false,
            budget: Budget::default(),
            shadow: Vec::new(),
            dirty: Vec::new(),
            may_hold: Vec::new(),
            written: written::Written::default(),
            counters: Counters::default(),
        }
    }

    /// A tracker for the device `read` reads: refuses a file system it
    /// cannot follow; a device without ext4 gives a waiting tracker.
    pub fn load(read: &mut Reader<'_>, device_size: u64) -> Result<Self, Unsupported> {
        let mut t = Self::new();
        t.device_size = device_size;
        t.relearn(read)?;
        Ok(t)
    }

    /// The device grew (or was given): layouts up to this size are accepted.
    pub fn set_device_size(&mut self, size: u64) {
        self.device_size = size;
    }

    /// Sets the memory budget (default: [`Budget::default`]).
    pub fn set_budget(&mut self, budget: Budget) {
        self.budget = budget;
        self.written.set_budget(budget.written_bytes);
    }

    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// The memory the tracker holds now (about): its bitmaps (a bit per
    /// block, a block per group whose committed bitmap is known), the
    /// journal it holds between commits and the ranges written since.
    pub fn memory_bytes(&self) -> u64 {
        let shadow: usize = self
            .shadow
            .iter()
            .map(|s| std::mem::size_of::<Option<Vec<u8>>>() + s.as_ref().map_or(0, Vec::capacity))
            .sum();
        (self.may_hold.capacity() * 8
            + self.dirty.capacity()
            + shadow
            + self.jlog_bytes
            + self.written.memory_bytes()) as u64
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }
    /// Following an ext4 (false: no ext4 yet, or refused).
    pub fn following(&self) -> bool {
        matches!(self.mode, Mode::Following)
    }
    pub fn refusal(&self) -> Option<&Unsupported> {
        match &self.mode {
            Mode::Refused(u) => Some(u),
            _ => None,
        }
    }
    pub fn layout(&self) -> Option<&Layout> {
        self.lay.as_ref()
    }
    /// The journal superblock as last read or written.
    pub fn journal_sb(&self) -> Option<&JournalSb> {
        self.jsb.as_ref()
    }

    /// Learns the layout again from the device. Keeps what it knows when
    /// the layout is the same; starts over otherwise.
    pub fn relearn(&mut self, read: &mut Reader<'_>) -> Result<(), Unsupported> {
        let loaded = Layout::load(read, self.device_size).and_then(|l| match l {
            None => Ok(None),
            Some(l) => {
                let pos0 = l
                    .journal_block(0)
                    .ok_or_else(|| Unsupported::Corrupt("journal block 0 unmapped".into()))?;
                let mut b = vec![0u8; l.sb.block_size as usize];
                read(pos0 * l.sb.block_size, &mut b).map_err(|e| Unsupported::Io(e.to_string()))?;
                let jsb = check_jsb(&l, &b)?;
                Ok(Some((l, jsb)))
            }
        });
        match loaded {
            Ok(None) => {
                self.reset(None);
                self.mode = Mode::Waiting;
                Ok(())
            }
            Err(e) => {
                self.reset(None);
                self.mode = Mode::Refused(e.clone());
                Err(e)
            }
            Ok(Some((l, jsb))) => {
                let same = self.lay.as_ref().is_some_and(|old| {
                    old.sb == l.sb && old.bitmap_homes == l.bitmap_homes && old.journal == l.journal
                });
                if !same || !self.following() {
                    self.reset(Some(l));
                }
                if jsb.start != 0 {
                    self.jsb_start = Some((jsb.sequence, jsb.start));
                }
                self.jsb = Some(jsb);
                self.mode = Mode::Following;
                Ok(())
            }
        }
    }

    fn reset(&mut self, lay: Option<Layout>) {
        let (groups, blocks) = lay
            .as_ref()
            .map_or((0, 0), |l| (l.groups.len(), l.sb.blocks_count));
        self.shadow = vec![None; groups];
        self.dirty = vec![false; groups];
        self.may_hold = vec![!0u64; blocks.div_ceil(64) as usize];
        self.lay = lay;
        self.jsb = None;
        self.jsb_start = None;
        self.last_commit = None;
        self.jsb_restart = false;
        self.doubt = false;
        self.jlog.clear();
        self.expect.clear();
        self.jlog_bytes = 0;
        self.jlog_lost = false;
        self.written.clear();
    }

    /// Feeds one write (`data` at device byte `offset`).
    pub fn observe_write(&mut self, offset: u64, data: &[u8]) -> Observation {
        self.observe(offset, data.len() as u64, Some(data))
    }

    /// Feeds a write of `len` zero bytes (NBD WRITE_ZEROES that writes).
    pub fn observe_zeroes(&mut self, offset: u64, len: u64) -> Observation {
        self.observe(offset, len, None)
    }

    fn observe(&mut self, offset: u64, len: u64, data: Option<&[u8]>) -> Observation {
        let mut obs = Observation::default();
        let end = offset.saturating_add(len);
        if len == 0 {
            return obs;
        }
        // The superblock: learn again if its layout fields changed.
        let sb_end = SUPERBLOCK_OFFSET + SUPERBLOCK_LEN as u64;
        if offset < sb_end && end > SUPERBLOCK_OFFSET {
            let same = match (
                data,
                &self.lay,
                offset <= SUPERBLOCK_OFFSET && end >= sb_end,
            ) {
                (Some(d), Some(l), true) if self.following() => {
                    let a = (SUPERBLOCK_OFFSET - offset) as usize;
                    d.get(a..a + SUPERBLOCK_LEN).is_some_and(|s| {
                        matches!(layout::Superblock::parse(s), Ok(Some(sb)) if sb.fingerprint == l.sb.fingerprint)
                    })
                }
                _ => false,
            };
            obs.relearn = !same;
        }
        if !self.following() {
            return obs;
        }
        let Some(lay) = &self.lay else { return obs };
        let bs = lay.sb.block_size;
        let b0 = offset / bs;
        let b1 = end.div_ceil(bs).min(lay.sb.blocks_count);
        if b0 >= b1 {
            return obs;
        }
        self.note_written(b0, b1, &mut obs);
        // The journal blocks and block bitmaps this write covers, in order.
        let Some(lay) = self.lay.as_ref() else {
            return obs;
        };
        let mut todo: Vec<(u64, Kind)> = Vec::new();
        let i = lay.journal.partition_point(|e| e.physical + e.len <= b0);
        for e in lay.journal.iter().skip(i) {
            if e.physical >= b1 {
                break;
            }
            for b in e.physical.max(b0)..(e.physical + e.len).min(b1) {
                todo.push((b, Kind::Journal(e.logical + (b - e.physical))));
            }
        }
        let i = lay.bitmap_homes.partition_point(|&(h, _)| h < b0);
        for &(h, g) in lay.bitmap_homes.iter().skip(i) {
            if h >= b1 {
                break;
            }
            todo.push((h, Kind::Bitmap(g)));
        }
        if todo.is_empty() {
            return obs;
        }
        todo.sort_unstable_by_key(|t| t.0);
        for (b, kind) in todo {
            let content = block_content(offset, end, data, b, bs);
            match kind {
                Kind::Journal(pos) => self.journal_block(pos, content, &mut obs),
                Kind::Bitmap(g) => self.bitmap_in_place(g, content, &mut obs),
            }
            if !self.following() {
                break;
            }
        }
        obs
    }

    fn note_written(&mut self, b0: u64, b1: u64, obs: &mut Observation) {
        let was = self.written.granularity();
        self.written.insert(b0, b1);
        let now = self.written.granularity();
        if now != was {
            obs.notes.push(format!(
                "blocks written since the last journal commit are over their memory budget \
                 ({} ranges): kept as runs of {now} blocks until the next commit, so blocks \
                 near them are kept one commit longer",
                self.written.len()
            ));
        }
    }

    /// A bitmap written in place (checkpoint, replay, e2fsck, resize2fs,
    /// mkfs): never a reason to drop. If it differs from the committed copy,
    /// the copy is forgotten until the journal commits the bitmap again.
    fn bitmap_in_place(&mut self, g: u32, content: Option<Cow<'_, [u8]>>, obs: &mut Observation) {
        let Some(slot) = self.shadow.get_mut(g as usize) else {
            return;
        };
        if let Some(copy) = slot {
            if content.as_deref() != Some(copy.as_slice()) {
                *slot = None;
                self.counters.bitmaps_forgotten += 1;
                if self.counters.bitmaps_forgotten <= 8 {
                    obs.notes.push(format!(
                        "block bitmap of group {g} written in place with other content than its last commit: kept as unknown until the journal commits it again"
                    ));
                }
            }
        }
    }

    fn journal_block(&mut self, pos: u64, content: Option<Cow<'_, [u8]>>, obs: &mut Observation) {
        let Some(block) = content else {
            // Part of a journal block: the transaction cannot be seen whole.
            if let Some(e) = self.jlog.remove(&pos) {
                self.jlog_bytes = self.jlog_bytes.saturating_sub(jlog_entry_bytes(&e));
            }
            self.jlog_lost = true;
            return;
        };
        if pos == 0 {
            let Some(lay) = &self.lay else { return };
            match check_jsb(lay, &block) {
                Ok(jsb) => {
                    if jsb.start != 0 {
                        self.jsb_start = Some((jsb.sequence, jsb.start));
                        self.jsb_restart = true;
                    }
                    let empty_after_last = jsb.start == 0
                        && !self.doubt
                        && !self.jlog_lost
                        && self.last_commit.is_some_and(|(s, _)| {
                            (1..1 << 31).contains(&jsb.sequence.wrapping_sub(s))
                        });
                    if jsb.start == 0 && !empty_after_last {
                        obs.notes.push(format!(
                            "journal marked empty at sequence {} (last commit {:?}, doubt {}, lost {}): suspicious blocks kept",
                            jsb.sequence,
                            self.last_commit.map(|c| c.0),
                            self.doubt,
                            self.jlog_lost
                        ));
                    }
                    self.jsb = Some(jsb);
                    if empty_after_last {
                        self.counters.quiesced += 1;
                        self.quiesced(obs);
                    }
                }
                Err(e @ Unsupported::FastCommit) => {
                    obs.notes.push(format!("stopped inferring deletes: {e}"));
                    self.reset(None);
                    self.mode = Mode::Refused(e);
                }
                Err(e) => {
                    obs.notes.push(format!("journal superblock unusable ({e}): commits are not followed until it is rewritten"));
                    self.jsb = None;
                    self.doubt = true;
                }
            }
            return;
        }
        let entry = if journal::header(&block).is_some() {
            JBlock::Header(block.into_owned())
        } else {
            match self.expect.get(&pos) {
                Some(&(seq, home)) if !self.is_bitmap(home) => JBlock::Seen(seq),
                _ => JBlock::Copy(block.into_owned()),
            }
        };
        self.store_jlog(pos, entry);
        let Some(JBlock::Header(b)) = self.jlog.get(&pos) else {
            return;
        };
        match journal::header(b) {
            Some((journal::BT_DESCRIPTOR, seq)) => self.expect_copies(pos, seq),
            Some((journal::BT_COMMIT, seq)) => {
                let b = b.clone();
                self.commit(seq, pos, &b, obs);
            }
            _ => {}
        }
    }

    fn store_jlog(&mut self, pos: u64, entry: JBlock) {
        let add = jlog_entry_bytes(&entry);
        if let Some(e) = self.jlog.remove(&pos) {
            self.jlog_bytes = self.jlog_bytes.saturating_sub(jlog_entry_bytes(&e));
        }
        if self.jlog_bytes + add > self.budget.journal_bytes {
            self.jlog_lost = true;
            return;
        }
        self.jlog_bytes += add;
        self.jlog.insert(pos, entry);
    }

    fn is_bitmap(&self, home: u64) -> bool {
        self.lay
            .as_ref()
            .is_some_and(|l| l.bitmap_group(home).is_some())
    }

    /// A descriptor arrived: note where its copies go, and shed the content
    /// of copies already held that are not bitmaps.
    fn expect_copies(&mut self, pos: u64, seq: u32) {
        let (Some(jsb), Some(JBlock::Header(b))) = (&self.jsb, self.jlog.get(&pos)) else {
            return;
        };
        let Some(tags) = journal::descriptor_tags(jsb, b) else {
            return;
        };
        let mut p = pos;
        let mut shed = Vec::new();
        for t in tags {
            p = jsb.next(p);
            if !self.expect.contains_key(&p) {
                if self.jlog_bytes + JLOG_ENTRY_BYTES > self.budget.journal_bytes {
                    // Over the budget: the transaction is not seen whole.
                    self.jlog_lost = true;
                    break;
                }
                self.jlog_bytes += JLOG_ENTRY_BYTES;
            }
            self.expect.insert(p, (seq, t.home));
            if !self.is_bitmap(t.home) && matches!(self.jlog.get(&p), Some(JBlock::Copy(_))) {
                shed.push(p);
            }
        }
        for p in shed {
            self.store_jlog(p, JBlock::Seen(seq));
        }
    }

    /// Walks transaction `seq` from `start` to the commit at `commit`.
    fn walk(&self, seq: u32, start: u64, commit: u64) -> Option<Walk> {
        let jsb = self.jsb.as_ref()?;
        let lay = self.lay.as_ref()?;
        let mut out = Walk {
            bitmaps: Vec::new(),
            revoked: Vec::new(),
        };
        let mut p = start;
        let mut steps = 0u64;
        while p != commit {
            steps += 1;
            if steps > jsb.maxlen {
                return None;
            }
            let Some(JBlock::Header(b)) = self.jlog.get(&p) else {
                return None;
            };
            match journal::header(b)? {
                (journal::BT_DESCRIPTOR, s) if s == seq => {
                    let tags: Vec<Tag> = journal::descriptor_tags(jsb, b)?;
                    for t in tags {
                        p = jsb.next(p);
                        if p == commit {
                            return None;
                        }
                        let group = lay.bitmap_group(t.home);
                        match (self.jlog.get(&p)?, group) {
                            (JBlock::Copy(c), Some(g)) => {
                                if !jsb.tag_ok(&t, seq, c) {
                                    return None;
                                }
                                out.bitmaps.push((g, journal::unescape(c, &t)));
                            }
                            (JBlock::Copy(c), None) => {
                                if !jsb.tag_ok(&t, seq, c) {
                                    return None;
                                }
                            }
                            (JBlock::Seen(s), None) if *s == seq => {}
                            _ => return None,
                        }
                    }
                    p = jsb.next(p);
                }
                (journal::BT_REVOKE, s) if s == seq => {
                    for home in journal::revoke_records(jsb, b)? {
                        if let Some(g) = lay.bitmap_group(home) {
                            out.revoked.push(g);
                        }
                    }
                    p = jsb.next(p);
                }
                _ => return None,
            }
        }
        Some(out)
    }

    fn commit(&mut self, seq: u32, pos: u64, block: &[u8], obs: &mut Observation) {
        let Some(jsb) = self.jsb.clone() else {
            self.jlog_lost = true;
            return;
        };
        if !jsb.commit_ok(block) {
            // jbd2's recovery stops at such a block: not a commit.
            obs.notes.push(format!(
                "commit block of transaction {seq} with a bad checksum: not a commit"
            ));
            self.doubt = true;
            return;
        }
        self.counters.commits += 1;
        // The previous transaction is the last commit seen, or the log was
        // restarted (mount, recovery: jbd2 skips sequence numbers) after it
        // with nothing doubtful in between.
        let restarted = self.jsb_restart
            && !self.doubt
            && self.jsb_start.is_some_and(|(s, _)| s == seq)
            && self
                .last_commit
                .is_some_and(|(s, _)| (1..1 << 31).contains(&seq.wrapping_sub(s)));
        let follows = restarted
            || self
                .last_commit
                .is_some_and(|(s, _)| s.wrapping_add(1) == seq);
        if let (Some((s, _)), false) = (self.last_commit, follows) {
            obs.notes.push(format!(
                "journal sequence went from {s} to {seq}: this commit drops nothing"
            ));
        }
        let mut starts = Vec::new();
        if let (Some((s, p)), true) = (self.last_commit, follows) {
            if s.wrapping_add(1) == seq {
                starts.push(jsb.next(p));
            }
        }
        if let Some((s, p)) = self.jsb_start {
            if s == seq {
                starts.push(p);
            }
        }
        let walked = if self.jlog_lost {
            None
        } else {
            starts.iter().find_map(|&st| self.walk(seq, st, pos))
        };
        let complete = walked.is_some();
        if !complete || (!follows && self.last_commit.is_some()) {
            // A transaction not seen whole (or one missed): no copy is known current.
            if self.shadow.iter().any(Option::is_some) {
                self.counters.bitmaps_forgotten +=
                    self.shadow.iter().filter(|s| s.is_some()).count() as u64;
            }
            self.shadow.iter_mut().for_each(|s| *s = None);
            if !complete {
                self.counters.commits_incomplete += 1;
            }
        }
        if let Some(w) = walked {
            for (g, copy) in w.bitmaps {
                if let Some(s) = self.shadow.get_mut(g as usize) {
                    *s = Some(copy);
                    self.dirty[g as usize] = true;
                }
            }
            for g in w.revoked {
                if let Some(s) = self.shadow.get_mut(g as usize) {
                    *s = None;
                    self.counters.bitmaps_forgotten += 1;
                }
            }
        }
        let written = self.absorb_written();
        if complete && follows {
            self.scan(&written, obs);
        } else {
            self.counters.commits_unanchored += 1;
        }
        self.jlog.clear();
        self.expect.clear();
        self.jlog_bytes = 0;
        self.jlog_lost = false;
        self.last_commit = Some((seq, pos));
        self.jsb_restart = false;
        self.doubt = false;
    }

    /// The journal was marked empty after the last commit seen, with no
    /// commit block since that could not be read (unmount,
    /// `jbd2_journal_flush`, e2fsck after recovery): every transaction with
    /// changes is committed — and was seen — and none runs, so a block free
    /// in the committed bitmaps belongs to no live generation, even if it
    /// was written since the previous commit. (The sequence it names may
    /// skip numbers: jbd2 numbers transactions that end without changes.)
    /// Drops them all.
    fn quiesced(&mut self, obs: &mut Observation) {
        self.absorb_written();
        self.scan(&[], obs);
    }

    /// Marks the blocks written since the last commit as possibly holding
    /// data (and their groups as having candidates); returns them, merged.
    fn absorb_written(&mut self) -> Vec<(u64, u64)> {
        let written = self.written.take();
        if let Some(lay) = &self.lay {
            for &(a, b) in &written {
                for blk in a..b {
                    if let Some(w) = self.may_hold.get_mut((blk / 64) as usize) {
                        *w |= 1 << (blk % 64);
                    }
                }
                if let (Some(ga), Some(gb)) = (lay.group_of(a), lay.group_of(b - 1)) {
                    for g in ga..=gb {
                        if let Some(d) = self.dirty.get_mut(g as usize) {
                            *d = true;
                        }
                    }
                }
            }
        }
        written
    }

    /// Drops every candidate of the dirty groups not written since the previous commit.
    fn scan(&mut self, written: &[(u64, u64)], obs: &mut Observation) {
        let Some(lay) = &self.lay else { return };
        let in_written = |b: u64| {
            let i = written.partition_point(|r| r.1 <= b);
            written.get(i).is_some_and(|r| b >= r.0 && b < r.1)
        };
        let mut freed: Vec<(u64, u64)> = Vec::new();
        let mut kept = 0u64;
        let mut garbage = 0u64;
        for g in 0..self.dirty.len() {
            if !self.dirty[g] {
                continue;
            }
            let Some(map) = self.shadow.get(g).and_then(|s| s.as_ref()) else {
                continue;
            };
            let first = lay.sb.group_first_block(g as u64);
            let len = lay.sb.group_len(g as u64);
            let mut kept_here = false;
            let mut i = 0u64;
            while i < len {
                // Skip whole bytes in use.
                if i.is_multiple_of(8) && map.get((i / 8) as usize) == Some(&0xFF) {
                    i += 8;
                    continue;
                }
                let b = first + i;
                i += 1;
                if bit(map, b - first) != Some(false) {
                    continue;
                }
                let Some(word) = self.may_hold.get_mut((b / 64) as usize) else {
                    continue;
                };
                if *word & (1 << (b % 64)) == 0 {
                    continue;
                }
                if lay.is_pinned(b) {
                    garbage += 1;
                    *word &= !(1 << (b % 64));
                    continue;
                }
                if in_written(b) {
                    kept += 1;
                    kept_here = true;
                    continue;
                }
                *word &= !(1 << (b % 64));
                match freed.last_mut() {
                    Some(l) if l.1 == b => l.1 = b + 1,
                    _ => freed.push((b, b + 1)),
                }
            }
            self.dirty[g] = kept_here;
        }
        if garbage > 0 {
            self.counters.garbage_kept += garbage;
            obs.notes.push(format!(
                "a committed bitmap calls {garbage} blocks of fixed metadata free: kept"
            ));
        }
        self.counters.suspicious_kept += kept;
        self.counters.suspicious_now = kept;
        let bs = lay.sb.block_size;
        for (a, b) in freed {
            self.counters.freed_inferred += b - a;
            obs.freed.push((a * bs, b * bs));
        }
    }
}

/// What an entry of `jlog` counts against the journal budget.
fn jlog_entry_bytes(e: &JBlock) -> usize {
    JLOG_ENTRY_BYTES
        + match e {
            JBlock::Header(b) | JBlock::Copy(b) => b.len(),
            JBlock::Seen(_) => 0,
        }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Journal(u64),
    Bitmap(u32),
}

/// The whole content of block `b` if the write covers it.
fn block_content<'a>(
    offset: u64,
    end: u64,
    data: Option<&'a [u8]>,
    b: u64,
    bs: u64,
) -> Option<Cow<'a, [u8]>> {
    let start = b.checked_mul(bs)?;
    if start < offset || start.checked_add(bs)? > end {
        return None;
    }
    match data {
        None => Some(Cow::Owned(vec![0u8; bs as usize])),
        Some(d) => {
            let a = usize::try_from(start - offset).ok()?;
            d.get(a..a.checked_add(bs as usize)?).map(Cow::Borrowed)
        }
    }
}

fn check_jsb(lay: &Layout, block: &[u8]) -> Result<JournalSb, Unsupported> {
    let jsb = JournalSb::parse(block).map_err(Unsupported::Corrupt)?;
    if jsb.incompat & journal::JINCOMPAT_FAST_COMMIT != 0 {
        return Err(Unsupported::FastCommit);
    }
    if jsb.incompat & !journal::JINCOMPAT_KNOWN != 0 {
        return Err(Unsupported::UnknownFeature {
            incompat: jsb.incompat & !journal::JINCOMPAT_KNOWN,
            ro_compat: 0,
        });
    }
    if jsb.block_size as u64 != lay.sb.block_size || jsb.maxlen > lay.journal_blocks {
        return Err(Unsupported::Corrupt(format!(
            "journal superblock: block size {}, {} blocks (the inode maps {})",
            jsb.block_size, jsb.maxlen, lay.journal_blocks
        )));
    }
    Ok(jsb)
}
