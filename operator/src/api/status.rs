//! What a `NetworkLink`'s status says: the operator's observations and actions, as the API server stores them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most failures listed in the status; the rest are counted in `failuresOmitted`.
pub const MAX_STATUS_FAILURES: usize = 16;
/// The most overlapping links listed in the status.
pub const MAX_STATUS_OVERLAPS: usize = 16;

/// What the operator observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkLinkStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: every pair is applied. `Degraded`: some pairs failed (see `failures`). `Overlapping`: another
    /// NetworkLink covers some of the same pairs (see `overlaps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `from` selector, summarized for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The `to` side, summarized for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The forward latency in force (with jitter), and the reverse one after a slash if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
    /// The loss in force, forward then reverse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<String>,
    /// The bandwidth in force, forward then reverse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<String>,
    /// The round trip a request from a `from` pod should expect on top of the network's own: forward plus
    /// reverse latency (± both jitters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_round_trip: Option<String>,
    /// Running `from` pods (and `to` pods for the reverse direction) that this link shapes.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub source_pods: u32,
    /// Distinct destination networks (pod IPs, Service ClusterIPs, CIDRs).
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub destinations: u32,
    /// (source pod, destination) pairs this link decides, after overlaps.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs: u32,
    /// Pairs the node agents confirmed.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs_applied: u32,
    /// Pairs the node agents could not apply.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs_failed: u32,
    /// Applied pairs that the node agents emulate themselves (the userspace datapath, on nodes without sch_netem:
    /// docs/datapaths.md); the other applied pairs go through the kernel's qdiscs.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs_emulated: u32,
    /// Applied pairs whose `queueLimit` the node's queue budget cut (docs/networklink.md#queue-bound).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 4294967295_u32))]
    pub queue_limits_capped: u32,
    /// Other NetworkLinks covering some of the same pairs, and who wins them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlaps: Vec<OverlapStatus>,
    /// Pods this link could not shape, with the reason; at most 16 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<PodFailure>,
    /// Failures beyond those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 4294967295_u32))]
    pub failures_omitted: u32,
    /// What the link's own probes measured, per direction (docs/networklink.md#measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<super::measured::MeasuredStatus>,
    /// The measured round trip and loss, forward then reverse, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_summary: Option<String>,
    /// Where `spec.schedule` stands (docs/networklink.md#schedule); absent without a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleStatus>,
}

/// Where a link's schedule stands, as the operator's clock reads it when it writes the status. The agents switch
/// phases on their own clocks; the operator refreshes this at most every few seconds, so a schedule with shorter
/// phases shows one phase in force at the time of the write.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    pub state: ScheduleState,
    /// The phase in force while `Running` or `Holding`: the name given in `spec.schedule.phases`, `up` or `down`
    /// for a flap, `step N` for a ramp, `window N` for a trace, else `phase N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// How many times the schedule has started over (0 in the first pass).
    #[serde(default)]
    pub cycle: u64,
    /// When the state or phase in force began, to the second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// When the next change is due, to the second; absent when none will come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_change: Option<Time>,
}

impl ScheduleStatus {
    /// Whether both show the same phase of the same pass (their times aside): what decides a refresh and an
    /// Event.
    pub fn same_phase(&self, other: &ScheduleStatus) -> bool {
        (self.state, &self.phase, self.cycle) == (other.state, &other.phase, other.cycle)
    }
}

/// The stage a schedule is in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ScheduleState {
    /// Before the start: the link's own impairment is in force.
    Waiting,
    /// A phase is in force and another follows.
    Running,
    /// The last phase is in force for good (`end: Hold`).
    Holding,
    /// The schedule ended and reverted to the link's own impairment (`end: Revert`).
    Over,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Another NetworkLink that covers some of the same (source pod, destination) pairs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OverlapStatus {
    /// The other NetworkLink (same namespace).
    pub link: String,
    /// Shared pairs this link wins.
    #[schemars(range(max = 4294967295_u32))]
    pub won: u32,
    /// Shared pairs the other link wins.
    #[schemars(range(max = 4294967295_u32))]
    pub lost: u32,
}

/// A pod this link could not shape.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodFailure {
    /// `namespace/name`.
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A stable reason: `HostNetwork`, `KernelUnsupported`, `AgentUnreachable`, `DuplicateRestriction`, …
    pub reason: String,
    /// What happened, for people.
    pub message: String,
}
