//! A server certificate from PEM files, re-read on change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::TlsError;

/// The two PEM files of a server certificate: the chain (leaf first, then intermediates) and the
/// private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain file.
    pub cert: PathBuf,
    /// The private key file.
    pub key: PathBuf,
}

impl CertFiles {
    /// The files of a pair of settings (`cert_setting`, `key_setting` name them in errors):
    /// `None` when both are empty (TLS off).
    ///
    /// Errors: [`TlsError::HalfPair`] when only one is set.
    pub fn from_settings(
        (cert_setting, cert): (&'static str, &str),
        (key_setting, key): (&'static str, &str),
    ) -> Result<Option<Self>, TlsError> {
        match (cert.trim(), key.trim()) {
            ("", "") => Ok(None),
            (_, "") => Err(TlsError::HalfPair {
                given: cert_setting,
                missing: key_setting,
            }),
            ("", _) => Err(TlsError::HalfPair {
                given: key_setting,
                missing: cert_setting,
            }),
            (cert, key) => Ok(Some(Self {
                cert: cert.into(),
                key: key.into(),
            })),
        }
    }

    /// Reads both files.
    ///
    /// Errors: [`TlsError::Read`] naming the file that cannot be read.
    fn read(&self) -> Result<Contents, TlsError> {
        Ok(Contents {
            cert: read(&self.cert, "TLS certificate file")?,
            key: read(&self.key, "TLS key file")?,
        })
    }

    /// Reads and checks the pair: a chain of at least one certificate, a key, and the key is the
    /// leaf's.
    ///
    /// Errors: [`TlsError::Read`] or [`TlsError::Invalid`] naming the file.
    pub fn load(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        self.certified(&self.read()?)
    }

    fn certified(&self, contents: &Contents) -> Result<Arc<CertifiedKey>, TlsError> {
        let invalid = |path: &Path, what, reason: String| TlsError::Invalid {
            what,
            path: path.to_path_buf(),
            reason,
        };
        let chain = parse_certificates(&contents.cert)
            .map_err(|e| invalid(&self.cert, "TLS certificate file", e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
            invalid(
                &self.key,
                "TLS key file",
                format!("no PEM private key: {e}"),
            )
        })?;
        let signing = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| invalid(&self.key, "TLS key file", e.to_string()))?;
        let certified = CertifiedKey::new(chain, signing);
        certified.keys_match().map_err(|e| {
            invalid(
                &self.key,
                "TLS key file",
                format!(
                    "the key does not belong to the certificate {}: {e}",
                    self.cert.display()
                ),
            )
        })?;
        Ok(Arc::new(certified))
    }
}

/// Why a PEM text gives no certificate chain.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PemCertificatesError {
    /// A PEM section is malformed.
    #[error("malformed PEM: {0}")]
    Malformed(#[from] rustls_pki_types::pem::Error),
    /// The text holds no certificate section.
    #[error("no PEM certificate (-----BEGIN CERTIFICATE-----) in it")]
    NoCertificate,
}

/// The certificates of a PEM text, in order.
///
/// Errors: a malformed PEM section, or none at all ([`PemCertificatesError`] says which).
pub(crate) fn parse_certificates(
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, PemCertificatesError> {
    let chain = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>()?;
    if chain.is_empty() {
        return Err(PemCertificatesError::NoCertificate);
    }
    Ok(chain)
}

/// Reads a file whose errors name it as `what`; read again while it changes during the read
/// ([`observability::reload::read_settled`]), so a rotation in progress is never half taken (an
/// empty or partial PEM is refused by its parser and the last good one stays).
pub(crate) fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    observability::reload::read_settled(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The crypto provider of every TLS configuration here.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

/// The raw content of both files (what a reload compares).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// The server certificate every handshake gets: the last good pair read from [`CertFiles`].
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    current: RwLock<(Contents, Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    /// Reads `files` now.
    ///
    /// Errors: as [`CertFiles::load`].
    pub fn load(files: CertFiles) -> Result<Arc<Self>, TlsError> {
        let contents = files.read()?;
        let certified = files.certified(&contents)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((contents, certified)),
        }))
    }

    /// The files it serves.
    pub fn files(&self) -> &CertFiles {
        &self.files
    }

    /// The certificate chain served now (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.read().expect("cert lock").1.cert.clone()
    }

    /// Re-reads the files once: a changed, valid pair replaces the served one (returns `true`);
    /// unchanged files return `false`.
    ///
    /// Errors: the files cannot be read or are not a valid pair; the served pair stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let contents = self.files.read()?;
        if self.current.read().expect("cert lock").0 == contents {
            return Ok(false);
        }
        let certified = self.files.certified(&contents)?;
        *self.current.write().expect("cert lock") = (contents, certified);
        tracing::info!(cert = %self.files.cert.display(), "TLS certificate files changed; new connections get the new certificate");
        Ok(true)
    }

    /// Spawns the task that calls [`ReloadingCert::reload`] every `period` (see
    /// [`observability::reload`]).
    pub fn watch(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        observability::reload::poll("TLS certificate", period, move || me.reload())
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("cert lock").1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_ca::TestCa;

    fn pair() -> (tempfile::TempDir, CertFiles) {
        let dir = tempfile::tempdir().unwrap();
        let (_, files) = TestCa::new("ca").write(dir.path(), "server", &["localhost"]);
        (dir, files)
    }

    #[test]
    fn both_settings_or_neither() {
        let cert = ("tls_cert", "a.crt");
        let key = ("tls_key", "a.key");
        assert_eq!(
            CertFiles::from_settings(("tls_cert", " "), ("tls_key", "")).unwrap(),
            None
        );
        assert_eq!(
            CertFiles::from_settings(cert, key).unwrap(),
            Some(CertFiles {
                cert: "a.crt".into(),
                key: "a.key".into()
            })
        );
        let err = CertFiles::from_settings(cert, ("tls_key", "")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "`tls_cert` is set but `tls_key` is not: TLS needs both the certificate chain and its key"
        );
        let err = CertFiles::from_settings(("tls_cert", ""), key).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("`tls_key` is set but `tls_cert` is not"),
            "{err}"
        );
    }

    #[test]
    fn bad_files_are_named() {
        let (dir, files) = pair();
        assert_eq!(files.load().unwrap().cert.len(), 1);
        let missing = CertFiles {
            cert: dir.path().join("nope.crt"),
            ..files.clone()
        };
        let err = missing.load().unwrap_err().to_string();
        assert!(
            err.starts_with("cannot read TLS certificate file ") && err.contains("nope.crt"),
            "{err}"
        );
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let err = CertFiles {
            cert: garbage.clone(),
            ..files.clone()
        }
        .load()
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("invalid TLS certificate file ") && err.contains("no PEM certificate"),
            "{err}"
        );
        let err = CertFiles {
            key: garbage,
            ..files.clone()
        }
        .load()
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("invalid TLS key file ") && err.contains("no PEM private key"),
            "{err}"
        );
        // A key of another certificate.
        let (_other_dir, other) = pair();
        let err = CertFiles {
            key: other.key,
            ..files
        }
        .load()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("the key does not belong to the certificate"),
            "{err}"
        );
    }

    #[test]
    fn reload_takes_a_new_pair_and_keeps_the_old_one_when_broken() {
        let (_dir, files) = pair();
        let cert = ReloadingCert::load(files.clone()).unwrap();
        let first = cert.chain();
        assert!(!cert.reload().unwrap());
        TestCa::new("ca2").write_server(&files, &["localhost"]);
        assert!(cert.reload().unwrap());
        let second = cert.chain();
        assert_ne!(first, second);
        // Half-written: a new key with the old certificate is refused; the served pair stays.
        let (_, key) = TestCa::new("ca3").server_cert(&["localhost"]);
        std::fs::write(&files.key, key).unwrap();
        assert!(cert
            .reload()
            .unwrap_err()
            .to_string()
            .contains("does not belong"));
        std::fs::remove_file(&files.cert).unwrap();
        assert!(cert
            .reload()
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        assert_eq!(cert.chain(), second);
    }
}
