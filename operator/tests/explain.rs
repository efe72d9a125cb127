//! `Planner::explain_pair`: the contest behind one pair agrees with the plan the operator sends, and says why
//! each other link lost.

mod support;

use std::net::IpAddr;

use isthmus_agent_api::Direction;
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::{Defeat, ExplainError, PlanLimits, Planner, Refusal};
use support::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("shop", name)
}

/// A client on n1 and a server; `links` are (name, created second, priority, latency ms) from client to server.
fn planner(links: &[(&str, i64, i32, u32)]) -> Planner {
    let mut p = Planner::new();
    for (k, v) in
        [pod("shop", "client", "client", "n1", &["10.0.0.1"]), pod("shop", "server", "server", "n2", &["10.0.0.9"])]
    {
        p.upsert_pod(k, v);
    }
    for (name, created, priority, ms) in links {
        let mut s = spec("client", "server", *ms);
        s.priority = *priority;
        let (k, v) = link("shop", name, *created, s);
        p.upsert_link(k, v);
    }
    p.recompute();
    p
}

/// The explanation's winner is the link the node plan holds for that destination.
fn assert_agrees_with_plan(p: &Planner, pod: &ObjectKey, dest: &str) {
    let e = p.explain_pair(pod, ip(dest)).unwrap();
    let (node, entry) = p.pod_entry(pod).unwrap();
    assert_eq!(node, e.node);
    let planned = entry.destinations.iter().find(|d| d.destination == e.decisive().destination).unwrap();
    assert_eq!(planned.link.name, e.decisive().winner.link.name);
    assert_eq!(planned.link.direction, e.decisive().winner.direction);
}

#[test]
fn higher_priority_wins_and_the_loser_is_told_why() {
    let p = planner(&[("old-low", 100, 0, 10), ("new-high", 200, 5, 50)]);
    let e = p.explain_pair(&key("client"), ip("10.0.0.9")).unwrap();
    assert_eq!(e.node, "n1");
    assert_eq!(e.entries.len(), 1);
    let entry = e.decisive();
    assert_eq!(entry.destination.to_string(), "10.0.0.9/32");
    assert_eq!(entry.winner.link, key("new-high"));
    assert_eq!(entry.losers.len(), 1);
    assert_eq!(entry.losers[0].0.link, key("old-low"));
    assert_eq!(entry.losers[0].1, Defeat::Priority { winner: 5, loser: 0 });
    assert_agrees_with_plan(&p, &key("client"), "10.0.0.9");
}

#[test]
fn at_equal_priority_the_older_wins_then_the_name() {
    let p = planner(&[("b-young", 300, 0, 10), ("z-old", 100, 0, 20), ("a-old", 100, 0, 30)]);
    let entry = p.explain_pair(&key("client"), ip("10.0.0.9")).unwrap().decisive().clone();
    assert_eq!(entry.winner.link, key("a-old"));
    let losers: Vec<(String, Defeat)> = entry.losers.iter().map(|(c, d)| (c.link.name.clone(), *d)).collect();
    assert_eq!(losers, vec![("z-old".into(), Defeat::Name), ("b-young".into(), Defeat::Younger)]);
    assert_agrees_with_plan(&p, &key("client"), "10.0.0.9");
}

#[test]
fn forward_beats_reverse_within_one_link() {
    // A link between pods of the same app in both directions: each pod is both a source and a destination.
    let mut p = Planner::new();
    for (k, v) in [pod("shop", "a", "peer", "n1", &["10.0.0.1"]), pod("shop", "b", "peer", "n2", &["10.0.0.2"])] {
        p.upsert_pod(k, v);
    }
    let mut s = spec("peer", "peer", 10);
    s.symmetric = true;
    let (k, v) = link("shop", "mesh", 100, s);
    p.upsert_link(k, v);
    p.recompute();
    let entry = p.explain_pair(&key("a"), ip("10.0.0.2")).unwrap().decisive().clone();
    assert_eq!((entry.winner.link.name.as_str(), entry.winner.direction), ("mesh", Direction::Forward));
    assert_eq!(entry.losers.len(), 1);
    assert_eq!((entry.losers[0].0.direction, entry.losers[0].1), (Direction::Reverse, Defeat::Direction));
    assert_agrees_with_plan(&p, &key("a"), "10.0.0.2");
}

#[test]
fn a_host_entry_shadows_a_covering_cidr() {
    let mut p = planner(&[("pods", 100, 0, 10)]);
    let mut s = spec("client", "nothing", 80);
    s.to.pod_selector = None;
    s.to.cidrs = vec!["10.0.0.0/24".into()];
    s.priority = 9;
    let (k, v) = link("shop", "subnet", 50, s);
    p.upsert_link(k, v);
    p.recompute();
    let e = p.explain_pair(&key("client"), ip("10.0.0.9")).unwrap();
    let order: Vec<(String, String)> =
        e.entries.iter().map(|x| (x.destination.to_string(), x.winner.link.name.clone())).collect();
    assert_eq!(order, vec![("10.0.0.9/32".into(), "pods".into()), ("10.0.0.0/24".into(), "subnet".into())]);
    // Another address of the subnet has only the CIDR entry.
    let other = p.explain_pair(&key("client"), ip("10.0.0.77")).unwrap();
    assert_eq!(other.decisive().winner.link, key("subnet"));
}

#[test]
fn a_link_refused_for_the_pod_is_listed() {
    // Per pod 1 destination: the second server does not fit, so the lower-ranked link is left out for the pod.
    let mut p = Planner::with_limits(PlanLimits::new(1, 1).unwrap());
    for (k, v) in [
        pod("shop", "client", "client", "n1", &["10.0.0.1"]),
        pod("shop", "server", "server", "n2", &["10.0.0.9"]),
        pod("shop", "cache", "cache", "n2", &["10.0.0.8"]),
    ] {
        p.upsert_pod(k, v);
    }
    for (name, created, to) in [("first", 100, "server"), ("second", 200, "cache")] {
        let (k, v) = link("shop", name, created, spec("client", to, 10));
        p.upsert_link(k, v);
    }
    p.recompute();
    let e = p.explain_pair(&key("client"), ip("10.0.0.9")).unwrap();
    assert_eq!(e.refused, vec![(key("second"), Refusal::PodDestinations { destinations: 2, limit: 1 })]);
    let err = p.explain_pair(&key("client"), ip("10.0.0.8")).unwrap_err();
    assert_eq!(err, ExplainError::NotCovered { pod: key("client"), destination: ip("10.0.0.8") });
}

#[test]
fn pods_without_links_and_uncovered_addresses_are_errors_that_say_so() {
    let p = planner(&[("slow", 100, 0, 10)]);
    let err = p.explain_pair(&key("server"), ip("10.0.0.1")).unwrap_err();
    assert_eq!(err, ExplainError::NotASource(key("server")));
    assert!(err.to_string().contains("no NetworkLink shapes the egress of pod shop/server"), "{err}");
    let err = p.explain_pair(&key("client"), ip("192.0.2.1")).unwrap_err();
    assert!(err.to_string().contains("no NetworkLink decides the pair shop/client → 192.0.2.1"), "{err}");
}
