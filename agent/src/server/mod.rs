//! The agent's listeners (see [`listen`] for the connection gate in front of each):
//! - the API (`PUT /v1/plan`, `GET /v1/observed`, `GET /v1/capabilities`, `GET /v1/measured`, `GET /metrics`): HTTP/1.1 + JSON over
//!   mutual TLS; everything for the operator, `/metrics` also for the scraper identity (see [`crate::auth`]);
//! - metrics (`GET /metrics` only), optional: HTTPS with the agent's serving certificate, for a ServiceAccount
//!   token allowed `get` on the non-resource URL `/metrics` ([`isthmus_agent_api::metrics_auth`]);
//! - health (`/healthz`, `/readyz`): plain HTTP on its own address, for kubelet probes. It carries neither
//!   control nor anything about tenants.

mod connection_gate;
pub mod listen;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use isthmus_agent_api::measure::MEASURED_PATH;
use isthmus_agent_api::{CAPABILITIES_PATH, ErrorBody, MAX_PLAN_BYTES, OBSERVED_PATH, PLAN_PATH};
use tokio::time::Instant;

use isthmus_agent_api::metrics_auth::{METRICS_PATH, MetricsAuth, Outcome, Reviewer};
pub use listen::{Limits, MetricsTlsListener, Peer, PlainListener, TlsListener};

use crate::auth::Caller;
use crate::metrics::Metrics;
use crate::node::{ApplyError, Node, RawNodePlan};

/// The longest an API request may take, body included: above the operator's own request timeout, so that the
/// operator gives up first and a stalled body upload cannot hold its connection for ever.
const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest a health request may take.
const HEALTH_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a scrape may spend reading the kernel's counters before the last values are served.
const OBSERVE_ON_SCRAPE: Duration = Duration::from_secs(5);
/// Scrapes this close to the last read of the counters serve that read: reading every pod's tree is the most
/// expensive thing a caller can ask for besides a plan.
const SCRAPE_FRESH_FOR: Duration = Duration::from_secs(2);

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(ErrorBody { message: message.into() })).into_response()
}

/// The API routes: each says which callers it serves.
pub fn api_router(node: Arc<Node>, metrics: Arc<Metrics>) -> Router {
    let scrape = Arc::new(Scrape { node: node.clone(), metrics: metrics.clone(), last: Default::default() });
    let operator_only = Router::new()
        .route(PLAN_PATH, put(put_plan))
        .route(OBSERVED_PATH, get(get_observed))
        .route(CAPABILITIES_PATH, get(get_capabilities))
        .route(MEASURED_PATH, get(get_measured))
        .layer(DefaultBodyLimit::max(MAX_PLAN_BYTES))
        .layer(middleware::from_fn_with_state((metrics.clone(), &[Caller::Operator][..]), require_caller))
        .with_state(node);
    let metrics_route = Router::new()
        .route("/metrics", get(|State(scrape): State<Arc<Scrape>>| async move { scrape.render().await }))
        .layer(middleware::from_fn_with_state((metrics, &[Caller::Operator, Caller::Scraper][..]), require_caller))
        .with_state(scrape);
    operator_only.merge(metrics_route).layer(middleware::from_fn_with_state(API_REQUEST_TIMEOUT, within))
}

/// The metrics listener's routes: `/metrics` for a bearer token allowed to read it, nothing else.
pub fn metrics_router<R: Reviewer + 'static>(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth<R>>,
) -> Router {
    let scrape = Arc::new(Scrape { node, metrics: metrics.clone(), last: Default::default() });
    Router::new()
        .route(METRICS_PATH, get(|State(scrape): State<Arc<Scrape>>| async move { scrape.render().await }))
        .with_state(scrape)
        .layer(middleware::from_fn_with_state((metrics, auth), require_token::<R>))
        .layer(middleware::from_fn_with_state(HEALTH_REQUEST_TIMEOUT, within))
}

/// Answers 401, 403 or 503 unless the request's bearer token may `get` `/metrics`; counts every outcome. Runs
/// before routing, so that an unknown path tells an unauthenticated caller nothing either.
async fn require_token<R: Reviewer>(
    State((metrics, auth)): State<(Arc<Metrics>, Arc<MetricsAuth<R>>)>,
    request: Request,
    next: Next,
) -> Response {
    let header = request.headers().get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    let result = auth.authorize(header).await;
    let outcome = Outcome::of(&result);
    if let Err(e) = &result {
        tracing::warn!(error = %e, "/metrics: the caller's token could not be reviewed");
    }
    metrics.count_metrics_auth(outcome);
    let Some(refusal) = outcome.refusal() else { return next.run(request).await };
    let status = StatusCode::from_u16(outcome.status()).expect("a valid status");
    let mut response = error(status, refusal);
    outcome.refusal_headers(response.headers_mut());
    response
}

/// Serves the metrics listener until `shutdown` resolves.
pub async fn serve_metrics<R: Reviewer + 'static>(
    listener: MetricsTlsListener,
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth<R>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, metrics_router(node, metrics, auth)).with_graceful_shutdown(shutdown).await
}

async fn require_caller(
    State((metrics, allowed)): State<(Arc<Metrics>, &'static [Caller])>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
    next: Next,
) -> Response {
    match &peer.caller {
        Ok(caller) if allowed.contains(caller) => next.run(request).await,
        Ok(caller) => {
            metrics.forbidden_requests.inc();
            error(StatusCode::FORBIDDEN, format!("{caller:?} may not call {}", request.uri().path()))
        }
        Err(reason) => {
            metrics.forbidden_requests.inc();
            error(StatusCode::FORBIDDEN, reason.clone())
        }
    }
}

/// Ends a request that takes longer than `limit`, body upload included.
async fn within(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => error(StatusCode::REQUEST_TIMEOUT, format!("the request took longer than {limit:?}")),
    }
}

/// `/metrics`: the kernel's counters read at most once at a time, and reused by scrapes within
/// [`SCRAPE_FRESH_FOR`] of the last read.
struct Scrape {
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl Scrape {
    async fn render(&self) -> Response {
        {
            // Held across the read: concurrent scrapes wait for the one in flight and then find it fresh.
            let mut last = self.last.lock().await;
            if last.is_none_or(|at| at.elapsed() >= SCRAPE_FRESH_FOR) {
                self.metrics.scrape_observes.inc();
                let _ = tokio::time::timeout(OBSERVE_ON_SCRAPE, self.node.observe()).await;
                *last = Some(Instant::now());
            }
        }
        (
            [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            self.metrics.encode(),
        )
            .into_response()
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

/// The prober's last complete windows; `enabled: false` with `--verify=false`.
async fn get_measured(State(node): State<Arc<Node>>) -> Response {
    axum::Json(node.measurements().current()).into_response()
}

/// Serves the API until `shutdown` resolves; in-flight requests finish first.
pub async fn serve_api(
    listener: TlsListener,
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, api_router(node, metrics).into_make_service_with_connect_info::<Peer>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Readiness: set once the capability probe ran and installed trees were adopted. Liveness: lost for good once a
/// part the agent cannot run without has stopped (the userspace datapath's loop), so that the kubelet restarts it.
#[derive(Debug, Clone, Default)]
pub struct Health {
    ready: Arc<AtomicBool>,
    failed: Arc<std::sync::OnceLock<String>>,
}

impl Health {
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// The agent can no longer do its work: both probes fail from now on, saying `why` (the first reason kept).
    pub fn set_failed(&self, why: String) {
        let _ = self.failed.set(why);
    }

    fn live(&self) -> (StatusCode, String) {
        match self.failed.get() {
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why.clone()),
            None => (StatusCode::OK, "ok".to_owned()),
        }
    }
}

pub fn health_router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(|State(h): State<Health>| async move { h.live() }))
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                match h.live() {
                    (StatusCode::OK, _) if h.ready.load(Ordering::SeqCst) => (StatusCode::OK, "ready".to_owned()),
                    (StatusCode::OK, _) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "probing the kernel and adopting installed trees".to_owned())
                    }
                    failed => failed,
                }
            }),
        )
        .layer(middleware::from_fn_with_state(HEALTH_REQUEST_TIMEOUT, within))
        .with_state(health)
}
