//! Hand-built jbd2 traffic on a real mkfs image: descriptor/commit/revoke blocks for every tag format (32/64-bit, no checksum, csum v2, csum v3), escaped copies, bad checksums, sequence gaps, in-place bitmap writes, and the drop rule (written since the previous commit → kept, then dropped).

mod common;
use common::*;
use oubli_ext4::{free_space, Budget, Ext4Tracker, Observation};

struct Rig {
    img: Vec<u8>,
    t: Ext4Tracker,
    jbd: Jbd,
    bs: u64,
    pos: u64,
    first: u64,
    maxlen: u64,
}

impl Rig {
    fn new(incompat: u32) -> Rig {
        let dir = tmpdir(&format!("journal-{incompat:x}"));
        let img = mkfs(&dir.join("j.img"), 64 << 20, &["-b", "1024"]);
        let _ = std::fs::remove_dir_all(&dir);
        let t = Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap();
        let bs = t.layout().unwrap().sb.block_size;
        let jsb = t.journal_sb().unwrap().clone();
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&img[1024 + 0x68..1024 + 0x78]);
        let mut r = Rig {
            img,
            t,
            jbd: Jbd {
                bs: bs as usize,
                incompat,
                uuid,
            },
            bs,
            pos: jsb.first,
            first: jsb.first,
            maxlen: jsb.maxlen,
        };
        let old = r.journal_read(0);
        let sb = r.jbd.superblock(&old, 100, r.first as u32);
        let o = r.put_journal(0, &sb);
        assert!(o.freed.is_empty());
        r
    }
    fn journal_read(&self, pos: u64) -> Vec<u8> {
        let b = self.t.layout().unwrap().journal_block(pos).unwrap();
        self.read(b)
    }
    fn read(&self, b: u64) -> Vec<u8> {
        let o = (b * self.bs) as usize;
        self.img[o..o + self.bs as usize].to_vec()
    }
    fn put(&mut self, b: u64, data: &[u8]) -> Observation {
        let o = (b * self.bs) as usize;
        self.img[o..o + data.len()].copy_from_slice(data);
        let obs = self.t.observe_write(b * self.bs, data);
        for &(a, e) in &obs.freed {
            self.img[a as usize..e as usize].fill(0);
        }
        obs
    }
    fn put_journal(&mut self, pos: u64, data: &[u8]) -> Observation {
        let b = self.t.layout().unwrap().journal_block(pos).unwrap();
        self.put(b, data)
    }
    fn next(&self, p: u64) -> u64 {
        if p + 1 >= self.maxlen {
            self.first
        } else {
            p + 1
        }
    }
    /// One transaction: revoke block, descriptor, copies, commit, each its own write.
    fn tx(
        &mut self,
        seq: u32,
        bitmaps: &[(u64, Vec<u8>)],
        revokes: &[u64],
        bad_tag: bool,
    ) -> Observation {
        let mut freed = Vec::new();
        if !revokes.is_empty() {
            let r = self.jbd.revoke(seq, revokes);
            let p = self.pos;
            freed.extend(self.put_journal(p, &r).freed);
            self.pos = self.next(p);
        }
        if !bitmaps.is_empty() {
            let copies: Vec<(u64, Vec<u8>, bool)> = bitmaps
                .iter()
                .map(|(h, b)| {
                    let mut c = b.clone();
                    let esc = c[..4] == MAGIC.to_be_bytes();
                    if esc {
                        c[..4].fill(0);
                    }
                    (*h, c, esc)
                })
                .collect();
            let tags: Vec<(u64, &[u8], bool)> = copies
                .iter()
                .map(|(h, c, e)| (*h, c.as_slice(), *e))
                .collect();
            let mut d = self.jbd.descriptor(seq, &tags);
            if bad_tag {
                // Corrupt the first tag's checksum (v3: bytes 24..28; v2: 16..18).
                let at = if self.jbd.v3() { 24 } else { 16 };
                d[at] ^= 0xff;
                if self.jbd.csum() {
                    let n = d.len();
                    d[n - 4..].fill(0);
                    let c = oubli_ext4::crc32c_raw(self.jbd.seed(), &d);
                    d[n - 4..].copy_from_slice(&c.to_be_bytes());
                }
            }
            let p = self.pos;
            freed.extend(self.put_journal(p, &d).freed);
            self.pos = self.next(p);
            for (_, c, _) in &copies {
                let p = self.pos;
                freed.extend(self.put_journal(p, c).freed);
                self.pos = self.next(p);
            }
        }
        let c = self.jbd.commit(seq);
        let p = self.pos;
        let mut o = self.put_journal(p, &c);
        self.pos = self.next(p);
        freed.append(&mut o.freed);
        o.freed = freed;
        o
    }
    fn bitmap(&self, g: usize) -> (u64, Vec<u8>) {
        let h = self.t.layout().unwrap().groups[g].block_bitmap;
        (h, self.read(h))
    }
}

fn set(map: &mut [u8], i: u64, used: bool) {
    if used {
        map[(i / 8) as usize] |= 1 << (i % 8);
    } else {
        map[(i / 8) as usize] &= !(1 << (i % 8));
    }
}

fn blocks(freed: &[(u64, u64)], bs: u64) -> Vec<u64> {
    freed
        .iter()
        .flat_map(|&(a, b)| (a / bs)..(b / bs))
        .collect()
}

const FEATURES: &[(u32, &str)] = &[
    (0x0, "32-bit tags, no checksums"),
    (0x2, "64-bit tags"),
    (0x8, "csum v2, 32-bit"),
    (0xA, "csum v2, 64-bit"),
    (0x10, "csum v3"),
    (0x12, "csum v3, 64-bit"),
];

#[test]
fn the_drop_rule_on_every_tag_format() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    for &(feat, what) in FEATURES {
        let mut r = Rig::new(feat);
        let bs = r.bs;
        let free = free_space(&mut reader(&r.img), r.img.len() as u64)
            .unwrap()
            .unwrap();
        let g0_first = r.t.layout().unwrap().sb.first_data_block;
        let (home, base) = r.bitmap(0);
        // Twenty free data blocks of group 0.
        let xs: Vec<u64> = (g0_first..g0_first + 8192)
            .filter(|&b| free.is_free(b))
            .take(20)
            .collect();
        let mut bm1 = base.clone();
        for &x in &xs {
            set(&mut bm1, x - g0_first, true);
        }
        // 100: first commit seen: learns, drops nothing.
        let o = r.tx(100, &[(home, bm1.clone())], &[], false);
        assert!(o.freed.is_empty(), "{what}: {o:?}");
        assert_eq!(r.t.counters().commits, 1, "{what}");
        for &x in &xs {
            r.put(x, &vec![0xAB; bs as usize]);
        }
        // 101: anchored; xs are allocated (and written since 100): never dropped.
        // Free blocks of group 0 not written since 100 are swept.
        let o = r.tx(101, &[(home, bm1.clone())], &[], false);
        let swept = blocks(&o.freed, bs);
        assert!(
            !swept.is_empty(),
            "{what}: the free blocks of group 0 are swept once"
        );
        for b in &swept {
            assert!(free.is_free(*b) && !xs.contains(b), "{what}: dropped {b}");
        }
        let o = r.tx(102, &[], &[], false);
        assert!(o.freed.is_empty(), "{what}: nothing new: {o:?}");
        // 103 frees xs[0..10]; xs[5] was written after 102: kept (suspicious).
        let mut bm2 = bm1.clone();
        for &x in &xs[..10] {
            set(&mut bm2, x - g0_first, false);
        }
        r.put(xs[5], &vec![0xCD; bs as usize]);
        let o = r.tx(103, &[(home, bm2.clone())], &[], false);
        let mut want: Vec<u64> = xs[..10].to_vec();
        want.remove(5);
        assert_eq!(blocks(&o.freed, bs), want, "{what}");
        assert_eq!(r.t.counters().suspicious_now, 1, "{what}");
        // 104 (no bitmap at all): xs[5] not written since 103 → dropped now.
        let o = r.tx(104, &[], &[], false);
        assert_eq!(blocks(&o.freed, bs), vec![xs[5]], "{what}");
        assert_eq!(r.t.counters().suspicious_now, 0, "{what}");
        // 105 reallocates xs[0..3] and they are written: kept.
        let mut bm3 = bm2.clone();
        for &x in &xs[..3] {
            set(&mut bm3, x - g0_first, true);
            r.put(x, &vec![0xEF; bs as usize]);
        }
        let o = r.tx(105, &[(home, bm3.clone())], &[], false);
        assert!(o.freed.is_empty(), "{what}: {o:?}");
        // Freed in 106 but written before 106's commit: a late data write of the
        // freed file or a reallocation in 107 — kept until a commit proves it.
        let mut bm4 = bm3.clone();
        set(&mut bm4, xs[0] - g0_first, false);
        r.put(xs[0], &vec![0x11; bs as usize]);
        let o = r.tx(106, &[(home, bm4.clone())], &[], false);
        assert!(o.freed.is_empty(), "{what}: {o:?}");
        // 107 reallocates xs[0] (the write was its data): never dropped.
        let o = r.tx(107, &[(home, bm3.clone())], &[], false);
        assert!(o.freed.is_empty(), "{what}: {o:?}");
        let o = r.tx(108, &[], &[], false);
        assert!(o.freed.is_empty(), "{what}: {o:?}");
        assert_eq!(
            r.read(xs[0]),
            vec![0x11; bs as usize],
            "{what}: a live block was dropped"
        );

        // A remount: jbd2 skips sequence numbers and writes the journal
        // superblock restarting the log there. Still anchored: 120 frees
        // xs[0..3] (last written before 107) and they drop at once.
        let old = r.journal_read(0);
        let p = r.pos as u32;
        let sb = r.jbd.superblock(&old, 120, p);
        r.put_journal(0, &sb);
        let o = r.tx(120, &[(home, bm2.clone())], &[], false);
        assert_eq!(blocks(&o.freed, bs), xs[..3].to_vec(), "{what}");
        // A gap nothing explains: no drops, every copy forgotten.
        let mut bm2b = bm2.clone();
        set(&mut bm2b, xs[19] - g0_first, false);
        let o = r.tx(130, &[(home, bm2b.clone())], &[], false);
        assert!(o.freed.is_empty(), "{what}: gap: {o:?}");
        let o = r.tx(131, &[], &[], false);
        assert!(o.freed.is_empty(), "{what}: 130 was not seen whole: {o:?}");

        // A bitmap written in place with other content: forgotten, nothing dropped.
        let mut bm5 = bm2.clone();
        for &x in &xs[10..15] {
            set(&mut bm5, x - g0_first, false);
        }
        r.put(home, &bm5);
        let o = r.tx(132, &[], &[], false);
        assert!(
            o.freed.is_empty(),
            "{what}: in-place bitmap is not a commit: {o:?}"
        );
        // Committed through the journal: dropped.
        let o = r.tx(133, &[(home, bm5.clone())], &[], false);
        assert_eq!(blocks(&o.freed, bs), xs[10..15].to_vec(), "{what}");

        // Revoking a bitmap home forgets that group's copy.
        let mut bm6 = bm5.clone();
        set(&mut bm6, xs[15] - g0_first, false);
        let o = r.tx(134, &[(home, bm6.clone())], &[home], false);
        assert!(o.freed.is_empty(), "{what}: revoked: {o:?}");
        assert!(r.t.counters().bitmaps_forgotten > 0);

        if r.jbd.csum() {
            // A corrupt tag checksum: the transaction is not seen whole.
            let inc = r.t.counters().commits_incomplete;
            let o = r.tx(135, &[(home, bm6.clone())], &[], true);
            assert!(o.freed.is_empty(), "{what}");
            assert_eq!(r.t.counters().commits_incomplete, inc + 1, "{what}");
            // A commit block with a bad checksum is no commit.
            let commits = r.t.counters().commits;
            let mut c = r.jbd.commit(136);
            c[0x30] ^= 1;
            let p = r.pos;
            let o = r.put_journal(p, &c);
            assert!(o.freed.is_empty() && !o.notes.is_empty(), "{what}");
            assert_eq!(r.t.counters().commits, commits, "{what}");
            // Rewritten correctly, 136 commits (anchored: 135 was seen).
            let c = r.jbd.commit(136);
            let o = r.put_journal(p, &c);
            r.pos = r.next(p);
            assert!(
                o.freed.is_empty(),
                "{what}: 126 carried no bitmap, 125's copy was not trusted"
            );
            let o = r.tx(137, &[(home, bm6.clone())], &[], false);
            assert_eq!(blocks(&o.freed, bs), vec![xs[15]], "{what}");
        }
        eprintln!("{what}: {:?}", r.t.counters());
    }
}

#[test]
fn escaped_copies_are_restored() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let mut r = Rig::new(0x12);
    let bs = r.bs;
    let lay = r.t.layout().unwrap().clone();
    // A group with no superblock backup, whose first blocks are data.
    let g = (1..lay.groups.len())
        .find(|&g| (0..32).all(|i| !lay.is_pinned(lay.sb.group_first_block(g as u64) + i)))
        .unwrap();
    let first = lay.sb.group_first_block(g as u64);
    let (home, base) = r.bitmap(g);
    let mut bm = base.clone();
    bm[..4].copy_from_slice(&MAGIC.to_be_bytes());
    // 200 learns (after the journal superblock says the log starts here).
    r.tx(100, &[(home, bm.clone())], &[], false);
    let o = r.tx(101, &[(home, bm.clone())], &[], false);
    let dropped = blocks(&o.freed, bs);
    for i in 0..32u64 {
        let used = bm[(i / 8) as usize] & (1 << (i % 8)) != 0;
        if used {
            assert!(
                !dropped.contains(&(first + i)),
                "block {i} of group {g} is in use in the unescaped copy"
            );
        }
    }
    // Bits zero in the magic (e.g. byte 0 = 0xC0: blocks 0-5) are free and dropped.
    assert!(
        dropped.contains(&first),
        "group {g} first {first} pinned {:?} dropped {} from {:?}",
        lay.pinned,
        dropped.len(),
        dropped.first()
    );
}

#[test]
fn one_write_holding_a_whole_transaction() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let mut r = Rig::new(0x10);
    let bs = r.bs as usize;
    let (home, base) = r.bitmap(0);
    let lay = r.t.layout().unwrap().clone();
    assert_eq!(lay.journal.len(), 1, "mkfs made a contiguous journal");
    let one = |r: &mut Rig, seq: u32, bm: &[u8]| {
        let mut buf = r.jbd.descriptor(seq, &[(home, bm, false)]);
        buf.extend_from_slice(bm);
        buf.extend_from_slice(&r.jbd.commit(seq));
        let p = r.pos;
        let o = r.put_journal(p, &buf);
        r.pos = r.next(r.next(r.next(p)));
        o
    };
    one(&mut r, 100, &base);
    let o = one(&mut r, 101, &base);
    assert!(
        !o.freed.is_empty(),
        "anchored commit sweeps group 0's free blocks"
    );
    // A write that covers half of a journal block: that transaction is not whole.
    let p = r.pos;
    let half = vec![0u8; bs / 2];
    let b = lay.journal_block(p).unwrap();
    r.t.observe_write(b * r.bs, &half);
    let o = one(&mut r, 102, &base);
    assert!(o.freed.is_empty());
    assert_eq!(r.t.counters().commits_incomplete, 1);
}

#[test]
fn an_empty_journal_after_the_last_commit_drops_the_suspicious() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let mut r = Rig::new(0x12);
    let bs = r.bs;
    let free = free_space(&mut reader(&r.img), r.img.len() as u64)
        .unwrap()
        .unwrap();
    let first = r.t.layout().unwrap().sb.first_data_block;
    let (home, base) = r.bitmap(0);
    let x = (first..first + 8192).find(|&b| free.is_free(b)).unwrap();
    let mut used = base.clone();
    set(&mut used, x - first, true);
    r.tx(100, &[(home, used.clone())], &[], false);
    r.put(x, &vec![0x55; bs as usize]);
    r.tx(101, &[(home, used.clone())], &[], false);
    // Freed in 102, but written after 101's commit (a late data write): kept.
    r.put(x, &vec![0x56; bs as usize]);
    let o = r.tx(102, &[(home, base.clone())], &[], false);
    assert!(!blocks(&o.freed, bs).contains(&x));
    assert_eq!(r.t.counters().suspicious_now, 1);
    let old = r.journal_read(0);
    // A journal superblock whose sequence is not after 102: nothing.
    let o = r.put_journal(0, &r.jbd.superblock(&old, 101, 0));
    assert!(o.freed.is_empty());
    // Marked empty after 102 (unmount: jbd2 names 104, 103 ended without
    // changes): nothing else can run.
    let o = r.put_journal(0, &r.jbd.superblock(&old, 104, 0));
    assert_eq!(blocks(&o.freed, bs), vec![x]);
    // The next mount restarts the log at 103: anchored at once.
    let p = r.pos as u32;
    r.put_journal(0, &r.jbd.superblock(&old, 103, p));
    let o = r.put_journal(0, &r.jbd.superblock(&old, 103, p));
    assert!(o.freed.is_empty());
    let mut b2 = base.clone();
    let y = (x + 1..first + 8192).find(|&b| free.is_free(b)).unwrap();
    set(&mut b2, y - first, true);
    r.tx(103, &[(home, b2.clone())], &[], false);
    r.put(y, &vec![0x57; bs as usize]);
    r.tx(104, &[(home, b2.clone())], &[], false);
    let o = r.tx(105, &[(home, base.clone())], &[], false);
    assert_eq!(blocks(&o.freed, bs), vec![y]);
}

/// Issue 40 item 4: past its memory budget for the blocks written since
/// the last commit, the tracker keeps more, never less. Writes to freed
/// blocks after the previous commit, scattered beyond a budget of two
/// ranges: the commit that frees them drops none of those written (it
/// keeps more than it would, the neighbours too) and the next commit drops
/// the rest; the tracker's memory stays within its bitmaps and its budget.
#[test]
fn over_its_memory_budget_the_tracker_keeps_more_never_less() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let mut r = Rig::new(0x12);
    let budget = Budget {
        written_bytes: 1,
        ..Budget::default()
    };
    r.t.set_budget(budget);
    let bs = r.bs;
    let free = free_space(&mut reader(&r.img), r.img.len() as u64)
        .unwrap()
        .unwrap();
    let first = r.t.layout().unwrap().sb.first_data_block;
    let (home, base) = r.bitmap(0);
    // Twenty free data blocks, two apart: writes to them never touch.
    let xs: Vec<u64> = (first..first + 8192)
        .filter(|&b| free.is_free(b) && b % 2 == 0)
        .take(20)
        .collect();
    let mut used = base.clone();
    for &x in &xs {
        set(&mut used, x - first, true);
    }
    r.tx(100, &[(home, used.clone())], &[], false);
    for &x in &xs {
        r.put(x, &vec![0xAB; bs as usize]);
    }
    r.tx(101, &[(home, used.clone())], &[], false);
    r.tx(102, &[], &[], false);
    // 103 frees all twenty; every other one was written after 102.
    let written: Vec<u64> = xs.iter().copied().step_by(2).collect();
    let mut notes = Vec::new();
    for &x in &written {
        notes.extend(r.put(x, &vec![0xCD; bs as usize]).notes);
    }
    assert!(
        notes.iter().any(|n| n.contains("memory budget")),
        "{notes:?}"
    );
    let o = r.tx(103, &[(home, base.clone())], &[], false);
    let dropped_103 = blocks(&o.freed, bs);
    for x in &written {
        assert!(!dropped_103.contains(x), "{x}, written after 102, dropped");
        assert_eq!(r.read(*x), vec![0xCD; bs as usize]);
    }
    // Coarser than exact: fewer than the ten unwritten ones went at 103.
    let unwritten: Vec<u64> = xs.iter().copied().skip(1).step_by(2).collect();
    let gone_103 = unwritten.iter().filter(|x| dropped_103.contains(x)).count();
    assert!(gone_103 < unwritten.len(), "{dropped_103:?}");
    // Nothing written since 103: everything freed goes at 104.
    let o = r.tx(104, &[], &[], false);
    let dropped_104 = blocks(&o.freed, bs);
    for x in &xs {
        assert!(
            dropped_103.contains(x) || dropped_104.contains(x),
            "{x} freed in 103 was never dropped"
        );
    }
    let lay = r.t.layout().unwrap();
    let bitmaps = lay.sb.blocks_count / 8 + lay.groups.len() as u64 * (bs + 64);
    assert!(
        r.t.memory_bytes() <= bitmaps + budget.total(),
        "{} bytes held",
        r.t.memory_bytes()
    );
}
