//! Every string and list of both CRDs has a bound, and the statuses the operator writes keep to them: the bounds
//! are read from the CRDs' own schemas, so a field added without one fails here.
//!
//! - every string and list in either CRD has a bound (spec and status);
//! - whatever the operator's status holds, `bound()` cuts it to what the schema admits (property test), and
//!   leaves a status already within the bounds as it is;
//! - the fullest status the schema admits (every string at its bound in 4-byte characters, every list full) is far
//!   below the API server's object size limit;
//! - a real API server admits that status, and refuses it with any one string or list one longer, naming the
//!   field (ignored by default: see the module documentation of `main.rs`).

use std::collections::BTreeMap;

use isthmus_operator::api::bounds::{MAX_MESSAGE, MAX_SUMMARY};
use isthmus_operator::api::{NetworkLinkStatus, OverlapStatus, PodFailure};
use isthmus_operator::topology::NetworkTopologyStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::schema_walk::{Place, each_schema, each_value};

/// The API server's limit on a request's body, and so on an object (etcd's own is about the same).
const OBJECT_SIZE_LIMIT: usize = 3 * 1024 * 1024 / 2;

fn status_schema(crd: &impl serde::Serialize) -> Value {
    let crd = serde_json::to_value(crd).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].clone()
}

fn link_schema() -> Value {
    status_schema(&isthmus_operator::api::crd())
}

fn topology_schema() -> Value {
    status_schema(&isthmus_operator::topology::crd())
}

/// Paths of the strings, lists and maps in `schema` that have no bound.
fn unbounded(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    each_schema(schema, "", &mut |schema, path| {
        let has = |k: &str| schema.get(k).is_some();
        let unbounded = match schema.get("type").and_then(Value::as_str) {
            // A date-time has one length; an enum has its values.
            Some("string") => !(has("maxLength") || has("enum") || schema["format"] == "date-time"),
            Some("array") => !has("maxItems"),
            _ => false,
        };
        if unbounded {
            out.push(path.into());
        }
        if schema.get("additionalProperties").is_some_and(Value::is_object) && !has("maxProperties") {
            out.push(format!("{path}{{}}"));
        }
    });
    out
}

#[test]
fn every_string_and_list_in_the_crds_has_a_bound() {
    for (name, crd) in [
        ("NetworkLink", serde_json::to_value(isthmus_operator::api::crd()).unwrap()),
        ("NetworkTopology", serde_json::to_value(isthmus_operator::topology::crd()).unwrap()),
    ] {
        let out = unbounded(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
        assert!(out.is_empty(), "{name}: unbounded: {out:#?}");
    }
}

/// Where `value` breaks a bound of `schema` (length, items, enum) or holds a field the schema lacks.
fn violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    each_value(schema, value, &Place::root("status"), &mut |schema, value, Place { path, .. }| {
        if schema.is_null() {
            return out.push(format!("{path}: not in the schema"));
        }
        if let Some(choices) = schema.get("enum").and_then(Value::as_array)
            && !choices.contains(value)
        {
            out.push(format!("{path}: {value} not one of {choices:?}"));
        }
        let max = |k: &str| schema.get(k).and_then(Value::as_u64).map(|m| m as usize);
        match value {
            Value::String(s) if max("maxLength").is_some_and(|m| s.chars().count() > m) => {
                out.push(format!("{path}: {} characters", s.chars().count()))
            }
            Value::Array(items) if max("maxItems").is_some_and(|m| items.len() > m) => {
                out.push(format!("{path}: {} items", items.len()))
            }
            _ => {}
        }
    });
    out
}

/// The fullest value `schema` admits: strings at their bound in `fill`, lists full, every property set,
/// numbers at their maximum (or 1).
fn fullest(schema: &Value, fill: char) -> Value {
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    let max = |k: &str| schema.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    match schema.get("type").and_then(Value::as_str) {
        Some("string") if schema["format"] == "date-time" => json!("2026-12-05T00:00:00Z"),
        Some("string") => Value::String(fill.to_string().repeat(max("maxLength"))),
        // The schema writes a maximum as a float (`4294967295.0`).
        Some("integer") => json!(schema.get("maximum").and_then(Value::as_f64).map_or(1, |m| m as u64)),
        Some("number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => Value::Array(vec![fullest(&schema["items"], fill); max("maxItems")]),
        Some("object") => Value::Object(
            schema
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(name, s)| (name.clone(), fullest(s, fill)))
                .collect(),
        ),
        other => panic!("a structural schema gives every field a type; got {other:?}"),
    }
}

fn text(most: usize) -> impl Strategy<Value = String> {
    // Mostly short, now and then far past any bound; characters of one to four bytes.
    let len = prop_oneof![3 => 0..40usize, 1 => 0..most];
    (len, prop::sample::select(vec!['a', 'é', '…', '𝄞'])).prop_map(|(n, c)| c.to_string().repeat(n))
}

fn condition() -> impl Strategy<Value = Condition> {
    (text(200), prop::sample::select(vec!["True", "False"]), text(200), text(5000)).prop_map(|(t, s, r, m)| Condition {
        type_: t,
        status: s.into(),
        reason: r,
        message: m,
        observed_generation: Some(1),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    })
}

fn link_status() -> impl Strategy<Value = NetworkLinkStatus> {
    let failure = (text(1000), prop::option::of(text(1000)), text(200), text(5000))
        .prop_map(|(pod, node, reason, message)| PodFailure { pod, node, reason, message });
    let overlap = text(1000).prop_map(|link| OverlapStatus { link, won: 1, lost: 2 });
    (
        prop::collection::vec(condition(), 0..20),
        prop::collection::vec(prop::option::of(text(1000)), 7),
        prop::collection::vec(overlap, 0..40),
        prop::collection::vec(failure, 0..40),
        any::<u32>(),
    )
        .prop_map(|(conditions, summaries, overlaps, failures, failures_omitted)| {
            let [from, to, latency, loss, bandwidth, expected_round_trip, measured_summary] =
                <[Option<String>; 7]>::try_from(summaries).unwrap();
            NetworkLinkStatus {
                conditions,
                from,
                to,
                latency,
                loss,
                bandwidth,
                expected_round_trip,
                measured_summary,
                overlaps,
                failures,
                failures_omitted,
                ..Default::default()
            }
        })
}

fn topology_status() -> impl Strategy<Value = NetworkTopologyStatus> {
    let cells = || prop::collection::vec(text(100), 0..40);
    let row = (text(200), cells(), cells())
        .prop_map(|(from, configured, measured)| json!({"from": from, "configured": configured, "measured": measured}));
    let region = text(200).prop_map(|name| json!({"name": name, "pods": 3}));
    (
        prop::collection::vec(condition(), 0..20),
        prop::option::of(text(1000)),
        prop::collection::vec(region, 0..40),
        prop::collection::vec(row, 0..40),
    )
        .prop_map(|(conditions, summary, regions, matrix)| NetworkTopologyStatus {
            conditions,
            summary,
            regions: serde_json::from_value(Value::Array(regions)).unwrap(),
            matrix: serde_json::from_value(Value::Array(matrix)).unwrap(),
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_cut_link_status_fits_its_schema(mut status in link_status()) {
        let failures = status.failures.len() as u64 + u64::from(status.failures_omitted);
        status.bound();
        let out = violations(&link_schema(), &serde_json::to_value(&status).unwrap());
        prop_assert!(out.is_empty(), "{out:#?}");
        // Failures cut from the list are still counted.
        let counted = status.failures.len() as u64 + u64::from(status.failures_omitted);
        prop_assert!(counted == failures || status.failures_omitted == u32::MAX);
        let again = { let mut s = status.clone(); s.bound(); s };
        prop_assert_eq!(again, status);
    }

    #[test]
    fn a_cut_topology_status_fits_its_schema(mut status in topology_status()) {
        status.bound();
        let out = violations(&topology_schema(), &serde_json::to_value(&status).unwrap());
        prop_assert!(out.is_empty(), "{out:#?}");
        let again = { let mut s = status.clone(); s.bound(); s };
        prop_assert_eq!(again, status);
    }
}

/// The fullest status admitted is one the operator can hold and would write unchanged (its cuts are exactly
/// the schema's bounds), and it is far below the object size limit.
#[test]
fn the_fullest_status_is_kept_whole_and_far_below_the_size_limit() {
    let link = fullest(&link_schema(), '𝄞');
    let mut status: NetworkLinkStatus = serde_json::from_value(link.clone()).unwrap();
    assert_eq!(serde_json::to_value(&status).unwrap(), link, "the fullest link status survives the Rust type");
    status.bound();
    assert_eq!(serde_json::to_value(&status).unwrap(), link, "bound() cut a status the schema admits");
    assert_eq!(status.conditions[0].message.chars().count(), MAX_MESSAGE);
    assert_eq!(status.from.as_ref().unwrap().chars().count(), MAX_SUMMARY);

    let topology = fullest(&topology_schema(), '𝄞');
    let mut t: NetworkTopologyStatus = serde_json::from_value(topology.clone()).unwrap();
    assert_eq!(serde_json::to_value(&t).unwrap(), topology, "the fullest topology status survives the Rust type");
    t.bound();
    assert_eq!(serde_json::to_value(&t).unwrap(), topology, "bound() cut a status the schema admits");

    let sizes: BTreeMap<&str, usize> =
        [("NetworkLink", link.to_string().len()), ("NetworkTopology", topology.to_string().len())].into();
    println!("the fullest statuses, in bytes of JSON: {sizes:?}");
    for (kind, size) in sizes {
        assert!(
            size < OBJECT_SIZE_LIMIT / 3,
            "{kind}: {size} bytes, a third of the limit is {}",
            OBJECT_SIZE_LIMIT / 3
        );
    }
}

/// The places of every string and list in `value` with a bound in `schema`, the first item standing for every
/// item of a list.
fn bounded_places(schema: &Value, value: &Value) -> Vec<Place> {
    let mut out = Vec::new();
    each_value(schema, value, &Place::root("status"), &mut |schema, value, place| {
        let bound = match value {
            Value::String(_) => "maxLength",
            Value::Array(_) => "maxItems",
            _ => return,
        };
        if schema.get(bound).is_some() && place.is_first_item() {
            out.push(place.clone());
        }
    });
    out
}

/// `value` with the string or list at `pointer` one longer.
fn one_longer(value: &Value, pointer: &str) -> Value {
    let mut v = value.clone();
    match v.pointer_mut(pointer).unwrap() {
        Value::String(s) => s.push('é'),
        Value::Array(items) => items.push(items[0].clone()),
        other => panic!("{pointer} is {other}"),
    }
    v
}

async fn admits_the_fullest_and_refuses_one_longer(api: Api<DynamicObject>, name: &str, schema: Value) {
    let status = fullest(&schema, 'é');
    let params = PatchParams::default();
    let write = |status: Value| {
        let (api, params) = (api.clone(), params.clone());
        async move { api.patch_status(name, &params, &Patch::Merge(&json!({"status": status}))).await }
    };
    let back = write(status.clone()).await.unwrap_or_else(|e| panic!("the fullest status is refused: {e}"));
    assert_eq!(back.data["status"], status, "the server changed the fullest status");
    let places = bounded_places(&schema, &status);
    assert!(places.len() >= 8, "{places:?}");
    println!("{}: the fullest status admitted; {} bounds one longer each", api.resource_url(), places.len());
    let mut wrong = Vec::new();
    for Place { path, pointer } in &places {
        match write(one_longer(&status, pointer)).await {
            Ok(_) => wrong.push(format!("{path}: admitted one longer")),
            Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains(path.as_str()) => {}
            Err(e) => wrong.push(format!("{path}: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{} of {} bounds wrong:\n{}", wrong.len(), places.len(), wrong.join("\n"));
}

#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation of main.rs"]
async fn the_api_server_admits_the_fullest_status_and_refuses_one_longer() {
    let (client, ns) = super::client_and_namespace().await;
    let link_ar = ApiResource::erase::<isthmus_operator::api::NetworkLink>(&());
    let links: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &link_ar);
    let mut link = super::manifest(&ns, "bounds", &super::base());
    link.metadata.namespace = Some(ns.clone());
    links.create(&PostParams::default(), &link).await.unwrap();
    admits_the_fullest_and_refuses_one_longer(links.clone(), "bounds", link_schema()).await;
    links.delete("bounds", &DeleteParams::default()).await.unwrap();

    let topology_ar = ApiResource::erase::<isthmus_operator::topology::NetworkTopology>(&());
    let topologies: Api<DynamicObject> = Api::namespaced_with(client, &ns, &topology_ar);
    let mut topology = DynamicObject::new("bounds", &topology_ar).within(&ns);
    topology.data = json!({"spec": {"regionLabel": "region", "regions": [{"name": "eu"}]}});
    topologies.create(&PostParams::default(), &topology).await.unwrap();
    admits_the_fullest_and_refuses_one_longer(topologies.clone(), "bounds", topology_schema()).await;
    topologies.delete("bounds", &DeleteParams::default()).await.unwrap();
}
