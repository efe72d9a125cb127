//! The plan limits through the whole controller: a link selecting every pod of the cluster is refused with
//! `TooManyDestinations` (status and Event) and reaches no agent, while another namespace's link on the same node
//! becomes `Ready`. And the status bounds: an agent's message past the CRD's bound is cut, written once.

use std::time::Duration;

use isthmus_agent_api::PodErrorKind;
use isthmus_operator::api::bounds::MAX_MESSAGE;
use isthmus_operator::controller::watch::Update;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

use super::apiserver::Write;
use super::harness::{Scenario, dispatch};
use super::{NO_RESYNC, events, support};

fn namespace(name: &str) -> Update {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
    }))
    .unwrap();
    Update::Namespace(Event::Apply(ns))
}

fn pod_in(ns: &str, name: &str, app: &str, ip: &str) -> Update {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "labels": {"app": app}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "none"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }))
    .unwrap();
    Update::Pod(Event::Apply(pod))
}

fn ready(s: &Scenario, key: &str) -> Option<(String, String, String)> {
    let c = s.api.link(key)?.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test]
async fn a_link_over_the_limit_is_refused_and_another_namespaces_link_becomes_ready() {
    let s = Scenario::synced(dispatch(NO_RESYNC)).await;
    let agent = s.node_with_agent("n1", "10.255.0.1").await;
    for ns in [super::NS, "tenant", "crowd"] {
        s.send(namespace(ns)).await;
    }
    s.send(pod_in(super::NS, "client", "client", "10.0.0.1")).await;
    s.send(pod_in("tenant", "client", "client", "10.0.1.1")).await;
    for i in 0..10 {
        s.send(pod_in("tenant", &format!("server-{i}"), "server", &format!("10.0.1.{}", 10 + i))).await;
    }
    for i in 0..600 {
        s.send(pod_in("crowd", &format!("pod-{i}"), "any", &format!("10.0.{}.{}", 2 + i / 250, i % 250 + 1))).await;
    }
    let mut everything = support::spec("client", "server", 100);
    everything.from.pod_selector = support::selector(&[]);
    everything.to.pod_selector = Some(support::selector(&[]));
    everything.to.namespace_selector = Some(support::selector(&[]));
    s.create(&support::link_object(super::NS, "everything", 1_700_000_000, everything)).await;
    s.create(&support::link_object("tenant", "wan", 1_700_000_000, support::spec("client", "server", 40))).await;

    let key = format!("{}/everything", super::NS);
    let (_, _, message) = s
        .eventually("the link over the limit refused", || {
            ready(&s, &key).filter(|(status, reason, _)| status == "False" && reason == "TooManyDestinations")
        })
        .await;
    assert!(message.contains("612 destinations") && message.contains("limit of 512"), "{message}");
    assert_eq!(s.api.link(&key).unwrap().status.unwrap().pairs, 0);
    s.eventually("an Event", || events(&s, "everything").iter().any(|(_, r)| r == "TooManyDestinations").then_some(()))
        .await;

    let (_, reason, _) = s
        .eventually("the tenant's link Ready", || ready(&s, "tenant/wan").filter(|(status, _, _)| status == "True"))
        .await;
    assert_eq!(reason, "Applied");
    let plan = s.agents.in_force(agent).expect("a plan in force");
    let planned: Vec<(&str, &str, usize)> =
        plan.pods.iter().map(|p| (p.namespace.as_str(), p.name.as_str(), p.destinations.len())).collect();
    assert_eq!(planned, [("tenant", "client", 10)], "the refused link reaches no agent");
    s.stop().await;
}

/// An agent's message longer than the CRD admits (a kernel's extended ack quoting a long name, say) is cut to
/// the bound in the failure and in the Degraded condition, and the cut status is written once, not again at every
/// resync (the uncut one would differ from the server's forever).
#[tokio::test]
async fn an_agent_message_past_the_bound_is_cut_and_written_once() {
    let s = Scenario::synced(dispatch(Duration::from_millis(200))).await;
    let agent = s.node_with_agent("n1", "10.255.0.1").await;
    let long = "netns net:[4026532] interface eth0: ".to_owned() + &"é".repeat(3 * MAX_MESSAGE);
    s.agents.fail_pod(agent, "client", PodErrorKind::KernelUnsupported, &long);
    s.send(pod_in(super::NS, "client", "client", "10.0.0.1")).await;
    s.send(pod_in(super::NS, "server", "server", "10.0.0.2")).await;
    s.create(&support::link_object(super::NS, "wan", 1_700_000_000, support::spec("client", "server", 40))).await;

    let key = format!("{}/wan", super::NS);
    let status = s
        .eventually("the failure in the status", || s.api.link(&key)?.status.filter(|st| !st.failures.is_empty()))
        .await;
    let message = &status.failures[0].message;
    assert_eq!(message.chars().count(), MAX_MESSAGE, "cut to the bound");
    assert!(message.starts_with("netns net:[4026532] interface eth0: é") && message.ends_with('…'), "{message}");
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded").expect("a Degraded condition");
    assert_eq!(degraded.message.chars().count(), MAX_MESSAGE);

    let writes = || s.api.writes().iter().filter(|w| matches!(w, Write::Status { link, .. } if *link == key)).count();
    let before = writes();
    // Ten resyncs: each sends the plan again and gets the same long message back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(writes(), before, "the same cut status written again");
    s.stop().await;
}
