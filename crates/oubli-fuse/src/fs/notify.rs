//! Notifications that keep the kernel's caches exact when names and objects change without a request of the kernel's (a redaction over the control socket).
//!
//! The kernel caches names and attributes (for [`crate::kernel`]'s TTL),
//! pages across opens and the absence of names. Every change it asks for
//! it applies to its caches itself; these are for the others (docs/FUSE.md,
//! "The kernel's caches"). They are sent after the change, holding neither
//! the gate nor an inode's lock: the kernel may make a notification wait
//! for a directory lock held by a request that waits for this file system.
//! ENOENT from the kernel (nothing cached) is no error.

use super::Fs;
use fuser::INodeNo;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

impl Fs {
    /// `name` in `parent`, which named `child`, was removed: its entry
    /// leaves the kernel's cache, and the kernel's inode for `child`, if it
    /// holds one under that name, drops its link count to 0 as after an
    /// unlink (a directory is marked dead). The directory's attributes (link
    /// count, times) and cached listing go too: the kernel drops them with
    /// the entry only when it held the entry.
    pub(super) fn tell_kernel_removed(&self, parent: u64, name: &[u8], child: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.delete(INodeNo(parent), INodeNo(child), OsStr::from_bytes(name));
            let _ = n.inval_inode(INodeNo(parent), 0, 0);
        }
    }

    /// `oid` changed or was erased without the kernel: its cached
    /// attributes and pages go, so that the next stat and read ask again
    /// (and an erased object answers ENOENT).
    pub(super) fn tell_kernel_changed(&self, oid: u64) {
        if let Some(n) = self.notifier.get() {
            let _ = n.inval_inode(INodeNo(oid), 0, 0);
        }
    }
}
