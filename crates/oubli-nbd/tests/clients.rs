//! Real NBD clients against the in-process server: nbdinfo, nbdcopy, qemu-img, qemu-io (Debian packages libnbd-bin and qemu-utils).

mod common;

use common::*;
use oubli_nbd::exports::create_export;
use oubli_nbd::{serve, Endpoint, ServerConfig};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(300);

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = json[at + key.len() + 3..].trim_start();
    let end = rest.find([',', '\n', '}']).unwrap();
    rest[..end].trim()
}

/// nbdinfo sees the size and every flag the server must advertise, and
/// `--list` every export, on the Unix socket and on TCP.
#[test]
fn nbdinfo_sees_size_flags_and_exports() {
    let Some(t) = tools(&[("nbdinfo", "libnbd-bin")]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 64 * MIB + 512).unwrap();
    create_export(&store, "second", MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());

    let json = run_ok(
        Command::new(&t[0]).arg("--json").arg(served.uri("disk")),
        LIMIT,
    );
    assert_eq!(
        json_field(&json, "export-size"),
        (64 * MIB + 512).to_string()
    );
    for (flag, want) in [
        ("is_read_only", "false"),
        ("can_flush", "true"),
        ("can_fua", "true"),
        ("can_trim", "true"),
        ("can_zero", "true"),
        ("can_fast_zero", "true"),
        ("can_multi_conn", "true"),
        ("can_df", "true"),
        ("structured", "true"),
    ] {
        assert_eq!(json_field(&json, flag), want, "{flag} in {json}");
    }
    assert_eq!(json_field(&json, "block_size_maximum"), "33554432");

    let list = run_ok(Command::new(&t[0]).arg("--list").arg(served.uri("")), LIMIT);
    assert!(list.contains("disk") && list.contains("second"), "{list}");

    // No default export configured: the empty name is refused with a message.
    let o = run(Command::new(&t[0]).arg(served.uri("")), LIMIT);
    assert!(!o.status.success());
    served.shutdown();

    // TCP on loopback, with a default export.
    let tcp = serve(
        store,
        &[Endpoint::Tcp("127.0.0.1:0".parse().unwrap())],
        ServerConfig {
            default_export: Some("second".into()),
            log: Captured::default().log(),
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let addr = tcp.tcp_addr().unwrap();
    let out = run_ok(
        Command::new(&t[0])
            .arg("--size")
            .arg(format!("nbd://{addr}/")),
        LIMIT,
    );
    assert_eq!(out.trim(), MIB.to_string());
    tcp.shutdown().unwrap();
}

/// nbdcopy writes a random image into an export and reads it back byte for byte.
#[test]
fn nbdcopy_round_trip() {
    let Some(t) = tools(&[("nbdcopy", "libnbd-bin")]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let size = 96 * MIB + 4096;
    create_export(&store, "disk", size).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let src = dir.path().join("src.img");
    random_file(&src, size, 41);
    run_ok(Command::new(&t[0]).arg(&src).arg(served.uri("disk")), LIMIT);
    let back = dir.path().join("back.img");
    run_ok(
        Command::new(&t[0]).arg(served.uri("disk")).arg(&back),
        LIMIT,
    );
    assert!(
        std::fs::read(&src).unwrap() == std::fs::read(&back).unwrap(),
        "nbdcopy round trip differs"
    );
    served.shutdown();
    // What the store holds after the shutdown commit is the image.
    drop(store);
    let store = reopen_dir_store(dir.path());
    let e = oubli_nbd::lookup_export(&store, "disk").unwrap().unwrap();
    let head = store.read(e.oid, 0, MIB as usize).unwrap();
    assert_eq!(head, std::fs::read(&src).unwrap()[..MIB as usize]);
}

/// The size: a 1 GiB random image through `qemu-img convert`, then
/// `qemu-img compare` against the export. A one-byte change makes compare
/// fail, so the comparison can fail.
#[test]
fn qemu_img_convert_and_compare_one_gib() {
    let Some(t) = tools(&[("qemu-img", "qemu-utils")]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let size = 1 << 30;
    create_export(&store, "big", size).unwrap();
    let mut served = Served::start(store, dir.path(), ServerConfig::default());
    let src = dir.path().join("src.img");
    random_file(&src, size, 7);
    let started = std::time::Instant::now();
    run_ok(
        Command::new(&t[0])
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(served.uri("big")),
        LIMIT,
    );
    let written = started.elapsed();
    let started = std::time::Instant::now();
    let out = run(
        Command::new(&t[0])
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(served.uri("big")),
        LIMIT,
    );
    let compared = started.elapsed();
    assert!(
        out.status.success(),
        "qemu-img compare: {}{}",
        out.stdout,
        out.stderr
    );
    eprintln!(
        "1 GiB: qemu-img convert {:.1} s ({:.0} MiB/s), compare {:.1} s ({:.0} MiB/s)",
        written.as_secs_f64(),
        1024.0 / written.as_secs_f64(),
        compared.as_secs_f64(),
        1024.0 / compared.as_secs_f64()
    );
    // Change one byte near the start through the protocol: compare must notice.
    let mut c = RawClient::connect(&served.socket, "big", false);
    let mut b = c.read(4096, 1).unwrap();
    b[0] ^= 0xff;
    assert_eq!(c.write(4096, &b), 0);
    c.disconnect();
    let out = run(
        Command::new(&t[0])
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(served.uri("big")),
        LIMIT,
    );
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    served.shutdown();
}

/// qemu-io: write, read with pattern checks, discard, write -z (with and
/// without unmap), each verified by a read.
#[test]
fn qemu_io_read_write_discard_write_zeroes() {
    let Some(t) = tools(&[("qemu-io", "qemu-utils")]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "disk", 8 * MIB).unwrap();
    let mut served = Served::start(store.clone(), dir.path(), ServerConfig::default());
    let cmds = [
        "write -P 0xab 0 4M",
        "read -P 0xab 0 4M",
        "write -P 0xcd -f 1M 64k", // FUA
        "read -P 0xcd 1M 64k",
        "discard 0 64k",
        "read -P 0 0 64k",
        "discard 70000 3000", // unaligned: a partial cell
        "read -P 0 70000 3000",
        "read -P 0xab 65536 4464",
        "read -P 0xab 73000 4096",
        "write -z 128k 64k", // may punch
        "read -P 0 128k 64k",
        "write -z -u 256k 100k", // unmap allowed
        "read -P 0 256k 100k",
        "flush",
        "read -P 0xab 512k 512k",
        "write -P 0x11 7M 1M",
        "read -P 0x11 7M 1M",
    ];
    let mut cmd = Command::new(&t[0]);
    cmd.args(["-f", "raw"]).arg(served.uri("disk"));
    for c in cmds {
        cmd.arg("-c").arg(c);
    }
    let out = run_ok(&mut cmd, LIMIT);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io reported a failure:\n{out}"
    );
    assert!(
        served
            .handle()
            .stats()
            .trims
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    // An out-of-range request is refused, not applied.
    let o = run(
        Command::new(&t[0])
            .args(["-f", "raw"])
            .arg(served.uri("disk"))
            .args(["-c", "write -P 1 8M 4k"]),
        LIMIT,
    );
    assert!(
        !o.status.success() || o.stdout.contains("error") || o.stderr.contains("error"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    served.shutdown();
    let e = oubli_nbd::lookup_export(&store, "disk").unwrap().unwrap();
    assert_eq!(store.size(e.oid).unwrap(), 8 * MIB);
    let d = store.read(e.oid, 0, 8 * MIB as usize).unwrap();
    assert!(d[..64 << 10].iter().all(|&b| b == 0));
    assert!(d[70000..73000].iter().all(|&b| b == 0));
    assert!(d[73000..128 << 10].iter().all(|&b| b == 0xab));
    assert!(d[7 << 20..].iter().all(|&b| b == 0x11));
}

/// Two exports served at once, each by several concurrent nbdcopy
/// connections (multi-conn), stay separate.
#[test]
fn concurrent_clients_on_two_exports() {
    let Some(t) = tools(&[("nbdcopy", "libnbd-bin")]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    create_export(&store, "a", 24 * MIB).unwrap();
    create_export(&store, "b", 24 * MIB).unwrap();
    let mut served = Served::start(store, dir.path(), ServerConfig::default());
    let (sa, sb) = (dir.path().join("a.img"), dir.path().join("b.img"));
    random_file(&sa, 24 * MIB, 1);
    random_file(&sb, 24 * MIB, 2);
    let ua = served.uri("a");
    let ub = served.uri("b");
    let (ta, tb) = (t[0].clone(), t[0].clone());
    let (pa, pb) = (sa.clone(), sb.clone());
    let ja = std::thread::spawn(move || {
        run_ok(Command::new(&ta).args(["-C", "4"]).arg(&pa).arg(&ua), LIMIT)
    });
    let jb = std::thread::spawn(move || {
        run_ok(Command::new(&tb).args(["-C", "4"]).arg(&pb).arg(&ub), LIMIT)
    });
    ja.join().unwrap();
    jb.join().unwrap();
    for (name, src) in [("a", &sa), ("b", &sb)] {
        let back = dir.path().join(format!("{name}.back"));
        run_ok(Command::new(&t[0]).arg(served.uri(name)).arg(&back), LIMIT);
        assert!(std::fs::read(src).unwrap() == std::fs::read(&back).unwrap());
    }
    served.shutdown();
}
