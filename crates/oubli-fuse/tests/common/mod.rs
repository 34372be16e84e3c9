//! Shared by the mount tests: FUSE availability, stores on memory or recording media, mounting in a temporary directory, errno helpers.
#![allow(dead_code)]

use oubli_core::{EpochPolicy, Medium, Options, Store};
use oubli_fuse::{MountOptions, Session};
use oubli_vault::MemoryVault;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whether the mount tests can run. Without /dev/fuse or fusermount3 they
/// fail, naming the package, unless OUBLI_SKIP_EXTERNAL=1 (then they skip).
pub fn fuse_available() -> bool {
    // Root mounts without fusermount3, but the machine is expected to have it (scripts/apt-packages).
    let fusermount = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").is_file()));
    let check = oubli_fuse::check_fuse().and_then(|()| {
        if fusermount {
            Ok(())
        } else {
            Err(oubli_fuse::Error::FuseUnavailable(
                "fusermount3 was not found: install the Debian package fuse3".into(),
            ))
        }
    });
    match check {
        Ok(()) => true,
        Err(e) if std::env::var("OUBLI_SKIP_EXTERNAL").as_deref() == Ok("1") => {
            eprintln!("skipped (OUBLI_SKIP_EXTERNAL=1): {e}");
            false
        }
        Err(e) => panic!(
            "{e}\nThe FUSE tests need /dev/fuse and the Debian package fuse3 (apt-get install fuse3); set OUBLI_SKIP_EXTERNAL=1 to skip them."
        ),
    }
}

pub fn store_options() -> Options {
    Options {
        policy: EpochPolicy::manual(),
        ..Options::default()
    }
}

/// A store on `medium` with an in-memory vault, commits only on demand.
pub fn store_on(medium: Arc<dyn Medium>, options: Options) -> Arc<Store> {
    Arc::new(
        Store::create(
            medium,
            |r| Ok(MemoryVault::new(r.clone())),
            oubli_testkit::harness::front_end_create_options(),
            options,
        )
        .expect("create store"),
    )
}

/// The store most mount tests run on: in memory, or — with
/// `OUBLI_FUSE_ON_S3=1` (scripts/test runs the POSIX suite so a second
/// time) — in a bucket of a versitygw server shared by the test binary.
pub fn mem_store() -> Arc<Store> {
    if std::env::var_os("OUBLI_FUSE_ON_S3").is_some() {
        return s3_store();
    }
    store_on(Arc::new(oubli_media::MemMedium::new()), store_options())
}

/// A fresh store (its own prefix) in the shared S3 test server's bucket.
fn s3_store() -> Arc<Store> {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static SERVER: OnceLock<(tempfile::TempDir, oubli_s3::test_server::TestServer)> =
        OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (_, server) = SERVER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let server = oubli_s3::test_server::TestServer::start(dir.path())
            .expect("OUBLI_FUSE_ON_S3 is set but versitygw is not installed");
        KILL_AT_EXIT.store(server.pid(), Ordering::Relaxed);
        // SAFETY: FFI; registers a plain function (no captured state) that
        // only reads an atomic and sends a signal.
        unsafe { libc::atexit(kill_server_at_exit) };
        (dir, server)
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let at = server.bucket("posix", false, &format!("t{n}"));
    let medium = oubli_s3::S3Medium::open_with(&at, &server.config()).unwrap();
    store_on(Arc::new(medium), store_options())
}

/// The shared S3 server's pid: a static is never dropped, so it is killed at exit.
static KILL_AT_EXIT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn kill_server_at_exit() {
    let pid = KILL_AT_EXIT.load(std::sync::atomic::Ordering::Relaxed);
    if pid != 0 {
        // SAFETY: FFI; signals the server process this binary started.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// A mounted store in a temporary directory; unmounted on drop.
pub struct Mounted {
    pub tmp: tempfile::TempDir,
    pub mnt: PathBuf,
    pub store: Arc<Store>,
    pub session: Option<Session>,
}

impl Mounted {
    pub fn new(store: Arc<Store>, options: MountOptions) -> Mounted {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let session = oubli_fuse::mount(store.clone(), &mnt, options).expect("mount");
        Mounted {
            tmp,
            mnt,
            store,
            session: Some(session),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn session(&self) -> &Session {
        self.session.as_ref().expect("mounted")
    }

    pub fn unmount(&mut self) {
        if let Some(s) = self.session.take() {
            s.unmount().expect("unmount");
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.unmount();
        }
    }
}

pub fn default_options() -> MountOptions {
    MountOptions {
        allow_other: true,
        ..MountOptions::default()
    }
}

/// The errno of a failed call.
pub fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("no errno in {e}")),
    }
}

pub fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Result of a libc call returning -1 on error.
pub fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// setxattr(2) on a path.
pub fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: FFI with valid NUL-terminated strings and a buffer of the given length.
    check(unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
    .map(|_| ())
}

/// getxattr(2) on a path: `size` 0 asks for the length (returned as that many zeros).
pub fn getxattr(p: &Path, name: &str, size: usize) -> std::io::Result<Vec<u8>> {
    let (c, n) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: FFI with valid strings and a writable buffer of `size` bytes.
    let rc = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
    check(rc as i32).map(|n| {
        buf.truncate(if size == 0 { 0 } else { n as usize });
        if size == 0 {
            buf = vec![0; n as usize];
        }
        buf
    })
}

/// removexattr(2) on a path.
pub fn removexattr(path: &Path, name: &str) -> std::io::Result<libc::c_int> {
    let (c, n) = (cpath(path), std::ffi::CString::new(name).unwrap());
    // SAFETY: FFI with valid NUL-terminated strings.
    check(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) })
}
