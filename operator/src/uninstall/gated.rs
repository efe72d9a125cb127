//! Pods that declare the readiness gate, at uninstall. Once isthmus is gone nothing writes
//! `isthmus.dev/links-applied`: a pod that declares it and is created later (a rollout, a rescheduled or scaled
//! replica, a pod that started while the hook ran) never becomes Ready. The pods that declare it now are how the
//! hook sees that workloads' templates still do, so by default it refuses to uninstall while any exists, naming
//! them and their owners; told to release them, it goes ahead and sets the condition `True` (`Uninstalled`) on each
//! that is not `True` yet, once every link is gone.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use serde_json::json;

use crate::gate::{CONDITION_TYPE, GateReason, PodGate};

/// What the hook does about pods that declare the readiness gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GatedPodsPolicy {
    /// Uninstall nothing while such a pod exists.
    Refuse,
    /// Uninstall, then mark each such pod's condition `True` (reason `Uninstalled`).
    Release,
}

/// How many pods an error names; the rest are counted.
const NAMED: usize = 10;

/// A pod that declares the gate and is neither terminating nor finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `Kind/name` of its controller, if any: the workload whose template declares the gate.
    pub owner: Option<String>,
    /// Whether its condition is `True` already (it stays Ready without isthmus).
    pub released: bool,
}

/// The pods among `pods` that declare the gate and will matter after uninstall, in the order given.
pub fn gated_pods(pods: &[Pod]) -> Vec<GatedPod> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| {
            let gate = PodGate::from_pod(p)?;
            let owner = p
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| format!("{}/{}", o.kind, o.name));
            Some(GatedPod {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
                uid: p.uid().unwrap_or_default(),
                owner,
                released: gate.condition.is_some_and(|c| c.status == Some(true)),
            })
        })
        .collect()
}

/// `namespace/name (owner Kind/name)`, comma-separated, the first [`NAMED`] of them, then how many more.
pub struct Named<'a>(pub &'a [GatedPod]);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pod) in self.0.iter().take(NAMED).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}/{}", pod.namespace, pod.name)?;
            if let Some(owner) = &pod.owner {
                write!(f, " (owner {owner})")?;
            }
        }
        if self.0.len() > NAMED {
            write!(f, " and {} more", self.0.len() - NAMED)?;
        }
        Ok(())
    }
}

/// The message of the condition the hook writes.
pub const RELEASE_MESSAGE: &str =
    "isthmus was uninstalled: no link shapes this pod and nothing will set this condition again";

/// The server-side apply body that releases `pod`: the one condition, on the pod with that UID (a pod replaced
/// meanwhile is refused by UID, and the new one is named by the next run).
pub fn release_body(pod: &GatedPod, now: &Time) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "status": {"conditions": [{
            "type": CONDITION_TYPE,
            "status": "True",
            "reason": GateReason::Uninstalled.as_str(),
            "message": RELEASE_MESSAGE,
            "lastTransitionTime": now,
        }]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, extra: serde_json::Value) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c"}], "readinessGates": [{"conditionType": CONDITION_TYPE}]},
        });
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (slot, v) => *slot = v,
        }
    }

    #[test]
    fn only_live_pods_that_declare_the_gate_count() {
        let pods = [
            pod("gated", json!({})),
            pod("plain", json!({"spec": {"readinessGates": null}})),
            pod("other-gate", json!({"spec": {"readinessGates": [{"conditionType": "example.com/x"}]}})),
            pod("leaving", json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})),
            pod("done", json!({"status": {"phase": "Succeeded"}})),
            pod("crashed", json!({"status": {"phase": "Failed"}})),
            pod("running", json!({"status": {"phase": "Running"}})),
        ];
        let names: Vec<_> = gated_pods(&pods).into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["gated", "running"]);
    }

    #[test]
    fn the_owner_is_the_controller_and_a_true_condition_is_released() {
        let owned = pod(
            "web-1",
            json!({
                "metadata": {"ownerReferences": [
                    {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "1"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d", "uid": "2", "controller": true},
                ]},
                "status": {"conditions": [{"type": CONDITION_TYPE, "status": "True", "reason": "Applied"}]},
            }),
        );
        let pending = pod("solo", json!({"status": {"conditions": [{"type": CONDITION_TYPE, "status": "False"}]}}));
        let got = gated_pods(&[owned, pending]);
        assert_eq!(got[0].owner.as_deref(), Some("ReplicaSet/web-7d"));
        assert!(got[0].released);
        assert_eq!((got[1].owner.as_deref(), got[1].released), (None, false));
    }

    #[test]
    fn an_error_names_ten_pods_and_counts_the_rest() {
        let pods: Vec<Pod> = (0..12).map(|i| pod(&format!("p{i:02}"), json!({}))).collect();
        let gated = gated_pods(&pods);
        let text = Named(&gated).to_string();
        assert!(text.starts_with("ns/p00, ns/p01"), "{text}");
        assert!(text.contains("ns/p09") && !text.contains("ns/p10"), "{text}");
        assert!(text.ends_with(" and 2 more"), "{text}");
        let owned = GatedPod { owner: Some("StatefulSet/db".into()), ..gated[0].clone() };
        assert_eq!(Named(&[owned]).to_string(), "ns/p00 (owner StatefulSet/db)");
    }

    #[test]
    fn the_release_sets_the_one_condition_on_that_pod() {
        let gated = &gated_pods(&[pod("p", json!({}))])[0];
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_767_225_600).unwrap());
        let body = release_body(gated, &now);
        assert_eq!(body["metadata"], json!({"name": "p", "namespace": "ns", "uid": "uid-p"}));
        let condition = &body["status"]["conditions"][0];
        assert_eq!(condition["type"], CONDITION_TYPE);
        assert_eq!((condition["status"].as_str(), condition["reason"].as_str()), (Some("True"), Some("Uninstalled")));
        assert_eq!(condition["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(body["status"]["conditions"].as_array().unwrap().len(), 1);
    }
}
