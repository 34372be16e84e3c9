//! Unix sockets that only their owner can connect to, from the moment they exist (the NBD socket and the control socket).

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Binds a listening Unix socket at `path` with mode 0600 from the start.
///
/// Binding at `path` and chmod'ing afterwards leaves a window in which the
/// socket exists with the umask's mode (often world-connectable), and the
/// umask is process-wide, so changing it races with other threads. Instead
/// the socket is bound inside a fresh 0700 directory beside `path` (nobody
/// else can reach it there), made 0600, and renamed into place; the
/// listener keeps working across the rename.
pub fn bind_private(path: &Path) -> io::Result<UnixListener> {
    bind_private_with(path, |_| {})
}

/// [`bind_private`], calling `after_bind` with the path of the freshly bound
/// socket before anything else is done to it (a seam for tests).
pub fn bind_private_with(path: &Path, after_bind: impl FnOnce(&Path)) -> io::Result<UnixListener> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Short: a socket path is limited to about 100 bytes.
    let mut nonce = [0u8; 6];
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().rotate_left(13);
    for (i, b) in nonce.iter_mut().enumerate() {
        *b = b"0123456789abcdef"[((seed >> (4 * i)) & 0xf) as usize];
    }
    let staging = parent.join(format!(
        ".oubli-{}",
        std::str::from_utf8(&nonce).expect("hex")
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let result = (|| {
        let bound = staging.join("s");
        let listener = UnixListener::bind(&bound)?;
        after_bind(&bound);
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&bound, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// The listening sockets systemd passed to this process (socket
/// activation: `LISTEN_PID` is this process, `LISTEN_FDS` counts the
/// descriptors from 3 on). The variables are removed so that children do
/// not take the sockets for theirs. Empty without socket activation.
pub fn systemd_listeners() -> Vec<std::os::fd::RawFd> {
    const FIRST: std::os::fd::RawFd = 3;
    let for_us = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY (of the call, not an FFI): run before any thread of this
        // process reads the environment (serve calls this at start-up).
        unsafe { std::env::remove_var(var) };
    }
    if !for_us || count <= 0 {
        return Vec::new();
    }
    (FIRST..FIRST + count).collect()
}

/// The TCP address a passed listening socket is bound to; `None` for a Unix
/// socket (or anything else). The descriptor stays open and unowned.
pub fn tcp_address_of(fd: std::os::fd::RawFd) -> Option<std::net::SocketAddr> {
    use std::os::fd::FromRawFd;
    // SAFETY: FFI-level adoption of a descriptor only to ask getsockname;
    // ManuallyDrop never closes it, so ownership stays with the caller.
    let l = std::mem::ManuallyDrop::new(unsafe { std::net::TcpListener::from_raw_fd(fd) });
    l.local_addr().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixStream;

    /// Even under umask 0 (a socket bound with mode 0777), the socket never
    /// appears at its final path, nor anywhere another user could reach it,
    /// with more than mode 0600.
    #[test]
    fn the_socket_is_private_from_the_moment_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        // SAFETY: umask only changes this process's file-creation mask; it
        // is restored below (other tests in this binary create no files
        // whose mode they check).
        let old = unsafe { libc_umask(0) };
        let listener = bind_private_with(&path, |bound| {
            assert!(
                !path.exists(),
                "the socket is at its final path before it is private"
            );
            let staging = bound.parent().unwrap();
            let mode = std::fs::metadata(staging).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o700, "the socket is bound where others can reach it");
        });
        // SAFETY: as above.
        unsafe { libc_umask(old) };
        let listener = listener.unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        // Still a working listener at its final path.
        let _client = UnixStream::connect(&path).unwrap();
        let _ = listener.accept().unwrap();
        // No staging directory left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1);
    }

    extern "C" {
        #[link_name = "umask"]
        fn libc_umask(mask: u32) -> u32;
    }
}
