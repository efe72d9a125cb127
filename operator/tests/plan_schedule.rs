//! A scheduled link's timelines in the node plans: each node whose pods a scheduled side shapes gets that side's
//! timeline, once, beside the destinations (which keep the link's own impairment); other nodes get none; a
//! schedule removed takes the timelines out of the plans. Fed synthetic objects like `plan.rs`.

mod support;

use isthmus_agent_api::{Direction, LinkRef};
use isthmus_operator::api::ScheduleSpec;
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::Planner;
use support::*;

fn flap() -> ScheduleSpec {
    serde_yaml::from_str("{flap: {up: 10s, down: 2s}}").unwrap()
}

fn link_ref(name: &str, direction: Direction) -> LinkRef {
    LinkRef { namespace: "ns".into(), name: name.into(), direction }
}

#[test]
fn a_scheduled_links_timelines_reach_the_nodes_of_its_sources() {
    let mut p = planner_with(&[
        ("c", "client", "n1", "10.0.0.1"),
        ("s", "server", "n2", "10.0.0.2"),
        ("w", "worker", "n3", "10.0.0.3"),
    ]);
    let mut flapping = spec("client", "server", 10);
    flapping.symmetric = true;
    flapping.schedule = Some(flap());
    let (k, v) = link("ns", "wan", 1, flapping.clone());
    p.upsert_link(k, v);
    let (k, v) = link("ns", "plain", 2, spec("worker", "server", 10));
    p.upsert_link(k, v);
    p.recompute();

    let n1 = p.node_plan("n1").unwrap();
    assert_eq!(n1.timelines.iter().map(|t| t.link.clone()).collect::<Vec<_>>(), [link_ref("wan", Direction::Forward)]);
    let phases = n1.timelines[0].timeline.phases();
    assert_eq!(phases.len(), 2, "up and down");
    assert_eq!(phases[0].duration_ms, 10_000);
    assert_eq!(phases[1].duration_ms, 2_000);
    let n2 = p.node_plan("n2").unwrap();
    assert_eq!(n2.timelines.iter().map(|t| t.link.clone()).collect::<Vec<_>>(), [link_ref("wan", Direction::Reverse)]);
    assert!(p.node_plan("n3").unwrap().timelines.is_empty(), "an unscheduled link's node gets no timeline");
    // The destinations keep the link's own impairment: the agents substitute each phase's themselves.
    let own = &n1.pods[0].destinations[0].impairment;
    assert_eq!(own.fields().latency, Some(std::time::Duration::from_millis(10)));

    // The schedule removed: the timelines leave the plans of both nodes.
    flapping.schedule = None;
    let (k, v) = link("ns", "wan", 1, flapping);
    p.upsert_link(k, v);
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1", "n2"]);
    assert!(p.node_plans().all(|plan| plan.timelines.is_empty()));
}

#[test]
fn a_changed_schedule_reaches_a_node_that_runs_several_of_its_sources() {
    // Two sources on one node share the node's timeline; a schedule's change must replace it, not keep the
    // first share's copy because the other share still names the link.
    let mut p = planner_with(&[
        ("c1", "client", "n1", "10.0.0.1"),
        ("c2", "client", "n1", "10.0.0.4"),
        ("s", "server", "n2", "10.0.0.2"),
    ]);
    let mut flapping = spec("client", "server", 10);
    flapping.schedule = Some(flap());
    let (k, v) = link("ns", "wan", 1, flapping.clone());
    p.upsert_link(k, v);
    p.recompute();
    let durations = |p: &Planner| -> Vec<Vec<u64>> {
        let plan = p.node_plan("n1").unwrap();
        plan.timelines.iter().map(|t| t.timeline.phases().iter().map(|ph| ph.duration_ms).collect()).collect()
    };
    assert_eq!(durations(&p), [[10_000, 2_000]]);

    flapping.schedule = Some(serde_yaml::from_str("{flap: {up: 30s, down: 5s}}").unwrap());
    let (k, v) = link("ns", "wan", 1, flapping);
    p.upsert_link(k, v);
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1"]);
    assert_eq!(durations(&p), [[30_000, 5_000]]);

    // One source leaves: the node keeps the timeline for the other; both gone, it goes.
    p.delete_pod(&ObjectKey::new("ns", "c1"));
    p.recompute();
    assert_eq!(durations(&p), [[30_000, 5_000]]);
    p.delete_pod(&ObjectKey::new("ns", "c2"));
    p.recompute();
    assert!(p.node_plan("n1").is_none(), "no source left on n1");
}

fn trace_map(lines_per_second: u64) -> k8s_openapi::api::core::v1::ConfigMap {
    // One delivery opportunity of 1,500 bytes every 1000/n ms for a second: n × 12 kbit/s.
    let trace: String = (1..=lines_per_second).map(|i| format!("{}\n", i * 1_000 / lines_per_second)).collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "ns", "name": "lte", "labels": {"isthmus.dev/trace": "true"}},
        "data": {"up": trace},
    }))
    .unwrap()
}

#[test]
fn a_trace_link_is_compiled_from_its_configmap_and_again_when_it_changes() {
    let mut p = planner_with(&[("c", "client", "n1", "10.0.0.1"), ("s", "server", "n2", "10.0.0.2")]);
    let mut traced = spec("client", "server", 10);
    traced.schedule = Some(serde_yaml::from_str("{trace: {configMap: lte, uplink: up, window: 500ms}}").unwrap());
    let key = isthmus_operator::index::ObjectKey::new("ns", "replay");
    p.apply_link(&link_object("ns", "replay", 1, traced));
    p.recompute();
    let error = p.link_facts(&key).unwrap().error.expect("no ConfigMap yet");
    assert_eq!(error.field, "spec.schedule.trace.configMap");
    assert!(error.message.contains("labelled isthmus.dev/trace"), "{}", error.message);

    p.apply_trace_map(&trace_map(1_000));
    p.recompute();
    assert_eq!(p.link_facts(&key).unwrap().error, None);
    let rates = |p: &Planner| -> Vec<Option<u64>> {
        let plan = p.node_plan("n1").unwrap();
        plan.timelines[0].timeline.phases().iter().map(|ph| ph.impairment.fields().rate_bps).collect()
    };
    assert_eq!(rates(&p), [Some(12_000_000), Some(12_000_000)], "two windows of 500 ms at 12 Mbit/s");

    // An edited trace reaches the plan without the link changing.
    p.apply_trace_map(&trace_map(500));
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1"]);
    assert_eq!(rates(&p), [Some(6_000_000), Some(6_000_000)]);

    // The ConfigMap gone: the link is refused again and its timeline leaves the plan.
    p.delete_trace_map(&isthmus_operator::index::ObjectKey::new("ns", "lte"));
    p.recompute();
    assert!(p.link_facts(&key).unwrap().error.is_some());
    assert!(p.node_plans().all(|plan| plan.timelines.is_empty()));
}
