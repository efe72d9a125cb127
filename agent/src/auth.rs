//! Who may call the agent: mutual TLS, with certificates read from files and reloaded when they change.
//!
//! # Why mutual TLS and not a ServiceAccount token checked with TokenReview
//! - The data path does not depend on the API server: the agent authenticates a call with what it has on disk,
//!   so the operator can still push or withdraw impairments while the API server is slow, overloaded or down
//!   (which is exactly what chaos experiments provoke), and a plan apply costs no extra round trip.
//! - No bearer secret travels: a token sent to an agent could be replayed against other agents or the API
//!   server until it expires; a TLS client key never leaves the operator's pod.
//! - No cluster-wide RBAC for the agent (`system:auth-delegator` to create TokenReviews).
//! - The cost is certificate management: the Helm chart creates a CA and two certificates, and both sides
//!   re-read the files on change, so rotation needs no restart.
//!
//! # The identity rule
//! A caller is the operator when its certificate chains to the CA in `ca.crt` **and** carries a DNS subject
//! alternative name equal to the configured operator identity (default
//! [`DEFAULT_OPERATOR_IDENTITY`]). A DNS SAN rather than a URI SAN (SPIFFE style) because Helm's
//! `genSignedCert`, which the chart uses to create the certificates, can only write DNS and IP SANs; and the
//! SAN rather than the subject CN because CN matching is deprecated and ambiguous. The identity names the
//! operator's ServiceAccount (`<serviceaccount>.<namespace>.serviceaccount.isthmus`), so a certificate issued
//! by the same CA for anything else (the agent's own serving certificate, another ServiceAccount) is refused
//! with HTTP 403; a certificate from another CA, or none, fails the TLS handshake.
//! Note: wildcard SANs are honoured as in server-name checking, so the CA must not issue `*.` names.
//!
//! A second identity, the metrics scraper's (`--scraper-identity`, the chart's `isthmus-metrics-scraper`
//! Secret), may read `/metrics` on the same port and nothing else: per-destination metrics name tenants' links
//! and pods, so they are not served to anonymous callers.
//!
//! # Files (a mounted `kubernetes.io/tls` Secret)
//! - `ca.crt`: the CA that signs the operator's client certificate (only this CA is trusted);
//! - `tls.crt`, `tls.key`: the agent's serving certificate, valid for the DNS name the operator dials
//!   (`isthmus-agent` by default, see `isthmus_agent_api::client::DEFAULT_AGENT_SERVER_NAME`).
//!
//! The files are re-read every few seconds; when their bytes changed and they form a valid configuration, new
//! connections use it (kubelet replaces Secret volumes by swapping a symlink, so the three files change
//! together). A half-written or invalid set is reported and the previous configuration stays in force.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use isthmus_agent_api::tls::{TlsError, TlsFiles, TlsMaterial, crypto_provider};
use rustls::pki_types::ServerName;
use rustls::server::{ParsedCertificate, ServerConfig, WebPkiClientVerifier};

/// The operator's identity when none is configured.
pub const DEFAULT_OPERATOR_IDENTITY: &str = "isthmus-operator.isthmus-system.serviceaccount.isthmus";

/// Who a caller is, by its client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Plans, observed state, capabilities and metrics.
    Operator,
    /// Metrics only (Prometheus, with the chart's scraper certificate).
    Scraper,
}

/// A DNS SAN a caller's certificate must carry.
#[derive(Debug, Clone)]
pub struct Identity(ServerName<'static>);

impl Identity {
    pub fn new(dns_name: &str) -> Result<Self, AuthError> {
        match ServerName::try_from(dns_name.to_owned()) {
            Ok(name @ ServerName::DnsName(_)) => Ok(Self(name)),
            _ => Err(AuthError::Identity(dns_name.to_owned())),
        }
    }

    fn carried_by(&self, certificate: &ParsedCertificate<'_>) -> bool {
        rustls::client::verify_server_name(certificate, &self.0).is_ok()
    }

    pub fn name(&self) -> String {
        self.0.to_str().into_owned()
    }
}

/// The identities the agent serves: the operator's, and optionally a metrics scraper's.
#[derive(Debug, Clone)]
pub struct Callers {
    pub operator: Identity,
    pub scraper: Option<Identity>,
}

impl Callers {
    /// Who a verified client certificate chain (end entity first) belongs to.
    pub fn authorize(&self, chain: Option<&[rustls::pki_types::CertificateDer<'_>]>) -> Result<Caller, String> {
        let Some(end_entity) = chain.and_then(|c| c.first()) else {
            return Err("no client certificate".into());
        };
        let parsed =
            ParsedCertificate::try_from(end_entity).map_err(|e| format!("unreadable client certificate: {e}"))?;
        if self.operator.carried_by(&parsed) {
            return Ok(Caller::Operator);
        }
        match &self.scraper {
            Some(scraper) if scraper.carried_by(&parsed) => Ok(Caller::Scraper),
            Some(scraper) => Err(format!(
                "the client certificate is neither the operator's nor the scraper's (expected DNS SAN {} or {})",
                self.operator.name(),
                scraper.name()
            )),
            None => Err(format!(
                "the client certificate is not for the operator (expected DNS SAN {})",
                self.operator.name()
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("operator identity {0:?} is not a DNS name")]
    Identity(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The agent's current TLS server configuration, replaced when the files change.
#[derive(Debug)]
pub struct ReloadingTls {
    files: TlsFiles,
    loaded: Mutex<TlsMaterial>,
    current: RwLock<Arc<ServerConfig>>,
}

impl ReloadingTls {
    /// Loads the files; fails when they are missing or invalid (the agent must not start without them).
    pub fn load(files: TlsFiles) -> Result<Self, AuthError> {
        let material = files.read()?;
        let config = build_server_config(&files, &material)?;
        Ok(Self { files, loaded: Mutex::new(material), current: RwLock::new(config) })
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Re-reads the files; true when a new configuration took effect.
    pub fn reload_if_changed(&self) -> Result<bool, AuthError> {
        let material = self.files.read()?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if *loaded == material {
            return Ok(false);
        }
        let config = build_server_config(&self.files, &material)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = config;
        *loaded = material;
        Ok(true)
    }

    /// Polls the files every `interval` for as long as the returned task runs.
    pub fn watch(self: Arc<Self>, interval: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_error = None::<String>;
            loop {
                ticker.tick().await;
                let this = self.clone();
                match tokio::task::spawn_blocking(move || this.reload_if_changed()).await {
                    Ok(Ok(true)) => {
                        tracing::info!("TLS certificates changed on disk; new connections use them");
                        last_error = None;
                    }
                    Ok(Ok(false)) => last_error = None,
                    Ok(Err(e)) => {
                        let message = e.to_string();
                        if last_error.as_deref() != Some(message.as_str()) {
                            tracing::warn!(error = %message, "TLS files unusable; keeping the previous certificates");
                        }
                        last_error = Some(message);
                    }
                    Err(e) => tracing::error!(error = %e, "TLS reload task failed"),
                }
            }
        })
    }
}

fn build_server_config(files: &TlsFiles, material: &TlsMaterial) -> Result<Arc<ServerConfig>, AuthError> {
    let provider = crypto_provider();
    // Client certificates are mandatory: a connection without one fails the handshake.
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(material.root_store(files)?), provider.clone()).build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::from)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(material.certificate_chain(files)?, material.private_key(files)?)
        .map_err(TlsError::from)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
