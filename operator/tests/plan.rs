//! The pure plan, fed synthetic objects the way watch events would deliver them (no API server involved).

mod support;

use std::time::Duration;

use ipnet::IpNet;
use isthmus_agent_api::{Direction, NodePlan};
use isthmus_operator::api::{NetworkLinkSpec, ServiceInclusion};
use isthmus_operator::controller::status::fill_status;
use isthmus_operator::failure::FailureReason;
use isthmus_operator::index::{ObjectKey, PodPhase};
use isthmus_operator::plan::{Planner, compute};
use support::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn dests(plan: &NodePlan, pod: &str) -> Vec<(String, Option<Duration>, String, Direction)> {
    let p =
        plan.pods.iter().find(|p| p.name == pod).unwrap_or_else(|| panic!("{pod} not in the plan of {}", plan.node));
    p.destinations
        .iter()
        .map(|d| (d.destination.to_string(), d.impairment.fields().latency, d.link.name.clone(), d.link.direction))
        .collect()
}

fn ms(v: u64) -> Option<Duration> {
    Some(Duration::from_millis(v))
}

/// Two clients on two nodes, a dual-stack server: each client gets both server addresses.
#[test]
fn sources_get_every_destination_ip_dual_stack() {
    let mut p = Planner::new();
    let (k, v) = pod("shop", "client-1", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("shop", "client-2", "client", "n2", &["10.0.0.2", "fd00::2"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("shop", "server", "server", "n3", &["10.0.0.9", "fd00::9"]);
    p.upsert_pod(k, v);
    let (k, v) = link("shop", "slow", 100, spec("client", "server", 40));
    p.upsert_link(k, v);
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1".to_string(), "n2".to_string()]);
    let n1 = p.node_plan("n1").unwrap();
    assert_eq!(
        dests(n1, "client-1"),
        vec![
            ("10.0.0.9/32".into(), ms(40), "slow".into(), Direction::Forward),
            ("fd00::9/128".into(), ms(40), "slow".into(), Direction::Forward),
        ]
    );
    let client2 = &p.node_plan("n2").unwrap().pods[0];
    assert_eq!(client2.uid, "uid-shop-client-2");
    assert_eq!(client2.ips, vec!["10.0.0.2".parse::<std::net::IpAddr>().unwrap(), "fd00::2".parse().unwrap()]);
    assert!(p.node_plan("n3").is_none(), "the server is not a source");
    let facts = p.link_facts(&ObjectKey::new("shop", "slow")).unwrap();
    assert_eq!((facts.source_pods, facts.destinations, facts.pairs), (2, 2, 4));
}

/// A one-way link's way back is what the plan applies in the other direction: another link's impairment, or none.
#[test]
fn the_way_back_of_a_one_way_link_is_the_opposite_link() {
    let mut p = Planner::new();
    let (k, v) = pod("geo", "eu-0", "eu", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("geo", "us-0", "us", "n2", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("geo", "ap-0", "ap", "n2", &["10.0.0.3"]);
    p.upsert_pod(k, v);
    let one_way = |from, to, ms| NetworkLinkSpec { one_way: true, ..spec(from, to, ms) };
    for (name, from, to, ms) in [("eu-us", "eu", "us", 20), ("us-eu", "us", "eu", 25), ("eu-ap", "eu", "ap", 30)] {
        let (k, v) = link("geo", name, 100, one_way(from, to, ms));
        p.upsert_link(k, v);
    }
    p.recompute();
    let back = p.way_back(&ObjectKey::new("geo", "eu-us")).expect("us-eu impairs the way back");
    assert_eq!(back.fields().latency, ms(25));
    assert_eq!(p.way_back(&ObjectKey::new("geo", "us-eu")).unwrap().fields().latency, ms(20));
    assert!(p.way_back(&ObjectKey::new("geo", "eu-ap")).is_none(), "nothing impairs ap → eu");
}

/// Pods without IPs, ended, of an unknown phase or terminating are neither sources nor destinations, and are not
/// failures; a pending pod with an IP is both (its init containers send before it runs).
#[test]
fn pods_not_ready_for_the_network_are_skipped_and_pending_ones_with_an_ip_are_planned() {
    let mut p = Planner::new();
    let (k, mut v) = pod("ns", "no-ip", "client", "n1", &[]);
    v.ips.clear();
    v.phase = PodPhase::Pending;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "done", "client", "n1", &["10.0.0.2"]);
    v.phase = PodPhase::Ended;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "lost", "client", "n1", &["10.0.0.5"]);
    v.phase = PodPhase::Unknown;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "leaving", "client", "n1", &["10.0.0.3"]);
    v.terminating = true;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "old-server", "server", "n2", &["10.0.0.8"]);
    v.terminating = true;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "ended-server", "server", "n2", &["10.0.0.7"]);
    v.phase = PodPhase::Ended;
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.4"]);
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "server", "server", "n2", &["10.0.0.9"]);
    v.phase = PodPhase::Pending;
    p.upsert_pod(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "server", 5));
    p.upsert_link(k, v);
    p.recompute();
    let plan = p.node_plan("n1").unwrap();
    assert_eq!(plan.pods.len(), 1);
    assert_eq!(dests(plan, "client"), vec![("10.0.0.9/32".into(), ms(5), "l".into(), Direction::Forward)]);
    let facts = p.link_facts(&ObjectKey::new("ns", "l")).unwrap();
    assert!(facts.exclusions.is_empty());

    // The pod without an IP gets one while still pending (its sandbox is up): it joins at the next recompute.
    let (k, mut v) = pod("ns", "no-ip", "client", "n1", &["10.0.0.2"]);
    v.phase = PodPhase::Pending;
    p.upsert_pod(k, v);
    assert_eq!(p.recompute().nodes, vec!["n1".to_string()]);
    assert_eq!(p.node_plan("n1").unwrap().pods.len(), 2);
    // Running changes nothing the plan holds.
    let (k, v) = pod("ns", "no-ip", "client", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    assert!(p.recompute().nodes.is_empty());
}

#[test]
fn host_network_pods_are_excluded_with_a_reason() {
    let mut p = Planner::new();
    let (k, mut v) = pod("ns", "agent", "client", "n1", &["192.168.1.10"]);
    v.host_network = true;
    p.upsert_pod(k, v);
    let (k, mut v) = pod("ns", "node-exporter", "server", "n2", &["192.168.1.11"]);
    v.host_network = true;
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "server", "server", "n2", &["10.0.0.9"]);
    p.upsert_pod(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "server", 5));
    p.upsert_link(k, v);
    p.recompute();
    let plan = p.node_plan("n1").unwrap();
    assert_eq!(plan.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), vec!["client"]);
    assert_eq!(dests(plan, "client").len(), 1, "the host-network server's node IP is not a destination");
    let facts = p.link_facts(&ObjectKey::new("ns", "l")).unwrap();
    let excluded: Vec<_> =
        facts.exclusions.iter().map(|e| (e.pod.name.as_str(), e.reason, e.node.as_deref())).collect();
    assert_eq!(
        excluded,
        vec![
            ("agent", FailureReason::HostNetwork, Some("n1")),
            ("node-exporter", FailureReason::HostNetwork, Some("n2"))
        ]
    );
    assert!(facts.exclusions[0].message.contains("host's network"));
    let mut status = isthmus_operator::api::NetworkLinkStatus::default();
    fill_status(&facts, &mut status);
    assert_eq!(status.failures[1].pod, "ns/node-exporter");
    assert_eq!(status.failures[1].reason, "HostNetwork");
}

/// Higher priority wins; on a tie the older link wins, then the name; both links report the overlap.
#[test]
fn overlap_rule_and_reporting() {
    let base = || {
        let mut p = Planner::new();
        let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.1"]);
        p.upsert_pod(k, v);
        let (k, v) = pod("ns", "server", "server", "n1", &["10.0.0.9"]);
        p.upsert_pod(k, v);
        let (k, v) = pod("ns", "db", "db", "n1", &["10.0.0.7"]);
        p.upsert_pod(k, v);
        p
    };
    let winner = |p: &Planner| dests(p.node_plan("n1").unwrap(), "client")[0].2.clone();

    // Same priority: the older link (created at 100) wins over the newer one (created at 200).
    let mut p = base();
    let (k, v) = link("ns", "newer", 200, spec("client", "server", 10));
    p.upsert_link(k, v);
    let (k, v) = link("ns", "older", 100, spec("client", "server", 20));
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(winner(&p), "older");
    let older = p.link_facts(&ObjectKey::new("ns", "older")).unwrap();
    let newer = p.link_facts(&ObjectKey::new("ns", "newer")).unwrap();
    assert_eq!((older.pairs, newer.pairs), (1, 0));
    assert_eq!(older.overlaps.len(), 1);
    assert_eq!((older.overlaps[0].link.name.as_str(), older.overlaps[0].won, older.overlaps[0].lost), ("newer", 1, 0));
    assert_eq!((newer.overlaps[0].link.name.as_str(), newer.overlaps[0].won, newer.overlaps[0].lost), ("older", 0, 1));

    // Higher priority beats age.
    let mut s = spec("client", "server", 10);
    s.priority = 5;
    let (k, v) = link("ns", "newer", 200, s);
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(winner(&p), "newer");
    assert_eq!(dests(p.node_plan("n1").unwrap(), "client")[0].1, ms(10));

    // Same priority and age: the name decides.
    let mut p = base();
    let (k, v) = link("ns", "b", 100, spec("client", "server", 10));
    p.upsert_link(k, v);
    let (k, v) = link("ns", "a", 100, spec("client", "server", 20));
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(winner(&p), "a");

    // Links covering different destinations of the same pod do not overlap.
    let mut p = base();
    let (k, v) = link("ns", "to-server", 1, spec("client", "server", 10));
    p.upsert_link(k, v);
    let (k, v) = link("ns", "to-db", 1, spec("client", "db", 30));
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(
        dests(p.node_plan("n1").unwrap(), "client"),
        vec![
            ("10.0.0.7/32".into(), ms(30), "to-db".into(), Direction::Forward),
            ("10.0.0.9/32".into(), ms(10), "to-server".into(), Direction::Forward),
        ]
    );
    assert!(p.link_facts(&ObjectKey::new("ns", "to-db")).unwrap().overlaps.is_empty());
}

#[test]
fn namespace_selector_picks_destination_namespaces() {
    let mut p = Planner::new();
    p.upsert_namespace("client".into(), labels(&[("env", "test")]));
    p.upsert_namespace("prod".into(), labels(&[("env", "prod")]));
    p.upsert_namespace("staging".into(), labels(&[("env", "staging")]));
    let (k, v) = pod("client", "c", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("prod", "api", "api", "n2", &["10.0.1.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("staging", "api", "api", "n2", &["10.0.2.1"]);
    p.upsert_pod(k, v);
    let mut s = spec("client", "api", 10);
    s.to.namespace_selector = Some(selector(&[("env", "prod")]));
    let (k, v) = link("client", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(dests(p.node_plan("n1").unwrap(), "c").len(), 1);
    assert_eq!(dests(p.node_plan("n1").unwrap(), "c")[0].0, "10.0.1.1/32");

    // Relabeling a namespace moves the destinations.
    p.upsert_namespace("staging".into(), labels(&[("env", "prod")]));
    assert_eq!(p.recompute().nodes, vec!["n1".to_string()]);
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "c").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.1.1/32", "10.0.2.1/32"]);

    // Without a namespaceSelector only the link's own namespace is searched.
    let (k, v) = link("client", "l", 1, spec("client", "api", 10));
    p.upsert_link(k, v);
    p.recompute();
    assert!(p.node_plan("n1").is_none());
}

#[test]
fn reverse_direction_shapes_the_to_pods() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "phone", "phone", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "api", "api", "n2", &["10.0.0.9", "fd00::9"]);
    p.upsert_pod(k, v);
    let mut s = spec("phone", "api", 0);
    s.impairment = None;
    s.profile = Some(isthmus_operator::api::Profile::GeoSatellite);
    s.reverse = Some(latency(300));
    let (k, v) = link("ns", "sat", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    let up = dests(p.node_plan("n1").unwrap(), "phone");
    assert_eq!(up[0], ("10.0.0.9/32".into(), ms(325), "sat".into(), Direction::Forward));
    let down = p.node_plan("n2").unwrap();
    assert_eq!(dests(down, "api"), vec![("10.0.0.1/32".into(), ms(300), "sat".into(), Direction::Reverse)]);
    assert_eq!(
        down.pods[0].destinations[0].impairment.fields().rate_bps,
        Some(10_000_000),
        "downlink rate from the profile"
    );
    let facts = p.link_facts(&ObjectKey::new("ns", "sat")).unwrap();
    assert_eq!((facts.source_pods, facts.destinations, facts.pairs), (2, 3, 3));
    let mut status = isthmus_operator::api::NetworkLinkStatus::default();
    fill_status(&facts, &mut status);
    assert_eq!(status.expected_round_trip.as_deref(), Some("625ms"));
    assert_eq!(status.latency.as_deref(), Some("325ms/300ms"));
    assert_eq!(status.bandwidth.as_deref(), Some("2Mbit/10Mbit"));
    assert_eq!((status.from.as_deref(), status.to.as_deref()), (Some("app=phone"), Some("app=api")));
    assert_eq!((status.source_pods, status.destinations, status.pairs, status.observed_generation), (2, 3, 3, Some(1)));
}

/// A link never impairs a pod outside its namespace, whatever its selectors say — even a reverse direction
/// that bypassed the CRD's validation.
#[test]
fn security_boundary() {
    let mut p = Planner::new();
    p.upsert_namespace("attacker".into(), labels(&[]));
    p.upsert_namespace("victim".into(), labels(&[("team", "v")]));
    let (k, v) = pod("attacker", "a", "x", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("victim", "v", "x", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    // `from` matches app=x, which the victim pod also carries.
    let mut s = spec("x", "x", 10);
    s.to.namespace_selector = Some(selector(&[]));
    let (k, v) = link("attacker", "l", 1, s.clone());
    p.upsert_link(k, v);
    p.recompute();
    let plan = p.node_plan("n1").unwrap();
    assert_eq!(plan.pods.iter().map(|p| p.namespace.as_str()).collect::<Vec<_>>(), vec!["attacker"]);

    // A symmetric link with a namespaceSelector is refused outright.
    s.symmetric = true;
    let (k, v) = link("attacker", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    assert!(p.node_plan("n1").is_none());
    let facts = p.link_facts(&ObjectKey::new("attacker", "l")).unwrap();
    assert_eq!(facts.error.unwrap().field, "spec.to.namespaceSelector");
}

/// A tenant learns nothing through its link's status that its own access would not show it: no pod of another
/// namespace is named (a host-network pod there is left alone without a trace), and no destination is counted
/// while the link shapes no pod of its own (with one, the destinations are in that pod's own kernel state).
#[test]
fn a_link_status_tells_a_tenant_nothing_about_other_namespaces() {
    let mut p = Planner::new();
    p.upsert_namespace("tenant".into(), labels(&[]));
    p.upsert_namespace("kube-system".into(), labels(&[]));
    p.upsert_namespace("bank".into(), labels(&[]));
    for (ns, name, ip, host_network) in [
        ("kube-system", "node-agent", "192.168.1.10", true),
        ("bank", "ledger-0", "10.0.5.1", false),
        ("bank", "ledger-1", "10.0.5.2", false),
        ("tenant", "own-host-pod", "192.168.1.11", true),
    ] {
        let (k, mut v) = pod(ns, name, "db", "n2", &[ip]);
        v.host_network = host_network;
        p.upsert_pod(k, v);
    }
    let mut s = spec("client", "db", 10);
    s.to.namespace_selector = Some(selector(&[]));
    let (k, v) = link("tenant", "probe", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    let key = ObjectKey::new("tenant", "probe");
    let status_of = |p: &Planner| {
        let mut status = isthmus_operator::api::NetworkLinkStatus::default();
        fill_status(&p.link_facts(&key).unwrap(), &mut status);
        status
    };
    let status = status_of(&p);
    assert_eq!((status.source_pods, status.destinations, status.pairs), (0, 0, 0), "no source pod: nothing counted");
    let named: Vec<&str> = status.failures.iter().map(|f| f.pod.as_str()).collect();
    assert_eq!(named, vec!["tenant/own-host-pod"], "only the link's own namespace is named");

    // With a pod of its own, the destinations its kernel state holds are counted; still nobody else is named.
    let (k, v) = pod("tenant", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    p.recompute();
    let status = status_of(&p);
    assert_eq!((status.source_pods, status.destinations, status.pairs), (1, 2, 2));
    let named: Vec<&str> = status.failures.iter().map(|f| f.pod.as_str()).collect();
    assert_eq!(named, vec!["tenant/own-host-pod"]);
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "client").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.5.1/32", "10.0.5.2/32"], "what the status counts is what the pod holds");
}

#[test]
fn services_fronting_only_destination_pods_are_included() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "api-1", "api", "n2", &["10.0.0.10"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "web", "web", "n2", &["10.0.0.20"]);
    p.upsert_pod(k, v);
    let (k, v) = service("ns", "api", "api", &["10.96.0.10", "fd00:96::10"]);
    p.upsert_service(k, v);
    let (k, v) = service("ns", "web", "web", &["10.96.0.20"]);
    p.upsert_service(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "api", 10));
    p.upsert_link(k, v);
    p.recompute();
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "client").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.0.10/32", "10.96.0.10/32", "fd00:96::10/128"]);

    // A pod that the Service also routes to, but the link does not cover, takes the Service out.
    // Pending, the pod is no endpoint yet (the Service sends to running pods only): the Service stays.
    let (k, mut v) = pod("ns", "api-canary", "api", "n2", &["10.0.0.11"]);
    v.labels.insert("track".into(), "canary".into());
    let canary = (k.clone(), v.clone());
    v.phase = PodPhase::Pending;
    p.upsert_pod(k, v);
    let mut s = spec("client", "api", 10);
    s.to.pod_selector = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some(labels(&[("app", "api")])),
        match_expressions: Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
            key: "track".into(),
            operator: "DoesNotExist".into(),
            values: None,
        }]),
    });
    let (k, v) = link("ns", "l", 1, s.clone());
    p.upsert_link(k, v);
    p.recompute();
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "client").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.0.10/32", "10.96.0.10/32", "fd00:96::10/128"]);
    p.upsert_pod(canary.0, canary.1);
    p.recompute();
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "client").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.0.10/32"]);

    // `services: Ignore` never adds ClusterIPs.
    p.delete_pod(&ObjectKey::new("ns", "api-canary"));
    s.to.services = ServiceInclusion::Ignore;
    let (k, v) = link("ns", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(dests(p.node_plan("n1").unwrap(), "client").len(), 1);
}

#[test]
fn external_cidrs_and_own_ip() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "a", "peer", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "b", "peer", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    let mut s = spec("peer", "peer", 10);
    s.to.cidrs = vec!["203.0.113.0/24".into(), "2001:db8::/32".into()];
    let (k, v) = link("ns", "mesh", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    let got: Vec<_> = dests(p.node_plan("n1").unwrap(), "a").into_iter().map(|d| d.0).collect();
    assert_eq!(got, vec!["10.0.0.2/32", "203.0.113.0/24", "2001:db8::/32"], "a pod is never its own destination");
    assert_eq!(p.link_facts(&ObjectKey::new("ns", "mesh")).unwrap().pairs, 6);
}

/// A rescheduled pod: its new IP is used everywhere and the old one forgotten, on every affected node.
#[test]
fn rescheduled_destination_moves_everywhere() {
    let mut p = Planner::new();
    for (i, node) in ["n1", "n2", "n3"].iter().enumerate() {
        let (k, v) = pod("ns", &format!("client-{i}"), "client", node, &[&format!("10.0.0.{}", i + 1)]);
        p.upsert_pod(k, v);
    }
    let (k, v) = pod("ns", "server", "server", "n1", &["10.0.0.9"]);
    p.upsert_pod(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "server", 10));
    p.upsert_link(k, v);
    p.recompute();
    p.delete_pod(&ObjectKey::new("ns", "server"));
    let (k, v) = pod("ns", "server", "server", "n3", &["10.0.3.9"]);
    p.upsert_pod(k, v);
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1", "n2", "n3"]);
    assert_eq!(changes.links, vec![ObjectKey::new("ns", "l")]);
    for plan in p.node_plans() {
        for pod in &plan.pods {
            assert_eq!(pod.destinations.iter().map(|d| d.destination).collect::<Vec<_>>(), vec![net("10.0.3.9/32")]);
        }
    }
    // An event that changes nothing the link cares about recomputes nothing.
    let (k, v) = pod("ns", "unrelated", "other", "n2", &["10.0.0.50"]);
    p.upsert_pod(k, v);
    assert_eq!(p.recompute(), Default::default());
}

#[test]
fn deleting_the_link_empties_the_plans() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "c", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "s", "server", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "server", 10));
    p.upsert_link(k, v);
    p.recompute();
    assert!(p.node_plan("n1").is_some());
    p.delete_link(&ObjectKey::new("ns", "l"));
    assert_eq!(p.recompute().nodes, vec!["n1"]);
    assert!(p.node_plan("n1").is_none());
    assert!(p.link_facts(&ObjectKey::new("ns", "l")).is_none());
}

#[test]
fn invalid_link_reports_the_field_and_plans_nothing() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "c", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "s", "server", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    let mut s = spec("client", "server", 10);
    s.impairment.as_mut().unwrap().bandwidth = Some("100mbps".into());
    let (k, v) = link("ns", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    assert!(p.node_plan("n1").is_none());
    let e = p.link_facts(&ObjectKey::new("ns", "l")).unwrap().error.unwrap();
    assert_eq!(e.field, "spec.impairment.bandwidth");
    assert!(e.message.contains("Mbit"), "{e}");
}

#[test]
fn full_and_incremental_agree_on_a_fixed_world() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "c", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = link("ns", "l", 1, spec("client", "client", 10));
    p.upsert_link(k, v);
    p.recompute();
    let (k, v) = pod("ns", "d", "client", "n2", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    p.recompute();
    assert_eq!(p.snapshot(), compute(p.index().clone()).snapshot());
}
