//! TLS from PEM files, for the router's public ports (gRPC and HTTP), the worker's gRPC port and
//! the router's links to workers. rustls with the `ring` provider; nothing here is on by default.
//!
//! - [`cert`]: a server certificate chain and key from two PEM files ([`CertFiles`]), served
//!   through a [`ReloadingCert`] resolver that re-reads the files every second: a new pair is used
//!   by the next handshake without a restart; a broken or mismatched pair keeps the last good one
//!   and logs a WARN.
//! - [`server`]: a TLS listener ([`TlsIncoming`]) that hands handshaken connections to tonic
//!   (`serve_with_incoming*`) or to axum (`axum::serve`), with the ALPN protocol of each.
//! - [`grpc`]: a tonic server on a listener, plain or TLS, behind one future type.
//! - [`client`]: the client side of a link to a TLS server: the CA file it trusts and the name it
//!   verifies.
//! - `test_ca` (feature `test-ca`): a CA made at run time, for tests.

pub mod cert;
pub mod client;
pub mod grpc;
pub mod server;
#[cfg(any(test, feature = "test-ca"))]
pub mod test_ca;

use std::path::PathBuf;

pub use cert::{CertFiles, ReloadingCert};
pub use client::ClientTls;
pub use server::{Alpn, TlsIncoming};

/// Why a TLS setting or file cannot be used. Every message names the setting or file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// One of the pair of settings is set without the other.
    #[error(
        "`{given}` is set but `{missing}` is not: TLS needs both the certificate chain and its key"
    )]
    HalfPair {
        /// The setting that is set.
        given: &'static str,
        /// The setting that is missing.
        missing: &'static str,
    },
    /// A file that cannot be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file should hold ("TLS certificate file", ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file whose content is not what it should hold.
    #[error("invalid {what} {path}: {reason}")]
    Invalid {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A server name that is not a DNS name or an IP address.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
}
