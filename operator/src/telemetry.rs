//! Logs (`tracing`, text or JSON) and the HTTP endpoints `/metrics`, `/healthz` and `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tracing_subscriber::EnvFilter;

use crate::metrics::Metrics;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber; `RUST_LOG` overrides the default `info` filter.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).init(),
    }
}

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    /// Set once every watch has listed its objects.
    pub ready: Arc<AtomicBool>,
    /// Whether `/metrics` is served here, to anyone (`--plain-metrics`).
    pub plain_metrics: bool,
}

pub fn router(state: HttpState) -> Router {
    let health = Router::new().route("/healthz", get(|| async { "ok" })).route("/readyz", get(readyz));
    let routes = if state.plain_metrics { health.route("/metrics", get(metrics)) } else { health };
    routes.with_state(state)
}

/// The media type of the metrics' exposition, on both listeners.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], s.metrics.encode())
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watches not synced yet")
    }
}

/// Serves on a bound listener until `shutdown` resolves (binding first lets the caller fail fast on a bad
/// address).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        let paths = if state.plain_metrics { "/metrics, /healthz, /readyz" } else { "/healthz, /readyz" };
        tracing::info!(%addr, paths, "serving plain HTTP");
    }
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}
