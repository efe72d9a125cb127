//! Who may call the agent, with real TLS against the agent binary: the operator's certificate is accepted;
//! no certificate, a certificate from another CA, and a valid certificate for another identity are refused;
//! the scraper's certificate reads /metrics only; rotated certificates are used without a restart, on both sides.

mod agent_common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, OPERATOR, Pki, TempDir, TestCerts, http_get, tls_exchange};
use isthmus_agent_api::client::ClientError;
use isthmus_agent_api::identity::node_server_name;
use isthmus_agent_api::tls::TlsFiles;

const NODE: &str = "node-auth";
const ROTATING_NODE: &str = "node-rot";

fn start_agent(certs: &TestCerts, work: &TempDir) -> Agent {
    let proc_dir = work.path().join("proc");
    let netns_dir = work.path().join("netns");
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::create_dir_all(&netns_dir).unwrap();
    Agent::start(&AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &netns_dir,
        log_dir: work.path(),
        extra_env: vec![],
    })
}

/// A TLS connection that presents no client certificate; returns what the server answered, or the error.
async fn call_without_client_cert(agent: SocketAddr, server_name: &str, ca_pem: &[u8]) -> Result<String, String> {
    let files = TlsFiles { ca: "ca.crt".into(), cert: "-".into(), key: "-".into() };
    let material = isthmus_agent_api::tls::TlsMaterial { ca: ca_pem.to_vec(), cert: vec![], key: vec![] };
    let roots = material.root_store(&files).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(isthmus_agent_api::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let request = format!("GET /v1/capabilities HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
    tls_exchange(agent, server_name, config, request.as_bytes()).await
}

fn write_client(dir: &Path, trust: &Pki, issuer: &Pki, identity: &str) {
    issuer.write(dir, trust, &issuer.issue(identity, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_auth_only_the_operator_is_served() {
    let certs = TestCerts::new(NODE);
    let work = TempDir::new("isth-auth-");
    let agent = start_agent(&certs, &work);

    // The operator.
    let caps = certs.operator().capabilities(agent.api, NODE).await.expect("the operator is served");
    assert!(!caps.kernel_release.is_empty());

    // No client certificate: the handshake is refused.
    let ca_pem = std::fs::read(certs.agent_dir().join("ca.crt")).unwrap();
    let no_cert = call_without_client_cert(agent.api, &certs.server_name, &ca_pem).await;
    assert!(
        no_cert.as_ref().is_err_and(|e| e.contains("CertificateRequired") || e.contains("certificate")),
        "{no_cert:?}"
    );

    // A certificate for the operator's name from another CA: the handshake is refused.
    let rogue = Pki::new("rogue CA");
    let rogue_dir = work.path().join("rogue");
    write_client(&rogue_dir, &certs.ca, &rogue, OPERATOR);
    let err = certs.client_from(&rogue_dir).capabilities(agent.api, NODE).await.unwrap_err();
    assert!(matches!(err, ClientError::Http { .. } | ClientError::Connect { .. }), "{err}");
    assert!(!err.is_forbidden());

    // A valid certificate of the same CA for another ServiceAccount: 403.
    let other_dir = certs.dir.0.join("other");
    write_client(&other_dir, &certs.ca, &certs.ca, "default.isthmus-system.serviceaccount.isthmus");
    let err = certs.client_from(&other_dir).capabilities(agent.api, NODE).await.unwrap_err();
    assert!(err.is_forbidden(), "{err}");
    assert!(err.to_string().contains("neither the operator's nor the scraper's"), "{err}");
    // The same for a plan: nothing is applied.
    let plan = isthmus_agent_api::NodePlan { node: NODE.into(), version: 1, pods: vec![], ..Default::default() };
    assert!(certs.client_from(&other_dir).apply(agent.api, &plan).await.unwrap_err().is_forbidden());
    let observed = certs.operator().observed(agent.api, NODE).await.unwrap();
    assert_eq!(observed.version, 0, "the refused plan was not applied");

    // The agent's own serving certificate is not a client certificate.
    let server_as_client = work.path().join("server-as-client");
    certs.ca.write(&server_as_client, &certs.ca, &certs.ca.issue(&certs.server_name, true));
    assert!(certs.client_from(&server_as_client).capabilities(agent.api, NODE).await.is_err());

    // The scraper may read /metrics and nothing else.
    let (code, body) = certs.get(agent.api, "scraper", "/v1/capabilities");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("Scraper may not call /v1/capabilities"), "{body}");
    let (code, _) = certs.get(agent.api, "operator", "/metrics");
    assert_eq!(code, 200, "the operator may read metrics too");
    let (code, body) = certs.get(agent.api, "other", "/metrics");
    assert_eq!(code, 403, "another identity of the same CA may not: {body}");
    let metrics = certs.metrics(agent.api);
    assert!(metrics.contains("isthmus_agent_forbidden_requests_total 4"), "{metrics}");
    let handshakes = metrics
        .lines()
        .find(|l| l.starts_with("isthmus_agent_tls_handshake_failures_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap();
    assert!(handshakes >= 2, "{metrics}");

    // The plain health port answers probes and nothing about tenants.
    assert_eq!(http_get(agent.health, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(agent.health, "/readyz").unwrap().0, 200);
    assert_eq!(http_get(agent.health, "/metrics").unwrap().0, 404, "no anonymous metrics");
}

/// Replaces a Secret-like directory the way kubelet does: new files in a fresh directory, then a symlink swap.
fn kubelet_style_dir(root: &Path, generation: u32, write: impl FnOnce(&Path)) -> std::path::PathBuf {
    let data = root.join(format!("..gen{generation}"));
    write(&data);
    let tmp = root.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(data.file_name().unwrap(), &tmp).unwrap();
    std::fs::rename(&tmp, root.join("..data")).unwrap();
    for name in ["ca.crt", "tls.crt", "tls.key"] {
        let link = root.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    root.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_auth_rotated_certificates_are_used_without_restart() {
    let work = TempDir::new("isth-rot-");
    let old = Pki::new("CA generation 1");
    let server_name = node_server_name(ROTATING_NODE).unwrap();
    let agent_root = work.path().join("agent-secret");
    let operator_root = work.path().join("operator-secret");
    std::fs::create_dir_all(&agent_root).unwrap();
    std::fs::create_dir_all(&operator_root).unwrap();
    kubelet_style_dir(&agent_root, 1, |d| old.write(d, &old, &old.issue(&server_name, true)));
    kubelet_style_dir(&operator_root, 1, |d| old.write(d, &old, &old.issue(OPERATOR, false)));

    let proc_dir = work.path().join("proc");
    let netns_dir = work.path().join("netns");
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::create_dir_all(&netns_dir).unwrap();
    let agent = Agent::start(&AgentOptions {
        node: ROTATING_NODE,
        tls_dir: &agent_root,
        proc: &proc_dir,
        netns_dir: &netns_dir,
        log_dir: work.path(),
        extra_env: vec![],
    });
    let pid = agent.child.id();
    let certs = TestCerts::new(ROTATING_NODE);
    let operator = certs.client_from(&operator_root);
    operator.capabilities(agent.api, ROTATING_NODE).await.expect("generation 1 works");

    // Rotate everything to a new CA: the agent's files first, then the operator's.
    let new = Pki::new("CA generation 2");
    kubelet_style_dir(&agent_root, 2, |d| new.write(d, &new, &new.issue(&server_name, true)));
    kubelet_style_dir(&operator_root, 2, |d| new.write(d, &new, &new.issue(OPERATOR, false)));

    // The same client object picks up its new files; the agent reloads within its poll interval.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match operator.capabilities(agent.api, ROTATING_NODE).await {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "rotated certificates never accepted: {e}\n{}", agent.log_text());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(agent.child.id(), pid, "no restart");
    assert!(agent.log_text().contains("TLS certificates changed on disk"));

    // A client still holding generation-1 certificates is now refused.
    let stale_dir = work.path().join("stale");
    old.write(&stale_dir, &old, &old.issue(OPERATOR, false));
    assert!(certs.client_from(&stale_dir).capabilities(agent.api, ROTATING_NODE).await.is_err());

    // A half-written rotation (key missing) is reported and the working certificates stay in force.
    let broken = agent_root.join("..gen3");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("ca.crt"), new.ca_cert.pem()).unwrap();
    std::fs::write(broken.join("tls.crt"), "not a certificate").unwrap();
    std::fs::write(broken.join("tls.key"), "").unwrap();
    let tmp = agent_root.join("..data_tmp");
    std::os::unix::fs::symlink("..gen3", &tmp).unwrap();
    std::fs::rename(&tmp, agent_root.join("..data")).unwrap();
    // The agent polls every second; wait for it to have seen the broken files, however loaded the machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !agent.log_text().contains("keeping the previous certificates") {
        assert!(Instant::now() < deadline, "the broken rotation was never reported: {}", agent.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    operator.capabilities(agent.api, ROTATING_NODE).await.expect("previous certificates stay in force");
}
