use serde_json::{Value, json};

use super::*;

fn review(operation: &str, spec: Value) -> Vec<u8> {
    let object = json!({
        "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkTopology",
        "metadata": {"name": "world", "namespace": "lab"},
        "spec": spec,
    });
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0b1d", "operation": operation, "name": "world", "namespace": "lab",
            "kind": {"group": "isthmus.dev", "version": "v1alpha1", "kind": "NetworkTopology"},
            "resource": {"group": "isthmus.dev", "version": "v1alpha1", "resource": "networktopologies"},
            "userInfo": {"username": "tenant"}, "dryRun": false,
            "object": object,
            "oldObject": if operation == "UPDATE" { object.clone() } else { Value::Null },
        }
    });
    serde_json::to_vec(&body).unwrap()
}

fn response(body: &[u8]) -> Value {
    let (review, verdict) = answer(body);
    let response = serde_json::to_value(review).unwrap()["response"].clone();
    let expected = match (response["allowed"].as_bool(), response["uid"].as_str()) {
        (Some(true), _) => AdmissionOutcome::Admitted,
        (Some(false), Some("0b1d")) => AdmissionOutcome::Refused,
        _ => AdmissionOutcome::Unreadable,
    };
    assert_eq!(verdict, expected, "{response}");
    response
}

fn regions(default: Value) -> Value {
    json!({"regionLabel": "region", "regions": [{"name": "eu"}, {"name": "us"}], "default": default})
}

#[test]
fn a_topology_that_expands_is_admitted_with_the_request_uid() {
    for operation in ["CREATE", "UPDATE"] {
        let r = response(&review(operation, regions(json!({"latency": "40ms", "jitter": "2ms"}))));
        assert_eq!(r["uid"], "0b1d");
        assert_eq!(r["allowed"], true, "{r}");
    }
}

#[test]
fn a_topology_the_operator_cannot_expand_is_refused_naming_the_field() {
    // Jitter with no layer giving the pair a latency: the schema admits it, netem cannot vary around nothing.
    let r = response(&review("CREATE", regions(json!({"jitter": "2ms"}))));
    assert_eq!(r["allowed"], false, "{r}");
    let message = r["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("spec.default.jitter: eu → us:"), "{message}");
    // The same spec over a dataset's latency expands.
    let mut spec = regions(json!({"jitter": "2ms"}));
    spec["dataset"] = json!("Azure");
    spec["regions"] = json!([{"name": "eu", "datasetRegion": "westeurope"}, {"name": "us", "datasetRegion": "eastus"}]);
    assert_eq!(response(&review("UPDATE", spec))["allowed"], true);
}

#[test]
fn an_object_the_operator_cannot_read_is_refused_saying_so() {
    let r = response(&review("CREATE", json!({"regions": "eu"})));
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"].as_str().unwrap().starts_with("the operator cannot read this NetworkTopology"));
}

#[test]
fn deletes_pass_and_a_body_that_is_no_review_is_answered_as_invalid() {
    let mut body: Value = serde_json::from_slice(&review("DELETE", regions(json!({"jitter": "2ms"})))).unwrap();
    body["request"]["oldObject"] = body["request"]["object"].take();
    assert_eq!(response(&serde_json::to_vec(&body).unwrap())["allowed"], true);
    let r = response(b"{\"kind\": 1}");
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"].as_str().unwrap().starts_with("not an AdmissionReview"), "{r}");
}
