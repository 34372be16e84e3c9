//! Export management: each export is one store object, named in the `.nbd-exports` directory object under `ROOT_DIR`, sized by the object's size.
//!
//! The directory is an ordinary object linked from the root directory under
//! [`EXPORTS_DIR`]; the leading dot keeps it apart from the names `oubli put`
//! stores. Shrinking or deleting an export is a deletion in the sense of the
//! threat model: the bytes past the new size, or the whole export, are erased
//! at the next commit.

use oubli_core::{Error, Result, Store, ROOT_DIR};

/// Name of the exports directory in the store's root directory.
pub const EXPORTS_DIR: &[u8] = b".nbd-exports";
/// Metadata of the exports directory object.
pub const EXPORTS_DIR_META: &[u8] = b"oubli-nbd exports directory v1";
/// Metadata of an export object.
pub const EXPORT_META: &[u8] = b"oubli-nbd export v1";
/// Largest export size: clients (qemu) use signed 64-bit offsets.
pub const MAX_EXPORT_SIZE: u64 = i64::MAX as u64;

/// The line of an export's metadata that turns ext4 delete inference on.
pub const INFER_EXT4: &str = "infer-deletes=ext4";

/// Settings stored with an export (lines after [`EXPORT_META`] in its metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSettings {
    /// `oubli serve --infer-deletes ext4`: deletions inferred from the ext4 journal.
    pub infer_ext4: bool,
}

/// The settings stored with an export object.
pub fn export_settings(store: &Store, oid: u64) -> Result<ExportSettings> {
    let meta = store.object(oid)?.meta;
    let text = String::from_utf8_lossy(&meta);
    Ok(ExportSettings {
        infer_ext4: text.lines().skip(1).any(|l| l == INFER_EXT4),
    })
}

/// Stores an export's settings (in its metadata, committed with the store).
pub fn set_export_settings(store: &Store, oid: u64, settings: &ExportSettings) -> Result<()> {
    let mut meta = EXPORT_META.to_vec();
    if settings.infer_ext4 {
        meta.push(b'\n');
        meta.extend_from_slice(INFER_EXT4.as_bytes());
    }
    store.set_meta(oid, &meta)
}

/// One export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    /// The store object holding the export's bytes.
    pub oid: u64,
    pub size: u64,
}

/// Checks an export name: 1 to 4096 bytes of UTF-8 without NUL (the NBD
/// protocol's string rules; the empty name means "the default export").
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("an export name cannot be empty".into()));
    }
    if name.len() > crate::proto::MAX_STRING {
        return Err(Error::Invalid(format!(
            "an export name is at most 4096 bytes (got {})",
            name.len()
        )));
    }
    if name.contains('\0') {
        return Err(Error::Invalid("an export name cannot contain NUL".into()));
    }
    Ok(())
}

fn validate_size(size: u64) -> Result<()> {
    if size > MAX_EXPORT_SIZE {
        return Err(Error::Invalid(format!(
            "export size {size} is over the maximum {MAX_EXPORT_SIZE}"
        )));
    }
    Ok(())
}

/// The exports directory, if it exists.
pub fn exports_dir(store: &Store) -> Result<Option<u64>> {
    let Some(dir) = store.lookup(ROOT_DIR, EXPORTS_DIR)? else {
        return Ok(None);
    };
    if store.object(dir)?.meta != EXPORTS_DIR_META {
        return Err(Error::Invalid(format!(
            "{:?} in the root directory is not an NBD exports directory",
            String::from_utf8_lossy(EXPORTS_DIR)
        )));
    }
    Ok(Some(dir))
}

fn ensure_exports_dir(store: &Store) -> Result<u64> {
    if let Some(dir) = exports_dir(store)? {
        return Ok(dir);
    }
    let dir = store.create_object(EXPORTS_DIR_META)?;
    match store.link(ROOT_DIR, EXPORTS_DIR, dir) {
        Ok(()) => Ok(dir),
        Err(Error::Exists(_)) => {
            // Another thread made it first.
            store.delete(dir)?;
            exports_dir(store)?.ok_or_else(|| Error::NoName(".nbd-exports".into()))
        }
        Err(e) => {
            let _ = store.delete(dir);
            Err(e)
        }
    }
}

/// Creates an export of `size` bytes (reading as zeros). Fails with
/// [`Error::Exists`] if the name is taken.
pub fn create_export(store: &Store, name: &str, size: u64) -> Result<Export> {
    validate_name(name)?;
    validate_size(size)?;
    let dir = ensure_exports_dir(store)?;
    if store.lookup(dir, name.as_bytes())?.is_some() {
        return Err(Error::Exists(name.into()));
    }
    let oid = store.create_object(EXPORT_META)?;
    // A file system writes its blocks in place: small cells, so that a
    // 4 KiB write re-seals 4 KiB (DESIGN §3).
    let made = store
        .use_small_cells(oid)
        .and_then(|_| store.truncate(oid, size))
        .and_then(|()| store.link(dir, name.as_bytes(), oid));
    if let Err(e) = made {
        let _ = store.delete(oid);
        return Err(e);
    }
    Ok(Export {
        name: name.into(),
        oid,
        size,
    })
}

/// The export called `name`, if any.
pub fn lookup_export(store: &Store, name: &str) -> Result<Option<Export>> {
    let Some(dir) = exports_dir(store)? else {
        return Ok(None);
    };
    let Some(oid) = store.lookup(dir, name.as_bytes())? else {
        return Ok(None);
    };
    Ok(Some(Export {
        name: name.into(),
        oid,
        size: store.size(oid)?,
    }))
}

/// Every export, sorted by name.
pub fn list_exports(store: &Store) -> Result<Vec<Export>> {
    let Some(dir) = exports_dir(store)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, oid) in store.list(dir)? {
        out.push(Export {
            name: String::from_utf8_lossy(&name).into_owned(),
            oid,
            size: store.size(oid)?,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Sets an export's size. Shrinking erases the bytes past the new size at the
/// next commit; growing adds zeros. Connected clients keep the size they
/// negotiated, and the server refuses their requests past the new end.
pub fn resize_export(store: &Store, name: &str, size: u64) -> Result<Export> {
    validate_size(size)?;
    let export = lookup_export(store, name)?.ok_or_else(|| Error::NoName(name.into()))?;
    store.truncate(export.oid, size)?;
    Ok(Export { size, ..export })
}

/// Deletes an export: its name and all its bytes, erased at the next commit.
pub fn delete_export(store: &Store, name: &str) -> Result<()> {
    let dir = exports_dir(store)?.ok_or_else(|| Error::NoName(name.into()))?;
    let oid = store.unlink(dir, name.as_bytes())?;
    store.delete(oid)
}
