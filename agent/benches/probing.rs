//! Probing benchmark (rerunnable; root): what `--verify` costs an agent that applied 100 pods × 100
//! destinations (rate-only trees). 100 throwaway pod namespaces are bridged in a hub namespace, which stands
//! for the node (the baseline's origin); every pod's destinations are the other 99 pods and the hub, so every
//! probe is answered. For each round an agent is started with verification off and one with it on (default
//! `--probe-rate 10`, `--probe-pairs-per-link 4`, `--probe-window 30s`), the plan applied, and after a settling
//! time the agent's CPU (user + system, from /proc) and resident memory are read over a measuring period. The
//! probe traffic is the probes counted by the agent's own `isthmus_link_probes_sent_total`, times the bytes of
//! an echo request and its reply on the wire.
//!
//! `cargo bench -p isthmus-agent --bench probing` (env `ROUNDS`, default 3; `SECONDS`, default 30).

#[path = "../tests/agent_common/mod.rs"]
mod agent_common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, TestCerts, ip};
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{LinkRef, NodePlan, PodOutcome, PodPlan};
use isthmus_test_kit::stats::median;

const NODE: &str = "node-probe-bench";
const PODS: usize = 100;
/// An IPv4 echo request or reply on an Ethernet link: 14 (Ethernet) + 20 (IP) + 8 (ICMP) + 16 (payload).
const ECHO_FRAME_BYTES: f64 = 58.0;

fn plan(fleet: &Fleet, hub: IpAddr) -> NodePlan {
    let pods = (0..PODS)
        .map(|i| {
            let others = fleet.ips.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, ip)| *ip);
            let destinations = others.chain([hub]).enumerate().map(|(d, to)| {
                let link = LinkRef { namespace: "bench".into(), ..link(&format!("link-{d}")) };
                destination(to, rate(10_000_000), link)
            });
            let pod = pod(&format!("uid-{i}"), &format!("pod-{i}"), &[fleet.ips[i]], destinations.collect());
            PodPlan { namespace: "bench".into(), ..pod }
        })
        .collect();
    NodePlan { node: NODE.into(), version: 1, pods, ..Default::default() }
}

/// The agent's user + system CPU time so far, in seconds.
fn cpu_seconds(agent: &Agent) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", agent.child.id())).unwrap();
    // The command name may hold spaces: the fields after its closing parenthesis are fixed.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf only reads a constant of the system.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn probes_sent(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("isthmus_link_probes_sent_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

struct Sample {
    cpu_percent: f64,
    rss_mib: f64,
    peak_mib: f64,
    probes_per_second: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let seconds: u64 = std::env::var("SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-pbench-");
    let fleet = Fleet::new("isth-pb-", PODS, &pinned, [10, 242]);
    // The hub bridges every pod's veth and holds the node's address in the pods' /16.
    let hub_ip = IpAddr::from([10, 242, 255, 1]);
    ip(&["-n", &fleet.hub.name, "link", "add", "br0", "type", "bridge"]);
    for i in 0..PODS {
        ip(&["-n", &fleet.hub.name, "link", "set", &format!("h{i}"), "master", "br0", "up"]);
    }
    ip(&["-n", &fleet.hub.name, "addr", "add", &format!("{hub_ip}/16"), "dev", "br0"]);
    ip(&["-n", &fleet.hub.name, "link", "set", "br0", "up"]);
    let certs = TestCerts::new(NODE);
    let tls_dir = certs.agent_dir();
    let client = certs.operator();
    let hub_path = fleet.hub.path().display().to_string();

    let mut samples: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (index, verify) in [(0, false), (1, true)] {
            let agent = Agent::start(&AgentOptions {
                node: NODE,
                tls_dir: &tls_dir,
                proc: &proc_dir,
                netns_dir: &pinned,
                log_dir: work.path(),
                extra_env: vec![
                    ("ISTHMUS_VERIFY", verify.to_string()),
                    ("ISTHMUS_PROBE_BASELINE_NETNS", hub_path.clone()),
                ],
            });
            let reply = client.apply(agent.api, &plan(&fleet, hub_ip)).await.expect("apply");
            assert!(reply.pods.iter().all(|p| p.outcome == PodOutcome::Applied), "{:?}", reply.pods.first());
            // Settle: the apply's own work and the prober's sockets are done with.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let (cpu_before, sent_before, started) =
                (cpu_seconds(&agent), probes_sent(&certs.metrics(agent.api)), Instant::now());
            agent.reset_peak_rss();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let elapsed = started.elapsed().as_secs_f64();
            let (rss, peak) = agent.rss_kib();
            let sample = Sample {
                cpu_percent: (cpu_seconds(&agent) - cpu_before) / elapsed * 100.0,
                rss_mib: rss as f64 / 1024.0,
                peak_mib: peak as f64 / 1024.0,
                probes_per_second: (probes_sent(&certs.metrics(agent.api)) - sent_before) / elapsed,
            };
            if verify {
                let (code, body) = certs.get(agent.api, "operator", isthmus_agent_api::measure::MEASURED_PATH);
                assert_eq!(code, 200, "{body}");
                let state: isthmus_agent_api::measure::MeasuredState = serde_json::from_str(&body).unwrap();
                let answered: u64 = state.links.iter().map(|m| m.impaired.answered).sum();
                eprintln!(
                    "round {round}: {} links measured, {answered} answered in their last windows",
                    state.links.len()
                );
            }
            eprintln!(
                "round {round}, verify {verify}: CPU {:.2} %, RSS {:.1} MiB (peak {:.1}), {:.2} probes/s",
                sample.cpu_percent, sample.rss_mib, sample.peak_mib, sample.probes_per_second
            );
            samples[index].push(sample);
        }
    }
    let [off, on] = samples;
    let column = |s: &[Sample], f: fn(&Sample) -> f64| median(&s.iter().map(f).collect::<Vec<_>>());
    println!("\n### Probing: {PODS} pods × {PODS} destinations, 100 links, {rounds} rounds of {seconds} s, medians\n");
    println!("| | --verify=false | --verify=true (defaults) |\n|---|---|---|");
    println!(
        "| agent CPU (user + system) | {:.2} % | {:.2} % |",
        column(&off, |s| s.cpu_percent),
        column(&on, |s| s.cpu_percent)
    );
    println!(
        "| agent resident memory | {:.1} MiB | {:.1} MiB |",
        column(&off, |s| s.rss_mib),
        column(&on, |s| s.rss_mib)
    );
    println!(
        "| agent peak resident during the period | {:.1} MiB | {:.1} MiB |",
        column(&off, |s| s.peak_mib),
        column(&on, |s| s.peak_mib)
    );
    let pps = column(&on, |s| s.probes_per_second);
    println!("| probes sent | {:.2} /s | {pps:.2} /s |", column(&off, |s| s.probes_per_second));
    println!(
        "| probe traffic on the wire (request + reply) | 0 B/s | {:.0} B/s ({:.1} kbit/s) |",
        pps * 2.0 * ECHO_FRAME_BYTES,
        pps * 2.0 * ECHO_FRAME_BYTES * 8.0 / 1000.0
    );
}
