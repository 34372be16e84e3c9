//! oubli-nbd: an NBD server over an oubli store, so any filesystem gets a block device on which TRIM, discard and write-zeroes erase at the next commit.
//!
//! Each *export* is one store object (see [`exports`]); the server speaks
//! the fixed newstyle NBD protocol on Unix sockets and TCP ([`serve`]). The
//! mapping of commands to the store:
//!
//! | NBD | store | erasure |
//! |---|---|---|
//! | `READ` | `read` | |
//! | `WRITE` (+`FUA` → `flush`) | `write` (without FUA: after the reply, [`WriteBehind`]) | the overwritten bytes, at the next commit |
//! | `FLUSH` | `flush`: durable through the intent log, the epoch stays open | |
//! | `TRIM` | `punch_hole` | the trimmed bytes, at the next commit |
//! | `WRITE_ZEROES` | `punch_hole`; with `NO_HOLE`, `write` of zeros | the old bytes, at the next commit |
//!
//! An authentication failure in the store ([`oubli_core::Error::Corrupt`])
//! becomes an `EIO` reply and a log line, never data. The byte-level parts —
//! [`handshake`], [`request`], [`reply`] — are sans-IO and fuzzed.
//!
//! ```no_run
//! use oubli_nbd::{exports, serve, Endpoint, ServerConfig};
//! # fn demo(store: std::sync::Arc<oubli_core::Store>) -> Result<(), Box<dyn std::error::Error>> {
//! exports::create_export(&store, "disk", 1 << 30)?;
//! let server = serve(
//!     store,
//!     &[Endpoint::Unix("/run/oubli.sock".into())],
//!     ServerConfig { default_export: Some("disk".into()), ..ServerConfig::default() },
//! )?;
//! // ... `nbdfuse`, `qemu-img`, `nbd-client` connect to /run/oubli.sock ...
//! server.shutdown()?; // closes connections and commits: trimmed data is gone
//! # Ok(()) }
//! ```

mod behind;
mod dropped;
pub mod exports;
pub mod handshake;
pub mod liveness;
pub mod proto;
pub mod reply;
pub mod request;
mod server;
pub mod socket;
mod spare;
pub mod tls;

pub use behind::WriteBehind;
pub use exports::{
    create_export, delete_export, export_settings, list_exports, lookup_export, resize_export,
    set_export_settings, Export, ExportSettings,
};
pub use handshake::{
    Catalog, ExportInfo, Handshake, HandshakeConfig, Negotiated, Progress, TlsMode,
};
pub use liveness::{Liveness, LivenessReport};
pub use proto::Errno;
pub use request::{check, parse_request, Action, Limits, Request};
pub use server::{serve, stderr_log, Endpoint, Log, ServerConfig, ServerHandle, Stats, Tls};
pub use tls::{TlsCredentials, TlsError};
