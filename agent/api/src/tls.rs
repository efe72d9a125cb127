//! The TLS files both sides of the agent API read (cargo feature `tls`): a mounted `kubernetes.io/tls` Secret
//! with a `ca.crt`, read as one unit so that a rotation is noticed by comparing bytes, and parsed with the one
//! crypto provider isthmus uses. Kept apart from the operator's HTTP client (feature `client`) so that the agent,
//! which only serves, does not link it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The three PEM files of a mounted `kubernetes.io/tls` Secret with a `ca.crt` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the peer's certificate (the only one trusted).
    pub ca: PathBuf,
    /// This side's certificate chain.
    pub cert: PathBuf,
    /// This side's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// `ca.crt`, `tls.crt` and `tls.key` in `dir`, the layout of a mounted TLS Secret.
    pub fn in_dir(dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref();
        Self { ca: dir.join("ca.crt"), cert: dir.join("tls.crt"), key: dir.join("tls.key") }
    }

    /// Reads all three files at once, so that a caller can tell whether anything changed by comparing bytes.
    pub fn read(&self) -> Result<TlsMaterial, TlsError> {
        let read = |path: &Path| std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source });
        Ok(TlsMaterial { ca: read(&self.ca)?, cert: read(&self.cert)?, key: read(&self.key)? })
    }
}

/// The raw contents of [`TlsFiles`].
#[derive(Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").field("ca_bytes", &self.ca.len()).field("cert_bytes", &self.cert.len()).finish()
    }
}

impl TlsMaterial {
    pub fn ca_certificates(&self, files: &TlsFiles) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        parse_certificates(&files.ca, &self.ca)
    }

    pub fn certificate_chain(&self, files: &TlsFiles) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        parse_certificates(&files.cert, &self.cert)
    }

    pub fn private_key(&self, files: &TlsFiles) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| TlsError::Pem { path: files.key.clone(), reason: format!("no usable private key: {e}") })
    }

    /// The CA certificates as a root store for verifying the peer.
    pub fn root_store(&self, files: &TlsFiles) -> Result<rustls::RootCertStore, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in self.ca_certificates(files)? {
            roots.add(cert).map_err(|e| TlsError::Pem {
                path: files.ca.clone(),
                reason: format!("unusable CA certificate: {e}"),
            })?;
        }
        Ok(roots)
    }
}

fn parse_certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_owned(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_owned(), reason: "no CERTIFICATE block".into() });
    }
    Ok(certs)
}

/// The TLS crypto provider isthmus uses everywhere (ring), passed explicitly so that no process-wide default
/// has to be installed.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether `leaf` (DER) is a serving certificate for `dns_name`, valid now and chaining to one of the CA
/// certificates in `roots_pem`: how the operator and an agent tell that an agent's certificate comes from the CAs
/// in force, not only from one still trusted while it is being replaced.
pub fn serves_under(leaf: &CertificateDer<'_>, roots_pem: &str, dns_name: &str) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(roots_pem.as_bytes()).flatten() {
        if roots.add(der).is_err() {
            return false;
        }
    }
    if roots.is_empty() {
        return false;
    }
    let Ok(name) = rustls::pki_types::ServerName::try_from(dns_name.to_owned()) else { return false };
    let Ok(verifier) =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crypto_provider()).build()
    else {
        return false;
    };
    verifier.verify_server_cert(leaf, &[], &name, &[], rustls::pki_types::UnixTime::now()).is_ok()
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}
