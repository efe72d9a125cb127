//! The benchmark's world as numbers and names: which pods, on which nodes, at which addresses, and which links
//! join which groups of pods.
//!
//! Pods come in groups of `group`; link `k` goes from group `k` to group `k + 1` (the last to the first), so
//! each link has `group × group` pairs and every group is a link's sources and another's destinations. Pod `i`
//! runs on node `i mod nodes`: a group's pods are spread over as many nodes as it has pods (up to `nodes`).
//!
//! Addresses: agent `n` listens on 127.1.0.0/16 (loopback: the operator dials the agent pod's IP, and the
//! harness serves there); pod `i` has an address of 198.18.0.0/15, the benchmarking range, which only the plans
//! carry (no packet is ever sent to it).

use std::net::Ipv4Addr;

/// One address per host part below 250 keeps the last octet away from 0 and 255.
const PER_OCTET: u32 = 250;
const MAX_INDEXED: u32 = PER_OCTET * 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    nodes: u32,
    pods: u32,
    group: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    #[error("--nodes must be between 1 and {MAX_INDEXED} (one loopback address each), not {0}")]
    Nodes(u32),
    #[error("--pods must be between 1 and {MAX_INDEXED} (one address each), not {0}")]
    Pods(u32),
    #[error("--group must be at least 1 and divide --pods ({pods}) into at least two groups, not {group}")]
    Group { pods: u32, group: u32 },
}

impl Shape {
    pub fn new(nodes: u32, pods: u32, group: u32) -> Result<Shape, ShapeError> {
        if !(1..=MAX_INDEXED).contains(&nodes) {
            return Err(ShapeError::Nodes(nodes));
        }
        if !(1..=MAX_INDEXED).contains(&pods) {
            return Err(ShapeError::Pods(pods));
        }
        if group == 0 || !pods.is_multiple_of(group) || pods / group < 2 {
            return Err(ShapeError::Group { pods, group });
        }
        Ok(Shape { nodes, pods, group })
    }

    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    pub fn pods(&self) -> u32 {
        self.pods
    }

    /// As many links as groups.
    pub fn links(&self) -> u32 {
        self.pods / self.group
    }

    pub fn pairs_per_link(&self) -> u32 {
        self.group * self.group
    }

    pub fn pairs(&self) -> u64 {
        u64::from(self.links()) * u64::from(self.pairs_per_link())
    }

    pub fn node_name(n: u32) -> String {
        format!("scale-node-{n}")
    }

    pub fn agent_pod_name(n: u32) -> String {
        format!("isthmus-agent-{n}")
    }

    pub fn agent_ip(n: u32) -> Ipv4Addr {
        indexed([127, 1], n)
    }

    pub fn pod_name(i: u32) -> String {
        format!("pod-{i}")
    }

    pub fn pod_ip(i: u32) -> Ipv4Addr {
        indexed([198, 18], i)
    }

    pub fn node_of_pod(&self, i: u32) -> u32 {
        i % self.nodes
    }

    /// The value of the `group` label of pod `i`.
    pub fn group_of_pod(&self, i: u32) -> String {
        format!("g{}", i / self.group)
    }

    pub fn link_name(k: u32) -> String {
        format!("link-{k}")
    }

    /// The `group` label values of link `k`'s sources and destinations.
    pub fn link_groups(&self, k: u32) -> (String, String) {
        (format!("g{k}"), format!("g{}", (k + 1) % self.links()))
    }
}

/// The `index`-th address of `prefix`/16, host parts `x.1` to `x.250`.
fn indexed(prefix: [u8; 2], index: u32) -> Ipv4Addr {
    let third = u8::try_from(index / PER_OCTET).expect("the shape keeps indices below 256 × 250");
    let fourth = u8::try_from(index % PER_OCTET + 1).expect("below 251");
    Ipv4Addr::new(prefix[0], prefix[1], third, fourth)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    #[test]
    fn the_issue_s_shape_has_ten_thousand_pairs_on_a_thousand_pods() {
        let s = Shape::new(50, 1000, 10).unwrap();
        assert_eq!((s.links(), s.pairs_per_link(), s.pairs()), (100, 100, 10_000));
    }

    #[test]
    fn each_link_joins_two_different_groups_and_every_group_is_a_source_once_and_a_destination_once() {
        let s = Shape::new(7, 60, 4).unwrap();
        let (mut from, mut to) = (BTreeSet::new(), BTreeSet::new());
        for k in 0..s.links() {
            let (a, b) = s.link_groups(k);
            assert_ne!(a, b);
            assert!(from.insert(a));
            assert!(to.insert(b));
        }
        let groups: BTreeSet<String> = (0..s.pods()).map(|i| s.group_of_pod(i)).collect();
        assert_eq!((from, to), (groups.clone(), groups));
    }

    #[test]
    fn a_group_is_spread_over_as_many_nodes_as_it_has_pods() {
        let s = Shape::new(50, 1000, 10).unwrap();
        let mut nodes_of: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for i in 0..s.pods() {
            nodes_of.entry(s.group_of_pod(i)).or_default().insert(s.node_of_pod(i));
        }
        assert!(nodes_of.values().all(|n| n.len() == 10), "{nodes_of:?}");
    }

    #[test]
    fn addresses_are_distinct_in_their_ranges_and_never_a_network_or_broadcast_address() {
        let max = MAX_INDEXED;
        let agents: BTreeSet<Ipv4Addr> = (0..max).map(Shape::agent_ip).collect();
        let pods: BTreeSet<Ipv4Addr> = (0..max).map(Shape::pod_ip).collect();
        assert_eq!((agents.len(), pods.len()), (max as usize, max as usize));
        assert!(agents.iter().all(|a| a.octets()[..2] == [127, 1] && !matches!(a.octets()[3], 0 | 255)));
        assert!(pods.iter().all(|a| a.octets()[..2] == [198, 18] && !matches!(a.octets()[3], 0 | 255)));
        assert_eq!(Shape::agent_ip(0), Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(Shape::pod_ip(250), Ipv4Addr::new(198, 18, 1, 1));
    }

    #[test]
    fn a_shape_the_addresses_or_the_links_cannot_hold_is_refused_naming_the_flag() {
        assert_eq!(Shape::new(0, 10, 5), Err(ShapeError::Nodes(0)));
        assert_eq!(Shape::new(1, MAX_INDEXED + 1, 1), Err(ShapeError::Pods(MAX_INDEXED + 1)));
        assert_eq!(Shape::new(1, 10, 3), Err(ShapeError::Group { pods: 10, group: 3 }));
        assert_eq!(Shape::new(1, 10, 10), Err(ShapeError::Group { pods: 10, group: 10 }));
        assert_eq!(Shape::new(1, 10, 0), Err(ShapeError::Group { pods: 10, group: 0 }));
        assert!(Shape::new(1, 10, 0).unwrap_err().to_string().contains("--group"));
    }
}
