//! Each node's share of every link's progress, kept between batches. An agent report or a change to a node's
//! plan recomputes that node's share alone and marks dirty only the links whose share changed: recomputing every
//! node's share for each report cost every pair of the cluster per report, so a round of reports from every
//! node cost pairs × nodes. Pure; [`progress`](super::progress) from scratch is the reference it must equal.

use std::collections::{BTreeMap, BTreeSet};

use isthmus_agent_api::NodePlan;

use super::progress::{Progress, node_progress};
use crate::controller::nodes::NodeReport;
use crate::index::ObjectKey;

#[derive(Debug, Clone, Default)]
pub struct ProgressLedger {
    shares: BTreeMap<String, BTreeMap<ObjectKey, Progress>>,
    /// The nodes holding a share of each link, in node order: the order [`progress`](super::progress) adds
    /// them in, which the failures' order and the first queue cap follow.
    link_nodes: BTreeMap<ObjectKey, BTreeSet<String>>,
}

impl ProgressLedger {
    /// Recomputes the node's share from its desired plan (`None`: nothing planned there) and its agent's latest
    /// report; returns the links whose share changed, and only those.
    pub fn update(&mut self, node: &str, plan: Option<&NodePlan>, report: Option<&NodeReport>) -> BTreeSet<ObjectKey> {
        let new = plan.map(|p| node_progress(p, report)).unwrap_or_default();
        let old = self.shares.remove(node).unwrap_or_default();
        let mut changed = BTreeSet::new();
        for (key, share) in &old {
            if new.get(key) == Some(share) {
                continue;
            }
            changed.insert(key.clone());
            if !new.contains_key(key)
                && let Some(nodes) = self.link_nodes.get_mut(key)
            {
                nodes.remove(node);
                if nodes.is_empty() {
                    self.link_nodes.remove(key);
                }
            }
        }
        // A share that changed was marked above; what is left is a share that is new.
        for key in new.keys().filter(|k| !old.contains_key(*k)) {
            changed.insert(key.clone());
            self.link_nodes.entry(key.clone()).or_default().insert(node.to_owned());
        }
        if !new.is_empty() {
            self.shares.insert(node.to_owned(), new);
        }
        changed
    }

    /// A link's progress over every node; `None` when no node plans a pair of it.
    pub fn progress(&self, link: &ObjectKey) -> Option<Progress> {
        let nodes = self.link_nodes.get(link)?;
        let mut total = Progress::default();
        for share in nodes.iter().filter_map(|n| self.shares.get(n)?.get(link)) {
            total.add(share);
        }
        Some(total)
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
