//! `compute_pod` against a model of the overlap rule written as the rule reads: links admitted in rank order
//! while the pod's distinct destinations fit, then per destination the best claim wins and every other link
//! that claimed it counts an overlap. The model keeps every claim in maps; the planner sorts vectors.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{DestinationPlan, Direction, Impairment, ImpairmentFields, LinkRef, PodPlan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;

use super::*;
use crate::plan::selection::Side;

const POD_IP: &str = "10.0.0.1";

/// The pool destinations are drawn from: the pod's own address (never planned), hosts, and networks that
/// contain some of them (distinct entries).
fn pool() -> Vec<IpNet> {
    [POD_IP, "10.0.0.2", "10.0.0.3", "10.0.1.0/24", "10.0.0.0/16", "fd00::1", "fd00::2", "fd00::/64"]
        .iter()
        .map(|s| s.parse::<IpNet>().or_else(|_| s.parse::<IpAddr>().map(IpNet::from)).unwrap())
        .collect()
}

fn pod() -> ObjectKey {
    ObjectKey::new("ns", "pod")
}

fn source(key: ObjectKey) -> Source {
    Source { key, node: "node-a".into(), uid: "uid".into(), ips: vec![POD_IP.parse().unwrap()] }
}

/// A side: whether the pod is among its sources (with another pod, sorted), and the pool's entries it claims.
fn side(link: &str, direction: Direction, lists_pod: bool, picks: &[bool], latency_ms: u64) -> Side {
    let mut sources = vec![source(ObjectKey::new("ns", "other"))];
    if lists_pod {
        sources.push(source(pod()));
    }
    sources.sort_by(|a, b| a.key.cmp(&b.key));
    let mut destinations: Vec<IpNet> =
        pool().into_iter().zip(picks).filter(|(_, picked)| **picked).map(|(d, _)| d).collect();
    destinations.sort();
    let fields = ImpairmentFields { latency: Some(std::time::Duration::from_millis(latency_ms)), ..Default::default() };
    Side {
        impairment: Arc::new(Impairment::try_from(fields).unwrap()),
        link: Arc::new(LinkRef { namespace: "ns".into(), name: link.into(), direction }),
        sources,
        destinations,
        timeline: None,
    }
}

type SideShape = (bool, Vec<bool>);

fn link_shape() -> impl Strategy<Value = (i32, Option<i64>, SideShape, Option<SideShape>)> {
    let side = (prop::bool::weighted(0.8), prop::collection::vec(any::<bool>(), 8));
    (0..2i32, prop::option::of(1..3i64), side.clone(), prop::option::of(side))
}

fn resolutions(shapes: &[(i32, Option<i64>, SideShape, Option<SideShape>)]) -> Vec<(ObjectKey, Resolution)> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, (priority, created, forward, reverse))| {
            let name = format!("link-{i}");
            let rank = Rank {
                priority: *priority,
                created: created.map(|s| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())),
                name: name.clone(),
            };
            let latency = 10 * i as u64;
            let res = Resolution {
                rank,
                error: None,
                summary: None,
                refusal: None,
                forward: Some(side(&name, Direction::Forward, forward.0, &forward.1, latency + 1)),
                reverse: reverse.as_ref().map(|r| side(&name, Direction::Reverse, r.0, &r.1, latency + 2)),
                exclusions: Vec::new(),
                to_namespaces: Vec::new(),
                verify: false,
                unprobed: Vec::new(),
            };
            (ObjectKey::new("ns", name), res)
        })
        .collect()
}

/// The overlap rule as written in the module's documentation, with maps and sets.
fn model(pod: &ObjectKey, links: &[(ObjectKey, Resolution)], per_pod: u32) -> Option<PodOutput> {
    let mut ranked: Vec<&(ObjectKey, Resolution)> = links.iter().collect();
    ranked.sort_by(|(ka, a), (kb, b)| (a.rank.sort_key(), ka).cmp(&(b.rank.sort_key(), kb)));
    let mut stats: BTreeMap<ObjectKey, LinkStats> = BTreeMap::new();
    let mut first_source: Option<&Source> = None;
    // Destination → (link, its rank, direction, side), in the order seen.
    let mut claims: BTreeMap<IpNet, Vec<(&ObjectKey, &Rank, Direction, &Side)>> = BTreeMap::new();
    for (key, res) in ranked {
        let mut mine = Vec::new();
        for (direction, side) in res.sides() {
            let Some(src) = side.sources.iter().find(|s| s.key == *pod) else { continue };
            first_source.get_or_insert(src);
            for dest in &side.destinations {
                if !src.ips.iter().any(|ip| IpNet::from(*ip) == *dest) {
                    mine.push((*dest, (key, &res.rank, direction, side)));
                }
            }
        }
        let union: BTreeSet<IpNet> = claims.keys().copied().chain(mine.iter().map(|(d, _)| *d)).collect();
        if union.len() > per_pod as usize {
            let refusal = Refusal::PodDestinations { destinations: union.len() as u32, limit: per_pod };
            stats.entry(key.clone()).or_default().refused = Some(refusal);
            continue;
        }
        for (dest, claim) in mine {
            claims.entry(dest).or_default().push(claim);
        }
    }
    let src = first_source?;
    if claims.is_empty() {
        return None;
    }
    let mut destinations = Vec::new();
    for (dest, all) in &claims {
        let winner = all.iter().min_by_key(|(_, rank, direction, _)| (rank.sort_key(), *direction)).unwrap();
        stats.entry(winner.0.clone()).or_default().pairs += 1;
        let losers: BTreeSet<&ObjectKey> = all.iter().map(|c| c.0).filter(|l| *l != winner.0).collect();
        for loser in losers {
            stats.entry(winner.0.clone()).or_default().overlaps.entry(loser.clone()).or_default().0 += 1;
            stats.entry(loser.clone()).or_default().overlaps.entry(winner.0.clone()).or_default().1 += 1;
        }
        destinations.push(DestinationPlan {
            destination: *dest,
            impairment: winner.3.impairment.clone(),
            link: winner.3.link.clone(),
        });
    }
    Some(PodOutput {
        node: src.node.clone(),
        plan: PodPlan {
            uid: src.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            ips: src.ips.clone(),
            interface: isthmus_agent_api::default_interface(),
            host_network: false,
            destinations,
        },
        link_stats: stats,
    })
}

/// The most distinct destinations one link claims for the pod: the per-pod limit is never below it (the
/// limits refuse a per-pod limit below the per-link one).
fn widest_link(links: &[(ObjectKey, Resolution)]) -> u32 {
    let own: IpNet = POD_IP.parse::<IpAddr>().unwrap().into();
    links
        .iter()
        .map(|(_, res)| {
            let listed = res.sides().filter(|(_, s)| s.source(&pod()).is_some());
            let dests: BTreeSet<IpNet> =
                listed.flat_map(|(_, s)| s.destinations.iter().copied()).filter(|d| *d != own).collect();
            dests.len() as u32
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn compute_pod_follows_the_overlap_rule(
        shapes in prop::collection::vec(link_shape(), 0..5),
        headroom in 0..8u32,
    ) {
        let links = resolutions(&shapes);
        let per_pod = widest_link(&links).max(1) + headroom;
        let got = compute_pod(&pod(), links.iter().map(|(k, r)| (k, r)), per_pod);
        prop_assert_eq!(got, model(&pod(), &links, per_pod));
    }
}

#[test]
fn a_pod_claimed_by_two_links_gets_each_destination_once_from_the_better() {
    // link-0 (priority 1) and link-1 (priority 0) both claim 10.0.0.2; link-1 alone claims fd00::1.
    let mut picks_a = vec![false; 8];
    picks_a[1] = true;
    let mut picks_b = picks_a.clone();
    picks_b[5] = true;
    let links = resolutions(&[(1, None, (true, picks_a), None), (0, None, (true, picks_b), None)]);
    let out = compute_pod(&pod(), links.iter().map(|(k, r)| (k, r)), 10).unwrap();
    let winners: Vec<(String, String)> =
        out.plan.destinations.iter().map(|d| (d.destination.to_string(), d.link.name.clone())).collect();
    assert_eq!(winners, [("10.0.0.2/32".into(), "link-0".into()), ("fd00::1/128".into(), "link-1".into())]);
    let (a, b) = (ObjectKey::new("ns", "link-0"), ObjectKey::new("ns", "link-1"));
    assert_eq!(out.link_stats[&a].overlaps[&b], (1, 0));
    assert_eq!(out.link_stats[&b].overlaps[&a], (0, 1));
    assert_eq!((out.link_stats[&a].pairs, out.link_stats[&b].pairs), (1, 1));
}
