use isthmus_agent_api::schedule::Position;

use super::*;

const CREATED: u64 = 1_795_000_000_000;

fn spec(yaml: &str) -> NetworkLinkSpec {
    let head = "from: {podSelector: {matchLabels: {app: a}}}\nto: {podSelector: {matchLabels: {app: b}}}\n";
    serde_yaml::from_str(&format!("{head}{yaml}")).unwrap()
}

fn compiled(yaml: &str) -> Timelines {
    compiled_with(yaml, None).unwrap()
}

fn compiled_with(yaml: &str, traces: TraceData<'_>) -> Result<Timelines, SpecError> {
    let s = spec(yaml);
    let own = s.resolve().unwrap();
    compile(&s, &own, CREATED, traces).map(|t| t.expect("a schedule"))
}

fn refused(yaml: &str, traces: TraceData<'_>) -> SpecError {
    compiled_with(yaml, traces).unwrap_err()
}

fn latency_ms(t: &Timeline, phase: usize) -> u64 {
    t.phases()[phase].impairment.fields().latency.map_or(0, |d| d.as_millis() as u64)
}

#[test]
fn a_link_without_a_schedule_has_no_timeline() {
    let s = spec("impairment: {latency: 10ms}\n");
    assert_eq!(compile(&s, &s.resolve().unwrap(), CREATED, None), Ok(None));
}

#[test]
fn two_phases_change_fields_over_the_links_own_in_both_directions_of_a_symmetric_link() {
    let t = compiled(
        "impairment: {latency: 10ms, loss: {percent: 1%}}\nsymmetric: true\n\
         schedule:\n  start: 30s\n  phases:\n  - {name: calm, duration: 5s}\n  - {duration: 5s, impairment: {latency: 100ms}}\n",
    );
    for timeline in [t.forward.as_ref().unwrap(), t.reverse.as_ref().unwrap()] {
        let f = timeline.fields();
        assert_eq!((f.start_unix_ms, f.end), (CREATED + 30_000, End::Repeat));
        assert_eq!(timeline.phases().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["calm", "phase 2"]);
        assert_eq!((latency_ms(timeline, 0), latency_ms(timeline, 1)), (10, 100));
        // The fields a phase leaves alone keep the link's own values.
        assert_eq!(timeline.phases()[1].impairment.fields().loss, timeline.phases()[0].impairment.fields().loss);
        assert_eq!(
            timeline.position(CREATED + 36_000),
            Position::In { cycle: 0, phase: 1, since_ms: CREATED + 35_000, next_ms: Some(CREATED + 40_000) }
        );
    }
}

#[test]
fn a_one_way_link_has_one_timeline_and_reverse_phases_need_a_reverse_direction() {
    let t = compiled("impairment: {latency: 10ms}\noneWay: true\nschedule: {phases: [{duration: 1s}]}\n");
    assert!(t.forward.is_some() && t.reverse.is_none());
    let e = refused(
        "impairment: {latency: 10ms}\noneWay: true\nschedule: {phases: [{duration: 1s, reverse: {latency: 5ms}}]}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.phases[0].reverse");
    let e = refused(
        "impairment: {latency: 10ms}\nsymmetric: true\nschedule: {phases: [{duration: 1s, reverse: {latency: 5ms}}]}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.phases[0].reverse");
    let t = compiled(
        "impairment: {latency: 10ms}\nreverse: {latency: 20ms}\n\
         schedule: {phases: [{duration: 1s, impairment: {latency: 1ms}, reverse: {latency: 2ms}}, {duration: 1s}]}\n",
    );
    let (f, r) = (t.forward.unwrap(), t.reverse.unwrap());
    assert_eq!((latency_ms(&f, 0), latency_ms(&f, 1), latency_ms(&r, 0), latency_ms(&r, 1)), (1, 10, 2, 20));
}

#[test]
fn a_flap_cuts_every_direction_and_its_seed_makes_it_reproducible() {
    let yaml = "impairment: {latency: 10ms}\nsymmetric: true\n\
                schedule: {flap: {up: 10s, down: 2s, jitter: 20%, seed: 7}}\n";
    let t = compiled(yaml);
    let f = t.forward.as_ref().unwrap();
    assert_eq!(f.phases().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["up", "down"]);
    let down = f.phases()[1].impairment.fields();
    assert_eq!(down.loss, Some(Loss::Random(Correlated { percent: Percent::HUNDRED, correlation: Percent::ZERO })));
    assert_eq!(down.latency, Some(Duration::from_millis(10)), "a down link keeps the rest of its own");
    assert_eq!(f.fields().jitter.map(|j| j.seed), Some(7));
    assert_eq!(compiled(yaml), t, "one seed, one timeline");
    let named = compiled(
        "impairment: {latency: 10ms}\nschedule: {flap: {up: 1s, down: 1s, downImpairment: {latency: 900ms}}}\n",
    );
    assert_eq!(latency_ms(named.forward.as_ref().unwrap(), 1), 900);
    assert_eq!(named.forward.unwrap().phases()[1].impairment.fields().loss, None);
    let e = refused("impairment: {latency: 10ms}\nschedule: {flap: {up: 1s, down: 1s, jitter: 95%}}\n", None);
    assert_eq!(e.field, "spec.schedule.flap");
    assert!(e.message.contains("jitter.percent"), "{e}");
    let e = refused("impairment: {latency: 10ms}\nschedule: {flap: {up: 0, down: 1s}}\n", None);
    assert_eq!(e.field, "spec.schedule.flap.up");
}

#[test]
fn a_ramp_steps_one_field_and_holds_its_end() {
    let t = compiled(
        "impairment: {latency: 10ms, bandwidth: 50Mbit}\noneWay: true\n\
         schedule: {ramp: {field: Latency, from: 10ms, to: 200ms, over: 60s, step: 10ms}}\n",
    );
    let f = t.forward.unwrap();
    assert_eq!(f.phases().len(), 20);
    assert_eq!(f.fields().end, End::Hold);
    assert_eq!((latency_ms(&f, 0), latency_ms(&f, 1), latency_ms(&f, 19)), (10, 20, 200));
    assert_eq!(f.phases()[19].name, "latency 200ms");
    assert!(f.phases().iter().all(|p| p.impairment.fields().rate_bps == Some(50_000_000)));
    assert_eq!(f.position(CREATED + 60_000), f.position(u64::MAX), "held from the end on");
    let loss = compiled(
        "impairment: {latency: 10ms}\nsymmetric: true\n\
         schedule: {ramp: {field: Loss, from: 0%, to: 1%, over: 10s, step: 0.1%, direction: Reverse}}\n",
    );
    assert!(loss.forward.is_none(), "the forward direction keeps its own");
    let r = loss.reverse.unwrap();
    assert_eq!(r.phases().len(), 11);
    assert_eq!(r.phases()[3].name, "loss 0.3%");
    let e = refused(
        "impairment: {latency: 10ms}\nschedule: {ramp: {field: Bandwidth, from: 1Mbit, to: 2Mbit, over: 1s, step: 1bit}}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.ramp.step");
    let e = refused(
        "impairment: {latency: 10ms}\nschedule: {ramp: {field: Latency, from: 10, to: 20ms, over: 1s, step: 1ms}}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.ramp.from");
    let e = refused(
        "impairment: {latency: 10ms}\noneWay: true\n\
         schedule: {ramp: {field: Latency, from: 1ms, to: 2ms, over: 1s, step: 1ms, direction: Reverse}}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.ramp.direction");
}

#[test]
fn a_trace_is_replayed_as_rate_windows_from_its_configmap() {
    let steady: String = (1..=1_000).map(|t| format!("{t}\n")).collect();
    let data = BTreeMap::from([("up".to_owned(), steady), ("bad".to_owned(), "1\nx\n".to_owned())]);
    let t = compiled_with(
        "impairment: {latency: 10ms}\nsymmetric: true\nschedule: {trace: {configMap: lte, uplink: up, window: 250ms}}\n",
        Some(&data),
    )
    .unwrap();
    let f = t.forward.unwrap();
    assert!(t.reverse.is_none(), "no downlink trace: the reverse keeps its own");
    assert_eq!(f.phases().len(), 4);
    assert!(f.phases().iter().all(|p| p.impairment.fields().rate_bps == Some(12_000_000)));
    assert!(f.phases().iter().all(|p| p.duration_ms == 250 && p.impairment.fields().latency.is_some()));
    assert_eq!(f.fields().end, End::Repeat);
    let trace = |spec: &str, data| refused(&format!("impairment: {{latency: 10ms}}\n{spec}"), data);
    assert_eq!(trace("schedule: {trace: {configMap: lte, uplink: up}}\n", None).field, "spec.schedule.trace.configMap");
    let e = trace("schedule: {trace: {configMap: lte, uplink: nope}}\n", Some(&data));
    assert_eq!((e.field.as_str(), e.message.contains("no key \"nope\"")), ("spec.schedule.trace.uplink", true));
    let e = trace("schedule: {trace: {configMap: lte, uplink: bad}}\n", Some(&data));
    assert!(e.message.contains("line 2"), "{e}");
    let e = trace("oneWay: true\nschedule: {trace: {configMap: lte, downlink: up}}\n", Some(&data));
    assert_eq!(e.field, "spec.schedule.trace.downlink");
    let e = trace("schedule: {trace: {configMap: lte, uplink: up, window: 5ms}}\n", Some(&data));
    assert_eq!(e.field, "spec.schedule.trace.window");
}

#[test]
fn the_shape_is_checked_even_past_an_older_schema() {
    let e =
        refused("impairment: {latency: 10ms}\nschedule: {phases: [{duration: 1s}], flap: {up: 1s, down: 1s}}\n", None);
    assert_eq!(e.field, "spec.schedule");
    let e = refused("impairment: {latency: 10ms}\nschedule: {}\n", None);
    assert_eq!(e.field, "spec.schedule");
    let e = refused(
        "impairment: {latency: 10ms}\nschedule: {start: 1s, startAt: '2026-12-01T00:00:00Z', phases: [{duration: 1s}]}\n",
        None,
    );
    assert_eq!(e.field, "spec.schedule.startAt");
    let e = refused("impairment: {latency: 10ms}\nschedule: {trace: {configMap: x}}\n", None);
    assert_eq!(e.field, "spec.schedule.trace");
    let many =
        format!("impairment: {{latency: 10ms}}\nschedule: {{phases: [{}]}}\n", vec!["{duration: 1s}"; 65].join(", "));
    assert_eq!(refused(&many, None).field, "spec.schedule.phases");
    let e = refused("impairment: {latency: 10ms}\nschedule: {phases: [{duration: 500us}]}\n", None);
    assert_eq!(e.field, "spec.schedule.phases[0].duration");
    let at = compiled(
        "impairment: {latency: 10ms}\nschedule: {startAt: '2026-12-01T00:00:00Z', phases: [{duration: 1s}]}\n",
    );
    assert_eq!(at.forward.unwrap().fields().start_unix_ms, 1_796_083_200_000);
}

#[test]
fn a_phase_whose_bandwidth_the_links_burst_outlasts_is_refused_naming_the_phase() {
    // 1 MiB at 1 Mbit/s is sent in 8.4 s; at 10 kbit/s it would take 839 s, past the kernel's 274 s bucket.
    let e = refused(
        "impairment: {bandwidth: 1Mbit, burst: 1MiB}\noneWay: true\n\
         schedule: {phases: [{duration: 1s}, {duration: 1s, impairment: {bandwidth: 10kbit}}]}\n",
        None,
    );
    assert!(e.field.starts_with("spec.schedule.phases[1]"), "{e:?}");
    assert!(e.to_string().contains("274s"), "{e}");
}
