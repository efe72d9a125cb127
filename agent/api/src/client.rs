//! The operator's client for the agent API (cargo feature `client`): typed calls over HTTP/1.1 + JSON, mutual
//! TLS, and a timeout on every call.
//!
//! Authentication is mutual TLS (see the agent's `auth` module for why it was chosen over TokenReview):
//! - the client trusts only the CA in `ca.crt` and checks that the agent's certificate is valid for
//!   [`ClientConfig::server_name`] (every agent serves the same name; agents are dialled by pod IP);
//! - the client presents `tls.crt`/`tls.key`, whose DNS SAN is the operator's identity that agents expect.
//!
//! The files are re-read before every call and the TLS configuration rebuilt when their contents changed, so a
//! rotated Secret (kubelet swaps a symlink in the mounted directory) is used without restarting the operator.
//! Every call opens its own connection: calls are rare (one per node per plan change or resync) and a fresh
//! handshake always uses the newest certificates.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::tls::{TlsError, TlsFiles};
use crate::tls::{TlsMaterial, crypto_provider};
use crate::{
    ApplyReply, CAPABILITIES_PATH, Capabilities, ErrorBody, NodePlan, OBSERVED_PATH, ObservedState, PLAN_PATH,
};

/// The DNS name every agent's serving certificate carries, unless configured otherwise.
pub const DEFAULT_AGENT_SERVER_NAME: &str = "isthmus-agent";

/// How the operator reaches agents.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub files: TlsFiles,
    /// The name the agents' serving certificate must be valid for.
    pub server_name: String,
    /// TCP connect plus TLS handshake.
    pub connect_timeout: Duration,
    /// The whole call, connect included. Applying a large plan takes a few seconds.
    pub request_timeout: Duration,
    /// The largest reply read from an agent; a longer one is cut off there, so that a broken or hostile agent
    /// cannot make the operator hold more. The observed state of 100 pods × 100 destinations is about 3 MB.
    pub max_reply_bytes: usize,
}

impl ClientConfig {
    pub fn new(files: TlsFiles) -> Self {
        Self {
            files,
            server_name: DEFAULT_AGENT_SERVER_NAME.to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            max_reply_bytes: 64 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("agent client TLS material: {0}")]
    Tls(#[from] TlsError),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
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

/// A client for any number of agents; cheap to share (`Arc`) between reconcilers.
#[derive(Debug)]
pub struct AgentClient {
    config: ClientConfig,
    server_name: ServerName<'static>,
    current: Mutex<(TlsMaterial, Arc<rustls::ClientConfig>)>,
}

impl AgentClient {
    /// Loads the certificates now, so that a broken Secret is reported at start-up.
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let server_name = ServerName::try_from(config.server_name.clone())
            .map_err(|_| ClientError::ServerName(config.server_name.clone()))?;
        let material = config.files.read()?;
        let tls = build_client_config(&config.files, &material)?;
        Ok(Self { config, server_name, current: Mutex::new((material, tls)) })
    }

    /// Replaces the agent's node plan (`PUT /v1/plan`).
    pub async fn apply(&self, agent: SocketAddr, plan: &NodePlan) -> Result<ApplyReply, ClientError> {
        self.call(agent, Method::PUT, PLAN_PATH, Some(plan), "apply reply").await
    }

    /// What is installed on the agent's node, with the kernel's counters (`GET /v1/observed`).
    pub async fn observed(&self, agent: SocketAddr) -> Result<ObservedState, ClientError> {
        self.call::<(), _>(agent, Method::GET, OBSERVED_PATH, None, "observed state").await
    }

    /// What the agent's kernel can do (`GET /v1/capabilities`).
    pub async fn capabilities(&self, agent: SocketAddr) -> Result<Capabilities, ClientError> {
        self.call::<(), _>(agent, Method::GET, CAPABILITIES_PATH, None, "capabilities").await
    }

    /// The TLS configuration for the next connection: rebuilt when the files changed; when the new files are
    /// unusable (a rotation caught half-written), the previous configuration is kept and used.
    fn tls_config(&self) -> Arc<rustls::ClientConfig> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(material) = self.config.files.read()
            && material != current.0
            && let Ok(tls) = build_client_config(&self.config.files, &material)
        {
            *current = (material, tls);
        }
        current.1.clone()
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        agent: SocketAddr,
        method: Method,
        path: &str,
        body: Option<&B>,
        what: &'static str,
    ) -> Result<R, ClientError> {
        let body = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).expect("plan types always serialize")),
            None => Bytes::new(),
        };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.config.server_name.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("static request parts are valid");
        let timeout = self.config.request_timeout;
        let (status, bytes) = tokio::time::timeout(timeout, self.exchange(agent, request))
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
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let connector = tokio_rustls::TlsConnector::from(self.tls_config());
        let connect = async {
            let tcp = tokio::net::TcpStream::connect(agent).await?;
            tcp.set_nodelay(true)?;
            connector.connect(self.server_name.clone(), tcp).await
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
    let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(material.root_store(files)?)
        .with_client_auth_cert(material.certificate_chain(files)?, material.private_key(files)?)?;
    Ok(Arc::new(config))
}
