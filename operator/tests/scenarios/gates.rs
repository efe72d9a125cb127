//! The readiness gate `isthmus.dev/links-applied`, end to end in memory: pods created through the in-memory
//! API server (so that each condition written comes back through the pod watch), a paused in-memory agent
//! standing for a slow node, and the conditions the controller writes on `pods/status`.

use std::time::Duration;

use isthmus_agent_api::PodErrorKind;
use isthmus_operator::controller::watch::WatchKind;
use isthmus_operator::gate::CONDITION_TYPE;
use serde_json::json;

use super::harness::{NS, Scenario, dispatch, gated_pod, pod};
use super::{NO_RESYNC, condition, entries, link};

/// The gate condition a pod carries on the server: (status, reason, message).
fn gate(s: &Scenario, pod: &str) -> Option<(String, String, String)> {
    let pod = s.api.pod(&format!("{NS}/{pod}"))?;
    let c = pod.status?.conditions?.into_iter().find(|c| c.type_ == CONDITION_TYPE)?;
    Some((c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

fn says(status: &str, reason: &str, message: &str) -> (String, String, String) {
    (status.into(), reason.into(), message.into())
}

fn reasons(s: &Scenario, pod: &str) -> Vec<String> {
    s.api.pod_conditions(pod).into_iter().map(|(_, reason, _)| reason).collect()
}

const APPLIED_ONE: &str = "node n1's agent applied every link that shapes this pod (1 destination)";
const NO_LINKS: &str = "no NetworkLink selects this pod as a source; nothing to wait for";

#[tokio::test]
async fn a_gated_pod_is_ready_only_once_the_agent_confirmed_its_links() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    // A slow node: its agent answers only when the test lets it.
    s.agents.set_paused(a1, true);
    s.api.create_pod(&pod("server", "server", "n1", "10.0.1.9"));
    let mut client = gated_pod("client", "client", "n1", "10.0.1.1");
    let kubelet = json!([{"type": "ContainersReady", "status": "True"},
                         {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}]);
    client.status.as_mut().unwrap().conditions = Some(serde_json::from_value(kubelet).unwrap());
    s.api.create_pod(&client);
    s.api.create_pod(&pod("plain", "client", "n1", "10.0.1.2")); // selected too, but declares no gate
    s.api.create_pod(&gated_pod("loner", "db", "n1", "10.0.1.3")); // no link selects it
    s.create(&link("slow", "client", "server", 30)).await;

    // Nothing to wait for: ready at once, although the agent has answered nothing.
    let loner = s.eventually("loner decided", || gate(&s, "loner")).await;
    assert_eq!(loner, says("True", "NoLinks", NO_LINKS));
    // The client's entry is planned and on its way, not confirmed: no condition, so the kubelet holds it NotReady.
    s.eventually("the link waits for the agent", || (condition(&s, "slow", "Ready")?.1 == "Pending").then_some(()))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gate(&s, "client"), None, "nothing written before the agent confirms");
    assert!(s.agents.in_force(a1).is_none(), "the agent has confirmed nothing yet");

    s.agents.set_paused(a1, false);
    let applied = s.eventually("client applied", || gate(&s, "client")).await;
    assert_eq!(applied, says("True", "Applied", APPLIED_ONE));
    let in_force = entries(&s.agents.in_force(a1).unwrap());
    assert!(in_force.iter().any(|e| e.0 == "client" && e.2 == 30), "confirmed by the agent: {in_force:?}");

    // A pending edit leaves a ready pod ready (it would otherwise leave its Services at every edit).
    s.agents.set_paused(a1, true);
    s.api.patch_spec(&format!("{NS}/slow"), |spec| spec["impairment"]["latency"] = json!("200ms"));
    s.eventually("the edit is planned", || {
        let st = s.api.link(&format!("{NS}/slow"))?.status?;
        (st.observed_generation == Some(2)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gate(&s, "client"), Some(says("True", "Applied", APPLIED_ONE)));
    s.agents.set_paused(a1, false);
    s.eventually("the edit in force", || {
        entries(&s.agents.in_force(a1)?).iter().any(|e| e.0 == "client" && e.2 == 200).then_some(())
    })
    .await;
    s.eventually("the link applied", || (condition(&s, "slow", "Ready")?.1 == "Applied").then_some(())).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // One write per change of status or reason, by the operator's field manager, and none to ungated pods.
    assert_eq!(s.api.pod_conditions("client"), [says("True", "Applied", APPLIED_ONE)], "applied again: no write");
    assert_eq!(s.api.pod_conditions("loner"), [says("True", "NoLinks", NO_LINKS)]);
    assert_eq!(s.api.pod_conditions("plain"), [], "no gate, no write");
    assert_eq!(s.api.pod_conditions("server"), [], "no gate, no write");
    let managers: Vec<String> = (s.api.writes().into_iter())
        .filter_map(|w| match w {
            super::apiserver::Write::PodCondition { manager, .. } => Some(manager),
            _ => None,
        })
        .collect();
    assert_eq!(managers, ["isthmus-operator", "isthmus-operator"]);
    // The kubelet's conditions are untouched: the apply merges the one condition by type. Ready is the kubelet's
    // to set (once every gate is True and the containers are ready).
    let conditions = s.api.pod(&format!("{NS}/client")).unwrap().status.unwrap().conditions.unwrap();
    let kinds: Vec<(&str, &str)> = conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
    assert_eq!(kinds, [("ContainersReady", "True"), ("Ready", "False"), (CONDITION_TYPE, "True")]);
    s.stop().await;
}

#[tokio::test]
async fn a_failed_entry_holds_a_gated_pod_not_ready_with_the_reason() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let a1 = s.node_with_agent("n1", "10.255.0.1").await;
    let a2 = s.node_with_agent("n2", "10.255.0.2").await;
    s.agents.set_netem(a1, false);
    let unsupported = "netns net:[4026532] interface eth0: the kernel does not support netem: Operation not supported";
    s.agents.fail_pod(a1, "client", PodErrorKind::KernelUnsupported, unsupported);
    s.agents.set_unreachable(a2, true);
    s.api.create_pod(&pod("server", "server", "n1", "10.0.1.9"));
    s.api.create_pod(&gated_pod("client", "client", "n1", "10.0.1.1"));
    s.api.create_pod(&gated_pod("far", "client", "n2", "10.0.2.1"));
    s.create(&link("geo", "client", "server", 50)).await;

    // The link status and the pod say the same: the reason, and the message the status gives.
    let no_netem = "node n1's kernel has no sch_netem and its agent runs the tc datapath: latency/loss cannot be applied (agent.datapath auto emulates them)";
    let failed = s.eventually("client failed", || gate(&s, "client")).await;
    assert_eq!(failed, says("False", "KernelUnsupported", no_netem));
    let refused = "agent on node n2: connecting to agent 10.255.0.2:9443: Connection refused (os error 111)";
    let far = s.eventually("far failed", || gate(&s, "far")).await;
    assert_eq!(far, says("False", "AgentUnreachable", refused));

    // Fixed: the next plan applies, and both become ready.
    s.agents.heal_pod(a1, "client");
    s.agents.set_netem(a1, true);
    s.agents.set_unreachable(a2, false);
    s.api.patch_spec(&format!("{NS}/geo"), |spec| spec["impairment"]["latency"] = json!("60ms"));
    s.eventually("client ready", || (gate(&s, "client")?.0 == "True").then_some(())).await;
    let far = s.eventually("far ready", || gate(&s, "far").filter(|g| g.0 == "True")).await;
    assert_eq!(far, says("True", "Applied", "node n2's agent applied every link that shapes this pod (1 destination)"));

    // Only a failure turns a ready pod NotReady again.
    let mixed = "netns net:[4026532] interface eth0: cannot mix duplicating netems";
    s.agents.fail_pod(a1, "client", PodErrorKind::DuplicateRestriction, mixed);
    s.api.patch_spec(&format!("{NS}/geo"), |spec| spec["impairment"]["latency"] = json!("70ms"));
    let failed = s.eventually("client failed again", || gate(&s, "client").filter(|g| g.0 == "False")).await;
    assert_eq!(failed, says("False", "DuplicateRestriction", mixed));
    assert_eq!(reasons(&s, "client"), ["KernelUnsupported", "Applied", "DuplicateRestriction"]);
    assert_eq!(reasons(&s, "far"), ["AgentUnreachable", "Applied"], "the far pod's entry applied again: no write");
    s.stop().await;
}

#[tokio::test]
async fn gates_are_decided_only_once_every_watch_has_listed() {
    // The link watch lists last: without its link, the client would look selected by nothing.
    let pods = vec![
        gated_pod("client", "client", "n1", "10.0.1.1"),
        pod("server", "server", "n1", "10.0.1.9"),
        gated_pod("loner", "db", "n1", "10.0.1.3"),
    ];
    let (s, links) = Scenario::restarted_but(WatchKind::Link, pods, vec![link("late", "client", "server", 10)]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.api.pod_conditions("client"), [], "not decided before the links are listed");
    assert_eq!(s.api.pod_conditions("loner"), [], "not decided before the links are listed");

    s.list(WatchKind::Link, links).await;
    s.eventually("client applied", || (gate(&s, "client")?.1 == "Applied").then_some(())).await;
    s.eventually("loner decided", || gate(&s, "loner")).await;
    assert_eq!(s.api.pod_conditions("client"), [says("True", "Applied", APPLIED_ONE)], "never NoLinks first");
    assert_eq!(s.api.pod_conditions("loner"), [says("True", "NoLinks", NO_LINKS)]);
    s.stop().await;
}

#[tokio::test]
async fn a_pod_is_never_failed_for_an_agent_whose_watch_has_not_listed_yet() {
    // The agent watch lists last: until then the node seems to have no agent.
    let pods = vec![gated_pod("client", "client", "n1", "10.0.1.1"), pod("server", "server", "n1", "10.0.1.9")];
    let (s, agents) = Scenario::restarted_but(WatchKind::Agent, pods, vec![link("geo", "client", "server", 10)]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.list(WatchKind::Agent, agents).await;
    s.eventually("client applied", || (gate(&s, "client")?.1 == "Applied").then_some(())).await;
    assert_eq!(s.api.pod_conditions("client"), [says("True", "Applied", APPLIED_ONE)], "never AgentUnavailable");
    let writes = format!("{:?}", s.api.writes());
    assert!(!writes.contains("AgentUnavailable"), "nothing written names a missing agent: {writes}");
    s.stop().await;
}

#[tokio::test]
async fn a_follower_writes_no_gate_until_it_leads() {
    let s = Scenario::start(false, dispatch(NO_RESYNC));
    for kind in WatchKind::ALL {
        s.list(kind, Vec::new()).await;
    }
    s.node_with_agent("n1", "10.255.0.1").await;
    s.api.create_pod(&pod("server", "server", "n1", "10.0.1.9"));
    s.api.create_pod(&gated_pod("client", "client", "n1", "10.0.1.1"));
    s.api.create_pod(&gated_pod("loner", "db", "n1", "10.0.1.3"));
    s.create(&link("quiet", "client", "server", 10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.api.pod_conditions("loner"), [], "a follower writes nothing");

    s.set_leading(true);
    s.eventually("client applied", || (gate(&s, "client")?.1 == "Applied").then_some(())).await;
    assert_eq!(gate(&s, "loner"), Some(says("True", "NoLinks", NO_LINKS)));
    s.stop().await;
}
