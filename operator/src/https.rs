//! The operator's HTTPS listeners (the admission webhook, `/metrics` by token). Anyone in the cluster can
//! connect to them, so connections are bounded in number, in handshake and header time, and in age; the
//! certificate they present is one of the operator's own ([`ServingCertificate`], renewed in place by
//! `admission::upkeep`). No client certificate is asked for: the webhook's answer has no side effects, and
//! `/metrics` authenticates its callers by their bearer token.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once; more wait in the kernel's backlog. The API server keeps a few open.
const CONNECTIONS: usize = 64;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Callers (the API server, Prometheus) reopen a connection the listener closed.
const CONNECTION_AGE: Duration = Duration::from_secs(60);

/// The certificate a listener presents, replaced in place when it is renewed.
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

/// Binds `addr`: the address bound, and the future that answers every request with `handle` until
/// `shutdown`. `name` says which listener a log line is about.
pub async fn bind<H, F>(
    addr: SocketAddr,
    name: &'static str,
    certificate: Arc<ServingCertificate>,
    handle: H,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + use<H, F>)>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let tcp = TcpListener::bind(addr).await?;
    let bound = tcp.local_addr()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    Ok((bound, serve(tcp, name, acceptor, handle, shutdown)))
}

async fn serve<H, F>(
    tcp: TcpListener,
    name: &'static str,
    acceptor: tokio_rustls::TlsAcceptor,
    handle: H,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
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
                    tracing::warn!(listener = name, error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => return,
        };
        let (acceptor, mut shutdown, handle) = (acceptor.clone(), shutdown.clone(), handle.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(listener = name, %peer, error = %e, "TLS handshake refused"),
                Err(_) => return tracing::debug!(listener = name, %peer, "TLS handshake timed out"),
            };
            let service = hyper::service::service_fn(move |request| {
                let answer = handle(request);
                async move { Ok::<_, std::convert::Infallible>(answer.await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tls), service);
            tokio::pin!(connection);
            // Callers keep their connections open: a listener that stops must close them too, after the
            // request in flight, or a stopped operator would go on answering. A connection kept open past its
            // age is closed likewise, so that idle ones cannot hold every slot.
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
                tracing::debug!(listener = name, %peer, error = %e, "connection ended");
            }
        });
    }
}

async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard `wait_for` returns is not Send: dropped here, before the caller's next await.
    let _ = shutdown.wait_for(|s| *s).await;
}

/// A plain-text answer.
pub fn plain(status: hyper::StatusCode, text: &str) -> Response<Full<Bytes>> {
    Response::builder().status(status).body(Full::new(Bytes::from(text.to_owned()))).expect("a valid response")
}
