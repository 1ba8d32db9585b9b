//! The client side: trust a CA file (PEM, one or more certificates) and verify a server name.
//! A long-running client re-reads the file on change ([`ClientTls::watch`], the loop of
//! [`observability::reload`], as for the server certificates), so a rotated CA takes effect for
//! new connections without a restart (connections already open keep the trust they were made with).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// PEM of the CA file as last read with at least one certificate in it (shared by clones).
    ca_pem: Arc<Mutex<Vec<u8>>>,
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
        let ca_pem = read_ca(path)?;
        let server_name = server_name.trim();
        let server_name = (!server_name.is_empty()).then(|| server_name.to_string());
        if let Some(name) = &server_name {
            ServerName::try_from(name.as_str()).map_err(|_| TlsError::ServerName(name.clone()))?;
        }
        Ok(Some(Self {
            ca: path.to_path_buf(),
            ca_pem: Arc::new(Mutex::new(ca_pem)),
            server_name,
        }))
    }

    /// The CA certificates trusted now (PEM): the file's content at the last good read.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.ca_pem.lock().expect("CA lock").clone()
    }

    /// Re-reads the CA file once: a changed file with at least one certificate replaces the
    /// trusted one (returns `true`); an unchanged file returns `false`.
    ///
    /// Errors: the file cannot be read or holds no certificate (say, caught half-written during a
    /// rotation); the trusted CA stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let pem = read_ca(&self.ca)?;
        let mut current = self.ca_pem.lock().expect("CA lock");
        if *current == pem {
            return Ok(false);
        }
        *current = pem;
        tracing::info!(ca = %self.ca.display(), "TLS CA file changed; new connections trust the new CA");
        Ok(true)
    }

    /// Spawns the task that calls [`ClientTls::reload`] every `period` (see
    /// [`observability::reload`]).
    pub fn watch(&self, period: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        observability::reload::poll("TLS CA", period, move || me.reload())
    }

    /// The `http(s)://HOST:PORT` URI to dial `address` (`HOST:PORT`) with: `https` for TLS.
    pub fn uri(tls: Option<&Self>, address: &str) -> String {
        match tls {
            Some(_) => format!("https://{address}"),
            None => format!("http://{address}"),
        }
    }

    /// tonic's client configuration for a new connection: trusts only the CA file's certificates
    /// ([`Self::ca_pem`]).
    pub fn tonic_config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.ca_pem()));
        match &self.server_name {
            Some(name) => config.domain_name(name.clone()),
            None => config,
        }
    }
}

/// Reads the CA file at `path` and checks it holds at least one PEM certificate.
fn read_ca(path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(path, "TLS CA file")?;
    parse_certificates(&pem).map_err(|e| TlsError::Invalid {
        what: "TLS CA file",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(pem)
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

    #[test]
    fn a_rotated_ca_file_is_read_again_and_a_broken_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        let (first, second) = (
            crate::test_ca::TestCa::new("first").pem,
            crate::test_ca::TestCa::new("second").pem,
        );
        std::fs::write(&path, &first).unwrap();
        let tls = ClientTls::load(path.to_str().unwrap(), "")
            .unwrap()
            .unwrap();
        assert!(!tls.reload().unwrap());
        assert_eq!(tls.ca_pem(), first.as_bytes());
        std::fs::write(&path, &second).unwrap();
        assert!(tls.reload().unwrap());
        assert_eq!(tls.ca_pem(), second.as_bytes());
        // Half-written or removed: the last good CA stays.
        std::fs::write(&path, "").unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(tls.ca_pem(), second.as_bytes());
        std::fs::remove_file(&path).unwrap();
        assert!(tls.reload().is_err());
        assert_eq!(tls.ca_pem(), second.as_bytes());
        // Clones (one per worker link) share what was last read.
        let clone = tls.clone();
        std::fs::write(&path, &first).unwrap();
        assert!(tls.reload().unwrap());
        assert_eq!(clone.ca_pem(), first.as_bytes());
        std::fs::remove_file(&path).unwrap();
        assert!(clone.reload().is_err());
        assert_eq!(tls.ca_pem(), first.as_bytes());
    }
}
