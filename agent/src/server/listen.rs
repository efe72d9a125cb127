//! The agent's two listeners, each behind a [`ConnectionGate`]: a caller gets a slot when its TCP connection is accepted
//! and keeps it for the connection's life (TLS handshake included), so neither idle connections nor stalled
//! handshakes can crowd out the operator or kubelet's probes, and handshakes in progress are bounded by the
//! gate's capacity. Connections the operator's certificate authenticated give their slot back after the
//! handshake: only the holder of the operator's key can open them, and the operator must never be evicted by a
//! stranger.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use super::connection_gate::{ConnectionGate, Eviction, Refused, Slot};
use crate::auth::{Caller, Callers, ReloadingTls};
use crate::metrics::{ConnectionGateOutcome, ListenerKind, Metrics};

/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many connections each listener admits at once, and after how long a holder counts as stale (see
/// [`ConnectionGate`]): a handshake, a probe or a scrape takes well under a second on a healthy node.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub connections: usize,
    pub stale_after: Duration,
}

impl Limits {
    pub const API: Limits = Limits { connections: 64, stale_after: Duration::from_secs(5) };
    pub const HEALTH: Limits = Limits { connections: 32, stale_after: Duration::from_secs(5) };
    pub const METRICS: Limits = Limits { connections: 16, stale_after: Duration::from_secs(5) };

    fn gate(self) -> ConnectionGate {
        ConnectionGate::new(self.connections, self.stale_after)
    }
}

/// A connection that holds a gate slot while it lives, and fails its next read or write once the gate gave
/// the slot to another caller, so that the HTTP server closes it.
pub struct Gated<S> {
    inner: S,
    slot: Option<Slot>,
}

impl<S> Gated<S> {
    fn evicted(&mut self, cx: &mut Context<'_>) -> bool {
        self.slot.as_mut().is_some_and(|slot| slot.poll_evicted(cx).is_ready())
    }
}

fn evicted_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the connection gate gave this slot to another caller")
}

impl<S: AsyncRead + Unpin> AsyncRead for Gated<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.evicted(cx) {
            return Poll::Ready(Err(evicted_error()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gated<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.evicted(cx) {
            return Poll::Ready(Err(evicted_error()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Admits an accepted connection through `gate`, counting what happened; None when refused.
fn admit(gate: &ConnectionGate, addr: SocketAddr, metrics: &Metrics, listener: ListenerKind) -> Option<Slot> {
    let (slot, outcome) = match gate.admit(addr.ip()) {
        Ok((slot, None)) => return Some(slot),
        Ok((slot, Some(Eviction::Heaviest))) => (Some(slot), ConnectionGateOutcome::EvictedHeaviest),
        Ok((slot, Some(Eviction::Stale))) => (Some(slot), ConnectionGateOutcome::EvictedStale),
        Err(Refused) => (None, ConnectionGateOutcome::Refused),
    };
    metrics.count_connection_gate(listener, outcome);
    tracing::debug!(peer = %addr, ?listener, ?outcome, "connection gate full");
    slot
}

async fn accept(tcp: &TcpListener, listener: ListenerKind) -> (TcpStream, SocketAddr) {
    loop {
        match tcp.accept().await {
            Ok(accepted) => return accepted,
            Err(e) => {
                tracing::warn!(error = %e, ?listener, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The verified peer of one API connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// Who the client certificate names; otherwise why it names nobody the agent serves.
    pub caller: Result<Caller, String>,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

/// Why a TLS handshake did not finish.
enum Handshake {
    Refused(io::Error),
    TimedOut,
}

/// A finished connection and what the listener tells axum about its peer.
type Finished<A> = (Gated<TlsStream<TcpStream>>, A);

/// Accepts TCP connections through `gate` and completes their TLS handshakes on tasks of their own, so that a
/// slow or hostile client never holds up others (a handshake whose slot the gate gave away ends there);
/// `finish` turns each handshake's result into the connection handed to axum, or None. Runs until the
/// returned receiver is dropped.
fn spawn_handshakes<A, F>(
    tcp: TcpListener,
    kind: ListenerKind,
    limits: Limits,
    metrics: Arc<Metrics>,
    acceptor: impl Fn() -> tokio_rustls::TlsAcceptor + Send + 'static,
    finish: F,
) -> mpsc::Receiver<Finished<A>>
where
    A: Send + 'static,
    F: Fn(Result<TlsStream<TcpStream>, Handshake>, Slot, SocketAddr) -> Option<Finished<A>>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let (sender, connections) = mpsc::channel(limits.connections);
    let gate = limits.gate();
    tokio::spawn(async move {
        loop {
            let (stream, addr) = accept(&tcp, kind).await;
            let Some(slot) = admit(&gate, addr, &metrics, kind) else { continue };
            let acceptor = acceptor();
            let (connection_sender, finish) = (sender.clone(), finish.clone());
            tokio::spawn(async move {
                let _ = stream.set_nodelay(true);
                let mut slot = slot;
                let outcome = tokio::select! {
                    outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => outcome,
                    () = slot.evicted() => return,
                };
                let result = match outcome {
                    Ok(Ok(tls)) => Ok(tls),
                    Ok(Err(e)) => Err(Handshake::Refused(e)),
                    Err(_) => Err(Handshake::TimedOut),
                };
                if let Some(connection) = finish(result, slot, addr) {
                    let _ = connection_sender.send(connection).await;
                }
            });
            if sender.is_closed() {
                return;
            }
        }
    });
    connections
}

/// The API listener: TLS with client certificates behind the API gate, handshakes on tasks of their own
/// ([`spawn_handshakes`]). Connections the operator's certificate authenticated give their slot back.
pub struct TlsListener {
    connections: mpsc::Receiver<Finished<Peer>>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(
        tcp: TcpListener,
        tls: Arc<ReloadingTls>,
        callers: Callers,
        metrics: Arc<Metrics>,
        limits: Limits,
    ) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let failures = metrics.clone();
        let finish = move |result: Result<TlsStream<TcpStream>, Handshake>, slot: Slot, addr: SocketAddr| {
            let tls = match result {
                Ok(tls) => tls,
                Err(Handshake::Refused(e)) => {
                    failures.tls_handshake_failures.inc();
                    tracing::warn!(peer = %addr, error = %e, "API TLS handshake refused");
                    return None;
                }
                Err(Handshake::TimedOut) => {
                    failures.tls_handshake_failures.inc();
                    tracing::warn!(peer = %addr, "API TLS handshake timed out");
                    return None;
                }
            };
            let caller = callers.authorize(tls.get_ref().1.peer_certificates());
            let slot = match &caller {
                Ok(Caller::Operator) => None,
                Ok(Caller::Scraper) => Some(slot),
                Err(reason) => {
                    tracing::warn!(peer = %addr, %reason, "API client is not one the agent serves");
                    Some(slot)
                }
            };
            Some((Gated { inner: tls, slot }, Peer { addr, caller }))
        };
        let acceptor = move || tokio_rustls::TlsAcceptor::from(tls.current());
        let connections = spawn_handshakes(tcp, ListenerKind::Api, limits, metrics, acceptor, finish);
        Ok(Self { connections, local })
    }
}

impl Listener for TlsListener {
    type Io = Gated<TlsStream<TcpStream>>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accept task only ends when this listener is dropped; never reached while serving.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(Peer { addr: self.local, caller: Err("the listener itself".into()) })
    }
}

/// The metrics listener: TLS with the agent's serving certificate and no client certificate (callers present a
/// bearer token, checked per request), behind its own gate; handshakes on tasks of their own as in
/// [`TlsListener`]. Every connection keeps its slot: no caller here is trusted before its token is.
pub struct MetricsTlsListener {
    connections: mpsc::Receiver<Finished<SocketAddr>>,
    local: SocketAddr,
}

impl MetricsTlsListener {
    pub fn new(tcp: TcpListener, tls: Arc<ReloadingTls>, metrics: Arc<Metrics>, limits: Limits) -> io::Result<Self> {
        let local = tcp.local_addr()?;
        let finish = |result: Result<TlsStream<TcpStream>, Handshake>, slot: Slot, addr: SocketAddr| match result {
            Ok(tls) => Some((Gated { inner: tls, slot: Some(slot) }, addr)),
            Err(Handshake::Refused(e)) => {
                tracing::debug!(peer = %addr, error = %e, "metrics TLS handshake failed");
                None
            }
            Err(Handshake::TimedOut) => {
                tracing::debug!(peer = %addr, "metrics TLS handshake timed out");
                None
            }
        };
        let acceptor = move || tokio_rustls::TlsAcceptor::from(tls.current_without_client_auth());
        let connections = spawn_handshakes(tcp, ListenerKind::Metrics, limits, metrics, acceptor, finish);
        Ok(Self { connections, local })
    }
}

impl Listener for MetricsTlsListener {
    type Io = Gated<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The health listener: plain TCP behind its own gate.
pub struct PlainListener {
    tcp: TcpListener,
    gate: ConnectionGate,
    metrics: Arc<Metrics>,
}

impl PlainListener {
    pub fn new(tcp: TcpListener, metrics: Arc<Metrics>, limits: Limits) -> Self {
        Self { tcp, gate: limits.gate(), metrics }
    }
}

impl Listener for PlainListener {
    type Io = Gated<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = accept(&self.tcp, ListenerKind::Health).await;
            if let Some(slot) = admit(&self.gate, addr, &self.metrics, ListenerKind::Health) {
                return (Gated { inner: stream, slot: Some(slot) }, addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
