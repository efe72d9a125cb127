//! A link that changes with time, through the agent binary on this machine's kernel (rate-only trees): the agent
//! installs the link's own impairment before the timeline starts, each phase while it lasts (switched by its own
//! timer, no plan per step), and, restarted mid-schedule, the phase of that moment. Judged by the TBF rate read
//! from the pod's namespace: each phase must show within its own span, never a timed bound.

mod agent_common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use agent_common::{Agent, AgentOptions, Ns, TestCerts, veth};
use isthmus_agent_api::schedule::{End, Phase, Position, Timeline, TimelineFields};
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{LinkTimeline, NodePlan, PodOutcome, unix_ms_now};

const NODE: &str = "node-schedule";
const PHASE_MS: u64 = 2_000;

/// The rates of the TBFs on the pod's eth0 (`tc qdisc show`: `rate 20Mbit`).
fn rates(ns: &Ns) -> Vec<String> {
    ns.qdiscs("eth0")
        .lines()
        .filter(|l| l.starts_with("qdisc tbf "))
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "rate").nth(1).map(str::to_owned))
        .collect()
}

/// Waits until the pod's one TBF shows `want`, no later than `until_ms` (Unix ms): the phase's own span.
async fn shows_within(ns: &Ns, want: &str, until_ms: u64, what: &str) {
    loop {
        let now = rates(ns);
        if now == [want] {
            return;
        }
        assert!(unix_ms_now() < until_ms, "{what}: the TBF shows {now:?}, not {want}, at the end of its span");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_switches_a_links_phases_on_its_own_clock_and_resumes_them_after_a_restart() {
    let dirs = agent_common::agent_dirs("isth-sched-");
    let k = (std::process::id() % 200 + 20) as u8;
    let (pod_ip, peer_ip): (IpAddr, IpAddr) =
        (format!("10.226.{k}.2").parse().unwrap(), format!("10.226.{k}.1").parse().unwrap());
    let pod_ns = Ns::new_pinned("isth-sc-pod-", &dirs.1);
    let peer = Ns::new("isth-sc-peer-");
    veth(&pod_ns, "eth0", pod_ip, &peer, "eth0", peer_ip);
    let certs = TestCerts::new(NODE);
    let tls_dir = certs.agent_dir();
    let options = AgentOptions::in_dirs(NODE, &tls_dir, &dirs, &[("ISTHMUS_RESYNC_SECONDS", "0")]);
    let agent = Agent::start(&options);
    let client = certs.operator();

    // Own rate 10 Mbit/s until the start; then 20 and 30 Mbit/s, two seconds each, repeating.
    let start = unix_ms_now() + 1_500;
    let phase = |bps| Phase { duration_ms: PHASE_MS, impairment: Arc::new(rate(bps)), name: format!("{bps}") };
    let fields = TimelineFields {
        start_unix_ms: start,
        phases: vec![phase(20_000_000), phase(30_000_000)],
        end: End::Repeat,
        jitter: None,
    };
    let timeline = Timeline::try_from(fields).unwrap();
    let plan = |version| NodePlan {
        node: NODE.into(),
        version,
        pods: vec![pod("uid-s", "s", &[pod_ip], vec![destination(peer_ip, rate(10_000_000), link("flap"))])],
        timelines: vec![LinkTimeline { link: link("flap"), timeline: timeline.clone() }],
        ..Default::default()
    };
    let reply = client.apply(agent.api, &plan(1)).await.unwrap();
    assert_eq!(reply.pods[0].outcome, PodOutcome::Applied, "{reply:?}");
    assert_eq!(rates(&pod_ns), ["10Mbit"], "before the start: the link's own rate");

    // Each phase within its own span: phase 0, phase 1, and phase 0 of the next cycle.
    for (i, want) in ["20Mbit", "30Mbit", "20Mbit"].into_iter().enumerate() {
        let (from, to) = (start + i as u64 * PHASE_MS, start + (i as u64 + 1) * PHASE_MS);
        tokio::time::sleep(Duration::from_millis(from.saturating_sub(unix_ms_now()))).await;
        shows_within(&pod_ns, want, to, &format!("phase {i} (+{} ms)", from - start)).await;
    }
    assert!(agent.log_text().contains("phases switched"), "{}", agent.log_text());

    // Restarted mid-schedule, the agent installs the phase of that moment with the next plan.
    drop(agent);
    let agent = Agent::start(&options);
    let reply = client.apply(agent.api, &plan(2)).await.unwrap();
    assert_eq!(reply.pods[0].outcome, PodOutcome::Applied, "{reply:?}");
    let Position::In { phase, next_ms: Some(next), .. } = timeline.position(unix_ms_now()) else { panic!("repeating") };
    let want = if phase == 0 { "20Mbit" } else { "30Mbit" };
    shows_within(&pod_ns, want, next, "after the restart").await;
    drop(agent);
}
