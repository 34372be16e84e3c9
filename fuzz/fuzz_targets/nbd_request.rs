//! Fuzz target: NBD request headers through the parser and the checker, and option bytes through the handshake state machine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oubli_nbd::handshake::{Catalog, ExportInfo, Handshake, HandshakeConfig, Progress};
use oubli_nbd::proto::{MAX_PAYLOAD, REQUEST_LEN};
use oubli_nbd::{check, parse_request, Action, Limits};

struct One;

impl Catalog for One {
    fn lookup(&self, name: &str) -> Result<Option<ExportInfo>, String> {
        Ok((name.is_empty() || name == "a").then(|| ExportInfo {
            name: "a".into(),
            size: 1 << 20,
            read_only: false,
            description: String::new(),
            id: 2,
        }))
    }
    fn list(&self) -> Result<Vec<String>, String> {
        Ok(vec!["a".into()])
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        // Transmission: every 28-byte header, checked against a small export.
        let limits = Limits {
            size: 1 << 20,
            read_only: mode & 2 != 0,
            structured: mode & 4 != 0,
            max_payload: MAX_PAYLOAD,
        };
        for h in rest.chunks(REQUEST_LEN) {
            if let Ok(Some(req)) = parse_request(h) {
                assert_eq!(&req.encode()[..], h);
                if let Ok(Action::Read { offset, len } | Action::Write { offset, len, .. }) =
                    check(&req, &limits)
                {
                    assert!(offset + len as u64 <= limits.size && len <= MAX_PAYLOAD);
                }
            }
        }
    } else {
        // Handshake: the same bytes whole and byte by byte must agree.
        let run = |step: usize| {
            let mut hs = Handshake::new(HandshakeConfig::default());
            let (mut out, mut pending, mut fed) = (Vec::new(), Vec::new(), 0);
            let mut progress = Progress::Continue;
            while fed < rest.len() && !hs.finished() {
                let to = (fed + step).min(rest.len());
                pending.extend_from_slice(&rest[fed..to]);
                fed = to;
                let (n, p) = hs.advance(&pending, &One, &mut out);
                assert!(n <= pending.len());
                pending.drain(..n);
                progress = p;
            }
            (out, progress)
        };
        assert_eq!(run(rest.len().max(1)), run(1));
    }
});
