//! The agent's two listeners:
//! - the API (`PUT /v1/plan`, `GET /v1/observed`, `GET /v1/capabilities`): HTTP/1.1 + JSON over mutual TLS,
//!   for the operator only (see [`crate::auth`]);
//! - health and metrics (`/healthz`, `/readyz`, `/metrics`): plain HTTP on its own address, for kubelet probes
//!   and Prometheus. It carries no control.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::serve::{IncomingStream, Listener};
use isthmus_agent_api::{CAPABILITIES_PATH, ErrorBody, OBSERVED_PATH, PLAN_PATH};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use crate::auth::{OperatorIdentity, ReloadingTls};
use crate::metrics::Metrics;
use crate::node::{ApplyError, Node, RawNodePlan};

/// Large plans (100 pods × 100 destinations is about 2 MB of JSON) must fit.
const MAX_PLAN_BYTES: usize = 64 << 20;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The verified peer of one API connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// Ok(()) when the client certificate is the operator's; otherwise why not.
    pub authorized: Result<(), String>,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// Accepts TCP connections and completes TLS handshakes on tasks of their own, so that a slow or hostile
/// client never holds up others; hands finished connections to axum.
pub struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(
        tcp: TcpListener,
        tls: Arc<ReloadingTls>,
        identity: OperatorIdentity,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (sender, connections) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an API connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                let connection_sender = sender.clone();
                let identity = identity.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let authorized = identity.authorize(tls.get_ref().1.peer_certificates());
                            if let Err(reason) = &authorized {
                                tracing::warn!(peer = %addr, %reason, "API client is not the operator");
                            }
                            let _ = connection_sender.send((tls, Peer { addr, authorized })).await;
                        }
                        Ok(Err(e)) => {
                            metrics.tls_handshake_failures.inc();
                            tracing::warn!(peer = %addr, error = %e, "API TLS handshake refused");
                        }
                        Err(_) => {
                            metrics.tls_handshake_failures.inc();
                            tracing::warn!(peer = %addr, "API TLS handshake timed out");
                        }
                    }
                });
                if sender.is_closed() {
                    return;
                }
            }
        });
        Ok(Self { connections, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept task only ends when this listener is dropped; never reached while serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, authorized: Err("the listener itself".into()) })
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(ErrorBody { message: message.into() })).into_response()
}

/// The API routes; every request must come from the operator.
pub fn api_router(node: Arc<Node>) -> Router {
    Router::new()
        .route(PLAN_PATH, put(put_plan))
        .route(OBSERVED_PATH, get(get_observed))
        .route(CAPABILITIES_PATH, get(get_capabilities))
        .layer(DefaultBodyLimit::max(MAX_PLAN_BYTES))
        .layer(middleware::from_fn_with_state(node.clone(), require_operator))
        .with_state(node)
}

async fn require_operator(
    State(node): State<Arc<Node>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
    next: Next,
) -> Response {
    match &peer.authorized {
        Ok(()) => next.run(request).await,
        Err(reason) => {
            node.metrics().forbidden_requests.inc();
            error(StatusCode::FORBIDDEN, reason.clone())
        }
    }
}

async fn put_plan(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    let plan = match RawNodePlan::from_json(&body) {
        Ok(plan) => plan,
        Err(e) => {
            let status = match e.classify() {
                serde_json::error::Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::BAD_REQUEST,
            };
            return error(status, format!("malformed plan: {e}"));
        }
    };
    // The plan's JSON (megabytes for a large node) is not needed while it is applied.
    drop(body);
    match node.apply(plan).await {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e @ ApplyError::WrongNode { .. }) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn get_observed(State(node): State<Arc<Node>>) -> Response {
    let observed = node.observe().await;
    // Written out here so that the observed state (as large as its JSON) is freed before the reply is sent.
    let json = match serde_json::to_vec(&observed) {
        Ok(json) => json,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("writing the observed state: {e}")),
    };
    drop(observed);
    crate::node::release_freed_memory();
    ([(axum::http::header::CONTENT_TYPE, "application/json")], json).into_response()
}

async fn get_capabilities(State(node): State<Arc<Node>>) -> Response {
    axum::Json(node.capabilities().clone()).into_response()
}

/// Serves the API until `shutdown` resolves; in-flight requests finish first.
pub async fn serve_api(
    listener: TlsListener,
    node: Arc<Node>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, api_router(node).into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Readiness: set once the capability probe ran and installed trees were adopted.
#[derive(Debug, Clone)]
pub struct Health {
    ready: Arc<AtomicBool>,
    node: Arc<std::sync::OnceLock<Arc<Node>>>,
    metrics: Arc<Metrics>,
}

impl Health {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { ready: Arc::default(), node: Arc::default(), metrics }
    }

    pub fn set_ready(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
        self.ready.store(true, Ordering::SeqCst);
    }
}

/// How long a scrape may spend reading the kernel's counters before the last values are served.
const OBSERVE_ON_SCRAPE: Duration = Duration::from_secs(5);

pub fn health_router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                if h.ready.load(Ordering::SeqCst) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "probing the kernel and adopting installed trees")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(h): State<Health>| async move {
                if let Some(node) = h.node.get() {
                    let _ = tokio::time::timeout(OBSERVE_ON_SCRAPE, node.observe()).await;
                }
                (
                    [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
                    h.metrics.encode(),
                )
            }),
        )
        .with_state(health)
}
