//! The agent binary with the userspace datapath, as a node without sch_netem runs it (this machine's kernel
//! has none, so `auto` picks it): a plan's latency is emulated, the counters are observed, `kill -9` leaves the
//! pod's traffic flowing unimpaired, the restarted agent emulates again, and an empty plan removes the capture.

mod agent_common;
// The same UDP round trips as the datapaths crate's userspace tests.
#[path = "../datapaths/tests/echo/mod.rs"]
mod echo;

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, Ns, TestCerts, add_addr, ip, veth};
use echo::{ECHO_PORT, Echo, WAIT, median, round_trips};
use isthmus_agent_api::test_util::{destination, link, pod};
use isthmus_agent_api::{DatapathKind, Impairment, ImpairmentFields, NodePlan, PodOutcome};
use isthmus_datapaths::userspace::routing;

const NODE: &str = "node-userspace";

fn latency(ms: u64) -> Impairment {
    Impairment::try_from(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() }).unwrap()
}

fn plan(version: u64, pod_ip: IpAddr, to: &[(IpAddr, u64)]) -> NodePlan {
    let destinations = to.iter().map(|(ip, ms)| destination(*ip, latency(*ms), link("wan"))).collect();
    let pods = if to.is_empty() { vec![] } else { vec![pod("uid-u", "client", &[pod_ip], destinations)] };
    NodePlan { node: NODE.into(), version, pods, ..Default::default() }
}

fn probe(from: &Ns, dst: IpAddr, count: u32) -> f64 {
    let socket = from.run_in(|| UdpSocket::bind(("0.0.0.0", 0))).join().unwrap().unwrap();
    median(&round_trips(socket, dst, count, WAIT))
}

fn has_capture(pod: &Ns) -> bool {
    ip(&["-n", &pod.name, "-o", "link"]).contains("isth-u0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_datapath_emulates_fails_open_on_kill9_and_comes_back() {
    let dirs = agent_common::agent_dirs("isth-us-");
    let k = (std::process::id() % 200 + 20) as u8;
    let (pod_ip, far, near) =
        (IpAddr::from([10, 79, k, 1]), IpAddr::from([10, 79, k, 2]), IpAddr::from([10, 79, k, 3]));
    let client = Ns::new_pinned("isth-us-pod-", &dirs.1);
    let server = Ns::new("isth-us-srv-");
    veth(&client, "eth0", pod_ip, &server, "eth0", far);
    add_addr(&server, "eth0", near);
    let bind = |ip: IpAddr| server.run_in(move || UdpSocket::bind((ip, ECHO_PORT))).join().unwrap().unwrap();
    let _echoes = [Echo::serve(bind(far)), Echo::serve(bind(near))];

    let certs = TestCerts::new(NODE);
    let tls_dir = certs.agent_dir();
    let options = AgentOptions::in_dirs(NODE, &tls_dir, &dirs, &[("ISTHMUS_DATAPATH", "auto")]);
    let mut agent = Agent::start(&options);
    let operator = certs.operator();
    let capabilities = operator.capabilities(agent.api, NODE).await.unwrap();
    assert!(!capabilities.netem, "this test needs a kernel without sch_netem, as this machine's: {capabilities:?}");
    assert_eq!(capabilities.datapath, DatapathKind::Userspace, "auto without netem: {capabilities:?}");
    let metrics = certs.metrics(agent.api);
    assert!(metrics.contains("isthmus_agent_datapath{datapath=\"userspace\"} 1"), "{metrics}");

    let reply = operator.apply(agent.api, &plan(1, pod_ip, &[(far, 20)])).await.unwrap();
    assert_eq!(reply.pods[0].outcome, PodOutcome::Applied, "{reply:?}\n{}", agent.log_text());
    let (slow, fast) = (probe(&client, far, 100), probe(&client, near, 100));
    println!("through the agent: {slow:.3} ms to the 20 ms destination, {fast:.3} ms to the other");
    assert!((20.0..23.0).contains(&slow), "20 ms destination: median {slow} ms\n{}", agent.log_text());
    assert!(fast < 3.0, "unimpaired destination: median {fast} ms");
    let observed = operator.observed(agent.api, NODE).await.unwrap();
    let counters = observed.pods[0].destinations[0].counters;
    assert!(counters.packets >= 100, "the emulator's counters, observed: {observed:?}");
    let metrics = certs.metrics(agent.api);
    let sent = metrics.lines().find(|l| l.starts_with("isthmus_link_packets") && l.contains("link_name=\"wan\""));
    assert!(sent.is_some_and(|l| !l.ends_with(" 0")), "the link's packet counter from the emulator: {metrics}");
    // 100 probes 10 ms apart: the loop kept up, and says so.
    for reason in ["capture_overrun", "send_error", "malformed"] {
        let line = format!("isthmus_agent_userspace_lost_total{{reason=\"{reason}\"}} 0");
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in the metrics:\n{metrics}");
    }

    // kill -9: the agent's own namespace goes with it, the capture and its route with that namespace.
    agent.kill9();
    let deadline = Instant::now() + Duration::from_secs(10);
    while has_capture(&client) {
        assert!(Instant::now() < deadline, "the capture outlived the killed agent by 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = probe(&client, far, 50);
    println!("agent killed: {after:.3} ms");
    assert!(after < 3.0, "the pod's traffic is still delayed ({after} ms) or black-holed without the agent");

    // Back: the next plan emulates again; an empty one removes the capture and its routes.
    let mut agent = Agent::start(&options);
    let reply = operator.apply(agent.api, &plan(2, pod_ip, &[(far, 20)])).await.unwrap();
    assert_eq!(reply.pods[0].outcome, PodOutcome::Applied, "{reply:?}");
    let again = probe(&client, far, 50);
    println!("restarted agent: {again:.3} ms");
    assert!((20.0..23.0).contains(&again), "after the restart: median {again} ms\n{}", agent.log_text());
    let reply = operator.apply(agent.api, &plan(3, pod_ip, &[])).await.unwrap();
    assert!(reply.pods.is_empty(), "{reply:?}");
    assert!(!has_capture(&client), "an empty plan left the capture");
    let routes = ip(&["-n", &client.name, "route", "show", "table", "all"]);
    let left = routes.lines().any(|l| l.starts_with(&format!("{far} ")) || l.contains("isth-u0"));
    assert!(!left, "an empty plan left a route:\n{routes}");
    assert!(probe(&client, far, 50) < 3.0);
    agent.kill9();
}

/// One agent, one loop thread, 100 pods × 10 destinations: every pod captured, the agent's memory within the
/// issue's 100 MiB, and an empty plan takes every capture away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_emulates_100_pods_with_10_destinations_each() {
    const PODS: usize = 100;
    let dirs = agent_common::agent_dirs("isth-us100-");
    let fleet = Fleet::new("isth-u100-", PODS, &dirs.1, [10, 249]);
    let certs = TestCerts::new(NODE);
    let tls_dir = certs.agent_dir();
    let options = AgentOptions::in_dirs(NODE, &tls_dir, &dirs, &[("ISTHMUS_DATAPATH", "userspace")]);
    let agent = Agent::start(&options);
    let operator = certs.operator();
    let to: Vec<IpAddr> = (1..=10).map(|i| IpAddr::from([10, 250, 0, i])).collect();
    let pods = fleet
        .ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let destinations = to.iter().map(|d| destination(*d, latency(10 + i as u64 % 7), link("wan"))).collect();
            pod(&format!("uid-{i}"), &format!("pod-{i}"), &[*ip], destinations)
        })
        .collect();
    let reply = operator
        .apply(agent.api, &NodePlan { node: NODE.into(), version: 1, pods, ..Default::default() })
        .await
        .unwrap();
    let failed: Vec<_> = reply.pods.iter().filter(|p| p.outcome != PodOutcome::Applied).collect();
    assert!(failed.is_empty() && reply.pods.len() == PODS, "{failed:?}\n{}", agent.log_text());
    for ns in [&fleet.pods[0], &fleet.pods[PODS - 1]] {
        assert!(has_capture(ns), "{} has no capture", ns.name);
        let table = routing::TABLE.to_string();
        let routes = ip(&["-n", &ns.name, "route", "show", "table", &table, "dev", "isth-u0"]);
        assert_eq!(routes.lines().count(), 10, "{}: {routes}", ns.name);
    }
    let (rss, peak) = agent.rss_kib();
    println!("agent with {PODS} pods × 10 destinations: RSS {} MiB, peak {} MiB", rss / 1024, peak / 1024);
    assert!(peak < 100 * 1024, "the agent's peak RSS {peak} KiB exceeds 100 MiB");
    let reply = operator
        .apply(agent.api, &NodePlan { node: NODE.into(), version: 2, pods: vec![], ..Default::default() })
        .await
        .unwrap();
    assert!(reply.pods.is_empty());
    let left: Vec<&str> = fleet.pods.iter().filter(|ns| has_capture(ns)).map(|ns| ns.name.as_str()).collect();
    assert!(left.is_empty(), "captures left after an empty plan: {left:?}");
}
