//! The webhook's HTTPS listener. The API server is its only intended caller, but nothing stops another pod from
//! connecting, so a connection is bounded in number, in handshake and header time, and in body size; the
//! answer has no side effects whoever asks.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::TOPOLOGIES_PATH;
use super::review;
use crate::metrics::{Metrics, VerdictLabels};

/// Connections served at once; more wait in the kernel's backlog. The API server keeps a few open.
const CONNECTIONS: usize = 64;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The API server reopens a connection the webhook closed.
const CONNECTION_AGE: Duration = Duration::from_secs(60);
/// An AdmissionReview holds the object and, on an update, the old one: each up to the API server's 3 MiB
/// request limit.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// The certificate the listener presents, replaced in place when it is renewed.
#[derive(Debug, Default)]
pub struct ServingCertificate {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingCertificate {
    pub fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(key);
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Binds `addr`: the address bound, and the future that serves until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    certificate: Arc<ServingCertificate>,
    metrics: Arc<Metrics>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + use<>)> {
    let tcp = TcpListener::bind(addr).await?;
    let bound = tcp.local_addr()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    Ok((bound, serve(tcp, acceptor, metrics, shutdown)))
}

async fn serve(
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    metrics: Arc<Metrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = stopped(&mut shutdown) => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a webhook connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => return,
        };
        let (acceptor, mut shutdown, metrics) = (acceptor.clone(), shutdown.clone(), metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "webhook TLS handshake refused"),
                Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(
                    TokioIo::new(tls),
                    hyper::service::service_fn(move |request| handle(request, metrics.clone())),
                );
            tokio::pin!(connection);
            // The API server keeps its connections open: a listener that stops must close them too, after the
            // review in flight, or a stopped operator would go on answering.
            // A connection kept open past its age is closed after the review in flight, so that idle ones
            // cannot hold every slot.
            let served = tokio::select! {
                served = connection.as_mut() => served,
                () = stopped(&mut shutdown) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
                () = tokio::time::sleep(CONNECTION_AGE) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "webhook connection ended");
            }
        });
    }
}

async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send: dropped here, before the caller's next await.
    let _ = shutdown.wait_for(|s| *s).await;
}

async fn handle(
    request: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if request.method() != Method::POST || request.uri().path() != TOPOLOGIES_PATH {
        return Ok(plain(StatusCode::NOT_FOUND, "not found"));
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, &format!("reading the review: {e}"))),
    };
    let (answer, verdict) = review::answer(&body);
    metrics.admission_reviews.get_or_create(&VerdictLabels { verdict }).inc();
    if let Some(r) = &answer.response {
        tracing::debug!(uid = %r.uid, allowed = r.allowed, message = %r.result.message, "NetworkTopology reviewed");
    }
    let json = serde_json::to_vec(&answer).expect("an AdmissionReview serializes");
    Ok(Response::builder()
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("a valid response"))
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    Response::builder().status(status).body(Full::new(Bytes::from(text.to_owned()))).expect("a valid response")
}
