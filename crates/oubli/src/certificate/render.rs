//! A certificate for people: plain text, and a printable self-contained HTML page (inline CSS, nothing fetched).

use super::{Category, Coverage, NameForm, Outcome, SignedCertificate, VaultAttestation};
use crate::certificate::sign::fingerprint;
use base64::Engine as _;

/// One section of the rendering: a title and label/value rows.
struct Section {
    title: &'static str,
    rows: Vec<(String, String)>,
}

fn sections(signed: &SignedCertificate) -> Vec<Section> {
    let c = &signed.certificate;
    let row = |k: &str, v: String| (k.to_string(), v);
    let names = match &c.erased.names {
        NameForm::Plain => "in clear".to_string(),
        NameForm::SaltedSha256 { salt } => {
            format!("salted SHA-256 (hex SHA-256 of salt ‖ name), salt {salt}")
        }
    };
    let mut erased = vec![row("Names", names)];
    if c.erased.items.is_empty() {
        erased.push(row(
            "Items",
            "none named by this command (see the epoch totals)".into(),
        ));
    }
    for item in &c.erased.items {
        let mut text = format!(
            "{}; {} byte(s); object id(s) {}",
            item.name,
            item.bytes,
            join(&item.object_ids)
        );
        if !item.from_snapshots.is_empty() {
            text += &format!(
                "; also removed from snapshot(s) {}",
                item.from_snapshots.join(", ")
            );
        }
        erased.push(row(&format!("Erased {}", item.kind.label()), text));
    }
    if c.erased.items_unlisted > 0 {
        erased.push(row(
            "Not listed",
            format!(
                "{} more name(s) removed through the mount and erased by this commit (the mount lists at most 100,000)",
                c.erased.items_unlisted
            ),
        ));
    }
    for item in &c.erased.retained {
        erased.push(row(
            &format!("NOT erased {}", item.kind.label()),
            format!(
                "{}: removed, but its data is still held by {} (object id(s) {})",
                item.name,
                item.kept_in.join(", "),
                join(&item.object_ids)
            ),
        ));
    }
    let t = &c.erased.epoch_totals;
    erased.push(row(
        "Epoch totals",
        format!(
            "{} deletion(s), {} sealed byte(s), {} unit(s) made unrecoverable by the commit (this command's items and every deletion since the previous commit)",
            t.deletions, t.sealed_bytes, t.units
        ),
    ));

    let s = &c.store;
    let store = vec![
        row("Store id", s.id.clone()),
        row(
            "Medium",
            format!(
                "{} {}",
                format!("{:?}", s.medium).to_lowercase(),
                s.location
            ),
        ),
        row(
            "Epoch",
            format!(
                "{} ended (its key destroyed), {} began",
                s.epoch_before, s.epoch_after
            ),
        ),
        row("Date (UTC)", c.issued_at.clone()),
        row("Command", c.command.clone()),
    ];

    let m = &c.method;
    let category = match m.category {
        Category::Purge => "PURGE (NIST SP 800-88)",
        Category::Clear => "NOT a Purge: Clear at best",
    };
    let method = vec![
        row("Technique", m.technique.clone()),
        row("Category", category.into()),
        row(
            "Vault",
            format!(
                "{} at {}; overwrite erases: {}",
                m.vault_kind,
                m.vault_location,
                if m.vault_overwrite_erases {
                    "yes"
                } else {
                    "no"
                }
            ),
        ),
        row("Statement", m.statement.clone()),
    ];

    let v = &c.verification;
    let coverage = match &v.coverage {
        Coverage::Full => "every unit the store's medium and the vault open".to_string(),
        Coverage::Sample { size, of } => format!("a random sample of {size} of {of} units"),
    };
    let outcome = match v.outcome {
        Outcome::Pass => "PASS",
        Outcome::Fail => "FAIL",
    };
    let mut verification = vec![
        row("Method", format!("{} ({coverage})", v.method)),
        row("Result", outcome.into()),
        row(
            "Findings",
            format!(
                "{} erased unit(s) opened before the commit; after it, {} unit(s) opened, {} deleted unit(s) still opened, older vault key(s): {}",
                v.erased_units_before,
                v.units_opened_after,
                v.leaked_units_after,
                if v.vault_leftover_epochs.is_empty() {
                    "none".to_string()
                } else {
                    join(&v.vault_leftover_epochs)
                }
            ),
        ),
    ];
    for limit in &v.limits {
        verification.push(row("Cannot see", limit.clone()));
    }

    let tool = vec![
        row("Tool", format!("{} {}", c.tool.name, c.tool.version)),
        row("Features", c.tool.features.join(" ")),
        row("Crypto provider", c.tool.crypto_provider.clone()),
    ];

    let b64 = base64::engine::general_purpose::STANDARD;
    let signer = b64
        .decode(&signed.signature.public_key)
        .ok()
        .and_then(|k| <[u8; 32]>::try_from(k).ok())
        .map_or("(unreadable key)".to_string(), |k| fingerprint(&k));
    let mut evidence = vec![
        row(
            "Vault record before",
            format!("{} {}", c.vault_records.algorithm, c.vault_records.before),
        ),
        row(
            "Vault record after",
            format!("{} {}", c.vault_records.algorithm, c.vault_records.after),
        ),
    ];
    match &c.vault_attestation {
        None => evidence.push(row("Vault attestation", "none".into())),
        Some(VaultAttestation::TpmNvCertify { nv_index, .. }) => evidence.push(row(
            "Vault attestation",
            format!(
                "TPM2_NV_Certify of NV index {nv_index:#010x}, signed by a TPM attestation key"
            ),
        )),
    }
    evidence.push(row(
        "Signature",
        format!(
            "{} by key SHA-256 {signer} (check it with `oubli certificate verify --public-key`)",
            signed.signature.algorithm
        ),
    ));
    evidence.push(row("Certificate id", c.id.clone()));

    vec![
        Section {
            title: "What was erased",
            rows: erased,
        },
        Section {
            title: "Store",
            rows: store,
        },
        Section {
            title: "Method",
            rows: method,
        },
        Section {
            title: "Verification",
            rows: verification,
        },
        Section {
            title: "Tool",
            rows: tool,
        },
        Section {
            title: "Evidence",
            rows: evidence,
        },
    ]
}

fn join<T: std::fmt::Display>(list: &[T]) -> String {
    if list.is_empty() {
        return "none".into();
    }
    list.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

const TITLE: &str = "Certificate of Sanitization";

/// Plain text, one `label: value` line per row.
pub fn text(signed: &SignedCertificate) -> String {
    let mut out = format!("{TITLE}\n{}\n", "=".repeat(TITLE.len()));
    for s in sections(signed) {
        out += &format!("\n{}\n{}\n", s.title, "-".repeat(s.title.len()));
        for (k, v) in s.rows {
            out += &format!("{k}: {v}\n");
        }
    }
    out
}

/// Escapes text for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(ch),
        }
    }
    out
}

/// Print styles: A4 or Letter, black on white, rows never split across
/// pages, and long names, hashes and paths wrap anywhere rather than being
/// cut off.
const CSS: &str = "\
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#111;background:#fff;margin:2rem auto;max-width:60rem;padding:0 1rem;line-height:1.4}
h1{font-size:1.6rem;margin:0 0 .25rem}
.sub{color:#444;margin:0 0 1.5rem}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem;border-bottom:2px solid #111;padding-bottom:.2rem}
table{width:100%;border-collapse:collapse;table-layout:fixed}
th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #ccc;overflow-wrap:anywhere;word-break:break-word;white-space:normal}
th{width:14rem;font-weight:600;color:#333}
.verdict{display:inline-block;padding:.2rem .6rem;border:2px solid currentColor;font-weight:700}
.purge{color:#075e1f}.clear{color:#8a2b00}.fail{color:#a00}
.sign{margin-top:3rem;display:flex;gap:3rem}
.sign div{flex:1;border-top:1px solid #111;padding-top:.3rem;color:#444}
@media print{body{margin:0;max-width:none;font-size:10pt}h2{break-after:avoid}tr{break-inside:avoid}.verdict{border-width:1px}}
@page{margin:15mm}
";

/// A printable HTML page, self-contained (inline CSS, no script, nothing
/// fetched).
pub fn html(signed: &SignedCertificate) -> String {
    let c = &signed.certificate;
    let (class, verdict) = match (c.method.category, c.verification.outcome) {
        (_, Outcome::Fail) => ("fail", "Verification FAILED"),
        (Category::Purge, Outcome::Pass) => ("purge", "Cryptographic Erase — Purge"),
        (Category::Clear, Outcome::Pass) => ("clear", "Cryptographic Erase — NOT a Purge"),
    };
    let mut out = String::new();
    out += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
    out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
    out += &format!("<title>{TITLE} {}</title>\n", escape(&c.id));
    out += &format!("<style>\n{CSS}</style>\n</head>\n<body>\n");
    out += &format!("<h1>{TITLE}</h1>\n");
    out += &format!(
        "<p class=\"sub\">oubli, store {} — {} UTC — <span class=\"verdict {class}\">{verdict}</span></p>\n",
        escape(&c.store.id),
        escape(&c.issued_at)
    );
    for s in sections(signed) {
        out += &format!("<h2>{}</h2>\n<table>\n", escape(s.title));
        for (k, v) in s.rows {
            out += &format!("<tr><th>{}</th><td>{}</td></tr>\n", escape(&k), escape(&v));
        }
        out += "</table>\n";
    }
    out += "<div class=\"sign\"><div>Performed by (name, title, signature)</div><div>Validated by (name, title, signature)</div></div>\n";
    out += "</body>\n</html>\n";
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
    }
}
