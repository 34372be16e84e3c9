//! TLS for the NBD server (rustls on ring): certificates loaded from a directory in nbdkit's layout, client certificates required, and a TLS session split into a read half and a write half so that a connection's reader and its workers run at once.
//!
//! The directory holds `ca-cert.pem` (the CA that signs client
//! certificates: a client is authenticated by presenting one it signed),
//! `server-cert.pem` (the server's chain, leaf first) and `server-key.pem`.
//! docs/NBD.md ("TLS") shows how to make them; `scripts/nbd-certs` does it.
//!
//! The upgrade happens in the I/O layer: the sans-IO handshake returns
//! [`Progress::StartTls`](crate::Progress::StartTls) after its ACK, and the
//! server wraps the socket here before feeding the handshake again.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConnection};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use zeroize::{Zeroize, Zeroizing};

/// File names in a certificates directory (nbdkit's and qemu's convention).
pub const CA_CERT: &str = "ca-cert.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";

/// A certificate directory that cannot be used.
#[derive(Debug)]
pub struct TlsError {
    /// The file at fault (or the directory).
    pub path: PathBuf,
    pub why: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.why)
    }
}

impl std::error::Error for TlsError {}

/// The server's TLS identity and the CA its clients must present a
/// certificate from. Cheap to clone.
#[derive(Clone)]
pub struct TlsCredentials {
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("TlsCredentials(..)")
    }
}

impl TlsCredentials {
    /// Loads `ca-cert.pem`, `server-cert.pem` and `server-key.pem` from `dir`.
    /// Clients must present a certificate that chains to a certificate of
    /// `ca-cert.pem`; TLS 1.2 and 1.3 are offered.
    pub fn load(dir: &Path) -> Result<TlsCredentials, TlsError> {
        let err = |file: &str, why: String| TlsError {
            path: dir.join(file),
            why,
        };
        let read = |file: &str| -> Result<Zeroizing<Vec<u8>>, TlsError> {
            std::fs::read(dir.join(file))
                .map(Zeroizing::new)
                .map_err(|e| err(file, e.to_string()))
        };
        let certs = |file: &str| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            let pem = read(file)?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err(file, format!("not a PEM certificate file: {e}")))?;
            if certs.is_empty() {
                return Err(err(file, "holds no certificate".into()));
            }
            Ok(certs)
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in certs(CA_CERT)? {
            roots
                .add(cert)
                .map_err(|e| err(CA_CERT, format!("not a usable CA certificate: {e}")))?;
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| err(CA_CERT, e.to_string()))?;
        let chain = certs(SERVER_CERT)?;
        let mut key = {
            let pem = read(SERVER_KEY)?;
            PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|e| err(SERVER_KEY, format!("not a PEM private key: {e}")))?
        };
        // Signing key made from a borrowed DER, so that our copy is wiped
        // here (rustls would drop an owned one without wiping it).
        let signer = rustls::crypto::ring::sign::any_supported_type(&key);
        key.zeroize();
        let signer = signer.map_err(|e| {
            err(
                SERVER_KEY,
                format!(
                    "unusable key ({e}); an ECDSA key written by certtool may need \
                     `openssl pkcs8 -topk8 -nocrypt`, or use an RSA key"
                ),
            )
        })?;
        let certified = rustls::sign::CertifiedKey::new(chain, signer);
        certified
            .keys_match()
            .map_err(|e| err(SERVER_CERT, format!("does not match {SERVER_KEY}: {e}")))?;
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| err("", e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
        Ok(TlsCredentials {
            config: Arc::new(config),
        })
    }

    pub(crate) fn session(&self) -> io::Result<ServerConnection> {
        ServerConnection::new(self.config.clone()).map_err(io::Error::other)
    }
}

/// What a TLS session runs over: the connection's socket (a stream that can
/// be cloned into independent read and write handles).
pub(crate) trait Socket: Read + Write + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
}

struct Session<S> {
    conn: Mutex<ServerConnection>,
    /// The socket's write side. Held while records are sealed and sent, so
    /// that they reach the wire in the order of their sequence numbers;
    /// taken before `conn`, never after.
    send: Mutex<S>,
}

impl<S: Socket> Session<S> {
    fn conn(&self) -> MutexGuard<'_, ServerConnection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seals `plain` (may be empty: then only what rustls has queued, such
    /// as alerts or key updates) and sends it.
    fn send(&self, plain: &[u8]) -> io::Result<()> {
        let mut sock = self.send.lock().unwrap_or_else(|e| e.into_inner());
        let mut sealed = Vec::new();
        // A few records at a time: the ciphertext waiting in memory stays small.
        let mut chunks = plain.chunks(64 * 1024);
        loop {
            let chunk = chunks.next();
            {
                let mut conn = self.conn();
                if let Some(chunk) = chunk {
                    conn.writer().write_all(chunk)?;
                }
                while conn.wants_write() {
                    conn.write_tls(&mut sealed)?;
                }
            }
            sock.write_all(&sealed)?;
            sealed.clear();
            if chunk.is_none() {
                return sock.flush();
            }
        }
    }
}

/// Reads the plaintext of a TLS session.
pub(crate) struct TlsReader<S> {
    session: Arc<Session<S>>,
    sock: S,
    /// Ciphertext read from the socket that rustls has not taken yet.
    incoming: Vec<u8>,
    /// The socket reached end of input.
    eof: bool,
}

/// Writes plaintext into a TLS session. Writes from several threads are
/// serialised; each `write` goes out whole before the next one starts.
pub(crate) struct TlsWriter<S> {
    session: Arc<Session<S>>,
}

/// Runs the TLS handshake on `sock` (which already received `early`: bytes
/// read past the `NBD_OPT_STARTTLS` option) and returns the two halves.
/// A client without a certificate from the CA fails here.
pub(crate) fn accept<S: Socket>(
    credentials: &TlsCredentials,
    sock: S,
    early: Vec<u8>,
) -> io::Result<(TlsReader<S>, TlsWriter<S>)> {
    let mut conn = credentials.session()?;
    let mut io = Prefixed {
        early: io::Cursor::new(early),
        sock,
    };
    while conn.is_handshaking() {
        let (rd, wr) = conn.complete_io(&mut io)?;
        if rd == 0 && wr == 0 && conn.is_handshaking() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client went away during the TLS handshake",
            ));
        }
    }
    // `send` drains every record right after sealing at most 64 KiB, so the
    // queue stays small; without a limit, a record rustls queued by itself
    // (an alert, a key update) cannot make a write accept nothing.
    conn.set_buffer_limit(None);
    // Unread bytes of `early` belong to the session too.
    let pos = io.early.position() as usize;
    let incoming = io.early.into_inner().split_off(pos);
    let sock = io.sock;
    let session = Arc::new(Session {
        conn: Mutex::new(conn),
        send: Mutex::new(sock.try_clone()?),
    });
    Ok((
        TlsReader {
            session: session.clone(),
            sock,
            incoming,
            eof: false,
        },
        TlsWriter { session },
    ))
}

impl<S: Socket> TlsReader<S> {
    /// The TLS version and cipher suite, for the log.
    pub(crate) fn describe(&self) -> String {
        let conn = self.session.conn();
        let version = conn.protocol_version().map(|v| format!("{v:?}"));
        let suite = conn
            .negotiated_cipher_suite()
            .map(|s| format!("{:?}", s.suite()));
        format!(
            "{}, {}",
            version.as_deref().unwrap_or("TLS"),
            suite.as_deref().unwrap_or("?")
        )
    }
}

impl<S: Socket> Read for TlsReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut conn = self.session.conn();
            match conn.reader().read(buf) {
                // Ok(0): the client sent close_notify.
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if !self.incoming.is_empty() {
                let mut slice = &self.incoming[..];
                let taken = conn.read_tls(&mut slice)?;
                self.incoming.drain(..taken);
                let processed = conn.process_new_packets();
                let reply = conn.wants_write();
                drop(conn);
                if reply {
                    // An alert for a bad record, a key update, ...
                    let _ = self.session.send(&[]);
                }
                if let Err(e) = processed {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                }
                continue;
            }
            drop(conn);
            if self.eof {
                // End of input without close_notify: still the end of input;
                // a request cut short is caught by the caller.
                return Ok(0);
            }
            let mut raw = [0u8; 32 * 1024];
            match self.sock.read(&mut raw) {
                Ok(0) => self.eof = true,
                Ok(n) => self.incoming.extend_from_slice(&raw[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<S: Socket> Write for TlsWriter<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.session.send(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<S: Socket> TlsWriter<S> {
    /// Ends the TLS session (close_notify), as the protocol asks before the
    /// connection closes.
    pub(crate) fn close(&self) {
        self.session.conn().send_close_notify();
        let _ = self.session.send(&[]);
    }
}

/// The socket with bytes already read from it put back in front.
struct Prefixed<S> {
    early: io::Cursor<Vec<u8>>,
    sock: S,
}

impl<S: Read> Read for Prefixed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if (self.early.position() as usize) < self.early.get_ref().len() {
            return self.early.read(buf);
        }
        self.sock.read(buf)
    }
}

impl<S: Write> Write for Prefixed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}
