//! End-to-end scenarios of netem's impairments: latency, jitter, loss, duplication, corruption, reordering, a long
//! fat network, head-of-line blocking, Service traffic, rescheduling, edits, and the kernel-dependent duplicate
//! restriction — each measured from inside pods with isthmus-probe, against a baseline measured in the same run.
//! Through the tc datapath on nodes whose kernel has sch_netem (the vm provider here, kind on GitHub's runners),
//! through the userspace datapath on nodes without it (this machine's kernel, the local provider):
//! `ISTHMUS_E2E_DATAPATH`, set by e2e/suite/run.
//!
//! A plain binary (`harness = false`): the scenarios share one namespace of probe pods, started once (a pod
//! takes tens of seconds to start on emulated nodes), and run one at a time; each removes its links when it ends,
//! pass or fail. Arguments select scenarios by substring; flags of the libtest harness are ignored.
//! Exit status: 0 when every selected scenario passed.

mod bands;
mod fixture;
mod scenarios;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::Instant;

use fixture::Fixture;

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
    ("edit_and_delete", scenarios::lifecycle::edit_and_delete),
    ("duplicate_restriction_follows_the_kernel", scenarios::packets::duplicate_restriction_follows_the_kernel),
];

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<&Scenario> =
        SCENARIOS.iter().filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f))).collect();
    if selected.is_empty() {
        // as libtest does with a filter that matches nothing
        println!("netem: no scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }
    println!("netem: {} scenario(s)", selected.len());
    let fixture = Fixture::new();
    let mut results = Vec::new();
    for (name, run) in selected {
        println!("\n==== scenario {name}");
        let start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&fixture)));
        let took = start.elapsed();
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!("==== scenario {name}: {verdict} in {took:.1?}");
        results.push((*name, outcome.is_ok(), took));
    }
    drop(fixture);
    println!("\nnetem scenarios:");
    for (name, ok, took) in &results {
        println!("  {name:<42} {:<6} {took:>8.1?}", if *ok { "ok" } else { "FAILED" });
    }
    let failed = results.iter().filter(|(_, ok, _)| !ok).count();
    println!("netem: {} passed, {failed} failed", results.len() - failed);
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
