//! The ledger against [`progress`] from scratch: after any sequence of plans and reports, updating only the
//! nodes whose input changed gives every link the progress a full recomputation gives, and the links it marks
//! are at least those whose progress changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use isthmus_agent_api::test_util::{self, destination, impairment, link, rate};
use isthmus_agent_api::{
    ApplyReply, Capabilities, DatapathKind, ImpairmentFields, NodePlan, PodError, PodErrorKind, PodOutcome, PodResult,
    QueueCap, RefusedDestination,
};
use proptest::prelude::*;

use super::ProgressLedger;
use crate::controller::nodes::{AgentFailure, AppliedPlan, NodeReport};
use crate::controller::status::progress;
use crate::failure::FailureReason;
use crate::index::ObjectKey;

const NODES: usize = 3;
const LINKS: usize = 3;

/// One node's input: per pod, how many destinations each link gives it; and what its agent said.
#[derive(Debug, Clone)]
struct NodeInput {
    pods: Vec<[u8; LINKS]>,
    /// 0: no report, 1: the plan did not reach the agent, 2: the agent confirmed this plan, 3: an older one.
    report: u8,
    /// Which pods the agent failed, which had a destination refused, which a queue cut.
    failed: u8,
    refused: u8,
    capped: u8,
    netem: bool,
    userspace: bool,
}

fn node_input() -> impl Strategy<Value = NodeInput> {
    (
        prop::collection::vec(prop::array::uniform3(0u8..3), 0..4),
        0u8..4,
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(pods, report, failed, refused, capped, netem, userspace)| NodeInput {
            pods,
            report,
            failed,
            refused,
            capped,
            netem,
            userspace,
        })
}

fn plan(node: usize, pods: &[[u8; LINKS]]) -> NodePlan {
    let pods = pods
        .iter()
        .enumerate()
        .filter(|(_, counts)| counts.iter().any(|c| *c > 0))
        .map(|(p, counts)| {
            let mut destinations = Vec::new();
            for (l, count) in counts.iter().enumerate() {
                for d in 0..*count {
                    // l1 is rate only: its pairs need no netem.
                    let imp = if l == 1 {
                        rate(1_000_000)
                    } else {
                        impairment(ImpairmentFields { latency: Some(Duration::from_millis(5)), ..Default::default() })
                    };
                    let to: ipnet::IpNet = format!("10.{l}.{p}.{d}/32").parse().unwrap();
                    destinations.push(destination(to, imp, link(&format!("l{l}"))));
                }
            }
            let name = format!("n{node}-p{p}");
            test_util::pod(&format!("uid-{name}"), &name, &[format!("10.9.{node}.{p}").parse().unwrap()], destinations)
        })
        .collect();
    NodePlan { node: format!("n{node}"), version: 0, pods, ..Default::default() }
}

fn report(node: usize, input: &NodeInput) -> Option<NodeReport> {
    let capabilities = Capabilities {
        netem: input.netem,
        htb: true,
        tbf: true,
        u32: true,
        datapath: if input.userspace { DatapathKind::Userspace } else { DatapathKind::default() },
        ..Default::default()
    };
    let applied = match input.report {
        0 => return None,
        1 => {
            let failure = AgentFailure { reason: FailureReason::AgentUnreachable, message: "refused".into() };
            return Some(NodeReport { failure: Some(failure), ..Default::default() });
        }
        2 => plan(node, &input.pods),
        // An older plan: every pod's first link had one destination more.
        _ => plan(node, &input.pods.iter().map(|c| [c[0] + 1, c[1], c[2]]).collect::<Vec<_>>()),
    };
    let bit = |bits: u8, i: usize| bits >> (i % 8) & 1 == 1;
    let pods = applied
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let error = |kind| PodError { kind, message: format!("{} failed", p.name) };
            let first = p.destinations.first().expect("a planned pod has a destination");
            let outcome = match bit(input.failed, i) {
                true => PodOutcome::Failed(error(PodErrorKind::KernelUnsupported)),
                false => PodOutcome::Applied,
            };
            PodResult {
                mutations: 1,
                queue_caps: bit(input.capped, i)
                    .then(|| QueueCap {
                        destination: first.destination,
                        link: (*first.link).clone(),
                        requested_packets: 50_000,
                        installed_packets: 1_000 + i as u32,
                    })
                    .into_iter()
                    .collect(),
                refused: bit(input.refused, i)
                    .then(|| RefusedDestination {
                        destination: first.destination,
                        link: (*first.link).clone(),
                        error: error(PodErrorKind::InvalidPlan),
                    })
                    .into_iter()
                    .collect(),
                ..PodResult::of(p, outcome)
            }
        })
        .collect();
    let reply = ApplyReply {
        node: applied.node.clone(),
        version: 1,
        stale: false,
        pods,
        capabilities: capabilities.clone(),
        leftovers: Vec::new(),
    };
    Some(NodeReport {
        applied: Some(AppliedPlan::new(Arc::new(applied), reply)),
        failure: None,
        capabilities: Some(capabilities),
    })
}

type World = (BTreeMap<String, NodePlan>, BTreeMap<String, NodeReport>);

fn world(inputs: &[NodeInput]) -> World {
    let mut plans = BTreeMap::new();
    let mut reports = BTreeMap::new();
    for (n, input) in inputs.iter().enumerate() {
        let p = plan(n, &input.pods);
        if !p.pods.is_empty() {
            plans.insert(p.node.clone(), p);
        }
        if let Some(r) = report(n, input) {
            reports.insert(format!("n{n}"), r);
        }
    }
    (plans, reports)
}

fn links() -> Vec<ObjectKey> {
    (0..LINKS).map(|l| ObjectKey::new("default", format!("l{l}"))).collect()
}

proptest! {
    #[test]
    fn updating_the_changed_nodes_equals_progress_from_scratch(
        steps in prop::collection::vec(prop::collection::vec(node_input(), NODES), 1..6),
    ) {
        let mut ledger = ProgressLedger::default();
        let (mut plans, mut reports): World = Default::default();
        let mut before = progress(plans.values(), &reports);
        for inputs in &steps {
            let (new_plans, new_reports) = world(inputs);
            let mut marked = BTreeSet::new();
            for n in 0..NODES {
                let node = format!("n{n}");
                if plans.get(&node) != new_plans.get(&node) || reports.get(&node) != new_reports.get(&node) {
                    marked.extend(ledger.update(&node, new_plans.get(&node), new_reports.get(&node)));
                }
            }
            (plans, reports) = (new_plans, new_reports);
            let after = progress(plans.values(), &reports);
            for key in links() {
                let kept = ledger.progress(&key);
                prop_assert_eq!(kept.as_ref(), after.get(&key), "link {}", key);
                if before.get(&key) != after.get(&key) {
                    prop_assert!(marked.contains(&key), "link {} changed and was not marked", key);
                }
            }
            before = after;
        }
    }
}

#[test]
fn a_resync_that_confirms_the_same_plan_marks_nothing() {
    let input =
        NodeInput { pods: vec![[1, 2, 0]], report: 2, failed: 0, refused: 0, capped: 0, netem: true, userspace: false };
    let (plans, reports) = world(std::slice::from_ref(&input));
    let mut ledger = ProgressLedger::default();
    let first = ledger.update("n0", plans.get("n0"), reports.get("n0"));
    assert_eq!(first, links()[..2].iter().cloned().collect());
    let mut again = reports["n0"].clone();
    let applied = again.applied.take().unwrap();
    let reply = ApplyReply { version: 2, ..applied.reply.clone() };
    again.applied = Some(AppliedPlan::new(Arc::new(NodePlan { version: 2, ..(*applied.plan).clone() }), reply));
    assert!(ledger.update("n0", plans.get("n0"), Some(&again)).is_empty());
    assert_eq!(ledger.progress(&links()[1]).map(|p| p.applied), Some(2));
    assert_eq!(ledger.update("n0", None, Some(&again)), links()[..2].iter().cloned().collect());
    assert_eq!(ledger.progress(&links()[0]), None);
}
