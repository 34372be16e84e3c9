//! `mount -t fuse.oubli` and /etc/fstab: the `oubli` binary called as `mount.fuse.oubli` (a symlink, as mount(8) looks for helpers) turns mount's arguments into `oubli mount`.
//!
//! mount(8) runs `/sbin/mount.fuse.oubli SOURCE TARGET [-sfnv] -o OPTIONS`
//! for an fstab line such as
//!
//! ```text
//! /srv/store  /mnt/secret  fuse.oubli  defaults,vault=/etc/oubli/vault,password-file=/etc/oubli/pw,_netdev  0 0
//! ```
//!
//! SOURCE is the store, unless a `store=PATH` option names it (then SOURCE
//! is free text, e.g. the `fsname`: handy because umount(8) takes a
//! directory given as SOURCE for a mount point); `vault=` and
//! `password-file=` become `--vault` and `--password-file`; every other
//! option goes to `oubli mount -o` (which
//! ignores what mount(8) and systemd keep for themselves: `defaults`,
//! `_netdev`, `noauto`, `nofail`, `x-systemd.*`, `comment=`, ...). The
//! command detaches once the file system is up, as mount(8) expects; `umount
//! TARGET` unmounts, and the mount process commits before it exits.
//!
//! Run by root, the helper mounts as mount(8) mounts a local file system:
//! `dev` and `suid` unless the line says `nodev` / `nosuid`. mount(8) never
//! passes `dev` or `suid` to a helper (they are its defaults; only their
//! negations and `user`'s implied `nosuid,nodev` arrive, and `x-*` options
//! stay with mount(8) too), so without this an fstab line could not enable
//! them at all (docs/FUSE.md, "fstab").

use std::ffi::OsString;
use std::path::Path;

/// Names under which the binary acts as mount's helper.
const HELPER_NAMES: &[&str] = &["mount.fuse.oubli", "mount.oubli"];

/// Whether this process was started as mount(8)'s helper.
pub fn called_as_mount_helper() -> bool {
    is_helper_name(std::env::args_os().next())
}

fn is_helper_name(arg0: Option<OsString>) -> bool {
    arg0.as_deref()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| HELPER_NAMES.contains(&n))
}

/// The arguments `oubli` parses: unchanged, unless called as mount's helper.
pub fn as_mount_helper(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // SAFETY: FFI call without arguments that cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    helper_args(args, root)
}

/// [`as_mount_helper`] for a caller who is root or not.
fn helper_args(args: Vec<OsString>, root: bool) -> Result<Vec<OsString>, String> {
    if !is_helper_name(args.first().cloned()) {
        return Ok(args);
    }
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut foreground = false;
    let mut rest = args.into_iter().skip(1);
    while let Some(arg) = rest.next() {
        match arg.to_str() {
            Some("-o") => {
                let list = rest.next().ok_or("-o needs a value")?;
                options.push(list.into_string().map_err(|_| "options must be UTF-8")?);
            }
            Some(o) if o.starts_with("-o") => options.push(o[2..].to_string()),
            // No mtab, sloppy, verbose: nothing to do; fake: refused.
            Some("-n" | "-s" | "-v") => {}
            Some("-f") => return Err("-f (fake mount) is not supported".into()),
            Some("-t") => {
                rest.next();
            }
            Some(o) if o.starts_with("-t") => {}
            Some("--foreground") => foreground = true,
            Some(o) if o.starts_with('-') && o.len() > 1 => {
                return Err(format!("unknown argument {o}"))
            }
            _ => positional.push(arg),
        }
    }
    let [source, target] = <[OsString; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.oubli STORE MOUNTPOINT [-o OPTIONS]".to_string())?;
    let mut store = source;
    let mut out: Vec<OsString> = vec!["oubli".into()];
    // First, so that a `nodev` / `nosuid` from the line wins (the last one does).
    let mut passed: Vec<String> = if root {
        vec!["dev".into(), "suid".into()]
    } else {
        Vec::new()
    };
    for opt in options.iter().flat_map(|l| l.split(',')) {
        match opt.split_once('=') {
            Some(("store", v)) => store = v.into(),
            Some(("vault", v)) => out.extend(["--vault".into(), v.into()]),
            Some(("password-file" | "password_file", v)) => {
                out.extend(["--password-file".into(), v.into()])
            }
            Some(("on-vault-failure", v)) => out.extend(["--on-vault-failure".into(), v.into()]),
            Some(("log-tally", v)) => out.extend(["--log-tally".into(), v.into()]),
            _ if opt.is_empty() => {}
            _ => passed.push(opt.to_string()),
        }
    }
    out.extend(["--store".into(), store, "mount".into(), target]);
    if foreground {
        out.push("--foreground".into());
    }
    if !passed.is_empty() {
        out.extend(["-o".into(), passed.join(",").into()]);
    }
    Ok(out)
}

/// `mount -o remount,ro|rw MOUNTPOINT` of a live mount: mount(8) calls the
/// helper again, but there is nothing to start, only the kernel's read-only
/// flag to change (a read-only file system refuses writes itself, with
/// EROFS). `None` when this is not a remount.
pub fn remount_if_asked(args: &[OsString]) -> Option<Result<(), String>> {
    if !is_helper_name(args.first().cloned()) {
        return None;
    }
    let mut options = Vec::new();
    let mut positional = Vec::new();
    let mut rest = args.iter().skip(1);
    while let Some(a) = rest.next() {
        match a.to_str() {
            Some("-o") => options.extend(rest.next().and_then(|o| o.to_str()).map(str::to_string)),
            Some(o) if o.starts_with("-o") => options.push(o[2..].to_string()),
            Some(o) if o.starts_with('-') => {}
            _ => positional.push(a.clone()),
        }
    }
    let options: Vec<&str> = options.iter().flat_map(|l| l.split(',')).collect();
    if !options.contains(&"remount") {
        return None;
    }
    let target = positional.last()?;
    let read_only = options.iter().rev().find_map(|o| match *o {
        "ro" => Some(true),
        "rw" => Some(false),
        _ => None,
    });
    Some(remount(Path::new(target), read_only))
}

fn remount(target: &Path, read_only: Option<bool>) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(target.as_os_str().as_bytes())
        .map_err(|_| "a mount point with a NUL byte".to_string())?;
    // A remount sets the mount's flags anew: keep the ones it has.
    let mut flags = libc::MS_REMOUNT
        | oubli_fuse::mount_flags(target).map_err(|e| format!("{}: {e}", target.display()))?;
    match read_only {
        Some(true) => flags |= libc::MS_RDONLY,
        Some(false) => flags &= !libc::MS_RDONLY,
        None => {}
    }
    // SAFETY: FFI; a remount of a mount point, with valid C strings and no data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            path.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "remounting {}: {}",
            target.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn fstab_arguments_become_oubli_mount() {
        let got = helper_args(
            args(&[
                "/sbin/mount.fuse.oubli",
                "/srv/store",
                "/mnt/secret",
                "-n",
                "-o",
                "rw,defaults,vault=/etc/oubli/vault,password-file=/etc/oubli/pw,_netdev,noatime",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            got,
            args(&[
                "oubli",
                "--vault",
                "/etc/oubli/vault",
                "--password-file",
                "/etc/oubli/pw",
                "--store",
                "/srv/store",
                "mount",
                "/mnt/secret",
                "-o",
                "rw,defaults,_netdev,noatime",
            ])
        );
        // store= names the store; SOURCE is then free text.
        let got = helper_args(
            args(&[
                "mount.fuse.oubli",
                "secrets",
                "/mnt/s",
                "-o",
                "store=/srv/s,fsname=secrets",
            ]),
            false,
        )
        .unwrap();
        assert_eq!(
            got,
            args(&[
                "oubli",
                "--store",
                "/srv/s",
                "mount",
                "/mnt/s",
                "-o",
                "fsname=secrets"
            ])
        );
        // Run by root, as a local file system: dev and suid unless the line
        // says otherwise (mount(8) passes nodev / nosuid, never dev / suid).
        let by_root = |o: &str| {
            let got = helper_args(args(&["mount.fuse.oubli", "/s", "/m", "-o", o]), true);
            got.unwrap().last().unwrap().to_str().unwrap().to_string()
        };
        assert_eq!(by_root("rw"), "dev,suid,rw");
        assert_eq!(by_root("rw,nodev,nosuid"), "dev,suid,rw,nodev,nosuid");
        let mut o = oubli_fuse::MountOptions::default();
        o.parse(&by_root("rw,nosuid")).unwrap();
        assert!(o.dev && !o.suid);
        // Called as itself, nothing changes.
        let plain = args(&["oubli", "status"]);
        assert_eq!(as_mount_helper(plain.clone()).unwrap(), plain);
        assert!(as_mount_helper(args(&["mount.fuse.oubli", "/srv/store"])).is_err());
        assert!(as_mount_helper(args(&["mount.fuse.oubli", "a", "b", "-f"])).is_err());
    }
}
