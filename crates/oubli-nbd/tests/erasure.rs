//! Discards honoured: after TRIM / WRITE_ZEROES / overwrite and a commit, an adversary holding every byte the medium ever held and the current vault recovers none of the deleted data.

mod common;

use common::*;
use oubli_core::{Medium, Options, Store, Vault};
use oubli_media::{DirMedium, RecordingMedium};
use oubli_nbd::exports::{create_export, delete_export, resize_export};
use oubli_nbd::proto::*;
use oubli_nbd::ServerConfig;
use oubli_testkit::marker::{self, Marker, BLOCK};
use oubli_testkit::{Adversary, RecordingVault};
use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

/// A store on a recording directory medium, a recording vault, and an image
/// model of one export that tracks which marker blocks were ever written.
struct Bench {
    dir: tempfile::TempDir,
    recording: Arc<RecordingMedium<DirMedium>>,
    vault: Arc<RecordingVault>,
    store: Arc<Store>,
    options: Options,
    image: Vec<u8>,
    written: BTreeSet<Marker>,
    next_write: u64,
}

impl Bench {
    fn new(export_size: u64) -> Bench {
        let dir = tempfile::tempdir().unwrap();
        let recording = Arc::new(RecordingMedium::new(
            DirMedium::create(dir.path().join("store")).unwrap(),
        ));
        let options = manual();
        let (store, vault) = store_on(recording.clone() as Arc<dyn Medium>, &options);
        create_export(&store, "disk", export_size).unwrap();
        Bench {
            dir,
            recording,
            vault,
            store,
            options,
            image: vec![0; export_size as usize],
            written: BTreeSet::new(),
            next_write: 1,
        }
    }

    /// Marker data for a new write of `len` bytes at `offset`; the model is updated.
    fn markers(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let id = self.next_write;
        self.next_write += 1;
        let data = marker::data(id, len);
        self.image[offset as usize..offset as usize + len].copy_from_slice(&data);
        for b in 0..(len / BLOCK) as u32 {
            self.written.insert((id, b));
        }
        data
    }

    fn zero(&mut self, offset: u64, len: u64) {
        self.image[offset as usize..(offset + len) as usize].fill(0);
    }

    /// Marker blocks the model says are gone.
    fn erased(&self) -> BTreeSet<Marker> {
        let mut live = BTreeSet::new();
        marker::scan(&self.image, &mut live);
        self.written.difference(&live).copied().collect()
    }

    /// Marker blocks the image holds that a write put down whole (a
    /// partial last block completed by zeros after it is not one: seed
    /// 200536 of the simulator).
    fn live(&self) -> BTreeSet<Marker> {
        let mut live = BTreeSet::new();
        marker::scan(&self.image, &mut live);
        live.intersection(&self.written).copied().collect()
    }

    /// What the adversary opens with every byte ever written and the current vault.
    fn recovered(&self) -> BTreeSet<Marker> {
        let adversary = Adversary::seize(&self.recording);
        assert!(
            adversary.plaintext_markers().is_empty(),
            "plaintext on the medium"
        );
        let current = self.vault.load().unwrap();
        adversary.recovered_markers(&[current], self.options.provider.clone())
    }

    /// Checks both halves: nothing erased opens, everything live does.
    fn check_erased(&self) {
        let erased = self.erased();
        assert!(!erased.is_empty());
        let recovered = self.recovered();
        let leaked: Vec<_> = recovered.intersection(&erased).take(5).collect();
        assert!(
            leaked.is_empty(),
            "deleted data recovered after the commit: {leaked:?} (of {} erased)",
            erased.len()
        );
        assert!(
            self.live().is_subset(&recovered),
            "the adversary must still read live data (it is not blind)"
        );
    }
}

/// TRIM (aligned and not), WRITE_ZEROES with and without NO_HOLE, and an
/// overwrite, sent by a raw client: before the commit the deleted data is
/// still pending (recoverable with the current key); after the server's
/// shutdown commit none of it is.
#[test]
fn trim_write_zeroes_and_overwrite_are_erased_at_commit() {
    let mut b = Bench::new(4 * MIB);
    let mut served = Served::start(b.store.clone(), b.dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    // Regions of 256 KiB: A trimmed (unaligned), B punched by write-zeroes,
    // C zeroed with NO_HOLE (unaligned), D partly overwritten, E kept.
    for r in 0..5u64 {
        let data = b.markers(r * 256 * KIB, 256 * KIB as usize);
        assert_eq!(c.write(r * 256 * KIB, &data), 0);
    }
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    b.store.commit().unwrap();

    let (a_off, a_len) = (4096 + 100, 200 * KIB);
    assert_eq!(c.cmd(CMD_TRIM, 0, a_off, a_len as u32, &[]), 0);
    b.zero(a_off, a_len);
    assert_eq!(
        c.cmd(CMD_WRITE_ZEROES, 0, 256 * KIB, 256 * KIB as u32, &[]),
        0
    );
    b.zero(256 * KIB, 256 * KIB);
    let (c_off, c_len) = (512 * KIB + 1000, 190 * KIB);
    assert_eq!(
        c.cmd(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, c_off, c_len as u32, &[]),
        0
    );
    b.zero(c_off, c_len);
    let over = b.markers(800 * KIB, 100 * KIB as usize);
    assert_eq!(
        c.cmd(CMD_WRITE, CMD_FLAG_FUA, 800 * KIB, over.len() as u32, &over),
        0
    );
    // The device reads what the model says.
    for off in (0..1280 * KIB).step_by(256 * KIB as usize) {
        let got = c.read(off, 256 * KIB as u32).unwrap();
        assert!(got == b.image[off as usize..(off + 256 * KIB) as usize]);
    }
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);

    // Before the commit the deletions are pending: the current key opens them.
    let pending = b.recovered();
    let erased = b.erased();
    assert!(
        erased.iter().filter(|m| pending.contains(m)).count() * 2 > erased.len(),
        "before the commit, most deleted blocks must still open (else the check below proves nothing)"
    );
    c.disconnect();
    served.shutdown(); // commits
    b.check_erased();
    assert_eq!(b.store.audit().unwrap().leaked_units, 0);
}

/// The same through real clients: an image of marker blocks is copied in
/// with nbdcopy, then qemu-io discards and zeroes parts of it; after the
/// commit the adversary recovers none of those parts.
#[test]
fn qemu_io_discards_are_erased_at_commit() {
    let Some(t) = tools(&[("nbdcopy", "libnbd-bin"), ("qemu-io", "qemu-utils")]) else {
        return;
    };
    let mut b = Bench::new(4 * MIB);
    let mut served = Served::start(b.store.clone(), b.dir.path(), ServerConfig::default());
    let image = b.markers(0, 4 * MIB as usize);
    let src = b.dir.path().join("markers.img");
    std::fs::write(&src, &image).unwrap();
    run_ok(
        Command::new(&t[0]).arg(&src).arg(served.uri("disk")),
        Duration::from_secs(120),
    );
    b.store.commit().unwrap();
    let ops: [(&str, u64, u64); 4] = [
        ("discard", 64 * KIB, 512 * KIB),
        ("discard", MIB + 1234, 100 * KIB),
        ("write -z", 2 * MIB, 256 * KIB),
        ("write -z -u", 3 * MIB, 300 * KIB),
    ];
    let mut cmd = Command::new(&t[1]);
    cmd.args(["-f", "raw"]).arg(served.uri("disk"));
    for (op, off, len) in ops {
        cmd.arg("-c").arg(format!("{op} {off} {len}"));
        b.zero(off, len);
    }
    cmd.arg("-c").arg("flush");
    run_ok(&mut cmd, Duration::from_secs(120));
    served.shutdown();
    b.check_erased();
}

/// Shrinking an export erases its tail; deleting one erases all of it.
#[test]
fn resize_and_delete_export_erase_at_commit() {
    let mut b = Bench::new(2 * MIB);
    let mut served = Served::start(b.store.clone(), b.dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let data = b.markers(0, 2 * MIB as usize);
    assert_eq!(c.write(0, &data), 0);
    c.disconnect();
    create_export(&b.store, "gone", MIB).unwrap();
    let mut g = RawClient::connect(&served.socket, "gone", false);
    // The model tracks "disk" only; this export's markers use their own write id.
    let id = 1000;
    let doomed = marker::data(id, MIB as usize);
    assert_eq!(g.write(0, &doomed), 0);
    g.disconnect();
    b.store.commit().unwrap();

    resize_export(&b.store, "disk", MIB + 100).unwrap();
    b.image.truncate((MIB + 100) as usize);
    delete_export(&b.store, "gone").unwrap();
    served.shutdown();
    b.check_erased();
    let recovered = b.recovered();
    assert!(
        !recovered.iter().any(|m| m.0 == id),
        "a deleted export's data opened after the commit"
    );
    // The shrunk export reports its new size to new clients.
    let served = Served::start(b.store.clone(), b.dir.path(), ServerConfig::default());
    let c = RawClient::connect(&served.socket, "disk", false);
    assert_eq!(c.size, MIB + 100);
    c.disconnect();
}

/// Control: an adversary that kept every old vault key recovers the trimmed
/// data — so the checks above can fail, and the vault overwrite is what counts.
#[test]
fn control_old_vault_keys_recover_trimmed_data() {
    let mut b = Bench::new(MIB);
    let mut served = Served::start(b.store.clone(), b.dir.path(), ServerConfig::default());
    let mut c = RawClient::connect(&served.socket, "disk", false);
    let data = b.markers(0, MIB as usize);
    assert_eq!(c.write(0, &data), 0);
    assert_eq!(c.cmd(CMD_FLUSH, 0, 0, 0, &[]), 0);
    b.store.commit().unwrap();
    assert_eq!(c.cmd(CMD_TRIM, 0, 0, MIB as u32, &[]), 0);
    b.zero(0, MIB);
    c.disconnect();
    served.shutdown();
    b.check_erased();
    let adversary = Adversary::seize(&b.recording);
    let with_history = adversary.recovered_markers(&b.vault.history(), b.options.provider.clone());
    let erased = b.erased();
    assert!(
        erased.is_subset(&with_history),
        "with the old keys every trimmed block opens"
    );
}
