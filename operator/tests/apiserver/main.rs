//! The NetworkLink CRD against a real kube-apiserver (no mock): the CRD installs, every invalid manifest in the
//! table is rejected with the offending field named, valid ones round-trip unchanged, and the Rust side agrees
//! with the server on each (what the server admits resolves; what it refuses, Rust refuses too).
//!
//! Needs a control plane and its kubeconfig, so it is ignored by default:
//! ```sh
//! export ISTHMUS_CLUSTER_NAME=operator-it
//! e2e/cluster/cluster up --control-plane-only
//! KUBECONFIG=$(e2e/cluster/cluster kubeconfig) cargo test -p isthmus-operator --test apiserver -- --ignored
//! e2e/cluster/cluster down
//! ```

mod cases;
mod hold_webhook;
mod metrics_token;
mod representable;
mod schema_values;
mod schema_walk;
mod status_bounds;
mod topology_webhook;

use std::time::Duration;

use isthmus_operator::api::{NetworkLink, NetworkLinkSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource};
use serde_json::{Value, json};

use cases::{base, invalid_cases, kept_out_cases, valid_cases};

const MANAGER: &str = "isthmus-operator-it";

fn merge(base: &Value, patch: &Value) -> Value {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            let mut out = b.clone();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge(b.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (_, p) => p.clone(),
    }
}

/// Whether the operator acts on `spec` as the controller resolves a link (impairments, selectors, schedule),
/// with every trace it names present and valid; the reason when it does not.
fn operator_resolves(spec: &Value) -> Result<(), String> {
    let spec: NetworkLinkSpec = serde_json::from_value(spec.clone()).map_err(|e| e.to_string())?;
    let link = NetworkLink::new("resolved", spec);
    let traces: std::collections::BTreeMap<String, String> = link
        .spec
        .schedule
        .as_ref()
        .and_then(|s| s.trace.as_ref())
        .into_iter()
        .flat_map(|t| [&t.uplink, &t.downlink])
        .flatten()
        .map(|key| (key.clone(), "10\n20\n".to_owned()))
        .collect();
    let (_, info) = isthmus_operator::index::LinkInfo::from_link_reading(&link, Some(&traces));
    info.compiled.map(|_| ()).map_err(|e| e.to_string())
}

async fn client_and_namespace() -> (Client, String) {
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG) for a running kube-apiserver");
    install(&client, isthmus_operator::api::crd()).await;
    install(&client, isthmus_operator::topology::crd()).await;
    let ns = format!("nl-it-{}", std::process::id());
    create_namespace(&client, &ns).await;
    (client, ns)
}

/// Creates namespace `ns` unless it exists.
async fn create_namespace(client: &Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut obj = Namespace::default();
    obj.metadata.name = Some(ns.to_owned());
    match namespaces.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {ns}: {e}"),
    }
}

/// Installs `crd` and waits until it is served.
async fn install(client: &Client, crd: CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().expect("a CRD has a name");
    crds.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(crd)).await.unwrap_or_else(|e| {
        panic!("the generated CRD {name} installs (its CEL rules compile within the cost budget): {e}")
    });
    // The CRD is served once Established. Usually well under a second; the bound is for a loaded machine, and
    // running on without it would fail every test below with a confusing 404.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let crd = crds.get(&name).await.unwrap();
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} is not Established after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn manifest(ns: &str, name: &str, spec: &Value) -> DynamicObject {
    let ar = ApiResource::erase::<NetworkLink>(&());
    let mut obj = DynamicObject::new(name, &ar).within(ns);
    obj.data = json!({"spec": spec});
    obj
}

#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn invalid_manifests_are_rejected_naming_the_field() {
    let (client, ns) = client_and_namespace().await;
    let ar = ApiResource::erase::<NetworkLink>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let cases: Vec<_> = (invalid_cases().into_iter().map(|c| (c, true)))
        .chain(kept_out_cases().into_iter().map(|c| (c, false)))
        .collect();
    assert!(cases.len() >= 30);
    let mut failures = Vec::new();
    for (i, ((case, patch, field), operator_refuses)) in cases.iter().enumerate() {
        let spec = merge(&base(), patch);
        let name = format!("invalid-{i}");
        let params = PatchParams::apply(MANAGER).validation_strict();
        match api.patch(&name, &params, &Patch::Apply(manifest(&ns, &name, &spec))).await {
            Ok(_) => failures.push(format!("{case}: admitted {spec}")),
            Err(kube::Error::Api(status)) => {
                // Server-side apply answers a value of the wrong type with 500 "failed to create typed patch
                // object" (still naming the field); everything else is 422 Invalid or 400 (strict validation).
                let typed_patch = status.code == 500 && status.message.contains("failed to create typed patch object");
                if !(status.code == 422 || status.code == 400 || typed_patch) || !status.message.contains(field) {
                    failures.push(format!("{case}: expected {field} in: {} {}", status.code, status.message));
                }
            }
            Err(e) => failures.push(format!("{case}: {e}")),
        }
        // Whatever deserializes must be refused by the Rust side too.
        if *operator_refuses && *case != "unknown field" && operator_resolves(&spec).is_ok() {
            failures.push(format!("{case}: the server refuses it but the operator resolves it"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn valid_manifests_round_trip() {
    let (client, ns) = client_and_namespace().await;
    let api: Api<NetworkLink> = Api::namespaced(client, &ns);
    for (i, (case, patch)) in valid_cases().into_iter().enumerate() {
        let spec: NetworkLinkSpec =
            serde_json::from_value(merge(&base(), &patch)).unwrap_or_else(|e| panic!("{case}: {e}"));
        let name = format!("valid-{i}");
        let mut obj = NetworkLink::new(&name, spec.clone());
        obj.meta_mut().namespace = Some(ns.clone());
        let params = PatchParams::apply(MANAGER).validation_strict();
        api.patch(&name, &params, &Patch::Apply(&obj)).await.unwrap_or_else(|e| panic!("{case}: refused: {e}"));
        let back = api.get(&name).await.unwrap();
        assert_eq!(back.spec, spec, "{case}: changed in the round trip");
        operator_resolves(&serde_json::to_value(&back.spec).unwrap())
            .unwrap_or_else(|e| panic!("{case}: the server admits it but the operator refuses it: {e}"));
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
}

/// The status subresource keeps what the operator writes of a measurement: `status.measured` with both
/// directions, `measuredSummary` and the `Conformant` condition, unchanged through the CRD's schema.
#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn a_measured_status_round_trips() {
    let (client, ns) = client_and_namespace().await;
    let api: Api<NetworkLink> = Api::namespaced(client, &ns);
    let spec: NetworkLinkSpec = serde_json::from_value(merge(&base(), &json!({"symmetric": true}))).unwrap();
    let mut obj = NetworkLink::new("measured", spec);
    obj.meta_mut().namespace = Some(ns.clone());
    api.create(&PostParams::default(), &obj).await.unwrap();
    let direction = json!({
        "rttP50": "121.4ms", "rttP90": "125ms", "baselineP50": "812us", "expectedRtt": "120.8ms",
        "loss": "0.4%", "lossInterval": "0.1%–1.6%", "samples": 1200, "pairs": 4, "window": "30s",
        "lastSample": "2026-11-25T16:00:00Z", "probe": "IcmpEcho"
    });
    let status = json!({
        "measured": {"forward": direction, "reverse": merge(&direction, &json!({"probe": "TcpSyn"}))},
        "measuredSummary": "121ms 0.4%/121ms 0.4%",
        "conditions": [{
            "type": "Conformant", "status": "True", "reason": "Conformant", "message": "forward: …",
            "lastTransitionTime": "2026-11-25T16:00:00Z", "observedGeneration": 1
        }]
    });
    let body = json!({"apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink", "status": status});
    let params = PatchParams::apply(MANAGER).force().validation_strict();
    api.patch_status("measured", &params, &Patch::Apply(&body)).await.expect("the schema admits a measured status");
    let back = api.get_status("measured").await.unwrap().status.expect("a status");
    let want: isthmus_operator::api::NetworkLinkStatus = serde_json::from_value(status).unwrap();
    assert_eq!(back.measured, want.measured);
    assert_eq!(back.measured_summary.as_deref(), Some("121ms 0.4%/121ms 0.4%"));
    assert_eq!(back.conditions, want.conditions);
    api.delete("measured", &DeleteParams::default()).await.unwrap();
}
