//! The agent's replies (agent → operator): what came of each pod of a plan ([`ApplyReply`]), what the node
//! holds ([`ObservedState`]) and can do ([`Capabilities`]).

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::plan::{LinkRef, PodPlan};

/// Why one pod's plan could not be applied. `kind` is stable (for status reasons and metrics); `message` is
/// for people and keeps the kernel's own text where there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodError {
    pub kind: PodErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub enum PodErrorKind {
    /// The plan for this pod is malformed or impossible (bad impairment, too many destinations).
    InvalidPlan,
    /// No network namespace on this node holds the pod's IPs.
    PodNotFound,
    /// The pod uses the host's network; isthmus never shapes it.
    HostNetwork,
    /// The namespace holding the pod's IPs belongs to another pod (an IP reused), or several pods of the plan
    /// resolve to it: isthmus shapes none of them rather than the wrong one.
    NamespaceConflict,
    /// The interface named in the plan does not exist in the pod.
    InterfaceNotFound,
    /// A root qdisc that isthmus did not install is on the interface.
    ForeignQdisc,
    /// The node's kernel lacks a qdisc or classifier this impairment needs (e.g. netem).
    KernelUnsupported,
    /// The kernel refuses a duplicating netem beside other netems on one interface.
    DuplicateRestriction,
    /// Any other kernel error; the message carries the kernel's extended-ack text.
    Kernel,
    /// The agent's userspace datapath stopped (its loop ended): the agent removed every capture, so the pod's
    /// traffic leaves unimpaired, and it fails its liveness probe so that the kubelet restarts it.
    DatapathStopped,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum PodOutcome {
    Applied,
    Failed(PodError),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResult {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub outcome: PodOutcome,
    /// Netlink changes this apply sent for the pod (0 when the kernel already matched the plan).
    #[serde(default)]
    pub mutations: u64,
    /// Destinations whose `queueLimit` the agent's queue budget cut (installed with a shorter queue).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue_caps: Vec<QueueCap>,
    /// Destinations the agent installed nothing for, each with why (an impairment the kernel cannot hold, in
    /// the link's own form or in one of its schedule's phases): one such destination fails alone, and the
    /// pod's other destinations are applied (`outcome` speaks for them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedDestination>,
}

impl PodResult {
    /// The result for `pod` with `outcome`: no netlink changes, no queue capped, nothing refused.
    pub fn of(pod: &PodPlan, outcome: PodOutcome) -> PodResult {
        PodResult {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            outcome,
            mutations: 0,
            queue_caps: Vec::new(),
            refused: Vec::new(),
        }
    }
}

/// A destination of a pod's plan that the agent refused, leaving the pod's traffic to it unimpaired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedDestination {
    pub destination: IpNet,
    pub link: LinkRef,
    pub error: PodError,
}

/// A destination installed with a shorter queue than its `queueLimit` asked for: the agent holds every queue to
/// its byte budgets (per destination, and per pod shared by the pod's destinations).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueCap {
    pub destination: IpNet,
    pub link: LinkRef,
    pub requested_packets: u32,
    pub installed_packets: u32,
}

/// The reply to a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReply {
    pub node: String,
    /// The version now in force (the request's, or a newer one if the request was stale).
    pub version: u64,
    /// True when the request's version was older than the applied one and nothing was done.
    #[serde(default)]
    pub stale: bool,
    pub pods: Vec<PodResult>,
    pub capabilities: Capabilities,
    /// Trees the agent could not remove; each is tried again with every plan until it goes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leftovers: Vec<LeftoverTree>,
}

/// A tree a plan no longer wants that the agent could not remove: where it is, what it served, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverTree {
    /// Inode of the network namespace.
    pub netns_inode: u64,
    pub interface: String,
    /// `namespace/name` of the pod it was installed for; absent for a tree adopted at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The links it served; empty when unknown (a tree adopted at start-up), which counts as any link.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkRef>,
    /// Why it could not be removed, with the kernel's text where there is one.
    pub message: String,
}

impl LeftoverTree {
    /// Whether the tree may still hold impairments of the link `namespace/name`.
    pub fn may_serve(&self, namespace: &str, name: &str) -> bool {
        self.links.is_empty() || self.links.iter().any(|l| l.namespace == namespace && l.name == name)
    }
}

/// What the node's kernel can do, from the datapath's probe in a scratch namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub kernel_release: String,
    pub htb: bool,
    pub tbf: bool,
    pub netem: bool,
    pub u32: bool,
    /// True when the kernel refuses a duplicating netem next to other netems on one interface.
    pub duplicate_restricted: bool,
    /// The datapath this agent gives every pod (chosen at start-up from `netem` and the agent's setting).
    #[serde(default)]
    pub datapath: DatapathKind,
}

/// How an agent impairs its pods' egress; one per node, never mixed within a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DatapathKind {
    /// Per-destination qdisc trees in the kernel (HTB, TBF, netem, u32).
    #[default]
    Tc,
    /// The agent's own link emulator, for kernels without sch_netem: packets routed to the agent and back.
    Userspace,
}

/// Kernel counters of one qdisc or class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub backlog_packets: u64,
    pub backlog_bytes: u64,
}

/// Two queues' counters as one queue's, when one takes over the other: the totals add, and so do the backlogs (the
/// packets of both now wait in one queue).
impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, other: Counters) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.drops += other.drops;
        self.overlimits += other.overlimits;
        self.backlog_packets += other.backlog_packets;
        self.backlog_bytes += other.backlog_bytes;
    }
}

/// What is installed for one destination of one pod, read back from the kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedDestination {
    pub destination: IpNet,
    pub link: Option<LinkRef>,
    pub counters: Counters,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub destinations: Vec<ObservedDestination>,
}

/// An isthmus tree found installed when the agent started, kept untouched until the first plan says whether it
/// is still wanted (so impairments do not flap while the agent restarts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdoptedTree {
    /// Inode of the network namespace (as `ip netns identify`/`lsns` show it).
    pub netns_inode: u64,
    pub interface: String,
    pub destinations: Vec<ObservedDestination>,
}

/// The reply to a read of the node's observed state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedState {
    pub node: String,
    pub version: u64,
    pub pods: Vec<ObservedPod>,
    pub capabilities: Capabilities,
    /// Trees adopted at start-up that no plan has claimed or removed yet (empty once a plan was applied).
    #[serde(default)]
    pub adopted: Vec<AdoptedTree>,
}

/// The body of every non-2xx reply of the agent's API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Direction;

    #[test]
    fn replies_from_before_the_additive_fields_still_parse() {
        let result: PodResult =
            serde_json::from_str(r#"{"uid":"u","namespace":"n","name":"p","outcome":{"state":"applied"}}"#).unwrap();
        assert_eq!(result.mutations, 0);
        assert_eq!(result.outcome, PodOutcome::Applied);
        let observed: ObservedState = serde_json::from_str(
            r#"{"node":"n","version":3,"pods":[],"capabilities":{"kernelRelease":"6.18","htb":true,"tbf":true,"netem":false,"u32":true,"duplicateRestricted":false}}"#,
        )
        .unwrap();
        assert!(observed.adopted.is_empty());
    }

    #[test]
    fn a_failed_pod_serializes_with_its_kind() {
        let result = PodResult {
            uid: "u".into(),
            namespace: "n".into(),
            name: "p".into(),
            outcome: PodOutcome::Failed(PodError { kind: PodErrorKind::HostNetwork, message: "m".into() }),
            mutations: 0,
            queue_caps: Vec::new(),
            refused: Vec::new(),
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(json["outcome"]["state"], "failed");
        assert_eq!(json["outcome"]["kind"], "HostNetwork");
        assert!(json.get("queueCaps").is_none(), "no caps, no field");
    }

    #[test]
    fn a_queue_cap_names_destination_link_and_both_limits() {
        let cap = QueueCap {
            destination: "10.0.0.2/32".parse().unwrap(),
            link: LinkRef { namespace: "n".into(), name: "l".into(), direction: Direction::Forward },
            requested_packets: 1_000_000,
            installed_packets: 11_081,
        };
        let json = serde_json::to_value(&cap).unwrap();
        assert_eq!(json["requestedPackets"], 1_000_000);
        assert_eq!(json["installedPackets"], 11_081);
        assert_eq!(serde_json::from_value::<QueueCap>(json).unwrap(), cap);
    }

    #[test]
    fn a_leftover_tree_may_serve_its_links_or_any_when_unknown() {
        let link = |name: &str| LinkRef { namespace: "n".into(), name: name.into(), direction: Direction::Reverse };
        let tree = LeftoverTree {
            netns_inode: 7,
            interface: "eth0".into(),
            pod: Some("n/p".into()),
            links: vec![link("a")],
            message: "Operation not permitted".into(),
        };
        assert!(tree.may_serve("n", "a") && !tree.may_serve("n", "b") && !tree.may_serve("m", "a"));
        let adopted = LeftoverTree { pod: None, links: vec![], ..tree.clone() };
        assert!(adopted.may_serve("m", "anything"));
        let json = serde_json::to_value(&adopted).unwrap();
        assert!(json.get("pod").is_none() && json.get("links").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<LeftoverTree>(json).unwrap(), adopted);
        let reply: ApplyReply = serde_json::from_value(serde_json::json!({
            "node": "n", "version": 1, "pods": [], "capabilities": Capabilities::default(),
        }))
        .unwrap();
        assert!(reply.leftovers.is_empty(), "an agent that reports none may leave the field out");
    }
}
