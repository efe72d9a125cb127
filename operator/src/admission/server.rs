//! The webhook's answers on the operator's HTTPS listener ([`crate::https`]). The API server is its only
//! intended caller; the answer has no side effects whoever asks, and a review's body is bounded.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};

use super::TOPOLOGIES_PATH;
use super::review;
pub use crate::https::ServingCertificate;
use crate::https::plain;
use crate::metrics::{Metrics, VerdictLabels};

/// An AdmissionReview holds the object and, on an update, the old one: each up to the API server's 3 MiB
/// request limit.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// Binds `addr`: the address bound, and the future that serves the webhook until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    metrics: Arc<Metrics>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + use<>)> {
    crate::https::bind(addr, "webhook", certificate, move |request| handle(request, metrics.clone()), shutdown).await
}

async fn handle(request: Request<Incoming>, metrics: Arc<Metrics>) -> Response<Full<Bytes>> {
    if request.method() != Method::POST || request.uri().path() != TOPOLOGIES_PATH {
        return plain(StatusCode::NOT_FOUND, "not found");
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return plain(StatusCode::PAYLOAD_TOO_LARGE, &format!("reading the review: {e}")),
    };
    let (answer, verdict) = review::answer(&body);
    metrics.admission_reviews.get_or_create(&VerdictLabels { verdict }).inc();
    if let Some(r) = &answer.response {
        tracing::debug!(uid = %r.uid, allowed = r.allowed, message = %r.result.message, "NetworkTopology reviewed");
    }
    let json = serde_json::to_vec(&answer).expect("an AdmissionReview serializes");
    Response::builder()
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("a valid response")
}
