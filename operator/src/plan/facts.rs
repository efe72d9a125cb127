//! What the plan knows about one link, for its status: counts, overlaps and exclusions, and what its answers meet
//! on the way back.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{DestinationPlan, Impairment, NodePlan};

use super::limits::Refusal;
use super::planner::Planner;
use super::selection::Exclusion;
use crate::api::{SpecError, Summary};
use crate::failure::FailureReason;
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
    /// Set when the whole link is refused for asking more than the limits allow (nothing is planned for it).
    pub refusal: Option<Refusal>,
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
            refusal: None,
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
        let mut exclusions = res.exclusions.clone();
        let source_pods = res.source_pods();
        for pod in &source_pods {
            let node = self.pod_nodes.get(*pod);
            let stats = node
                .and_then(|n| self.nodes.get(n))
                .and_then(|s| s.pod_states.get(*pod))
                .and_then(|behind| behind.link_stats.get(key));
            if let Some(stats) = stats {
                if let Some(refusal) = &stats.refused {
                    exclusions.push(Exclusion {
                        pod: (*pod).clone(),
                        node: node.cloned(),
                        reason: FailureReason::TooManyDestinations,
                        message: refusal.message(),
                    });
                }
                pairs += stats.pairs;
                for (other, (won, lost)) in &stats.overlaps {
                    let e = overlaps.entry(other).or_default();
                    e.0 += won;
                    e.1 += lost;
                }
            }
        }
        let info = self.index.links.get(key)?;
        Some(LinkFacts {
            generation: info.generation,
            from_summary: info.from_summary.clone(),
            to_summary: info.to_summary.clone(),
            error: res.error.clone(),
            refusal: res.refusal.or_else(|| self.total_refused.get(key).copied()),
            summary: res.summary.clone(),
            source_pods: source_pods.len() as u32,
            destinations: res.destination_count(),
            pairs,
            overlaps: overlaps
                .into_iter()
                .map(|(link, (won, lost))| Overlap { link: link.clone(), won, lost })
                .collect(),
            exclusions: {
                // The resolution's are sorted; refusals for pods join them.
                if exclusions.len() > res.exclusions.len() {
                    exclusions.sort();
                }
                exclusions
            },
        })
    }

    /// The timeline whose phases a link's `status.schedule` shows: the forward direction's, else the reverse's
    /// (a ramp or trace may move one direction only). `None` without a schedule.
    pub fn link_timeline(&self, key: &ObjectKey) -> Option<&Arc<isthmus_agent_api::schedule::Timeline>> {
        let timelines = self.index.links.get(key)?.timelines.as_ref()?;
        timelines.forward.as_ref().or(timelines.reverse.as_ref())
    }

    /// What the answers to a link's forward probes meet on their way back when the link has no reverse
    /// direction of its own: the impairment that the plan of one of its destination pods applies towards one of
    /// its source pods (another link's, e.g. the opposite link of a NetworkTopology). The first such pair found
    /// speaks for the link: its measurements are merged over pairs anyway. `None` when no plan impairs the way
    /// back.
    pub fn way_back(&self, key: &ObjectKey) -> Option<Arc<Impairment>> {
        let forward = self.resolutions.get(key)?.forward.as_ref()?;
        let sources: Vec<IpAddr> = forward.sources.iter().flat_map(|s| s.ips.iter().copied()).collect();
        let is_destination = |ip: &IpAddr| forward.destinations.binary_search(&IpNet::from(*ip)).is_ok();
        self.node_plans()
            .flat_map(|plan| &plan.pods)
            .filter(|pod| pod.ips.iter().any(is_destination))
            .find_map(|pod| towards(&pod.destinations, &sources))
            .map(|d| d.impairment.clone())
    }

    /// Every node plan and every link's facts, for comparisons.
    pub fn snapshot(&self) -> (BTreeMap<String, NodePlan>, BTreeMap<ObjectKey, LinkFacts>) {
        let nodes = self.nodes.iter().map(|(n, s)| (n.clone(), s.plan.clone())).collect();
        let links = self.index.links.keys().filter_map(|k| Some((k.clone(), self.link_facts(k)?))).collect();
        (nodes, links)
    }
}

/// A pod's destination entry towards one of `sources`. A pod's entries are sorted, and pods are destinations as
/// host prefixes: each source is one binary search; only entries for wider networks (`to.cidrs`) are scanned.
/// Scanning every entry for every source cost a destination pod's entries times the link's sources, per link.
fn towards<'p>(destinations: &'p [DestinationPlan], sources: &[IpAddr]) -> Option<&'p DestinationPlan> {
    let host = sources.iter().find_map(|s| {
        let i = destinations.binary_search_by(|d| d.destination.cmp(&IpNet::from(*s))).ok()?;
        Some(&destinations[i])
    });
    host.or_else(|| {
        let mut wider = destinations.iter().filter(|d| d.destination.prefix_len() < d.destination.max_prefix_len());
        wider.find(|d| sources.iter().any(|s| d.destination.contains(s)))
    })
}
