//! The operator's client for the agent API (cargo feature `client`): typed calls over HTTP/1.1 + JSON, mutual
//! TLS, and a timeout on every call.
//!
//! Authentication is mutual TLS (see the agent's `auth` module for why it was chosen over TokenReview):
//! - the client trusts only the isthmus CAs and checks that the agent's certificate is valid for the name of the
//!   node it means to reach ([`crate::identity::node_server_name`]): agents are dialled by pod IP, and an agent
//!   whose certificate names another node is refused in the handshake;
//! - the client presents a certificate whose DNS SAN is the operator's identity that agents expect.
//!
//! Where the trust anchors and the client certificate come from is a [`Credentials`]: files re-read before every
//! call ([`FileCredentials`], rebuilt when their contents changed, so that a rotated Secret is used without a
//! restart), or a configuration the caller replaces in memory ([`MemoryCredentials`], the operator's: its key
//! never leaves the process). Every call opens its own connection: calls are rare (one per node per plan change
//! or resync) and a fresh handshake always uses the newest certificates.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::identity::{NodeNameError, node_server_name};
use crate::measure::{MEASURED_PATH, MeasuredState};
pub use crate::tls::{TlsError, TlsFiles};
use crate::tls::{TlsMaterial, crypto_provider};
use crate::{
    ApplyReply, CAPABILITIES_PATH, Capabilities, ErrorBody, NodePlan, OBSERVED_PATH, ObservedState, PLAN_PATH,
};

/// How the operator reaches agents.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The trusted CAs and the operator's client certificate.
    pub credentials: Arc<dyn Credentials>,
    /// TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
    /// The whole call, connect included. Applying a large plan takes a few seconds.
    pub request_timeout: Duration,
    /// The largest reply read from an agent; a longer one is cut off there, so that a broken or hostile agent
    /// cannot make the operator hold more. The observed state of 100 pods × 100 destinations is about 3 MB.
    pub max_reply_bytes: usize,
}

impl ClientConfig {
    /// Credentials read from files (a mounted `kubernetes.io/tls` Secret with `ca.crt`); they are loaded now,
    /// so that a broken set is reported at start-up.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        Ok(Self::with_credentials(Arc::new(FileCredentials::load(files)?)))
    }

    pub fn with_credentials(credentials: Arc<dyn Credentials>) -> Self {
        Self {
            credentials,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            max_reply_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("node {node:?} cannot be dialled: {source}")]
    ServerName { node: String, source: NodeNameError },
    #[error("connecting to agent {agent}: {source}")]
    Connect { agent: SocketAddr, source: std::io::Error },
    #[error("agent {agent} did not answer within {after:?}")]
    Timeout { agent: SocketAddr, after: Duration },
    #[error("HTTP exchange with agent {agent}: {source}")]
    Http { agent: SocketAddr, source: hyper::Error },
    #[error("agent {agent} answered {status}: {message}")]
    Status { agent: SocketAddr, status: StatusCode, message: String },
    #[error("agent {agent} sent an unreadable {what}: {source}")]
    Decode { agent: SocketAddr, what: &'static str, source: serde_json::Error },
    #[error("agent {agent} sent a reply longer than {limit} bytes; cut off there")]
    TooLarge { agent: SocketAddr, limit: usize },
}

impl ClientError {
    /// True when the agent refused the caller's identity (HTTP 403); retrying will not help.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, ClientError::Status { status, .. } if *status == StatusCode::FORBIDDEN)
    }
}

/// Where the client's trust anchors and certificate come from.
pub trait Credentials: Send + Sync + std::fmt::Debug {
    /// The TLS configuration for the next connection (without a server name: that is per call).
    fn client_config(&self) -> Arc<rustls::ClientConfig>;
}

/// Credentials from files, re-read before every call.
#[derive(Debug)]
pub struct FileCredentials {
    files: TlsFiles,
    current: Mutex<(TlsMaterial, Arc<rustls::ClientConfig>)>,
}

impl FileCredentials {
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let material = files.read()?;
        let tls = build_client_config(&files, &material)?;
        Ok(Self { files, current: Mutex::new((material, tls)) })
    }
}

impl Credentials for FileCredentials {
    /// Rebuilt when the files changed; when the new files are unusable (a rotation caught half-written), the
    /// previous configuration is kept and used.
    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(material) = self.files.read()
            && material != current.0
            && let Ok(tls) = build_client_config(&self.files, &material)
        {
            *current = (material, tls);
        }
        current.1.clone()
    }
}

/// Credentials held in memory and replaced by their owner (the operator re-issues its certificate before it
/// expires and trusts each new CA as it is published).
#[derive(Debug)]
pub struct MemoryCredentials(RwLock<Arc<rustls::ClientConfig>>);

impl MemoryCredentials {
    pub fn new(
        roots: rustls::RootCertStore,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, TlsError> {
        Ok(Self(RwLock::new(client_config(roots, chain, key)?)))
    }

    /// Replaces the configuration; connections opened from now on use it.
    pub fn replace(
        &self,
        roots: rustls::RootCertStore,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TlsError> {
        let config = client_config(roots, chain, key)?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }
}

impl Credentials for MemoryCredentials {
    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A client for any number of agents; cheap to share (`Arc`) between reconcilers.
#[derive(Debug)]
pub struct AgentClient {
    config: ClientConfig,
}

impl AgentClient {
    pub fn new(config: ClientConfig) -> Self {
        Self { config }
    }

    /// Replaces the node plan of the agent on `plan.node` (`PUT /v1/plan`).
    pub async fn apply(&self, agent: SocketAddr, plan: &NodePlan) -> Result<ApplyReply, ClientError> {
        self.call(agent, &plan.node, Method::PUT, PLAN_PATH, Some(plan), "apply reply").await
    }

    /// What is installed on `node`, with the kernel's counters (`GET /v1/observed`).
    pub async fn observed(&self, agent: SocketAddr, node: &str) -> Result<ObservedState, ClientError> {
        self.call::<(), _>(agent, node, Method::GET, OBSERVED_PATH, None, "observed state").await
    }

    /// What the agent on `node` measured over its last complete probe windows (`GET /v1/measured`).
    pub async fn measured(&self, agent: SocketAddr, node: &str) -> Result<MeasuredState, ClientError> {
        self.call::<(), _>(agent, node, Method::GET, MEASURED_PATH, None, "measured state").await
    }

    /// What the kernel of `node` can do (`GET /v1/capabilities`).
    pub async fn capabilities(&self, agent: SocketAddr, node: &str) -> Result<Capabilities, ClientError> {
        self.call::<(), _>(agent, node, Method::GET, CAPABILITIES_PATH, None, "capabilities").await
    }

    /// Calls the agent at `agent`, which must prove that it serves `node`.
    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        agent: SocketAddr,
        node: &str,
        method: Method,
        path: &str,
        body: Option<&B>,
        what: &'static str,
    ) -> Result<R, ClientError> {
        let name =
            node_server_name(node).map_err(|source| ClientError::ServerName { node: node.to_owned(), source })?;
        let server_name = ServerName::try_from(name.clone()).expect("node_server_name only returns valid DNS names");
        let body = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).expect("plan types always serialize")),
            None => Bytes::new(),
        };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, name.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("static request parts are valid");
        let timeout = self.config.request_timeout;
        let (status, bytes) = tokio::time::timeout(timeout, self.exchange(agent, server_name, request))
            .await
            .map_err(|_| ClientError::Timeout { agent, after: timeout })??;
        if !status.is_success() {
            let message = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| e.message)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ClientError::Status { agent, status, message });
        }
        serde_json::from_slice(&bytes).map_err(|source| ClientError::Decode { agent, what, source })
    }

    async fn exchange(
        &self,
        agent: SocketAddr,
        server_name: ServerName<'static>,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let connector = tokio_rustls::TlsConnector::from(self.config.credentials.client_config());
        let connect = async {
            let tcp = tokio::net::TcpStream::connect(agent).await?;
            tcp.set_nodelay(true)?;
            connector.connect(server_name, tcp).await
        };
        let tls = tokio::time::timeout(self.config.connect_timeout, connect)
            .await
            .map_err(|_| ClientError::Timeout { agent, after: self.config.connect_timeout })?
            .map_err(|source| ClientError::Connect { agent, source })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|source| ClientError::Http { agent, source })?;
        // The connection future does the I/O; it ends when the sender is dropped after the one exchange.
        let driver = tokio::spawn(connection);
        let response = sender.send_request(request).await.map_err(|source| ClientError::Http { agent, source })?;
        let status = response.status();
        let limit = self.config.max_reply_bytes;
        let bytes = match http_body_util::Limited::new(response.into_body(), limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                driver.abort();
                return Err(match e.downcast::<hyper::Error>() {
                    Ok(source) => ClientError::Http { agent, source: *source },
                    Err(_) => ClientError::TooLarge { agent, limit },
                });
            }
        };
        drop(sender);
        driver.abort();
        Ok((status, bytes))
    }
}

fn build_client_config(files: &TlsFiles, material: &TlsMaterial) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    client_config(material.root_store(files)?, material.certificate_chain(files)?, material.private_key(files)?)
}

fn client_config(
    roots: rustls::RootCertStore,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    Ok(Arc::new(config))
}
