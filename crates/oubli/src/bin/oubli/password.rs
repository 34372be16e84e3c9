//! Where the vault password comes from: `--password-file`, then `OUBLI_PASSWORD`, then the terminal.

use crate::failure::Failure;
use oubli::exit;
use oubli::SecretBytes;
use std::io::{IsTerminal, Read};
use std::path::Path;
use zeroize::Zeroizing;

/// Environment variable holding the password (for scripts; a file is safer:
/// the environment of a process can be read by its owner's other processes).
pub const PASSWORD_ENV: &str = "OUBLI_PASSWORD";

/// Whether the password opens an existing vault or sets a new one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Open,
    Create,
}

/// Gets the password from the first source present.
pub fn obtain(file: Option<&Path>, vault: &Path, purpose: Purpose) -> Result<SecretBytes, Failure> {
    let password = if let Some(file) = file {
        from_file(file)?
    } else if let Some(value) = std::env::var_os(PASSWORD_ENV) {
        SecretBytes::new(value.into_encoded_bytes())
    } else {
        prompt(vault, purpose)?
    };
    if purpose == Purpose::Create && password.expose().is_empty() {
        return Err(Failure::usage(
            "the new vault password is empty; an empty password protects nothing",
        ));
    }
    Ok(password)
}

/// Environment variable holding the new password for `oubli vault passwd`
/// and `oubli vault move` (after `--new-password-file`, before the terminal).
pub const NEW_PASSWORD_ENV: &str = "OUBLI_NEW_PASSWORD";

/// Gets a new password: `file`, else `$OUBLI_NEW_PASSWORD`, else asked twice
/// on the terminal. Empty passwords are refused.
pub fn obtain_new(file: Option<&Path>, vault: &Path) -> Result<SecretBytes, Failure> {
    let password = if let Some(file) = file {
        from_file(file)?
    } else if let Some(value) = std::env::var_os(NEW_PASSWORD_ENV) {
        SecretBytes::new(value.into_encoded_bytes())
    } else {
        prompt(vault, Purpose::Create).map_err(|f| {
            if f.message.starts_with("no password given") {
                Failure::new(
                    exit::USAGE,
                    "no new password given and no terminal to ask for one",
                    format!("pass --new-password-file FILE or set {NEW_PASSWORD_ENV}"),
                )
            } else {
                f
            }
        })?
    };
    if password.expose().is_empty() {
        return Err(Failure::usage(
            "the new vault password is empty; an empty password protects nothing",
        ));
    }
    Ok(password)
}

/// The first line of `path`, without its line ending. A file other users
/// can read or write draws a warning (not a refusal: it may be all a boot
/// script has), checked on the file as opened.
fn from_file(path: &Path) -> Result<SecretBytes, Failure> {
    let unreadable = |e: std::io::Error| {
        Failure::new(
            exit::USAGE,
            format!("cannot read password file {}: {e}", path.display()),
            "check --password-file",
        )
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if let Some(warning) = crate::privacy::secret_file_warning("password file", path, &meta) {
        eprintln!("oubli: {warning}");
    }
    // Room for it all at once, as fs::read makes: a buffer that grew would
    // leave copies of the password behind in the memory it gave up.
    let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len() as usize + 1));
    file.read_to_end(&mut bytes).map_err(unreadable)?;
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    Ok(SecretBytes::new(line.to_vec()))
}

/// Asks on the terminal, twice for a new password.
fn prompt(vault: &Path, purpose: Purpose) -> Result<SecretBytes, Failure> {
    // Ask only when a person is plausibly there: a script with no terminal
    // gets a clear error instead of a hang. rpassword reads /dev/tty, so a
    // piped stdin (`oubli put NAME - < file`) still works interactively.
    let interactive = std::io::stdin().is_terminal() || std::io::stderr().is_terminal();
    if !interactive || std::fs::File::open("/dev/tty").is_err() {
        return Err(no_source());
    }
    let ask = |text: String| -> Result<SecretBytes, Failure> {
        rpassword::prompt_password(text)
            .map(|s| SecretBytes::new(s.into_bytes()))
            .map_err(|_| no_source())
    };
    match purpose {
        Purpose::Open => ask(format!("Password for vault {}: ", vault.display())),
        Purpose::Create => {
            let first = ask(format!("New password for vault {}: ", vault.display()))?;
            let again = ask("Repeat the password: ".to_string())?;
            if first != again {
                return Err(Failure::new(
                    exit::USAGE,
                    "the two passwords differ",
                    "run the command again and type the same password twice",
                ));
            }
            Ok(first)
        }
    }
}

fn no_source() -> Failure {
    Failure::new(
        exit::USAGE,
        "no password given and no terminal to ask for one",
        format!("pass --password-file FILE (first line is the password) or set {PASSWORD_ENV}"),
    )
}
