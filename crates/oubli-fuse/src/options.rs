//! Mount options: the `-o` comma list of `oubli mount`, and what each one turns into.

use oubli_core::EpochPolicy;
use std::path::PathBuf;
use std::time::Duration;

/// How a store is mounted.
#[derive(Debug, Clone, PartialEq)]
pub struct MountOptions {
    /// The "device" shown in /proc/mounts (`-o fsname=`); default `oubli`.
    pub fsname: String,
    /// The file system subtype: the mount's type is `fuse.<subtype>`, or plain
    /// `fuse` when empty (`-o subtype=`); default `oubli`.
    pub subtype: String,
    /// Let users other than the one who mounted use the file system (`-o allow_other`).
    pub allow_other: bool,
    /// The kernel checks permissions from the stored modes (`-o default_permissions`).
    /// Always on: without it any user admitted by `allow_other` could read
    /// everything. The option is accepted for compatibility.
    pub default_permissions: bool,
    pub read_only: bool,
    /// Epoch triggers for the mount (`epoch_interval=S`, `epoch_bytes=N`,
    /// `epoch_deletions=N`; 0 disables one): set on the store at mount
    /// (`Store::set_policy`), unset ones keep the store's. The store checks
    /// them after every change; the timer covers an idle store. Deletions are
    /// counted as the engine does: removing a file's last link counts its
    /// name, its object and its orphan-list entry.
    pub policy: Option<EpochPolicy>,
    /// How often the timer calls `Store::tick`.
    pub tick: Duration,
    /// FUSE request loops (threads, `-o threads=N`); default: twice the CPUs, 4 to 16.
    pub threads: usize,
    /// `statfs` reports the size and free space of the file system holding this path (the store's directory).
    pub space_from: Option<PathBuf>,
    /// Owner of the root directory when the store is mounted for the first time; default: the mounting user.
    pub root_owner: Option<(u32, u32)>,
    /// Allow device nodes and set-id programs (`-o dev`, `-o suid`): only
    /// for root (refused otherwise, as fusermount3 does); default off
    /// (`nodev,nosuid`, as every FUSE mount).
    pub dev: bool,
    pub suid: bool,
    /// Access-time flags of the mount (`nodiratime`, `relatime`,
    /// `strictatime`, ... and `lazytime`): applied to the mount point after
    /// mounting (see `atime` in lib.rs), not passed as FUSE data options.
    pub atime: Vec<String>,
    /// The mount's readahead window in KiB (`-o readahead=KIB`; 0 leaves the
    /// kernel's 128 KiB). Unset: 1 MiB when mounting as root, else the
    /// kernel's (the window is set through sysfs, which needs root; see
    /// `bdi.rs`). Set explicitly, it needs root.
    pub readahead_kib: Option<u32>,
    /// The mount's share of the system's dirty-page limit in percent
    /// (`-o dirty_share=PERCENT`, 1 to 100; 0 leaves the kernel's 1 %).
    /// Unset: [`crate::bdi::DEFAULT_DIRTY_SHARE`] when mounting as root,
    /// else the kernel's. Set explicitly, it needs root (sysfs).
    pub dirty_share: Option<u32>,
    /// List `.snapshots` in the root directory (`-o snapdir=visible`); by
    /// default it is hidden from listings but reachable by name, like ZFS's `.zfs`.
    pub snapdir_visible: bool,
    /// The kernel's writeback cache (`-o writeback_cache`, the default on
    /// Linux 6.16 and later, see [`kernel_waits_for_fuse_writeback`];
    /// `-o no_writeback_cache` turns it off): small writes gather in the
    /// page cache and reach the mount in large requests at writeback,
    /// `fsync`, close and before a purge; the kernel then owns a file's size
    /// and mtime while it is cached (FUSE.md, "The writeback cache").
    pub writeback_cache: bool,
    /// Other options, passed to the kernel as they are (`noatime`, `nosuid`, ...).
    pub extra: Vec<String>,
}

/// The largest `-o readahead=` accepted (64 MiB): beyond it a sequential
/// reader gains nothing and random readers pay for pages they never read.
pub const MAX_READAHEAD_KIB: u64 = 64 << 10;

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            fsname: "oubli".into(),
            subtype: "oubli".into(),
            allow_other: false,
            default_permissions: true,
            read_only: false,
            policy: None,
            tick: Duration::from_secs(1),
            // Request loops block on the medium and the engine lock as much as
            // on the CPU: twice the CPUs keeps the cores busy (measured: 4
            // loops give 2.3× the random-read throughput of 1 on 2 cores).
            threads: std::thread::available_parallelism()
                .map(|n| 2 * n.get())
                .unwrap_or(4)
                .clamp(4, 16),
            space_from: None,
            root_owner: None,
            dev: false,
            suid: false,
            atime: Vec::new(),
            readahead_kib: None,
            dirty_share: None,
            snapdir_visible: false,
            writeback_cache: kernel_waits_for_fuse_writeback(),
            extra: Vec::new(),
        }
    }
}

/// Whether the running kernel keeps a FUSE page under writeback until the
/// mount has answered its WRITE (Linux 6.16 and later: the writeback
/// temp-page copies are gone). A purge relies on it to wait for the writes
/// the kernel has in flight (`lib.rs`, `write_back_kernel_cache`); before
/// 6.16 the kernel ended writeback when it copied the page, so a purge could
/// end the epoch before such a write arrived and leave what it overwrote
/// recoverable. There the writeback cache is off unless asked for.
pub fn kernel_waits_for_fuse_writeback() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, 6, 16)
}

/// Whether a kernel release string (`6.18.44-fc-v1300`) is at least `major.minor`.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(ma), Some(mi)) => (ma, mi) >= (major, minor),
        _ => false,
    }
}

impl MountOptions {
    /// Applies a `-o` comma list (`allow_other,fsname=dev,epoch_interval=30`).
    pub fn parse(&mut self, list: &str) -> Result<(), String> {
        for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let number = |what: &str| -> Result<u64, String> {
                value
                    .ok_or_else(|| format!("-o {key} needs a value ({what})"))?
                    .parse::<u64>()
                    .map_err(|_| format!("-o {opt}: {what} expected"))
            };
            match key {
                "fsname" => self.fsname = value.unwrap_or_default().to_string(),
                "subtype" => self.subtype = value.unwrap_or_default().to_string(),
                "allow_other" => self.allow_other = true,
                "default_permissions" => self.default_permissions = true,
                "ro" => self.read_only = true,
                "rw" => self.read_only = false,
                "epoch_interval" => {
                    let s = number("seconds")?;
                    self.policy_mut().interval = (s > 0).then(|| Duration::from_secs(s));
                }
                "epoch_bytes" => {
                    let n = number("bytes")?;
                    self.policy_mut().bytes = (n > 0).then_some(n);
                }
                "epoch_deletions" => {
                    let n = number("a count")?;
                    self.policy_mut().deletions = (n > 0).then_some(n);
                }
                "threads" => self.threads = number("a count")?.clamp(1, 64) as usize,
                "readahead" => {
                    let kib = number("KiB")?;
                    if kib > MAX_READAHEAD_KIB {
                        return Err(format!("-o {opt}: at most {MAX_READAHEAD_KIB} KiB"));
                    }
                    self.readahead_kib = Some(kib as u32);
                }
                "dirty_share" => {
                    let percent = number("percent")?;
                    if percent > 100 {
                        return Err(format!("-o {opt}: at most 100 (percent)"));
                    }
                    self.dirty_share = Some(percent as u32);
                }
                "snapdir" => {
                    self.snapdir_visible = match value {
                        Some("visible") => true,
                        Some("hidden") => false,
                        _ => return Err(format!("-o {opt}: snapdir=visible or snapdir=hidden")),
                    }
                }
                "writeback_cache" => self.writeback_cache = true,
                "no_writeback_cache" => self.writeback_cache = false,
                "dev" => self.dev = true,
                "nodev" => self.dev = false,
                "suid" => self.suid = true,
                "nosuid" => self.suid = false,
                "nodiratime" | "diratime" | "relatime" | "norelatime" | "strictatime"
                | "nostrictatime" | "lazytime" | "nolazytime" => self.atime.push(key.to_string()),
                // Options fusermount and mount(8) pass along that mean nothing here.
                "exec" | "async" | "auto" | "noauto" | "nofail" | "_netdev" | "user" | "nouser"
                | "users" | "defaults" | "comment" => {}
                // systemd's fstab generator and mount(8) keep these for themselves.
                k if k.starts_with("x-") => {}
                "allow_root" | "auto_unmount" => {
                    return Err(format!("-o {key} is not supported (use allow_other)"))
                }
                _ => self.extra.push(opt.to_string()),
            }
        }
        Ok(())
    }

    fn policy_mut(&mut self) -> &mut EpochPolicy {
        self.policy.get_or_insert_with(EpochPolicy::manual)
    }

    /// The policy to open the store with: the mount's triggers where set, the store's default otherwise.
    pub fn store_policy(&self) -> EpochPolicy {
        let default = EpochPolicy::default();
        match &self.policy {
            None => default,
            Some(p) => EpochPolicy {
                interval: p.interval.or(default.interval),
                bytes: p.bytes.or(default.bytes),
                deletions: p.deletions.or(default.deletions),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writeback_cache_defaults_on_only_where_the_kernel_waits_for_its_writes() {
        assert!(release_at_least("6.18.44-fc-v1300", 6, 16));
        assert!(release_at_least("6.16.0", 6, 16));
        assert!(release_at_least("7.0.1", 6, 16));
        assert!(!release_at_least("6.15.9-arch1", 6, 16));
        assert!(!release_at_least("6.1.0-28-amd64", 6, 16));
        assert!(!release_at_least("5.19.0", 6, 16));
        assert!(!release_at_least("garbage", 6, 16));
    }

    #[test]
    fn parses_the_documented_options() {
        let mut o = MountOptions::default();
        o.parse("allow_other,default_permissions,fsname=/dev/x,subtype=,epoch_interval=30,epoch_bytes=1000,epoch_deletions=5,noatime,snapdir=visible")
            .unwrap();
        assert!(o.allow_other && o.default_permissions && o.snapdir_visible);
        assert!(o.parse("snapdir=shown").is_err());
        assert_eq!(o.fsname, "/dev/x");
        assert_eq!(o.subtype, "");
        assert_eq!(
            o.policy,
            Some(EpochPolicy {
                interval: Some(Duration::from_secs(30)),
                bytes: Some(1000),
                deletions: Some(5),
            })
        );
        assert_eq!(o.extra, vec!["noatime".to_string()]);
        o.parse("nodiratime,relatime,lazytime,dev,suid,nosuid")
            .unwrap();
        assert_eq!(o.atime, ["nodiratime", "relatime", "lazytime"]);
        assert!(o.dev && !o.suid);
        assert!(o.parse("epoch_bytes=lots").is_err());
        assert!(o.parse("epoch_bytes").is_err());
    }

    #[test]
    fn store_policy_fills_unset_triggers() {
        let mut o = MountOptions::default();
        assert_eq!(o.store_policy(), EpochPolicy::default());
        o.parse("epoch_deletions=1").unwrap();
        let p = o.store_policy();
        assert_eq!(p.deletions, Some(1));
        assert_eq!(p.interval, EpochPolicy::default().interval);
    }
}
