//! Access-time mount flags (`nodiratime`, `relatime`, `strictatime`, ...): mount flags, not FUSE options, so they are set on the mount point after mounting.
//!
//! fuser's direct mount(2) path (taken as root) would pass them to the FUSE
//! driver as data options, which it refuses ("fuse: Unknown parameter").
//! They are per-mount flags, changed like `mount -o remount,bind,FLAG`: a
//! bind remount that keeps every other flag the mount has. `lazytime` is a
//! superblock flag that FUSE does not let a remount change; oubli already
//! keeps timestamps in memory and writes them back lazily (FUSE.md,
//! "Design"), which is what it asks for, so it is accepted as such.

use std::io;
use std::path::Path;

/// The `MS_*` flags the mount at `mountpoint` has now (read-only, nosuid,
/// nodev, noexec, sync and the access-time ones): what a remount must pass
/// again to keep them, since it sets the mount's flags anew.
pub fn mount_flags(mountpoint: &Path) -> io::Result<libc::c_ulong> {
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point with a NUL byte"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: FFI with a valid path and a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded.
    let have = unsafe { st.assume_init() }.f_flag;
    let mut flags: libc::c_ulong = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if have & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Applies the access-time options, in order, to the mount at `mountpoint`.
pub(crate) fn apply(mountpoint: &Path, options: &[String]) -> io::Result<()> {
    let flags_wanted: Vec<&str> = options
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "lazytime" | "nolazytime"))
        .collect();
    if flags_wanted.is_empty() {
        return Ok(());
    }
    let mut flags = mount_flags(mountpoint)?;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mount point with a NUL byte"))?;
    const ATIME_MODES: libc::c_ulong = libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;
    for option in flags_wanted {
        match option {
            "nodiratime" => flags |= libc::MS_NODIRATIME,
            "diratime" => flags &= !libc::MS_NODIRATIME,
            "relatime" => flags = (flags & !ATIME_MODES) | libc::MS_RELATIME,
            "strictatime" | "norelatime" => flags = (flags & !ATIME_MODES) | libc::MS_STRICTATIME,
            // Back to the kernel's default, relatime.
            "nostrictatime" => flags = (flags & !ATIME_MODES) | libc::MS_RELATIME,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("unknown access-time option {other}"),
                ))
            }
        }
    }
    // SAFETY: FFI; a bind remount of the mount point with valid C strings and no data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "setting {} on {}: {e} (access-time flags need root)",
                options.join(","),
                mountpoint.display()
            ),
        ));
    }
    Ok(())
}
