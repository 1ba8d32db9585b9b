//! A certificate authority made at run time, for tests (feature `test-ca`): no private key is
//! ever committed. Certificates carry what strict verifiers (Python's `ssl` with
//! `VERIFY_X509_STRICT`) ask for: key usages on the CA, an authority key identifier and the
//! `serverAuth` extended key usage on the leaves.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::CertFiles;

/// A self-signed CA that signs server certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem: String,
}

impl TestCa {
    /// A new CA whose subject common name is `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("generating a key");
        let pem = params.self_signed(&key).expect("self-signing").pem();
        Self {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses) signed by this CA: (chain
    /// PEM, key PEM).
    pub fn server_cert(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("valid names");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("generating a key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        (cert.pem(), key.serialize_pem())
    }

    /// Writes this CA's certificate to `dir/ca.pem` and a server certificate for `names` to
    /// `dir/{stem}.crt` and `dir/{stem}.key`; returns (CA file, server files).
    pub fn write(&self, dir: &Path, stem: &str, names: &[&str]) -> (std::path::PathBuf, CertFiles) {
        let ca = dir.join(format!("{stem}-ca.pem"));
        std::fs::write(&ca, &self.pem).expect("writing the CA");
        let files = CertFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        self.write_server(&files, names);
        (ca, files)
    }

    /// Writes a new server certificate for `names` over `files` (key first, then the chain).
    pub fn write_server(&self, files: &CertFiles, names: &[&str]) {
        let (cert, key) = self.server_cert(names);
        std::fs::write(&files.key, key).expect("writing the key");
        std::fs::write(&files.cert, cert).expect("writing the certificate");
    }
}
