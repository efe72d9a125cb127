//! The hold (`isthmus_operator::admission::hold`) called by a real API server: the operator's own listener and
//! decision, registered as the chart registers it (pods, CREATE, the label's object selector, failure policy
//! Fail, reinvocation), reached by URL on this machine and limited to one namespace so that nothing else in the
//! cluster depends on it; then the held pod's question answered from the listener's watch, asked by the injected
//! container's own code (`wait_for_links::run`).

use std::sync::Arc;
use std::time::Duration;

use isthmus_operator::admission::hold::{CONTAINER_NAME, HOLD_LABEL};
use isthmus_operator::admission::links_applied::HeldPods;
use isthmus_operator::admission::server::{HoldServing, ServingCertificate, bind};
use isthmus_operator::admission::{HOLD_PATH, LINKS_APPLIED_PATH, upkeep};
use isthmus_operator::gate::CONDITION_TYPE;
use isthmus_operator::metrics::Metrics;
use isthmus_operator::pki::ca::{Authority, CaSet};
use isthmus_operator::pki::names::ServiceDnsName;
use isthmus_operator::wait_for_links::{self, WaitConfig};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const IMAGE: &str = "localhost/isthmus-operator:it";

/// The hold as the chart registers it (charts/isthmus/templates/hold-webhook.yaml), with a URL for the service
/// and a namespace selector that picks the test's namespace alone.
fn registration(name: &str, ns: &str, port: u16, ca_bundle: &str) -> MutatingWebhookConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "hold.isthmus.dev",
            "clientConfig": {
                "url": format!("https://localhost:{port}{HOLD_PATH}"),
                "caBundle": k8s_openapi::ByteString(ca_bundle.as_bytes().to_vec()),
            },
            "rules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"], "scope": "Namespaced",
            }],
            "objectSelector": {"matchLabels": {HOLD_LABEL: "true"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))
    .expect("a valid MutatingWebhookConfiguration")
}

fn pod(name: &str, held: bool) -> Pod {
    let labels = if held { json!({"app": "api", HOLD_LABEL: "true"}) } else { json!({"app": "api"}) };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "localhost/migrate:1"}],
            "containers": [{"name": "api", "image": "localhost/api:1"}],
        },
    }))
    .unwrap()
}

fn init_names(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().init_containers.iter().flatten().map(|c| c.name.clone()).collect()
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().readiness_gates.iter().flatten().map(|g| g.condition_type.clone()).collect()
}

/// The container's configuration for `pod`, aimed at the listener on loopback (certificate for `localhost`).
fn waiting_for(pod: &Pod, port: u16, ca_bundle: &str, timeout: Duration) -> WaitConfig {
    WaitConfig {
        host: "localhost".into(),
        port,
        path: LINKS_APPLIED_PATH.into(),
        address: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        ca_bundle: ca_bundle.into(),
        namespace: pod.metadata.namespace.clone().unwrap(),
        name: pod.metadata.name.clone().unwrap(),
        uid: pod.metadata.uid.clone().unwrap(),
        timeout,
    }
}

#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation of main.rs"]
async fn an_opted_in_pod_is_held_once_and_released_by_its_condition_and_others_never_depend_on_the_operator() {
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG) for a running kube-apiserver");
    let ns = format!("hold-it-{}", std::process::id());
    super::create_namespace(&client, &ns).await;
    let ca = CaSet::new(Authority::generate(time::OffsetDateTime::now_utc(), Duration::from_secs(86_400)).unwrap());
    let (_, key) = upkeep::issue(&ca, "localhost", Duration::from_secs(3600)).unwrap();
    let certificate = Arc::new(ServingCertificate::default());
    certificate.set(key);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let bundle = ca.bundle();
    let bundle_now = bundle.clone();
    let hold = HoldServing::new(
        HeldPods::watch(client.clone(), stopped.clone()),
        client.clone(),
        IMAGE.into(),
        "IfNotPresent".into(),
        // No such Service: the container is configured with its name alone (the test aims it at loopback).
        ServiceDnsName::new(&format!("isthmus-webhook.{ns}.svc")).unwrap(),
        443,
        Arc::new(move || bundle_now.clone()),
        Duration::from_secs(120),
        Duration::from_secs(600),
    );
    let metrics = Arc::new(Metrics::new());
    let (addr, serving) =
        bind("127.0.0.1:0".parse().unwrap(), certificate, metrics, Some(Arc::new(hold)), stopped).await.unwrap();
    tokio::spawn(serving);
    let name = format!("isthmus-it-{ns}");
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let _ = configurations.delete(&name, &DeleteParams::default()).await;
    configurations.create(&PostParams::default(), &registration(&name, &ns, addr.port(), &bundle)).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // The API server picks a new configuration up from its informer, within about a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let dry = PostParams { dry_run: true, ..Default::default() };
    loop {
        let probe = pods.create(&dry, &pod("probe", true)).await.unwrap();
        if init_names(&probe).first().map(String::as_str) == Some(CONTAINER_NAME) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the webhook is not called: {probe:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Opted in: the wait first, exactly once, and the gate; the rest of the pod as written.
    let held = pods.create(&PostParams::default(), &pod("held", true)).await.unwrap();
    assert_eq!(init_names(&held), [CONTAINER_NAME, "migrate"]);
    assert_eq!(gates(&held), [CONDITION_TYPE]);
    let wait = &held.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!((wait.image.as_deref(), wait.args.as_deref()), (Some(IMAGE), Some(&["wait-for-links".to_string()][..])));
    // Not opted in: untouched.
    let plain = pods.create(&PostParams::default(), &pod("plain", false)).await.unwrap();
    assert_eq!(init_names(&plain), ["migrate"]);
    assert!(gates(&plain).is_empty());

    // The container's question, asked by its own code: Unknown while no condition is written, so it times out
    // naming its timeout and the last answer; True once the operator writes it, and the wait ends.
    let short = waiting_for(&held, addr.port(), &bundle, Duration::from_secs(2));
    let timed_out = wait_for_links::run(short.clone()).await.unwrap_err().to_string();
    assert!(
        timed_out.starts_with("the pod's links were not applied within 2s")
            && timed_out.ends_with("last: isthmus.dev/links-applied Unknown"),
        "{timed_out}"
    );
    let other = WaitConfig { uid: "00000000-0000-0000-0000-000000000000".into(), ..short };
    let refused = wait_for_links::run(other).await.unwrap_err().to_string();
    assert!(refused.contains("404 Not Found: no held pod"), "another pod's UID: {refused}");
    let applied = json!({"status": {"conditions": [
        {"type": CONDITION_TYPE, "status": "True", "reason": "Applied", "message": "applied"},
    ]}});
    pods.patch_status("held", &PatchParams::default(), &Patch::Merge(&applied)).await.unwrap();
    let long = waiting_for(&held, addr.port(), &bundle, Duration::from_secs(30));
    tokio::time::timeout(Duration::from_secs(30), wait_for_links::run(long)).await.unwrap().expect("released");

    // The operator down: an unrelated pod is admitted as ever; an opted-in one is refused, not run unimpaired.
    let _ = stop.send(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    pods.create(&PostParams::default(), &pod("plain-2", false)).await.expect("an unlabelled pod is admitted");
    let refused = pods.create(&PostParams::default(), &pod("held-2", true)).await.unwrap_err().to_string();
    assert!(refused.contains("failed calling webhook \"hold.isthmus.dev\""), "{refused}");

    configurations.delete(&name, &DeleteParams::default()).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
}
