//! The `isthmus.dev/cleanup` finalizer: a deleted NetworkLink disappears only once every node that had its
//! impairments confirmed a plan without them and holds no tree of it it could not remove, or its node is gone,
//! or a bounded wait ran out.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_agent_api::NodePlan;
use serde_json::json;

use super::nodes::NodeReport;
use crate::index::ObjectKey;

pub const FINALIZER: &str = "isthmus.dev/cleanup";

/// Whether a plan still asks for anything of the link.
pub fn plan_uses(plan: &NodePlan, link: &ObjectKey) -> bool {
    plan.pods
        .iter()
        .flat_map(|p| &p.destinations)
        .any(|d| d.link.namespace == link.namespace && d.link.name == link.name)
}

/// Where a deleted link's cleanup stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// Every node confirmed, or has no agent plan with the link.
    Done { gone_nodes: Vec<String> },
    Waiting {
        nodes: Vec<String>,
        /// What the waiting nodes' agents said they could not remove (`node: pod netns interface: why`).
        leftovers: Vec<String>,
    },
}

/// The nodes among `affected` that still have to confirm a plan without the link. A node counts as done when it
/// no longer exists, or its agent's latest acknowledged plan does not use the link and the agent reports no tree
/// that may serve the link as one it could not remove.
pub fn cleanup_state(
    link: &ObjectKey,
    affected: &BTreeSet<String>,
    existing_nodes: &BTreeSet<String>,
    reports: &BTreeMap<String, NodeReport>,
) -> Cleanup {
    let mut waiting = Vec::new();
    let mut leftovers = Vec::new();
    let mut gone_nodes = Vec::new();
    for node in affected {
        if !existing_nodes.contains(node) {
            gone_nodes.push(node.clone());
            continue;
        }
        let Some(applied) = reports.get(node).and_then(|r| r.applied.as_ref()) else {
            waiting.push(node.clone());
            continue;
        };
        let stuck: Vec<String> = applied
            .reply
            .leftovers
            .iter()
            .filter(|l| l.may_serve(&link.namespace, &link.name))
            .map(|l| {
                let pod = l.pod.as_deref().map(|p| format!("pod {p} ")).unwrap_or_default();
                format!("{node}: {pod}net:[{}] {}: {}", l.netns_inode, l.interface, l.message)
            })
            .collect();
        if plan_uses(&applied.plan, link) || !stuck.is_empty() {
            waiting.push(node.clone());
            leftovers.extend(stuck);
        }
    }
    if waiting.is_empty() { Cleanup::Done { gone_nodes } } else { Cleanup::Waiting { nodes: waiting, leftovers } }
}

/// A merge patch that sets `metadata.finalizers`, guarded by the resource version it was computed from so that
/// a concurrent change makes it fail (409) instead of dropping someone else's finalizer.
pub fn finalizers_patch(finalizers: &[String], resource_version: Option<&str>) -> serde_json::Value {
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}})
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use isthmus_agent_api::test_util::{destination, link, pod};
    use isthmus_agent_api::{ApplyReply, Capabilities, Impairment, LeftoverTree};

    use super::*;
    use crate::controller::nodes::AppliedPlan;

    fn plan(node: &str, links: &[&str]) -> NodePlan {
        let destinations = links
            .iter()
            .enumerate()
            .map(|(i, l)| destination(net(&format!("10.0.1.{i}/32")), Impairment::default(), link(l)))
            .collect();
        NodePlan {
            node: node.into(),
            version: 1,
            pods: vec![pod("u", "p", &["10.0.0.1".parse().unwrap()], destinations)],
            ..Default::default()
        }
    }

    fn net(s: &str) -> ipnet::IpNet {
        s.parse().unwrap()
    }

    fn acked(plan: NodePlan) -> NodeReport {
        let reply = ApplyReply {
            node: plan.node.clone(),
            version: 1,
            stale: false,
            pods: vec![],
            capabilities: Capabilities::default(),
            leftovers: vec![],
        };
        NodeReport { applied: Some(AppliedPlan { plan: Arc::new(plan), reply }), failure: None, capabilities: None }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn waits_for_nodes_whose_acknowledged_plan_still_uses_the_link() {
        let link = ObjectKey::new("default", "a");
        let mut reports = BTreeMap::new();
        reports.insert("n1".to_string(), acked(plan("n1", &["a", "b"])));
        reports.insert("n2".to_string(), acked(plan("n2", &["b"])));
        let state = cleanup_state(&link, &set(&["n1", "n2", "n3"]), &set(&["n1", "n2", "n3"]), &reports);
        let waiting = Cleanup::Waiting { nodes: vec!["n1".into(), "n3".into()], leftovers: vec![] };
        assert_eq!(state, waiting, "n3 never acknowledged anything");

        reports.insert("n1".to_string(), acked(plan("n1", &["b"])));
        reports.insert("n3".to_string(), acked(plan("n3", &[])));
        assert_eq!(
            cleanup_state(&link, &set(&["n1", "n2", "n3"]), &set(&["n1", "n2", "n3"]), &reports),
            Cleanup::Done { gone_nodes: vec![] }
        );
    }

    #[test]
    fn a_tree_the_agent_could_not_remove_holds_the_cleanup_of_the_links_it_may_serve() {
        let (a, b) = (ObjectKey::new("default", "a"), ObjectKey::new("default", "b"));
        let leftover = |links: Vec<&str>| LeftoverTree {
            netns_inode: 4026532999,
            interface: "eth0".into(),
            pod: Some("default/p".into()),
            links: links.into_iter().map(link).collect(),
            message: "Operation not permitted".into(),
        };
        let mut report = acked(plan("n1", &[]));
        report.applied.as_mut().unwrap().reply.leftovers = vec![leftover(vec!["a"])];
        let reports = BTreeMap::from([("n1".to_string(), report)]);
        let nodes = set(&["n1"]);
        let waiting = Cleanup::Waiting {
            nodes: vec!["n1".into()],
            leftovers: vec!["n1: pod default/p net:[4026532999] eth0: Operation not permitted".into()],
        };
        assert_eq!(cleanup_state(&a, &nodes, &nodes, &reports), waiting);
        assert_eq!(cleanup_state(&b, &nodes, &nodes, &reports), Cleanup::Done { gone_nodes: vec![] }, "not b's tree");

        // A tree adopted at start-up names no links: it may serve any.
        let mut report = acked(plan("n1", &[]));
        report.applied.as_mut().unwrap().reply.leftovers = vec![LeftoverTree { pod: None, ..leftover(vec![]) }];
        let reports = BTreeMap::from([("n1".to_string(), report)]);
        assert!(matches!(cleanup_state(&b, &nodes, &nodes, &reports), Cleanup::Waiting { .. }));
    }

    #[test]
    fn a_deleted_node_does_not_block() {
        let link = ObjectKey::new("default", "a");
        let reports = BTreeMap::new();
        assert_eq!(
            cleanup_state(&link, &set(&["gone"]), &set(&["other"]), &reports),
            Cleanup::Done { gone_nodes: vec!["gone".into()] }
        );
        assert_eq!(cleanup_state(&link, &set(&[]), &set(&[]), &reports), Cleanup::Done { gone_nodes: vec![] });
    }

    #[test]
    fn the_patch_is_guarded_by_the_resource_version() {
        let p = finalizers_patch(&["other.io/x".into()], Some("42"));
        assert_eq!(p, json!({"metadata": {"finalizers": ["other.io/x"], "resourceVersion": "42"}}));
    }
}
