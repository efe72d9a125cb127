//! Crash safety: the agent is killed with SIGKILL in the middle of applying a large plan (50 pods × 100
//! destinations); started again, it adopts what is installed, and the next plan converges every namespace to
//! exactly the plan: complete trees for the pods it wants, nothing for the others.

mod agent_common;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use agent_common::{Agent, AgentOptions, Fleet, TestCerts, count_tc};
use ipnet::IpNet;
use isthmus_agent_api::test_util::{destination, link, pod, rate};
use isthmus_agent_api::{NodePlan, PodOutcome};

const NODE: &str = "node-crash";
const PODS: usize = 50;
const DESTINATIONS: usize = 100;

fn plan(fleet: &Fleet, version: u64, pods: usize, shift: usize, rate_base: u64) -> NodePlan {
    NodePlan {
        node: NODE.into(),
        version,
        pods: (0..pods)
            .map(|i| {
                let destinations = (shift..shift + DESTINATIONS).map(|d| {
                    let to = IpAddr::from([10, 243, (d / 250) as u8, (d % 250 + 1) as u8]);
                    destination(to, rate(rate_base + d as u64 * 1000), link("big"))
                });
                pod(&format!("uid-{i}"), &format!("pod-{i}"), &[fleet.ips[i]], destinations.collect())
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_kill9_mid_apply_then_converge() {
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-crash-");
    let fleet = Fleet::new("isth-ac-", PODS, &pinned, [10, 242]);
    let certs = TestCerts::new(NODE);
    let options = AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &pinned,
        log_dir: work.path(),
        extra_env: vec![],
    };
    let mut agent = Agent::start(&options);
    let client = std::sync::Arc::new(certs.operator());

    // Start the big apply and kill the agent as soon as the first trees appear.
    let big = plan(&fleet, 1, PODS, 0, 10_000_000);
    let call = {
        let client = client.clone();
        let api = agent.api;
        let big = big.clone();
        tokio::spawn(async move { client.apply(api, &big).await })
    };
    let started = Instant::now();
    let first = &fleet.pods[0];
    while count_tc(first, "class", "htb") < 10 {
        assert!(started.elapsed() < Duration::from_secs(60), "no tree appeared: {}", agent.log_text());
        assert!(!call.is_finished(), "the apply finished before the kill could happen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    agent.kill9();
    let reply = call.await.unwrap();
    assert!(reply.is_err(), "the apply must have been cut off: {reply:?}");
    let touched: Vec<usize> = (0..PODS).filter(|i| count_tc(&fleet.pods[*i], "qdisc", "htb") > 0).collect();
    let complete_classes = DESTINATIONS + 1; // a class per destination and the default class
    let incomplete = touched.iter().filter(|i| count_tc(&fleet.pods[**i], "class", "htb") < complete_classes).count();
    eprintln!("at the kill: {} of {PODS} pods had a tree, {incomplete} of them incomplete", touched.len());
    assert!(
        !touched.is_empty() && touched.len() < PODS,
        "the kill must land mid-apply ({} pods touched)",
        touched.len()
    );
    drop(agent);

    // Restart: whatever was installed is adopted untouched.
    let agent = Agent::start(&options);
    let observed = client.observed(agent.api, NODE).await.unwrap();
    assert_eq!(observed.adopted.len(), touched.len(), "every tree found is adopted");

    // The next plan: the first 35 pods, destinations shifted by 20 (20 removed, 20 new, 80 kept) and every
    // rate changed; the last 15 pods are no longer wanted.
    let wanted = 35;
    let next = plan(&fleet, 2, wanted, 20, 20_000_000);
    let reply = client.apply(agent.api, &next).await.unwrap();
    assert!(reply.pods.iter().all(|r| r.outcome == PodOutcome::Applied), "{reply:?}");

    let observed = client.observed(agent.api, NODE).await.unwrap();
    assert!(observed.adopted.is_empty());
    assert_eq!(observed.pods.len(), wanted);
    for (i, pod) in next.pods.iter().enumerate() {
        let want: BTreeSet<IpNet> = pod.destinations.iter().map(|d| d.destination).collect();
        let got: BTreeSet<IpNet> = observed
            .pods
            .iter()
            .find(|p| p.uid == pod.uid)
            .unwrap()
            .destinations
            .iter()
            .map(|d| d.destination)
            .collect();
        assert_eq!(got, want, "pod {i}: installed destinations differ from the plan");
    }
    // Counted independently with iproute2: identical trees everywhere, whether the pod was complete,
    // half-built or untouched at the kill; nothing at all on the pods no longer wanted.
    let reference = (
        count_tc(&fleet.pods[0], "class", ""),
        count_tc(&fleet.pods[0], "qdisc", ""),
        count_tc(&fleet.pods[0], "filter", ""),
    );
    assert_eq!(count_tc(&fleet.pods[0], "class", "htb"), complete_classes);
    for i in 0..wanted {
        let ns = &fleet.pods[i];
        let counts = (count_tc(ns, "class", ""), count_tc(ns, "qdisc", ""), count_tc(ns, "filter", ""));
        assert_eq!(counts, reference, "pod {i} (touched at the kill: {})", touched.contains(&i));
        let qdiscs = ns.qdiscs("eth0");
        assert!(qdiscs.contains("rate 20") && !qdiscs.contains("rate 10"), "pod {i}: new rates in force: {qdiscs}");
    }
    for i in wanted..PODS {
        assert_eq!(
            count_tc(&fleet.pods[i], "qdisc", "htb"),
            0,
            "pod {i} is no longer wanted: {}",
            fleet.pods[i].qdiscs("eth0")
        );
    }
    drop(agent);
}
