//! Objects the API server accepts but the operator's types cannot hold: every integer of the CRD carries its
//! Rust type's bounds, and a link stored before those bounds existed (out of range) is reported on itself while
//! every other link is reconciled, across an operator restart.

use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::crd::CustomResourceExt;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::cluster::*;

fn manifest(name: &str, impairment: Value, priority: Option<i64>) -> Value {
    let mut spec = json!({
        "from": {"podSelector": {"matchLabels": {"app": "client"}}},
        "to": {"podSelector": {"matchLabels": {"app": "server"}}},
        "impairment": impairment,
    });
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({"apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink", "metadata": {"name": name}, "spec": spec})
}

/// The CRD as an older release installed it: `spec.priority` without bounds.
async fn install_unbounded_crd(client: &kube::Client) {
    let mut crd = serde_json::to_value(NetworkLink::crd()).unwrap();
    let priority =
        &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["priority"];
    let fields = priority.as_object_mut().expect("spec.priority in the schema");
    assert!(fields.remove("maximum").is_some() && fields.remove("minimum").is_some(), "{priority}");
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.patch("networklinks.isthmus.dev", &PatchParams::apply("isthmus-operator-it").force(), &Patch::Apply(&crd))
        .await
        .unwrap();
}

fn condition_of(object: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let c = object.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?;
    Some((c["status"].as_str()?.into(), c["reason"].as_str()?.into(), c["message"].as_str()?.into()))
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn every_integer_is_bounded_and_an_unreadable_link_stops_no_other() {
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-unreadable-{}", std::process::id());
    namespace(&client, &ns).await;
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<NetworkLink>(&()));
    let dry_run = PostParams { dry_run: true, ..Default::default() };
    let create = |m: Value| {
        let raw = raw.clone();
        let params = dry_run.clone();
        async move { raw.create(&params, &serde_json::from_value(m).unwrap()).await }
    };

    // At each bound accepted, one beyond refused naming the field.
    let latency = json!({"latency": "10ms"});
    // (field, a manifest at its bound, one beyond it)
    let at_and_beyond = |impairment: &dyn Fn(u64) -> Value, at: u64| {
        (manifest("at-bound", impairment(at), None), manifest("beyond", impairment(at + 1), None))
    };
    let queue = at_and_beyond(
        &|n| json!({"latency": "10ms", "queueLimit": n}),
        u64::from(isthmus_agent_api::MAX_QUEUE_LIMIT_PACKETS),
    );
    let gap = at_and_beyond(&|n| json!({"latency": "10ms", "reorder": {"percent": "1%", "gap": n}}), u32::MAX as u64);
    let cases = [
        (
            "spec.priority",
            manifest("at-bound", latency.clone(), Some(i32::MAX.into())),
            manifest("beyond", latency.clone(), Some(i64::from(i32::MAX) + 1)),
        ),
        (
            "spec.priority",
            manifest("at-bound", latency.clone(), Some(i32::MIN.into())),
            manifest("beyond", latency.clone(), Some(i64::from(i32::MIN) - 1)),
        ),
        ("spec.impairment.queueLimit", queue.0, queue.1),
        ("spec.impairment.reorder.gap", gap.0, gap.1),
    ];
    for (field, at, beyond) in cases {
        create(at).await.unwrap_or_else(|e| panic!("{field} at its bound: {e}"));
        let refused = create(beyond).await.unwrap_err().to_string();
        assert!(refused.contains(field), "{field} beyond its bound: {refused}");
    }

    // A link stored before the bounds: accepted by the older schema, kept by the newer one.
    install_unbounded_crd(&client).await;
    let bad = manifest("bad", latency.clone(), Some(1 << 40));
    eventually("the unbounded schema in force", || async {
        raw.create(&dry_run, &serde_json::from_value(bad.clone()).unwrap()).await.ok()
    })
    .await;
    raw.create(&PostParams::default(), &serde_json::from_value(bad).unwrap()).await.unwrap();
    install_crd(&client).await;

    for (round, good) in [("first start", "good-1"), ("after a restart", "good-2")] {
        let (_leader_tx, leader_rx) = watch::channel(true);
        let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
        raw.create(&PostParams::default(), &serde_json::from_value(manifest(good, latency.clone(), None)).unwrap())
            .await
            .unwrap();
        eventually(&format!("{round}: the valid link is reconciled"), || async {
            let l = raw.get(good).await.ok()?;
            (condition_of(&l, "Ready")?.1 == "NoPairs").then_some(())
        })
        .await;
        let (status, reason, message) = eventually(&format!("{round}: the unreadable link says why"), || async {
            condition_of(&raw.get("bad").await.ok()?, "Degraded")
        })
        .await;
        assert_eq!((status.as_str(), reason.as_str()), ("True", "InvalidSpec"), "{message}");
        assert!(message.contains("spec.priority") && message.contains("1099511627776"), "{message}");
        let events = eventually("an event on the unreadable link", || async {
            let reasons = event_reasons(&client, &ns, "bad").await;
            reasons.iter().any(|r| r == "InvalidSpec").then_some(reasons)
        })
        .await;
        assert!(events.contains(&"InvalidSpec".to_owned()), "{events:?}");
        running.stop().await;
    }

    // Deleting it goes through the cleanup like any link; the others go too, leaving nothing for other tests.
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
    for name in ["bad", "good-1", "good-2"] {
        raw.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("every link deleted", || async {
        raw.list(&Default::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    running.stop().await;
}
