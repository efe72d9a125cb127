//! The plan limits through the whole controller: a link selecting every pod of the cluster is refused with
//! `TooManyDestinations` (status and Event) and reaches no agent, while another namespace's link on the same node
//! becomes `Ready`.

use isthmus_operator::controller::watch::Update;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

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
