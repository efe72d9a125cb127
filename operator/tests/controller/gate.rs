//! The readiness gate against a real API server and a real agent: the operator's server-side apply of its one
//! condition on `pods/status` lands next to the kubelet's conditions, holds a pod whose entry failed NotReady,
//! makes a pod no link selects ready, decides a pending pod once it has an IP (planned before it runs), leaves
//! ungated pods alone, writes nothing more once the conditions stand, decides a replaced pod anew, and releases a
//! pod whose link is deleted.

use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::gate::CONDITION_TYPE;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};

use super::cluster::*;

/// The gate condition a pod carries: (status, reason, message).
fn gate(pod: &Pod) -> Option<(String, String, String)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == CONDITION_TYPE)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// Ready as the kubelet computes it (there is none here): the containers ready and every readiness gate True.
fn kubelet_ready(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let is_true = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
    let gates = pod.spec.as_ref().and_then(|s| s.readiness_gates.clone()).unwrap_or_default();
    is_true("ContainersReady") && gates.iter().all(|g| is_true(&g.condition_type))
}

/// The pod once it carries the gate condition.
async fn decided(pods: &Api<Pod>, name: &str, what: &str) -> Pod {
    eventually(what, || async {
        let p = pods.get(name).await.ok()?;
        gate(&p).is_some().then_some(p)
    })
    .await
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn the_gate_condition_lands_on_the_pod_and_holds_it_not_ready() {
    let t = WithAgent::start("gate").await;
    let (client, ns, node) = (&t.client, &t.ns, &t.node);
    // The agent sees no network namespace: it answers every pod it is sent with PodNotFound.
    gated_pod(client, ns, "client-0", "client", node, "198.51.100.50").await;
    gated_pod(client, ns, "loner", "db", node, "198.51.100.51").await;
    running_pod(client, ns, "plain", "client", node, "198.51.100.52").await;
    // Init containers run: one pod's sandbox has its IP, the other's not yet.
    pending_gated_pod(client, ns, "client-1", "client", node, Some("198.51.100.54")).await;
    pending_gated_pod(client, ns, "client-2", "client", node, None).await;
    running_pod(client, ns, "server-0", "server", node, "198.51.100.60").await;
    // The link exists before the controller starts: started first, a controller may decide the client's gate
    // (NoLinks) before it sees a link created after it (seen once under load in operator-it).
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);
    links.create(&PostParams::default(), &link("gated", "10ms")).await.unwrap();
    let running = t.controller();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // The agent failed the client's entry: False with its reason and message, so the pod stays NotReady.
    let client_0 = decided(&pods, "client-0", "the client's condition").await;
    let (status, reason, message) = gate(&client_0).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PodNotFound"));
    assert!(message.contains("198.51.100.50"), "the agent's message, naming the pod's IP: {message}");
    assert!(!kubelet_ready(&client_0), "a kubelet would hold the pod NotReady");
    // The pending pod with an IP was planned and its entry sent to the agent, which failed it as the running one's.
    let client_1 = decided(&pods, "client-1", "the pending client's condition").await;
    let (status, reason, message) = gate(&client_1).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "PodNotFound"), "{message}");
    assert!(message.contains("198.51.100.54"), "the agent's message, naming the pending pod's IP: {message}");
    // No link selects the loner: ready at once.
    let loner = decided(&pods, "loner", "the loner's condition").await;
    let (status, reason, _) = gate(&loner).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NoLinks"));
    assert!(kubelet_ready(&loner));

    // One condition merged by type next to the kubelet's, owned by the operator's field manager on `status`.
    let kinds: Vec<String> =
        client_0.status.clone().unwrap().conditions.unwrap().into_iter().map(|c| c.type_).collect();
    assert_eq!(kinds, ["ContainersReady", "Ready", CONDITION_TYPE]);
    let managers = client_0.metadata.managed_fields.clone().unwrap_or_default();
    assert!(
        managers.iter().any(|m| m.manager.as_deref() == Some("isthmus-operator")
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref() == Some("status")),
        "applied by isthmus-operator on status: {managers:?}"
    );
    // Ungated pods are never written.
    for name in ["plain", "server-0"] {
        assert_eq!(gate(&pods.get(name).await.unwrap()), None, "{name} declares no gate");
    }

    // The conditions stand: nothing is written again (the index knows what each pod carries).
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (name, before) in [("client-0", &client_0), ("client-1", &client_1), ("loner", &loner)] {
        let now = pods.get(name).await.unwrap();
        assert_eq!(now.metadata.resource_version, before.metadata.resource_version, "{name} was written again");
    }
    // A pod without an IP is not planned, so nothing is decided for it (pending is never written).
    assert_eq!(gate(&pods.get("client-2").await.unwrap()), None, "client-2 has no IP yet");

    // A pod replaced under the same name is decided anew: its own condition, on the new pod.
    pods.delete("loner", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    eventually("the old loner gone", || async { pods.get_opt("loner").await.ok()?.is_none().then_some(()) }).await;
    gated_pod(client, ns, "loner", "db", node, "198.51.100.53").await;
    let renewed = eventually("the new loner's condition", || async {
        let p = pods.get("loner").await.ok()?;
        (p.metadata.uid != loner.metadata.uid && gate(&p).is_some()).then_some(p)
    })
    .await;
    assert_eq!(gate(&renewed).map(|g| g.1), Some("NoLinks".into()));

    // The link goes: nothing selects the client any more, so nothing holds it back.
    links.delete("gated", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("gated").await.ok()?.is_none().then_some(()) }).await;
    let freed = eventually("the client released", || async {
        let p = pods.get("client-0").await.ok()?;
        (gate(&p)?.0 == "True").then_some(p)
    })
    .await;
    assert_eq!(gate(&freed).map(|g| g.1), Some("NoLinks".into()));
    assert!(kubelet_ready(&freed));

    running.stop().await;
    t.finish().await;
}
