//! Time as part of a link: one direction's [`Timeline`] says which impairment is in force at any instant.
//!
//! Pure. The operator turns a link's schedule, flap, ramp or trace into a timeline of phases and sends it once,
//! in the plan; every agent evaluates it against its own clock. So no plan travels per step, every node switches
//! at the same instants (give or take the nodes' clock skew), and an agent that restarts mid-schedule finds the
//! right phase from the time alone. Instants are Unix milliseconds.
//!
//! Phase `i` of cycle `k` lasts its duration, stretched by the timeline's jitter when it has one: a factor
//! `1 + percent · u` with `u` in [-1, 1) drawn from the seed, the cycle and the phase by a counter-based
//! generator, so two runs with one seed flap identically and any instant can be evaluated without the ones
//! before it having been.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Impairment, Percent};

/// The most phases one timeline holds: an hour of one-second trace windows, six minutes of 100 ms ones.
pub const MAX_PHASES: usize = 3_600;
/// The longest phase: a year; beyond that a schedule is not a schedule.
pub const MAX_PHASE_MS: u64 = 366 * 24 * 3_600 * 1_000;
/// A jitter stretches a phase by less than this share of its duration, so that none is stretched to nothing.
pub const MAX_JITTER_PERCENT: f64 = 90.0;

/// Why a timeline was refused; `field` is the path inside the timeline (`phases[2].durationMs`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ScheduleError {
    pub field: String,
    pub reason: String,
}

impl ScheduleError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ScheduleError { field: field.into(), reason: reason.into() }
    }
}

/// One phase: how long it lasts and the impairment in force meanwhile (the link's own, with the phase's changes
/// already applied by the operator).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Phase {
    pub duration_ms: u64,
    pub impairment: Arc<Impairment>,
    /// For status and Events: `up`, `down`, the user's phase name, `step 3`, `window 12`.
    #[serde(default)]
    pub name: String,
}

/// What follows the last phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum End {
    /// The first phase again, for ever.
    Repeat,
    /// The last phase stays.
    Hold,
    /// The link's own impairment, for good.
    Revert,
}

/// Every phase's duration stretched by `1 + percent · u`, `u` uniform in [-1, 1) from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Jitter {
    pub percent: Percent,
    pub seed: u64,
}

/// A timeline as written on the wire, not yet checked: what becomes a [`Timeline`] through `Timeline::try_from`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimelineFields {
    /// When the first phase begins; before it the link has its own impairment.
    pub start_unix_ms: u64,
    pub phases: Vec<Phase>,
    pub end: End,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<Jitter>,
}

/// A [`TimelineFields`] that passed the checks: at least one phase and at most [`MAX_PHASES`], each lasting at
/// least a millisecond and at most [`MAX_PHASE_MS`], a jitter under [`MAX_JITTER_PERCENT`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "TimelineFields", into = "TimelineFields")]
pub struct Timeline(TimelineFields);

impl TryFrom<TimelineFields> for Timeline {
    type Error = ScheduleError;

    fn try_from(fields: TimelineFields) -> Result<Self, ScheduleError> {
        if fields.phases.is_empty() {
            return Err(ScheduleError::new("phases", "a timeline needs at least one phase"));
        }
        if fields.phases.len() > MAX_PHASES {
            return Err(ScheduleError::new("phases", format!("{} phases: at most {MAX_PHASES}", fields.phases.len())));
        }
        for (i, phase) in fields.phases.iter().enumerate() {
            if phase.duration_ms == 0 || phase.duration_ms > MAX_PHASE_MS {
                return Err(ScheduleError::new(
                    format!("phases[{i}].durationMs"),
                    format!("{} ms: a phase lasts from 1 ms to {MAX_PHASE_MS} ms", phase.duration_ms),
                ));
            }
        }
        if let Some(j) = fields.jitter
            && j.percent.value() >= MAX_JITTER_PERCENT
        {
            return Err(ScheduleError::new(
                "jitter.percent",
                format!("{}%: a jitter stretches a phase by less than {MAX_JITTER_PERCENT}%", j.percent.value()),
            ));
        }
        Ok(Timeline(fields))
    }
}

impl From<Timeline> for TimelineFields {
    fn from(timeline: Timeline) -> Self {
        timeline.0
    }
}

/// Where a timeline stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Before the first phase: the link's own impairment until `next_ms`.
    Before { next_ms: u64 },
    /// In `phase` of `cycle` (always 0 unless the timeline repeats), begun at `since_ms`; the next change comes
    /// at `next_ms`, or never (the last phase, held).
    In { cycle: u64, phase: usize, since_ms: u64, next_ms: Option<u64> },
    /// A timeline that reverts, over since `since_ms`: the link's own impairment for good.
    Over { since_ms: u64 },
}

impl Position {
    /// The instant of the next change, if one is to come.
    pub fn next_ms(&self) -> Option<u64> {
        match *self {
            Position::Before { next_ms } => Some(next_ms),
            Position::In { next_ms, .. } => next_ms,
            Position::Over { .. } => None,
        }
    }
}

impl Timeline {
    pub fn fields(&self) -> &TimelineFields {
        &self.0
    }

    pub fn phases(&self) -> &[Phase] {
        &self.0.phases
    }

    /// How long phase `phase` of cycle `cycle` lasts, jitter included; at least 1 ms.
    pub fn duration_ms(&self, cycle: u64, phase: usize) -> u64 {
        let base = self.0.phases[phase].duration_ms;
        let Some(jitter) = self.0.jitter else { return base };
        let u = unit(jitter.seed, cycle, phase);
        let stretched = base as f64 * (1.0 + jitter.percent.value() / 100.0 * u);
        (stretched.round() as u64).max(1)
    }

    /// Where the timeline stands at `now_ms`, evaluated from its start (see [`Cursor`] for a clock that moves).
    pub fn position(&self, now_ms: u64) -> Position {
        Cursor::default().advance(self, now_ms)
    }

    /// The impairment in force at `position`: a phase's, or `own` (the link's) before the first phase and after
    /// a reverting timeline's last.
    pub fn impairment<'a>(&'a self, position: &Position, own: &'a Arc<Impairment>) -> &'a Arc<Impairment> {
        match *position {
            Position::In { phase, .. } => &self.0.phases[phase].impairment,
            Position::Before { .. } | Position::Over { .. } => own,
        }
    }

    /// One cycle's length without jitter.
    fn period_ms(&self) -> u64 {
        self.0.phases.iter().map(|p| p.duration_ms).fold(0, u64::saturating_add)
    }
}

/// A timeline's position kept between evaluations at growing instants, so that a jittered timeline that has run
/// for a long time is not walked from its start at every step. A cursor belongs to one timeline: a changed
/// timeline gets a fresh one. Asked about an earlier instant than the last, it starts over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// None until the first phase has begun.
    at: Option<(u64, usize, u64)>,
}

impl Cursor {
    pub fn advance(&mut self, timeline: &Timeline, now_ms: u64) -> Position {
        let fields = &timeline.0;
        let n = fields.phases.len();
        if now_ms < fields.start_unix_ms {
            *self = Cursor::default();
            return Position::Before { next_ms: fields.start_unix_ms };
        }
        let (mut cycle, mut phase, mut since) = match self.at {
            Some(at @ (_, _, since)) if since <= now_ms => at,
            _ => (0, 0, fields.start_unix_ms),
        };
        let position = loop {
            if phase + 1 == n && fields.end == End::Hold {
                break Position::In { cycle, phase, since_ms: since, next_ms: None };
            }
            let end = since.saturating_add(timeline.duration_ms(cycle, phase));
            if now_ms < end {
                break Position::In { cycle, phase, since_ms: since, next_ms: Some(end) };
            }
            if phase + 1 < n {
                (phase, since) = (phase + 1, end);
                continue;
            }
            match fields.end {
                End::Hold => unreachable!("a held last phase has no end"),
                End::Revert => break Position::Over { since_ms: end },
                End::Repeat => {
                    (cycle, phase, since) = (cycle + 1, 0, end);
                    if fields.jitter.is_none() {
                        // Whole cycles at once: without jitter they all last one period.
                        let period = timeline.period_ms().max(1);
                        let skip = (now_ms - since) / period;
                        (cycle, since) = (cycle + skip, since + skip * period);
                    }
                }
            }
        };
        self.at = Some((cycle, phase, since));
        position
    }
}

/// A number in [-1, 1) from the seed, the cycle and the phase: SplitMix64's finaliser over the three, so that
/// every (cycle, phase) has its own draw and evaluating one needs none of the others.
fn unit(seed: u64, cycle: u64, phase: usize) -> f64 {
    let x = mix(seed ^ mix(cycle.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (phase as u64)));
    (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
