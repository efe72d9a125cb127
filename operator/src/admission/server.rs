//! The webhooks' answers on the operator's HTTPS listener ([`crate::https`]): the NetworkTopology validation
//! and, with the hold on, the pod mutation and the held pods' question. The API server and the held pods are its
//! intended callers; no answer has side effects whoever asks, and a review's body is bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Service;

use super::hold::{self, HoldConfig};
use super::links_applied::{HeldPods, parse_query};
use super::{HOLD_PATH, LINKS_APPLIED_PATH, TOPOLOGIES_PATH, review};
pub use crate::https::ServingCertificate;
use crate::https::plain;
use crate::metrics::{AdmissionOutcomeLabels, Metrics};
use crate::pki::names::ServiceDnsName;

/// An AdmissionReview holds the object and, on an update, the old one: each up to the API server's 3 MiB
/// request limit.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// What the hold's routes need: the held pods, and what the injected container is configured with.
pub struct HoldServing {
    pub held: HeldPods,
    pub client: kube::Client,
    pub image: String,
    pub image_pull_policy: String,
    /// The webhook Service's name, which the container checks the certificate under.
    pub dns_name: ServiceDnsName,
    /// The Service's port (the chart's: 443).
    pub port: u16,
    /// The operator's CA bundle as it is now (it changes when the CA rotates).
    pub ca_bundle: Arc<dyn Fn() -> String + Send + Sync>,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    /// The Service's ClusterIP and port, read once (a ClusterIP never changes for a Service's life).
    cluster_ip: tokio::sync::OnceCell<String>,
}

impl HoldServing {
    #[allow(clippy::too_many_arguments)] // each is a flag of the operator's, named at its one call site
    pub fn new(
        held: HeldPods,
        client: kube::Client,
        image: String,
        image_pull_policy: String,
        dns_name: ServiceDnsName,
        port: u16,
        ca_bundle: Arc<dyn Fn() -> String + Send + Sync>,
        default_timeout: Duration,
        max_timeout: Duration,
    ) -> Self {
        let cluster_ip = tokio::sync::OnceCell::new();
        HoldServing {
            held,
            client,
            image,
            image_pull_policy,
            dns_name,
            port,
            ca_bundle,
            default_timeout,
            max_timeout,
            cluster_ip,
        }
    }

    /// The injected container's configuration now. Without the ClusterIP (the Service cannot be read), the
    /// container resolves the Service's name, which needs cluster DNS.
    async fn config(&self) -> HoldConfig {
        let address = match self.dns_name.service() {
            Some((namespace, name)) => {
                let services: kube::Api<Service> = kube::Api::namespaced(self.client.clone(), namespace);
                let read = self.cluster_ip.get_or_try_init(|| async {
                    let service = services.get(name).await.map_err(|e| e.to_string())?;
                    let ip = service.spec.and_then(|s| s.cluster_ip).and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
                    ip.map(|ip| SocketAddr::new(ip, self.port).to_string())
                        .ok_or_else(|| format!("Service {namespace}/{name} has no ClusterIP"))
                });
                match read.await {
                    Ok(address) => Some(address.clone()),
                    Err(e) => {
                        tracing::warn!(error = %e, "the webhook Service's ClusterIP: held pods will resolve its name");
                        None
                    }
                }
            }
            None => None,
        };
        HoldConfig {
            image: self.image.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            url: format!("https://{}:{}{LINKS_APPLIED_PATH}", self.dns_name, self.port),
            address,
            ca_bundle: (self.ca_bundle)(),
            default_timeout: self.default_timeout,
            max_timeout: self.max_timeout,
        }
    }
}

/// Binds `addr`: the address bound, and the future that serves the webhooks until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    metrics: Arc<Metrics>,
    hold: Option<Arc<HoldServing>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + use<>)> {
    let handler = move |request| handle(request, metrics.clone(), hold.clone());
    crate::https::bind(addr, "webhook", certificate, handler, shutdown).await
}

async fn handle(
    request: Request<Incoming>,
    metrics: Arc<Metrics>,
    hold: Option<Arc<HoldServing>>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    match (request.method(), path.as_str(), hold) {
        (&Method::POST, TOPOLOGIES_PATH, _) => {
            let body = match read_body(request).await {
                Ok(b) => b,
                Err(response) => return response,
            };
            let (answer, verdict) = review::answer(&body);
            metrics.admission_reviews.get_or_create(&AdmissionOutcomeLabels { verdict: verdict.as_str() }).inc();
            if let Some(r) = &answer.response {
                tracing::debug!(uid = %r.uid, allowed = r.allowed, message = %r.result.message, "NetworkTopology reviewed");
            }
            json(StatusCode::OK, &answer)
        }
        (&Method::POST, HOLD_PATH, Some(hold)) => {
            let body = match read_body(request).await {
                Ok(b) => b,
                Err(response) => return response,
            };
            let answer = match review::request_of(&body) {
                Ok(request) => {
                    let response = hold::decide(&request, &hold.config().await);
                    tracing::debug!(uid = %response.uid, allowed = response.allowed, held = response.patch.is_some(), "pod reviewed");
                    response.into_review()
                }
                Err(reason) => kube::core::admission::AdmissionResponse::invalid(reason).into_review(),
            };
            json(StatusCode::OK, &answer)
        }
        (&Method::GET, LINKS_APPLIED_PATH, Some(hold)) => match parse_query(request.uri().query()) {
            Ok(query) => match hold.held.answer(&query) {
                Some(answer) => json(StatusCode::OK, &answer),
                None => plain(
                    StatusCode::NOT_FOUND,
                    &format!("no held pod {}/{} of UID {} (yet)", query.namespace, query.name, query.uid),
                ),
            },
            Err(e) => plain(StatusCode::BAD_REQUEST, &e),
        },
        _ => plain(StatusCode::NOT_FOUND, "not found"),
    }
}

async fn read_body(request: Request<Incoming>) -> Result<Bytes, Response<Full<Bytes>>> {
    match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(plain(StatusCode::PAYLOAD_TOO_LARGE, &format!("reading the review: {e}"))),
    }
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let json = serde_json::to_vec(value).expect("an answer serializes");
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("a valid response")
}
