//! The fixed newstyle handshake as a sans-IO state machine: bytes from the client in, bytes for the client and a verdict out.
//!
//! The connection code feeds whatever it has read to [`Handshake::advance`],
//! writes the output, drains the consumed bytes and acts on the
//! [`Progress`]. Nothing here blocks or allocates beyond one option (at most
//! [`MAX_OPTION_LEN`] bytes); longer options are skipped without buffering.
//!
//! TLS (`NBD_OPT_STARTTLS`) is decided here and done by the caller: after
//! the ACK the handshake returns [`Progress::StartTls`], the caller runs the
//! TLS handshake on the same connection and calls
//! [`Handshake::tls_started`], then feeds the decrypted bytes as before.

use crate::proto::*;
use crate::reply::{option_error, option_reply};

/// Longest option payload buffered; longer ones are skipped and refused
/// (`NBD_REP_ERR_TOO_BIG`). GO/INFO need 4 + 4096 + 2 + 2·n bytes.
pub const MAX_OPTION_LEN: u32 = 16 * 1024;

/// An export as the handshake advertises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Canonical name.
    pub name: String,
    pub size: u64,
    pub read_only: bool,
    /// Shown by `NBD_INFO_DESCRIPTION` when asked.
    pub description: String,
    /// The store object behind the export (opaque to the handshake).
    pub id: u64,
}

/// Where the handshake looks exports up. Errors are messages for the server
/// log; the client only learns that the export is unavailable.
pub trait Catalog {
    /// The export the client names (`""` is the default export, if any).
    fn lookup(&self, name: &str) -> Result<Option<ExportInfo>, String>;
    /// Every export's name, for `NBD_OPT_LIST`.
    fn list(&self) -> Result<Vec<String>, String>;
}

/// When a connection uses TLS (nbdkit's `--tls`; the protocol's NOTLS,
/// SELECTIVETLS and FORCEDTLS modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused (`NBD_REP_ERR_UNSUP`).
    Off,
    /// TLS for clients that ask (`NBD_OPT_STARTTLS`), plain for the others.
    On,
    /// TLS or nothing: every option before `NBD_OPT_STARTTLS` but
    /// `NBD_OPT_ABORT` is answered `NBD_REP_ERR_TLS_REQD`, and
    /// `NBD_OPT_EXPORT_NAME` closes the connection.
    Require,
}

impl TlsMode {
    /// Whether a client may reach an export without TLS.
    pub fn allows_plain(self) -> bool {
        self != TlsMode::Require
    }
}

/// What the server offers in this handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeConfig {
    /// Accept `NBD_OPT_STRUCTURED_REPLY`.
    pub structured_replies: bool,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN` (flush covers every connection).
    pub multi_conn: bool,
    /// Preferred block size for `NBD_INFO_BLOCK_SIZE` (a power of two ≥ 512).
    pub preferred_block: u32,
    /// Maximum payload for `NBD_INFO_BLOCK_SIZE`.
    pub max_payload: u32,
    /// Whether TLS is offered or required on this connection.
    pub tls: TlsMode,
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        HandshakeConfig {
            structured_replies: true,
            multi_conn: true,
            preferred_block: 4096,
            max_payload: MAX_PAYLOAD,
            tls: TlsMode::Off,
        }
    }
}

/// The outcome of option haggling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub export: ExportInfo,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The transmission flags sent to the client.
    pub flags: u16,
}

/// Why the server closes the connection during the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent `NBD_OPT_ABORT` (a soft disconnect; the reply was sent).
    Abort,
    /// `NBD_OPT_EXPORT_NAME` named an export that is not available: the
    /// protocol can only answer by closing.
    ExportUnavailable(String),
    /// The client broke a mandatory rule (bad magic, unknown client flags).
    Protocol(String),
    /// `NBD_OPT_EXPORT_NAME` without TLS where TLS is required: the
    /// protocol can only answer by closing.
    TlsRequired,
}

/// What [`Handshake::advance`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// More input is needed.
    Continue,
    /// Option haggling is over: enter transmission with this export. Bytes
    /// after the consumed ones belong to the transmission phase.
    Transmission(Negotiated),
    /// Write the output, then close the connection.
    Close(CloseReason),
    /// Write the output (the ACK of `NBD_OPT_STARTTLS`), then run a TLS
    /// handshake as the server on the same connection: bytes after the
    /// consumed ones are already TLS. Call [`Handshake::tls_started`] once
    /// it succeeded and feed the decrypted bytes; until then `advance`
    /// consumes nothing and returns this again.
    StartTls,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    ClientFlags,
    Options,
    /// The STARTTLS ACK is out; waiting for the caller's TLS handshake.
    StartTls,
    /// Discarding an over-long option's payload, then refusing it.
    Skip {
        option: u32,
        remaining: u32,
    },
    Finished(Progress),
}

/// The server side of one handshake.
#[derive(Debug, Clone)]
pub struct Handshake {
    config: HandshakeConfig,
    state: State,
    no_zeroes: bool,
    structured: bool,
    /// The connection runs inside TLS.
    tls: bool,
}

impl Handshake {
    pub fn new(config: HandshakeConfig) -> Handshake {
        Handshake {
            config,
            state: State::ClientFlags,
            no_zeroes: false,
            structured: false,
            tls: false,
        }
    }

    /// The TLS handshake that [`Progress::StartTls`] asked for succeeded:
    /// option haggling goes on inside TLS.
    pub fn tls_started(&mut self) {
        if self.state == State::StartTls {
            self.tls = true;
            self.state = State::Options;
        }
    }

    /// Whether the connection runs inside TLS.
    pub fn in_tls(&self) -> bool {
        self.tls
    }

    /// TLS is required and has not started: options are refused.
    fn tls_missing(&self) -> bool {
        self.config.tls == TlsMode::Require && !self.tls
    }

    /// The server's opening bytes: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
    pub fn greeting() -> [u8; 18] {
        let mut out = [0u8; 18];
        out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        out
    }

    /// Whether the handshake has ended (transmission or close).
    pub fn finished(&self) -> bool {
        matches!(self.state, State::Finished(_))
    }

    /// Consumes as many complete messages from `input` as it can, appending
    /// replies to `out`. Returns how many bytes were consumed and what to do.
    /// Feeding the same bytes in any split gives the same output.
    pub fn advance(
        &mut self,
        input: &[u8],
        catalog: &dyn Catalog,
        out: &mut Vec<u8>,
    ) -> (usize, Progress) {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.state.clone() {
                State::Finished(p) => return (used, p),
                State::StartTls => return (used, Progress::StartTls),
                State::ClientFlags => {
                    let Some(b) = rest.get(..4) else {
                        return (used, Progress::Continue);
                    };
                    used += 4;
                    let flags = u32::from_be_bytes(b.try_into().unwrap());
                    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                        self.finish(Progress::Close(CloseReason::Protocol(format!(
                            "unknown client flags {flags:#x}"
                        ))));
                        continue;
                    }
                    self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                    self.state = State::Options;
                }
                State::Skip { option, remaining } => {
                    let n = remaining.min(rest.len().min(u32::MAX as usize) as u32);
                    used += n as usize;
                    if n < remaining {
                        self.state = State::Skip {
                            option,
                            remaining: remaining - n,
                        };
                        return (used, Progress::Continue);
                    }
                    self.state = State::Options;
                    let reply = if self.tls_missing() && option != OPT_ABORT {
                        REP_ERR_TLS_REQD
                    } else if known_option(option) {
                        REP_ERR_TOO_BIG
                    } else {
                        REP_ERR_UNSUP
                    };
                    option_error(out, option, reply, "option data too long");
                }
                State::Options => {
                    let Some(h) = rest.get(..OPTION_HEADER_LEN) else {
                        return (used, Progress::Continue);
                    };
                    let magic = u64::from_be_bytes(h[0..8].try_into().unwrap());
                    let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
                    let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
                    if magic != IHAVEOPT {
                        used += OPTION_HEADER_LEN;
                        self.finish(Progress::Close(CloseReason::Protocol(format!(
                            "bad option magic {magic:#018x}"
                        ))));
                        continue;
                    }
                    if option == OPT_EXPORT_NAME && len as usize > MAX_STRING {
                        used += OPTION_HEADER_LEN;
                        self.finish(Progress::Close(CloseReason::Protocol(format!(
                            "export name of {len} bytes"
                        ))));
                        continue;
                    }
                    if len > MAX_OPTION_LEN {
                        used += OPTION_HEADER_LEN;
                        self.state = State::Skip {
                            option,
                            remaining: len,
                        };
                        continue;
                    }
                    let total = OPTION_HEADER_LEN + len as usize;
                    let Some(data) = rest.get(OPTION_HEADER_LEN..total) else {
                        return (used, Progress::Continue);
                    };
                    used += total;
                    self.option(option, data, catalog, out);
                }
            }
        }
    }

    fn finish(&mut self, progress: Progress) {
        self.state = State::Finished(progress);
    }

    fn flags(&self, export: &ExportInfo) -> u16 {
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA;
        if export.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
        }
        if self.config.multi_conn {
            flags |= FLAG_CAN_MULTI_CONN;
        }
        if self.structured {
            flags |= FLAG_SEND_DF;
        }
        flags
    }

    /// Handles one complete option.
    fn option(&mut self, option: u32, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) {
        if self.tls_missing() {
            match option {
                OPT_STARTTLS | OPT_ABORT => {}
                OPT_EXPORT_NAME => return self.finish(Progress::Close(CloseReason::TlsRequired)),
                _ => {
                    return option_error(
                        out,
                        option,
                        REP_ERR_TLS_REQD,
                        "this server requires TLS: send NBD_OPT_STARTTLS first",
                    )
                }
            }
        }
        match option {
            OPT_EXPORT_NAME => {
                let export = std::str::from_utf8(data)
                    .map_err(|_| "export name is not UTF-8".to_string())
                    .and_then(|name| match catalog.lookup(name) {
                        Ok(Some(e)) => Ok(e),
                        Ok(None) => Err(format!("no export named {name:?}")),
                        Err(e) => Err(format!("export {name:?} unavailable: {e}")),
                    });
                match export {
                    Ok(export) => {
                        let flags = self.flags(&export);
                        out.extend_from_slice(&export.size.to_be_bytes());
                        out.extend_from_slice(&flags.to_be_bytes());
                        if !self.no_zeroes {
                            out.extend_from_slice(&[0u8; 124]);
                        }
                        self.finish(Progress::Transmission(Negotiated {
                            export,
                            structured: self.structured,
                            flags,
                        }));
                    }
                    Err(why) => {
                        self.finish(Progress::Close(CloseReason::ExportUnavailable(why)));
                    }
                }
            }
            OPT_ABORT => {
                option_reply(out, option, REP_ACK, &[]);
                self.finish(Progress::Close(CloseReason::Abort));
            }
            OPT_LIST => {
                if !data.is_empty() {
                    return option_error(out, option, REP_ERR_INVALID, "LIST takes no data");
                }
                match catalog.list() {
                    Ok(names) => {
                        for name in names {
                            let mut d = Vec::with_capacity(4 + name.len());
                            d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                            d.extend_from_slice(name.as_bytes());
                            option_reply(out, option, REP_SERVER, &d);
                        }
                        option_reply(out, option, REP_ACK, &[]);
                    }
                    Err(_) => option_error(
                        out,
                        option,
                        REP_ERR_POLICY,
                        "the export list is unavailable (see the server log)",
                    ),
                }
            }
            OPT_INFO | OPT_GO => self.info_or_go(option, data, catalog, out),
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_error(
                        out,
                        option,
                        REP_ERR_INVALID,
                        "STRUCTURED_REPLY takes no data",
                    );
                } else if !self.config.structured_replies {
                    option_error(
                        out,
                        option,
                        REP_ERR_UNSUP,
                        "structured replies are disabled",
                    );
                } else {
                    self.structured = true;
                    option_reply(out, option, REP_ACK, &[]);
                }
            }
            OPT_STARTTLS => self.start_tls(data, out),
            _ => option_error(out, option, REP_ERR_UNSUP, "option not supported"),
        }
    }

    fn start_tls(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.config.tls == TlsMode::Off {
            option_error(
                out,
                OPT_STARTTLS,
                REP_ERR_UNSUP,
                "TLS is not offered on this connection",
            );
        } else if self.tls {
            option_error(out, OPT_STARTTLS, REP_ERR_INVALID, "TLS is already on");
        } else if !data.is_empty() {
            option_error(out, OPT_STARTTLS, REP_ERR_INVALID, "STARTTLS takes no data");
        } else {
            option_reply(out, OPT_STARTTLS, REP_ACK, &[]);
            // What was negotiated in the clear may have been tampered with:
            // start over inside TLS.
            self.structured = false;
            self.state = State::StartTls;
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8], catalog: &dyn Catalog, out: &mut Vec<u8>) {
        let Some((name, requests)) = parse_info_request(data) else {
            return option_error(out, option, REP_ERR_INVALID, "malformed INFO/GO data");
        };
        let Ok(name) = std::str::from_utf8(name) else {
            return option_error(out, option, REP_ERR_INVALID, "export name is not UTF-8");
        };
        let export = match catalog.lookup(name) {
            Ok(Some(e)) => e,
            Ok(None) => {
                return option_error(
                    out,
                    option,
                    REP_ERR_UNKNOWN,
                    &format!("no export named {name:?}"),
                )
            }
            Err(_) => {
                return option_error(
                    out,
                    option,
                    REP_ERR_UNKNOWN,
                    "export unavailable (see the server log)",
                )
            }
        };
        let flags = self.flags(&export);
        let mut info = Vec::with_capacity(12);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&export.size.to_be_bytes());
        info.extend_from_slice(&flags.to_be_bytes());
        option_reply(out, option, REP_INFO, &info);
        let mut sent = Vec::new();
        for req in requests {
            if sent.contains(&req) {
                continue;
            }
            sent.push(req);
            let mut d = req.to_be_bytes().to_vec();
            match req {
                INFO_NAME => d.extend_from_slice(export.name.as_bytes()),
                INFO_DESCRIPTION => d.extend_from_slice(export.description.as_bytes()),
                INFO_BLOCK_SIZE => {
                    d.extend_from_slice(&1u32.to_be_bytes());
                    d.extend_from_slice(&self.config.preferred_block.to_be_bytes());
                    d.extend_from_slice(&self.config.max_payload.to_be_bytes());
                }
                _ => continue,
            }
            option_reply(out, option, REP_INFO, &d);
        }
        option_reply(out, option, REP_ACK, &[]);
        if option == OPT_GO {
            self.finish(Progress::Transmission(Negotiated {
                export,
                structured: self.structured,
                flags,
            }));
        }
    }
}

fn known_option(option: u32) -> bool {
    matches!(
        option,
        OPT_EXPORT_NAME
            | OPT_ABORT
            | OPT_LIST
            | OPT_INFO
            | OPT_GO
            | OPT_STRUCTURED_REPLY
            | OPT_STARTTLS
    )
}

/// Splits `NBD_OPT_INFO`/`NBD_OPT_GO` data into the export name and the
/// information requests; `None` if the lengths do not add up exactly.
pub fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let name_len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    if name_len > MAX_STRING {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let rest = &data[4 + name_len..];
    let n = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?) as usize;
    let list = &rest[2..];
    if list.len() != 2 * n {
        return None;
    }
    Some((
        name,
        list.chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two;
    impl Catalog for Two {
        fn lookup(&self, name: &str) -> Result<Option<ExportInfo>, String> {
            let (name, size) = match name {
                "" | "disk" => ("disk", 1 << 20),
                "other" => ("other", 4096),
                "broken" => return Err("corrupt".into()),
                _ => return Ok(None),
            };
            Ok(Some(ExportInfo {
                name: name.into(),
                size,
                read_only: false,
                description: "test".into(),
                id: 9,
            }))
        }
        fn list(&self) -> Result<Vec<String>, String> {
            Ok(vec!["disk".into(), "other".into()])
        }
    }

    fn opt(option: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    fn go_data(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        d
    }

    /// Splits the server output into (option, reply type, data) triples.
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut v = Vec::new();
        while !out.is_empty() {
            assert_eq!(&out[..8], &OPTION_REPLY_MAGIC.to_be_bytes());
            let o = u32::from_be_bytes(out[8..12].try_into().unwrap());
            let t = u32::from_be_bytes(out[12..16].try_into().unwrap());
            let l = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
            v.push((o, t, out[20..20 + l].to_vec()));
            out = &out[20 + l..];
        }
        v
    }

    fn run(input: &[u8]) -> (usize, Progress, Vec<u8>) {
        let mut h = Handshake::new(HandshakeConfig::default());
        let mut out = Vec::new();
        let (n, p) = h.advance(input, &Two, &mut out);
        (n, p, out)
    }

    fn with_tls(tls: TlsMode) -> Handshake {
        Handshake::new(HandshakeConfig {
            tls,
            ..HandshakeConfig::default()
        })
    }

    /// FORCEDTLS: before STARTTLS every option but ABORT is refused with
    /// TLS_REQD (EXPORT_NAME closes); after it, haggling starts over inside
    /// TLS and a second STARTTLS is invalid.
    #[test]
    fn tls_required_refuses_everything_before_starttls() {
        let mut h = with_tls(TlsMode::Require);
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_LIST, &[]));
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(OPT_GO, &go_data("disk", &[])));
        input.extend(opt(OPT_INFO, &go_data("disk", &[])));
        input.extend(opt(4242, b"?"));
        input.extend(opt(OPT_GO, &vec![0u8; MAX_OPTION_LEN as usize + 1]));
        input.extend(opt(OPT_STARTTLS, &[]));
        let tls_bytes = b"\x16\x03\x01 (a ClientHello)";
        input.extend_from_slice(tls_bytes);
        let mut out = Vec::new();
        let (n, p) = h.advance(&input, &Two, &mut out);
        assert_eq!(p, Progress::StartTls);
        assert_eq!(n, input.len() - tls_bytes.len(), "TLS bytes are left alone");
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            [REP_ERR_TLS_REQD; 6]
                .iter()
                .copied()
                .chain([REP_ACK])
                .collect::<Vec<_>>()
        );
        // Nothing moves until the caller has run the TLS handshake.
        let mut more = Vec::new();
        assert_eq!(
            h.advance(tls_bytes, &Two, &mut more),
            (0, Progress::StartTls)
        );
        assert!(more.is_empty() && !h.in_tls());
        h.tls_started();
        assert!(h.in_tls());
        let mut input = opt(OPT_STARTTLS, &[]);
        input.extend(opt(OPT_LIST, &[]));
        input.extend(opt(OPT_GO, &go_data("disk", &[])));
        let mut out = Vec::new();
        let (n, p) = h.advance(&input, &Two, &mut out);
        assert_eq!(n, input.len());
        let Progress::Transmission(neg) = p else {
            panic!("{p:?}")
        };
        assert!(!neg.structured);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            [
                REP_ERR_INVALID,
                REP_SERVER,
                REP_SERVER,
                REP_ACK,
                REP_INFO,
                REP_ACK
            ]
        );
    }

    #[test]
    fn tls_required_closes_on_export_name_and_allows_abort() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_EXPORT_NAME, b"disk"));
        let mut out = Vec::new();
        let (_, p) = with_tls(TlsMode::Require).advance(&input, &Two, &mut out);
        assert_eq!(p, Progress::Close(CloseReason::TlsRequired));
        assert!(out.is_empty(), "no export data without TLS");
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_ABORT, &[]));
        let mut out = Vec::new();
        let (_, p) = with_tls(TlsMode::Require).advance(&input, &Two, &mut out);
        assert_eq!(p, Progress::Close(CloseReason::Abort));
        assert_eq!(replies(&out)[0].1, REP_ACK);
    }

    /// SELECTIVETLS (`On`): plain clients are served, STARTTLS is accepted
    /// and forgets what was negotiated in the clear; `Off` refuses it.
    #[test]
    fn tls_on_serves_both_and_off_refuses_starttls() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(OPT_GO, &go_data("disk", &[])));
        let mut out = Vec::new();
        let (_, p) = with_tls(TlsMode::On).advance(&input, &Two, &mut out);
        assert!(matches!(p, Progress::Transmission(n) if n.structured));

        let mut h = with_tls(TlsMode::On);
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(OPT_STARTTLS, b"x"));
        input.extend(opt(OPT_STARTTLS, &[]));
        let mut out = Vec::new();
        assert_eq!(h.advance(&input, &Two, &mut out).1, Progress::StartTls);
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ACK, REP_ERR_INVALID, REP_ACK]);
        h.tls_started();
        let mut out = Vec::new();
        let (_, p) = h.advance(&opt(OPT_GO, &go_data("disk", &[])), &Two, &mut out);
        assert!(matches!(p, Progress::Transmission(n) if !n.structured));

        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_STARTTLS, &[]));
        input.extend(opt(OPT_ABORT, &[]));
        let (_, p, out) = run(&input);
        assert_eq!(p, Progress::Close(CloseReason::Abort));
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ERR_UNSUP, REP_ACK]);
    }

    #[test]
    fn go_with_block_size_enters_transmission() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(
            OPT_GO,
            &go_data("disk", &[INFO_BLOCK_SIZE, INFO_NAME, 77]),
        ));
        input.extend_from_slice(b"tail");
        let (n, p, out) = run(&input);
        assert_eq!(n, input.len() - 4, "transmission bytes are left alone");
        let Progress::Transmission(neg) = p else {
            panic!("{p:?}")
        };
        assert!(neg.structured);
        assert_eq!(neg.export.size, 1 << 20);
        assert!(neg.flags & FLAG_SEND_DF != 0 && neg.flags & FLAG_CAN_MULTI_CONN != 0);
        let r = replies(&out);
        assert_eq!(r[0], (OPT_STRUCTURED_REPLY, REP_ACK, vec![]));
        assert_eq!(r[1].1, REP_INFO);
        assert_eq!(&r[1].2[..2], &INFO_EXPORT.to_be_bytes());
        assert_eq!(&r[2].2[..2], &INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(r[3].2, b"\x00\x01disk");
        assert_eq!(r.last().unwrap().1, REP_ACK);
    }

    #[test]
    fn unknown_export_and_options_keep_the_session() {
        let mut input = 1u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_GO, &go_data("nope", &[])));
        input.extend(opt(1234, b"xyz"));
        input.extend(opt(OPT_INFO, b"\x00\x00\x00\x09ab"));
        input.extend(opt(OPT_GO, &go_data("broken", &[])));
        input.extend(opt(OPT_LIST, &[]));
        input.extend(opt(OPT_ABORT, &[]));
        let (n, p, out) = run(&input);
        assert_eq!(n, input.len());
        assert_eq!(p, Progress::Close(CloseReason::Abort));
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(
            types,
            [
                REP_ERR_UNKNOWN,
                REP_ERR_UNSUP,
                REP_ERR_INVALID,
                REP_ERR_UNKNOWN,
                REP_SERVER,
                REP_SERVER,
                REP_ACK,
                REP_ACK
            ]
        );
    }

    #[test]
    fn export_name_without_zeroes_and_with() {
        for (flags, pad) in [(3u32, 0usize), (1, 124)] {
            let mut input = flags.to_be_bytes().to_vec();
            input.extend(opt(OPT_EXPORT_NAME, b""));
            let (_, p, out) = run(&input);
            assert!(matches!(p, Progress::Transmission(_)));
            assert_eq!(out.len(), 10 + pad);
        }
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(opt(OPT_EXPORT_NAME, b"missing"));
        assert!(matches!(
            run(&input).1,
            Progress::Close(CloseReason::ExportUnavailable(_))
        ));
    }

    #[test]
    fn violations_close() {
        assert!(matches!(
            run(&8u32.to_be_bytes()).1,
            Progress::Close(CloseReason::Protocol(_))
        ));
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend_from_slice(&[0xAB; 16]);
        assert!(matches!(
            run(&input).1,
            Progress::Close(CloseReason::Protocol(_))
        ));
    }

    #[test]
    fn long_options_are_skipped_in_pieces() {
        let mut input = 3u32.to_be_bytes().to_vec();
        let big = vec![0u8; MAX_OPTION_LEN as usize + 10];
        input.extend(opt(OPT_GO, &big));
        input.extend(opt(9999, &big));
        input.extend(opt(OPT_ABORT, &[]));
        let mut h = Handshake::new(HandshakeConfig::default());
        let mut out = Vec::new();
        let mut fed = 0;
        let mut pending: Vec<u8> = Vec::new();
        let mut last = Progress::Continue;
        for chunk in input.chunks(1000) {
            pending.extend_from_slice(chunk);
            let (n, p) = h.advance(&pending, &Two, &mut out);
            pending.drain(..n);
            fed += n;
            last = p;
        }
        assert_eq!(fed, input.len());
        assert_eq!(last, Progress::Close(CloseReason::Abort));
        let types: Vec<u32> = replies(&out).iter().map(|r| r.1).collect();
        assert_eq!(types, [REP_ERR_TOO_BIG, REP_ERR_UNSUP, REP_ACK]);
    }
}
