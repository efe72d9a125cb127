use std::time::Duration;

use isthmus_agent_api::schedule::{End, Phase, TimelineFields};
use isthmus_agent_api::test_util::link;
use isthmus_agent_api::{Impairment, ImpairmentFields};

use super::*;

fn latency(ms: u64) -> Arc<Impairment> {
    let fields = ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() };
    Arc::new(Impairment::try_from(fields).unwrap())
}

/// 10 ms for 5 s, then 100 ms for 5 s, from t = 1 s, repeating.
fn flip(link_name: &str) -> LinkTimeline {
    let phase = |ms| Phase { duration_ms: 5_000, impairment: latency(ms), name: format!("{ms}ms") };
    let fields =
        TimelineFields { start_unix_ms: 1_000, phases: vec![phase(10), phase(100)], end: End::Repeat, jitter: None };
    LinkTimeline { link: link(link_name), timeline: Timeline::try_from(fields).unwrap() }
}

fn destinations() -> Vec<Destination> {
    let (scheduled, plain) = (Arc::new(link("flip")), Arc::new(link("plain")));
    vec![
        ("10.0.0.2/32".parse().unwrap(), latency(40), scheduled.clone()),
        ("10.0.0.3/32".parse().unwrap(), latency(40), scheduled),
        ("10.0.0.4/32".parse().unwrap(), latency(7), plain),
    ]
}

fn latencies(d: &[Destination]) -> Vec<Option<Duration>> {
    d.iter().map(|(_, i, _)| i.fields().latency).collect()
}

#[test]
fn a_scheduled_links_destinations_follow_its_phase_and_the_others_keep_theirs() {
    let t = Timelines::new(vec![flip("flip")]);
    let ms = |v: u64| Some(Duration::from_millis(v));
    assert_eq!(latencies(&t.in_force(&destinations(), 999)), [ms(40), ms(40), ms(7)], "before the start: its own");
    assert_eq!(latencies(&t.in_force(&destinations(), 1_000)), [ms(10), ms(10), ms(7)]);
    assert_eq!(latencies(&t.in_force(&destinations(), 6_000)), [ms(100), ms(100), ms(7)]);
    assert_eq!(latencies(&t.in_force(&destinations(), 11_000)), [ms(10), ms(10), ms(7)]);
    let now = t.in_force(&destinations(), 6_500);
    assert!(Arc::ptr_eq(&now[0].1, &now[1].1), "one phase, one impairment for all its destinations");
}

#[test]
fn the_next_change_is_the_earliest_phase_boundary_of_any_timeline() {
    let t = Timelines::new(vec![flip("flip")]);
    assert_eq!(t.next_change(0), Some(1_000));
    assert_eq!(t.next_change(1_000), Some(6_000));
    assert_eq!(t.next_change(5_999), Some(6_000));
    assert_eq!(Timelines::default().next_change(0), None);
}

#[test]
fn without_timelines_the_plan_is_installed_as_it_came() {
    let d = destinations();
    assert_eq!(Timelines::default().in_force(&d, 5_000), d);
}

#[test]
fn a_cursor_kept_between_evaluations_gives_what_a_fresh_evaluation_gives() {
    let jittered = |link_name: &str| {
        let mut t = flip(link_name);
        let mut fields = t.timeline.fields().clone();
        fields.jitter = Some(isthmus_agent_api::schedule::Jitter {
            percent: isthmus_agent_api::Percent::new("test", 40.0).unwrap(),
            seed: 7,
        });
        t.timeline = Timeline::try_from(fields).unwrap();
        t
    };
    let kept = Timelines::new(vec![jittered("flip")]);
    let timeline = jittered("flip").timeline;
    // Forward in uneven steps, then back to an earlier instant (a clock set back): the cursor starts over.
    for now in (0..600_000).step_by(977).chain([1_000, 250_000, 599_999, 3]) {
        let fresh = timeline.position(now);
        assert_eq!(kept.positions(now).next().unwrap().1, fresh, "at {now} ms");
        assert_eq!(kept.next_change(now), fresh.next_ms(), "at {now} ms");
    }
}
