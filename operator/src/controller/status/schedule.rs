//! `status.schedule` from a link's timeline and the operator's clock. Pure; the controller refreshes it on its
//! one-second tick, at most every [`REFRESH_MS`] per link, so that a ramp of 100 ms steps does not turn into ten
//! status writes (and Events) a second.

use isthmus_agent_api::schedule::{Position, Timeline};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{ScheduleState, ScheduleStatus};
use crate::schedule::phase_name;

/// The shortest time between two refreshes of one link's `status.schedule` that the tick asks for.
pub const REFRESH_MS: u64 = 5_000;

/// The status of `timeline` standing at `position`.
pub fn schedule_status(timeline: &Timeline, position: Position) -> ScheduleStatus {
    let (state, phase, cycle, since) = match position {
        Position::Before { .. } => (ScheduleState::Waiting, None, 0, None),
        Position::In { cycle, phase, since_ms, next_ms } => (
            if next_ms.is_some() { ScheduleState::Running } else { ScheduleState::Holding },
            Some(phase_name(timeline, phase)),
            cycle,
            Some(since_ms),
        ),
        Position::Over { since_ms } => (ScheduleState::Over, None, 0, Some(since_ms)),
    };
    ScheduleStatus { state, phase, cycle, since: since.map(seconds), next_change: position.next_ms().map(seconds) }
}

/// Whether the tick should refresh a status that shows `shown`: the schedule has moved on from it, and the last
/// refresh the tick asked for was at least [`REFRESH_MS`] ago.
pub fn refresh_due(shown: Option<&ScheduleStatus>, now: &ScheduleStatus, now_ms: u64, last_ms: Option<u64>) -> bool {
    let moved = shown.is_none_or(|s| !s.same_phase(now));
    moved && last_ms.is_none_or(|last| now_ms.saturating_sub(last) >= REFRESH_MS)
}

/// An instant to the second, as the API server stores times: a finer one would never compare equal after a
/// round trip and would be written again on every flush.
fn seconds(unix_ms: u64) -> Time {
    let secs = i64::try_from(unix_ms / 1_000).unwrap_or(i64::MAX);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or(k8s_openapi::jiff::Timestamp::MAX))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use isthmus_agent_api::schedule::{End, Phase, TimelineFields};
    use isthmus_agent_api::test_util::rate;

    use super::*;

    fn timeline(end: End) -> Timeline {
        let phase =
            |ms, name: &str| Phase { duration_ms: ms, impairment: Arc::new(rate(ms * 1_000)), name: name.into() };
        Timeline::try_from(TimelineFields {
            start_unix_ms: 10_000,
            phases: vec![phase(5_000, "fast"), phase(5_000, "")],
            end,
            jitter: None,
        })
        .unwrap()
    }

    fn at_time(t: &Timeline, ms: u64) -> ScheduleStatus {
        schedule_status(t, t.position(ms))
    }

    fn at(s: i64) -> Option<Time> {
        Some(Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap()))
    }

    #[test]
    fn each_stage_of_a_schedule_reads_as_a_state_with_its_times() {
        let t = timeline(End::Repeat);
        let waiting = schedule_status(&t, t.position(9_999));
        assert_eq!(
            (waiting.state, waiting.phase.as_deref(), waiting.next_change.clone()),
            (ScheduleState::Waiting, None, at(10))
        );
        let first = schedule_status(&t, t.position(12_500));
        assert_eq!(first.state, ScheduleState::Running);
        assert_eq!(
            (first.phase.as_deref(), first.cycle, first.since.clone(), first.next_change.clone()),
            (Some("fast"), 0, at(10), at(15))
        );
        let unnamed = schedule_status(&t, t.position(15_000));
        assert_eq!((unnamed.phase.as_deref(), unnamed.next_change.clone()), (Some("phase 2"), at(20)));
        let again = schedule_status(&t, t.position(21_000));
        assert_eq!((again.phase.as_deref(), again.cycle, again.since.clone()), (Some("fast"), 1, at(20)));

        let held = at_time(&timeline(End::Hold), 99_000);
        assert_eq!(
            (held.state, held.phase.as_deref(), held.next_change.clone()),
            (ScheduleState::Holding, Some("phase 2"), None)
        );
        let over = at_time(&timeline(End::Revert), 99_000);
        assert_eq!(
            (over.state, over.phase.as_deref(), over.since.clone(), over.next_change.clone()),
            (ScheduleState::Over, None, at(20), None)
        );
    }

    #[test]
    fn a_refresh_is_due_when_the_schedule_moved_on_and_not_more_often_than_the_bound() {
        let t = timeline(End::Repeat);
        let shown = schedule_status(&t, t.position(11_000));
        assert!(refresh_due(None, &shown, 11_000, None), "nothing shown yet");
        assert!(!refresh_due(Some(&shown), &schedule_status(&t, t.position(14_000)), 14_000, None), "the same phase");
        let next = schedule_status(&t, t.position(16_000));
        assert!(refresh_due(Some(&shown), &next, 16_000, Some(11_000)));
        assert!(!refresh_due(Some(&shown), &next, 16_000, Some(12_000)), "refreshed 4 s ago");
        let next_cycle = schedule_status(&t, t.position(21_000));
        assert!(refresh_due(Some(&shown), &next_cycle, 21_000, Some(11_000)), "the same phase one cycle on");
    }
}
