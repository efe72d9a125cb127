//! The controller loop's pure work per event at 10,000 pods × 100 links (issue 32), printed as a table:
//! `cargo bench -p isthmus-operator --bench control`.
//!
//! The world is `plan.rs`'s 10,000-pod one (100 nodes of 100 pods; every link has sources on every node), with
//! every node's agent having confirmed its plan. Each row is what the controller task does, with no I/O, for:
//! - an agent report: node-42's agent confirms its plan (alternately: its report is cleared), then the link
//!   statuses it marks dirty are made (progress, facts, status) and the readiness gate of each of the node's
//!   pods is judged;
//! - an agent resync: node-42's agent confirms the same plan again under a new version;
//! - a pod event: a destination pod's IP changes, the planner recomputes, and then the same status and gate
//!   work for the links and nodes it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use isthmus_agent_api::{ApplyReply, Capabilities, NodePlan, PodOutcome, PodResult};
use isthmus_operator::controller::gates::links_state;
use isthmus_operator::controller::nodes::{AppliedPlan, NodeReport};
use isthmus_operator::controller::status::{ProgressLedger, link_status};
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::{Planner, compute};
use isthmus_test_kit::stats::Sorted;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

#[path = "support/worlds.rs"]
#[allow(dead_code, reason = "plan.rs uses the rest")]
mod worlds;

const NODE: &str = "node-42";

fn confirmed(plan: &NodePlan, version: u64) -> NodeReport {
    let capabilities = Capabilities { netem: true, htb: true, tbf: true, u32: true, ..Default::default() };
    let pods = plan.pods.iter().map(|p| PodResult::of(p, PodOutcome::Applied)).collect();
    let reply = ApplyReply {
        node: plan.node.clone(),
        version,
        stale: false,
        pods,
        capabilities: capabilities.clone(),
        leftovers: Vec::new(),
    };
    let plan = NodePlan { version, ..plan.clone() };
    NodeReport {
        applied: Some(AppliedPlan::new(Arc::new(plan), reply)),
        failure: None,
        capabilities: Some(capabilities),
    }
}

/// The controller's status and gate work once the plans or reports of `nodes` may have changed, and the links
/// in `dirty` (as `flush_statuses` and `flush_gates` do it); returns how many statuses and gates it made.
fn after(
    planner: &Planner,
    reports: &BTreeMap<String, NodeReport>,
    ledger: &mut ProgressLedger,
    dirty: &BTreeSet<ObjectKey>,
    nodes: &BTreeSet<String>,
) -> (usize, usize) {
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(2).unwrap());
    let mut dirty = dirty.clone();
    for node in nodes {
        dirty.extend(ledger.update(node, planner.node_plan(node), reports.get(node)));
    }
    let mut statuses = 0;
    for key in &dirty {
        let Some(facts) = planner.link_facts(key) else { continue };
        std::hint::black_box(link_status(&facts, ledger.progress(key).as_ref(), None, &now));
        statuses += 1;
    }
    let mut gates = 0;
    for node in nodes {
        for pod in planner.node_plan(node).into_iter().flat_map(|p| &p.pods) {
            std::hint::black_box(links_state(planner, reports, &ObjectKey::new(&pod.namespace, &pod.name)));
            gates += 1;
        }
    }
    (statuses, gates)
}

struct Row {
    scenario: &'static str,
    median: Duration,
    max: Duration,
    detail: String,
}

fn row(scenario: &'static str, samples: Vec<Duration>, detail: String) -> Row {
    let sorted = Sorted::new(samples).expect("at least one run");
    Row { scenario, median: sorted.median(), max: sorted.max(), detail }
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 2 } else { 41 };
    let mut planner = compute(worlds::ten_thousand_pods_hundred_links());
    let mut reports: BTreeMap<String, NodeReport> =
        planner.node_plans().map(|p| (p.node.clone(), confirmed(p, 1))).collect();
    let node_plan = planner.node_plan(NODE).expect("node-42 has a plan").clone();
    let mut ledger = ProgressLedger::default();
    let all: BTreeSet<String> = reports.keys().cloned().collect();
    after(&planner, &reports, &mut ledger, &BTreeSet::new(), &all);
    let none = BTreeSet::new();
    let mut rows = Vec::new();

    let (mut samples, mut made) = (Vec::with_capacity(runs), (0, 0));
    for i in 0..runs {
        let start = Instant::now();
        if i % 2 == 0 {
            reports.remove(NODE);
        } else {
            reports.insert(NODE.into(), confirmed(&node_plan, 1));
        }
        made = after(&planner, &reports, &mut ledger, &none, &BTreeSet::from([NODE.to_owned()]));
        samples.push(start.elapsed());
    }
    rows.push(row("agent report: confirmed / cleared", samples, format!("{} statuses, {} gates", made.0, made.1)));

    let mut samples = Vec::with_capacity(runs);
    for i in 0..runs {
        let start = Instant::now();
        reports.insert(NODE.into(), confirmed(&node_plan, 2 + i as u64));
        made = after(&planner, &reports, &mut ledger, &none, &BTreeSet::from([NODE.to_owned()]));
        samples.push(start.elapsed());
    }
    rows.push(row("agent resync: same plan, new version", samples, format!("{} statuses, {} gates", made.0, made.1)));

    let key = ObjectKey::new("ns-3", "app-4-7");
    let original = planner.index().pods[&key].clone();
    let mut moved = original.clone();
    moved.ips = vec!["10.200.0.1".parse().unwrap()];
    let (mut samples, mut changed) = (Vec::with_capacity(runs), 0);
    for i in 0..runs {
        let next = if i % 2 == 0 { moved.clone() } else { original.clone() };
        let start = Instant::now();
        planner.upsert_pod(key.clone(), next);
        let changes = planner.recompute();
        let nodes: BTreeSet<String> = changes.nodes.iter().cloned().collect();
        made = after(&planner, &reports, &mut ledger, &changes.links.iter().cloned().collect(), &nodes);
        samples.push(start.elapsed());
        changed = changes.nodes.len();
    }
    rows.push(row(
        "pod event: a destination's IP changes",
        samples,
        format!("{changed} node plans changed, {} statuses, {} gates", made.0, made.1),
    ));

    println!("| event (10,000 pods × 100 links, 100 nodes) | median | max | notes |");
    println!("|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.3} ms | {:.3} ms | {}, {runs} runs |",
            r.scenario,
            r.median.as_secs_f64() * 1e3,
            r.max.as_secs_f64() * 1e3,
            r.detail
        );
    }
}
