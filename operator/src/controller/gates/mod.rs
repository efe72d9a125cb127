//! The readiness gate `isthmus.dev/links-applied`, decided: for each pod that declares it, whether every link
//! that shapes the pod's egress is in force, from the index, the desired plans and the agents' reports. Pure;
//! `writer.rs` queues the changes and writes them.
//!
//! The rule, per gated pod (docs/networklink.md, "Readiness gate"):
//! - `True`, `Applied`: the node's agent confirmed exactly the pod's desired entry (what a link counts in
//!   `pairsApplied`, judged by the same rule, [`judge_entry`]), with no destination refused;
//! - `True`, `NoLinks`: no link selects the pod as a source; `True`, `NoPairs`: links select it but give it no
//!   destination. Its kernel needs nothing, so there is nothing to wait for;
//! - `False`, a [`FailureReason`]: the entry failed (as the links' `status.failures` say), or the pod uses the host
//!   network and a link selects it;
//! - pending (the agent has not confirmed the entry yet): no write, the condition stays as it is — absent on a new
//!   pod, so the kubelet holds it NotReady. A `True` condition therefore never turns `False` for a change that is
//!   still pending (an edit would otherwise pull serving pods out of their Services), only for a failure. A plan
//!   that did not reach the agent (`AgentUnavailable`, `AgentUnreachable`, `AgentRefused`) says nothing about the
//!   pod's kernel, which keeps what the agent last applied: it makes a pod `False` only while it is not `True`.
//!
//! The caller decides only once every watch has listed and after the planner has processed every event, so that
//! a pod is never `NoLinks` just because its link or its plan is not known yet.

pub(super) mod writer;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::SelectorExt;
use serde_json::json;

use super::nodes::NodeReport;
use super::status::{Outcome, judge_entry};
use crate::failure::FailureReason;
use crate::gate::{CONDITION_TYPE, GateCondition, GateReason};
use crate::index::{Index, NamespaceScope, ObjectKey, PodInfo};
use crate::plan::{Planner, host_network};

/// What isthmus has made of a gated pod's links, before the rule on what to write.
#[derive(Debug, Clone, PartialEq)]
pub enum PodLinksState {
    Applied {
        node: String,
        destinations: usize,
        /// The node's agent emulates the pod's links itself (the userspace datapath), which sockets bound to
        /// the pod's interface bypass.
        emulated: bool,
    },
    NoLinks,
    /// The names of the links (in the pod's namespace) that select the pod.
    NoPairs {
        links: Vec<String>,
    },
    Failed {
        reason: FailureReason,
        message: String,
    },
    Pending,
}

impl PodLinksState {
    fn reason(&self) -> Option<GateReason> {
        match self {
            PodLinksState::Applied { .. } => Some(GateReason::Applied),
            PodLinksState::NoLinks => Some(GateReason::NoLinks),
            PodLinksState::NoPairs { .. } => Some(GateReason::NoPairs),
            PodLinksState::Failed { reason, .. } => Some(GateReason::Failed(*reason)),
            PodLinksState::Pending => None,
        }
    }

    fn message(&self) -> String {
        match self {
            PodLinksState::Applied { node, destinations, emulated } => {
                let s = if *destinations == 1 { "" } else { "s" };
                let applied = format!(
                    "node {node}'s agent applied every link that shapes this pod ({destinations} destination{s})"
                );
                match emulated {
                    false => applied,
                    true => format!("{applied}, emulated by the agent: {EMULATION_LIMIT}"),
                }
            }
            PodLinksState::NoLinks => "no NetworkLink selects this pod as a source; nothing to wait for".into(),
            PodLinksState::NoPairs { links } => {
                let (noun, select, give) = if links.len() == 1 {
                    ("NetworkLink", "selects", "gives")
                } else {
                    ("NetworkLinks", "select", "give")
                };
                let links = links.join(", ");
                format!(
                    "{noun} {links} {select} this pod as a source but {give} it no destination yet; nothing to apply"
                )
            }
            PodLinksState::Failed { message, .. } => message.clone(),
            PodLinksState::Pending => String::new(),
        }
    }
}

/// What the userspace datapath does not impair (docs/datapaths.md), said on every pod it shapes.
pub const EMULATION_LIMIT: &str =
    "sockets bound to the pod's interface (SO_BINDTODEVICE) bypass the emulation and go unimpaired";

/// The condition to write on one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct GateWrite {
    pub reason: GateReason,
    pub message: String,
    pub last_transition_time: Time,
}

/// A write for one pod, bound to the pod's UID: a pod deleted and created again under the same name is not the
/// pod this was decided for.
#[derive(Debug, Clone, PartialEq)]
pub struct GateChange {
    pub pod: ObjectKey,
    pub uid: String,
    pub write: GateWrite,
}

/// The conditions to write among `pods`: those that declare the gate and whose decision differs from the
/// condition they carry.
pub fn changes<'a>(
    planner: &Planner,
    reports: &BTreeMap<String, NodeReport>,
    pods: impl IntoIterator<Item = &'a ObjectKey>,
    now: &Time,
) -> Vec<GateChange> {
    let index = planner.index();
    pods.into_iter()
        .filter_map(|key| {
            let gate = index.gates.get(key)?;
            let state = links_state(planner, reports, key)?;
            let write = decide(gate.condition.as_ref(), &state, now)?;
            Some(GateChange { pod: key.clone(), uid: index.pods.get(key)?.uid.clone(), write })
        })
        .collect()
}

/// What isthmus has made of the pod's links; `None` for a pod the index does not hold or that is terminating
/// (its readiness no longer matters).
pub fn links_state(
    planner: &Planner,
    reports: &BTreeMap<String, NodeReport>,
    key: &ObjectKey,
) -> Option<PodLinksState> {
    let pod = planner.index().pods.get(key)?;
    if pod.terminating {
        return None;
    }
    if let Some((node, entry)) = planner.pod_entry(key) {
        let report = reports.get(node);
        let needs_netem = entry.destinations.iter().any(|d| d.impairment.needs_netem());
        return Some(match judge_entry(node, report, entry, needs_netem) {
            Outcome::Applied => PodLinksState::Applied {
                node: node.to_owned(),
                destinations: entry.destinations.len(),
                emulated: report
                    .and_then(|r| r.capabilities.as_ref())
                    .is_some_and(|c| c.datapath == isthmus_agent_api::DatapathKind::Userspace),
            },
            Outcome::Failed(reason, message) => PodLinksState::Failed { reason, message },
            Outcome::Pending => PodLinksState::Pending,
        });
    }
    let links = selecting_links(planner.index(), key, pod);
    Some(if links.is_empty() {
        PodLinksState::NoLinks
    } else if pod.host_network {
        PodLinksState::Failed { reason: FailureReason::HostNetwork, message: host_network("source") }
    } else if pod.usable() {
        // Planned, and no plan holds it: every link that selects it has no destination for it.
        PodLinksState::NoPairs { links }
    } else {
        // No IP yet (or ended): its entry comes once its sandbox has one.
        PodLinksState::Pending
    })
}

/// The links whose selectors pick the pod as a source, whether or not it runs: `from`, or `to` where the link has
/// a reverse direction. Only links of the pod's own namespace shape its egress.
fn selecting_links(index: &Index, key: &ObjectKey, pod: &PodInfo) -> Vec<String> {
    let ns_labels = index.namespaces.get(&key.namespace);
    index
        .links_in(&key.namespace)
        .filter(|(_, link)| {
            let Ok((sel, impairments)) = &link.compiled else { return false };
            let in_scope = match &sel.to_namespaces {
                NamespaceScope::Own => true,
                NamespaceScope::Selected(s) => ns_labels.is_some_and(|l| s.matches(l)),
            };
            let reverse_source = impairments.reverse.is_some()
                && in_scope
                && sel.to_pods.as_ref().is_some_and(|s| s.matches(&pod.labels));
            sel.from.matches(&pod.labels) || reverse_source
        })
        .map(|(k, _)| k.name.clone())
        .collect()
}

/// The rule: what to write given the condition the pod carries; `None` to leave it as it is.
pub fn decide(current: Option<&GateCondition>, state: &PodLinksState, now: &Time) -> Option<GateWrite> {
    let reason = state.reason()?;
    let ready = current.is_some_and(|c| c.status == Some(true));
    if let GateReason::Failed(failure) = reason
        && undelivered(failure)
        && ready
    {
        return None;
    }
    if current.is_some_and(|c| c.says(reason)) {
        return None;
    }
    let last_transition_time = match current {
        Some(c) if c.status == Some(reason.status()) => c.last_transition_time.clone().unwrap_or_else(|| now.clone()),
        _ => now.clone(),
    };
    Some(GateWrite { reason, message: state.message(), last_transition_time })
}

/// The plan did not reach the agent: the pod's kernel keeps whatever the agent last applied.
fn undelivered(reason: FailureReason) -> bool {
    matches!(reason, FailureReason::AgentUnavailable | FailureReason::AgentUnreachable | FailureReason::AgentRefused)
}

/// The server-side apply body of one change: the one condition, on the status of the pod with that UID (the API
/// server refuses a UID that is not the pod's: the pod was replaced meanwhile).
pub fn apply_body(change: &GateChange) -> serde_json::Value {
    let w = &change.write;
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": change.pod.name, "namespace": change.pod.namespace, "uid": change.uid},
        "status": {"conditions": [{
            "type": CONDITION_TYPE,
            "status": if w.reason.status() { "True" } else { "False" },
            "reason": w.reason.as_str(),
            "message": w.message,
            "lastTransitionTime": w.last_transition_time,
        }]},
    })
}

#[cfg(test)]
mod tests;
