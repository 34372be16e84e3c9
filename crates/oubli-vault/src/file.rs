//! `FileVault`: the epoch key in one password-protected file with two A/B record slots.
//!
//! A file on a modern SSD or a journaling/copy-on-write file system does not
//! honour overwrites: old slot contents may survive in remapped flash pages,
//! the journal or snapshots. This vault is the default because it needs no
//! hardware, not because its erasure is real; [`VaultInfo::overwrite_is_erasure`]
//! says so. See docs/FORMAT-vault.md.

use crate::format::{parse_slot, seal_slot, Slot, SlotFault, FILE_LEN, SLOT_COUNT, SLOT_STRIDE};
use crate::kdf::KdfParams;
use crate::sealed::{self, Current, KekState};
use crate::{RotationHook, RotationStep};
use oubli_core::{Vault, VaultError, VaultInfo, VaultRecord};
use oubli_crypto::{CryptoProvider, SecretBytes};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(test)]
mod tests;

/// Where a replace stops early, to simulate a power cut in tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
enum Crash {
    Never,
    /// Only the first `n` bytes of the new slot reach the file.
    TornNewSlot(usize),
    /// The new slot is durable, the old one not yet erased.
    BeforeErase,
}

/// The default vault: one file, two fixed 4 KiB slots (A at 0, B at 4096).
///
/// Each slot holds a full record sealed under a key derived from the
/// password (Argon2id) and a per-record nonce; a replace writes the slot not
/// holding the current record with the next generation, syncs, then zeroes
/// the old slot and syncs again. A read takes the readable slot with the
/// highest generation that authenticates.
///
/// One handle serializes its own operations; the file is not locked against
/// other processes (the engine's store lock is expected to guarantee a
/// single writer).
pub struct FileVault {
    path: PathBuf,
    provider: Arc<dyn CryptoProvider>,
    state: Mutex<KekState>,
    hook: Mutex<Option<RotationHook>>,
}

impl std::fmt::Debug for FileVault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileVault")
            .field("path", &self.path)
            .field("provider", &self.provider.name())
            .field("kek", &"<redacted>")
            .finish()
    }
}

fn invalid_input(msg: String) -> VaultError {
    VaultError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

fn slot_name(index: usize) -> String {
    format!("slot {}", ['A', 'B'][index])
}

impl FileVault {
    /// Creates a new vault file at `path` holding `record` in slot A.
    ///
    /// Fails if anything exists at `path`. The file (mode 0600 on Unix) and
    /// its directory entry are synced before returning. `params` are checked
    /// against [`KdfParams::validate`]; use [`KdfParams::default`] for real
    /// vaults.
    pub fn create(
        path: impl AsRef<Path>,
        password: &SecretBytes,
        params: KdfParams,
        record: &VaultRecord,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<FileVault, VaultError> {
        let path = path.as_ref().to_path_buf();
        params.validate().map_err(invalid_input)?;
        let state = KekState::fresh(password, params, &*provider)?;
        let header = sealed::first_header(&state, &*provider);
        let mut contents = seal_slot(&*provider, &state.kek, &header, record);
        contents.resize(FILE_LEN, 0);

        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            // The file is sealed, but offline guessing needs only a copy of it.
            options.mode(0o600);
        }
        let mut file = options.open(&path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                VaultError::Io(io::Error::new(
                    e.kind(),
                    format!("{} already exists", path.display()),
                ))
            } else {
                VaultError::Io(e)
            }
        })?;
        let written = file
            .write_all(&contents)
            .and_then(|()| file.sync_all())
            .and_then(|()| sync_parent_dir(&path));
        if let Err(e) = written {
            // Create never returned Ok: leave no half-written vault behind
            // that would make a retry fail with "already exists".
            drop(file);
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }

        let vault = FileVault {
            path,
            provider,
            state: Mutex::new(state),
            hook: Mutex::new(None),
        };
        // Read back: proves the bytes on disk open with this password.
        vault.load()?;
        Ok(vault)
    }

    /// Opens an existing vault, deriving the key-encryption key from
    /// `password` once and checking it by loading the record.
    ///
    /// If the two slots carry different salts (a password change was cut
    /// short), either the old or the new password opens the vault.
    pub fn open(
        path: impl AsRef<Path>,
        password: &SecretBytes,
        provider: Arc<dyn CryptoProvider>,
    ) -> Result<FileVault, VaultError> {
        let path = path.as_ref().to_path_buf();
        let bytes = read_vault_file(&path)?;
        let slots = parse_slots(&bytes);
        let place = path.display().to_string();
        let state = sealed::unlock(&place, &slots, &slot_name, password, &*provider)?;
        Ok(FileVault {
            path,
            provider,
            state: Mutex::new(state),
            hook: Mutex::new(None),
        })
    }

    /// The vault file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The Argon2id parameters this handle's password key was derived with.
    pub fn kdf_params(&self) -> KdfParams {
        self.lock().params
    }

    /// Called at each step of a rotation (as for the TPM and PKCS#11
    /// vaults): an `Err` stops the rotation there, as a power cut would.
    pub fn set_rotation_hook(&self, hook: Option<RotationHook>) {
        *self.hook.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }

    fn call_hook(&self, step: RotationStep) -> Result<(), VaultError> {
        let hook = self.hook.lock().unwrap_or_else(|e| e.into_inner()).clone();
        hook.map_or(Ok(()), |h| h(step))
    }

    /// Generation of the current record (1 after create, +1 per replace).
    pub fn generation(&self) -> Result<u64, VaultError> {
        let state = self.lock();
        Ok(self.current(&state)?.header.generation)
    }

    /// Re-seals the current record under `new_password` with a fresh salt and
    /// `params`, by the same two-slot replace as [`store`](Vault::store): a
    /// power cut leaves a vault that opens with the old or the new password.
    /// After `Ok`, only the new password opens it.
    pub fn change_password(
        &self,
        new_password: &SecretBytes,
        params: KdfParams,
    ) -> Result<(), VaultError> {
        self.change_password_inner(new_password, params, Crash::Never)
    }

    fn change_password_inner(
        &self,
        new_password: &SecretBytes,
        params: KdfParams,
        crash: Crash,
    ) -> Result<(), VaultError> {
        params.validate().map_err(invalid_input)?;
        let mut state = self.lock();
        let current = self.current(&state)?;
        let new_state = KekState::fresh(new_password, params, &*self.provider)?;
        let header = sealed::next_header(&current, &new_state, &*self.provider)?;
        let region = seal_slot(&*self.provider, &new_state.kek, &header, &current.record);
        self.replace(current.index, &region, crash, || *state = new_state)
    }

    fn store_inner(&self, record: &VaultRecord, crash: Crash) -> Result<(), VaultError> {
        let state = self.lock();
        let current = self.current(&state)?;
        sealed::check_same_store(&self.path.display().to_string(), &current, record)?;
        let header = sealed::next_header(&current, &state, &*self.provider)?;
        let region = seal_slot(&*self.provider, &state.kek, &header, record);
        self.replace(current.index, &region, crash, || ())
    }

    /// The replace protocol. `on_durable` runs once the new slot is synced,
    /// i.e. from the moment a read would return it.
    fn replace(
        &self,
        current_index: usize,
        new_region: &[u8],
        crash: Crash,
        on_durable: impl FnOnce(),
    ) -> Result<(), VaultError> {
        let target = 1 - current_index;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(|e| self.map_open_error(e))?;

        // Step 1: the new record goes to the slot that does not hold the
        // current one, so the current one stays readable until the new one
        // is durable. Its higher generation makes it win from then on.
        // (sync_all rather than sync_data: the length never changes, but the
        // file is too small for the stronger flush to cost anything.)
        self.call_hook(RotationStep::Start)?;
        if let Crash::TornNewSlot(n) = crash {
            write_at(&mut file, target * SLOT_STRIDE, &new_region[..n]).map_err(io_error)?;
            file.sync_all().map_err(io_error)?;
            return Err(simulated_crash());
        }
        write_at(&mut file, target * SLOT_STRIDE, new_region).map_err(io_error)?;
        file.sync_all().map_err(io_error)?;
        on_durable();
        if crash == Crash::BeforeErase {
            return Err(simulated_crash());
        }
        self.call_hook(RotationStep::NewRecordWritten)?;

        // Step 2: only now overwrite the old record. If this fails the old
        // slot may survive, so the replace is reported as failed even though
        // reads already return the new record (`erase_leftovers` finishes).
        zero_slots(&mut file, &[current_index])?;
        self.call_hook(RotationStep::OldRecordCleared)
    }

    fn lock(&self) -> MutexGuard<'_, KekState> {
        // A panic while holding the lock cannot leave the KEK half-updated
        // (it is replaced in one assignment) and the file is crash-safe by
        // construction, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn map_open_error(&self, e: io::Error) -> VaultError {
        if e.kind() == io::ErrorKind::NotFound {
            VaultError::Missing(self.path.display().to_string())
        } else {
            io_error(e)
        }
    }

    /// Reads the file and finds the newest slot this handle's KEK opens.
    fn current(&self, state: &KekState) -> Result<Current, VaultError> {
        let bytes = read_vault_file(&self.path)?;
        let slots = parse_slots(&bytes);
        let place = self.path.display().to_string();
        sealed::current(&place, &slots, &slot_name, state, &*self.provider)
    }
}

impl Vault for FileVault {
    fn info(&self) -> VaultInfo {
        VaultInfo {
            kind: "file".into(),
            location: self.path.display().to_string(),
            endurance_writes: None,
            // A stand-in: SSD remapping, journals and snapshots may keep the
            // old slot's bytes after they are overwritten.
            overwrite_is_erasure: false,
        }
    }

    fn load(&self) -> Result<VaultRecord, VaultError> {
        let state = self.lock();
        Ok(self.current(&state)?.record)
    }

    fn store(&self, record: &VaultRecord) -> Result<(), VaultError> {
        self.store_inner(record, Crash::Never)
    }

    fn write_count(&self) -> Result<u64, VaultError> {
        let state = self.lock();
        Ok(self.current(&state)?.header.write_count)
    }

    fn readable_records(&self) -> Result<Vec<VaultRecord>, VaultError> {
        let state = self.lock();
        let bytes = read_vault_file(&self.path)?;
        Ok(sealed::readable_records(
            &parse_slots(&bytes),
            &state,
            &*self.provider,
        ))
    }

    /// Zeroes every slot but the current one that is not zeros already (a
    /// clean vault is not written: no wear, no mtime change).
    fn erase_leftovers(&self) -> Result<(), VaultError> {
        let state = self.lock();
        let bytes = read_vault_file(&self.path)?;
        let current = self.current(&state)?;
        let region = |i: usize| &bytes[i * SLOT_STRIDE..(i + 1) * SLOT_STRIDE];
        let stale = sealed::leftover_indices(
            &self.path.display().to_string(),
            &parse_slots(&bytes),
            &current,
            &|i| region(i).iter().all(|&b| b == 0),
        )?;
        if stale.is_empty() {
            return Ok(());
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(|e| self.map_open_error(e))?;
        zero_slots(&mut file, &stale)
    }
}

/// Overwrites the slots at `indices` with zeros and syncs.
fn zero_slots(file: &mut File, indices: &[usize]) -> Result<(), VaultError> {
    for &i in indices {
        write_at(file, i * SLOT_STRIDE, &[0u8; SLOT_STRIDE]).map_err(io_error)?;
    }
    file.sync_all().map_err(io_error)
}

fn read_vault_file(path: &Path) -> Result<Vec<u8>, VaultError> {
    let bytes = std::fs::read(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            VaultError::Missing(path.display().to_string())
        } else {
            io_error(e)
        }
    })?;
    // The length never changes after create, so any other length means the
    // file was truncated or is not a vault.
    if bytes.len() != FILE_LEN {
        return Err(VaultError::Corrupt(format!(
            "{} is {} bytes long, expected {FILE_LEN}",
            path.display(),
            bytes.len()
        )));
    }
    Ok(bytes)
}

fn parse_slots(bytes: &[u8]) -> [Result<Slot, SlotFault>; SLOT_COUNT] {
    std::array::from_fn(|i| parse_slot(&bytes[i * SLOT_STRIDE..(i + 1) * SLOT_STRIDE]))
}

/// Classifies an I/O error on the vault file: a device or file system that
/// went away (a USB stick pulled, a network mount lost, a file system
/// remounted read-only after errors) is `Unavailable` — the engine keeps the
/// epoch open and retries — and anything else stays an I/O error.
fn io_error(e: io::Error) -> VaultError {
    use io::ErrorKind as K;
    // EIO, ENXIO, ENODEV: the same numbers on Linux and the BSDs.
    let device_gone = cfg!(unix) && matches!(e.raw_os_error(), Some(5 | 6 | 19));
    if device_gone
        || matches!(
            e.kind(),
            K::NotConnected
                | K::TimedOut
                | K::Interrupted
                | K::StaleNetworkFileHandle
                | K::ReadOnlyFilesystem
                | K::ResourceBusy
        )
    {
        VaultError::Unavailable(format!("vault file: {e}"))
    } else {
        VaultError::Io(e)
    }
}

fn write_at(file: &mut File, offset: usize, bytes: &[u8]) -> io::Result<()> {
    file.seek(SeekFrom::Start(offset as u64))?;
    file.write_all(bytes)
}

/// Makes the new directory entry durable (otherwise a crash right after
/// create could lose the whole file on some file systems).
fn sync_parent_dir(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

fn simulated_crash() -> VaultError {
    VaultError::Io(io::Error::other("simulated power cut"))
}
