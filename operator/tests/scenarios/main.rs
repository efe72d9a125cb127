//! Scenario tests of the whole controller, in memory: watch events go in, and the tests check what each node's
//! agent receives and what the controller writes to the API (statuses, finalizers, Events). The agents are
//! [`agent::FakeAgents`], the API server is [`apiserver::FakeApiServer`]; no process, port or cluster is involved.
//! The same paths against a real API server and a real agent binary: tests/controller/ (`make operator-it`).

mod agent;
mod apiserver;
mod gates;
mod harness;
mod limits;
mod measured;
#[path = "../support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use isthmus_agent_api::{Direction, LeftoverTree, LinkRef, NodePlan, PodErrorKind};
use isthmus_operator::api::{NetworkLink, PodFailure};
use isthmus_operator::controller::finalizer::FINALIZER;
use isthmus_operator::controller::version::unix_millis;
use isthmus_operator::controller::watch::{Update, WatchKind};
use kube::runtime::watcher::Event;
use serde_json::json;

use apiserver::Write;
use harness::{NS, Scenario, agent_pod, agent_pod_restarted, dispatch, pod};

/// No periodic resend: every plan an agent gets is caused by the scenario.
const NO_RESYNC: Duration = Duration::from_secs(3600);

fn link(name: &str, from: &str, to: &str, ms: u32) -> NetworkLink {
    support::link_object(NS, name, 1_700_000_000, support::spec(from, to, ms))
}

/// A plan as (source pod, destination, latency in ms, link, direction), sorted.
fn entries(plan: &NodePlan) -> Vec<(String, String, u128, String, Direction)> {
    let mut v: Vec<_> = plan
        .pods
        .iter()
        .flat_map(|p| {
            p.destinations.iter().map(|d| {
                let ms = d.impairment.fields().latency.unwrap_or_default().as_millis();
                (p.name.clone(), d.destination.to_string(), ms, d.link.name.clone(), d.link.direction)
            })
        })
        .collect();
    v.sort();
    v
}

fn entry(pod: &str, dest: &str, ms: u128, link: &str, d: Direction) -> (String, String, u128, String, Direction) {
    (pod.into(), dest.into(), ms, link.into(), d)
}

/// The (status, reason, message) of a condition of the link's status on the server.
fn condition(s: &Scenario, link: &str, type_: &str) -> Option<(String, String, String)> {
    let l = s.api.link(&format!("{NS}/{link}"))?;
    let c = l.status?.conditions.into_iter().find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

fn events(s: &Scenario, link: &str) -> Vec<(String, String)> {
    let link = format!("{NS}/{link}");
    s.api
        .writes()
        .into_iter()
        .filter_map(|w| match w {
            Write::Event { link: l, type_, reason } if l == link => Some((type_, reason)),
            _ => None,
        })
        .collect()
}

async fn send_pod(s: &Scenario, name: &str, app: &str, node: &str, ip: &str) {
    s.send(Update::Pod(Event::Apply(pod(name, app, node, ip)))).await;
}

/// A synced scenario without resyncs, agents on `n1` and `n2`, pod `client` on n1 and `server` on n2; with the
/// two agents' addresses.
async fn client_and_server() -> (Scenario, SocketAddr, SocketAddr) {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    let a2 = s.node_with_agent("n2", "10.255.0.2").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n2", "10.0.2.1").await;
    (s, a1, a2)
}

#[tokio::test]
async fn each_agent_gets_its_nodes_plan_as_pods_come_and_move() {
    let (s, a1, a2) = client_and_server().await;
    let mut l = link("frankfurt-tokyo", "client", "server", 120);
    l.spec.symmetric = true;
    s.create(&l).await;

    // Each agent holds exactly its own node's source pods: the forward direction on n1, the reverse on n2.
    let n1 = [entry("client", "10.0.2.1/32", 120, "frankfurt-tokyo", Direction::Forward)];
    s.eventually("n1's plan", || (entries(&s.agents.in_force(a1)?) == n1).then_some(())).await;
    let n2 = [entry("server", "10.0.1.1/32", 120, "frankfurt-tokyo", Direction::Reverse)];
    s.eventually("n2's plan", || (entries(&s.agents.in_force(a2)?) == n2).then_some(())).await;

    // The server is replaced by one on n1 with another IP: n1 gets both pods, n2 an empty plan.
    s.send(Update::Pod(Event::Delete(pod("server", "server", "n2", "10.0.2.1")))).await;
    send_pod(&s, "server-2", "server", "n1", "10.0.1.2").await;
    let n1 = [
        entry("client", "10.0.1.2/32", 120, "frankfurt-tokyo", Direction::Forward),
        entry("server-2", "10.0.1.1/32", 120, "frankfurt-tokyo", Direction::Reverse),
    ];
    s.eventually("n1's plan after the move", || (entries(&s.agents.in_force(a1)?) == n1).then_some(())).await;
    s.eventually("n2's empty plan", || s.agents.in_force(a2)?.pods.is_empty().then_some(())).await;

    // A spec change reaches the agent and is observed in the status.
    s.api.patch_spec(&format!("{NS}/frankfurt-tokyo"), |spec| spec["impairment"]["latency"] = json!("200ms"));
    let n1 = [
        entry("client", "10.0.1.2/32", 200, "frankfurt-tokyo", Direction::Forward),
        entry("server-2", "10.0.1.1/32", 200, "frankfurt-tokyo", Direction::Reverse),
    ];
    s.eventually("n1's plan after the change", || (entries(&s.agents.in_force(a1)?) == n1).then_some(())).await;
    let status = s
        .eventually("generation 2 observed", || {
            let st = s.api.link(&format!("{NS}/frankfurt-tokyo"))?.status?;
            (st.observed_generation == Some(2)).then_some(st)
        })
        .await;
    assert_eq!(status.latency.as_deref(), Some("200ms/200ms"), "symmetric: both directions");

    for (addr, node) in [(a1, "n1"), (a2, "n2")] {
        let received = s.agents.received(addr);
        assert!(received.iter().all(|p| p.node == node), "{node}'s agent got another node's plan");
        assert!(received.windows(2).all(|w| w[0].version < w[1].version), "versions only grow: {received:?}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_deleted_link_keeps_its_finalizer_until_the_agent_confirms_the_cleanup() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("lossy", "client", "server", 30)).await;
    s.eventually("finalizer and Ready", || {
        let l = s.api.link(&format!("{NS}/lossy"))?;
        let applied = condition(&s, "lossy", "Ready")?.1 == "Applied";
        (applied && l.metadata.finalizers?.iter().any(|f| f == FINALIZER)).then_some(())
    })
    .await;

    // The agent cannot be reached when the link is deleted: the link stays, marked for deletion.
    s.agents.set_unreachable(a1, true);
    s.api.delete(&format!("{NS}/lossy"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = s.api.link(&format!("{NS}/lossy")).expect("held by the finalizer");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(s.agents.in_force(a1).is_some_and(|p| !p.pods.is_empty()), "the agent still shapes the pod");

    // Back: it gets a plan without the link, and only then does the finalizer go.
    s.agents.set_unreachable(a1, false);
    s.eventually("link gone", || s.api.link(&format!("{NS}/lossy")).is_none().then_some(())).await;
    assert!(s.agents.in_force(a1).unwrap().pods.is_empty());
    let finalizers: Vec<Vec<String>> = s
        .api
        .writes()
        .into_iter()
        .filter_map(|w| match w {
            Write::Finalizers { finalizers, .. } => Some(finalizers),
            _ => None,
        })
        .collect();
    assert_eq!(finalizers, [vec![FINALIZER.to_owned()], vec![]], "added once, removed once");
    s.stop().await;
}

#[tokio::test]
async fn a_tree_the_agent_could_not_remove_keeps_the_finalizer_until_it_goes() {
    // A resync brings the agent's later answer without any other change.
    let s = Scenario::synced(dispatch(Duration::from_millis(300))).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("lossy", "client", "server", 30)).await;
    s.eventually("Ready", || (condition(&s, "lossy", "Ready")?.1 == "Applied").then_some(())).await;

    // The agent takes a plan without the link but says it could not remove the pod's tree.
    let stuck = LeftoverTree {
        netns_inode: 4026532999,
        interface: "eth0".into(),
        pod: Some(format!("{NS}/client")),
        links: vec![LinkRef { namespace: NS.into(), name: "lossy".into(), direction: Direction::Forward }],
        message: "netns net:[4026532999] interface eth0: Operation not permitted".into(),
    };
    s.agents.set_leftovers(a1, vec![stuck]);
    s.api.delete(&format!("{NS}/lossy"));
    s.eventually("a plan without the link", || s.agents.in_force(a1)?.pods.is_empty().then_some(())).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(s.api.link(&format!("{NS}/lossy")).is_some(), "held by the finalizer while the tree is left over");

    // The tree goes with a later plan: so does the finalizer.
    s.agents.set_leftovers(a1, vec![]);
    s.eventually("link gone", || s.api.link(&format!("{NS}/lossy")).is_none().then_some(())).await;
    s.stop().await;
}

#[tokio::test]
async fn per_pod_agent_errors_become_status_failures_until_the_agent_succeeds() {
    // A resync lets the healed agent's answer reach the status without any other change.
    let s = Scenario::synced(dispatch(Duration::from_millis(300))).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    s.agents.set_netem(a1, false);
    let unsupported = "netns net:[4026532] interface eth0: the kernel does not support netem: Operation not supported";
    s.agents.fail_pod(a1, "client-a", PodErrorKind::KernelUnsupported, unsupported);
    send_pod(&s, "client-a", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "client-b", "client", "n1", "10.0.1.2").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.9").await;
    s.create(&link("geo", "client", "server", 50)).await;

    let no_netem = "node n1's kernel has no sch_netem and its agent runs the tc datapath: latency/loss cannot be applied (agent.datapath auto emulates them)";
    let status = s
        .eventually("one pair failed", || {
            let st = s.api.link(&format!("{NS}/geo"))?.status?;
            (st.pairs_failed == 1).then_some(st)
        })
        .await;
    assert_eq!((status.pairs, status.pairs_applied, status.pairs_failed), (2, 1, 1));
    let failure = PodFailure {
        pod: format!("{NS}/client-a"),
        node: Some("n1".into()),
        reason: "KernelUnsupported".into(),
        message: no_netem.into(),
    };
    assert_eq!(status.failures, [failure]);
    let degraded = ("True".into(), "KernelUnsupported".into(), format!("{NS}/client-a: {no_netem}"));
    assert_eq!(condition(&s, "geo", "Degraded"), Some(degraded));
    let ready = ("False".into(), "Failed".into(), "1 of 2 pairs applied, 1 failed".into());
    assert_eq!(condition(&s, "geo", "Ready"), Some(ready));

    // Another pod fails for another reason: the agent's message is shown verbatim.
    let not_found = "no network namespace on this node holds all of the pod's IPs [10.0.1.2]";
    s.agents.fail_pod(a1, "client-b", PodErrorKind::PodNotFound, not_found);
    s.agents.heal_pod(a1, "client-a");
    s.eventually("client-b fails instead", || {
        let st = s.api.link(&format!("{NS}/geo"))?.status?;
        let f = st.failures.first()?;
        (st.failures.len() == 1 && f.reason == "PodNotFound" && f.pod == format!("{NS}/client-b")).then_some(())
    })
    .await;
    assert_eq!(s.api.link(&format!("{NS}/geo")).unwrap().status.unwrap().failures[0].message, not_found);

    s.agents.heal_pod(a1, "client-b");
    s.eventually("applied", || (condition(&s, "geo", "Ready")?.1 == "Applied").then_some(())).await;
    let ready = ("True".into(), "Applied".into(), "all 2 pairs are applied".into());
    assert_eq!(condition(&s, "geo", "Ready"), Some(ready));
    assert_eq!(condition(&s, "geo", "Degraded").unwrap().1, "AsExpected");
    s.eventually("the Applied event", || {
        events(&s, "geo").contains(&("Normal".into(), "Applied".into())).then_some(())
    })
    .await;
    let events = events(&s, "geo");
    assert!(events.contains(&("Warning".into(), "KernelUnsupported".into())), "{events:?}");
    assert!(events.contains(&("Warning".into(), "PodNotFound".into())), "{events:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_stale_reply_makes_the_operator_resend_above_the_version_in_force() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let addr = "10.255.0.1:9443".parse().unwrap();
    s.agents.add(addr, "n1");
    // A previous leader's clock was an hour ahead: the agent holds a version far above this operator's clock.
    let held = unix_millis() + 3_600_000;
    s.agents.hold_version(addr, held);
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    assert_eq!(a1, addr);
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("ahead", "client", "server", 10)).await;

    s.eventually("applied", || (condition(&s, "ahead", "Ready")?.1 == "Applied").then_some(())).await;
    let received = s.agents.received(a1);
    let stale: Vec<u64> = received.iter().map(|p| p.version).filter(|v| *v < held).collect();
    assert_eq!(stale.len(), 1, "one stale reply is enough to jump past the version in force: {received:?}");
    let in_force = s.agents.in_force(a1).unwrap();
    assert!(in_force.version > held);
    assert_eq!(entries(&in_force), [entry("client", "10.0.1.2/32", 10, "ahead", Direction::Forward)]);
    s.stop().await;
}

#[tokio::test]
async fn an_unreachable_agent_is_reported_and_catches_up_when_back() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    s.agents.set_unreachable(a1, true);
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("wan", "client", "server", 80)).await;

    let degraded =
        s.eventually("degraded", || condition(&s, "wan", "Degraded").filter(|c| c.1 == "AgentUnreachable")).await;
    let refused = "agent on node n1: connecting to agent 10.255.0.1:9443: Connection refused (os error 111)";
    assert_eq!(degraded, ("True".into(), "AgentUnreachable".into(), format!("{NS}/client: {refused}")));
    assert_eq!(condition(&s, "wan", "Ready").unwrap().1, "Failed");
    let status = s.api.link(&format!("{NS}/wan")).unwrap().status.unwrap();
    assert_eq!((status.pairs, status.pairs_applied, status.pairs_failed), (1, 0, 1));
    let metrics = s.metrics.encode();
    assert!(metrics.contains(r#"isthmus_operator_agent_call_errors_total{node="n1",kind="connect"}"#), "{metrics}");

    s.agents.set_unreachable(a1, false);
    s.eventually("applied", || (condition(&s, "wan", "Ready")?.1 == "Applied").then_some(())).await;
    assert_eq!(condition(&s, "wan", "Degraded").unwrap().1, "AsExpected");
    assert_eq!(
        entries(&s.agents.in_force(a1).unwrap()),
        [entry("client", "10.0.1.2/32", 80, "wan", Direction::Forward)]
    );
    s.eventually("the Applied event", || {
        events(&s, "wan").contains(&("Normal".into(), "Applied".into())).then_some(())
    })
    .await;
    let events = events(&s, "wan");
    let warned = events.iter().position(|e| *e == ("Warning".into(), "AgentUnreachable".into()));
    let applied = events.iter().position(|e| *e == ("Normal".into(), "Applied".into()));
    assert!(warned < applied && warned.is_some(), "a warning, then Applied: {events:?}");
    s.stop().await;
}

#[tokio::test]
async fn a_restarted_agent_gets_the_plan_again_at_once() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("steady", "client", "server", 10)).await;
    s.eventually("applied", || (condition(&s, "steady", "Ready")?.1 == "Applied").then_some(())).await;
    let before = s.agents.received(a1);

    // Same node, same address, a new pod UID: nothing in the plan changed, yet the new agent gets it.
    s.send(Update::Agent(Event::Apply(agent_pod("n1", "10.255.0.1", "uid-agent-n1-restarted")))).await;
    let after = s.eventually("resent", || Some(s.agents.received(a1)).filter(|r| r.len() > before.len())).await;
    assert_eq!(after.last().unwrap().pods, before.last().unwrap().pods);

    // The same pod, its container restarted (an agent with the userspace datapath starts with nothing
    // installed): it gets the plan again too.
    let restarted = agent_pod_restarted("n1", "10.255.0.1", "uid-agent-n1-restarted", 1);
    s.send(Update::Agent(Event::Apply(restarted))).await;
    let again = s.eventually("resent", || Some(s.agents.received(a1)).filter(|r| r.len() > after.len())).await;
    assert_eq!(again.last().unwrap().pods, before.last().unwrap().pods);
    s.stop().await;
}

#[tokio::test]
async fn a_follower_neither_dispatches_nor_writes_until_it_leads() {
    let s = Scenario::start(false, dispatch(NO_RESYNC));
    for kind in WatchKind::ALL {
        s.list(kind, Vec::new()).await;
    }
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    send_pod(&s, "client", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.2").await;
    s.create(&link("quiet", "client", "server", 10)).await;
    s.eventually("ready", || s.ready.load(Ordering::Relaxed).then_some(())).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(s.agents.received(a1).is_empty(), "a follower sends no plan");
    assert!(s.api.writes().is_empty(), "a follower writes nothing: {:?}", s.api.writes());

    s.set_leading(true);
    s.eventually("applied", || (condition(&s, "quiet", "Ready")?.1 == "Applied").then_some(())).await;
    let l = s.api.link(&format!("{NS}/quiet")).unwrap();
    assert!(l.metadata.finalizers.unwrap().iter().any(|f| f == FINALIZER));
    assert_eq!(
        entries(&s.agents.in_force(a1).unwrap()),
        [entry("client", "10.0.1.2/32", 10, "quiet", Direction::Forward)]
    );
    s.stop().await;
}

#[tokio::test]
async fn nothing_is_dispatched_until_every_watch_has_listed() {
    // The link watch lists last: the node's agent is shaping the client meanwhile, and a plan made of the pods
    // alone would be empty and strip it.
    let pods = vec![pod("client", "client", "n1", "10.0.1.1"), pod("server", "server", "n1", "10.0.1.9")];
    let (s, links) = Scenario::restarted_but(WatchKind::Link, pods, vec![link("kept", "client", "server", 10)]).await;
    let a1 = "10.255.0.1:9443".parse().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.agents.received(a1).is_empty(), "a plan before the links are known: {:?}", s.agents.received(a1));

    s.list(WatchKind::Link, links).await;
    let kept = [entry("client", "10.0.1.9/32", 10, "kept", Direction::Forward)];
    s.eventually("the plan", || (entries(&s.agents.in_force(a1)?) == kept).then_some(())).await;
    let received = s.agents.received(a1);
    assert_eq!(received.iter().map(entries).collect::<Vec<_>>(), [kept], "the first plan is the whole one");
    s.stop().await;
}

#[tokio::test]
async fn readiness_waits_for_every_watch_and_a_relist_forgets_what_it_no_longer_names() {
    let s = Scenario::start(true, dispatch(NO_RESYNC));
    let (last, first) = WatchKind::ALL.split_last().unwrap();
    for kind in first {
        s.list(*kind, Vec::new()).await;
    }
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!s.ready.load(Ordering::Relaxed), "one watch has not listed yet");
    s.list(*last, Vec::new()).await;
    s.eventually("ready", || s.ready.load(Ordering::Relaxed).then_some(())).await;

    send_pod(&s, "client-a", "client", "n1", "10.0.1.1").await;
    send_pod(&s, "client-b", "client", "n1", "10.0.1.2").await;
    send_pod(&s, "server", "server", "n1", "10.0.1.9").await;
    s.create(&link("pair", "client", "server", 10)).await;
    let both = [
        entry("client-a", "10.0.1.9/32", 10, "pair", Direction::Forward),
        entry("client-b", "10.0.1.9/32", 10, "pair", Direction::Forward),
    ];
    s.eventually("both clients", || (entries(&s.agents.in_force(a1)?) == both).then_some(())).await;

    // The pod watch restarts and lists client-a and the server only: client-b was deleted meanwhile.
    let relisted = vec![
        Update::Pod(Event::InitApply(pod("client-a", "client", "n1", "10.0.1.1"))),
        Update::Pod(Event::InitApply(pod("server", "server", "n1", "10.0.1.9"))),
    ];
    s.list(WatchKind::Pod, relisted).await;
    let one = [entry("client-a", "10.0.1.9/32", 10, "pair", Direction::Forward)];
    s.eventually("client-b forgotten", || (entries(&s.agents.in_force(a1)?) == one).then_some(())).await;
    s.eventually("status counts one source", || {
        let st = s.api.link(&format!("{NS}/pair"))?.status?;
        (st.source_pods == 1 && st.pairs == 1).then_some(())
    })
    .await;
    s.stop().await;
}
