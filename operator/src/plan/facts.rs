//! What the plan knows about one link, for its status: counts, overlaps and exclusions.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use isthmus_agent_api::NodePlan;

use super::planner::Planner;
use super::resolve::Exclusion;
use crate::api::{SpecError, Summary};
use crate::index::ObjectKey;

/// Another link sharing pairs with this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub link: ObjectKey,
    pub won: u32,
    pub lost: u32,
}

/// What the plan knows about one link, for its status.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkFacts {
    pub generation: Option<i64>,
    pub from_summary: String,
    pub to_summary: String,
    pub error: Option<SpecError>,
    pub summary: Option<Summary>,
    /// Distinct pods whose egress the link shapes (both directions).
    pub source_pods: u32,
    /// Distinct destination networks (both directions).
    pub destinations: u32,
    /// (source pod, destination) pairs the link wins.
    pub pairs: u32,
    pub overlaps: Vec<Overlap>,
    pub exclusions: Vec<Exclusion>,
}

impl LinkFacts {
    /// The facts of a stored link the operator cannot read: nothing is planned for it, and its status says
    /// which field.
    pub fn unreadable(generation: Option<i64>, field: &str, reason: &str) -> Self {
        LinkFacts {
            generation,
            from_summary: String::new(),
            to_summary: String::new(),
            error: Some(SpecError {
                field: field.to_owned(),
                message: format!(
                    "{reason}; the operator cannot read this link and applies nothing for it until it is fixed"
                ),
            }),
            summary: None,
            source_pods: 0,
            destinations: 0,
            pairs: 0,
            overlaps: Vec::new(),
            exclusions: Vec::new(),
        }
    }
}

impl Planner {
    /// The status facts of a link; `None` for an unknown link.
    pub fn link_facts(&self, key: &ObjectKey) -> Option<LinkFacts> {
        let res = self.resolutions.get(key)?;
        let mut pairs = 0;
        let mut overlaps: BTreeMap<&ObjectKey, (u32, u32)> = BTreeMap::new();
        let source_pods = res.source_pods();
        for pod in &source_pods {
            let stats = self
                .pod_nodes
                .get(*pod)
                .and_then(|n| self.nodes.get(n))
                .and_then(|s| s.link_stats.get(*pod))
                .and_then(|per_link| per_link.get(key));
            if let Some(stats) = stats {
                pairs += stats.pairs;
                for (other, (won, lost)) in &stats.overlaps {
                    let e = overlaps.entry(other).or_default();
                    e.0 += won;
                    e.1 += lost;
                }
            }
        }
        let destinations: BTreeSet<&IpNet> = res.sides().flat_map(|(_, s)| s.destinations.iter()).collect();
        let info = self.index.links.get(key)?;
        Some(LinkFacts {
            generation: info.generation,
            from_summary: info.from_summary.clone(),
            to_summary: info.to_summary.clone(),
            error: res.error.clone(),
            summary: res.summary.clone(),
            source_pods: source_pods.len() as u32,
            destinations: destinations.len() as u32,
            pairs,
            overlaps: overlaps
                .into_iter()
                .map(|(link, (won, lost))| Overlap { link: link.clone(), won, lost })
                .collect(),
            exclusions: res.exclusions.clone(),
        })
    }

    /// Every node plan and every link's facts, for comparisons.
    pub fn snapshot(&self) -> (BTreeMap<String, NodePlan>, BTreeMap<ObjectKey, LinkFacts>) {
        let nodes = self.nodes.iter().map(|(n, s)| (n.clone(), s.plan.clone())).collect();
        let links = self.index.links.keys().filter_map(|k| Some((k.clone(), self.link_facts(k)?))).collect();
        (nodes, links)
    }
}
