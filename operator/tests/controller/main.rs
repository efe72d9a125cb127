//! The controller against a real kube-apiserver (no mock): the cleanup finalizer is added and removed, statuses
//! carry `observedGeneration` and the conditions, leadership hands over between two controllers, and the
//! readiness gate's condition lands on pods (`gate.rs`); links the operator cannot decode (`unreadable.rs`);
//! the plan limits (`limits.rs`); plans of a deposed or killed leader arriving late (`handover.rs`); NetworkTopology
//! and the links it owns, with the garbage collector (`topology.rs`); a schedule's status and Events (`schedule.rs`).
//!
//! Needs `ISTHMUS_TEST_KUBECONFIG` naming a control plane's kubeconfig: the tests are ignored in a plain
//! `cargo test`, and `make operator-it` starts one and runs them. The control plane has no nodes and no kubelet: agents are either
//! absent or one real `isthmus-agent` process on 127.0.0.1. Pods are made "running" by patching their status.
//! The same controller paths in memory, with an in-memory agent and API server: tests/scenarios/.

mod cluster;
mod gate;
mod handover;
mod limits;
mod schedule;
mod topology;
mod unreadable;

use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::controller::finalizer::FINALIZER;
use isthmus_operator::leader::{Election, LeaderConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use cluster::*;

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn finalizer_and_status_follow_the_link() {
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-status-{}", std::process::id());
    let node_name = format!("op-it-node-{}", std::process::id());
    let _made = Made::new(&ns, &node_name);
    namespace(&client, &ns).await;
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);

    // No pod matches yet: the link is ready with nothing to do, and carries the finalizer.
    links.create(&PostParams::default(), &link("quiet", "10ms")).await.unwrap();
    let l = eventually("finalizer and first status", || async {
        let l = links.get("quiet").await.ok()?;
        let ok = l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)
            && l.status.as_ref()?.observed_generation == Some(1);
        ok.then_some(l)
    })
    .await;
    assert_eq!(condition(&l, "Ready"), Some(("True".into(), "NoPairs".into())));
    assert_eq!(condition(&l, "Degraded"), Some(("False".into(), "AsExpected".into())));

    // A source and a destination on a node whose agent does not exist: one pair, failed, Degraded says why.
    running_pod(&client, &ns, "client-0", "client", "ghost-node", "198.51.100.10").await;
    running_pod(&client, &ns, "server-0", "server", "ghost-node", "198.51.100.20").await;
    let l = eventually("degraded status", || async {
        let l = links.get("quiet").await.ok()?;
        (condition(&l, "Degraded")?.0 == "True").then_some(l)
    })
    .await;
    let s = l.status.clone().unwrap();
    assert_eq!((s.source_pods, s.destinations, s.pairs, s.pairs_applied, s.pairs_failed), (1, 1, 1, 0, 1));
    assert_eq!(condition(&l, "Degraded").unwrap().1, "AgentUnavailable");
    assert_eq!(condition(&l, "Ready"), Some(("False".into(), "Failed".into())));
    assert_eq!(s.failures[0].pod, format!("{ns}/client-0"));
    assert_eq!(s.failures[0].node.as_deref(), Some("ghost-node"));

    // A spec change is observed.
    links
        .patch("quiet", &PatchParams::default(), &Patch::Merge(json!({"spec": {"impairment": {"latency": "20ms"}}})))
        .await
        .unwrap();
    let l = eventually("generation 2 observed", || async {
        let l = links.get("quiet").await.ok()?;
        (l.status.as_ref()?.observed_generation == Some(2)).then_some(l)
    })
    .await;
    assert_eq!(l.status.unwrap().latency.as_deref().map(|s| s.contains("20ms")), Some(true));

    // Deleting: the only affected node has no Node object, so nothing blocks; the Event says so.
    links.delete("quiet", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("quiet").await.ok()?.is_none().then_some(()) }).await;
    let reasons = eventually("cleanup event", || async {
        let r = event_reasons(&client, &ns, "quiet").await;
        r.iter().any(|r| r == "CleanupSkippedNode").then_some(r)
    })
    .await;
    assert!(reasons.iter().any(|r| r == "AgentUnavailable"), "the Degraded transition was published: {reasons:?}");

    // A node that exists but whose agent never confirms: the finalizer goes after the timeout, with a warning.
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
    nodes
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap())
        .await
        .unwrap();
    running_pod(&client, &ns, "client-1", "client", &node_name, "198.51.100.11").await;
    links.create(&PostParams::default(), &link("stuck", "10ms")).await.unwrap();
    eventually("stuck link has one pair", || async {
        let l = links.get("stuck").await.ok()?;
        let s = l.status.as_ref()?;
        (s.pairs == 2 && l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)).then_some(())
    })
    .await;
    // The chart's uninstall hook deletes it: the finalizer holds the link while the node has not confirmed, goes
    // after the timeout, and the hook then fails, naming the node and the pod that may still be impaired.
    let started = std::time::Instant::now();
    let hook = tokio::spawn(isthmus_operator::uninstall::delete_all_and_wait(client.clone(), Duration::from_secs(60)));
    eventually("stuck link deleting", || async {
        links.get_opt("stuck").await.ok()??.metadata.deletion_timestamp.map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        links.get_opt("stuck").await.unwrap().is_some(),
        "the finalizer holds the link while the node has not confirmed"
    );
    let error = hook.await.unwrap().expect_err("the hook fails once a cleanup gave up");
    let text = error.to_string();
    assert!(started.elapsed() >= Duration::from_secs(3), "not before the cleanup timeout");
    assert!(links.get_opt("stuck").await.unwrap().is_none(), "the link is gone");
    for needle in [format!("{ns}/stuck"), format!("node {node_name}"), format!("{ns}/client-1")] {
        assert!(text.contains(&needle), "the hook's error names {needle}: {text}");
    }
    let event = eventually("timeout event", || async {
        events_of(&client, &ns, "stuck").await.into_iter().find(|e| e.reason.as_deref() == Some("CleanupTimedOut"))
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&node_name) && note.contains(&format!("{ns}/client-1")), "{note}");

    running.stop().await;
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn leadership_hands_over_between_two_controllers() {
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-leader-{}", std::process::id());
    namespace(&client, &ns).await;
    let lease = |identity: &str| LeaderConfig {
        lease_name: "isthmus-operator".into(),
        lease_namespace: ns.clone(),
        identity: identity.into(),
        duration_s: 4,
        grace_s: 1,
    };
    let a = Election::start(client.clone(), &lease("replica-a")).await.unwrap();
    let mut a_leads = a.is_leader.clone();
    a_leads.wait_for(|l| *l).await.unwrap();
    let b = Election::start(client.clone(), &lease("replica-b")).await.unwrap();
    let b_leads = b.is_leader.clone();
    let run_a = start(&client, &ns, "replica-a", a.is_leader.clone(), Duration::from_secs(30));
    let run_b = start(&client, &ns, "replica-b", b_leads.clone(), Duration::from_secs(30));

    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);
    links.create(&PostParams::default(), &link("shared", "10ms")).await.unwrap();
    eventually("the leader writes status and finalizer", || async {
        let l = links.get("shared").await.ok()?;
        let ok = l.metadata.finalizers.as_ref()?.iter().any(|f| f == FINALIZER)
            && l.status.as_ref()?.observed_generation == Some(1);
        ok.then_some(())
    })
    .await;
    assert!(!*b_leads.borrow(), "only one leader");

    // The leader stops and releases the lease; the follower takes over and handles the next change.
    run_a.stop().await;
    tokio::time::timeout(Duration::from_secs(20), a.release(vec![a_leads])).await.expect("lease released");
    let mut b_wait = b_leads.clone();
    tokio::time::timeout(Duration::from_secs(30), b_wait.wait_for(|l| *l)).await.expect("b leads").unwrap();
    let holder = Api::<Lease>::namespaced(client.clone(), &ns).get("isthmus-operator").await.unwrap();
    assert_eq!(holder.spec.and_then(|s| s.holder_identity).as_deref(), Some("replica-b"));

    links
        .patch("shared", &PatchParams::default(), &Patch::Merge(json!({"spec": {"impairment": {"latency": "30ms"}}})))
        .await
        .unwrap();
    eventually("the new leader observes generation 2", || async {
        let l = links.get("shared").await.ok()?;
        (l.status.as_ref()?.observed_generation == Some(2)).then_some(())
    })
    .await;
    links.delete("shared", &DeleteParams::default()).await.unwrap();
    eventually("the new leader removes the finalizer", || async {
        links.get_opt("shared").await.ok()?.is_none().then_some(())
    })
    .await;

    run_b.stop().await;
    drop(b_wait);
    tokio::time::timeout(Duration::from_secs(20), b.release(vec![b_leads])).await.expect("lease released");
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_real_agent_confirms_plans_and_releases_the_finalizer() {
    let t = WithAgent::start("agent").await;
    let (client, ns, agent) = (&t.client, &t.ns, &t.agent);
    running_pod(client, ns, "client-0", "client", &t.node, "198.51.100.30").await;
    running_pod(client, ns, "server-0", "server", &t.node, "198.51.100.40").await;
    let running = t.controller();

    let links: Api<NetworkLink> = Api::namespaced(client.clone(), ns);
    links.create(&PostParams::default(), &link("real", "10ms")).await.unwrap();
    // The agent cannot find the pod's namespace (it sees none): the status says so, per pod and node.
    let l = eventually("the agent's per-pod answer in the status", || async {
        let l = links.get("real").await.ok()?;
        (condition(&l, "Degraded")?.1 == "PodNotFound").then_some(l)
    })
    .await;
    let s = l.status.unwrap();
    assert_eq!((s.pairs, s.pairs_applied, s.pairs_failed), (1, 0, 1));
    assert_eq!(s.failures[0].node.as_deref(), Some(t.node.as_str()));

    // Deleting: the agent acknowledges a plan without the link, and the finalizer goes long before the timeout.
    let started = std::time::Instant::now();
    links.delete("real", &DeleteParams::default()).await.unwrap();
    eventually("link gone", || async { links.get_opt("real").await.ok()?.is_none().then_some(()) }).await;
    assert!(started.elapsed() < Duration::from_secs(60), "released by the agent's acknowledgement, not the timeout");
    let reasons = event_reasons(client, ns, "real").await;
    assert!(!reasons.iter().any(|r| r == "CleanupTimedOut"), "{reasons:?}");
    let observed =
        agent.client.observed(std::net::SocketAddr::from(([127, 0, 0, 1], agent.port)), &agent.node).await.unwrap();
    assert!(observed.pods.is_empty(), "the agent holds an empty plan: {observed:?}");

    running.stop().await;
    t.finish().await;
}
