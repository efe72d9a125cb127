//! /metrics by ServiceAccount token against a real API server (`make operator-it` runs it with
//! `ISTHMUS_TEST_KUBECONFIG`; ignored otherwise): the agent binary's metrics listener asks the API server
//! (TokenReview, SubjectAccessReview) about the tokens of two ServiceAccounts, one bound to a ClusterRole with
//! the chart's `<fullname>-metrics-reader` rule (`get` on the non-resource URL /metrics) and one without:
//! 200 for the first, 403 for the second, 401 without a token or with a forged one; only /metrics is served
//! there, and the API port still refuses a caller without the operator's certificate.

mod agent_common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use agent_common::{Agent, AgentOptions, TempDir, TestCerts, free_port, unique};
use isthmus_agent_api::test_util::https::{Answer, bearer_get, tls_exchange};

const NODE: &str = "node-token";

fn kubeconfig() -> Option<String> {
    std::env::var("ISTHMUS_TEST_KUBECONFIG").ok().filter(|k| !k.is_empty())
}

fn kubectl(kubeconfig: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A TLS client that verifies the agent's serving certificate and presents none of its own.
fn without_client_certificate(certs: &TestCerts) -> rustls::ClientConfig {
    let ca = std::fs::read(certs.agent_dir().join("ca.crt")).unwrap();
    let files = isthmus_agent_api::tls::TlsFiles { ca: "ca.crt".into(), cert: "-".into(), key: "-".into() };
    let material = isthmus_agent_api::tls::TlsMaterial { ca, cert: vec![], key: vec![] };
    rustls::ClientConfig::builder_with_provider(isthmus_agent_api::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(material.root_store(&files).unwrap())
        .with_no_client_auth()
}

/// `GET path` over TLS without a client certificate, verifying the agent's serving certificate, with an
/// optional bearer token.
async fn get(certs: &TestCerts, addr: SocketAddr, path: &str, token: Option<&str>) -> Answer {
    bearer_get(addr, &certs.server_name, without_client_certificate(certs), path, token).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real API server: ISTHMUS_TEST_KUBECONFIG (make operator-it)"]
async fn agent_metrics_by_token_200_403_401() {
    let Some(kubeconfig) = kubeconfig() else { panic!("ISTHMUS_TEST_KUBECONFIG is not set") };
    let ns = unique("metrics-token-");
    let reader_role = format!("{ns}-metrics-reader");
    kubectl(&kubeconfig, &["create", "namespace", &ns], None);
    let objects = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: reader, namespace: {ns}}}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: stranger, namespace: {ns}}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {reader_role}}}\n\
         rules: [{{nonResourceURLs: [/metrics], verbs: [get]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {reader_role}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {reader_role}}}\n\
         subjects: [{{kind: ServiceAccount, name: reader, namespace: {ns}}}]\n"
    );
    kubectl(&kubeconfig, &["apply", "-f", "-"], Some(&objects));
    let reader = kubectl(&kubeconfig, &["-n", &ns, "create", "token", "reader"], None);
    let stranger = kubectl(&kubeconfig, &["-n", &ns, "create", "token", "stranger"], None);

    let certs = TestCerts::new(NODE);
    let work = TempDir::new("isth-token-");
    let (proc_dir, netns_dir) = (work.path().join("proc"), work.path().join("netns"));
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::create_dir_all(&netns_dir).unwrap();
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = Agent::start(&AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &netns_dir,
        log_dir: work.path(),
        extra_env: vec![("ISTHMUS_METRICS_LISTEN", metrics_addr.to_string()), ("KUBECONFIG", kubeconfig.clone())],
    });

    // RBAC reaches the authorizer's cache shortly after the binding is written: wait for the first 200.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = loop {
        let answer = get(&certs, metrics_addr, "/metrics", Some(&reader)).await;
        if answer.status == 200 || std::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_eq!(answer.status, 200, "{answer:?}\n{}", agent.log_text());
    assert!(answer.body.contains("isthmus_agent_metrics_auth_total{outcome=\"allowed\"}"), "{answer:?}");

    let answer = get(&certs, metrics_addr, "/metrics", Some(&stranger)).await;
    assert_eq!((answer.status, answer.header("WWW-Authenticate")), (403, None), "{answer:?}");
    // A 401 names the scheme it wants (RFC 6750).
    for token in [None, Some("eyJhbGciOiJSUzI1NiJ9.forged.signature")] {
        let answer = get(&certs, metrics_addr, "/metrics", token).await;
        assert_eq!((answer.status, answer.header("WWW-Authenticate")), (401, Some("Bearer")), "{answer:?}");
    }
    // Only /metrics is served there: anything else needs a token first, and is not found with one.
    assert_eq!(get(&certs, metrics_addr, "/v1/capabilities", None).await.status, 401);
    assert_eq!(get(&certs, metrics_addr, "/v1/capabilities", Some(&reader)).await.status, 404);
    // The API port still wants the operator's certificate: a token does not get past its handshake.
    let config = without_client_certificate(&certs);
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {reader}\r\nConnection: close\r\n\r\n",
        certs.server_name
    );
    let api = tls_exchange(agent.api, &certs.server_name, config, request.as_bytes()).await;
    assert!(api.as_ref().is_err_and(|e| e.contains("ertificate")), "{api:?}");

    // Every outcome counted (the cached ones too), read back as the reader.
    let body = get(&certs, metrics_addr, "/metrics", Some(&reader)).await.body;
    for (outcome, at_least) in [("allowed", 2), ("forbidden", 1), ("unauthenticated", 3)] {
        let line = body
            .lines()
            .find(|l| l.starts_with(&format!("isthmus_agent_metrics_auth_total{{outcome=\"{outcome}\"}}")))
            .unwrap_or_else(|| panic!("no {outcome} counter: {body}"));
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value >= at_least as f64, "{line}");
    }

    kubectl(&kubeconfig, &["delete", "clusterrolebinding,clusterrole", &reader_role, "--wait=false"], None);
    kubectl(&kubeconfig, &["delete", "namespace", &ns, "--wait=false"], None);
}
