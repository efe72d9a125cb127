//! Property tests of the plan over random worlds: event order does not matter, incremental updates equal a
//! full recompute, and the invariants (security boundary, overlap rule, usable pods only, the plan limits)
//! always hold — within the default limits and within limits small enough to refuse links.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use isthmus_operator::api::{NetworkLinkSpec, ServiceInclusion};
use isthmus_operator::failure::FailureReason;
use isthmus_operator::index::{Labels, LinkInfo, ObjectKey, PodInfo, PodPhase, ServiceInfo};
use isthmus_operator::plan::{PlanLimits, Planner, Refusal, compute_with, resolve_link};
use proptest::prelude::*;
use support::*;

#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "a few hundred events per case; boxing would only obscure the test")]
enum Event {
    Pod(ObjectKey, Option<PodInfo>),
    Namespace(String, Option<Labels>),
    Service(ObjectKey, Option<ServiceInfo>),
    Link(ObjectKey, Option<LinkInfo>),
}

impl Event {
    fn key(&self) -> String {
        match self {
            Event::Pod(k, _) => format!("pod/{k}"),
            Event::Namespace(n, _) => format!("ns/{n}"),
            Event::Service(k, _) => format!("svc/{k}"),
            Event::Link(k, _) => format!("link/{k}"),
        }
    }

    fn apply(&self, p: &mut Planner) {
        match self.clone() {
            Event::Pod(k, Some(v)) => p.upsert_pod(k, v),
            Event::Pod(k, None) => p.delete_pod(&k),
            Event::Namespace(n, Some(l)) => p.upsert_namespace(n, l),
            Event::Namespace(n, None) => p.delete_namespace(&n),
            Event::Service(k, Some(v)) => p.upsert_service(k, v),
            Event::Service(k, None) => p.delete_service(&k),
            Event::Link(k, Some(v)) => p.upsert_link(k, v),
            Event::Link(k, None) => p.delete_link(&k),
        }
    }
}

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const APPS: [&str; 3] = ["p", "q", "r"];

fn ip(i: u8) -> IpAddr {
    if i.is_multiple_of(3) { format!("fd00::{i:x}").parse().unwrap() } else { format!("10.0.0.{i}").parse().unwrap() }
}

fn pod_event() -> impl Strategy<Value = Event> {
    (
        0..3usize,
        0..6u8,
        0..3usize,
        prop::option::weighted(0.9, 0..3u8),
        prop::collection::vec(0..24u8, 0..3),
        prop::sample::select(vec![
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Running,
            PodPhase::Ended,
            PodPhase::Unknown,
        ]),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(ns, name, app, node, ips, phase, terminating, host_network, present)| {
            let key = ObjectKey::new(NAMESPACES[ns], format!("pod-{name}"));
            let info = PodInfo {
                uid: format!("uid-{}-{name}-{node:?}", NAMESPACES[ns]),
                labels: labels(&[("app", APPS[app])]),
                node: node.map(|n| format!("n{n}")),
                ips: {
                    let mut v: Vec<IpAddr> = ips.into_iter().map(ip).collect();
                    v.dedup();
                    v
                },
                phase,
                terminating,
                host_network,
            };
            Event::Pod(key, present.then_some(info))
        })
}

fn namespace_event() -> impl Strategy<Value = Event> {
    (0..3usize, 0..2usize, prop::bool::weighted(0.9)).prop_map(|(ns, env, present)| {
        let mut l = labels(&[("env", ["x", "y"][env])]);
        l.insert("kubernetes.io/metadata.name".into(), NAMESPACES[ns].into());
        Event::Namespace(NAMESPACES[ns].into(), present.then_some(l))
    })
}

fn service_event() -> impl Strategy<Value = Event> {
    (0..3usize, 0..3u8, 0..3usize, 0..8u8, prop::bool::weighted(0.85)).prop_map(|(ns, name, app, ipn, present)| {
        let (key, info) = service(NAMESPACES[ns], &format!("svc-{name}"), APPS[app], &[&format!("10.96.0.{ipn}")]);
        Event::Service(key, present.then_some(info))
    })
}

fn link_event() -> impl Strategy<Value = Event> {
    (
        (0..3usize, 0..4u8, 0..3usize, 0..3usize),
        (0..4usize, 0..4usize, 0..3i32, 0..3i64, 1..100u32),
        (
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.85),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
        ),
    )
        .prop_map(
            |((ns, name, from, to), (ns_sel, dir, priority, created, ms), (cidr, ignore_svc, present, quiet, flap))| {
                let mut s: NetworkLinkSpec = spec(APPS[from], APPS[to], ms);
                s.priority = priority;
                // The plan's probing hints and timelines (verify.rs) follow `verify` and `schedule`.
                if quiet {
                    s.verify = Some(false);
                }
                if flap {
                    s.schedule = Some(serde_yaml::from_str(&format!("{{flap: {{up: {ms}s, down: 2s}}}}")).unwrap());
                }
                s.to.namespace_selector = match ns_sel {
                    0 | 1 => None,
                    2 => Some(selector(&[("env", "x")])),
                    _ => Some(selector(&[])),
                };
                match dir {
                    1 => s.symmetric = true,
                    2 => s.reverse = Some(latency(ms + 1)),
                    _ => {}
                }
                if cidr {
                    s.to.cidrs = vec!["203.0.113.0/24".into()];
                }
                if ignore_svc {
                    s.to.services = ServiceInclusion::Ignore;
                }
                let (key, info) = link(NAMESPACES[ns], &format!("link-{name}"), created, s);
                Event::Link(key, present.then_some(info))
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![6 => pod_event(), 1 => namespace_event(), 1 => service_event(), 2 => link_event()]
}

/// The last event per object, all of them upserts: a world that different event orders must agree on.
fn final_state(events: &[Event]) -> Vec<Event> {
    let mut last: BTreeMap<String, Event> = BTreeMap::new();
    for e in events {
        last.insert(e.key(), e.clone());
    }
    last.into_values()
        .filter(|e| {
            !matches!(
                e,
                Event::Pod(_, None) | Event::Namespace(_, None) | Event::Service(_, None) | Event::Link(_, None)
            )
        })
        .collect()
}

/// The default limits, or limits a handful of pods exceed (destinations, pairs per link, pairs in total).
fn limits() -> impl Strategy<Value = PlanLimits> {
    prop_oneof![
        Just(PlanLimits::DEFAULT),
        (1u32..8, 0u32..3).prop_map(|(per_link, more)| PlanLimits::new(per_link, per_link + more).unwrap()),
        (1u32..12, 0u32..12).prop_map(|(pairs, more)| PlanLimits::DEFAULT.with_pairs(pairs, pairs + more).unwrap()),
    ]
}

/// Whether the link is left out for this pod by the per-pod limit.
fn refused_for(p: &Planner, link: &ObjectKey, pod: &ObjectKey) -> bool {
    p.link_facts(link)
        .is_some_and(|f| f.exclusions.iter().any(|e| &e.pod == pod && e.reason == FailureReason::TooManyDestinations))
}

fn check_invariants(p: &Planner) -> Result<(), TestCaseError> {
    let index = p.index();
    let limits = p.limits();
    for (lk, info) in &index.links {
        let facts = p.link_facts(lk).expect("every link has facts");
        let res = resolve_link(index, lk, info, &limits);
        let over_destinations = facts.destinations > limits.per_link();
        match facts.refusal {
            Some(Refusal::LinkDestinations { .. }) => prop_assert!(over_destinations, "{}", lk),
            Some(Refusal::LinkPairs { pairs, .. }) => {
                prop_assert!(!over_destinations && pairs > u64::from(limits.pairs_per_link()), "{}", lk);
            }
            Some(Refusal::TotalPairs { pairs, admitted, .. }) => {
                prop_assert!(admitted + pairs > u64::from(limits.pairs_total()), "{}", lk);
                prop_assert!(res.refusal.is_none(), "{} fits its own limits", lk);
            }
            Some(Refusal::PodDestinations { .. }) => prop_assert!(false, "a per-pod refusal refuses no link whole"),
            None => prop_assert!(!over_destinations && res.refusal.is_none(), "{}", lk),
        }
        if facts.refusal.is_some() {
            prop_assert_eq!(facts.pairs, 0, "{} refused", lk);
        }
        if res.refusal.is_some() {
            prop_assert!(res.forward.is_none() && res.reverse.is_none(), "{} refused", lk);
        }
    }
    let planned: usize = p.node_plans().flat_map(|n| &n.pods).map(|pod| pod.destinations.len()).sum();
    prop_assert!(planned as u64 <= u64::from(limits.pairs_total()), "{planned} pairs planned, beyond the total");
    for plan in p.node_plans() {
        prop_assert!(!plan.pods.is_empty());
        for pod in &plan.pods {
            let key = ObjectKey::new(&pod.namespace, &pod.name);
            let info = index.pods.get(&key).expect("planned pods exist");
            prop_assert!(info.usable(), "{key} is planned but not usable: {info:?}");
            prop_assert_eq!(info.node.as_deref(), Some(plan.node.as_str()));
            prop_assert_eq!(&info.uid, &pod.uid);
            prop_assert_eq!(&info.ips, &pod.ips);
            prop_assert!(!pod.destinations.is_empty());
            prop_assert!(pod.destinations.len() <= limits.per_pod() as usize, "{key}: beyond the per-pod limit");
            for w in pod.destinations.windows(2) {
                prop_assert!(w[0].destination < w[1].destination, "destinations sorted and unique");
            }
            for d in &pod.destinations {
                // Security boundary: only links of the pod's own namespace shape it.
                prop_assert_eq!(&d.link.namespace, &pod.namespace);
                prop_assert!(!pod.ips.iter().any(|ip| IpNet::from(*ip) == d.destination), "own IP as destination");
                // Overlap rule: no link covering this pair ranks better than the winner.
                let winner = &index.links[&ObjectKey::new(&d.link.namespace, &d.link.name)].rank;
                for (lk, info) in &index.links {
                    let res = resolve_link(index, lk, info, &limits);
                    let covers = res.forward.iter().chain(res.reverse.iter()).any(|side| {
                        side.sources.iter().any(|s| s.key == key) && side.destinations.contains(&d.destination)
                    }) && !refused_for(p, lk, &key)
                        && p.link_facts(lk).is_some_and(|f| f.refusal.is_none());
                    if covers {
                        prop_assert!(winner.sort_key() <= info.rank.sort_key(), "{} beats winner {}", lk, d.link.name);
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The same objects, delivered in any order, give the same plans and facts.
    #[test]
    fn event_order_does_not_matter(
        (world, shuffled) in prop::collection::vec(event(), 0..40)
            .prop_map(|events| final_state(&events))
            .prop_flat_map(|w| (Just(w.clone()), Just(w).prop_shuffle())),
        limits in limits(),
    ) {
        let mut a = Planner::with_limits(limits);
        for e in &world { e.apply(&mut a); }
        a.recompute();
        let mut b = Planner::with_limits(limits);
        for e in &shuffled { e.apply(&mut b); }
        b.recompute();
        prop_assert_eq!(a.snapshot(), b.snapshot());
        check_invariants(&a)?;
    }

    /// Recomputing after any subset of events gives exactly what a full computation gives.
    #[test]
    fn incremental_equals_full(
        events in prop::collection::vec((event(), prop::bool::weighted(0.5)), 0..60),
        limits in limits(),
    ) {
        let mut p = Planner::with_limits(limits);
        for (e, recompute_now) in &events {
            e.apply(&mut p);
            if *recompute_now {
                p.recompute();
                prop_assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
            }
        }
        p.recompute();
        prop_assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
        check_invariants(&p)?;
    }
}
