//! What a window of a link that changes with time was probed under. Pure.
//!
//! The agents cut such a link's windows at its phases, a settling time inside each (the agent's
//! `measure/window.rs`), so that a window lies in one phase. A window is judged against that phase when each leg
//! of its round trips kept one impairment over the whole of it: the way out from [`MARGIN_MS`] before the window
//! to as long after it, the way back until the way out's latency later still (a probe sent at the window's end
//! crosses the other node then). The margin covers the two nodes switching at slightly different instants (their
//! clocks' skew and each switch's lateness). A window that fails this (a trace whose two directions loop at
//! different lengths, a window measured before a plan with a new schedule) is reported but not judged.

use isthmus_agent_api::Impairment;
use isthmus_agent_api::schedule::{Position, Timeline};

use crate::schedule::phase_name;

/// How far around a window each leg must have kept its impairment for the window to be judged against it.
pub const MARGIN_MS: u64 = 500;

/// One leg of a probed round trip: its link direction's own impairment and, if it changes with time, its timeline.
#[derive(Debug, Clone, Copy)]
pub struct Leg<'a> {
    pub own: &'a Impairment,
    pub timeline: Option<&'a Timeline>,
}

/// The impairments a window's round trips crossed, and the phase it was probed in (`None` before a schedule's
/// start or after a reverting one's end, where the link has its own impairment).
#[derive(Debug, Clone, PartialEq)]
pub struct PhasePath<'a> {
    pub out: &'a Impairment,
    pub back: Option<&'a Impairment>,
    pub phase: Option<String>,
}

/// The path of the window `[start_ms, end_ms)` out through `out` and back through `back`; `None` when either
/// leg changed within it (margins included).
pub fn phase_path<'a>(out: Leg<'a>, back: Option<Leg<'a>>, (start_ms, end_ms): (u64, u64)) -> Option<PhasePath<'a>> {
    let from = start_ms.saturating_sub(MARGIN_MS);
    let (out_impairment, out_phase) = steady(out, from, end_ms.saturating_add(MARGIN_MS))?;
    let fields = out_impairment.fields();
    let out_ms = (fields.latency.unwrap_or_default() + fields.jitter.unwrap_or_default()).as_millis() as u64;
    let back = match back {
        Some(leg) => Some(steady(leg, from, end_ms.saturating_add(out_ms).saturating_add(MARGIN_MS))?),
        None => None,
    };
    let phase = out_phase.or_else(|| back.as_ref().and_then(|(_, name)| name.clone()));
    Some(PhasePath { out: out_impairment, back: back.map(|(impairment, _)| impairment), phase })
}

/// The impairment `leg` kept from `from_ms` to `to_ms`, with its phase's name; `None` when it changed between.
fn steady(leg: Leg<'_>, from_ms: u64, to_ms: u64) -> Option<(&Impairment, Option<String>)> {
    let Some(timeline) = leg.timeline else { return Some((leg.own, None)) };
    let first = timeline.position(from_ms);
    if first != timeline.position(to_ms) {
        return None;
    }
    Some(match first {
        Position::In { phase, .. } => (&*timeline.phases()[phase].impairment, Some(phase_name(timeline, phase))),
        Position::Before { .. } | Position::Over { .. } => (leg.own, None),
    })
}

#[cfg(test)]
mod tests;
