//! `open_medium` / `create_medium`: pick a medium from a location string.
//!
//! Rules, applied in order:
//!
//! 1. `dir:PATH` is always a [`DirMedium`] and `file:PATH` always a
//!    [`FileMedium`] (a regular file or a block device).
//! 2. A bare `PATH` that exists is looked at: a directory means
//!    [`DirMedium`]; a regular file or a block device means [`FileMedium`];
//!    anything else is refused with `InvalidInput`.
//! 3. A bare `PATH` that does not exist: [`open_medium`] fails with
//!    `NotFound`; [`create_medium`] makes a [`DirMedium`] there (the
//!    embedded default). To create a new single-file store, say `file:PATH`.
//!
//! `create_medium` formats a [`FileMedium`] with [`DEFAULT_SLOT_SIZE`] and
//! no size limit (a regular file grows as needed; a block device is used
//! whole); call [`FileMedium::create`] directly for other choices.

use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use oubli_core::Medium;

use crate::dir::DirMedium;
use crate::file::{FileMedium, DEFAULT_SLOT_SIZE};
use crate::util::invalid_input;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Dir,
    File,
}

/// Splits an explicit prefix off, or decides from what is at the path.
/// `None` means "nothing there".
fn choose(location: &str) -> io::Result<(Option<Choice>, &Path)> {
    if let Some(p) = location.strip_prefix("dir:") {
        return Ok((Some(Choice::Dir), Path::new(p)));
    }
    if let Some(p) = location.strip_prefix("file:") {
        return Ok((Some(Choice::File), Path::new(p)));
    }
    let path = Path::new(location);
    if location.is_empty() {
        return Err(invalid_input("empty medium location"));
    }
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok((Some(Choice::Dir), path)),
        Ok(m) if m.is_file() || m.file_type().is_block_device() => Ok((Some(Choice::File), path)),
        Ok(_) => Err(invalid_input(format!(
            "{location} is neither a directory, a regular file nor a block device"
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((None, path)),
        Err(e) => Err(e),
    }
}

/// Opens the existing store at `location` (rules in the module docs).
pub fn open_medium(location: &str) -> io::Result<Box<dyn Medium>> {
    match choose(location)? {
        (Some(Choice::Dir), p) => Ok(Box::new(DirMedium::open(p)?)),
        (Some(Choice::File), p) => Ok(Box::new(FileMedium::open(p)?)),
        (None, p) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no store at {}", p.display()),
        )),
    }
}

/// Creates a new store at `location` (rules in the module docs).
pub fn create_medium(location: &str) -> io::Result<Box<dyn Medium>> {
    match choose(location)? {
        (Some(Choice::Dir) | None, p) => Ok(Box::new(DirMedium::create(p)?)),
        (Some(Choice::File), p) => Ok(Box::new(FileMedium::create(p, None, DEFAULT_SLOT_SIZE)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oubli_core::Slot;

    #[test]
    fn picks_by_prefix_and_by_what_is_there() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("d");
        let dir_s = dir.to_str().unwrap();

        // Missing bare path: create makes a directory store, open refuses.
        assert_eq!(
            open_medium(dir_s).err().unwrap().kind(),
            io::ErrorKind::NotFound
        );
        let m = create_medium(dir_s).unwrap();
        assert!(m.describe().starts_with("dir:"));
        m.write_superblock(Slot::A, b"x").unwrap();
        m.sync().unwrap();
        drop(m);
        let m = open_medium(dir_s).unwrap();
        assert!(m.describe().starts_with("dir:"));
        drop(m);
        let m = open_medium(&format!("dir:{dir_s}")).unwrap();
        assert_eq!(m.read_superblock(Slot::A).unwrap().unwrap(), b"x");
        drop(m);

        // file: prefix creates a single-file store; a bare path to it opens it.
        let f = d.path().join("f.img");
        let f_s = f.to_str().unwrap();
        let m = create_medium(&format!("file:{f_s}")).unwrap();
        assert!(m.describe().starts_with("file:"));
        assert_eq!(m.segment_capacity(), DEFAULT_SLOT_SIZE - 4096);
        drop(m);
        assert!(open_medium(f_s).unwrap().describe().starts_with("file:"));
        assert_eq!(
            create_medium(f_s).err().unwrap().kind(),
            io::ErrorKind::AlreadyExists
        );

        // An existing empty file is formatted as a file store.
        let e = d.path().join("empty");
        fs::write(&e, b"").unwrap();
        assert!(create_medium(e.to_str().unwrap())
            .unwrap()
            .describe()
            .starts_with("file:"));

        assert_eq!(
            open_medium("").err().unwrap().kind(),
            io::ErrorKind::InvalidInput
        );
        if Path::new("/dev/null").exists() {
            assert_eq!(
                open_medium("/dev/null").err().unwrap().kind(),
                io::ErrorKind::InvalidInput
            );
        }
    }
}
