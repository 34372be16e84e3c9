//! The `oubli` command: a store in a directory whose deletions become unrecoverable at each commit.
//!
//! Thin by design: each command opens the store, calls the library, prints
//! the result and maps errors to the exit codes of docs/CLI.md
//! (`oubli::exit`). Results go to stdout, errors and progress to stderr.

mod admin;
mod audit;
mod cert_cmd;
mod data;
mod failure;
mod fstab;
mod mount;
mod nand;
mod password;
mod privacy;
mod serve;
mod session;
mod share_cmd;
mod snapshot_cmd;
mod ui;
mod vault_cmd;

use clap::{Parser, Subcommand};
use failure::Failure;
use session::Global;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const AFTER_HELP: &str = "\
Password: --password-file FILE (first line), else $OUBLI_PASSWORD, else asked on the terminal.

Exit codes: 0 success; 1 unexpected error; 2 usage error; 3 no such name; 4 already exists;
5 wrong password; 6 vault missing, corrupted, unreachable or another store's; 7 integrity
failure or fsck problems; 8 no store at --store; 9 medium I/O error or full; 10 audit found
deleted data still recoverable; 11 store in use by another process. See docs/CLI.md.";

#[derive(Parser)]
#[command(
    name = "oubli",
    version,
    about = "Storage in which deleting data makes it cryptographically unrecoverable",
    long_about = "Storage in which deleting data makes it cryptographically unrecoverable.\n\n\
        Every piece of data is encrypted under its own key; the keys form a tree sealed by \
        an epoch key kept in a vault. `oubli commit` replaces the vault's key: everything \
        deleted before it becomes unreadable, even from old copies of the store (backups, \
        snapshots, what an SSD keeps behind).",
    after_help = AFTER_HELP
)]
struct Cli {
    /// The store directory, s3://BUCKET/PREFIX for a store in an S3 bucket (endpoint and credentials from AWS_* variables or ~/.aws), or nand:IMAGE for a store on a simulated raw NAND chip [default: $XDG_DATA_HOME/oubli/store or ~/.local/share/oubli/store]
    #[arg(long, global = true, env = "OUBLI_STORE", value_name = "PATH")]
    store: Option<PathBuf>,
    /// The vault: a file path, tpm:TCTI, a pkcs11: URI, or `nand` (in the chip of a nand:IMAGE store) [default: $XDG_CONFIG_HOME/oubli/vault or ~/.config/oubli/vault]
    #[arg(long, global = true, env = "OUBLI_VAULT", value_name = "ADDRESS")]
    vault: Option<PathBuf>,
    /// Read the vault password from the first line of FILE
    #[arg(long, global = true, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// What mount and serve do when the vault cannot take a commit
    #[arg(
        long,
        global = true,
        env = "OUBLI_ON_VAULT_FAILURE",
        value_name = "POLICY",
        value_enum,
        default_value = "keep-open"
    )]
    on_vault_failure: session::OnVaultFailure,
    /// How often the intent log's tally catches up with its frames:
    /// `every-flush`, or SECONDS (mount and serve)
    #[arg(
        long,
        global = true,
        env = "OUBLI_LOG_TALLY",
        value_name = "WHEN",
        value_parser = session::parse_log_tally,
        default_value = "1"
    )]
    log_tally: oubli::TallyCadence,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new store and its vault
    Init {
        /// Unit of encryption and erasure for data: a power of two from 4K to 1M (4K for a block device)
        #[arg(long, value_name = "SIZE", default_value_t = oubli::DEFAULT_CELL_SIZE, value_parser = ui::parse_cell_size)]
        cell_size: u32,
        /// Where unit keys live: parent-pointer (each key in its parent), keyed-hash-forest (derived from a forest of roots, Lethe), key-storage-area (an array of key positions, DNEFS)
        #[arg(long, value_name = "SCHEME", default_value = "parent-pointer", value_parser = ui::parse_key_scheme)]
        key_scheme: u8,
        /// Argon2id memory for the password key, in MiB
        #[arg(long, value_name = "MIB", default_value_t = 64)]
        kdf_memory: u32,
        /// Argon2id passes for the password key
        #[arg(long, value_name = "N", default_value_t = 3)]
        kdf_iterations: u32,
        /// Shape of the chip of a new `--store nand:IMAGE`: page size, pages per erase block, erase blocks and, optionally, out-of-band bytes per page
        #[arg(long, value_name = "PAGExPAGESxBLOCKS[xOOB]", default_value = "2048x64x2048x64", value_parser = oubli_nand::parse_geometry)]
        nand_geometry: oubli_nand::Geometry,
    },
    /// Store data under NAME (replacing what NAME held), from SRC or stdin
    Put {
        name: String,
        /// File to read, or - for stdin [default: -]
        #[arg(value_name = "SRC|-")]
        src: Option<PathBuf>,
        /// Place the data under this key share (destroying the share erases it)
        #[arg(long, value_name = "SHARE")]
        share: Option<String>,
    },
    /// Write the data stored under NAME to DST or stdout
    Get {
        name: String,
        /// File to write (replaced atomically), or - for stdout [default: -]
        #[arg(value_name = "DST|-")]
        dst: Option<PathBuf>,
        /// Read NAME as it was in this snapshot
        #[arg(long, value_name = "SNAP")]
        snapshot: Option<String>,
    },
    /// Remove NAME; its data is erased at the next commit (except from snapshots that hold it)
    Rm {
        name: String,
        /// Commit at once, so that the data is unrecoverable when the command returns
        #[arg(long)]
        purge: bool,
        /// Also remove NAME (and its data) from every snapshot that holds it
        #[arg(long)]
        all_snapshots: bool,
        #[command(flatten)]
        cert: cert_cmd::CertArgs,
    },
    /// List the stored names
    Ls {
        /// Show size and modification time
        #[arg(short = 'l')]
        long: bool,
        /// Print JSON (always with sizes and times)
        #[arg(long)]
        json: bool,
        /// List the names of this snapshot
        #[arg(long, value_name = "SNAP")]
        snapshot: Option<String>,
    },
    /// Keep read-only versions of the whole store, list and remove them
    #[command(subcommand)]
    Snapshot(snapshot_cmd::SnapshotCommand),
    /// Key shares: second secrets in their own vaults, destroyed out of band
    #[command(subcommand)]
    Share(share_cmd::ShareCommand),
    /// On a live mount: erase a file or directory from the store and from every snapshot
    Redact {
        /// The file or directory, inside the mount (or its copy under MOUNTPOINT/.snapshots/SNAP/)
        path: PathBuf,
        /// The mount point [default: the oubli mount that holds PATH]
        mountpoint: Option<PathBuf>,
        /// Commit at once, so that the data is unrecoverable when the command returns
        #[arg(long)]
        purge: bool,
        #[command(flatten)]
        cert: cert_cmd::CertArgs,
    },
    /// End the epoch now: everything deleted so far becomes unrecoverable
    #[command(visible_alias = "purge")]
    Commit {
        /// A live `oubli mount`: commit the store mounted there (instead of --store)
        mountpoint: Option<PathBuf>,
        #[command(flatten)]
        cert: cert_cmd::CertArgs,
    },
    /// Show the epoch, pending deletions, space and vault
    Status {
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Refresh every --interval seconds until interrupted (in place on a terminal), with the write rate
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// Seconds between refreshes of --watch
        #[arg(long, value_name = "SECS", default_value_t = 2, requires = "watch")]
        interval: u64,
        /// A live `oubli mount`: the store mounted there (instead of --store)
        mountpoint: Option<PathBuf>,
    },
    /// Reclaim space from segments that are mostly dead (commits)
    Gc {
        /// Clean segments whose live share is below this fraction
        #[arg(long, default_value_t = 0.5)]
        threshold: f64,
        /// On a store in a versioned S3 bucket, also delete the old versions the
        /// bucket keeps of the store's objects (ciphertext under dead keys: only
        /// space is at stake)
        #[arg(long)]
        purge_versions: bool,
        /// First re-seal the live data under fresh keys, so that a keyed hash
        /// forest fragmented by deletions shrinks back to few roots (reads and
        /// rewrites all live data; nothing to do under parent-pointer)
        #[arg(long)]
        consolidate_keys: bool,
    },
    /// Try to recover deleted data as an adversary would, and give a verdict (exit 10 on a leak)
    Audit {
        /// An old copy of the store directory the adversary also holds (backup, snapshot); repeatable
        #[arg(long = "with-copy", value_name = "DIR")]
        with_copy: Vec<PathBuf>,
        /// An old copy of the vault file the adversary also holds; repeatable
        #[arg(long = "with-vault-copy", value_name = "FILE")]
        with_vault_copy: Vec<PathBuf>,
        /// On S3: every version the bucket kept of every object of the store, as the provider holds them
        #[arg(long)]
        with_versions: bool,
        /// Instead: list the blocks the file system on --export has free but the store still holds (exit 10 if any); the store must not be served
        #[arg(long, value_name = "FS", value_enum, requires = "export")]
        fs: Option<audit::FsArg>,
        /// The export whose file system --fs reads
        #[arg(long, value_name = "NAME", requires = "fs")]
        export: Option<String>,
        /// With --fs: drop those blocks at once (as a TRIM would) and commit
        #[arg(long, requires = "fs")]
        erase: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Read and authenticate everything in the store (exit 7 on problems)
    Fsck {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Serve an export as an NBD block device, in the foreground; TRIM erases at the next commit
    Serve(serve::ServeArgs),
    /// Mount the store as a file system (FUSE) in which rm, truncate and overwrite erase at the next commit
    Mount(mount::MountArgs),
    /// Show the vault, change its password, or move the store to another vault
    #[command(subcommand)]
    Vault(vault_cmd::VaultCommand),
    /// Unmount a mounted store: commits, so that everything deleted is unrecoverable
    Umount(mount::UmountArgs),
    /// Certificates of sanitization: check one (against the store too), show one as text or HTML
    #[command(subcommand)]
    Certificate(cert_cmd::CertificateCommand),
    /// Write the man pages and shell completions under DIR (as under /usr/local/share)
    #[command(hide = true)]
    Generate { dir: PathBuf },
}

/// What this build can do: `+tpm`, `-tpm`, ... (`oubli --version`, certificates).
pub fn features() -> Vec<String> {
    let features = [
        (cfg!(feature = "tpm"), "tpm"),
        (true, "pkcs11"),
        (true, "fuse"),
        (true, "nbd"),
        (true, "nbd-tls"),
    ];
    features
        .iter()
        .map(|(on, name)| format!("{}{name}", if *on { '+' } else { '-' }))
        .collect()
}

/// `oubli --version`: the version, what this build can do, and the crypto provider.
fn long_version() -> String {
    let features = features();
    format!(
        "{}\nfeatures: {}\ncrypto provider: {} (passwords: Argon2id)",
        env!("CARGO_PKG_VERSION"),
        features.join(" "),
        session::provider().name()
    )
}

/// `oubli generate DIR`: the man pages (`oubli(1)` and one per subcommand,
/// `oubli-mount(1)`, ...) and the bash, zsh and fish completions, from the
/// same clap definitions as the command itself, laid out as under
/// `/usr/local/share` (the repository keeps a copy in `share/`, which the
/// tests check is current and `scripts/install` copies).
fn generate(dir: &std::path::Path) -> Result<String, Failure> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    let man = dir.join("man/man1");
    let completions = [
        (Shell::Bash, "bash-completion/completions", "oubli"),
        (Shell::Zsh, "zsh/site-functions", "_oubli"),
        (Shell::Fish, "fish/vendor_completions.d", "oubli.fish"),
    ];
    let write = |path: std::path::PathBuf, bytes: Vec<u8>| {
        std::fs::create_dir_all(path.parent().expect("a file in a directory"))
            .and_then(|()| std::fs::write(&path, bytes))
            .map_err(|e| Failure::file(format!("writing {}", path.display()), e))
    };
    std::fs::create_dir_all(&man)
        .map_err(|e| Failure::file(format!("creating {}", man.display()), e))?;
    clap_mangen::generate_to(Cli::command(), &man)
        .map_err(|e| Failure::file(format!("writing man pages in {}", man.display()), e))?;
    for (shell, sub, file) in completions {
        let mut out = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "oubli", &mut out);
        write(dir.join(sub).join(file), out)?;
    }
    Ok(format!(
        "wrote man pages and completions under {}\n",
        dir.display()
    ))
}

/// Writes a command's output to stdout. A closed pipe (`oubli ls | head`)
/// ends the output quietly instead of failing.
pub fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::file("writing to stdout", e))
        }
        _ => Ok(()),
    }
}

fn run(cli: Cli) -> Result<String, Failure> {
    // `certificate verify` checks against the store only when told which.
    let store_given = cli.store.is_some();
    let g = Global::new(
        cli.store,
        cli.vault,
        cli.password_file,
        cli.on_vault_failure,
        cli.log_tally,
    )?;
    match cli.command {
        Command::Init {
            cell_size,
            key_scheme,
            kdf_memory,
            kdf_iterations,
            nand_geometry,
        } => admin::init(
            &g,
            oubli::CreateOptions {
                cell_size,
                key_scheme,
            },
            kdf_memory,
            kdf_iterations,
            nand_geometry,
        ),
        Command::Put { name, src, share } => data::put(&g, &name, src.as_deref(), share.as_deref()),
        Command::Get {
            name,
            dst,
            snapshot,
        } => data::get(&g, &name, dst.as_deref(), snapshot.as_deref()),
        Command::Rm {
            name,
            purge,
            all_snapshots,
            cert,
        } => data::rm(&g, &name, purge, all_snapshots, &cert),
        Command::Ls {
            long,
            json,
            snapshot,
        } => data::ls(&g, long, json, snapshot.as_deref()),
        Command::Snapshot(command) => snapshot_cmd::run(&g, command),
        Command::Share(command) => share_cmd::run(&g, command),
        Command::Redact {
            path,
            mountpoint,
            purge,
            cert,
        } => snapshot_cmd::redact(&g, &path, mountpoint.as_deref(), purge, &cert),
        Command::Commit { mountpoint, cert } => {
            admin::commit(&g.at_mount(mountpoint.as_deref())?, &cert)
        }
        Command::Status {
            json: _,
            watch: true,
            interval,
            mountpoint,
        } => admin::watch(&g.at_mount(mountpoint.as_deref())?, interval),
        Command::Status {
            json, mountpoint, ..
        } => admin::status(&g.at_mount(mountpoint.as_deref())?, json),
        Command::Gc {
            threshold,
            purge_versions,
            consolidate_keys,
        } => admin::gc(&g, threshold, purge_versions, consolidate_keys),
        Command::Audit {
            fs: Some(fs),
            export: Some(export),
            erase,
            json,
            ..
        } => audit::fs_audit(&g, fs, &export, erase, json),
        Command::Audit {
            with_copy,
            with_vault_copy,
            with_versions,
            json,
            ..
        } => audit::audit(&g, &with_copy, with_versions, &with_vault_copy, json),
        Command::Fsck { json } => admin::fsck(&g, json),
        Command::Serve(args) => serve::serve(&g, args),
        Command::Mount(args) => mount::mount(&g, args),
        Command::Umount(args) => mount::umount(&g, args),
        Command::Vault(command) => vault_cmd::run(&g, command),
        Command::Certificate(command) => cert_cmd::run(&g, store_given, command),
        Command::Generate { dir } => generate(&dir),
    }
}

/// Keeps the keys this process will hold out of reach of other processes:
/// no core dump (`RLIMIT_CORE` 0) and not dumpable, which also makes
/// `/proc/PID/environ` (where `OUBLI_PASSWORD` may be), `/proc/PID/mem` and
/// ptrace unavailable to other processes of the same user. Done first, for
/// every command, before anything secret is read.
fn protect_process() {
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: FFI calls that only change this process's own attributes; the
    // one pointer is to a local that outlives the call. Failures are not
    // fatal (a sandbox may forbid them) and leave the defaults in place.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    protect_process();
    // clap prints usage errors itself and exits with 2, as docs/CLI.md says.
    // As mount(8)'s helper, success is silent, as for every file system.
    let quiet = fstab::called_as_mount_helper();
    if let Some(done) = fstab::remount_if_asked(&std::env::args_os().collect::<Vec<_>>()) {
        return match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("mount.fuse.oubli: {message}");
                ExitCode::from(oubli::exit::UNEXPECTED as u8)
            }
        };
    }
    let cli = {
        use clap::{CommandFactory, FromArgMatches};
        let version: &'static str = Box::leak(long_version().into_boxed_str());
        let args = match fstab::as_mount_helper(std::env::args_os().collect()) {
            Ok(args) => args,
            Err(message) => {
                eprintln!("mount.fuse.oubli: {message}");
                return ExitCode::from(oubli::exit::USAGE as u8);
            }
        };
        let matches = Cli::command().long_version(version).get_matches_from(args);
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    };
    match run(cli).and_then(|out| if quiet { Ok(()) } else { emit(&out) }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            ExitCode::from(u8::try_from(failure.code).unwrap_or(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
