use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::ImpairmentFields;
use isthmus_agent_api::schedule::{End, Phase, TimelineFields};
use isthmus_agent_api::test_util::impairment;

use super::*;

const START: u64 = 1_000_000_000;
const S: u64 = 1_000;

fn latency(ms: u64) -> Impairment {
    impairment(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() })
}

/// Two 10 s phases from START, repeating: `near` at `near_ms`, then `far` (unnamed) at `far_ms`.
fn timeline(near_ms: u64, far_ms: u64) -> Timeline {
    let phase = |name: &str, ms| Phase { duration_ms: 10 * S, impairment: Arc::new(latency(ms)), name: name.into() };
    let fields = TimelineFields {
        start_unix_ms: START,
        phases: vec![phase("near", near_ms), phase("", far_ms)],
        end: End::Repeat,
        jitter: None,
    };
    Timeline::try_from(fields).unwrap()
}

#[test]
fn a_window_inside_one_phase_of_both_legs_is_judged_against_that_phase() {
    let own = latency(1);
    let (forward, reverse) = (timeline(10, 100), timeline(20, 50));
    let out = Leg { own: &own, timeline: Some(&forward) };
    let back = Leg { own: &own, timeline: Some(&reverse) };
    // As the agents cut it: a second in, a second and the way out's latency before the end.
    let p = phase_path(out, Some(back), (START + S, START + 9 * S - 10)).expect("one phase");
    assert_eq!((p.out, p.back, p.phase.as_deref()), (&latency(10), Some(&latency(20)), Some("near")));
    let p = phase_path(out, Some(back), (START + 11 * S, START + 19 * S - 100)).expect("one phase");
    assert_eq!((p.out, p.back, p.phase.as_deref()), (&latency(100), Some(&latency(50)), Some("phase 2")));
    // Before the start and without a way back: the link's own, no phase.
    let p = phase_path(out, None, (START - 30 * S, START - 2 * S)).expect("before the start");
    assert_eq!((p.out, p.back, p.phase), (&own, None, None));
}

#[test]
fn a_window_a_leg_changes_in_is_not_judged() {
    let own = latency(1);
    let (forward, reverse) = (timeline(10, 400), timeline(20, 50));
    let out = Leg { own: &own, timeline: Some(&forward) };
    let back = Leg { own: &own, timeline: Some(&reverse) };
    // The way out changes within the margin after the window.
    assert_eq!(phase_path(out, None, (START + S, START + 10 * S - MARGIN_MS + 1)), None);
    assert!(phase_path(out, None, (START + S, START + 10 * S - MARGIN_MS - 1)).is_some());
    // In `far` the way out takes 400 ms: a window ending 800 ms before the next phase has probes whose answers
    // cross the other node after it changed.
    assert_eq!(phase_path(out, Some(back), (START + 11 * S, START + 20 * S - 800)), None);
    assert!(phase_path(out, Some(back), (START + 11 * S, START + 20 * S - 400 - MARGIN_MS - 1)).is_some());
    // And before its start.
    assert_eq!(phase_path(out, Some(back), (START + MARGIN_MS - 1, START + 5 * S)), None);
}

#[test]
fn a_leg_without_a_timeline_keeps_its_own_and_the_other_names_the_phase() {
    let (own_out, own_back) = (latency(3), latency(7));
    let reverse = timeline(20, 50);
    let out = Leg { own: &own_out, timeline: None };
    let back = Leg { own: &own_back, timeline: Some(&reverse) };
    let p = phase_path(out, Some(back), (START + 12 * S, START + 18 * S)).expect("one phase");
    assert_eq!((p.out, p.back, p.phase.as_deref()), (&own_out, Some(&latency(50)), Some("phase 2")));
}
