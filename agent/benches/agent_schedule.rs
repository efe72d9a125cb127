//! Phase switching benchmark (rerunnable; root): the agent binary on one node of 100 throwaway network namespaces,
//! 100 pods × 10 destinations, every destination on one scheduled link.
//!
//! - Switching: the link's rate alternates 10 ↔ 20 Mbit/s every second, so at each instant all 1,000
//!   destinations change at once. Per switch, the agent's own account (its log line "phases switched"): from the
//!   scheduled instant to its timer waking (`woke_after_ms`) and to every change acknowledged by the kernel
//!   (`done_after_ms`, also the histogram `isthmus_agent_phase_switch_seconds`). p50 and p99 over the switches.
//! - Ramp: a rate ramp of 100 ms steps over the same 1,000 destinations; the agent's CPU time (utime + stime
//!   from /proc) over its wall time, beside the same span with no schedule.
//!
//! `cargo bench -p isthmus-agent --bench agent_schedule` (env `SWITCHES`, default 30; `RAMP_SECONDS`, default 10).

#[path = "../tests/agent_common/mod.rs"]
mod agent_common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, TestCerts};
use isthmus_agent_api::schedule::{End, Phase, Timeline, TimelineFields};
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{LinkRef, LinkTimeline, NodePlan, PodOutcome, PodPlan, unix_ms_now};
use isthmus_test_kit::stats::quantile;

const NODE: &str = "node-bench";
const PODS: usize = 100;
const DESTINATIONS: usize = 10;

fn link_ref() -> LinkRef {
    LinkRef { namespace: "bench".into(), ..link("scheduled") }
}

fn plan(fleet: &Fleet, version: u64, timeline: Option<Timeline>) -> NodePlan {
    NodePlan {
        node: NODE.into(),
        version,
        pods: (0..PODS)
            .map(|i| {
                let destinations = (0..DESTINATIONS).map(|d| {
                    let to = IpAddr::from([10, 245, 0, (d + 1) as u8]);
                    destination(to, rate(10_000_000), link_ref())
                });
                let pod = pod(&format!("uid-{i}"), &format!("pod-{i}"), &[fleet.ips[i]], destinations.collect());
                PodPlan { namespace: "bench".into(), ..pod }
            })
            .collect(),
        timelines: timeline.into_iter().map(|timeline| LinkTimeline { link: link_ref(), timeline }).collect(),
        ..Default::default()
    }
}

fn timeline(start_unix_ms: u64, rates: impl Iterator<Item = u64>, step_ms: u64) -> Timeline {
    let phases = rates
        .enumerate()
        .map(|(k, bps)| Phase { duration_ms: step_ms, impairment: Arc::new(rate(bps)), name: format!("step {k}") })
        .collect();
    Timeline::try_from(TimelineFields { start_unix_ms, phases, end: End::Repeat, jitter: None }).expect("a timeline")
}

/// The agent's CPU time so far (utime + stime), in seconds.
fn cpu_seconds(agent: &Agent) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", agent.child.id())).unwrap();
    // Fields after the command name (which may hold spaces) start at ") ": utime and stime are 14 and 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn share_of_a_core(agent: &Agent, span: Duration) -> f64 {
    let (cpu, wall) = (cpu_seconds(agent), Instant::now());
    std::thread::sleep(span);
    (cpu_seconds(agent) - cpu) / wall.elapsed().as_secs_f64() * 100.0
}

/// `field=N` of the agent's "phases switched" log lines, in order.
fn switches(log: &str, field: &str) -> Vec<f64> {
    let key = format!("{field}=");
    log.lines()
        .filter(|l| l.contains("phases switched"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix(&key)).and_then(|v| v.parse().ok()))
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (switch_count, ramp_seconds) = (env("SWITCHES", 30), env("RAMP_SECONDS", 10));
    let dirs = agent_common::agent_dirs("isth-sched-");
    let fleet = Fleet::new("isth-sb-", PODS, &dirs.1, [10, 244]);
    let certs = TestCerts::new(NODE);
    // The text log carries colour codes unless told not to; the switches are read from it.
    let agent = Agent::start(&AgentOptions::in_dirs(NODE, &certs.agent_dir(), &dirs, &[("NO_COLOR", "1")]));
    let client = certs.operator();
    let apply = |plan: NodePlan| {
        let client = &client;
        async move {
            let reply = client.apply(agent.api, &plan).await.expect("apply");
            assert!(reply.pods.iter().all(|p| p.outcome == PodOutcome::Applied), "{:?}", reply.pods.first());
        }
    };

    apply(plan(&fleet, 1, None)).await;
    let idle = share_of_a_core(&agent, Duration::from_secs(ramp_seconds));

    let start = unix_ms_now() + 2_000;
    apply(plan(&fleet, 2, Some(timeline(start, [20_000_000, 10_000_000].into_iter(), 1_000)))).await;
    tokio::time::sleep(Duration::from_millis(2_000 + switch_count * 1_000 + 500)).await;
    let log = std::fs::read_to_string(&agent.log).unwrap();
    let (woke, done, mutations) =
        (switches(&log, "woke_after_ms"), switches(&log, "done_after_ms"), switches(&log, "mutations"));
    if (done.len() as u64) < switch_count {
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        panic!("{} switches logged, {switch_count} expected; the agent's log ends:\n{}", done.len(), tail.join("\n"));
    }

    // The ramp: 10 → 19.9 Mbit/s in 100 steps of 100 ms, again and again.
    let ramp_start = unix_ms_now() + 1_000;
    let steps = (0..100u64).map(|k| 10_000_000 + k * 100_000);
    apply(plan(&fleet, 3, Some(timeline(ramp_start, steps, 100)))).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let ramping = share_of_a_core(&agent, Duration::from_secs(ramp_seconds));
    let ramp_done = switches(&std::fs::read_to_string(&agent.log).unwrap(), "done_after_ms")[done.len()..].to_vec();

    println!("\n### Phase switching: {PODS} pods × {DESTINATIONS} destinations on one scheduled link\n");
    println!("| | switches | p50 (ms) | p99 (ms) | max (ms) |\n|---|---|---|---|---|");
    for (what, v) in [
        ("rate 10 ↔ 20 Mbit/s every 1 s: timer woke after the instant", &woke),
        ("rate 10 ↔ 20 Mbit/s every 1 s: every change acknowledged", &done),
        ("ramp of 100 ms steps: every change acknowledged", &ramp_done),
    ] {
        let max = v.iter().copied().fold(0.0, f64::max);
        println!("| {what} | {} | {:.0} | {:.0} | {max:.0} |", v.len(), quantile(v, 0.5), quantile(v, 0.99));
    }
    println!("\nnetlink changes per switch: median {:.0}", quantile(&mutations, 0.5));
    println!("\n| agent CPU over {ramp_seconds} s | % of one core |\n|---|---|");
    println!("| plan applied, no schedule | {idle:.1} |");
    println!("| ramp of 100 ms steps running | {ramping:.1} |");
}
