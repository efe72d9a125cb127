//! Who may call the agent: mutual TLS, with certificates read from files and reloaded when they change.
//!
//! # Why mutual TLS and not a ServiceAccount token checked with TokenReview
//! - The data path does not depend on the API server: the agent authenticates a call with what it has on disk,
//!   so the operator can still push or withdraw impairments while the API server is slow, overloaded or down
//!   (which is exactly what chaos experiments provoke), and a plan apply costs no extra round trip.
//! - No bearer secret travels: a token sent to an agent could be replayed against other agents or the API
//!   server until it expires; a TLS client key never leaves the operator's pod.
//! - No cluster-wide RBAC for the agent (`system:auth-delegator` to create TokenReviews).
//! - The cost is certificate management: the operator is the CA (a Secret it creates through the API, never a
//!   Helm-rendered one) and signs each agent's certificate request; both sides pick up new certificates
//!   without a restart. The agent's token is used for one thing only: to request its own certificate.
//!
//! # The identity rule
//! A caller is the operator when its certificate chains to the CA in `ca.crt` **and** carries a DNS subject
//! alternative name equal to the configured operator identity (default
//! [`DEFAULT_OPERATOR_IDENTITY`]). A DNS SAN (rather than a URI SAN, SPIFFE style) because rustls checks DNS
//! names natively and the chart's identities were DNS names from the start; the SAN rather than the subject CN
//! because CN matching is deprecated and ambiguous. The identity names the
//! operator's ServiceAccount (`<serviceaccount>.<namespace>.serviceaccount.isthmus`), so a certificate issued
//! by the same CA for anything else (the agent's own serving certificate, another ServiceAccount) is refused
//! with HTTP 403; a certificate from another CA, or none, fails the TLS handshake.
//! Note: wildcard SANs are honoured as in server-name checking, so the CA must not issue `*.` names.
//!
//! A second identity, the metrics scraper's (`--scraper-identity`, the chart's `isthmus-metrics-scraper`
//! Secret), may read `/metrics` on the same port and nothing else: per-destination metrics name tenants' links
//! and pods, so they are not served to anonymous callers.
//!
//! A third way to `/metrics`, on a port of its own (`--metrics-listen`, the chart's `agent.metricsPort`): HTTPS
//! with the same serving certificate but no client certificate, for a ServiceAccount token checked with a
//! TokenReview and a SubjectAccessReview (`isthmus_agent_api::metrics_auth`), the convention Prometheus and
//! the Prometheus Operator follow. Only `/metrics` is served there, so the reasons above still hold for
//! everything else: a token can never reach a plan, and the API port's handshake still requires a certificate.
//!
//! # Where the certificates come from
//! - [`TlsSource::Issued`] (the chart's): the agent's serving certificate comes from the Kubernetes
//!   CertificateSigningRequest API (`crate::csr`), for the DNS name of its node
//!   ([`isthmus_agent_api::identity::node_server_name`]), signed by the operator; its key is made in memory and
//!   never written anywhere. The trusted CAs are the operator's bundle (`ca.crt` of the ConfigMap the operator
//!   publishes, watched through the API: `crate::ca_bundle`); the agent serves nothing until both are there.
//! - [`TlsSource::Files`]: a mounted `kubernetes.io/tls` Secret: `ca.crt` (the CA that signs the operator's
//!   client certificate), `tls.crt`, `tls.key` (the agent's serving certificate, for its node's DNS name).
//!
//! Either way the material is re-read every few seconds; when its bytes changed and it forms a valid
//! configuration, new connections use it (kubelet replaces volumes by swapping a symlink, so the files change
//! together). A half-written or invalid set is reported and the previous configuration stays in force.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use isthmus_agent_api::tls::{TlsError, TlsFiles, TlsMaterial, crypto_provider};

use crate::ca_bundle::TrustedBundle;
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
    #[error("no serving certificate issued yet")]
    NotIssued,
    #[error("the operator has not published its CA bundle yet")]
    NoBundle,
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The serving certificate and key obtained from the CSR API, held in memory (PEM); None until the first one.
#[derive(Debug, Default)]
pub struct IssuedCertificate(RwLock<Option<(Vec<u8>, Vec<u8>)>>);

impl IssuedCertificate {
    pub fn set(&self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some((cert_pem, key_pem));
    }

    fn get(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Where the agent's TLS material comes from (module docs).
#[derive(Debug, Clone)]
pub enum TlsSource {
    Files(TlsFiles),
    /// The CA bundle from the operator's ConfigMap, the serving certificate from the CSR API, both held in memory.
    Issued {
        ca: Arc<TrustedBundle>,
        certificate: Arc<IssuedCertificate>,
    },
}

impl TlsSource {
    /// The paths errors name (the issued certificate has none: it is named as such).
    fn files(&self) -> TlsFiles {
        match self {
            TlsSource::Files(files) => files.clone(),
            TlsSource::Issued { .. } => TlsFiles {
                ca: "<the operator's CA bundle>".into(),
                cert: "<issued certificate>".into(),
                key: "<issued key>".into(),
            },
        }
    }

    fn read(&self) -> Result<TlsMaterial, AuthError> {
        match self {
            TlsSource::Files(files) => Ok(files.read()?),
            TlsSource::Issued { ca, certificate } => {
                let ca = ca.get().ok_or(AuthError::NoBundle)?;
                let (cert, key) = certificate.get().ok_or(AuthError::NotIssued)?;
                Ok(TlsMaterial { ca, cert, key })
            }
        }
    }
}

/// The agent's current TLS server configurations, replaced when its material changes: the API's (client
/// certificates required) and the metrics listener's (the same serving certificate, no client certificate: its
/// callers present bearer tokens).
#[derive(Debug)]
pub struct ReloadingTls {
    source: TlsSource,
    loaded: Mutex<TlsMaterial>,
    current: RwLock<(Arc<ServerConfig>, Arc<ServerConfig>)>,
}

impl ReloadingTls {
    /// Loads the material; fails when it is missing or invalid (the agent must not serve without it).
    pub fn load(source: TlsSource) -> Result<Self, AuthError> {
        let material = source.read()?;
        let configs = build_server_configs(&source.files(), &material)?;
        Ok(Self { source, loaded: Mutex::new(material), current: RwLock::new(configs) })
    }

    /// Loads the material once it is complete, checking every `interval` (an issued certificate and the CA
    /// bundle arrive some time after start-up); reports each new reason for waiting.
    pub async fn load_when_complete(source: TlsSource, interval: Duration) -> Self {
        let mut last = None::<String>;
        loop {
            match Self::load(source.clone()) {
                Ok(tls) => return tls,
                Err(e) => {
                    let message = e.to_string();
                    if last.as_deref() != Some(message.as_str()) {
                        tracing::info!(reason = %message, "waiting for the TLS material before serving");
                    }
                    last = Some(message);
                }
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// The API's configuration for the next connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// The metrics listener's configuration for the next connection (no client certificate asked for).
    pub fn current_without_client_auth(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).1.clone()
    }

    /// Re-reads the files; true when a new configuration took effect.
    pub fn reload_if_changed(&self) -> Result<bool, AuthError> {
        let material = self.source.read()?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if *loaded == material {
            return Ok(false);
        }
        let configs = build_server_configs(&self.source.files(), &material)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = configs;
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

/// The API's configuration and the metrics listener's.
fn build_server_configs(
    files: &TlsFiles,
    material: &TlsMaterial,
) -> Result<(Arc<ServerConfig>, Arc<ServerConfig>), AuthError> {
    let provider = crypto_provider();
    let mut metrics = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::from)?
        .with_no_client_auth()
        .with_single_cert(material.certificate_chain(files)?, material.private_key(files)?)
        .map_err(TlsError::from)?;
    metrics.alpn_protocols = vec![b"http/1.1".to_vec()];
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
    Ok((Arc::new(config), Arc::new(metrics)))
}
