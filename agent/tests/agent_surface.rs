//! The agent's surface under abuse, against the agent binary (root: network namespaces): 500 idle connections
//! (stalled TLS handshakes, and idle connections holding a stolen scraper certificate) and 200 concurrent
//! scrapes, from addresses other than the operator's. The operator's plan must still be answered and applied;
//! the kernel's counters are read once per burst of scrapes, not once per scrape. The plan's times, quiet and
//! under abuse, are printed side by side (a figure to read, not a timed assertion).

mod agent_common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, TestCerts};
use isthmus_agent_api::identity::node_server_name;
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{NodePlan, PodOutcome};
use isthmus_test_kit::openmetrics;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const NODE: &str = "node-surface";
const PODS: usize = 10;
const DESTINATIONS: usize = 10;
const IDLE: usize = 500;
const SCRAPES: usize = 200;
/// Scrapes this close to the last read of the counters reuse it: the agent's `SCRAPE_FRESH_FOR`.
const FRESH_FOR: Duration = Duration::from_secs(2);

fn plan(fleet: &Fleet, version: u64) -> NodePlan {
    let pods = (0..PODS).map(|i| {
        let destinations = (0..DESTINATIONS).map(|d| {
            let to = IpAddr::from([10, 247, 1, d as u8 + 1]);
            destination(to, rate(10_000_000 + version * 1000 + d as u64), link(&format!("l{d}")))
        });
        pod(&format!("uid-{i}"), &format!("p{i}"), &[fleet.ips[i]], destinations.collect())
    });
    NodePlan { node: NODE.into(), version, pods: pods.collect(), ..Default::default() }
}

async fn connect_from(source: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(to).await
}

/// `GET /metrics` as the scraper from `source`: the status, or None when the agent closed the connection.
async fn scrape(config: Arc<rustls::ClientConfig>, source: [u8; 4], agent: SocketAddr) -> Option<u16> {
    let tcp = connect_from(source, agent).await.ok()?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let server_name = node_server_name(NODE).unwrap();
    let mut tls = connector.connect(ServerName::try_from(server_name.clone()).unwrap(), tcp).await.ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).split_whitespace().nth(1)?.parse().ok()
}

/// One idle connection from `source`: a TCP connection that never starts its handshake (even), or a finished
/// handshake with the scraper's certificate that never sends a request (odd). None when refused at once.
enum Idle {
    Stalled(TcpStream),
    Authenticated(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

async fn idle(n: usize, config: Arc<rustls::ClientConfig>, agent: SocketAddr) -> Option<Idle> {
    let source = [127, 0, 0, 10 + (n % 5) as u8];
    let tcp = connect_from(source, agent).await.ok()?;
    if n.is_multiple_of(2) {
        return Some(Idle::Stalled(tcp));
    }
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = connector.connect(ServerName::try_from(node_server_name(NODE).unwrap()).unwrap(), tcp).await.ok()?;
    Some(Idle::Authenticated(Box::new(tls)))
}

/// Whether the agent has closed an idle connection (evicted it, or timed its handshake out).
async fn closed_by_agent(connection: &mut Idle) -> bool {
    let mut byte = [0u8; 1];
    let read = match connection {
        Idle::Stalled(tcp) => tokio::time::timeout(Duration::from_millis(20), tcp.read(&mut byte)).await,
        Idle::Authenticated(tls) => tokio::time::timeout(Duration::from_millis(20), tls.read(&mut byte)).await,
    };
    matches!(read, Ok(Ok(0)) | Ok(Err(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_surface_plan_answered_under_idle_connections_and_scrapes() {
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-surface-");
    let fleet = Fleet::new("isth-sf-", PODS, &pinned, [10, 246]);
    let certs = TestCerts::new(NODE);
    let agent = Agent::start(&AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &pinned,
        log_dir: work.path(),
        extra_env: vec![("ISTHMUS_RESYNC_SECONDS", "0".into())],
    });
    let client = certs.operator();
    let apply = |version| {
        let (client, plan) = (&client, plan(&fleet, version));
        async move {
            let start = Instant::now();
            let reply = client.apply(agent.api, &plan).await.expect("the operator's plan is answered");
            assert!(reply.pods.iter().all(|p| p.outcome == PodOutcome::Applied), "{reply:?}");
            start.elapsed()
        }
    };
    apply(1).await;
    let mut quiet = Vec::new();
    for version in 2..=4 {
        quiet.push(apply(version).await);
    }

    // Idle connections first, from five addresses; then a burst of scrapes from a sixth, with the plan
    // applied while the burst runs.
    let scraper = Arc::new(certs.tls_config("scraper"));
    let mut idle_connections = Vec::new();
    for n in 0..IDLE {
        idle_connections.extend(idle(n, scraper.clone(), agent.api).await);
    }
    let burst_start = Instant::now();
    let scrapes: Vec<_> =
        (0..SCRAPES).map(|_| tokio::spawn(scrape(scraper.clone(), [127, 0, 0, 20], agent.api))).collect();
    let loaded = apply(5).await;
    let mut answered = 0;
    for scrape in scrapes {
        answered += usize::from(scrape.await.unwrap() == Some(200));
    }
    let burst = burst_start.elapsed();
    let mut closed = 0;
    for connection in &mut idle_connections {
        closed += usize::from(closed_by_agent(connection).await);
    }
    let quiet_ms: Vec<String> = quiet.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1000.0)).collect();
    println!(
        "plan of {PODS} pods × {DESTINATIONS} destinations, every rate changed: quiet {} ms; with {} idle \
         connections held and {SCRAPES} scrapes: {:.1} ms; scrapes answered {answered}, refused or evicted {}; \
         idle connections closed by the agent {closed}; burst {:.0} ms",
        quiet_ms.join(" / "),
        idle_connections.len(),
        loaded.as_secs_f64() * 1000.0,
        SCRAPES - answered,
        burst.as_secs_f64() * 1000.0
    );

    let metrics = certs.metrics(agent.api);
    assert!(answered > 0, "no scrape was answered");
    let gate_acted = openmetrics::sum(&metrics, "isthmus_agent_connection_gate_total", &["listener=\"api\""]);
    assert!(gate_acted > 0.0, "the gate never had to act with {IDLE} idle connections: {metrics}");
    assert!(closed > 0, "no idle connection was closed to make room");
    // One read of the counters per FRESH_FOR window of the burst at most, plus the metrics call above.
    let observes = openmetrics::sum(&metrics, "isthmus_agent_scrape_observes_total", &[]);
    let windows = (burst.as_secs_f64() / FRESH_FOR.as_secs_f64()).ceil() + 2.0;
    assert!(observes <= windows, "{observes} reads of the counters for {answered} scrapes in {burst:?}");
    // The plan took effect in the kernel while all this went on.
    let tbfs = agent_common::count_tc(&fleet.pods[0], "qdisc", "tbf");
    assert_eq!(tbfs, DESTINATIONS, "{}", fleet.pods[0].qdiscs("eth0"));
}
