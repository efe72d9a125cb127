//! `isthmus-operator uninstall` (the chart's pre-delete hook) against a real kube-apiserver: while the cleanup
//! finalizer stays on the links it deletes them, times out and names them; once the finalizers are gone it
//! succeeds and no NetworkLink is left, including one created in between. While a pod declares the readiness gate
//! it uninstalls nothing, naming the pod, unless told to release such pods.
//!
//! Ignored in a plain `cargo test`: `make operator-it` starts a control plane and names its kubeconfig in
//! `ISTHMUS_TEST_KUBECONFIG`. Each test deletes every NetworkLink in the cluster, so they run one at a time.

use std::process::Output;
use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::controller::finalizer::FINALIZER;
use isthmus_operator::gate::CONDITION_TYPE;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::json;

const NAMESPACE: &str = "isthmus-uninstall-it";
const GATED_NAMESPACE: &str = "isthmus-uninstall-gated-it";

/// Held by each test: every one deletes every NetworkLink in the cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn client() -> Option<(Client, String)> {
    let path = std::env::var("ISTHMUS_TEST_KUBECONFIG").ok()?;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("usable kubeconfig");
    Some((Client::try_from(config).expect("client"), path))
}

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = NetworkLink::crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(&name, &PatchParams::apply("isthmus-uninstall-it").force(), &Patch::Apply(&crd)).await.unwrap();
    eventually("CRD established", || async {
        let c = crds.get(&name).await.ok()?;
        c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

async fn fresh_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    eventually("old namespace gone", || async { api.get_opt(name).await.ok()?.is_none().then_some(()) }).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

async fn create_link(links: &Api<NetworkLink>, name: &str, finalizers: &[&str]) {
    let link: NetworkLink = serde_json::from_value(json!({
        "apiVersion": "isthmus.dev/v1alpha1",
        "kind": "NetworkLink",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {"from": {"podSelector": {}}, "to": {"podSelector": {}}, "impairment": {"bandwidth": "1Mbit"}},
    }))
    .unwrap();
    links.create(&PostParams::default(), &link).await.unwrap();
}

/// Runs the real binary, as the Job does, with the test cluster's kubeconfig.
async fn uninstall(kubeconfig: &str, timeout_seconds: u64, extra: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_isthmus-operator"));
    command.args(["uninstall", "--timeout-seconds", &timeout_seconds.to_string()]).args(extra);
    command.env("KUBECONFIG", kubeconfig);
    tokio::task::spawn_blocking(move || command.output().expect("isthmus-operator runs")).await.unwrap()
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn uninstall_fails_naming_links_kept_by_finalizer_then_succeeds_once_they_are_gone() {
    let _serial = SERIAL.lock().await;
    let (client, kubeconfig) =
        client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    install_crd(&client).await;
    fresh_namespace(&client, NAMESPACE).await;
    let _removed = Removed(NAMESPACE);
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), NAMESPACE);
    let all: Api<NetworkLink> = Api::all(client.clone());
    for name in ["held-1", "held-2"] {
        create_link(&links, name, &[FINALIZER]).await;
    }

    // No operator runs, so nothing removes the finalizers: the command must give up and name both links.
    let out = uninstall(&kubeconfig, 3, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "uninstall succeeded while finalizers remained; stderr:\n{stderr}");
    eprintln!("uninstall with finalizers left, as expected:\n{stderr}");
    for name in ["held-1", "held-2"] {
        assert!(
            stderr.contains(&format!("{NAMESPACE}/{name} (finalizers: {FINALIZER})")),
            "{name} not named:\n{stderr}"
        );
        let link = links.get(name).await.unwrap();
        assert!(link.metadata.deletion_timestamp.is_some(), "{name} was not deleted");
    }
    assert!(stderr.contains("2 NetworkLink(s) still present after 3s"), "unexpected message:\n{stderr}");

    // The operator's part, done by hand; plus a link that appears before the rerun.
    let drop_finalizers = json!({"metadata": {"finalizers": null}});
    for name in ["held-1", "held-2"] {
        links.patch(name, &PatchParams::default(), &Patch::Merge(&drop_finalizers)).await.unwrap();
    }
    create_link(&links, "late", &[]).await;
    let out = uninstall(&kubeconfig, 30, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "uninstall failed although no finalizer remained; stderr:\n{stderr}");
    let left = all.list(&ListParams::default()).await.unwrap();
    assert!(
        left.items.is_empty(),
        "NetworkLinks left: {:?}",
        left.items.iter().map(|l| &l.metadata.name).collect::<Vec<_>>()
    );
}

/// Deletes its namespace when dropped, on its own runtime and thread (also when the test fails: its own runtime
/// may be unwinding), and waits until it is gone, for at most a minute. Declared after the [`SERIAL`] guard, so
/// dropped before it: the next test must not find this one's pods, as an uninstall checks every namespace for
/// gated ones (a CI run of the finalizer test met the gated pod of the test before it, its namespace still
/// terminating).
struct Removed(&'static str);

impl Drop for Removed {
    fn drop(&mut self) {
        let ns = self.0;
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let Some((client, _)) = client().await else { return };
                let namespaces = Api::<Namespace>::all(client);
                let _ = namespaces.delete(ns, &DeleteParams::default()).await;
                for _ in 0..300 {
                    if matches!(namespaces.get_opt(ns).await, Ok(None)) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                eprintln!("namespace {ns} still there a minute after its deletion");
            });
        });
        let _ = cleanup.join();
    }
}

/// A pod of `GATED_NAMESPACE`, with or without the readiness gate. No scheduler runs, so it stays Pending and
/// unbound (and goes at once when deleted); created once the namespace's default ServiceAccount exists.
async fn create_pod(pods: &Api<Pod>, name: &str, gated: bool) {
    let gates = if gated { json!([{"conditionType": CONDITION_TYPE}]) } else { json!(null) };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"readinessGates": gates, "containers": [{"name": "c", "image": "localhost/none:1"}]},
    }))
    .unwrap();
    eventually(&format!("pod {name} created"), || async { pods.create(&PostParams::default(), &pod).await.ok() }).await;
}

/// The reason of the gate's condition on the pod, if it carries one.
async fn gate_reason(pods: &Api<Pod>, name: &str) -> Option<(String, Option<String>)> {
    let pod = pods.get(name).await.unwrap();
    let conditions = pod.status?.conditions?;
    let c = conditions.into_iter().find(|c| c.type_ == CONDITION_TYPE)?;
    Some((c.status, c.reason))
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn uninstall_refuses_while_a_pod_declares_the_gate_and_releases_it_when_told() {
    let _serial = SERIAL.lock().await;
    let (client, kubeconfig) =
        client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    install_crd(&client).await;
    fresh_namespace(&client, GATED_NAMESPACE).await;
    let _removed = Removed(GATED_NAMESPACE);
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), GATED_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), GATED_NAMESPACE);
    create_link(&links, "kept", &[]).await;
    create_pod(&pods, "gated", true).await;
    create_pod(&pods, "plain", false).await;

    // Without isthmus nothing would set the gated pod's condition (nor that of any later pod from its template):
    // the hook refuses before it deletes anything, naming the pod.
    let out = uninstall(&kubeconfig, 30, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "uninstall went ahead while a pod declares the gate; stderr:\n{stderr}");
    eprintln!("uninstall with a gated pod, refused as expected:\n{stderr}");
    assert!(stderr.contains("nothing was uninstalled: 1 pod(s) declare the readiness gate"), "{stderr}");
    assert!(stderr.contains(&format!("{GATED_NAMESPACE}/gated")), "the gated pod is not named:\n{stderr}");
    assert!(!stderr.contains(&format!("{GATED_NAMESPACE}/plain")), "a pod without the gate is named:\n{stderr}");
    assert!(stderr.contains("--gated-pods release"), "the way out is not named:\n{stderr}");
    let kept = links.get("kept").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_none(), "a refused uninstall deleted a link");

    // Told to release such pods, it uninstalls and then marks the gated pod's condition True.
    let out = uninstall(&kubeconfig, 30, &["--gated-pods", "release"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "uninstall --gated-pods release failed; stderr:\n{stderr}");
    assert!(links.get_opt("kept").await.unwrap().is_none(), "the link outlived the uninstall");
    assert_eq!(gate_reason(&pods, "gated").await, Some(("True".to_owned(), Some("Uninstalled".to_owned()))));
    assert_eq!(gate_reason(&pods, "plain").await, None, "a pod without the gate was written to");
}
