//! What a NetworkLink's own probes measured (`status.measured`) and the words of its `Conformant` condition.
//! The agents probe; the operator merges their windows and judges (docs/networklink.md#measured).

use isthmus_agent_api::measure::ProbeKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::{MAX_FIGURE, MAX_LABEL, cut_opt};

/// Per direction, what the link's probes saw over the last window of every node that probes it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredStatus {
    /// Probed from the `from` pods towards the `to` destinations: a round trip takes the forward impairment
    /// out and the reverse one back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<DirectionMeasured>,
    /// Probed from the `to` pods towards the `from` pods (only where the link has a reverse direction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse: Option<DirectionMeasured>,
}

/// One direction's measurement. Durations and percentages are written as the API writes them (`121.4ms`,
/// `0.4%`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DirectionMeasured {
    /// Median round trip of the answered probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub rtt_p50: Option<String>,
    /// 90th percentile round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub rtt_p90: Option<String>,
    /// Median round trip of the same destinations probed from the nodes themselves, without the impairment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub baseline_p50: Option<String>,
    /// What the configuration predicts: the baseline plus forward and reverse latency (and the probe's
    /// serialization at a configured bandwidth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub expected_rtt: Option<String>,
    /// Share of probes not answered within their timeout (a round trip: lost out or back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub loss: Option<String>,
    /// The 99 % confidence interval of `loss` for this many probes (Wilson score), e.g. `0.1%–1.2%`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub loss_interval: Option<String>,
    /// Probes sent in the window (from inside the pods).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub samples: u64,
    /// (source pod, destination) pairs probed, over all nodes.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs: u32,
    /// The window's length, e.g. `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FIGURE))]
    pub window: Option<String>,
    /// When the last answer arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sample: Option<Time>,
    /// How the round trips were probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// For a link that changes with time (`spec.schedule`): the phase the window was probed in, whose impairment
    /// it was judged against (docs/networklink.md#measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_LABEL))]
    pub phase: Option<String>,
}

impl MeasuredStatus {
    /// Cuts every string to the bound the CRD declares for it.
    pub fn bound(&mut self) {
        for d in [&mut self.forward, &mut self.reverse].into_iter().flatten() {
            for figure in [
                &mut d.rtt_p50,
                &mut d.rtt_p90,
                &mut d.baseline_p50,
                &mut d.expected_rtt,
                &mut d.loss,
                &mut d.loss_interval,
                &mut d.window,
            ] {
                cut_opt(figure, MAX_FIGURE);
            }
            cut_opt(&mut d.phase, MAX_LABEL);
        }
    }
}

/// How round trips were probed (the agent's [`ProbeKind`], with a schema).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Probe {
    /// ICMP echo: answered by the destination's kernel.
    IcmpEcho,
    /// TCP SYN, where ICMP got no answer: the destination's kernel answers with a SYN-ACK or a reset.
    TcpSyn,
}

impl From<ProbeKind> for Probe {
    fn from(kind: ProbeKind) -> Self {
        match kind {
            ProbeKind::IcmpEcho => Probe::IcmpEcho,
            ProbeKind::TcpSyn => Probe::TcpSyn,
        }
    }
}

/// The `Conformant` condition's reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConformanceReason {
    /// Measured round trip and loss are within tolerance of what the link asks for.
    Conformant,
    /// The round trip is longer than the tolerance allows.
    Slower,
    /// The round trip is shorter than the tolerance allows (e.g. the impairment is not in force).
    Faster,
    /// More probes are lost than the configured loss explains at 99 % confidence.
    Lossier,
    /// Fewer probes are lost than the configured loss explains at 99 % confidence.
    LessLossy,
    /// Nothing could be measured: no pair is applied, or no probe was answered.
    Unmeasurable,
    /// Measured but not judged: the link changes with time (`spec.schedule`), so a window spans phases and no one
    /// impairment predicts it.
    Scheduled,
}

impl ConformanceReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conformant => "Conformant",
            Self::Slower => "Slower",
            Self::Faster => "Faster",
            Self::Lossier => "Lossier",
            Self::LessLossy => "LessLossy",
            Self::Unmeasurable => "Unmeasurable",
            Self::Scheduled => "Scheduled",
        }
    }
}
