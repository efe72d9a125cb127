//! Agent benchmark (rerunnable; root): the agent binary applies a plan of 100 pods × 100 destinations (rate-only
//! trees) on one node made of 100 throwaway network namespaces. Prints, per phase, the time from call to
//! reply (median and range over the rounds) and the agent's resident memory.
//!
//! `cargo bench -p isthmus-agent --bench agent_apply` (env `ROUNDS`, default 3).

#[path = "../tests/agent_common/mod.rs"]
mod agent_common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, TestCerts};
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{LinkRef, NodePlan, PodOutcome, PodPlan};
use isthmus_test_kit::stats::Sorted;

const NODE: &str = "node-bench";
const PODS: usize = 100;
const DESTINATIONS: usize = 100;

fn plan(fleet: &Fleet, version: u64, pods: usize, rate_base: u64) -> NodePlan {
    NodePlan {
        node: NODE.into(),
        version,
        pods: (0..pods)
            .map(|i| {
                let destinations = (0..DESTINATIONS).map(|d| {
                    let to = IpAddr::from([10, 245, (d / 250) as u8, (d % 250 + 1) as u8]);
                    let link = LinkRef { namespace: "bench".into(), ..link(&format!("link-{d}")) };
                    destination(to, rate(rate_base + d as u64 * 1000), link)
                });
                let pod = pod(&format!("uid-{i}"), &format!("pod-{i}"), &[fleet.ips[i]], destinations.collect());
                PodPlan { namespace: "bench".into(), ..pod }
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-bench-");
    let setup = Instant::now();
    let fleet = Fleet::new("isth-ab-", PODS, &pinned, [10, 244]);
    eprintln!("{PODS} namespaces with veths created in {:.1} s", setup.elapsed().as_secs_f64());
    let certs = TestCerts::new(NODE);
    let agent = Agent::start(&AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &pinned,
        log_dir: work.path(),
        extra_env: vec![],
    });
    let client = certs.operator();
    let (rss_idle, _) = agent.rss_kib();
    let split_idle = agent.rss_split_kib();

    let phases = [
        "apply (empty node)",
        "apply (unchanged)",
        "apply (every rate changed)",
        "observe (10,000 links)",
        "apply (empty plan: remove all)",
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); phases.len()];
    let mut rss_after = Vec::new();
    // Per phase, the highest peak (VmHWM) over the rounds: the peak is reset before each phase.
    let mut phase_peaks = vec![0u64; phases.len()];
    // Per phase, the resident size right after it (max over the rounds).
    let mut phase_after = vec![0u64; phases.len()];
    let mut version = 0;
    for round in 0..rounds {
        let timed_apply = |plan: NodePlan| {
            let client = &client;
            let api = agent.api;
            let agent = &agent;
            async move {
                agent.reset_peak_rss();
                let start = Instant::now();
                let reply = client.apply(api, &plan).await.expect("apply");
                let elapsed = start.elapsed().as_secs_f64();
                assert!(
                    reply.pods.iter().all(|p| p.outcome == PodOutcome::Applied),
                    "{:?}",
                    reply.pods.iter().find(|p| p.outcome != PodOutcome::Applied)
                );
                (elapsed, reply.pods.iter().map(|p| p.mutations).sum::<u64>())
            }
        };
        version += 1;
        let (t, m_cold) = timed_apply(plan(&fleet, version, PODS, 10_000_000)).await;
        times[0].push(t);
        phase_peaks[0] = phase_peaks[0].max(agent.rss_kib().1);
        phase_after[0] = phase_after[0].max(agent.rss_kib().0);
        version += 1;
        let (t, m_same) = timed_apply(plan(&fleet, version, PODS, 10_000_000)).await;
        assert_eq!(m_same, 0, "an unchanged plan sends nothing");
        times[1].push(t);
        phase_peaks[1] = phase_peaks[1].max(agent.rss_kib().1);
        phase_after[1] = phase_after[1].max(agent.rss_kib().0);
        version += 1;
        let (t, m_changed) = timed_apply(plan(&fleet, version, PODS, 20_000_000)).await;
        times[2].push(t);
        phase_peaks[2] = phase_peaks[2].max(agent.rss_kib().1);
        phase_after[2] = phase_after[2].max(agent.rss_kib().0);
        agent.reset_peak_rss();
        let start = Instant::now();
        let observed = client.observed(agent.api, NODE).await.unwrap();
        times[3].push(start.elapsed().as_secs_f64());
        phase_peaks[3] = phase_peaks[3].max(agent.rss_kib().1);
        phase_after[3] = phase_after[3].max(agent.rss_kib().0);
        assert_eq!(observed.pods.iter().map(|p| p.destinations.len()).sum::<usize>(), PODS * DESTINATIONS);
        rss_after.push((agent.rss_kib().0, agent.rss_split_kib()));
        version += 1;
        let (t, _) = timed_apply(NodePlan { node: NODE.into(), version, pods: vec![], ..Default::default() }).await;
        times[4].push(t);
        phase_peaks[4] = phase_peaks[4].max(agent.rss_kib().1);
        phase_after[4] = phase_after[4].max(agent.rss_kib().0);
        eprintln!("round {round}: mutations cold {m_cold}, unchanged {m_same}, changed {m_changed}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (rss_end, _) = agent.rss_kib();
    let hwm = phase_peaks.iter().copied().max().unwrap_or(0);
    println!("\n### Agent: {PODS} pods × {DESTINATIONS} destinations, rate-only trees, {rounds} rounds\n");
    println!("| phase | median (s) | min (s) | max (s) |");
    println!("|---|---|---|---|");
    for (phase, t) in phases.iter().zip(times) {
        let t = Sorted::new(t).expect("every phase timed in every round");
        let (m, lo, hi) = (t.median(), t.min(), t.max());
        println!("| {phase} | {m:.3} | {lo:.3} | {hi:.3} |");
    }
    let (max_rss, split_max) = rss_after.iter().copied().max_by_key(|r| r.0).unwrap_or_default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let split = |(anon, file): (u64, u64)| format!("{:.1} / {:.1}", mib(anon), mib(file));
    println!("\n| agent memory | MiB | anonymous / mapped from files (MiB) |\n|---|---|---|");
    println!("| resident after start (adoption, no plan) | {:.1} | {} |", mib(rss_idle), split(split_idle));
    println!(
        "| resident with 10,000 links installed, after observe (max over rounds) | {:.1} | {} |",
        mib(max_rss),
        split(split_max)
    );
    println!("| resident at the end | {:.1} | {} |", mib(rss_end), split(agent.rss_split_kib()));
    println!("\n| phase | peak resident during it (VmHWM, MiB) | resident right after it (MiB) |\n|---|---|---|");
    for ((phase, peak), after) in phases.iter().zip(&phase_peaks).zip(&phase_after) {
        println!("| {phase} | {:.1} | {:.1} |", *peak as f64 / 1024.0, *after as f64 / 1024.0);
    }
    println!("\npeak resident over all phases (VmHWM): {:.1} MiB", hwm as f64 / 1024.0);
}
