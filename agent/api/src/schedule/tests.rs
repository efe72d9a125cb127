use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::ImpairmentFields;

fn latency(ms: u64) -> Arc<Impairment> {
    let fields = ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() };
    Arc::new(Impairment::try_from(fields).unwrap())
}

fn phase(duration_ms: u64, latency_ms: u64) -> Phase {
    Phase { duration_ms, impairment: latency(latency_ms), name: format!("{latency_ms}ms") }
}

fn timeline(start: u64, phases: Vec<Phase>, end: End, jitter: Option<Jitter>) -> Timeline {
    Timeline::try_from(TimelineFields { start_unix_ms: start, phases, end, jitter }).unwrap()
}

fn jitter(percent: f64, seed: u64) -> Option<Jitter> {
    Some(Jitter { percent: Percent::new("percent", percent).unwrap(), seed })
}

#[test]
fn two_phases_repeat_switch_exactly_at_their_boundaries() {
    let t = timeline(1_000, vec![phase(5_000, 10), phase(5_000, 100)], End::Repeat, None);
    assert_eq!(t.position(999), Position::Before { next_ms: 1_000 });
    assert_eq!(t.position(1_000), Position::In { cycle: 0, phase: 0, since_ms: 1_000, next_ms: Some(6_000) });
    assert_eq!(t.position(5_999), Position::In { cycle: 0, phase: 0, since_ms: 1_000, next_ms: Some(6_000) });
    assert_eq!(t.position(6_000), Position::In { cycle: 0, phase: 1, since_ms: 6_000, next_ms: Some(11_000) });
    assert_eq!(t.position(11_000), Position::In { cycle: 1, phase: 0, since_ms: 11_000, next_ms: Some(16_000) });
    // A day later, evaluated from scratch without walking every cycle.
    let day = 86_400_000;
    assert_eq!(
        t.position(1_000 + day + 5_000),
        Position::In {
            cycle: day / 10_000,
            phase: 1,
            since_ms: 1_000 + day + 5_000,
            next_ms: Some(1_000 + day + 10_000)
        }
    );
    let own = latency(1);
    assert_eq!(t.impairment(&t.position(6_000), &own), &latency(100));
    assert_eq!(t.impairment(&t.position(0), &own), &own);
}

#[test]
fn a_timeline_ends_by_holding_its_last_phase_or_reverting_to_the_links_own() {
    let hold = timeline(0, vec![phase(10, 10), phase(20, 20)], End::Hold, None);
    assert_eq!(hold.position(9), Position::In { cycle: 0, phase: 0, since_ms: 0, next_ms: Some(10) });
    assert_eq!(hold.position(29), Position::In { cycle: 0, phase: 1, since_ms: 10, next_ms: None });
    assert_eq!(hold.position(30), Position::In { cycle: 0, phase: 1, since_ms: 10, next_ms: None });
    assert_eq!(hold.position(u64::MAX), Position::In { cycle: 0, phase: 1, since_ms: 10, next_ms: None });
    let revert = timeline(0, vec![phase(10, 10), phase(20, 20)], End::Revert, None);
    assert_eq!(revert.position(30), Position::Over { since_ms: 30 });
    let own = latency(1);
    assert_eq!(revert.impairment(&revert.position(31), &own), &own);
    assert_eq!(revert.position(30).next_ms(), None);
}

#[test]
fn bad_timelines_are_refused_naming_the_field() {
    let fields = |phases: Vec<Phase>, jitter| TimelineFields { start_unix_ms: 0, phases, end: End::Repeat, jitter };
    let cases = [
        (fields(vec![], None), "phases"),
        (fields(vec![phase(1, 1); MAX_PHASES + 1], None), "phases"),
        (fields(vec![phase(1, 1), phase(0, 1)], None), "phases[1].durationMs"),
        (fields(vec![phase(MAX_PHASE_MS + 1, 1)], None), "phases[0].durationMs"),
        (fields(vec![phase(1, 1)], jitter(MAX_JITTER_PERCENT, 1)), "jitter.percent"),
    ];
    for (f, field) in cases {
        let json = serde_json::to_string(&f).unwrap();
        let err = Timeline::try_from(f).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        let via_json = serde_json::from_str::<Timeline>(&json).unwrap_err().to_string();
        assert!(via_json.contains(field), "{via_json}");
    }
}

#[test]
fn a_timeline_round_trips_through_json() {
    let t = timeline(7, vec![phase(5, 10), phase(6, 100)], End::Revert, jitter(20.0, 42));
    let json = serde_json::to_string(&t).unwrap();
    assert!(json.contains("\"startUnixMs\":7") && json.contains("\"durationMs\":5"), "{json}");
    assert_eq!(serde_json::from_str::<Timeline>(&json).unwrap(), t);
}

fn arb_timeline() -> impl Strategy<Value = Timeline> {
    (
        0u64..1_000_000,
        proptest::collection::vec((1u64..5_000, 0u64..500), 1..6),
        prop_oneof![Just(End::Repeat), Just(End::Hold), Just(End::Revert)],
        proptest::option::of((0.0f64..89.0, any::<u64>())),
    )
        .prop_map(|(start, phases, end, j)| {
            let phases = phases.into_iter().map(|(d, l)| phase(d, l)).collect();
            timeline(start, phases, end, j.and_then(|(p, seed)| jitter(p, seed)))
        })
}

/// Instants spread from before the start to some fifty cycles after it, sorted.
fn instants(t: &Timeline, fractions: &[f64]) -> Vec<u64> {
    let span = t.period_ms() * 100;
    let start = t.fields().start_unix_ms;
    let mut at: Vec<u64> =
        fractions.iter().map(|f| (start as f64 - 1_000.0 + f * span as f64).max(0.0) as u64).collect();
    at.sort();
    at
}

proptest! {
    #[test]
    fn a_cursor_moving_with_the_clock_agrees_with_evaluating_from_the_start(
        t in arb_timeline(),
        fractions in proptest::collection::vec(0.0f64..1.0, 1..40),
    ) {
        let mut cursor = Cursor::default();
        for at in instants(&t, &fractions) {
            prop_assert_eq!(cursor.advance(&t, at), t.position(at), "at {}", at);
        }
    }

    #[test]
    fn each_phase_holds_from_its_start_to_just_before_the_next_change(
        t in arb_timeline(),
        fractions in proptest::collection::vec(0.0f64..1.0, 1..20),
    ) {
        for at in instants(&t, &fractions) {
            let p = t.position(at);
            match p {
                Position::Before { next_ms } => {
                    prop_assert!(at < next_ms);
                    prop_assert_eq!(next_ms, t.fields().start_unix_ms);
                }
                Position::In { cycle, phase, since_ms, next_ms } => {
                    prop_assert!(since_ms <= at);
                    prop_assert_eq!(t.position(since_ms), p);
                    match next_ms {
                        Some(next) => {
                            prop_assert!(at < next);
                            prop_assert_eq!(next - since_ms, t.duration_ms(cycle, phase));
                            prop_assert_eq!(t.position(next - 1), p);
                            // The next change leads to the following phase, the next cycle, or the end.
                            let after = t.position(next);
                            let n = t.phases().len();
                            match after {
                                Position::In { cycle: c, phase: q, since_ms: s, .. } => {
                                    let expected = if phase + 1 < n { (cycle, phase + 1) } else { (cycle + 1, 0) };
                                    prop_assert_eq!((c, q, s), (expected.0, expected.1, next));
                                }
                                Position::Over { since_ms: s } => {
                                    prop_assert_eq!(t.fields().end, End::Revert);
                                    prop_assert_eq!((phase + 1, s), (n, next));
                                }
                                Position::Before { .. } => prop_assert!(false, "before the start after it"),
                            }
                        }
                        None => {
                            prop_assert_eq!(t.fields().end, End::Hold);
                            prop_assert_eq!((cycle, phase + 1), (0, t.phases().len()));
                        }
                    }
                }
                Position::Over { since_ms } => {
                    prop_assert_eq!(t.fields().end, End::Revert);
                    prop_assert!(since_ms <= at);
                    let total: u64 = (0..t.phases().len()).map(|i| t.duration_ms(0, i)).sum();
                    prop_assert_eq!(since_ms, t.fields().start_unix_ms + total);
                }
            }
        }
    }

    #[test]
    fn without_jitter_a_repeating_timeline_is_periodic(t in arb_timeline(), at in 0u64..10_000_000) {
        let t = Timeline::try_from(TimelineFields { end: End::Repeat, jitter: None, ..t.fields().clone() }).unwrap();
        let period = t.period_ms();
        if let Position::In { cycle, phase, since_ms, next_ms } = t.position(at) {
            prop_assert_eq!(
                t.position(at + period),
                Position::In { cycle: cycle + 1, phase, since_ms: since_ms + period, next_ms: next_ms.map(|n| n + period) }
            );
        }
    }

    #[test]
    fn jittered_durations_are_the_seeds_and_stay_within_the_stretch(
        seed in any::<u64>(),
        percent in 0.0f64..89.0,
        base in 1u64..100_000,
        cycles in 1u64..200,
    ) {
        let make = |seed| timeline(0, vec![phase(base, 1), phase(base, 2)], End::Repeat, jitter(percent, seed));
        let (a, b) = (make(seed), make(seed));
        for cycle in 0..cycles {
            for i in 0..2 {
                let d = a.duration_ms(cycle, i);
                prop_assert_eq!(d, b.duration_ms(cycle, i), "the same seed, the same durations");
                let stretch = base as f64 * percent / 100.0;
                prop_assert!(d as f64 >= (base as f64 - stretch - 0.5).max(1.0) && d as f64 <= base as f64 + stretch + 0.5);
            }
        }
        // Two runs of one seed flap identically: the same positions at the same instants.
        for at in (0..cycles * base).step_by(base as usize / 2 + 1) {
            prop_assert_eq!(a.position(at), b.position(at));
        }
    }
}

#[test]
fn different_seeds_flap_differently_and_a_jitter_moves_durations_both_ways() {
    let make = |seed| timeline(0, vec![phase(10_000, 1), phase(10_000, 2)], End::Repeat, jitter(50.0, seed));
    let (a, b) = (make(1), make(2));
    let da: Vec<u64> = (0..100).map(|c| a.duration_ms(c, 0)).collect();
    let db: Vec<u64> = (0..100).map(|c| b.duration_ms(c, 0)).collect();
    assert_ne!(da, db);
    assert!(da.iter().any(|&d| d < 7_500) && da.iter().any(|&d| d > 12_500), "{da:?}");
    let mean = da.iter().sum::<u64>() as f64 / da.len() as f64;
    assert!((mean - 10_000.0).abs() < 1_000.0, "centred on the phase's duration: {mean}");
}
