//! What the oubli benchmarks share: JSON-line output and statistics (`report`), the timed medium, stores and payloads, plain-file baselines, and size arguments.

pub mod plain;
pub mod report;
pub mod store;
pub mod timed;

/// The `main` of a benchmark binary: parses the arguments (an empty error
/// means `--help` was asked for), runs, and turns errors into exit codes.
pub fn main_of<C>(
    name: &str,
    help: &str,
    parse: fn(Vec<String>) -> Result<C, String>,
    run: fn(&C) -> store::BoxResult<()>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let config = match parse(std::env::args().skip(1).collect()) {
        Ok(c) => c,
        Err(e) if e.is_empty() => {
            print!("{help}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{name}: {e}\n\n{help}");
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Command-line arguments taken one by one: a flag, then its value if it has one.
pub struct Args(std::vec::IntoIter<String>);

impl Args {
    pub fn new(args: Vec<String>) -> Args {
        Args(args.into_iter())
    }

    /// The next argument (a flag or a positional one).
    pub fn next_arg(&mut self) -> Option<String> {
        self.0.next()
    }

    /// The value that follows `flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.0.next().ok_or_else(|| format!("{flag} needs a value"))
    }

    /// The whole number that follows `flag`.
    pub fn number(&mut self, flag: &str) -> Result<u64, String> {
        let v = self.value(flag)?;
        v.parse().map_err(|_| format!("{flag}: bad number {v:?}"))
    }
}

/// A size with an optional binary suffix: `4096`, `1.5K`, `100M`, `100MiB`, `2G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s
        .trim()
        .trim_end_matches(['B', 'b'])
        .trim_end_matches(['i', 'I']);
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {s:?} (e.g. 100M, 2G)"))?;
    if n < 0.0 {
        return Err(format!("bad size {s:?}"));
    }
    Ok((n * mult as f64) as u64)
}

/// Bytes available to an unprivileged user on the file system holding `path`.
pub fn free_space(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs only writes into the zeroed struct we pass; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("100MiB").unwrap(), 100 << 20);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
    }
}
