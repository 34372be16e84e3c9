//! Files other local users can reach: the warnings for a store directory (from `init`, `status`, `fsck`) and a secret file (a password file, `serve`'s TLS key).
//!
//! New stores are private from the moment they exist (directories 0700,
//! files 0600). A store made before that, or opened up since, lets another
//! user take its lock (holding commits, and so erasure, off for as long as
//! they like) and read the names and sizes of its files; the commands that
//! look at a store say so, with the command that closes it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The permission bits that let users other than the owner in.
const OTHERS: u32 = 0o077;

fn mode(meta: &std::fs::Metadata) -> u32 {
    meta.permissions().mode() & 0o7777
}

/// `path` as a shell word, for a command the user may paste.
fn shell_word(path: &Path) -> String {
    let text = path.to_string_lossy();
    shlex::try_quote(&text).map_or_else(|_| text.to_string(), |q| q.into_owned())
}

/// What in the store directory `dir` lets other users in, with its mode:
/// the directory itself and the entries at its top (lock, marker,
/// superblocks, `segments/`, control socket; the segment files are behind
/// `segments/`). Empty when all is private or `dir` is missing (the state
/// directory of a store on S3 before its first writer).
fn open_to_others(dir: &Path) -> Vec<String> {
    let Ok(meta) = std::fs::metadata(dir) else {
        return Vec::new();
    };
    let mut open = Vec::new();
    if mode(&meta) & OTHERS != 0 {
        open.push(format!("the directory (mode {:o})", mode(&meta)));
    }
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            // DirEntry::metadata does not follow symlinks, whose own mode
            // means nothing.
            let meta = entry.metadata().ok()?;
            (!meta.file_type().is_symlink() && mode(&meta) & OTHERS != 0).then(|| {
                format!(
                    "{} (mode {:o})",
                    entry.file_name().to_string_lossy(),
                    mode(&meta)
                )
            })
        })
        .collect();
    entries.sort();
    open.extend(entries);
    open
}

/// The warning for store directory `dir` when other users can reach into
/// it (`None` when they cannot).
pub fn store_warning(dir: &Path) -> Option<String> {
    let open = open_to_others(dir);
    if open.is_empty() {
        return None;
    }
    Some(format!(
        "oubli: warning: store directory {} lets other users in: {}; another user could hold \
         its lock, keeping commits (and so erasure) off, and read its files' names and sizes: \
         run `chmod -R go= {}`",
        dir.display(),
        open.join(", "),
        shell_word(dir)
    ))
}

/// Prints [`store_warning`] to stderr, if any.
pub fn warn_about_store(dir: &Path) {
    if let Some(warning) = store_warning(dir) {
        eprintln!("{warning}");
    }
}

/// The warning for a secret file (`what`: "password file", "TLS private
/// key") whose `meta` lets other users read or write it, as ssh gives for
/// a private key; the caller adds its prefix.
pub fn secret_file_warning(what: &str, path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    (mode(meta) & OTHERS != 0).then(|| {
        format!(
            "warning: {what} {} is open to other users (mode {:o}): run `chmod 600 {}`",
            path.display(),
            mode(meta),
            shell_word(path)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_with_spaces_is_quoted_in_the_command() {
        assert_eq!(shell_word(Path::new("/srv/my store")), "'/srv/my store'");
        assert_eq!(shell_word(Path::new("/srv/store")), "/srv/store");
    }

    #[test]
    fn a_private_store_draws_no_warning_and_an_open_one_names_what_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        oubli::create_private_dir(&store).unwrap();
        let lock = store.join("lock");
        std::fs::write(&lock, b"").unwrap();
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", store.join("link")).unwrap();
        assert_eq!(store_warning(&store), None);
        assert_eq!(store_warning(&dir.path().join("missing")), None);
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o640)).unwrap();
        let warning = store_warning(&store).unwrap();
        assert!(warning.contains(": lock (mode 640);"), "{warning}");
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o711)).unwrap();
        let warning = store_warning(&store).unwrap();
        assert!(
            warning.contains(": the directory (mode 711), lock (mode 640);"),
            "{warning}"
        );
    }
}
