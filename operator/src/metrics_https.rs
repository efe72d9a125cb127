//! `/metrics` by ServiceAccount token on the operator's HTTPS metrics listener: the convention of
//! controller-runtime and kube-rbac-proxy that a stock Prometheus follows (its own token as
//! `bearer_token_file`), the same decision as the agents' ([`isthmus_agent_api::metrics_auth`]). The token is
//! reviewed before the path is looked at, so that an unauthenticated caller learns nothing, not even which
//! paths exist.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use isthmus_agent_api::metrics_auth::{METRICS_PATH, MetricsAuth, Outcome, Reviewer};

use crate::https::{ServingCertificate, plain};
use crate::metrics::Metrics;

/// Binds `addr`: the address bound, and the future that serves `/metrics` to allowed tokens until `shutdown`.
pub async fn bind<R: Reviewer + 'static>(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth<R>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + use<R>)> {
    let handle = move |request| handle(request, metrics.clone(), auth.clone());
    crate::https::bind(addr, "metrics", certificate, handle, shutdown).await
}

async fn handle<R: Reviewer>(
    request: Request<Incoming>,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth<R>>,
) -> Response<Full<Bytes>> {
    let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let result = auth.authorize(authorization).await;
    let outcome = Outcome::of(&result);
    if let Err(e) = &result {
        tracing::warn!(error = %e, "/metrics: the caller's token could not be reviewed");
    }
    metrics.count_metrics_auth(outcome);
    if let Some(refusal) = outcome.refusal() {
        let mut response = plain(StatusCode::from_u16(outcome.status()).expect("a valid status"), refusal);
        outcome.refusal_headers(response.headers_mut());
        return response;
    }
    if request.method() != Method::GET || request.uri().path() != METRICS_PATH {
        return plain(StatusCode::NOT_FOUND, "not found");
    }
    Response::builder()
        .header(header::CONTENT_TYPE, crate::telemetry::METRICS_CONTENT_TYPE)
        .body(Full::new(Bytes::from(metrics.encode())))
        .expect("a valid response")
}
