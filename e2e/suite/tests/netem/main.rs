//! End-to-end scenarios of netem's impairments: latency, jitter, loss, duplication, corruption, reordering, a long
//! fat network, head-of-line blocking, Service traffic, rescheduling, a pending pod's init container, edits, the kernel-dependent duplicate
//! restriction, a link's measurement of itself, and a NetworkTopology's matrix of regions — each measured from inside pods with isthmus-probe, against a baseline measured in the same run.
//! Through the tc datapath on nodes whose kernel has sch_netem (the vm provider here, kind on GitHub's runners),
//! through the userspace datapath on nodes without it (this machine's kernel, the local provider):
//! `ISTHMUS_E2E_DATAPATH`, set by e2e/suite/run.
//!
//! Each scenario asserts what a busy machine cannot fake (gates) and reports two-sided figures beside their bands
//! (isthmus_e2e::verdict). Two modes:
//! - `netem [FILTER...]` (make e2e, make e2e-vm): each selected scenario once; exit status 0 when every gate held.
//!   The end of the output lists each scenario, the reports outside their band, and a `FAILED: scenario <name>:
//!   <reason>` line per failed one.
//! - `netem --fidelity RUNS [FILTER...]` (make fidelity): each selected scenario RUNS times, then a table of every
//!   figure, configured band against the median measured; never fails for a figure (a report).
//!
//! A plain binary (`harness = false`): the scenarios share one namespace of probe pods, started once (a pod
//! takes tens of seconds to start on emulated nodes), and run one at a time; each removes its links when it ends,
//! pass or fail. Arguments select scenarios by substring; flags of the libtest harness are ignored.

mod bands;
mod fidelity;
mod fixture;
mod scenarios;

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use fixture::Fixture;
use isthmus_e2e::verdict::{self, Figure, Kind};

type Scenario = (&'static str, fn(&Fixture));

const SCENARIOS: &[Scenario] = &[
    ("latency_and_jitter", scenarios::latency::latency_and_jitter),
    ("asymmetric_profile_lte", scenarios::latency::asymmetric_profile_lte),
    ("random_loss", scenarios::loss::random_loss),
    ("gilbert_elliott_loss", scenarios::loss::gilbert_elliott_loss),
    ("duplication", scenarios::packets::duplication),
    ("corruption", scenarios::packets::corruption),
    ("reordering", scenarios::packets::reordering),
    ("long_fat_network", scenarios::throughput::long_fat_network),
    ("no_head_of_line_blocking", scenarios::throughput::no_head_of_line_blocking),
    ("service_traffic", scenarios::latency::service_traffic),
    ("rescheduling", scenarios::lifecycle::rescheduling),
    ("impaired_while_pending", scenarios::first_packet::impaired_while_pending),
    ("held_from_the_first_packet", scenarios::first_packet::held_from_the_first_packet),
    ("edit_and_delete", scenarios::lifecycle::edit_and_delete),
    ("duplicate_restriction_follows_the_kernel", scenarios::packets::duplicate_restriction_follows_the_kernel),
    ("measured_follows_the_link", scenarios::measured::measured_follows_the_link),
    ("topology_matrix", scenarios::topology::topology_matrix),
    ("schedule_switches_phases", scenarios::schedule::schedule_switches_phases),
    ("flap_drops_all_while_down", scenarios::schedule::flap_drops_all_while_down),
    ("both_nodes_switch_together", scenarios::schedule::both_nodes_switch_together),
    ("trace_caps_each_window", scenarios::schedule::trace_caps_each_window),
];

/// Scenarios left out on the userspace datapath, and why. Each costs minutes of waiting for probe windows; on this
/// machine's cluster the measurement is checked by the e2e and no_netem suites (a bandwidth-only link conforms, a
/// link that cannot apply is Unmeasurable) and through the userspace datapath by agent/tests/agent_measure.rs.
const TC_ONLY: &[(&str, &str)] = &[(
    "measured_follows_the_link",
    "issue 15's proof runs in the stock-kernel cluster (make e2e-vm); the userspace datapath's probes are checked by \
     agent/tests/agent_measure.rs",
)];

/// One run of one scenario.
pub struct Outcome {
    pub name: &'static str,
    /// The panic's message when a gate (or the set-up) failed.
    pub failure: Option<String>,
    pub took: Duration,
    pub figures: Vec<Figure>,
}

fn message(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs one scenario, pass or fail, and keeps what it measured.
pub fn run_one(fixture: &Fixture, &(name, run): &Scenario) -> Outcome {
    println!("\n==== scenario {name}");
    verdict::take();
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| run(fixture)));
    let took = start.elapsed();
    let failure = outcome.err().map(|p| message(p.as_ref()));
    if failure.is_some() {
        isthmus_e2e::print_isthmus_logs(took);
    }
    println!("==== scenario {name}: {} in {took:.1?}", if failure.is_none() { "ok" } else { "FAILED" });
    Outcome { name, failure, took, figures: verdict::take() }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fidelity_runs = args.iter().position(|a| a == "--fidelity").map(|i| {
        args.get(i + 1).and_then(|n| n.parse::<u32>().ok()).filter(|n| *n > 0).expect("--fidelity RUNS (a count > 0)")
    });
    let filters: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !(a.starts_with('-') || *i > 0 && args[i - 1] == "--fidelity"))
        .map(|(_, a)| a)
        .collect();
    let userspace = isthmus_e2e::datapath() == isthmus_e2e::Datapath::Userspace;
    let selected: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .filter(|(name, _)| match TC_ONLY.iter().find(|(n, _)| n == name) {
            Some((_, why)) if userspace => {
                println!("netem: {name} not run on the userspace datapath: {why}");
                false
            }
            _ => true,
        })
        .collect();
    if selected.is_empty() {
        // as libtest does with a filter that matches nothing
        println!("netem: no scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }
    println!("netem: {} scenario(s)", selected.len());
    let fixture = Fixture::new();
    if let Some(runs) = fidelity_runs {
        let table = fidelity::run(&fixture, &selected, runs);
        drop(fixture);
        println!("{table}");
        return ExitCode::SUCCESS;
    }
    let results: Vec<Outcome> = selected.iter().map(|s| run_one(&fixture, s)).collect();
    drop(fixture);
    println!("\nnetem scenarios:");
    for r in &results {
        println!("  {:<42} {:<6} {:>8.1?}", r.name, if r.failure.is_none() { "ok" } else { "FAILED" }, r.took);
    }
    let outside: Vec<String> = results
        .iter()
        .flat_map(|r| r.figures.iter().filter(|f| f.kind == Kind::Report && !f.holds()).map(move |f| (r.name, f)))
        .map(|(name, f)| format!("  {name}: {}: {:.3} outside [{:.3}, {:.3}]", f.what, f.measured, f.band.0, f.band.1))
        .collect();
    if !outside.is_empty() {
        println!("reports outside their band (not gates; make fidelity tabulates them):\n{}", outside.join("\n"));
    }
    let failed: Vec<&Outcome> = results.iter().filter(|r| r.failure.is_some()).collect();
    for r in &failed {
        println!("FAILED: scenario {}: {}", r.name, r.failure.as_deref().unwrap_or_default());
    }
    println!("netem: {} passed, {} failed", results.len() - failed.len(), failed.len());
    if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
