//! The client side: trust a CA file (PEM, one or more certificates) and verify a server name.

use std::path::{Path, PathBuf};

use rustls_pki_types::ServerName;
use tonic::transport::{Certificate, ClientTlsConfig};

use crate::cert::{parse_certificates, read};
use crate::TlsError;

/// TLS settings of a gRPC client: the CA it trusts, and the name the server's certificate must
/// carry (when `None`, the host of the address dialled).
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The CA file.
    pub ca: PathBuf,
    /// PEM of the CA file, checked to hold at least one certificate.
    ca_pem: Vec<u8>,
    /// The name to verify instead of the dialled host.
    pub server_name: Option<String>,
}

impl ClientTls {
    /// Reads and checks the CA file `ca` (`None` when empty: plain text) and the optional
    /// `server_name` (a DNS name or an IP address; empty = the dialled host).
    ///
    /// Errors: the CA file cannot be read or holds no certificate (the message names it); the
    /// server name is not a valid name.
    pub fn load(ca: &str, server_name: &str) -> Result<Option<Self>, TlsError> {
        let ca = ca.trim();
        if ca.is_empty() {
            return Ok(None);
        }
        let path = Path::new(ca);
        let ca_pem = read(path, "TLS CA file")?;
        parse_certificates(&ca_pem).map_err(|reason| TlsError::Invalid {
            what: "TLS CA file",
            path: path.to_path_buf(),
            reason,
        })?;
        let server_name = server_name.trim();
        let server_name = (!server_name.is_empty()).then(|| server_name.to_string());
        if let Some(name) = &server_name {
            ServerName::try_from(name.as_str()).map_err(|_| TlsError::ServerName(name.clone()))?;
        }
        Ok(Some(Self {
            ca: path.to_path_buf(),
            ca_pem,
            server_name,
        }))
    }

    /// The `http(s)://HOST:PORT` URI to dial `address` (`HOST:PORT`) with: `https` for TLS.
    pub fn uri(tls: Option<&Self>, address: &str) -> String {
        match tls {
            Some(_) => format!("https://{address}"),
            None => format!("http://{address}"),
        }
    }

    /// tonic's client configuration: trusts only the CA file's certificates.
    pub fn tonic_config(&self) -> ClientTlsConfig {
        let config =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.ca_pem.clone()));
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_and_server_name_are_checked() {
        assert!(ClientTls::load(" ", "").unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, crate::test_ca::TestCa::new("ca").pem).unwrap();
        let ca = ca.to_str().unwrap();
        let tls = ClientTls::load(ca, "").unwrap().unwrap();
        assert_eq!(tls.server_name, None);
        assert_eq!(ClientTls::uri(Some(&tls), "w:1"), "https://w:1");
        assert_eq!(ClientTls::uri(None, "w:1"), "http://w:1");
        let tls = ClientTls::load(ca, "worker.ns.svc").unwrap().unwrap();
        assert_eq!(tls.server_name.as_deref(), Some("worker.ns.svc"));
        let err = ClientTls::load(ca, "bad name!").unwrap_err().to_string();
        assert_eq!(err, "invalid TLS server name \"bad name!\"");
        let err = ClientTls::load("/nonexistent/ca.pem", "")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot read TLS CA file /nonexistent/ca.pem"),
            "{err}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = ClientTls::load(empty.to_str().unwrap(), "")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid TLS CA file") && err.contains("no PEM certificate"),
            "{err}"
        );
    }
}
