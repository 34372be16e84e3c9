//! The commands on named data: put, get, rm, ls.

use crate::failure::Failure;
use crate::session::{Access, Global};
use crate::ui;
use oubli::{exit, Error, Store, ROOT_DIR};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Data moves in chunks of this size: a multiple of every cell size, so
/// that whole cells are sealed as they arrive, and small enough to keep
/// memory flat for any file size.
const CHUNK: usize = 1 << 20;
/// `get` to stdout buffers objects up to this size, so that a failure
/// prints nothing; larger ones are authenticated in a first pass.
const STDOUT_BUFFER: u64 = 64 << 20;
/// Longest name accepted (as most file systems).
const NAME_MAX: usize = 255;

/// Front-end metadata the CLI keeps in each object it creates (JSON, inside
/// the encrypted tree). Objects made by other front-ends may hold anything:
/// unreadable metadata shows as unknown.
#[derive(Serialize, Deserialize, Default)]
struct FileMeta {
    #[serde(default)]
    kind: String,
    /// Modification time of the source file (or of the `put`), Unix seconds.
    #[serde(default)]
    mtime: u64,
}

impl FileMeta {
    fn parse(bytes: &[u8]) -> FileMeta {
        serde_json::from_slice(bytes).unwrap_or_default()
    }
}

/// Names are flat (one directory) and must also make sense as file names
/// for front-ends that show the store as a file system.
fn check_name(name: &str) -> Result<&[u8], Failure> {
    let bad = |why: &str| {
        Failure::new(
            exit::USAGE,
            format!("invalid name {name:?}: {why}"),
            "names are 1 to 255 bytes of UTF-8 without '/' or NUL, and not '.' or '..'",
        )
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(bad("reserved or empty"));
    }
    if name.len() > NAME_MAX {
        return Err(bad("longer than 255 bytes"));
    }
    if name.contains(['/', '\0']) {
        return Err(bad("contains '/' or NUL"));
    }
    Ok(name.as_bytes())
}

fn is_stdio(path: Option<&Path>) -> bool {
    path.is_none_or(|p| p.as_os_str() == "-")
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn fill(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `oubli put NAME [SRC|-]`.
pub fn put(
    g: &Global,
    name: &str,
    src: Option<&Path>,
    share: Option<&str>,
) -> Result<String, Failure> {
    let key = check_name(name)?;
    // The source is opened before the store: a typo in SRC must not cost a
    // password prompt, nor leave anything behind.
    let (mut input, total, mtime): (Box<dyn Read>, Option<u64>, u64) = if is_stdio(src) {
        if io::stdin().is_terminal() {
            return Err(Failure::usage(
                "put reads the data from stdin, which is a terminal: give a SRC file or pipe the data in",
            ));
        }
        (Box::new(io::stdin().lock()), None, ui::now())
    } else {
        let path = src.expect("not stdio");
        let file = File::open(path)
            .map_err(|e| Failure::file(format!("cannot open {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Failure::file(format!("cannot read {}", path.display()), e))?;
        if meta.is_dir() {
            return Err(Failure::usage(format!("{} is a directory", path.display())));
        }
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(ui::now, |d| d.as_secs());
        (Box::new(file), Some(meta.len()), mtime)
    };
    let source_name = src.map_or("stdin".into(), |p| p.display().to_string());

    let session = g.open(Access::Write)?;
    let store = &session.store;
    let meta = serde_json::to_vec(&FileMeta {
        kind: "file".into(),
        mtime,
    })
    .expect("plain struct");
    let oid = store.create_object(&meta).map_err(|e| g.fail(e))?;
    if let Some(share) = share {
        if let Err(e) = store.set_share(oid, share) {
            let _ = store.delete(oid);
            return Err(g.fail(e));
        }
    }

    // Nothing reaches the intent log before the final flush, so ^C before it
    // leaves the store as it was: the sealed cells already written are
    // unreferenced and die with this epoch. An error is undone below.
    let bar = ui::bytes_bar(total, "put");
    let mut buf = Zeroizing::new(vec![0u8; CHUNK]);
    let mut offset = 0u64;
    let copied = loop {
        let n = match fill(&mut input, &mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => n,
            Err(e) => break Err(Failure::file(format!("reading {source_name}"), e)),
        };
        if let Err(e) = store.write(oid, offset, &buf[..n]) {
            break Err(g.fail(e));
        }
        offset += n as u64;
        bar.inc(n as u64);
    };
    bar.finish_and_clear();
    if let Err(failure) = copied {
        // Closing the store flushes: without this, the nameless object with
        // the partial plaintext would become durable, reachable by nothing.
        // Deleted, it is erased at the next commit instead.
        let _ = store.delete(oid);
        return Err(failure);
    }

    // Replace atomically: unlink, link and delete go into one log batch.
    let old = store.lookup(ROOT_DIR, key).map_err(|e| g.fail(e))?;
    if old.is_some() {
        store.unlink(ROOT_DIR, key).map_err(|e| g.fail(e))?;
    }
    store.link(ROOT_DIR, key, oid).map_err(|e| g.fail(e))?;
    if let Some(old) = old {
        delete_if_unlinked(store, old).map_err(|e| g.fail(e))?;
    }
    store.flush().map_err(|e| g.fail(e))?;
    Ok(match old {
        None => format!("stored {name} ({})\n", ui::size(offset)),
        Some(_) => format!(
            "replaced {name} ({}); its old content is erased at the next commit (`oubli commit`)\n",
            ui::size(offset)
        ),
    })
}

/// Deletes an object unless another name in the root directory still
/// refers to it (objects linked twice by the library): erasing data a
/// remaining name needs would be data loss, not deletion.
fn delete_if_unlinked(store: &Store, oid: u64) -> oubli::Result<()> {
    if store.list(ROOT_DIR)?.iter().any(|(_, t)| *t == oid) {
        return Ok(());
    }
    store.delete(oid)
}

fn lookup(g: &Global, store: &Store, name: &str) -> Result<u64, Failure> {
    let key = check_name(name)?;
    store
        .lookup(ROOT_DIR, key)
        .map_err(|e| g.fail(e))?
        .ok_or_else(|| g.fail(Error::NoName(name.to_string())))
}

/// Reads `[offset, offset+CHUNK)`; the plaintext is wiped when dropped.
fn read_chunk(store: &Store, oid: u64, offset: u64) -> oubli::Result<Zeroizing<Vec<u8>>> {
    store.read(oid, offset, CHUNK).map(Zeroizing::new)
}

/// `oubli get NAME [DST|-]`. Never writes a byte of an object that does
/// not authenticate completely: to a file through a temporary file renamed
/// at the end, to stdout after buffering or a first authenticating pass.
pub fn get(
    g: &Global,
    name: &str,
    dst: Option<&Path>,
    snapshot: Option<&str>,
) -> Result<String, Failure> {
    let session = g.open(Access::Read)?;
    let view = at_snapshot(g, &session.store, snapshot)?;
    let store = view.as_ref().unwrap_or(&session.store);
    let oid = lookup(g, store, name)?;
    let size = store.size(oid).map_err(|e| g.fail(e))?;
    if is_stdio(dst) {
        to_stdout(g, store, oid, size)?;
        Ok(String::new())
    } else {
        let path = dst.expect("not stdio");
        to_file(g, store, oid, size, path)?;
        Ok(format!(
            "wrote {name} to {} ({})\n",
            path.display(),
            ui::size(size)
        ))
    }
}

fn to_stdout(g: &Global, store: &Store, oid: u64, size: u64) -> Result<(), Failure> {
    let bar = ui::bytes_bar(Some(size), "get");
    let mut out = io::stdout().lock();
    let result = if size <= STDOUT_BUFFER {
        let mut all = Zeroizing::new(Vec::with_capacity(size as usize));
        let mut offset = 0;
        while offset < size {
            let chunk = read_chunk(store, oid, offset).map_err(|e| g.fail(e))?;
            offset += chunk.len() as u64;
            all.extend_from_slice(&chunk);
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        out.write_all(&all).and_then(|()| out.flush())
    } else {
        // Too large to hold: authenticate everything first, then stream.
        let mut offset = 0;
        while offset < size {
            offset += read_chunk(store, oid, offset).map_err(|e| g.fail(e))?.len() as u64;
        }
        bar.set_length(2 * size);
        bar.set_position(size);
        let mut offset = 0;
        let mut written = Ok(());
        while offset < size && written.is_ok() {
            let chunk = read_chunk(store, oid, offset).map_err(|e| g.fail(e))?;
            written = out.write_all(&chunk);
            offset += chunk.len() as u64;
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        written.and_then(|()| out.flush())
    };
    match result {
        // The reader went away (`oubli get x | head`): not an error of ours.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure::file("writing to stdout", e)),
        Ok(()) => Ok(()),
    }
}

fn to_file(g: &Global, store: &Store, oid: u64, size: u64, path: &Path) -> Result<(), Failure> {
    let file_name = path
        .file_name()
        .ok_or_else(|| Failure::usage(format!("{} does not name a file", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".oubli-{}.part", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Data out of a secure store is private until its owner says otherwise.
        options.mode(0o600);
    }
    let mut file = options
        .open(&tmp)
        .map_err(|e| Failure::file(format!("cannot create {}", tmp.display()), e))?;
    let bar = ui::bytes_bar(Some(size), "get");
    let copied = (|| {
        let mut offset = 0;
        while offset < size {
            let chunk = read_chunk(store, oid, offset).map_err(|e| g.fail(e))?;
            file.write_all(&chunk)
                .map_err(|e| Failure::file(format!("writing {}", tmp.display()), e))?;
            offset += chunk.len() as u64;
            bar.inc(chunk.len() as u64);
        }
        file.sync_all()
            .map_err(|e| Failure::file(format!("syncing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            Failure::file(
                format!("renaming {} to {}", tmp.display(), path.display()),
                e,
            )
        })
    })();
    bar.finish_and_clear();
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied
}

/// A read-only view of `snapshot` (`None`: read the live store).
fn at_snapshot(
    g: &Global,
    store: &Store,
    snapshot: Option<&str>,
) -> Result<Option<Store>, Failure> {
    snapshot
        .map(|s| store.snapshot(s).map_err(|e| g.fail(e)))
        .transpose()
}

/// `oubli rm NAME [--purge] [--all-snapshots] [--certificate FILE]`.
pub fn rm(
    g: &Global,
    name: &str,
    purge: bool,
    all_snapshots: bool,
    cert: &crate::cert_cmd::CertArgs,
) -> Result<String, Failure> {
    let key = check_name(name)?;
    let request = crate::cert_cmd::prepare(cert, purge)?;
    let (session, mut tally) = crate::cert_cmd::open(g, request.is_some())?;
    let store = &session.store;
    // What the certificate states: the objects and their sizes, taken
    // before they go.
    let (removed, kept_in, oids, bytes, from) = if all_snapshots {
        let gone = erase_everywhere(g, store, name, key, request.is_some())?;
        (gone.message, Vec::new(), gone.oids, gone.bytes, gone.from)
    } else {
        let bytes = match (&request, store.lookup(ROOT_DIR, key)) {
            (Some(_), Ok(Some(oid))) => crate::cert_cmd::object_bytes(store, &[oid]),
            _ => 0,
        };
        let oid = store.unlink(ROOT_DIR, key).map_err(|e| g.fail(e))?;
        delete_if_unlinked(store, oid).map_err(|e| g.fail(e))?;
        let kept_in = store.snapshots_holding(oid).map_err(|e| g.fail(e))?;
        (
            format!("removed {name}"),
            kept_in,
            vec![oid],
            bytes,
            Vec::new(),
        )
    };
    let except = match kept_in.len() {
        0 => String::new(),
        n => format!(
            ", except from {n} snapshot(s) that hold it ({}): use --all-snapshots to erase it from them too",
            kept_in.join(", ")
        ),
    };
    if purge {
        if let Some(tally) = &mut tally {
            tally.before_commit(g, &session)?;
        }
        store.commit().map_err(|e| g.fail(e))?;
        let done = if except.is_empty() {
            "its data is now unrecoverable".to_string()
        } else {
            format!("its data is now unrecoverable{except}")
        };
        let mut out = format!("{removed} and committed epoch {}: {done}\n", store.epoch());
        if let (Some(request), Some(tally)) = (request, tally) {
            use oubli::certificate::{ErasedItem, ItemKind, RetainedItem};
            // Erased only if no snapshot and no other name keeps the data.
            let mut still = Vec::new();
            for &oid in &oids {
                if store.exists(oid).map_err(|e| g.fail(e))? {
                    still.push(oid);
                }
            }
            let (items, retained) = if kept_in.is_empty() && still.is_empty() {
                let item = ErasedItem {
                    kind: ItemKind::Name,
                    name: request.name(name),
                    object_ids: oids,
                    bytes,
                    from_snapshots: from.iter().map(|s| request.name(s)).collect(),
                };
                (vec![item], Vec::new())
            } else {
                let item = RetainedItem {
                    kind: ItemKind::Name,
                    name: request.name(name),
                    object_ids: oids,
                    kept_in: kept_in.iter().map(|s| request.name(s)).collect(),
                };
                (Vec::new(), vec![item])
            };
            let command = if all_snapshots {
                "oubli rm --purge --all-snapshots"
            } else {
                "oubli rm --purge"
            };
            out += &crate::cert_cmd::finish(request, g, &session, tally, command, items, retained)?;
        }
        Ok(out)
    } else {
        store.flush().map_err(|e| g.fail(e))?;
        Ok(format!(
            "{removed}; its data is erased at the next commit (run `oubli commit` to erase it now){except}\n"
        ))
    }
}

/// What `rm --all-snapshots` removed.
struct Gone {
    message: String,
    oids: Vec<u64>,
    /// Their sizes (measured only for a certificate).
    bytes: u64,
    /// The snapshots they were removed from.
    from: Vec<String>,
}

/// `rm --all-snapshots`: the objects NAME names in the live store or in any
/// snapshot are removed everywhere — every name of theirs in the live store,
/// their data, and their entries in every snapshot (which stay otherwise
/// intact). Returns what to tell the user.
fn erase_everywhere(
    g: &Global,
    store: &Store,
    name: &str,
    key: &[u8],
    measure: bool,
) -> Result<Gone, Failure> {
    let fail = |e| g.fail(e);
    let live = store.lookup(ROOT_DIR, key).map_err(fail)?;
    let mut oids: Vec<u64> = live.into_iter().collect();
    for (_, oid) in store.lookup_in_snapshots(ROOT_DIR, key).map_err(fail)? {
        if !oids.contains(&oid) {
            oids.push(oid);
        }
    }
    if oids.is_empty() {
        return Err(g.fail(Error::NoName(format!(
            "{name} (neither in the store nor in any snapshot)"
        ))));
    }
    let bytes = if measure {
        crate::cert_cmd::object_bytes(store, &oids)
    } else {
        0
    };
    for (linked, target) in store.list(ROOT_DIR).map_err(fail)? {
        if oids.contains(&target) {
            store.unlink(ROOT_DIR, &linked).map_err(fail)?;
        }
    }
    for &oid in &oids {
        if store.exists(oid).map_err(fail)? {
            store.delete(oid).map_err(fail)?;
        }
    }
    let from = store.redact_snapshots(&oids).map_err(fail)?;
    let live = if live.is_some() { "the store and " } else { "" };
    let message = match from.len() {
        0 => format!("removed {name} from {live}no snapshot (none held it)"),
        n => format!(
            "removed {name} from {live}{n} snapshot(s) ({})",
            from.join(", ")
        ),
    };
    Ok(Gone {
        message,
        oids,
        bytes,
        from,
    })
}

#[derive(Serialize)]
struct Entry {
    name: String,
    id: u64,
    /// `None` if the name points at an object that is gone (see `oubli fsck`).
    size: Option<u64>,
    modified: Option<u64>,
}

/// `oubli ls [-l] [--json]`.
pub fn ls(g: &Global, long: bool, json: bool, snapshot: Option<&str>) -> Result<String, Failure> {
    let session = g.open(Access::Read)?;
    let view = at_snapshot(g, &session.store, snapshot)?;
    let store = view.as_ref().unwrap_or(&session.store);
    let mut names = store.list(ROOT_DIR).map_err(|e| g.fail(e))?;
    names.sort();
    let mut entries = Vec::with_capacity(names.len());
    for (name, id) in names {
        let (size, modified) = if long || json {
            match store.object(id) {
                Ok(record) => {
                    let meta = FileMeta::parse(&record.meta);
                    (Some(record.size), (meta.mtime > 0).then_some(meta.mtime))
                }
                Err(Error::NoObject(_)) => (None, None),
                Err(e) => return Err(g.fail(e)),
            }
        } else {
            (None, None)
        };
        entries.push(Entry {
            name: String::from_utf8_lossy(&name).into_owned(),
            id,
            size,
            modified,
        });
    }
    if json {
        return Ok(serde_json::to_string_pretty(&entries).expect("plain data") + "\n");
    }
    let mut out = String::new();
    for e in entries {
        if long {
            let size = e.size.map_or("(missing)".to_string(), |s| s.to_string());
            let date = e.modified.map_or("-".repeat(16), ui::date);
            out.push_str(&format!("{size:>12}  {date}  {}\n", e.name));
        } else {
            out.push_str(&e.name);
            out.push('\n');
        }
    }
    Ok(out)
}
