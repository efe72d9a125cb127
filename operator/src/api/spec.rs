//! The `NetworkLink` custom resource (`isthmus.dev/v1alpha1`). Doc comments here become `kubectl explain`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use isthmus_agent_api::MAX_BUCKET_TIME;
use isthmus_agent_api::impairment::MAX_JITTER;

use super::profile::{PresetDirection, Profile};
use super::quantity::{BurstValue, CidrValue, DurationValue, PercentValue, RateValue};
use super::schedule::ScheduleSpec;
use super::status::NetworkLinkStatus;
use crate::unit_syntax;

/// Why a burst is refused at admission: [`isthmus_agent_api::ImpairmentFields`] refuses it for the same reason.
const BURST_TOO_DEEP: &str = "burst takes longer than 274s to send at the bandwidth, the most the kernel's token bucket holds: a smaller burst or a higher bandwidth";

/// CEL: when `has_rate` holds, the `burst` of the impairment at `parent` (a CEL path) is sent within
/// [`MAX_BUCKET_TIME`] at `rate_bits` (a CEL double of bits per second).
fn burst_fits(parent: &str, rate_bits: &str, has_rate: &str) -> String {
    format!(
        "!has({parent}.burst) || !({has_rate}) || {bytes} * 8.0 <= {seconds}.0 * {rate_bits}",
        bytes = unit_syntax::cel_size_bytes(&format!("{parent}.burst")),
        seconds = MAX_BUCKET_TIME.as_secs(),
    )
}

/// CEL at the spec's level: a burst in `direction` (`impairment` or `reverse`) that takes its bandwidth from the
/// profile (`preset` gives that direction's) fits the profile's rate.
fn burst_fits_profile(direction: &str, preset: fn(Profile) -> PresetDirection) -> String {
    let rates: Vec<String> = Profile::ALL
        .iter()
        .map(|&p| {
            let name = serde_json::to_value(p).expect("a profile serializes");
            format!("{name}: {:.1}", preset(p).rate_bps as f64).replace('"', "'")
        })
        .collect();
    let rate = format!("{{{}}}[self.profile]", rates.join(", "));
    let has_rate = format!("has(self.profile) && !has(self.{direction}.bandwidth)");
    format!("!has(self.{direction}) || ({})", burst_fits(&format!("self.{direction}"), &rate, &has_rate))
}

/// Why a schedule may not change the `to → from` direction.
macro_rules! one_way {
    () => {
        "the link does not shape to → from (it is one-way)"
    };
}
const ONE_WAY: &str = one_way!();

/// The reverse direction is in force (CEL): explicit `reverse`, `symmetric`, or a profile's downlink.
macro_rules! cel_reverse_in_force {
    () => {
        "(has(self.reverse) || (has(self.symmetric) && self.symmetric) || (has(self.profile) && !(has(self.oneWay) && self.oneWay)))"
    };
}

/// [`cel_reverse_in_force`] for code outside the attributes.
pub const CEL_REVERSE_IN_FORCE: &str = cel_reverse_in_force!();

/// How the network behaves between two groups of pods: `from` pods sending to `to` destinations get
/// `impairment` (one way); the other direction gets `reverse`, the same impairment (`symmetric`), or a
/// profile's downlink. Latency is one way: a request and its answer see the forward plus the reverse latency
/// (see `status.expectedRoundTrip`).
///
/// A NetworkLink changes only the egress of pods in its own namespace: the `from` pods, and for the reverse
/// direction the `to` pods, which must then be in the link's namespace too.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[allow(clippy::duplicated_attributes, reason = "each printcolumn names its own type_")]
#[kube(
    group = "isthmus.dev",
    version = "v1alpha1",
    kind = "NetworkLink",
    plural = "networklinks",
    singular = "networklink",
    namespaced,
    shortname = "nl",
    shortname = "nlink",
    category = "isthmus",
    status = "NetworkLinkStatus",
    derive = "PartialEq",
    printcolumn(name = "From", type_ = "string", json_path = ".status.from"),
    printcolumn(name = "To", type_ = "string", json_path = ".status.to"),
    printcolumn(name = "Latency", type_ = "string", json_path = ".status.latency"),
    printcolumn(name = "Loss", type_ = "string", json_path = ".status.loss"),
    printcolumn(name = "Bandwidth", type_ = "string", json_path = ".status.bandwidth"),
    printcolumn(name = "Pairs", type_ = "integer", json_path = ".status.pairs"),
    printcolumn(name = "Measured", type_ = "string", json_path = ".status.measuredSummary"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("has(self.impairment) || has(self.profile)")
    .message("set impairment, a profile, or both")
    .field_path(".impairment"))]
#[x_kube(validation = Rule::new("!(has(self.reverse) && has(self.symmetric) && self.symmetric)")
    .message("reverse and symmetric exclude each other: symmetric copies impairment to the reverse direction, reverse sets it explicitly")
    .field_path(".symmetric"))]
#[x_kube(validation = Rule::new("!(has(self.profile) && has(self.symmetric) && self.symmetric)")
    .message("a profile already sets the reverse direction (its downlink); override it with reverse instead of symmetric")
    .field_path(".symmetric"))]
#[x_kube(validation = Rule::new("!(has(self.oneWay) && self.oneWay && (has(self.reverse) || (has(self.symmetric) && self.symmetric)))")
    .message("oneWay excludes reverse and symmetric")
    .field_path(".oneWay"))]
#[x_kube(validation = Rule::new(concat!("!has(self.to.namespaceSelector) || !", cel_reverse_in_force!()))
    .message("the reverse direction (reverse, symmetric, or a profile's downlink) changes the egress of the to pods, which a NetworkLink may do only in its own namespace: remove to.namespaceSelector, set oneWay: true, or create a second NetworkLink in the other namespace")
    .field_path(".to.namespaceSelector"))]
#[x_kube(validation = Rule::new(concat!("has(self.to.podSelector) || !", cel_reverse_in_force!()))
    .message("the reverse direction (reverse, symmetric, or a profile's downlink) shapes the egress of the to pods, but to has no podSelector: set oneWay: true or select pods")
    .field_path(".to.podSelector"))]
#[x_kube(validation = Rule::new("!has(self.impairment) || !has(self.impairment.jitter) || duration(self.impairment.jitter) == duration('0s') || (has(self.impairment.latency) ? duration(self.impairment.latency) > duration('0s') : has(self.profile))")
    .message("jitter varies the latency, so it needs a latency above 0 (or a profile)")
    .field_path(".impairment.jitter"))]
#[x_kube(validation = Rule::new("!has(self.reverse) || !has(self.reverse.jitter) || duration(self.reverse.jitter) == duration('0s') || (has(self.reverse.latency) ? duration(self.reverse.latency) > duration('0s') : has(self.profile))")
    .message("jitter varies the latency, so it needs a latency above 0 (or a profile)")
    .field_path(".reverse.jitter"))]
#[x_kube(validation = Rule::new("!has(self.impairment) || !has(self.impairment.reorder) || (has(self.impairment.latency) ? duration(self.impairment.latency) > duration('0s') : has(self.profile))")
    .message("reordering sends some packets without the delay, so it needs a latency above 0 (or a profile)")
    .field_path(".impairment.reorder"))]
#[x_kube(validation = Rule::new("!has(self.reverse) || !has(self.reverse.reorder) || (has(self.reverse.latency) ? duration(self.reverse.latency) > duration('0s') : has(self.profile))")
    .message("reordering sends some packets without the delay, so it needs a latency above 0 (or a profile)")
    .field_path(".reverse.reorder"))]
#[x_kube(validation = Rule::new("!has(self.impairment) || !has(self.impairment.burst) || has(self.impairment.bandwidth) || has(self.profile)")
    .message("burst is the token bucket of a bandwidth limit, so it needs bandwidth (or a profile)")
    .field_path(".impairment.burst"))]
#[x_kube(validation = Rule::new(burst_fits_profile("impairment", Profile::uplink))
    .message(BURST_TOO_DEEP)
    .field_path(".impairment.burst"))]
#[x_kube(validation = Rule::new(burst_fits_profile("reverse", Profile::downlink))
    .message(BURST_TOO_DEEP)
    .field_path(".reverse.burst"))]
#[x_kube(validation = Rule::new("!has(self.reverse) || !has(self.reverse.burst) || has(self.reverse.bandwidth) || has(self.profile)")
    .message("burst is the token bucket of a bandwidth limit, so it needs bandwidth (or a profile)")
    .field_path(".reverse.burst"))]
#[x_kube(validation = Rule::new(concat!("!has(self.schedule) || !has(self.schedule.trace) || !has(self.schedule.trace.downlink) || ", cel_reverse_in_force!()))
    .message(ONE_WAY)
    .field_path(".schedule.trace.downlink"))]
#[x_kube(validation = Rule::new(concat!("!has(self.schedule) || !has(self.schedule.ramp) || !has(self.schedule.ramp.direction) || self.schedule.ramp.direction != 'Reverse' || ", cel_reverse_in_force!()))
    .message(ONE_WAY)
    .field_path(".schedule.ramp.direction"))]
#[x_kube(validation = Rule::new(concat!("!has(self.schedule) || !has(self.schedule.phases) || self.schedule.phases.all(p, !has(p.reverse)) || ", cel_reverse_in_force!()))
    .message(concat!("a phase's reverse: ", one_way!()))
    .field_path(".schedule.phases"))]
#[x_kube(validation = Rule::new("!has(self.schedule) || !has(self.schedule.phases) || !(has(self.symmetric) && self.symmetric) || self.schedule.phases.all(p, !has(p.reverse))")
    .message("a phase's reverse: on a symmetric link impairment changes both directions; leave reverse out")
    .field_path(".schedule.phases"))]
#[x_kube(validation = Rule::new(super::ramp_rules::latency_ramp_keeps_a_latency())
    .message(super::ramp_rules::LATENCY_RAMP)
    .field_path(".schedule.ramp"))]
#[x_kube(validation = Rule::new(super::ramp_rules::jitter_ramp_fits())
    .message(super::ramp_rules::JITTER_RAMP)
    .field_path(".schedule.ramp"))]
#[x_kube(validation = Rule::new(super::ramp_rules::bandwidth_ramp_fits_the_burst())
    .message(super::ramp_rules::BANDWIDTH_RAMP)
    .field_path(".schedule.ramp"))]
#[serde(rename_all = "camelCase")]
pub struct NetworkLinkSpec {
    /// The sending pods, in this NetworkLink's namespace. Their egress towards `to` is impaired.
    pub from: FromSpec,
    /// The receiving side: pods (in this namespace or in namespaces chosen by `namespaceSelector`), the
    /// Services in front of them, and external networks.
    pub to: ToSpec,
    /// What happens to packets from `from` to `to` (one way). With a `profile`, fields set here override the
    /// profile's uplink. An empty impairment (`{}`) claims the pairs without impairing them, which exempts
    /// them from lower-priority links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impairment: Option<ImpairmentSpec>,
    /// What happens to packets from the `to` pods back to the `from` pods, when it differs from `impairment`
    /// (asymmetric links such as satellite or ADSL). With a `profile`, fields set here override the profile's
    /// downlink. Only allowed when the `to` pods are in this namespace (no `to.namespaceSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse: Option<ImpairmentSpec>,
    /// Apply `impairment` in both directions. Excludes `reverse` and `profile`; only allowed when the `to`
    /// pods are in this namespace.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub symmetric: bool,
    /// Impair only `from → to`, dropping a profile's downlink; needed with a profile when the `to` pods are in
    /// other namespaces (their egress belongs to those namespaces).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub one_way: bool,
    /// A preset access network (from the dummynet table): the `from` pods are the subscribers, `from → to` gets
    /// the uplink and `to → from` the downlink (unless `oneWay`). Explicit fields override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// When several NetworkLinks cover the same (source pod, destination) pair, the highest priority wins; on
    /// a tie the older link (creationTimestamp, then name) wins. Both report the overlap in their status.
    #[serde(default)]
    #[schemars(range(min = -2147483648, max = 2147483647))]
    pub priority: i32,
    /// Whether the node agents probe this link's pairs and report what they measure in `status.measured` and
    /// the `Conformant` condition (default `true`). Probing can also be switched off for the whole install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
    /// How the impairment changes with time: phases, a flap, a ramp or a replayed trace
    /// (docs/networklink.md#schedule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleSpec>,
}

impl NetworkLinkSpec {
    /// The plainest link: pods matching `from` send to pods matching `to` (in the link's namespace, Services
    /// included) with `impairment`, one way, every other field at its default. What programs that build links
    /// (test suites, benchmarks) start from.
    pub fn between(from: LabelSelector, to: LabelSelector, impairment: ImpairmentSpec) -> NetworkLinkSpec {
        NetworkLinkSpec {
            from: FromSpec { pod_selector: from },
            to: ToSpec {
                pod_selector: Some(to),
                namespace_selector: None,
                cidrs: Vec::new(),
                services: ServiceInclusion::Matching,
            },
            impairment: Some(impairment),
            reverse: None,
            symmetric: false,
            one_way: false,
            profile: None,
            priority: 0,
            verify: None,
            schedule: None,
        }
    }
}

/// The sending pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FromSpec {
    /// Pods in this NetworkLink's namespace; `{}` selects all of them. Host-network pods are never impaired
    /// (they share the node's network); they are listed in the status instead.
    #[schemars(schema_with = "super::selector::schema")]
    pub pod_selector: LabelSelector,
}

/// The destinations.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.podSelector) || (has(self.cidrs) && size(self.cidrs) > 0)")
    .message("to needs a podSelector, cidrs, or both"))]
#[x_kube(validation = Rule::new("!has(self.namespaceSelector) || has(self.podSelector)")
    .message("namespaceSelector chooses where podSelector looks, so it needs a podSelector")
    .field_path(".namespaceSelector"))]
#[serde(rename_all = "camelCase")]
pub struct ToSpec {
    /// Destination pods; `{}` selects all pods of the chosen namespaces. Each pod IP (IPv4 and IPv6) becomes a
    /// destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::selector::optional_schema")]
    pub pod_selector: Option<LabelSelector>,
    /// Namespaces in which `podSelector` looks; absent means this NetworkLink's namespace only. Not allowed
    /// together with a reverse direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::selector::optional_schema")]
    pub namespace_selector: Option<LabelSelector>,
    /// External destinations by network, e.g. `203.0.113.0/24` or `2001:db8::/32`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub cidrs: Vec<CidrValue>,
    /// Whether Service ClusterIPs are destinations too. Traffic to a Service leaves the pod addressed to the
    /// ClusterIP, so a pod-IP destination alone would miss it. `Matching` (the default) adds the ClusterIPs of
    /// every Service in a destination namespace whose selector picks at least one running pod and only
    /// destination pods; a Service that also fronts other pods is left out, since impairing it would impair
    /// those too. `Ignore` adds none.
    #[serde(default)]
    pub services: ServiceInclusion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum ServiceInclusion {
    /// Services whose selected running pods are all destination pods.
    #[default]
    Matching,
    /// No Service ClusterIPs.
    Ignore,
}

/// One direction of a link. Every field is optional; unset fields leave that aspect unimpaired (or take a
/// profile's value).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.jitterCorrelation) || (has(self.jitter) && duration(self.jitter) > duration('0s'))")
    .message("jitterCorrelation needs a jitter above 0")
    .field_path(".jitterCorrelation"))]
#[x_kube(validation = Rule::new(format!("!has(self.jitter) || duration(self.jitter) <= duration('{}ns')", MAX_JITTER.as_nanos()))
    .message("must be at most 2.147483647s, the widest jitter the kernel's netem applies (31 bits of nanoseconds)")
    .field_path(".jitter"))]
#[x_kube(validation = Rule::new(burst_fits("self", &unit_syntax::cel_rate_bits("self.bandwidth"), "has(self.bandwidth)"))
    .message(BURST_TOO_DEEP)
    .field_path(".burst"))]
#[serde(rename_all = "camelCase")]
pub struct ImpairmentSpec {
    /// One-way delay added to every packet, e.g. `120ms`, `1.5s`, `500us`. A round trip sees the forward
    /// plus the reverse latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<DurationValue>,
    /// Random variation of the latency, ± this much (uniform). Jitter reorders packets whose delays cross.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<DurationValue>,
    /// How much each packet's jitter depends on the previous packet's, e.g. `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_correlation: Option<PercentValue>,
    /// Packet loss: random (`percent`, optional `correlation`) or bursty (`gilbertElliott`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<LossSpec>,
    /// Packets sent twice, e.g. `{percent: 1%}`. Some kernels refuse a duplicating netem next to other
    /// netems on the same pod; the status then names the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<CorrelatedSpec>,
    /// Packets with a flipped bit, e.g. `{percent: 0.1%}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrupt: Option<CorrelatedSpec>,
    /// Packets sent at once instead of after the latency, so they overtake others; needs a latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reorder: Option<ReorderSpec>,
    /// Bandwidth in bits per second: `100Mbit`, `1.5Gbit`, `64kbit` (bit, kbit, Mbit, Gbit; `mbps` is refused
    /// as ambiguous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<RateValue>,
    /// Token bucket size: how much may leave at line rate after an idle period, e.g. `32KiB`; needs a
    /// bandwidth. Derived from the bandwidth when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstValue>,
    /// Packets queued per destination before tail drop, at most 1,000,000. Derived from the bandwidth-delay
    /// product when absent, so high-rate, high-latency links are not silently capped by a short queue. Either
    /// way the node's agent holds every queue to its byte budgets (per destination and per pod) and reports a
    /// `queueLimit` it cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = isthmus_agent_api::MAX_QUEUE_LIMIT_PACKETS))]
    pub queue_limit: Option<u32>,
}

/// A probability with correlation to the previous packet.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CorrelatedSpec {
    /// Probability per packet, e.g. `0.1%`.
    pub percent: PercentValue,
    /// How much each decision depends on the previous one, e.g. `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation: Option<PercentValue>,
}

/// Packet loss, random or bursty.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.percent) != has(self.gilbertElliott)")
    .message("set either percent (random loss) or gilbertElliott (bursty loss)"))]
#[x_kube(validation = Rule::new("!has(self.correlation) || has(self.percent)")
    .message("correlation applies to random loss (percent)")
    .field_path(".correlation"))]
#[serde(rename_all = "camelCase")]
pub struct LossSpec {
    /// Random loss probability per packet, e.g. `0.1%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<PercentValue>,
    /// How much each loss decision depends on the previous one, e.g. `25%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation: Option<PercentValue>,
    /// Bursty loss with the Gilbert-Elliott two-state model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gilbert_elliott: Option<GilbertElliottSpec>,
}

/// The Gilbert-Elliott model: a good and a bad state with their own loss probabilities.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GilbertElliottSpec {
    /// Probability of moving from the good to the bad state, per packet.
    pub p: PercentValue,
    /// Probability of moving from the bad back to the good state, per packet (mean burst length is 1/r).
    pub r: PercentValue,
    /// Loss probability in the bad state; `100%` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_in_bad: Option<PercentValue>,
    /// Loss probability in the good state; `0%` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_in_good: Option<PercentValue>,
}

/// Reordering.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.gap) || !self.percent.matches('^[0.]*%$')")
    .message("gap needs a reorder percent above 0%")
    .field_path(".gap"))]
#[serde(rename_all = "camelCase")]
pub struct ReorderSpec {
    /// Share of packets sent immediately, e.g. `25%`.
    pub percent: PercentValue,
    /// How much each decision depends on the previous one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation: Option<PercentValue>,
    /// With a gap of N, only every Nth packet may be reordered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4294967295_u32))]
    pub gap: Option<u32>,
}
