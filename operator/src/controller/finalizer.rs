//! The `isthmus.dev/cleanup` finalizer: a deleted NetworkLink disappears only once every node that had its
//! impairments confirmed a plan without them and holds no tree of it it could not remove, or its node is gone,
//! or a bounded wait ran out.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_agent_api::{NodePlan, PodPlan};
use serde_json::json;

use super::nodes::NodeReport;
use crate::index::ObjectKey;

pub const FINALIZER: &str = "isthmus.dev/cleanup";
/// Set on a deleted link just before its finalizer is dropped after the wait ran out: what may remain impaired.
/// A patch of its own, first: the object a watch sees deleted is the one stored before the update that deleted
/// it, so an annotation set in the finalizer's own patch would never be seen. The uninstall hook reads it from
/// the link's last state and fails with it.
pub const INCOMPLETE_ANNOTATION: &str = "isthmus.dev/cleanup-incomplete";
/// The most an Event's note may hold: the API server refuses a longer one (events.k8s.io/v1).
pub const MAX_NOTE_BYTES: usize = 1024;

/// Why a deleted link's finalizer went before its nodes confirmed, within [`MAX_NOTE_BYTES`]: the nodes that did
/// not confirm, each with the pods whose impairment may remain there, then the trees the agents could not remove.
/// Whatever does not fit is counted, never cut mid-name.
pub fn timed_out_note(
    timeout: std::time::Duration,
    waiting: &[String],
    pods: &BTreeMap<String, BTreeSet<String>>,
    leftovers: &[String],
) -> String {
    let mut note = format!(
        "removed the finalizer after {timeout:?} although {} node(s) did not confirm removing this link's \
         impairments, which may remain on: ",
        waiting.len()
    );
    let mut items: Vec<String> = waiting
        .iter()
        .map(|node| match pods.get(node).filter(|p| !p.is_empty()) {
            Some(p) => format!("node {node} (pods {})", p.iter().cloned().collect::<Vec<_>>().join(", ")),
            None => format!("node {node}"),
        })
        .collect();
    items.extend(leftovers.iter().map(|l| format!("tree {l}")));
    append_fitting(&mut note, &items, MAX_NOTE_BYTES);
    note
}

/// Why a deleted link's finalizer went although some of its nodes never confirmed: they no longer exist. Within
/// [`MAX_NOTE_BYTES`].
pub fn gone_note(gone_nodes: &[String]) -> String {
    let mut note = "nothing to clean up on node(s) that no longer exist: ".to_owned();
    append_fitting(&mut note, gone_nodes, MAX_NOTE_BYTES);
    note
}

/// Appends `items` to `out`, comma-separated, while they fit within `limit` bytes with room for the count of
/// those left out (" and N more"); an item that does not fit whole is left out whole.
fn append_fitting(out: &mut String, items: &[String], limit: usize) {
    const ROOM: usize = " and 9999999 more".len();
    for (i, item) in items.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        let last = i + 1 == items.len();
        let reserve = if last { 0 } else { ROOM };
        if out.len() + separator.len() + item.len() + reserve > limit {
            let left = items.len() - i;
            out.push_str(&if i == 0 { format!("{left}, too long to list") } else { format!(" and {left} more") });
            return;
        }
        out.push_str(separator);
        out.push_str(item);
    }
}

/// Whether a plan still asks for anything of the link.
pub fn plan_uses(plan: &NodePlan, link: &ObjectKey) -> bool {
    plan.pods.iter().any(|pod| pod_uses(pod, link))
}

/// Whether a pod's entry asks for anything of the link.
pub fn pod_uses(pod: &PodPlan, link: &ObjectKey) -> bool {
    pod.destinations.iter().any(|d| link.names(&d.link))
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
pub fn cleanup_state<'a>(
    link: &ObjectKey,
    affected: impl IntoIterator<Item = &'a String>,
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

/// A merge patch that records, in [`INCOMPLETE_ANNOTATION`], what a cleanup may have left; guarded likewise.
pub fn incomplete_patch(resource_version: Option<&str>, note: &str) -> serde_json::Value {
    json!({"metadata": {"annotations": { INCOMPLETE_ANNOTATION: note }, "resourceVersion": resource_version}})
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
        NodeReport { applied: Some(AppliedPlan::new(Arc::new(plan), reply)), failure: None, capabilities: None }
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

    #[test]
    fn a_timed_out_note_names_nodes_and_pods_and_stays_within_an_events_limit() {
        let pods = BTreeMap::from([("n1".to_string(), set(&["default/a", "default/b"]))]);
        let note = timed_out_note(std::time::Duration::from_secs(3), &["n1".into(), "n2".into()], &pods, &[]);
        assert!(note.ends_with("may remain on: node n1 (pods default/a, default/b), node n2"), "{note}");
        assert!(note.contains("after 3s") && note.contains("2 node(s)"), "{note}");

        // Thousands of nodes and pods: the note names what fits and counts the rest.
        let waiting: Vec<String> = (0..5000).map(|i| format!("node-with-a-long-name-{i:05}")).collect();
        let pods: BTreeMap<String, BTreeSet<String>> =
            waiting.iter().map(|n| (n.clone(), (0..50).map(|p| format!("tenant/pod-{p}")).collect())).collect();
        let note = timed_out_note(std::time::Duration::from_secs(300), &waiting, &pods, &["n: pod x: EPERM".into()]);
        assert!(note.len() <= MAX_NOTE_BYTES, "{} bytes", note.len());
        let named = note.matches("node node-with-a-long-name-").count();
        let more: usize = note.rsplit(" and ").next().and_then(|t| t.strip_suffix(" more")).unwrap().parse().unwrap();
        assert!(named >= 1 && named + more == 5001, "every node and the tree named or counted: {note}");

        // One item too long for the note on its own is counted, not cut.
        let note = timed_out_note(std::time::Duration::from_secs(1), &["x".repeat(2000)], &BTreeMap::new(), &[]);
        assert!(note.ends_with("may remain on: 1, too long to list"), "{note}");
    }

    #[test]
    fn the_incomplete_patch_carries_the_note() {
        let p = incomplete_patch(Some("7"), "node n1");
        assert_eq!(p, json!({"metadata": {"resourceVersion": "7", "annotations": {INCOMPLETE_ANNOTATION: "node n1"}}}));
    }
}
