//! The node plan (operator → agent); the agent's replies are in `reply.rs`.
//!
//! A plan is the node's *full* desired state: every source pod on the node that some link impairs, with every
//! destination. Pods absent from the plan get their isthmus trees removed. Plans carry a version that only
//! grows; the agent ignores a plan older than the newest it has applied.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::Impairment;
use crate::schedule::Timeline;

/// `PUT` a [`NodePlan`], answered with an [`ApplyReply`](crate::ApplyReply).
pub const PLAN_PATH: &str = "/v1/plan";
/// `GET` the [`ObservedState`](crate::ObservedState).
pub const OBSERVED_PATH: &str = "/v1/observed";
/// `GET` the node's [`Capabilities`](crate::Capabilities).
pub const CAPABILITIES_PATH: &str = "/v1/capabilities";

/// The largest plan body an agent reads; the operator's limits keep every node plan far below it
/// (docs/networklink.md#plan-limits).
pub const MAX_PLAN_BYTES: usize = 64 << 20;

/// The most destinations one pod's interface can have: the agent numbers each destination's classes, qdiscs and
/// filter nodes with a 12-bit slot (u32's node field). The operator's per-pod limit may not exceed it.
pub const MAX_DESTINATIONS_PER_INTERFACE: usize = 0xfff;

/// Which NetworkLink (and direction) asked for a destination's impairment; used for metrics and status.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkRef {
    pub namespace: String,
    pub name: String,
    /// `forward` (from → to) or `reverse` (to → from).
    pub direction: Direction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Direction {
    Forward,
    Reverse,
}

/// One destination of one source pod: packets from the pod to `destination` get `impairment`. The impairment
/// and the link are shared (`Arc`) by every destination that has them: a plan holds one pair in some 40 bytes
/// instead of several hundred (docs/networklink.md#plan-limits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationPlan {
    pub destination: IpNet,
    pub impairment: Arc<Impairment>,
    pub link: Arc<LinkRef>,
}

/// A pod whose egress is impaired, identified the way the agent can check on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPlan {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The pod's IPs (`status.podIPs`); the agent finds the network namespace that holds them.
    pub ips: Vec<IpAddr>,
    /// The interface inside the pod whose egress is shaped.
    #[serde(default = "default_interface")]
    pub interface: String,
    /// Host-network pods are never touched: the agent refuses them.
    #[serde(default)]
    pub host_network: bool,
    /// Sorted by destination. On the wire, grouped by link and impairment (`groups`, see `groups.rs`).
    #[serde(
        rename = "groups",
        serialize_with = "crate::groups::serialize",
        deserialize_with = "crate::groups::deserialize"
    )]
    pub destinations: Vec<DestinationPlan>,
}

pub fn default_interface() -> String {
    "eth0".to_owned()
}

/// The node's full desired state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    pub node: String,
    /// Monotonic; a plan with a lower version than the last applied one is refused as stale.
    pub version: u64,
    pub pods: Vec<PodPlan>,
    /// Links whose `spec.verify` is false: the agent does not probe their pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<LinkId>,
    /// Destinations that are not pods — Service ClusterIPs and `to.cidrs` networks: never probed (a ClusterIP
    /// does not answer, and isthmus sends nothing to networks outside the cluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unprobed: Vec<IpNet>,
    /// Link directions whose impairment changes with time: every destination the plan gives such a link gets,
    /// at each instant, what its timeline says on the agent's own clock (its `impairment` above is the link's
    /// own, in force before the first phase and after a reverting timeline's last). Sorted by link, one each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timelines: Vec<LinkTimeline>,
}

/// One link direction's [`Timeline`], sent once with the plan rather than a plan per step: the agents switch
/// phases themselves (docs/networklink.md#schedule).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkTimeline {
    pub link: LinkRef,
    pub timeline: Timeline,
}

/// A NetworkLink by namespace and name (both directions).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkId {
    pub namespace: String,
    pub name: String,
}
