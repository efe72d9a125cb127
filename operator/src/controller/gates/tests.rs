//! The gate's rule, case by case: a planner computed from a small index, node reports as the dispatchers would
//! record them, and the condition each pod carries.

use std::sync::Arc;

use isthmus_agent_api::{ApplyReply, Capabilities, NodePlan, PodError, PodErrorKind, PodOutcome, PodResult};
use serde_json::{Value, json};

use super::*;
use crate::api::NetworkLink;
use crate::controller::nodes::{AgentFailure, AppliedPlan};
use crate::gate::PodGate;
use crate::index::{Index, LinkInfo, PodPhase};
use crate::plan::compute;

const NS: &str = "ns";

fn time(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(NS, name)
}

/// A running pod of `app` on n1 with its own network.
fn pod(name: &str, app: &str, ip: &str) -> PodInfo {
    PodInfo {
        uid: format!("uid-{name}"),
        labels: [("app".to_owned(), app.to_owned())].into(),
        node: Some("n1".into()),
        ips: vec![ip.parse().unwrap()],
        phase: PodPhase::Running,
        terminating: false,
        host_network: false,
    }
}

fn link(ns: &str, name: &str, spec: Value) -> (ObjectKey, LinkInfo) {
    let link: NetworkLink = serde_json::from_value(json!({
        "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkLink",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 1},
        "spec": spec,
    }))
    .unwrap();
    LinkInfo::from_link(&link)
}

/// `app=client → app=server`, 10 ms.
fn client_to_server() -> Value {
    json!({"from": {"podSelector": {"matchLabels": {"app": "client"}}},
           "to": {"podSelector": {"matchLabels": {"app": "server"}}},
           "impairment": {"latency": "10ms"}})
}

/// An index of `pods` (every one gated, carrying no condition yet) and `links`, planned.
fn planned(pods: Vec<(&str, PodInfo)>, links: Vec<(ObjectKey, LinkInfo)>) -> Planner {
    let mut index = Index::default();
    index.namespaces.insert(NS.into(), [("kubernetes.io/metadata.name".to_owned(), NS.to_owned())].into());
    for (name, info) in pods {
        index.gates.insert(key(name), PodGate::default());
        index.pods.insert(key(name), info);
    }
    index.links.extend(links);
    compute(index)
}

/// A report of n1's agent: it acknowledged `plan` with these outcomes.
fn acked(plan: &NodePlan, outcomes: &[(&str, PodOutcome)], netem: bool) -> BTreeMap<String, NodeReport> {
    let capabilities = Capabilities { netem, htb: true, tbf: true, u32: true, ..Default::default() };
    let pods = outcomes
        .iter()
        .map(|(name, outcome)| PodResult {
            uid: format!("uid-{name}"),
            namespace: NS.into(),
            name: (*name).into(),
            outcome: outcome.clone(),
            mutations: 1,
            queue_caps: Vec::new(),
            refused: Vec::new(),
        })
        .collect();
    let reply = ApplyReply {
        node: "n1".into(),
        version: 1,
        stale: false,
        pods,
        capabilities: capabilities.clone(),
        leftovers: Vec::new(),
    };
    let report = NodeReport {
        applied: Some(AppliedPlan::new(Arc::new(plan.clone()), reply)),
        failure: None,
        capabilities: Some(capabilities),
    };
    BTreeMap::from([("n1".to_owned(), report)])
}

fn unreachable() -> BTreeMap<String, NodeReport> {
    let failure = AgentFailure { reason: FailureReason::AgentUnreachable, message: "agent on node n1: refused".into() };
    BTreeMap::from([("n1".to_owned(), NodeReport { failure: Some(failure), ..Default::default() })])
}

fn carrying(reason: GateReason, since: i64) -> GateCondition {
    GateCondition { status: Some(reason.status()), reason: Some(reason), last_transition_time: Some(time(since)) }
}

fn state_of(p: &Planner, reports: &BTreeMap<String, NodeReport>, name: &str) -> Option<PodLinksState> {
    links_state(p, reports, &key(name))
}

fn client_and_server() -> Planner {
    planned(
        vec![("client", pod("client", "client", "10.0.0.1")), ("server", pod("server", "server", "10.0.0.2"))],
        vec![link(NS, "l", client_to_server())],
    )
}

#[test]
fn applied_only_once_the_agent_confirmed_the_desired_entry() {
    let p = client_and_server();
    let none = BTreeMap::new();
    assert_eq!(state_of(&p, &none, "client"), Some(PodLinksState::Pending), "planned, not confirmed");
    assert_eq!(changes(&p, &none, [&key("client")], &time(10)), [], "pending: nothing written");

    let desired = p.node_plan("n1").unwrap().clone();
    let reports = acked(&desired, &[("client", PodOutcome::Applied)], true);
    let applied = PodLinksState::Applied { node: "n1".into(), destinations: 1, emulated: false };
    assert_eq!(state_of(&p, &reports, "client"), Some(applied));
    let written = changes(&p, &reports, [&key("client")], &time(10));
    let expected = GateChange {
        pod: key("client"),
        uid: "uid-client".into(),
        write: GateWrite {
            reason: GateReason::Applied,
            message: "node n1's agent applied every link that shapes this pod (1 destination)".into(),
            last_transition_time: time(10),
        },
    };
    assert_eq!(written, [expected]);

    // The agent confirmed an older entry (another destination): the desired one is pending again.
    let mut older = desired.clone();
    older.pods[0].destinations[0].destination = "10.9.9.9/32".parse().unwrap();
    let reports = acked(&older, &[("client", PodOutcome::Applied)], true);
    assert_eq!(state_of(&p, &reports, "client"), Some(PodLinksState::Pending));
}

#[test]
fn a_pod_the_agent_emulates_is_told_what_the_emulation_leaves_unimpaired() {
    let p = client_and_server();
    let desired = p.node_plan("n1").unwrap().clone();
    let mut reports = acked(&desired, &[("client", PodOutcome::Applied)], false);
    let report = reports.get_mut("n1").unwrap();
    report.capabilities.as_mut().unwrap().datapath = isthmus_agent_api::DatapathKind::Userspace;
    let state = state_of(&p, &reports, "client").unwrap();
    assert_eq!(state, PodLinksState::Applied { node: "n1".into(), destinations: 1, emulated: true });
    let written = changes(&p, &reports, [&key("client")], &time(10));
    assert_eq!(written.len(), 1);
    assert_eq!(
        written[0].write.message,
        format!(
            "node n1's agent applied every link that shapes this pod (1 destination), emulated by the agent: {}",
            super::EMULATION_LIMIT
        )
    );
}

#[test]
fn a_pod_no_link_selects_is_ready_at_once_and_one_not_running_yet_waits() {
    let mut waiting = pod("waiting", "client", "10.0.0.3");
    waiting.phase = PodPhase::Pending;
    waiting.ips.clear();
    let mut other = pod("other", "db", "10.0.0.4");
    other.node = None;
    let p = planned(
        vec![("waiting", waiting), ("other", other), ("server", pod("server", "server", "10.0.0.2"))],
        vec![link(NS, "l", client_to_server())],
    );
    let none = BTreeMap::new();
    assert_eq!(
        state_of(&p, &none, "other"),
        Some(PodLinksState::NoLinks),
        "not even scheduled, and nothing selects it"
    );
    assert_eq!(
        state_of(&p, &none, "waiting"),
        Some(PodLinksState::Pending),
        "selected: its entry comes once it has an IP"
    );
    assert_eq!(
        state_of(&p, &none, "server"),
        Some(PodLinksState::NoLinks),
        "a destination only: its egress is not shaped"
    );
    let written = changes(&p, &none, [&key("other"), &key("waiting"), &key("server")], &time(5));
    let reasons: Vec<(&str, GateReason)> = written.iter().map(|c| (c.pod.name.as_str(), c.write.reason)).collect();
    assert_eq!(reasons, [("other", GateReason::NoLinks), ("server", GateReason::NoLinks)]);
    assert_eq!(written[0].write.message, "no NetworkLink selects this pod as a source; nothing to wait for");
}

#[test]
fn links_that_give_a_pod_no_destination_leave_nothing_to_wait_for() {
    // No server runs: the link selects the client, whose kernel needs nothing.
    let p = planned(
        vec![("client", pod("client", "client", "10.0.0.1"))],
        vec![link(NS, "a", client_to_server()), link(NS, "b", client_to_server())],
    );
    let v = state_of(&p, &BTreeMap::new(), "client").unwrap();
    assert_eq!(v, PodLinksState::NoPairs { links: vec!["a".into(), "b".into()] });
    let w = decide(None, &v, &time(1)).unwrap();
    assert_eq!(w.reason, GateReason::NoPairs);
    assert_eq!(
        w.message,
        "NetworkLinks a, b select this pod as a source but give it no destination yet; nothing to apply"
    );
    let one = PodLinksState::NoPairs { links: vec!["a".into()] };
    assert_eq!(
        decide(None, &one, &time(1)).unwrap().message,
        "NetworkLink a selects this pod as a source but gives it no destination yet; nothing to apply"
    );
}

#[test]
fn only_links_of_the_pods_namespace_in_force_select_it() {
    let pods = vec![("client", pod("client", "client", "10.0.0.1")), ("server", pod("server", "server", "10.0.0.2"))];
    let mut invalid = client_to_server();
    invalid["from"]["podSelector"] = json!({"matchExpressions": [{"key": "app", "operator": "Bogus"}]});
    let p = planned(pods, vec![link("elsewhere", "l", client_to_server()), link(NS, "broken", invalid)]);
    assert_eq!(state_of(&p, &BTreeMap::new(), "client"), Some(PodLinksState::NoLinks));
}

#[test]
fn the_reverse_direction_makes_the_to_pods_sources() {
    let mut symmetric = client_to_server();
    symmetric["symmetric"] = json!(true);
    let mut server = pod("server", "server", "10.0.0.2");
    server.phase = PodPhase::Pending;
    server.ips.clear();
    let pods = vec![("client", pod("client", "client", "10.0.0.1")), ("server", server)];
    let p = planned(pods.clone(), vec![link(NS, "l", symmetric)]);
    assert_eq!(
        state_of(&p, &BTreeMap::new(), "server"),
        Some(PodLinksState::Pending),
        "a source of the reverse direction"
    );
    let p = planned(pods, vec![link(NS, "l", client_to_server())]);
    assert_eq!(state_of(&p, &BTreeMap::new(), "server"), Some(PodLinksState::NoLinks), "one way: not a source");
}

#[test]
fn a_failed_entry_is_false_with_the_reason_the_link_status_gives() {
    let p = client_and_server();
    let desired = p.node_plan("n1").unwrap().clone();
    let err = PodError { kind: PodErrorKind::KernelUnsupported, message: "EOPNOTSUPP".into() };
    let reports = acked(&desired, &[("client", PodOutcome::Failed(err))], false);
    let v = state_of(&p, &reports, "client").unwrap();
    let message = "node n1's kernel has no sch_netem and its agent runs the tc datapath: latency/loss cannot be applied (agent.datapath auto emulates them)";
    assert_eq!(v, PodLinksState::Failed { reason: FailureReason::KernelUnsupported, message: message.into() });

    // A failure the agent reports turns a ready pod NotReady, with a new transition time.
    let ready = carrying(GateReason::Applied, 1);
    let w = decide(Some(&ready), &v, &time(50)).unwrap();
    assert_eq!(
        w,
        GateWrite {
            reason: GateReason::Failed(FailureReason::KernelUnsupported),
            message: message.into(),
            last_transition_time: time(50),
        }
    );
    assert!(!w.reason.status());
    // Once written, the same failure is not written again, whatever its message says now.
    let failed = carrying(GateReason::Failed(FailureReason::KernelUnsupported), 50);
    let other_text = PodLinksState::Failed { reason: FailureReason::KernelUnsupported, message: "other".into() };
    assert_eq!(decide(Some(&failed), &other_text, &time(60)), None);
    // Another reason is written, keeping the time the status turned False.
    let dup = PodLinksState::Failed { reason: FailureReason::DuplicateRestriction, message: "cannot mix".into() };
    assert_eq!(decide(Some(&failed), &dup, &time(70)).unwrap().last_transition_time, time(50));
}

#[test]
fn an_undelivered_plan_holds_a_pod_not_yet_ready_but_never_unreadies_one() {
    let p = client_and_server();
    let v = state_of(&p, &unreachable(), "client").unwrap();
    let failed =
        PodLinksState::Failed { reason: FailureReason::AgentUnreachable, message: "agent on node n1: refused".into() };
    assert_eq!(v, failed);
    assert_eq!(decide(None, &v, &time(1)).unwrap().reason, GateReason::Failed(FailureReason::AgentUnreachable));
    for reason in [GateReason::Applied, GateReason::NoLinks, GateReason::NoPairs] {
        assert_eq!(decide(Some(&carrying(reason, 1)), &v, &time(2)), None, "the kernel keeps what {reason} said");
    }
    // An unreachable agent that had confirmed exactly this entry before: still applied.
    let desired = p.node_plan("n1").unwrap().clone();
    let mut reports = acked(&desired, &[("client", PodOutcome::Applied)], true);
    reports.get_mut("n1").unwrap().failure = unreachable()["n1"].failure.clone();
    assert!(matches!(state_of(&p, &reports, "client"), Some(PodLinksState::Applied { .. })));
}

#[test]
fn pending_never_writes_and_ready_stays_ready() {
    let now = time(9);
    assert_eq!(decide(None, &PodLinksState::Pending, &now), None, "absent while pending: the pod is not Ready");
    for reason in [GateReason::Applied, GateReason::NoLinks, GateReason::Failed(FailureReason::PodNotFound)] {
        assert_eq!(decide(Some(&carrying(reason, 1)), &PodLinksState::Pending, &now), None, "{reason} stays");
    }
    // True stays True through a change of reason, and keeps its transition time.
    let applied = PodLinksState::Applied { node: "n1".into(), destinations: 3, emulated: false };
    let w = decide(Some(&carrying(GateReason::NoLinks, 1)), &applied, &now).unwrap();
    assert_eq!((w.reason, w.last_transition_time), (GateReason::Applied, time(1)));
    assert_eq!(w.message, "node n1's agent applied every link that shapes this pod (3 destinations)");
    assert_eq!(decide(Some(&carrying(GateReason::Applied, 1)), &applied, &now), None, "unchanged: no write");
    // A condition someone else wrote is corrected.
    let foreign = GateCondition { status: None, reason: None, last_transition_time: None };
    assert_eq!(decide(Some(&foreign), &applied, &now).unwrap().last_transition_time, now);
    let wrong_status = GateCondition { status: Some(false), ..carrying(GateReason::Applied, 1) };
    assert_eq!(decide(Some(&wrong_status), &applied, &now).unwrap().last_transition_time, now);
}

#[test]
fn host_network_pods_a_link_selects_are_never_ready() {
    let mut host = pod("host", "client", "192.0.2.1");
    host.host_network = true;
    let mut alone = pod("alone", "db", "192.0.2.1");
    alone.host_network = true;
    let p = planned(
        vec![("host", host), ("alone", alone), ("server", pod("server", "server", "10.0.0.2"))],
        vec![link(NS, "l", client_to_server())],
    );
    let v = state_of(&p, &BTreeMap::new(), "host").unwrap();
    assert_eq!(v, PodLinksState::Failed { reason: FailureReason::HostNetwork, message: host_network("source") });
    let w = decide(Some(&carrying(GateReason::NoLinks, 1)), &v, &time(2)).unwrap();
    assert_eq!((w.reason, w.last_transition_time), (GateReason::Failed(FailureReason::HostNetwork), time(2)));
    assert_eq!(state_of(&p, &BTreeMap::new(), "alone"), Some(PodLinksState::NoLinks));
}

#[test]
fn ungated_terminating_and_unknown_pods_get_nothing() {
    let mut p = client_and_server();
    let mut index = p.index().clone();
    index.gates.remove(&key("server"));
    index.pods.get_mut(&key("client")).unwrap().terminating = true;
    p = compute(index);
    let none = BTreeMap::new();
    assert_eq!(state_of(&p, &none, "client"), None, "terminating");
    assert_eq!(state_of(&p, &none, "gone"), None, "not in the index");
    assert_eq!(changes(&p, &none, [&key("client"), &key("server"), &key("gone")], &time(1)), [], "server: no gate");
}

#[test]
fn the_apply_body_holds_the_one_condition_and_the_pods_uid() {
    let change = GateChange {
        pod: key("client"),
        uid: "uid-client".into(),
        write: GateWrite {
            reason: GateReason::Failed(FailureReason::PodNotFound),
            message: "no network namespace".into(),
            last_transition_time: time(1_767_225_600),
        },
    };
    assert_eq!(
        apply_body(&change),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "client", "namespace": NS, "uid": "uid-client"},
            "status": {"conditions": [{
                "type": "isthmus.dev/links-applied", "status": "False", "reason": "PodNotFound",
                "message": "no network namespace", "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]},
        })
    );
}
