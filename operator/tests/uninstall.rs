//! `isthmus-operator uninstall` (the chart's pre-delete hook) against a real kube-apiserver: while the cleanup
//! finalizer stays on the links it deletes them, times out and names them; once the finalizers are gone it
//! succeeds and no NetworkLink is left, including one created in between.
//!
//! Runs only when `ISTHMUS_TEST_KUBECONFIG` names a control plane's kubeconfig (`make operator-it` starts one);
//! without it the test says so and passes. It deletes every NetworkLink in the cluster.

use std::process::Output;
use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::controller::finalizer::FINALIZER;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::json;

const NAMESPACE: &str = "isthmus-uninstall-it";

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

async fn fresh_namespace(client: &Client) {
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(NAMESPACE, &DeleteParams::default()).await;
    eventually("old namespace gone", || async { api.get_opt(NAMESPACE).await.ok()?.is_none().then_some(()) }).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
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
async fn uninstall(kubeconfig: &str, timeout_seconds: u64) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_isthmus-operator"));
    command.args(["uninstall", "--timeout-seconds", &timeout_seconds.to_string()]).env("KUBECONFIG", kubeconfig);
    tokio::task::spawn_blocking(move || command.output().expect("isthmus-operator runs")).await.unwrap()
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn uninstall_fails_naming_links_kept_by_finalizer_then_succeeds_once_they_are_gone() {
    let (client, kubeconfig) =
        client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    install_crd(&client).await;
    fresh_namespace(&client).await;
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), NAMESPACE);
    let all: Api<NetworkLink> = Api::all(client.clone());
    for name in ["held-1", "held-2"] {
        create_link(&links, name, &[FINALIZER]).await;
    }

    // No operator runs, so nothing removes the finalizers: the command must give up and name both links.
    let out = uninstall(&kubeconfig, 3).await;
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
    let out = uninstall(&kubeconfig, 30).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "uninstall failed although no finalizer remained; stderr:\n{stderr}");
    let left = all.list(&ListParams::default()).await.unwrap();
    assert!(
        left.items.is_empty(),
        "NetworkLinks left: {:?}",
        left.items.iter().map(|l| &l.metadata.name).collect::<Vec<_>>()
    );

    let _ = Api::<Namespace>::all(client).delete(NAMESPACE, &DeleteParams::default()).await;
}
