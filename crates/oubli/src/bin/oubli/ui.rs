//! Small presentation helpers: progress bars on a terminal, human-readable sizes and dates.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Work smaller than this finishes before a bar is worth drawing.
const BAR_THRESHOLD: u64 = 8 << 20;

/// A progress bar on stderr for `total` bytes of work (`None`: unknown, a
/// spinner), drawn only when stderr is a terminal and the work is large —
/// scripts and logs never see it.
pub fn bytes_bar(total: Option<u64>, message: &'static str) -> ProgressBar {
    let worth_it = total.is_none_or(|t| t >= BAR_THRESHOLD);
    if !worth_it || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => (
            ProgressBar::new(total),
            "{msg} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{msg} {spinner} {bytes} {bytes_per_sec}",
        ),
    };
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(message);
    bar
}

/// A spinner with the elapsed time for work of unknown length (gc, audit,
/// vault move), on a terminal only; cleared when dropped.
pub fn spinner(message: &'static str) -> Spinner {
    if !std::io::stderr().is_terminal() {
        return Spinner(ProgressBar::hidden());
    }
    let bar = ProgressBar::new_spinner();
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg} {spinner} {elapsed}").expect("static template"),
    );
    bar.set_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    Spinner(bar)
}

/// A running [`spinner`]: the line goes away when the work is done.
pub struct Spinner(ProgressBar);

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// `1536` → `1.5 KiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `3725` → `1h 2m 5s`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m {s}s"),
        _ => format!("{d}d {h}h {m}m"),
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM` (UTC).
pub fn date(secs: u64) -> String {
    let t = oubli::clock::utc(secs);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        t.year, t.month, t.day, t.hour, t.minute
    )
}

pub use oubli::clock::now;

/// Parses `4096`, `64K`, `512M`, `1G`, `2T` (binary multiples; `KiB`, `MB`... accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let shift = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("unknown unit in {s:?} (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Parses `90s`, `15m`, `12h`, `30d`, `2w` (a bare number is seconds) into seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a duration: {s:?} (e.g. 90m, 12h, 30d)"))?;
    let per = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("unknown unit in {s:?} (use s, m, h, d or w)")),
    };
    match n.checked_mul(per) {
        Some(0) => Err(format!("duration {s:?} is zero")),
        Some(secs) => Ok(secs),
        None => Err(format!("duration {s:?} is too long")),
    }
}

/// `--cell-size`: a size as [`parse_size`] reads it (`4K`, `32768`), within a `u32`.
pub fn parse_cell_size(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size(s)?).map_err(|_| format!("cell size {s:?} is too large"))
}

/// A scheme id's name.
pub fn key_scheme_name(id: u8) -> &'static str {
    oubli::crates::crypto::scheme_name(id).unwrap_or("unknown")
}

/// `--key-scheme`: a scheme's name, as the superblock's id.
pub fn parse_key_scheme(s: &str) -> Result<u8, String> {
    oubli::SCHEME_NAMES
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, id)| *id)
        .ok_or_else(|| {
            let names: Vec<&str> = oubli::SCHEME_NAMES.iter().map(|(n, _)| *n).collect();
            format!("unknown key scheme {s:?} (one of: {})", names.join(", "))
        })
}

/// The words `status` and `audit` use for a vault that still holds older
/// keys (a rotation cut between its two steps).
/// What `status` and `audit` say of a share vault that still holds an
/// older record ([`oubli::ShareLeftover`]).
pub fn share_leftover(share: &str, vault: &str, why: &str) -> String {
    format!(
        "erasure incomplete: the vault of key share {share} ({}) still holds an older record, which may open everything placed under the share (it could not destroy it: {why}); make that vault writable and run `oubli share destroy {share}` again if its destruction was cut short, or any `oubli` command (each opens the share vaults and retries)",
        crate::session::shown(std::path::Path::new(vault))
    )
}

pub fn erasure_incomplete(epochs: &[u64], why: Option<&str>) -> String {
    let list: Vec<String> = epochs.iter().map(|e| e.to_string()).collect();
    let mut text = format!(
        "erasure incomplete: the vault still holds epoch {}'s key, so what was deleted in it is still recoverable",
        list.join(", ")
    );
    if let Some(why) = why {
        text.push_str(&format!(
            " (the vault could not destroy it: {why}; retried at every commit and open)"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(size(10), "10 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 20), "3.0 MiB");
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(3725), "1h 2m 5s");
        assert_eq!(duration(90_061), "1d 1h 1m");
        assert_eq!(date(0), "1970-01-01 00:00");
        assert_eq!(date(951_782_400), "2000-02-29 00:00");
        assert_eq!(date(1_700_000_000), "2023-11-14 22:13");
    }
}
