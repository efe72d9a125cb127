//! The pod readiness gate's vocabulary: the condition type a pod declares in `spec.readinessGates`, the reasons
//! isthmus writes (each spelled once, in [`GateReason::as_str`]), and the condition as the index keeps it.
//!
//! The texts are API: users match them in `kubectl get pod -o jsonpath` and alerts; docs/troubleshooting.md
//! lists each. What isthmus decides and when it writes is in `controller/gates/`.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::failure::FailureReason;

/// The pod condition isthmus maintains on pods that declare it as a readiness gate.
pub const CONDITION_TYPE: &str = "isthmus.dev/links-applied";

/// Why the condition has its status: `True` for [`Applied`](GateReason::Applied), [`NoLinks`](GateReason::NoLinks),
/// [`NoPairs`](GateReason::NoPairs) and [`Uninstalled`](GateReason::Uninstalled), `False` for a
/// [`Failed`](GateReason::Failed) entry. A pod whose links are
/// still pending gets no reason: isthmus leaves its condition as it is (absent on a new pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GateReason {
    /// The node's agent confirmed the pod's desired plan entry.
    Applied,
    /// No NetworkLink selects the pod as a source.
    NoLinks,
    /// NetworkLinks select the pod as a source but give it no destination: its kernel needs nothing.
    NoPairs,
    /// The pod's entry failed, for the reason its links' status gives.
    Failed(FailureReason),
    /// Written once, by the uninstall hook told to release gated pods (`--gated-pods release`): isthmus is going
    /// away, and nothing would set the condition after it.
    Uninstalled,
}

impl GateReason {
    /// Every reason but the failures: each makes the condition `True`.
    pub const OWN: [GateReason; 4] =
        [GateReason::Applied, GateReason::NoLinks, GateReason::NoPairs, GateReason::Uninstalled];

    pub const fn as_str(self) -> &'static str {
        match self {
            GateReason::Applied => "Applied",
            GateReason::NoLinks => "NoLinks",
            GateReason::NoPairs => "NoPairs",
            GateReason::Failed(r) => r.as_str(),
            GateReason::Uninstalled => "Uninstalled",
        }
    }

    /// The condition's status for this reason: `True` unless the entry failed.
    pub const fn status(self) -> bool {
        !matches!(self, GateReason::Failed(_))
    }

    /// The reason a condition on the server carries; `None` for a text isthmus never writes.
    pub fn parse(text: &str) -> Option<GateReason> {
        GateReason::OWN.into_iter().chain(FailureReason::ALL.map(GateReason::Failed)).find(|r| r.as_str() == text)
    }
}

impl fmt::Display for GateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The condition as a pod carries it on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateCondition {
    /// `Some(true)` for `True`, `Some(false)` for `False`, `None` for anything else (`Unknown`).
    pub status: Option<bool>,
    /// `None` when the reason is not one isthmus writes (someone else set the condition).
    pub reason: Option<GateReason>,
    pub last_transition_time: Option<Time>,
}

impl GateCondition {
    /// Whether the condition already says `reason` (and so the status that goes with it).
    pub fn says(&self, reason: GateReason) -> bool {
        self.status == Some(reason.status()) && self.reason == Some(reason)
    }
}

/// A pod that declares the gate, as the index keeps it: the condition it carries now, so that isthmus writes
/// only when its decision differs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodGate {
    pub condition: Option<GateCondition>,
}

impl PodGate {
    /// The pod's gate; `None` when the pod does not declare it, in which case isthmus never writes to it.
    pub fn from_pod(pod: &Pod) -> Option<PodGate> {
        let gates = pod.spec.as_ref()?.readiness_gates.as_ref()?;
        if !gates.iter().any(|g| g.condition_type == CONDITION_TYPE) {
            return None;
        }
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        let condition = conditions.into_iter().flatten().find(|c| c.type_ == CONDITION_TYPE).map(|c| GateCondition {
            status: match c.status.as_str() {
                "True" => Some(true),
                "False" => Some(false),
                _ => None,
            },
            reason: c.reason.as_deref().and_then(GateReason::parse),
            last_transition_time: c.last_transition_time.clone(),
        });
        Some(PodGate { condition })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(gates: serde_json::Value, conditions: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}], "readinessGates": gates},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_pod_that_declares_the_gate_has_one() {
        assert_eq!(PodGate::from_pod(&pod(json!(null), json!([]))), None);
        assert_eq!(PodGate::from_pod(&pod(json!([{"conditionType": "example.com/other"}]), json!([]))), None);
        let gated = json!([{"conditionType": "example.com/other"}, {"conditionType": CONDITION_TYPE}]);
        assert_eq!(PodGate::from_pod(&pod(gated, json!([]))), Some(PodGate { condition: None }));
    }

    #[test]
    fn the_condition_on_the_server_is_read_back() {
        let gated = json!([{"conditionType": CONDITION_TYPE}]);
        let conditions = json!([
            {"type": "Ready", "status": "False"},
            {"type": CONDITION_TYPE, "status": "False", "reason": "KernelUnsupported",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]);
        let gate = PodGate::from_pod(&pod(gated.clone(), conditions)).unwrap();
        let c = gate.condition.unwrap();
        assert_eq!(c.status, Some(false));
        assert_eq!(c.reason, Some(GateReason::Failed(FailureReason::KernelUnsupported)));
        assert!(c.says(GateReason::Failed(FailureReason::KernelUnsupported)));
        assert!(!c.says(GateReason::Applied));
        assert_eq!(c.last_transition_time.unwrap().0.as_second(), 1_767_225_600);

        // Someone else's text: no reason isthmus knows, so any decision of isthmus differs from it.
        let foreign = json!([{"type": CONDITION_TYPE, "status": "Unknown", "reason": "SetByHand"}]);
        let c = PodGate::from_pod(&pod(gated, foreign)).unwrap().condition.unwrap();
        assert_eq!((c.status, c.reason), (None, None));
    }

    #[test]
    fn every_reason_keeps_its_text_and_reads_back() {
        let texts = ["Applied", "NoLinks", "NoPairs", "Uninstalled"];
        for (reason, text) in GateReason::OWN.into_iter().zip(texts) {
            assert_eq!((reason.as_str(), reason.status()), (text, true));
            assert_eq!(GateReason::parse(text), Some(reason));
        }
        for failure in FailureReason::ALL {
            let reason = GateReason::Failed(failure);
            assert_eq!((reason.to_string(), reason.status()), (failure.to_string(), false));
            assert_eq!(GateReason::parse(failure.as_str()), Some(reason));
        }
        assert_eq!(GateReason::parse("Pending"), None, "pending is never written");
    }

    /// Each reason isthmus itself gives has its row in the reference and in the troubleshooting table (the failure
    /// reasons have theirs in the failure table, checked in `failure.rs`).
    #[test]
    fn every_own_reason_is_documented() {
        let reference = include_str!("../../docs/networklink.md");
        let troubleshooting = include_str!("../../docs/troubleshooting.md");
        for reason in GateReason::OWN {
            let row = format!("\n| `True` | `{reason}` |");
            assert!(reference.contains(&row), "{reason}: no row in docs/networklink.md");
            assert!(troubleshooting.contains(&row), "{reason}: no row in docs/troubleshooting.md");
        }
        assert!(reference.contains(&format!("conditionType: {CONDITION_TYPE}")), "the YAML a user adds");
    }
}
