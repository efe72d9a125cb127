//! The verdict on one link direction: the merged windows against what the configuration predicts
//! (`expect.rs`), as `status.measured`'s numbers and the `Conformant` condition's reason and message. Pure.

use std::time::Duration;

use isthmus_agent_api::Direction;
use isthmus_agent_api::measure::ProbeKind;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::expect::{PathNoise, RoundTrip, rtt_tolerance, wilson_99};
use super::merge::Merged;
use crate::api::format_duration;
use crate::api::measured::{ConformanceReason, DirectionMeasured};

/// What the judge needs besides the windows.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub path: RoundTrip<'a>,
    /// The direction's destinations are IPv6 (the probe is 20 bytes longer).
    pub ipv6: bool,
    /// At least one pair of the direction is applied by its node's agent.
    pub applied: bool,
}

/// One direction's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub reason: ConformanceReason,
    pub message: String,
    /// `None` when no window could be used.
    pub measured: Option<DirectionMeasured>,
    /// The configured RTT without the baseline, for the probe used (ICMP echo when none was).
    pub expected_added_rtt: Duration,
    pub expected_loss: f64,
}

impl Verdict {
    /// Conformant or not; `None` when unmeasurable.
    pub fn conformant(&self) -> Option<bool> {
        match self.reason {
            ConformanceReason::Unmeasurable | ConformanceReason::Scheduled => None,
            r => Some(r == ConformanceReason::Conformant),
        }
    }
}

/// The verdict on a direction of a link that changes with time whose last window could not be placed in one
/// phase (`phase.rs`): what was measured stays, the judgment against the link's own impairment goes. Nothing
/// measured stays `Unmeasurable`.
pub fn unjudged_scheduled(v: Verdict) -> Verdict {
    if v.reason == ConformanceReason::Unmeasurable {
        return v;
    }
    let message = "not judged: the link changes with time (spec.schedule) and its last window does not lie in one \
                   phase of both directions (phases shorter than a few seconds leave none that does)";
    Verdict { reason: ConformanceReason::Scheduled, message: message.into(), ..v }
}

/// Judges one direction from its merged windows (`None`: no node reported it).
pub fn judge(input: Judged<'_>, merged: Option<&Merged>) -> Verdict {
    let probe = merged.and_then(|m| m.probe).unwrap_or(ProbeKind::IcmpEcho);
    let added = input.path.added_rtt(probe, input.ipv6);
    let expected_loss = input.path.expected_loss();
    let verdict = |reason, message: String, measured| Verdict {
        reason,
        message,
        measured,
        expected_added_rtt: added,
        expected_loss,
    };
    let unmeasurable = |message: String, measured| verdict(ConformanceReason::Unmeasurable, message, measured);
    if !input.applied {
        return unmeasurable("no pair of this direction is applied, so none is probed".into(), None);
    }
    let Some(m) = merged.filter(|m| m.nodes > 0) else {
        let message = match merged {
            Some(m) if m.unmeasurable_nodes > 0 => {
                let why = m.unmeasurable.as_ref().map(|u| format!("{:?}: {}", u.reason, u.message)).unwrap_or_default();
                format!("the agents cannot measure this direction ({why})")
            }
            Some(m) if m.stale_nodes > 0 => {
                format!("the last windows of {} node(s) are stale: their agents have not reported since", m.stale_nodes)
            }
            _ => "no agent has reported a window for this direction yet".into(),
        };
        return unmeasurable(message, None);
    };
    let mut measured = measured_fields(m, probe);
    let (sent, answered) = (m.impaired.sent, m.impaired.answered.min(m.impaired.sent));
    if sent == 0 {
        return unmeasurable("no probe was sent in the last window".into(), Some(measured));
    }
    let (low, high) = wilson_99(sent - answered, sent).expect("sent > 0");
    let loss_ok = (low..=high).contains(&expected_loss);
    let loss_text = format!(
        "loss {} (99% interval {}–{}), expected {}",
        percent(1.0 - answered as f64 / sent as f64),
        percent(low),
        percent(high),
        percent(expected_loss)
    );
    let tail = format!("; {sent} probes over {} pairs in {}", m.pairs, format_duration(m.window));
    let Some(p50) = m.impaired.rtt.quantile(0.5) else {
        // Nothing came back: only the loss can be judged, and it conforms only where everything should be lost.
        return if loss_ok {
            verdict(ConformanceReason::Conformant, format!("{loss_text}{tail}"), Some(measured))
        } else {
            unmeasurable(format!("no probe was answered: {loss_text}{tail}"), Some(measured))
        };
    };
    let Some(baseline) = m.baseline.rtt.quantile(0.5) else {
        return unmeasurable(
            format!("the unimpaired baseline got no answer, so no RTT can be expected{tail}"),
            Some(measured),
        );
    };
    let expected = baseline + added;
    measured.expected_rtt = Some(rtt(expected));
    let noise = PathNoise {
        spread: m
            .baseline
            .rtt
            .quantile(0.9)
            .unwrap_or(baseline)
            .saturating_sub(m.baseline.rtt.quantile(0.1).unwrap_or(baseline)),
        answered: m.baseline.answered,
    };
    let tolerance = rtt_tolerance(input.path.widest_jitter(), answered, expected, noise);
    let rtt_text = format!(
        "round trip p50 {}, expected {} ± {} (baseline {} + configured {})",
        rtt(p50),
        rtt(expected),
        rtt(tolerance),
        rtt(baseline),
        rtt(added)
    );
    let reason = if p50 > expected + tolerance {
        ConformanceReason::Slower
    } else if p50 + tolerance < expected {
        ConformanceReason::Faster
    } else if expected_loss < low {
        ConformanceReason::Lossier
    } else if expected_loss > high {
        ConformanceReason::LessLossy
    } else {
        ConformanceReason::Conformant
    };
    verdict(reason, format!("{rtt_text}; {loss_text}{tail}"), Some(measured))
}

fn measured_fields(m: &Merged, probe: ProbeKind) -> DirectionMeasured {
    let (sent, answered) = (m.impaired.sent, m.impaired.answered.min(m.impaired.sent));
    let interval = wilson_99(sent - answered, sent);
    DirectionMeasured {
        rtt_p50: m.impaired.rtt.quantile(0.5).map(rtt),
        rtt_p90: m.impaired.rtt.quantile(0.9).map(rtt),
        baseline_p50: m.baseline.rtt.quantile(0.5).map(rtt),
        expected_rtt: None,
        loss: (sent > 0).then(|| percent(1.0 - answered as f64 / sent as f64)),
        loss_interval: interval.map(|(lo, hi)| format!("{}–{}", percent(lo), percent(hi))),
        samples: sent,
        pairs: m.pairs,
        window: (!m.window.is_zero()).then(|| format_duration(m.window)),
        last_sample: m
            .last_answer_ms
            .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64).ok())
            .map(|t| Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).expect("in range"))),
        probe: Some(probe.into()),
        phase: None,
    }
}

/// An RTT to four significant digits: the histogram reads back within 1 %, so more digits would be noise (and
/// would make the status change with every window).
pub fn rtt(d: Duration) -> String {
    format_duration(significant(d, 4))
}

/// `d` rounded to `digits` significant digits.
fn significant(d: Duration, digits: u32) -> Duration {
    let ns = d.as_nanos();
    let width = ns.checked_ilog10().map_or(0, |l| l + 1);
    if width <= digits {
        return d;
    }
    let unit = 10u128.pow(width - digits);
    Duration::from_nanos(((ns + unit / 2) / unit * unit) as u64)
}

/// A ratio as a percentage with at most two decimals: `0.4%`, `12.25%`, `0%`.
pub fn percent(ratio: f64) -> String {
    let s = format!("{:.2}", ratio * 100.0);
    format!("{}%", s.trim_end_matches('0').trim_end_matches('.'))
}

/// The `Conformant` condition over the link's directions (forward first): the first direction that conforms
/// not, else `Unmeasurable` when a direction could not be judged, else `Conformant`.
pub fn overall(verdicts: &[(Direction, &Verdict)]) -> (ConformanceReason, String) {
    let label = |d: Direction| match d {
        Direction::Forward => "forward",
        Direction::Reverse => "reverse",
    };
    let pick = verdicts
        .iter()
        .find(|(_, v)| v.conformant() == Some(false))
        .or_else(|| verdicts.iter().find(|(_, v)| v.conformant().is_none()))
        .or(verdicts.first());
    let Some((_, chosen)) = pick else {
        return (ConformanceReason::Unmeasurable, "the link has no direction to probe".into());
    };
    let message = if verdicts.len() == 1 {
        verdicts[0].1.message.clone()
    } else {
        verdicts.iter().map(|(d, v)| format!("{}: {}", label(*d), v.message)).collect::<Vec<_>>().join("; ")
    };
    (chosen.reason, message)
}

/// `kubectl get`'s MEASURED column: each direction's p50 (in ms, three significant digits) and loss, forward then reverse: `121ms
/// 0.4%`, `121ms 0.4%/80.2ms 0%`; `-` for a direction without a measurement.
pub fn summary(forward: Option<&DirectionMeasured>, reverse: Option<Option<&DirectionMeasured>>) -> Option<String> {
    let one = |m: Option<&DirectionMeasured>| match m {
        Some(DirectionMeasured { rtt_p50: Some(p50), loss: Some(loss), .. }) => {
            let d = significant(crate::unit_syntax::parse_duration(p50).unwrap_or_default(), 3);
            format!("{}ms {loss}", trim_number(d.as_secs_f64() * 1e3))
        }
        Some(DirectionMeasured { loss: Some(loss), .. }) => format!("- {loss}"),
        _ => "-".into(),
    };
    let text = match reverse {
        None => one(forward),
        Some(r) => format!("{}/{}", one(forward), one(r)),
    };
    (forward.is_some() || reverse.flatten().is_some()).then_some(text)
}

fn trim_number(v: f64) -> String {
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}
