//! `spec.schedule`: a link whose impairment changes with time. Doc comments here become `kubectl explain`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::quantity::{DurationValue, PercentValue};
use super::spec::ImpairmentSpec;

/// The shortest phase (the operator's schedule works in whole milliseconds), for CEL.
macro_rules! phase_min {
    () => {
        "1ms"
    };
}

/// The most phases a schedule lists.
pub const MAX_SCHEDULE_PHASES: usize = 64;

/// How the link's impairment changes with time: exactly one of `phases`, `flap`, `ramp` and `trace`. Every node
/// carries the whole schedule out on its own clock from the link's start; the link's own impairment (`impairment`,
/// `reverse`, `profile`) is in force before the start and, with `end: Revert`, after the end.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("[has(self.phases), has(self.flap), has(self.ramp), has(self.trace)].filter(x, x).size() == 1")
    .message("set exactly one of phases, flap, ramp and trace"))]
#[x_kube(validation = Rule::new("!(has(self.start) && has(self.startAt))")
    .message("start (after the link's creation) and startAt (an instant) exclude each other")
    .field_path(".startAt"))]
#[serde(rename_all = "camelCase")]
pub struct ScheduleSpec {
    /// When the schedule begins, after the link's creation (`metadata.creationTimestamp`, whole seconds); default
    /// at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<DurationValue>,
    /// When the schedule begins, as an instant (RFC 3339, e.g. `2026-12-01T09:00:00Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Time>,
    /// What follows the last phase: `Repeat` (from the first; the default of phases, flap and trace), `Hold` (the
    /// last phase stays; the default of a ramp) or `Revert` (the link's own impairment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<ScheduleEnd>,
    /// Phases in order, each a duration and the changes to the link's impairment while it lasts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1, max = 64))]
    pub phases: Vec<PhaseSpec>,
    /// Up and down, over and over: a link that fails and recovers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flap: Option<FlapSpec>,
    /// One field moving from one value to another in equal steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampSpec>,
    /// Bandwidth replayed from a recorded trace (Mahimahi's format) held in a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ScheduleEnd {
    Repeat,
    Hold,
    Revert,
}

/// One phase of a schedule.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(concat!("duration(self.duration) >= duration('", phase_min!(), "')"))
    .message(concat!("a phase lasts at least ", phase_min!()))
    .field_path(".duration"))]
#[serde(rename_all = "camelCase")]
pub struct PhaseSpec {
    /// Shown in the status and in Events while the phase is in force; default `phase <n>` (from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub name: Option<String>,
    /// How long the phase lasts (above 0).
    pub duration: DurationValue,
    /// Changes to the `from → to` direction while the phase lasts, field by field over the link's own; on a
    /// symmetric link, to both directions. Empty or absent: the link's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impairment: Option<ImpairmentSpec>,
    /// Changes to the `to → from` direction, on a link that shapes it (not on a symmetric one: there
    /// `impairment` applies to both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse: Option<ImpairmentSpec>,
}

/// Up for `up`, down for `down`, repeated.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(concat!("duration(self.up) >= duration('", phase_min!(), "')"))
    .message(concat!("a phase lasts at least ", phase_min!()))
    .field_path(".up"))]
#[x_kube(validation = Rule::new(concat!("duration(self.down) >= duration('", phase_min!(), "')"))
    .message(concat!("a phase lasts at least ", phase_min!()))
    .field_path(".down"))]
// The agent API's MAX_JITTER_PERCENT.
#[x_kube(validation = Rule::new("!has(self.jitter) || double(self.jitter.find('^[0-9.]+')) < 90.0")
    .message("a jitter stretches a phase by less than 90%")
    .field_path(".jitter"))]
#[serde(rename_all = "camelCase")]
pub struct FlapSpec {
    /// How long the link stays up (its own impairment) each time.
    pub up: DurationValue,
    /// How long it stays down each time.
    pub down: DurationValue,
    /// What a down period does, over the link's own impairment, in every direction the link shapes; default
    /// `{loss: {percent: 100%}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_impairment: Option<ImpairmentSpec>,
    /// Random stretch of every up and down period: each lasts its duration times 1 ± up to this share (below
    /// 90 %), drawn from `seed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<PercentValue>,
    /// The jitter's seed: two links (or two runs) with one seed flap at the same instants after their start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub seed: Option<i64>,
}

/// `field` from `from` to `to` over `over`, in steps of `step`: each value holds for an equal share of `over`,
/// and `to` is reached at the end.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new(super::ramp_rules::values_in_unit("self", "from"))
    .message(super::ramp_rules::VALUES_IN_UNIT)
    .field_path(".from"))]
#[x_kube(validation = Rule::new(super::ramp_rules::values_in_unit("self", "to"))
    .message(super::ramp_rules::VALUES_IN_UNIT)
    .field_path(".to"))]
#[x_kube(validation = Rule::new(super::ramp_rules::values_in_unit("self", "step"))
    .message(super::ramp_rules::VALUES_IN_UNIT)
    .field_path(".step"))]
#[x_kube(validation = Rule::new(super::ramp_rules::step_count())
    .message(super::ramp_rules::STEP_COUNT)
    .field_path(".step"))]
#[x_kube(validation = Rule::new(super::ramp_rules::step_length())
    .message(super::ramp_rules::STEP_LENGTH)
    .field_path(".over"))]
#[serde(rename_all = "camelCase")]
pub struct RampSpec {
    pub field: RampField,
    /// The first value, in the field's unit (`10ms`, `0%`, `100Mbit`).
    #[schemars(length(min = 1, max = 32))]
    pub from: String,
    /// The last value, in the field's unit.
    #[schemars(length(min = 1, max = 32))]
    pub to: String,
    /// How long the ramp takes from `from` to `to` (above 0).
    pub over: DurationValue,
    /// How far each step moves the value, in the field's unit (above 0); the last step may be shorter.
    #[schemars(length(min = 1, max = 32))]
    pub step: String,
    /// The directions it moves in: `Both` (every direction the link shapes; the default), `Forward` or `Reverse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<RampDirection>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RampField {
    Latency,
    Jitter,
    Loss,
    Bandwidth,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RampDirection {
    Both,
    Forward,
    Reverse,
}

/// A bandwidth trace in Mahimahi's format — one line per 1,500-byte delivery opportunity, its time in ms, the
/// trace looping at its last line — replayed as one bandwidth per `window`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.uplink) || has(self.downlink)")
    .message("name the trace of at least one direction: uplink, downlink or both"))]
// The operator's MIN_TRACE_WINDOW and MAX_TRACE_WINDOW (schedule/mod.rs).
#[x_kube(validation = Rule::new("!has(self.window) || (duration(self.window) >= duration('10ms') && duration(self.window) <= duration('10s'))")
    .message("a rate window lasts from 10ms to 10s")
    .field_path(".window"))]
#[serde(rename_all = "camelCase")]
pub struct TraceSpec {
    /// The ConfigMap, in the link's namespace, that holds the traces.
    #[schemars(length(min = 1, max = 253))]
    pub config_map: String,
    /// The key of the `from → to` trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub uplink: Option<String>,
    /// The key of the `to → from` trace, on a link that shapes that direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub downlink: Option<String>,
    /// The length of each rate window, 10ms to 10s (default 100ms): the opportunities in a window, times 1,500
    /// bytes, over its length, are its bandwidth. Shorter windows follow the trace closer and change the node's
    /// queues more often (docs/networklink.md#schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationValue>,
}
