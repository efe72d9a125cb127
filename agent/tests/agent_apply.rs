//! Applying plans through the agent binary on this machine's kernel (rate-only trees: htb, tbf, u32):
//! apply, unchanged, change, stale, per-pod errors, garbage collection, graceful shutdown that keeps the
//! impairments, adoption after a restart, and the cleanup mode. Throughput is measured through real veths.

mod agent_common;

use std::net::IpAddr;
use std::process::Command;

use agent_common::goodput::assert_shaped;
use agent_common::{Agent, AgentOptions, Ns, TestCerts, ip, veth};
use isthmus_agent_api::client::ClientError;
use isthmus_agent_api::test_util::{destination, link, rate};
use isthmus_agent_api::{ApplyReply, Impairment, NodePlan, PodErrorKind, PodOutcome, PodPlan, PodResult};
use isthmus_test_kit::openmetrics;

const NODE: &str = "node-apply";

fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A pod whose destinations were all asked for by link `l1`.
fn pod(uid: &str, name: &str, ips: &[IpAddr], destinations: Vec<(IpAddr, Impairment)>) -> PodPlan {
    let destinations = destinations.into_iter().map(|(ip, impairment)| destination(ip, impairment, link("l1")));
    isthmus_agent_api::test_util::pod(uid, name, ips, destinations.collect())
}

fn outcome<'a>(results: &'a [PodResult], uid: &str) -> &'a PodOutcome {
    &results.iter().find(|r| r.uid == uid).unwrap_or_else(|| panic!("no result for {uid}: {results:?}")).outcome
}

fn error_kind(results: &[PodResult], uid: &str) -> PodErrorKind {
    match outcome(results, uid) {
        PodOutcome::Failed(e) => e.kind,
        other => panic!("{uid}: expected an error, got {other:?}"),
    }
}

fn mbit(bps: f64) -> f64 {
    bps / 1e6
}

/// A "node": a pod namespace whose eth0 reaches two destination namespaces through a bridge.
struct Topology {
    pod: Ns,
    dst1: Ns,
    dst2: Ns,
    switch: Ns,
    pod_ip: IpAddr,
    dst1_ip: IpAddr,
    dst2_ip: IpAddr,
}

fn topology(pinned: &std::path::Path) -> Topology {
    let k = (std::process::id() % 200 + 20) as u8;
    let switch = Ns::new("isth-aa-sw-");
    ip(&["-n", &switch.name, "link", "add", "br0", "type", "bridge"]);
    ip(&["-n", &switch.name, "link", "set", "br0", "up"]);
    let pod = Ns::new_pinned("isth-aa-pod-", pinned);
    let dst1 = Ns::new_pinned("isth-aa-d1-", pinned);
    let dst2 = Ns::new_pinned("isth-aa-d2-", pinned);
    let pod_ip = addr(&format!("10.237.{k}.2"));
    let dst1_ip = addr(&format!("10.237.{k}.3"));
    let dst2_ip = addr(&format!("10.237.{k}.4"));
    for (ns, port, ip_addr) in [(&pod, "p0", pod_ip), (&dst1, "p1", dst1_ip), (&dst2, "p2", dst2_ip)] {
        // The switch side gets a throwaway address-less port on the bridge.
        veth(ns, "eth0", ip_addr, &switch, port, addr(&format!("10.238.{k}.{}", port.as_bytes()[1])));
        ip(&["-n", &switch.name, "addr", "flush", "dev", port]);
        ip(&["-n", &switch.name, "link", "set", port, "master", "br0"]);
    }
    Topology { pod, dst1, dst2, switch, pod_ip, dst1_ip, dst2_ip }
}

fn throughput(from: &Ns, to: &Ns, to_ip: IpAddr) -> f64 {
    agent_common::tcp_goodput(from, to, to_ip)
}

fn has_isthmus_root(ns: &Ns) -> bool {
    ns.qdiscs("eth0").lines().any(|l| l.contains("htb") && l.contains("root"))
}

/// A temporary directory with `netns/` (the agent's only namespace source) and an empty `proc/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_apply_change_gc_shutdown_adopt_and_cleanup() {
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-apply-");
    let t = topology(&pinned);
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
    let client = certs.operator();

    let bare = throughput(&t.pod, &t.dst1, t.dst1_ip);

    // v1: 20 Mbit/s towards dst1 only.
    let v1 = NodePlan {
        node: NODE.into(),
        version: 1,
        pods: vec![pod("uid-p", "p", &[t.pod_ip], vec![(t.dst1_ip, rate(20_000_000))])],
        ..Default::default()
    };
    let reply = client.apply(agent.api, &v1).await.unwrap();
    assert!(!reply.stale);
    assert_eq!(outcome(&reply.pods, "uid-p"), &PodOutcome::Applied, "{reply:?}");
    assert!(reply.pods[0].mutations > 0);
    assert!(has_isthmus_root(&t.pod));
    let shaped = assert_shaped("20 Mbit/s towards dst1", 20e6, || throughput(&t.pod, &t.dst1, t.dst1_ip));
    let other = throughput(&t.pod, &t.dst2, t.dst2_ip);
    eprintln!(
        "bare {:.0} Mbit/s, shaped {:.1} Mbit/s, other destination {:.0} Mbit/s",
        mbit(bare),
        mbit(shaped),
        mbit(other)
    );
    assert!(other > 150e6, "unimpaired destination measured {:.1} Mbit/s", mbit(other));

    // The same plan again: nothing sent to the kernel.
    let again = client.apply(agent.api, &v1).await.unwrap();
    assert_eq!(outcome(&again.pods, "uid-p"), &PodOutcome::Applied);
    assert_eq!(again.pods[0].mutations, 0, "an unchanged plan mutates nothing: {again:?}");

    // v2: 60 Mbit/s.
    let v2 = NodePlan {
        version: 2,
        pods: vec![pod("uid-p", "p", &[t.pod_ip], vec![(t.dst1_ip, rate(60_000_000))])],
        ..v1.clone()
    };
    let reply = client.apply(agent.api, &v2).await.unwrap();
    assert_eq!(outcome(&reply.pods, "uid-p"), &PodOutcome::Applied);
    assert!(reply.pods[0].mutations > 0);
    let faster = assert_shaped("60 Mbit/s after the change", 60e6, || throughput(&t.pod, &t.dst1, t.dst1_ip));
    eprintln!("after the change: {:.1} Mbit/s", mbit(faster));

    // An older version is stale: nothing happens.
    let stale = client.apply(agent.api, &v1).await.unwrap();
    assert!(stale.stale);
    assert_eq!(stale.version, 2);
    assert_shaped("60 Mbit/s after the stale plan", 60e6, || throughput(&t.pod, &t.dst1, t.dst1_ip));

    // A plan for another node never reaches this agent: the client dials `elsewhere.node.isthmus`, and this
    // agent's certificate names only its own node (the agent would also answer 409 to a plan for another node).
    let wrong = NodePlan { node: "elsewhere".into(), version: 9, ..v2.clone() };
    let err = client.apply(agent.api, &wrong).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Connect { .. }) && err.to_string().contains("not valid for name"),
        "a plan for another node: {err}"
    );

    // Per-pod errors never block the good pod. dst1 gets a root qdisc isthmus did not install.
    t.dst1.tc(&[
        "qdisc", "add", "dev", "eth0", "root", "handle", "7:", "tbf", "rate", "1gbit", "burst", "64kb", "latency",
        "50ms",
    ]);
    let mut bad_interface = pod("uid-if", "badif", &[t.dst2_ip], vec![(t.pod_ip, rate(1_000_000))]);
    bad_interface.interface = "nope0".into();
    let mut host = pod("uid-host", "host", &[addr("10.0.0.1")], vec![(t.pod_ip, rate(1_000_000))]);
    host.host_network = true;
    let invalid = pod("uid-inv", "inv", &[t.dst2_ip], vec![(t.pod_ip, rate(1_000_000))]);
    let v3 = NodePlan {
        node: NODE.into(),
        version: 3,
        pods: vec![
            // A third destination at 8 bit/s, whose default bucket the kernel cannot hold: refused alone.
            pod(
                "uid-p",
                "p",
                &[t.pod_ip],
                vec![(t.dst1_ip, rate(60_000_000)), (t.dst2_ip, rate(30_000_000)), (addr("10.237.1.1"), rate(8))],
            ),
            pod("uid-gone", "gone", &[addr("10.237.250.250")], vec![(t.pod_ip, rate(1_000_000))]),
            bad_interface,
            host,
            invalid,
            pod("uid-foreign", "foreign", &[t.dst1_ip], vec![(t.pod_ip, rate(1_000_000))]),
        ],
        ..Default::default()
    };
    // A burst without a rate: no Impairment can say that, so the plan goes out as JSON.
    let mut v3 = serde_json::to_value(&v3).unwrap();
    v3["pods"][4]["groups"][0]["impairment"] = serde_json::json!({"burstBytes": 10_000});
    let (status, body) = certs.put_plan_json(agent.api, &v3).await;
    assert_eq!(status, 200, "{body}");
    let reply: ApplyReply = serde_json::from_str(&body).unwrap();
    assert_eq!(outcome(&reply.pods, "uid-p"), &PodOutcome::Applied, "{reply:?}");
    let p = reply.pods.iter().find(|r| r.uid == "uid-p").unwrap();
    let [refused] = p.refused.as_slice() else { panic!("one destination refused: {p:?}") };
    assert_eq!(refused.destination, "10.237.1.1/32".parse::<ipnet::IpNet>().unwrap());
    assert_eq!(refused.error.kind, PodErrorKind::InvalidPlan);
    assert!(refused.error.message.contains("bandwidth") && refused.error.message.contains("275 s"), "{refused:?}");
    assert_eq!(metric(&certs, &agent, "isthmus_agent_destinations_refused", &[]), 1.0);
    assert_eq!(error_kind(&reply.pods, "uid-gone"), PodErrorKind::PodNotFound);
    assert_eq!(error_kind(&reply.pods, "uid-if"), PodErrorKind::InterfaceNotFound);
    assert_eq!(error_kind(&reply.pods, "uid-host"), PodErrorKind::HostNetwork);
    assert_eq!(error_kind(&reply.pods, "uid-inv"), PodErrorKind::InvalidPlan);
    assert_eq!(error_kind(&reply.pods, "uid-foreign"), PodErrorKind::ForeignQdisc);
    if let PodOutcome::Failed(e) = outcome(&reply.pods, "uid-inv") {
        assert!(e.message.contains("burst"), "{}", e.message);
    }
    assert!(t.dst1.qdiscs("eth0").contains("tbf 7:"), "the foreign qdisc is untouched");

    // Observed state and metrics carry the kernel's counters per destination.
    let _ = throughput(&t.pod, &t.dst2, t.dst2_ip);
    let observed = client.observed(agent.api, NODE).await.unwrap();
    assert_eq!(observed.version, 3);
    let p = observed.pods.iter().find(|p| p.uid == "uid-p").expect("pod observed");
    assert_eq!(p.destinations.len(), 2);
    let to_dst2 = p.destinations.iter().find(|d| d.destination == t.dst2_ip.into()).unwrap();
    assert!(to_dst2.counters.packets > 100 && to_dst2.counters.bytes > 100_000, "{to_dst2:?}");
    assert_eq!(to_dst2.link.as_ref().unwrap().name, "l1");
    let metrics = certs.metrics(agent.api);
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("isthmus_link_bytes_total{") && l.contains(&format!("destination=\"{}/32\"", t.dst2_ip))
        })
        .unwrap_or_else(|| panic!("no per-link metric: {metrics}"));
    assert!(
        line.contains("link_name=\"l1\"") && line.contains("pod_name=\"p\"") && line.contains("direction=\"forward\""),
        "{line}"
    );
    assert!(metrics.contains("isthmus_agent_pod_errors_total{kind=\"ForeignQdisc\"} 1"), "{metrics}");

    // v4 drops the pod: its tree is removed, nothing is left over; the foreign qdisc stays.
    let v4 = NodePlan { node: NODE.into(), version: 4, pods: vec![], ..Default::default() };
    let reply = client.apply(agent.api, &v4).await.unwrap();
    assert!(reply.leftovers.is_empty(), "{:?}", reply.leftovers);
    assert!(certs.metrics(agent.api).contains("isthmus_agent_leftover_trees 0"));
    assert!(!has_isthmus_root(&t.pod), "{}", t.pod.qdiscs("eth0"));
    assert!(t.dst1.qdiscs("eth0").contains("tbf 7:"));
    let free = throughput(&t.pod, &t.dst1, t.dst1_ip);
    assert!(free > 150e6, "after removal {:.1} Mbit/s", mbit(free));

    // v5: two pods shaped; then SIGTERM: the impairments stay.
    let v5 = NodePlan {
        node: NODE.into(),
        version: 5,
        pods: vec![
            pod("uid-p", "p", &[t.pod_ip], vec![(t.dst1_ip, rate(20_000_000))]),
            pod("uid-d2", "d2", &[t.dst2_ip], vec![(t.pod_ip, rate(20_000_000))]),
        ],
        ..Default::default()
    };
    let reply = client.apply(agent.api, &v5).await.unwrap();
    assert!(reply.pods.iter().all(|r| r.outcome == PodOutcome::Applied), "{reply:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(agent.child.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "graceful exit: {status}");
    assert!(agent.log_text().contains("impairments stay installed"));
    assert!(has_isthmus_root(&t.pod) && has_isthmus_root(&t.dst2));
    assert_shaped("20 Mbit/s while the agent is down", 20e6, || throughput(&t.pod, &t.dst1, t.dst1_ip));

    // Restart: the trees are adopted, untouched, until the next plan.
    drop(agent);
    let agent = Agent::start(&options);
    let observed = client.observed(agent.api, NODE).await.unwrap();
    assert_eq!(observed.adopted.len(), 2, "{observed:?}");
    assert!(observed.adopted.iter().any(|a| a.netns_inode == t.pod.inode() && a.destinations.len() == 1));
    assert!(has_isthmus_root(&t.pod));
    // The first plan keeps the pod it still wants without changes and removes the other adopted tree.
    let v1_again = NodePlan {
        node: NODE.into(),
        version: 1,
        pods: vec![pod("uid-p", "p", &[t.pod_ip], vec![(t.dst1_ip, rate(20_000_000))])],
        ..Default::default()
    };
    let reply = client.apply(agent.api, &v1_again).await.unwrap();
    assert_eq!(reply.pods[0].outcome, PodOutcome::Applied);
    assert_eq!(reply.pods[0].mutations, 0, "the adopted tree already matched");
    assert!(has_isthmus_root(&t.pod));
    assert!(!has_isthmus_root(&t.dst2), "the adopted tree no plan wants is removed");
    let observed = client.observed(agent.api, NODE).await.unwrap();
    assert!(observed.adopted.is_empty());
    drop(agent);

    // Cleanup mode removes every isthmus tree and nothing else.
    client_apply_with_fresh_agent(&options, &certs, &v5).await;
    assert!(has_isthmus_root(&t.pod) && has_isthmus_root(&t.dst2));
    let out = Command::new(env!("CARGO_BIN_EXE_isthmus-agent"))
        .args(["cleanup", "--log-format", "text", "--proc"])
        .arg(&proc_dir)
        .arg("--netns-dirs")
        .arg(&pinned)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!has_isthmus_root(&t.pod) && !has_isthmus_root(&t.dst2));
    assert!(t.dst1.qdiscs("eth0").contains("tbf 7:"), "cleanup never removes a foreign qdisc");
    drop(t.switch);
}

async fn client_apply_with_fresh_agent(options: &AgentOptions<'_>, certs: &TestCerts, plan: &NodePlan) {
    let agent = Agent::start(options);
    let reply = certs.operator().apply(agent.api, plan).await.unwrap();
    assert!(reply.pods.iter().all(|r| r.outcome == PodOutcome::Applied), "{reply:?}");
}

/// The sum of metric `name`'s samples with `labels` in the agent's /metrics text.
fn metric(certs: &TestCerts, agent: &Agent, name: &str, labels: &[&str]) -> f64 {
    openmetrics::sum(&certs.metrics(agent.api), name, labels)
}

/// `(parent, handle)` of every TBF on the interface, from `tc qdisc show`.
fn tbfs(ns: &Ns) -> Vec<(String, String)> {
    ns.qdiscs("eth0")
        .lines()
        .filter(|l| l.starts_with("qdisc tbf "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let parent = words.iter().position(|w| *w == "parent").map(|i| words[i + 1]).unwrap();
            (parent.to_owned(), words[2].to_owned())
        })
        .collect()
}

/// A pod namespace (pinned for the agent) with eth0 towards a peer namespace of its own.
fn sandbox(pinned: &std::path::Path, pod_ip: IpAddr, peer_ip: IpAddr) -> (Ns, Ns) {
    let pod = Ns::new_pinned("isth-ar-pod-", pinned);
    let peer = Ns::new("isth-ar-peer-");
    veth(&pod, "eth0", pod_ip, &peer, "eth0", peer_ip);
    (pod, peer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_apply_reuses_the_pods_connection_follows_a_new_sandbox_and_resync_repairs_drift() {
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-reuse-");
    let k = (std::process::id() % 200 + 20) as u8;
    let pod_ip = addr(&format!("10.229.{k}.2"));
    let peer_ip = addr(&format!("10.229.{k}.1"));
    let (dst1, dst2) = (addr("10.228.0.1"), addr("10.228.0.2"));
    let certs = TestCerts::new(NODE);
    let mut options = AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &pinned,
        log_dir: work.path(),
        // No periodic resync until the last part of the test.
        extra_env: vec![("ISTHMUS_RESYNC_SECONDS", "0".into())],
    };
    let (sandbox1, peer1) = sandbox(&pinned, pod_ip, peer_ip);
    let agent = Agent::start(&options);
    let client = certs.operator();
    let plan = |version| NodePlan {
        node: NODE.into(),
        version,
        pods: vec![pod("uid-r", "r", &[pod_ip], vec![(dst1, rate(20_000_000)), (dst2, rate(30_000_000))])],
        ..Default::default()
    };
    let opened = |agent: &Agent| metric(&certs, agent, "isthmus_agent_datapath_connections_opened_total", &[]);
    let record_path = |agent: &Agent| metric(&certs, agent, "isthmus_agent_reconciles_total", &["path=\"record\""]);

    // A fresh install, then the same plan: nothing sent, on the same connection. (A fresh install leaves no
    // record, since the kernel picked some filter handles, so the second call reads the tree back once.)
    let first = client.apply(agent.api, &plan(1)).await.unwrap();
    assert_eq!(outcome(&first.pods, "uid-r"), &PodOutcome::Applied, "{first:?}");
    assert!(first.pods[0].mutations > 0);
    assert_eq!(tbfs(&sandbox1).len(), 2);
    let same = client.apply(agent.api, &plan(2)).await.unwrap();
    assert_eq!(same.pods[0].mutations, 0, "{same:?}");
    assert_eq!(opened(&agent), 1.0, "one connection for the pod across plans");
    assert_eq!(record_path(&agent), 2.0);

    // A TBF removed behind the agent's back: a plan applied from the record trusts it (no dump), so the same
    // plan again sends nothing and the drift stays — which shows that the record, not a dump, was used.
    let (parent, handle) = tbfs(&sandbox1)[0].clone();
    sandbox1.tc(&["qdisc", "del", "dev", "eth0", "parent", &parent, "handle", &handle]);
    assert_eq!(tbfs(&sandbox1).len(), 1);
    let trusted = client.apply(agent.api, &plan(3)).await.unwrap();
    assert_eq!(trusted.pods[0].mutations, 0, "{trusted:?}");
    assert_eq!(tbfs(&sandbox1).len(), 1);
    assert_eq!(opened(&agent), 1.0);

    // The pod's sandbox is replaced (new namespace, same IP): the new one gets the whole tree on a new
    // connection.
    drop(sandbox1);
    drop(peer1);
    let (sandbox2, _peer2) = sandbox(&pinned, pod_ip, peer_ip);
    assert!(!has_isthmus_root(&sandbox2));
    let moved = client.apply(agent.api, &plan(4)).await.unwrap();
    assert_eq!(outcome(&moved.pods, "uid-r"), &PodOutcome::Applied, "{moved:?}");
    assert!(moved.pods[0].mutations > 0, "{moved:?}");
    assert_eq!(tbfs(&sandbox2).len(), 2);
    assert_eq!(opened(&agent), 2.0, "a new connection for the new sandbox");
    drop(agent);

    // With the periodic resync on, the same drift is found and repaired without any new plan.
    options.extra_env = vec![("ISTHMUS_RESYNC_SECONDS", "1".into())];
    let agent = Agent::start(&options);
    let adopted = client.apply(agent.api, &plan(5)).await.unwrap();
    assert_eq!(adopted.pods[0].mutations, 0, "the restarted agent adopts the tree as it is: {adopted:?}");
    let (parent, handle) = tbfs(&sandbox2)[1].clone();
    sandbox2.tc(&["qdisc", "del", "dev", "eth0", "parent", &parent, "handle", &handle]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tbfs(&sandbox2).len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the resync did not repair the tree: {}", agent.log_text());
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(metric(&certs, &agent, "isthmus_agent_resync_mutations_total", &[]) >= 1.0);
    assert!(agent.log_text().contains("resync repaired a tree changed behind isthmus's back"));
}
