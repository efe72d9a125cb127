//! The operator's `/metrics` by ServiceAccount token (`isthmus_operator::metrics_https`) asking a real API
//! server: the listener as the binary serves it (a certificate from the operator's CA, `KubeReviewer`), the
//! tokens of two ServiceAccounts, one bound to a ClusterRole with the chart's `<fullname>-metrics-reader`
//! rule (`get` on the non-resource URL /metrics) and one without: 200 for the first, 403 for the second, 401
//! without a token or with a forged one, 404 elsewhere with the allowed token only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::metrics_auth::{DecisionCache, KubeReviewer, MetricsAuth};
use isthmus_agent_api::test_util::https::{Answer, bearer_get};
use isthmus_operator::admission::upkeep;
use isthmus_operator::https::ServingCertificate;
use isthmus_operator::metrics::Metrics;
use isthmus_operator::pki::ca::{Authority, CaSet, certificates};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const SERVER_NAME: &str = "isthmus-operator-metrics.it.svc";

/// `GET path` over TLS, verifying the listener's certificate under [`SERVER_NAME`] against `ca`, with an
/// optional bearer token.
async fn get(ca: &str, addr: SocketAddr, path: &str, token: Option<&str>) -> Answer {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca).unwrap() {
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    bearer_get(addr, SERVER_NAME, config, path, token)
        .await
        .expect("the listener's certificate verifies under its name")
}

async fn token(client: &Client, ns: &str, account: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let answered = accounts.create_token_request(account, &PostParams::default(), &TokenRequest::default()).await;
    answered.unwrap().status.expect("a token").token
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn operator_metrics_by_token_200_403_401() {
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG) for a running kube-apiserver");
    let ns = format!("op-metrics-{}", std::process::id());
    super::create_namespace(&client, &ns).await;
    let role = format!("{ns}-metrics-reader");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    for name in ["reader", "stranger"] {
        accounts.create(&PostParams::default(), &object(json!({"metadata": {"name": name}}))).await.unwrap();
    }
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let rule = json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]});
    roles.create(&PostParams::default(), &object(json!({"metadata": {"name": role}, "rules": [rule]}))).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = json!({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    });
    bindings.create(&PostParams::default(), &object(binding)).await.unwrap();
    let (reader, stranger) = (token(&client, &ns, "reader").await, token(&client, &ns, "stranger").await);

    let ca = CaSet::new(Authority::generate(time::OffsetDateTime::now_utc(), Duration::from_secs(86_400)).unwrap());
    let (_, key) = upkeep::issue(&ca, SERVER_NAME, Duration::from_secs(3600)).unwrap();
    let certificate = Arc::new(ServingCertificate::default());
    certificate.set(key);
    let metrics = Arc::new(Metrics::new());
    let auth = Arc::new(MetricsAuth::new(KubeReviewer::new(client.clone()), DecisionCache::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (addr, serving) =
        isthmus_operator::metrics_https::bind("127.0.0.1:0".parse().unwrap(), certificate, metrics, auth, stopped)
            .await
            .unwrap();
    let serving = tokio::spawn(serving);
    let bundle = ca.bundle();

    // RBAC reaches the authorizer's cache shortly after the binding is written: wait for the first 200 (a
    // refusal is cached for 30 s, so this waits with a fresh token's worth of patience each time).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let fresh = token(&client, &ns, "reader").await;
        let answer = get(&bundle, addr, "/metrics", Some(&fresh)).await;
        if answer.status == 200 || tokio::time::Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("isthmus_operator_metrics_auth_total{outcome=\"allowed\"}"), "{answer:?}");
    assert!(answer.body.contains("isthmus_operator_reconciles_total"), "{answer:?}");
    assert_eq!(get(&bundle, addr, "/metrics", Some(&reader)).await.status, 200);
    let answer = get(&bundle, addr, "/metrics", Some(&stranger)).await;
    assert_eq!((answer.status, answer.header("WWW-Authenticate")), (403, None), "{answer:?}");
    // A 401 names the scheme it wants (RFC 6750).
    for token in [None, Some("eyJhbGciOiJSUzI1NiJ9.forged.signature")] {
        let answer = get(&bundle, addr, "/metrics", token).await;
        assert_eq!((answer.status, answer.header("WWW-Authenticate")), (401, Some("Bearer")), "{answer:?}");
    }
    // Nothing else is served: without a token not even a 404 says so.
    assert_eq!(get(&bundle, addr, "/healthz", None).await.status, 401);
    assert_eq!(get(&bundle, addr, "/healthz", Some(&reader)).await.status, 404);

    // Every outcome counted (the cached ones too), read back as the reader.
    let body = get(&bundle, addr, "/metrics", Some(&reader)).await.body;
    for (outcome, at_least) in [("allowed", 3), ("forbidden", 1), ("unauthenticated", 3)] {
        let prefix = format!("isthmus_operator_metrics_auth_total{{outcome=\"{outcome}\"}} ");
        let line = body.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {outcome}: {body}"));
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value >= f64::from(at_least), "{line}");
    }

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), serving).await;
    let _ = bindings.delete(&role, &DeleteParams::default()).await;
    let _ = roles.delete(&role, &DeleteParams::default()).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
