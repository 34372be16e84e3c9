//! Real images from mkfs.ext4 (1 KiB and 4 KiB blocks, 64bit on/off, flex_bg off, meta_bg): the free-space audit matches dumpe2fs, the layout matches debugfs, and the refusals.

mod common;
use common::*;
use oubli_ext4::{free_space, Ext4Tracker, Unsupported};
use std::process::Command;

const VARIANTS: &[(&str, u64, &[&str])] = &[
    ("b1k", 64 << 20, &["-b", "1024"]),
    ("b4k", 256 << 20, &["-b", "4096"]),
    ("no64", 128 << 20, &["-b", "4096", "-O", "^64bit"]),
    ("noflex", 96 << 20, &["-b", "1024", "-O", "^flex_bg"]),
    (
        "metabg",
        160 << 20,
        &["-b", "1024", "-O", "meta_bg,^resize_inode"],
    ),
    (
        "metabg4k",
        1 << 30,
        &[
            "-b",
            "4096",
            "-O",
            "meta_bg,^resize_inode,^64bit",
            "-G",
            "1",
        ],
    ),
    (
        "uninit",
        640 << 20,
        &["-b", "4096", "-O", "^metadata_csum,uninit_bg"],
    ),
];

#[test]
fn free_space_matches_dumpe2fs_and_layout_loads() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let dir = tmpdir("images");
    for &(name, size, args) in VARIANTS {
        let path = dir.join(format!("{name}.img"));
        let mut img = mkfs(&path, size, args);
        // Some files, so that bitmaps are not only mkfs's.
        let f = dir.join("payload");
        std::fs::write(&f, vec![0x5au8; 300_000]).unwrap();
        run(Command::new("debugfs")
            .args(["-w", "-R"])
            .arg(format!("write {} payload", f.display()))
            .arg(&path));
        run(Command::new("debugfs")
            .args(["-w", "-R", "mkdir d"])
            .arg(&path));
        img = std::fs::read(&path).unwrap_or(img);
        let ours = free_space(&mut reader(&img), img.len() as u64)
            .unwrap()
            .expect("ext4");
        let theirs = dumpe2fs_free(&path);
        assert_eq!(
            ours.ranges, theirs,
            "{name}: free blocks differ from dumpe2fs"
        );
        let t = Ext4Tracker::load(&mut reader(&img), img.len() as u64)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(t.following(), "{name}");
        let lay = t.layout().unwrap();
        // The journal's extents agree with debugfs.
        let stat = run(Command::new("debugfs").args(["-R", "stat <8>"]).arg(&path));
        let mapped: u64 = lay.journal.iter().map(|e| e.len).sum();
        assert!(mapped >= lay.journal_blocks, "{name}");
        for e in &lay.journal {
            let want = if e.len == 1 {
                format!("{}", e.physical)
            } else {
                format!("{}-{}", e.physical, e.physical + e.len - 1)
            };
            assert!(
                stat.contains(&want),
                "{name}: journal extent {e:?} not in debugfs stat:\n{stat}"
            );
        }
        // No block the file system has in use is free, no metadata is free.
        for d in &lay.groups {
            assert!(
                !ours.is_free(d.block_bitmap) && !ours.is_free(d.inode_table),
                "{name}"
            );
        }
        eprintln!(
            "{name}: {} groups, {} free blocks, journal {} blocks in {} extents",
            lay.groups.len(),
            ours.free_blocks(),
            lay.journal_blocks,
            lay.journal.len()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn patch_sb(img: &mut [u8], off: usize, set: u32) {
    let o = 1024 + off;
    let v = u32::from_le_bytes(img[o..o + 4].try_into().unwrap()) | set;
    img[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn refuses_what_it_cannot_follow() {
    if !require("mkfs.ext4", "e2fsprogs") {
        return;
    }
    let dir = tmpdir("refuse");
    let p = dir.join("x.img");
    let img = mkfs(&p, 32 << 20, &["-O", "^has_journal"]);
    assert_eq!(
        Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::NoJournal
    );
    // The audit reads it all the same.
    assert!(free_space(&mut reader(&img), img.len() as u64)
        .unwrap()
        .is_some());

    let img = mkfs(&p, 64 << 20, &["-O", "bigalloc", "-C", "16384"]);
    assert_eq!(
        Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::Bigalloc
    );

    let good = mkfs(&p, 32 << 20, &[]);
    let mut img = good.clone();
    patch_sb(&mut img, 0x5C, 0x400); // fast_commit
    assert_eq!(
        Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::FastCommit
    );
    let mut img = good.clone();
    patch_sb(&mut img, 0xE4, 0x0801); // s_journal_dev: external journal
    assert_eq!(
        Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::ExternalJournal
    );
    let mut img = good.clone();
    patch_sb(&mut img, 0x60, 0x8000_0000); // unknown incompat
    assert!(matches!(
        Ext4Tracker::load(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::UnknownFeature {
            incompat: 0x8000_0000,
            ..
        }
    ));
    let mut img = good.clone();
    patch_sb(&mut img, 0x60, 0x4); // needs_recovery: followable, not auditable
    assert!(Ext4Tracker::load(&mut reader(&img), img.len() as u64).is_ok());
    assert_eq!(
        free_space(&mut reader(&img), img.len() as u64).unwrap_err(),
        Unsupported::NeedsRecovery
    );
    // A blank device: waiting, not refused.
    let blank = vec![0u8; 1 << 20];
    let t = Ext4Tracker::load(&mut reader(&blank), blank.len() as u64).unwrap();
    assert!(!t.following() && t.refusal().is_none());
    assert_eq!(
        free_space(&mut reader(&blank), blank.len() as u64).unwrap(),
        None
    );
    // Every message says what is wrong.
    for u in [
        Unsupported::NoJournal,
        Unsupported::ExternalJournal,
        Unsupported::FastCommit,
        Unsupported::Bigalloc,
    ] {
        assert!(u.to_string().starts_with("ext4 with"), "{u}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
