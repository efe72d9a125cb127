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

mod representable;
mod schema_values;
mod status_bounds;

use std::time::Duration;

use isthmus_operator::api::{NetworkLink, NetworkLinkSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, Resource};
use serde_json::{Value, json};

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

fn base() -> Value {
    json!({
        "from": {"podSelector": {"matchLabels": {"app": "client"}}},
        "to": {"podSelector": {"matchLabels": {"app": "api"}}},
        "impairment": {"latency": "10ms"},
    })
}

/// (case, patch to the valid base spec, field the server must name).
fn invalid_cases() -> Vec<(&'static str, Value, &'static str)> {
    let imp = |v: Value| json!({"impairment": v});
    vec![
        ("latency without unit", imp(json!({"latency": "10"})), "spec.impairment.latency"),
        ("latency with a space", imp(json!({"latency": "10 ms"})), "spec.impairment.latency"),
        ("latency in minutes", imp(json!({"latency": "1m"})), "spec.impairment.latency"),
        ("latency over an hour", imp(json!({"latency": "3601s"})), "spec.impairment.latency"),
        ("negative latency", imp(json!({"latency": "-5ms"})), "spec.impairment.latency"),
        ("latency as a number", imp(json!({"latency": 10})), "spec.impairment.latency"),
        ("jitter without latency", json!({"impairment": {"latency": null, "jitter": "5ms"}}), "spec.impairment.jitter"),
        ("jitter with zero latency", imp(json!({"latency": "0", "jitter": "5ms"})), "spec.impairment.jitter"),
        ("jitter correlation alone", imp(json!({"jitterCorrelation": "25%"})), "spec.impairment.jitterCorrelation"),
        ("loss without %", imp(json!({"loss": {"percent": "0.1"}})), "spec.impairment.loss.percent"),
        ("loss over 100%", imp(json!({"loss": {"percent": "101%"}})), "spec.impairment.loss.percent"),
        ("empty loss", imp(json!({"loss": {}})), "spec.impairment.loss"),
        (
            "random and bursty loss",
            imp(json!({"loss": {"percent": "1%", "gilbertElliott": {"p": "1%", "r": "10%"}}})),
            "spec.impairment.loss",
        ),
        (
            "correlation with bursty loss",
            imp(json!({"loss": {"correlation": "5%", "gilbertElliott": {"p": "1%", "r": "10%"}}})),
            "spec.impairment.loss.correlation",
        ),
        (
            "bursty loss without r",
            imp(json!({"loss": {"gilbertElliott": {"p": "1%"}}})),
            "spec.impairment.loss.gilbertElliott.r",
        ),
        ("duplicate without percent", imp(json!({"duplicate": {}})), "spec.impairment.duplicate.percent"),
        (
            "corrupt percent not a number",
            imp(json!({"corrupt": {"percent": "abc%"}})),
            "spec.impairment.corrupt.percent",
        ),
        (
            "reorder without latency",
            json!({"impairment": {"latency": null, "reorder": {"percent": "5%"}}}),
            "spec.impairment.reorder",
        ),
        ("reorder gap with 0%", imp(json!({"reorder": {"percent": "0%", "gap": 5}})), "spec.impairment.reorder.gap"),
        ("reorder gap 0", imp(json!({"reorder": {"percent": "5%", "gap": 0}})), "spec.impairment.reorder.gap"),
        ("bandwidth in mbps", imp(json!({"bandwidth": "100mbps"})), "spec.impairment.bandwidth"),
        ("bandwidth in MBps", imp(json!({"bandwidth": "100MBps"})), "spec.impairment.bandwidth"),
        ("bandwidth below 8bit", imp(json!({"bandwidth": "4bit"})), "spec.impairment.bandwidth"),
        // The default bucket (3,200 bytes) would take 3,200 s to refill at 8 bit/s; the kernel's holds 274 s.
        ("bandwidth below 100bit", imp(json!({"bandwidth": "8bit"})), "spec.impairment.bandwidth"),
        (
            "burst too deep for the bandwidth",
            imp(json!({"bandwidth": "1kbit", "burst": "34251B"})),
            "spec.impairment.burst",
        ),
        (
            "burst too deep for the profile's uplink",
            json!({"profile": "edge", "impairment": {"burst": "8MiB"}}),
            "spec.impairment.burst",
        ),
        (
            "reverse burst too deep for the profile's downlink",
            json!({"profile": "edge", "reverse": {"burst": "8MiB"}}),
            "spec.reverse.burst",
        ),
        ("jitter wider than netem's", imp(json!({"jitter": "2.2s"})), "spec.impairment.jitter"),
        ("bandwidth above 1000Gbit", imp(json!({"bandwidth": "2000Gbit"})), "spec.impairment.bandwidth"),
        ("bandwidth without unit", imp(json!({"bandwidth": "100"})), "spec.impairment.bandwidth"),
        ("burst without bandwidth", imp(json!({"burst": "32KiB"})), "spec.impairment.burst"),
        ("burst below a packet", imp(json!({"bandwidth": "1Mbit", "burst": "1KiB"})), "spec.impairment.burst"),
        ("burst in ambiguous KB", imp(json!({"bandwidth": "1Mbit", "burst": "32KB"})), "spec.impairment.burst"),
        ("queue limit 0", imp(json!({"queueLimit": 0})), "spec.impairment.queueLimit"),
        ("queue limit negative", imp(json!({"queueLimit": -1})), "spec.impairment.queueLimit"),
        ("neither impairment nor profile", json!({"impairment": null}), "spec.impairment"),
        ("reverse and symmetric", json!({"reverse": {"latency": "5ms"}, "symmetric": true}), "spec.symmetric"),
        ("profile and symmetric", json!({"profile": "lte", "symmetric": true}), "spec.symmetric"),
        ("oneWay and reverse", json!({"oneWay": true, "reverse": {"latency": "5ms"}}), "spec.oneWay"),
        (
            "symmetric across namespaces",
            json!({"symmetric": true, "to": {"namespaceSelector": {}}}),
            "spec.to.namespaceSelector",
        ),
        (
            "profile across namespaces",
            json!({"profile": "dsl", "to": {"namespaceSelector": {}}}),
            "spec.to.namespaceSelector",
        ),
        (
            "reverse towards CIDRs only",
            json!({"symmetric": true, "to": {"podSelector": null, "cidrs": ["10.0.0.0/8"]}}),
            "spec.to.podSelector",
        ),
        ("empty to", json!({"to": {"podSelector": null}}), "spec.to"),
        (
            "namespaceSelector without podSelector",
            json!({"to": {"podSelector": null, "namespaceSelector": {}, "cidrs": ["10.0.0.0/8"]}}),
            "spec.to.namespaceSelector",
        ),
        ("CIDR with host bits", json!({"to": {"cidrs": ["10.0.0.1/8"]}}), "spec.to.cidrs[0]"),
        ("CIDR not a CIDR", json!({"to": {"cidrs": ["10.0.0.0"]}}), "spec.to.cidrs[0]"),
        ("unknown profile", json!({"profile": "5g"}), "spec.profile"),
        ("unknown services mode", json!({"to": {"services": "All"}}), "spec.to.services"),
        ("priority as text", json!({"priority": "high"}), "spec.priority"),
        ("verify as text", json!({"verify": "no"}), "spec.verify"),
        ("reverse jitter without latency", json!({"reverse": {"jitter": "5ms"}}), "spec.reverse.jitter"),
        ("reverse bandwidth in Mbps", json!({"reverse": {"bandwidth": "10Mbps"}}), "spec.reverse.bandwidth"),
        ("unknown field", imp(json!({"delay": "10ms"})), "spec.impairment.delay"),
        ("missing from", json!({"from": null}), "spec.from"),
        (
            "unknown selector operator",
            from_expression(json!({"key": "app", "operator": "Has"})),
            "matchExpressions[0].operator",
        ),
        (
            "In without values",
            from_expression(json!({"key": "app", "operator": "In"})),
            "spec.from.podSelector.matchExpressions[0]",
        ),
        ("only an empty list of CIDRs", json!({"to": {"podSelector": null, "cidrs": []}}), "spec.to"),
        ("a phase under 1ms", schedule(json!({"phases": [{"duration": "999us"}]})), "spec.schedule.phases[0].duration"),
        ("a flap that is never up", schedule(json!({"flap": {"up": "0", "down": "1s"}})), "spec.schedule.flap.up"),
        (
            "a trace window under 10ms",
            schedule(json!({"trace": {"configMap": "t", "uplink": "u", "window": "5ms"}})),
            "spec.schedule.trace.window",
        ),
        (
            "a downlink trace on a one-way link",
            schedule(json!({"trace": {"configMap": "t", "downlink": "d"}})),
            "spec.schedule.trace.downlink",
        ),
        (
            "a reverse ramp on a one-way link",
            schedule(
                json!({"ramp": {"field": "Latency", "from": "0", "to": "9ms", "step": "1ms", "over": "9s", "direction": "Reverse"}}),
            ),
            "spec.schedule.ramp.direction",
        ),
        (
            "a phase's reverse on a one-way link",
            schedule(json!({"phases": [{"duration": "1s", "reverse": {"latency": "1ms"}}]})),
            "spec.schedule.phases",
        ),
        (
            "a phase's reverse on a symmetric link",
            merge(
                &schedule(json!({"phases": [{"duration": "1s", "reverse": {"latency": "1ms"}}]})),
                &json!({"symmetric": true}),
            ),
            "spec.schedule.phases",
        ),
    ]
}

/// (case, patch to the valid base spec, field the server must name): selectors the API keeps out as it does
/// those of built-in objects (past their bounds, values where none belong), though the operator could evaluate
/// them.
fn kept_out_cases() -> Vec<(&'static str, Value, &'static str)> {
    let labels = |n: usize, key: &str, value: &str| {
        let m: serde_json::Map<String, Value> = (0..n).map(|i| (format!("{key}{i}"), json!(value))).collect();
        json!({"from": {"podSelector": {"matchLabels": m}}})
    };
    vec![
        (
            "Exists with values",
            from_expression(json!({"key": "app", "operator": "Exists", "values": ["a"]})),
            "spec.from.podSelector.matchExpressions[0]",
        ),
        ("65 labels", labels(65, "k", "v"), "spec.from.podSelector.matchLabels"),
        ("a label key of 318 characters", labels(1, &"k".repeat(317), "v"), "spec.from.podSelector.matchLabels"),
        ("a label value of 64 characters", labels(1, "k", &"v".repeat(64)), "spec.from.podSelector.matchLabels"),
        (
            "65 values",
            from_expression(
                json!({"key": "app", "operator": "In", "values": (0..65).map(|i| i.to_string()).collect::<Vec<_>>()}),
            ),
            "spec.from.podSelector.matchExpressions[0].values",
        ),
    ]
}

fn from_expression(requirement: Value) -> Value {
    json!({"from": {"podSelector": {"matchLabels": null, "matchExpressions": [requirement]}}})
}

fn schedule(schedule: Value) -> Value {
    json!({"schedule": schedule})
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

fn valid_cases() -> Vec<(&'static str, Value)> {
    vec![
        ("base", json!({})),
        ("zero latency", json!({"impairment": {"latency": "0"}})),
        (
            "every field",
            json!({
                "profile": "lte",
                "priority": 7,
                "impairment": {
                    "latency": "80ms", "jitter": "1.5ms", "jitterCorrelation": "25%",
                    "loss": {"gilbertElliott": {"p": "1%", "r": "20%", "lossInBad": "90%", "lossInGood": "0.1%"}},
                    "duplicate": {"percent": "0.5%", "correlation": "10%"},
                    "corrupt": {"percent": "0.01%"},
                    "reorder": {"percent": "5%", "correlation": "50%", "gap": 3},
                    "bandwidth": "1.5Gbit", "burst": "4095MiB", "queueLimit": 10000
                },
                "reverse": {"latency": "500us", "loss": {"percent": "100%", "correlation": "0%"}, "bandwidth": "64kbit"},
                "to": {"cidrs": ["203.0.113.0/24", "2001:db8::/32"], "services": "Ignore"}
            }),
        ),
        ("symmetric", json!({"symmetric": true, "impairment": {"latency": "3600s", "jitter": "1s"}})),
        (
            "one-way profile across namespaces",
            json!({"profile": "geo-satellite", "oneWay": true, "impairment": null, "to": {"namespaceSelector": {"matchLabels": {"env": "prod"}}}}),
        ),
        ("bandwidth bounds", json!({"impairment": {"bandwidth": "100bit"}, "reverse": {"bandwidth": "1000Gbit"}})),
        ("the deepest burst", json!({"impairment": {"bandwidth": "1kbit", "burst": "34250B"}})),
        ("a burst the profile's uplink sends in time", json!({"profile": "edge", "impairment": {"burst": "6MiB"}})),
        ("the widest jitter", json!({"impairment": {"latency": "3s", "jitter": "2.147483647s"}})),
        ("verification off", json!({"verify": false})),
        ("verification on, said explicitly", json!({"verify": true})),
    ]
}

async fn client_and_namespace() -> (Client, String) {
    let client = Client::try_default().await.expect("a kubeconfig (KUBECONFIG) for a running kube-apiserver");
    install(&client, isthmus_operator::api::crd()).await;
    install(&client, isthmus_operator::topology::crd()).await;
    let ns = format!("nl-it-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut obj = Namespace::default();
    obj.metadata.name = Some(ns.clone());
    match namespaces.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating namespace {ns}: {e}"),
    }
    (client, ns)
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
        back.spec.resolve().unwrap_or_else(|e| panic!("{case}: the server admits it but Rust refuses: {e}"));
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
