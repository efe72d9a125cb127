//! What a `NetworkLink`'s status says: the operator's observations and actions, as the API server stores them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::{MAX_LABEL, MAX_MESSAGE, MAX_NAME, MAX_POD, MAX_REASON, MAX_SUMMARY, cut, cut_conditions, cut_opt};

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
    #[schemars(schema_with = "super::bounds::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `from` selector, summarized for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub from: Option<String>,
    /// The `to` side, summarized for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub to: Option<String>,
    /// The forward latency in force (with jitter), and the reverse one after a slash if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub latency: Option<String>,
    /// The loss in force, forward then reverse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub loss: Option<String>,
    /// The bandwidth in force, forward then reverse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub bandwidth: Option<String>,
    /// The round trip a request from a `from` pod should expect on top of the network's own: forward plus
    /// reverse latency (± both jitters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub expected_round_trip: Option<String>,
    /// `from` pods (and `to` pods for the reverse direction) that this link shapes: pending or running, with an IP.
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
    #[schemars(length(max = MAX_STATUS_OVERLAPS))]
    pub overlaps: Vec<OverlapStatus>,
    /// Pods this link could not shape, with the reason; at most 16 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_STATUS_FAILURES))]
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
    #[schemars(length(max = MAX_SUMMARY))]
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
    #[schemars(length(max = MAX_LABEL))]
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

impl NetworkLinkStatus {
    /// Cuts every string and list to the bound the CRD declares for it (super::bounds), so that the API server
    /// admits whatever the operator writes.
    pub fn bound(&mut self) {
        cut_conditions(&mut self.conditions);
        for summary in [
            &mut self.from,
            &mut self.to,
            &mut self.latency,
            &mut self.loss,
            &mut self.bandwidth,
            &mut self.expected_round_trip,
            &mut self.measured_summary,
        ] {
            cut_opt(summary, MAX_SUMMARY);
        }
        self.overlaps.truncate(MAX_STATUS_OVERLAPS);
        for o in &mut self.overlaps {
            cut(&mut o.link, MAX_NAME);
        }
        let omitted = self.failures.len().saturating_sub(MAX_STATUS_FAILURES) as u32;
        self.failures.truncate(MAX_STATUS_FAILURES);
        self.failures_omitted = self.failures_omitted.saturating_add(omitted);
        for f in &mut self.failures {
            cut(&mut f.pod, MAX_POD);
            cut_opt(&mut f.node, MAX_NAME);
            cut(&mut f.reason, MAX_REASON);
            cut(&mut f.message, MAX_MESSAGE);
        }
        if let Some(measured) = &mut self.measured {
            measured.bound();
        }
        if let Some(schedule) = &mut self.schedule {
            cut_opt(&mut schedule.phase, MAX_LABEL);
        }
    }
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Another NetworkLink that covers some of the same (source pod, destination) pairs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OverlapStatus {
    /// The other NetworkLink (same namespace).
    #[schemars(length(max = MAX_NAME))]
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
    #[schemars(length(max = MAX_POD))]
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_NAME))]
    pub node: Option<String>,
    /// A stable reason: `HostNetwork`, `KernelUnsupported`, `AgentUnreachable`, `DuplicateRestriction`, …
    #[schemars(length(max = MAX_REASON))]
    pub reason: String,
    /// What happened, for people.
    #[schemars(length(max = MAX_MESSAGE))]
    pub message: String,
}
