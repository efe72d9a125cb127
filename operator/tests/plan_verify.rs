//! The plan's probing hints: `NodePlan.unverified` (links with `spec.verify: false`) and `NodePlan.unprobed`
//! (Service ClusterIPs and `to.cidrs` networks), fed synthetic objects like `plan.rs`.

mod support;

use ipnet::IpNet;
use isthmus_agent_api::LinkId;
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::{Planner, compute};
use support::*;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

fn id(ns: &str, name: &str) -> LinkId {
    LinkId { namespace: ns.into(), name: name.into() }
}

/// Two links on one node, one with verification off: only that one is listed, on every node it has sources.
#[test]
fn links_with_verify_off_are_listed_on_their_nodes_only() {
    let mut p = planner_with(&[
        ("c1", "client", "n1", "10.0.0.1"),
        ("c2", "client", "n2", "10.0.0.2"),
        ("w", "worker", "n1", "10.0.0.3"),
    ]);
    let (k, v) = pod("ns", "server", "server", "n3", &["10.0.0.9"]);
    p.upsert_pod(k, v);
    let mut quiet = spec("client", "server", 10);
    quiet.verify = Some(false);
    let (k, v) = link("ns", "quiet", 1, quiet);
    p.upsert_link(k, v);
    let (k, v) = link("ns", "loud", 2, spec("worker", "server", 10));
    p.upsert_link(k, v);
    p.recompute();
    assert_eq!(p.node_plan("n1").unwrap().unverified, vec![id("ns", "quiet")]);
    assert_eq!(p.node_plan("n2").unwrap().unverified, vec![id("ns", "quiet")]);
    assert!(p.node_plan("n1").unwrap().unprobed.is_empty(), "pod destinations are probed");

    // Switching verification on again changes only the hint, and the nodes that carry it get a new plan.
    let (k, v) = link("ns", "quiet", 1, spec("client", "server", 10));
    p.upsert_link(k, v);
    let changes = p.recompute();
    assert_eq!(changes.nodes, vec!["n1", "n2"]);
    assert!(p.node_plans().all(|plan| plan.unverified.is_empty()));
    // `verify: true` said explicitly is the default: nothing changes.
    let mut explicit = spec("client", "server", 10);
    explicit.verify = Some(true);
    let (k, v) = link("ns", "quiet", 1, explicit);
    p.upsert_link(k, v);
    assert!(p.recompute().nodes.is_empty());
}

/// ClusterIPs of matching Services and `to.cidrs` networks are never probed; the pods behind them are.
#[test]
fn service_ips_and_cidrs_are_unprobed() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "api", "api", "n2", &["10.0.0.10", "fd00::10"]);
    p.upsert_pod(k, v);
    let (k, v) = service("ns", "api", "api", &["10.96.0.10", "fd00:96::10"]);
    p.upsert_service(k, v);
    let mut s = spec("client", "api", 10);
    s.to.cidrs = vec!["203.0.113.0/24".into()];
    s.symmetric = true;
    let (k, v) = link("ns", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    let n1 = p.node_plan("n1").unwrap();
    assert_eq!(n1.unprobed, nets(&["10.96.0.10/32", "203.0.113.0/24", "fd00:96::10/128"]));
    assert!(n1.unverified.is_empty());
    assert!(p.node_plan("n2").unwrap().unprobed.is_empty(), "the reverse direction's destinations are pods");

    // The Service goes: its ClusterIPs leave the plan and the hint with it.
    p.delete_service(&ObjectKey::new("ns", "api"));
    p.recompute();
    assert_eq!(p.node_plan("n1").unwrap().unprobed, nets(&["203.0.113.0/24"]));
}

/// The hints computed incrementally equal the hints computed from scratch.
#[test]
fn incremental_hints_equal_a_fresh_computation() {
    let mut p = Planner::new();
    let (k, v) = pod("ns", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    let (k, v) = pod("ns", "server", "server", "n2", &["10.0.0.9"]);
    p.upsert_pod(k, v);
    let mut s = spec("client", "server", 10);
    s.verify = Some(false);
    s.to.cidrs = vec!["198.51.100.0/24".into()];
    let (k, v) = link("ns", "l", 1, s);
    p.upsert_link(k, v);
    p.recompute();
    // The client moves to another node: the old node's plan goes, the new one carries the hints.
    let (k, v) = pod("ns", "client", "client", "n3", &["10.0.3.1"]);
    p.upsert_pod(k, v);
    p.recompute();
    assert!(p.node_plan("n1").is_none());
    let fresh = compute(p.index().clone());
    let n3 = p.node_plan("n3").unwrap();
    assert_eq!(n3, fresh.node_plan("n3").unwrap());
    assert_eq!((n3.unverified.clone(), n3.unprobed.clone()), (vec![id("ns", "l")], nets(&["198.51.100.0/24"])));
}
