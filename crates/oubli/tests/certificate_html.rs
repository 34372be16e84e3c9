//! `oubli certificate show --html` in a real browser engine (headless Chromium): the page renders, and no name is cut off on screen or on paper.
//!
//! The page is loaded in an iframe of a wrapper page whose script looks for
//! text that does not fit: a box that clips content wider or taller than
//! itself (`overflow` other than visible), text that a clipping ancestor
//! hides, text past the page's width, a page wider than the sheet. The
//! result comes back through `--dump-dom`. The page is also printed to PDF
//! (`--print-to-pdf`) and `pdftotext` must find every name whole in it, and
//! a screenshot must be a PNG of the window's size. The checker is shown to
//! catch a page made to cut names (`white-space: nowrap` with and without
//! `overflow: hidden`).
//!
//! Needs `chromium-headless-shell` (or `chromium`) and `pdftotext`
//! (poppler-utils), both in scripts/apt-packages; fails without them unless
//! OUBLI_SKIP_EXTERNAL=1.

mod common;

use base64::Engine as _;
use common::{on_path, require, run};
use oubli::certificate::sign::SigningKey;
use oubli::certificate::SignedCertificate;
use std::path::{Path, PathBuf};
use std::process::Command;

/// RFC 8410 section 10.3's Ed25519 key, as `openssl genpkey` writes it.
const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n";

/// The width of an A4 sheet at 96 dpi, in CSS pixels: the printable page.
const A4_WIDTH: u32 = 794;

/// The headless browser, or `None` (test skipped) with OUBLI_SKIP_EXTERNAL=1.
fn browser() -> Option<(PathBuf, Vec<&'static str>)> {
    for (program, extra) in [
        ("chromium-headless-shell", vec![]),
        ("chromium", vec!["--headless"]),
    ] {
        if on_path(program) {
            return Some((PathBuf::from(program), extra));
        }
    }
    require(
        false,
        "the HTML certificate test needs a headless Chromium: apt-get install chromium-headless-shell",
    );
    None
}

fn tools() -> Option<(PathBuf, Vec<&'static str>)> {
    let browser = browser()?;
    if !require(
        on_path("pdftotext"),
        "the HTML certificate test needs pdftotext: apt-get install poppler-utils",
    ) {
        return None;
    }
    Some(browser)
}

/// A name of `len` characters without a space or a hyphen, distinct per `i`.
fn long_name(i: usize, len: usize) -> String {
    let mut s = format!("/srv/archive/customer-{i:04}/");
    while s.len() < len {
        s += &format!("records_{i:04}_{}/", s.len());
    }
    s.truncate(len);
    s
}

/// A signed certificate of an erasure of many items with 200-character
/// names, retained items, snapshots and shares with long names, a long
/// store path and vault location.
fn certificate() -> (SignedCertificate, Vec<String>) {
    let names: Vec<String> = (0..40).map(|i| long_name(i, 200)).collect();
    let snapshot = format!("snapshot-{}", "s".repeat(190));
    let share = format!("share-{}", "h".repeat(194));
    let store = long_name(99, 200);
    let mut items: Vec<serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            serde_json::json!({"kind": "path", "name": n, "object_ids": (0..30).map(|k| 1_000_000_000 + i as u64 * 100 + k).collect::<Vec<u64>>(),
                               "bytes": 123_456_789_012u64, "from_snapshots": [snapshot.clone()]})
        })
        .collect();
    items.push(serde_json::json!({"kind": "snapshot", "name": snapshot, "object_ids": [], "bytes": 0, "from_snapshots": []}));
    items.push(serde_json::json!({"kind": "share", "name": share, "object_ids": [], "bytes": 0, "from_snapshots": []}));
    let kept = long_name(77, 200);
    let certificate = serde_json::from_value(serde_json::json!({
        "format": "oubli-certificate-of-sanitization",
        "version": 1,
        "id": "00112233445566778899aabbccddeeff",
        "issued_at": "2026-12-07T12:00:00Z",
        "command": format!("oubli redact --purge {}", names[0]),
        "erased": {
            "names": {"form": "plain"},
            "items": items,
            "retained": [{"kind": "path", "name": kept, "object_ids": [5, 6],
                          "kept_in": [snapshot.clone()]}],
            "epoch_totals": {"deletions": 40, "sealed_bytes": 9_876_543_210u64, "units": 123_456}
        },
        "store": {"id": "44".repeat(16), "medium": "directory",
                  "location": store, "epoch_before": 41, "epoch_after": 42},
        "method": {"technique": "cryptographic erase", "category": "purge",
                   "vault_kind": "tpm2",
                   "vault_location": format!("tpm:swtpm:host={},port=2321;index=0x01500016", "h".repeat(150)),
                   "vault_overwrite_erases": true, "statement": "Cryptographic Erase (NIST SP 800-88 Purge)."},
        "verification": {"method": "oubli audit", "coverage": {"kind": "full"},
                         "erased_units_before": 123_456, "units_opened_after": 99,
                         "leaked_units_after": 0, "vault_leftover_epochs": [],
                         "outcome": "pass", "limits": ["The audit opens what the store's own medium and the vault hold now."]},
        "tool": {"name": "oubli", "version": "0.1.0", "features": ["+tpm"],
                 "crypto_provider": "ring"},
        "vault_records": {"algorithm": "sha-256", "before": "ab".repeat(32), "after": "cd".repeat(32)},
        "vault_attestation": {"kind": "tpm_nv_certify", "ak_public": "A".repeat(120),
                              "attest": "B".repeat(200), "signature": "C".repeat(96),
                              "nv_index": 0x0150_0018, "qualifying_data": "ef".repeat(32),
                              "other_nv_index": 0x0150_0017, "other_attest": "D".repeat(200),
                              "other_signature": "E".repeat(96),
                              "sealed_record_before": "12".repeat(32),
                              "before_nv_index": 0x0150_0017, "before_attest": "F".repeat(200),
                              "before_signature": "G".repeat(96),
                              "before_qualifying_data": "34".repeat(32)}
    }))
    .expect("the test's certificate fits the model");
    let signed = SigningKey::from_pkcs8_pem(KEY_PEM)
        .unwrap()
        .sign(certificate);
    let mut expected = names;
    expected.extend([snapshot, share, kept, long_name(99, 200)]);
    (signed, expected)
}

/// `oubli certificate show --html FILE`, through the binary.
fn render(dir: &Path, signed: &SignedCertificate) -> PathBuf {
    let json = dir.join("certificate.json");
    std::fs::write(&json, signed.to_json()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_oubli"))
        .args(["certificate", "show", "--html"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oubli certificate show --html: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = dir.join("certificate.html");
    std::fs::write(&page, &out.stdout).unwrap();
    page
}

/// Runs the browser on `url` with `args`, in a profile of its own (tests
/// run in parallel).
fn chromium(browser: &(PathBuf, Vec<&str>), dir: &Path, args: &[String], url: &str) -> String {
    let profile = tempfile::tempdir_in(dir).unwrap();
    let mut cmd = Command::new(&browser.0);
    cmd.args(&browser.1)
        // The sandbox needs user namespaces, which containers and root lack.
        .args(["--no-sandbox", "--disable-gpu", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url);
    let (ok, out) = run(&mut cmd);
    assert!(ok, "{cmd:?} failed:\n{out}");
    out
}

fn url(path: &Path) -> String {
    format!("file://{}", path.canonicalize().unwrap().display())
}

/// What the wrapper's script found: text cut off, and the page's text.
#[derive(serde::Deserialize, Debug)]
struct Layout {
    cut: Vec<String>,
    text: String,
}

/// The wrapper page: `page` in an iframe `width` pixels wide, and the
/// script that measures it once everything has loaded.
const WRAPPER: &str = r#"<!DOCTYPE html><meta charset="utf-8"><body style="margin:0">
<iframe id="page" src="PAGE" style="width:WIDTHpx;height:1123px;border:0"></iframe>
<pre id="report"></pre>
<script>
window.addEventListener('load', () => {
  const out = {cut: [], text: ''};
  try {
    const doc = document.getElementById('page').contentDocument;
    const win = doc.defaultView;
    const vw = doc.documentElement.clientWidth;
    const name = el => el.tagName.toLowerCase()
      + (typeof el.className === 'string' && el.className.trim() ? '.' + el.className.trim().split(/\s+/).join('.') : '');
    const clips = s => s.overflowX !== 'visible' || s.overflowY !== 'visible';
    if (doc.documentElement.scrollWidth > vw + 1) {
      out.cut.push('the page is ' + doc.documentElement.scrollWidth + 'px wide, the sheet ' + vw + 'px');
    }
    for (const el of doc.querySelectorAll('body, body *')) {
      const s = win.getComputedStyle(el);
      if (s.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1) {
        out.cut.push(name(el) + ': content ' + el.scrollWidth + 'px wide in a clipping box of ' + el.clientWidth + 'px');
      }
      if (s.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 1) {
        out.cut.push(name(el) + ': content ' + el.scrollHeight + 'px high in a clipping box of ' + el.clientHeight + 'px');
      }
    }
    const walk = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
    for (let t = walk.nextNode(); t; t = walk.nextNode()) {
      if (!t.data.trim()) continue;
      const range = doc.createRange();
      range.selectNodeContents(t);
      let found = null;
      for (const r of range.getClientRects()) {
        if (r.width === 0) continue;
        if (r.right > vw + 1 || r.left < -1) {
          found = 'past the sheet (' + Math.round(r.left) + '..' + Math.round(r.right) + 'px of ' + vw + 'px)';
        }
        for (let a = t.parentElement; !found && a && a !== doc.documentElement; a = a.parentElement) {
          if (!clips(win.getComputedStyle(a))) continue;
          const b = a.getBoundingClientRect();
          if (r.left < b.left - 1 || r.right > b.right + 1 || r.top < b.top - 1 || r.bottom > b.bottom + 1) {
            found = 'hidden by ' + name(a);
          }
        }
        if (found) break;
      }
      if (found) out.cut.push(name(t.parentElement) + ': text ' + found + ': ' + t.data.slice(0, 60));
    }
    out.text = doc.body.innerText;
  } catch (e) {
    out.cut.push('the check could not run: ' + e);
  }
  // Base64 of the UTF-8 JSON, so the DOM dump carries it verbatim.
  const utf8 = new TextEncoder().encode(JSON.stringify(out));
  let bytes = '';
  for (const b of utf8) bytes += String.fromCharCode(b);
  document.getElementById('report').textContent = 'LAYOUT' + '[' + btoa(bytes) + ']';
});
</script>
"#;

/// Loads `page` at `width` pixels and reports what does not fit.
fn layout(browser: &(PathBuf, Vec<&str>), page: &Path, width: u32) -> Layout {
    let dir = page.parent().unwrap();
    let wrapper = dir.join(format!("check-{width}.html"));
    let name = page.file_name().unwrap().to_str().unwrap();
    std::fs::write(
        &wrapper,
        WRAPPER
            .replace("PAGE", name)
            .replace("WIDTH", &width.to_string()),
    )
    .unwrap();
    let dom = chromium(
        browser,
        dir,
        &[
            // The wrapper reads the page's DOM: both are file:// URLs.
            "--allow-file-access-from-files".into(),
            // Run until the page is idle (its load handler has run).
            "--virtual-time-budget=10000".into(),
            "--dump-dom".into(),
        ],
        &url(&wrapper),
    );
    let start = dom
        .find("LAYOUT[")
        .unwrap_or_else(|| panic!("no layout report in the DOM dump:\n{dom}"))
        + "LAYOUT[".len();
    let end = start + dom[start..].find(']').expect("the report's end");
    let json = base64::engine::general_purpose::STANDARD
        .decode(&dom[start..end])
        .expect("the report is base64");
    serde_json::from_slice(&json).unwrap_or_else(|e| panic!("report {json:?}: {e}"))
}

/// The page printed to PDF, as `pdftotext -raw` reads it (drawing order,
/// so a name broken over lines comes out in one piece), without whitespace.
fn printed_text(browser: &(PathBuf, Vec<&str>), page: &Path) -> String {
    let pdf = page.with_extension("pdf");
    chromium(
        browser,
        page.parent().unwrap(),
        &[
            format!("--print-to-pdf={}", pdf.display()),
            "--no-pdf-header-footer".into(),
        ],
        &url(page),
    );
    let out = Command::new("pdftotext")
        .arg("-raw")
        .arg(&pdf)
        .arg("-")
        .output()
        .unwrap();
    assert!(out.status.success(), "pdftotext failed");
    String::from_utf8_lossy(&out.stdout)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// A screenshot of `page` in a `width` x `height` window: a PNG of that size.
fn screenshot(browser: &(PathBuf, Vec<&str>), page: &Path, width: u32, height: u32) -> Vec<u8> {
    let png = page.with_extension("png");
    chromium(
        browser,
        page.parent().unwrap(),
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".into(),
        ],
        &url(page),
    );
    std::fs::read(&png).unwrap()
}

/// Everything wrong with `page`: text cut off at the A4 width, names
/// missing from the page's text or from the printed PDF.
fn problems(browser: &(PathBuf, Vec<&str>), page: &Path, names: &[String]) -> Vec<String> {
    let found = layout(browser, page, A4_WIDTH);
    let mut problems = found.cut;
    let printed = printed_text(browser, page);
    for name in names {
        if !found.text.contains(name.as_str()) {
            problems.push(format!("not in the page's text: {name}"));
        }
        if !printed.contains(name.as_str()) {
            problems.push(format!("not whole in the printed PDF: {name}"));
        }
    }
    problems
}

/// `page` with `css` added last to its style sheet.
fn restyled(page: &Path, css: &str, name: &str) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap();
    let at = html.find("</head>").expect("the page has a head");
    let out = page.with_file_name(name);
    std::fs::write(
        &out,
        format!("{}<style>{css}</style>{}", &html[..at], &html[at..]),
    )
    .unwrap();
    out
}

#[test]
fn the_html_certificate_renders_with_every_long_name_whole() {
    let Some(browser) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (signed, names) = certificate();
    let page = render(dir.path(), &signed);

    let problems = problems(&browser, &page, &names);
    assert!(
        problems.is_empty(),
        "the page cuts text:\n{}",
        problems.join("\n")
    );

    let found = layout(&browser, &page, A4_WIDTH);
    for expected in [
        signed.certificate.id.as_str(),
        "0x01500018",
        "oubli redact --purge",
    ] {
        assert!(found.text.contains(expected), "{expected} not on the page");
    }

    let png = screenshot(&browser, &page, 1024, 1400);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    // IHDR: width and height, big-endian, at bytes 16..24.
    let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
    assert_eq!((size(16), size(20)), (1024, 1400));
    assert!(
        png.len() > 10_000,
        "a {}-byte screenshot is blank",
        png.len()
    );
}

#[test]
fn the_check_catches_a_page_that_cuts_names() {
    let Some(browser) = tools() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (signed, names) = certificate();
    let page = render(dir.path(), &signed);
    // Names on one line, clipped by their cell.
    let clipped = restyled(
        &page,
        "td { white-space: nowrap !important; overflow: hidden !important; max-width: 30em !important; }",
        "clipped.html",
    );
    let found = problems(&browser, &clipped, &names);
    assert!(
        found.iter().any(|p| p.contains("clipping box")),
        "clipped cells not caught: {found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("not whole in the printed PDF")),
        "clipped names found whole in print: {found:?}"
    );
    // Names on one line running off the sheet.
    let wide = restyled(
        &page,
        "td { white-space: nowrap !important; overflow-wrap: normal !important; word-break: normal !important; }",
        "wide.html",
    );
    let found = problems(&browser, &wide, &names);
    assert!(
        found.iter().any(|p| p.contains("past the sheet")),
        "text past the sheet not caught: {found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.contains("not whole in the printed PDF")),
        "names off the sheet found whole in print: {found:?}"
    );
}
