//! The operator's agent client against a hostile agent: a TLS server holding a valid agent certificate that
//! streams a reply without end (1 GiB announced), or never answers. The client cuts the first off at its reply
//! limit, with its memory bounded by that limit, and the second at its request timeout. And an agent whose
//! certificate names another node than the one the client means to reach is refused in the handshake.

mod agent_common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_common::TestCerts;
use isthmus_agent_api::client::{AgentClient, ClientConfig, ClientError, TlsFiles};
use isthmus_agent_api::tls::crypto_provider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const GIB: u64 = 1 << 30;

/// A fake agent on 127.0.0.1 that answers one request with `reply` (None: never answers); returns its address
/// and what it managed to send.
async fn fake_agent(certs: &TestCerts, reply: Option<u64>) -> (SocketAddr, tokio::task::JoinHandle<u64>) {
    let files = TlsFiles::in_dir(certs.agent_dir());
    let material = files.read().unwrap();
    let config = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(material.certificate_chain(&files).unwrap(), material.private_key(&files).unwrap())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        // A client that refuses the certificate ends the handshake: nothing was sent.
        let Ok(mut tls) = acceptor.accept(tcp).await else { return 0 };
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return 0,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let Some(length) = reply else {
            // Hold the connection open without a word until the client goes.
            let _ = tls.read(&mut buf).await;
            return 0;
        };
        let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n");
        if tls.write_all(head.as_bytes()).await.is_err() {
            return 0;
        }
        let chunk = vec![b' '; 1 << 20];
        let mut sent = 0u64;
        while sent < length {
            if tls.write_all(&chunk).await.is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        sent
    });
    (addr, task)
}

fn client(certs: &TestCerts, request_timeout: Duration) -> AgentClient {
    let mut config = ClientConfig::new(TlsFiles::in_dir(certs.dir.0.join("operator"))).unwrap();
    config.request_timeout = request_timeout;
    AgentClient::new(config)
}

/// This process's peak resident memory (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    isthmus_test_kit::proc::status_kib(&status, "VmHWM").unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_client_cuts_off_an_endless_reply_with_bounded_memory() {
    let certs = TestCerts::new("node-a");
    let (agent, server) = fake_agent(&certs, Some(GIB)).await;
    let client = client(&certs, Duration::from_secs(120));
    let limit = ClientConfig::new(TlsFiles::in_dir(certs.dir.0.join("operator"))).unwrap().max_reply_bytes as u64;
    // The peak so far, then the peak after: what the call added at most.
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = peak_rss();
    let err = client.capabilities(agent, "node-a").await.unwrap_err();
    let grown = peak_rss().saturating_sub(before);
    assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains(&format!("longer than {limit} bytes")), "{err}");
    let sent = tokio::time::timeout(Duration::from_secs(60), server).await.expect("the fake agent stops").unwrap();
    println!("reply cut off after the fake agent sent {} MiB; peak memory grew {} MiB", sent >> 20, grown >> 20);
    assert!(sent < GIB, "the client read the whole 1 GiB");
    assert!(grown < 3 * limit, "memory grew by {grown} bytes for a {limit}-byte limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_client_gives_up_on_an_agent_that_never_answers() {
    let certs = TestCerts::new("node-a");
    let (agent, _server) = fake_agent(&certs, None).await;
    let err = client(&certs, Duration::from_secs(1)).capabilities(agent, "node-a").await.unwrap_err();
    assert!(matches!(err, ClientError::Timeout { after, .. } if after == Duration::from_secs(1)), "{err}");
}

/// The agent serving node-a's certificate, dialled as node-b (a pod IP the operator believes is node-b's agent):
/// refused before a request is sent; dialled as node-a, the same agent is reached (its endless reply is then cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_client_refuses_an_agent_whose_certificate_names_another_node() {
    let certs = TestCerts::new("node-a");
    let client = client(&certs, Duration::from_secs(20));

    let (agent, server) = fake_agent(&certs, Some(GIB)).await;
    let err = client.capabilities(agent, "node-b").await.unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    let sent = tokio::time::timeout(Duration::from_secs(20), server).await.unwrap().unwrap();
    assert_eq!(sent, 0, "the agent got a request although its certificate names another node");

    let (agent, server) = fake_agent(&certs, Some(GIB)).await;
    let err = client.capabilities(agent, "node-a").await.unwrap_err();
    assert!(matches!(err, ClientError::TooLarge { .. }), "dialled as its own node, the agent is reached: {err}");
    let _ = server.await;
}
