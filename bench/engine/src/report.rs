//! Output: one JSON object per line for machines, `# `-prefixed lines for people, and small statistics helpers.

use crate::timed::{IoSnapshot, KINDS};
use std::fmt::Write as _;
use std::io::Write as _;

/// Bytes in a MiB (sizes) and in an MB (rates, like `openssl speed`).
pub const MIB: u64 = 1 << 20;
pub const MB: f64 = 1e6;

/// One JSON line under construction: `{"bench": NAME, ...}`.
pub struct Rec {
    body: String,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn number(v: f64) -> String {
    if v.is_finite() {
        // Display never uses exponents, so this is always a JSON number.
        format!("{v}")
    } else {
        "null".into()
    }
}

impl Rec {
    pub fn new(bench: &str) -> Rec {
        Rec {
            body: format!("{{\"bench\":{}", escape(bench)),
        }
    }

    fn key(&mut self, k: &str) {
        let _ = write!(self.body, ",{}:", escape(k));
    }

    pub fn num(mut self, k: &str, v: f64) -> Rec {
        self.key(k);
        self.body.push_str(&number(v));
        self
    }

    pub fn int(mut self, k: &str, v: u64) -> Rec {
        self.key(k);
        let _ = write!(self.body, "{v}");
        self
    }

    pub fn str(mut self, k: &str, v: &str) -> Rec {
        self.key(k);
        self.body.push_str(&escape(v));
        self
    }

    pub fn nums(mut self, k: &str, vs: &[f64]) -> Rec {
        self.key(k);
        let items: Vec<String> = vs.iter().map(|v| number(*v)).collect();
        let _ = write!(self.body, "[{}]", items.join(","));
        self
    }

    /// Medium time by kind, as `io_<kind>_s`, `io_<kind>_calls` and `io_<kind>_bytes`.
    pub fn io(mut self, io: &IoSnapshot) -> Rec {
        for (kind, name) in KINDS {
            let t = io.get(kind);
            if t.calls == 0 {
                continue;
            }
            self = self
                .num(&format!("io_{name}_s"), t.secs)
                .int(&format!("io_{name}_calls"), t.calls)
                .int(&format!("io_{name}_bytes"), t.bytes);
        }
        self
    }

    /// Process CPU time of a phase (every thread), as `user_cpu_s` and `sys_cpu_s`.
    pub fn cpu(self, cpu: &Cpu) -> Rec {
        self.num("user_cpu_s", cpu.user).num("sys_cpu_s", cpu.sys)
    }

    /// Prints the line to stdout.
    pub fn emit(self) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}}}", self.body);
        let _ = out.flush();
    }
}

/// CPU time this process has used so far, all threads: (user seconds, system seconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub user: f64,
    pub sys: f64,
}

impl Cpu {
    pub fn now() -> Cpu {
        // SAFETY: getrusage only writes into the zeroed struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
            return Cpu::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        Cpu {
            user: secs(ru.ru_utime),
            sys: secs(ru.ru_stime),
        }
    }

    /// CPU used between `earlier` and `self`.
    pub fn since(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            user: self.user - earlier.user,
            sys: self.sys - earlier.sys,
        }
    }
}

/// Prints a human-readable line (prefixed `# ` so that JSON readers skip it).
pub fn say(msg: impl AsRef<str>) {
    let mut out = std::io::stdout().lock();
    for line in msg.as_ref().lines() {
        let _ = writeln!(out, "# {line}");
    }
    let _ = out.flush();
}

/// "append 0.41 s, sync 1.90 s" for the kinds that took time.
pub fn io_summary(io: &IoSnapshot) -> String {
    let parts: Vec<String> = KINDS
        .iter()
        .filter(|(k, _)| io.get(*k).calls > 0)
        .map(|(k, name)| {
            let t = io.get(*k);
            format!("{name} {:.3} s/{} calls", t.secs, t.calls)
        })
        .collect();
    if parts.is_empty() {
        "no medium calls".into()
    } else {
        parts.join(", ")
    }
}

/// Median of a non-empty sample (mean of the middle two for even sizes).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn mb_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / MB / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_shape() {
        let r = Rec::new("x\"y")
            .num("a", 1.5)
            .int("b", 7)
            .str("c", "q\n")
            .nums("d", &[1.0, f64::NAN])
            .num("e", f64::INFINITY);
        assert_eq!(
            r.body + "}",
            r#"{"bench":"x\"y","a":1.5,"b":7,"c":"q\u000a","d":[1,null],"e":null}"#
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
