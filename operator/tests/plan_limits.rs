//! The plan's size limits (docs/networklink.md#plan-limits): a link selecting more destinations than the
//! per-link limit is refused whole, a pod's links are admitted in rank order within the per-pod limit, a link
//! asking for more pairs than the per-link limit is refused whole, links are admitted in rank order within the
//! total, and none of these touches another link's pairs.

mod support;

use isthmus_operator::controller::status::link_status;
use isthmus_operator::failure::FailureReason;
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::{PlanLimits, Planner, Refusal, compute_with};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use support::*;

fn servers(p: &mut Planner, ns: &str, app: &str, count: u8, first_ip: u8) {
    for i in 0..count {
        let (k, v) = pod(ns, &format!("{app}-{i}"), app, "n2", &[&format!("10.1.{first_ip}.{i}")]);
        p.upsert_pod(k, v);
    }
}

fn destinations(p: &Planner, node: &str, pod: &str) -> Vec<String> {
    let plan = p.node_plan(node).expect("a plan");
    let pod = plan.pods.iter().find(|x| x.name == pod).expect("the pod in the plan");
    pod.destinations.iter().map(|d| format!("{} {}", d.destination, d.link.name)).collect()
}

fn condition(p: &Planner, link: &ObjectKey, type_: &str) -> (String, String, String) {
    let facts = p.link_facts(link).unwrap();
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let status = link_status(&facts, None, None, &now);
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// A link over the per-link limit gets nothing planned and says why; another tenant's link on the same nodes
/// keeps its pairs; dropping below the limit admits the link.
#[test]
fn a_link_beyond_the_per_link_limit_is_refused_whole() {
    let limits = PlanLimits::new(3, 4).unwrap();
    let mut p = Planner::with_limits(limits);
    let (k, v) = pod("big", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    servers(&mut p, "big", "server", 4, 1);
    let (k, v) = pod("other", "client", "client", "n1", &["10.0.0.2"]);
    p.upsert_pod(k, v);
    servers(&mut p, "other", "server", 2, 2);
    let (big, v) = link("big", "all", 1, spec("client", "server", 10));
    p.upsert_link(big.clone(), v);
    let (other, v) = link("other", "wan", 1, spec("client", "server", 20));
    p.upsert_link(other.clone(), v);
    p.recompute();

    let facts = p.link_facts(&big).unwrap();
    assert_eq!(facts.refusal, Some(Refusal::LinkDestinations { destinations: 4, limit: 3 }));
    assert_eq!((facts.destinations, facts.pairs), (4, 0));
    let (status, reason, message) = condition(&p, &big, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "TooManyDestinations"));
    assert!(message.contains("4 destinations") && message.contains("limit of 3 per link"), "{message}");
    assert_eq!(condition(&p, &big, "Degraded").1, "TooManyDestinations");
    let n1 = p.node_plan("n1").unwrap();
    assert!(n1.pods.iter().all(|x| x.namespace == "other"), "nothing planned for the refused link: {n1:?}");
    assert_eq!(destinations(&p, "n1", "client"), ["10.1.2.0/32 wan", "10.1.2.1/32 wan"]);
    assert_eq!(p.link_facts(&other).unwrap().refusal, None);

    p.delete_pod(&ObjectKey::new("big", "server-3"));
    p.recompute();
    assert_eq!(p.link_facts(&big).unwrap().refusal, None);
    assert_eq!(p.link_facts(&big).unwrap().pairs, 3);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
}

/// A pod's links are admitted in rank order: a newer link that would take the pod beyond the per-pod limit is
/// left out for that pod (a failure in its status), a higher-priority one displaces the lower-ranked, and a
/// link adding only destinations the pod already has always fits.
#[test]
fn a_pods_links_are_admitted_in_rank_order_within_the_per_pod_limit() {
    let limits = PlanLimits::new(3, 4).unwrap();
    let mut p = Planner::with_limits(limits);
    let (k, v) = pod("t", "client", "client", "n1", &["10.0.0.1"]);
    p.upsert_pod(k, v);
    servers(&mut p, "t", "a", 3, 1);
    servers(&mut p, "t", "b", 2, 2);
    let (old, v) = link("t", "old", 1, spec("client", "a", 10));
    p.upsert_link(old.clone(), v);
    let (new, v) = link("t", "new", 2, spec("client", "b", 20));
    p.upsert_link(new.clone(), v);
    p.recompute();

    assert_eq!(destinations(&p, "n1", "client"), ["10.1.1.0/32 old", "10.1.1.1/32 old", "10.1.1.2/32 old"]);
    let facts = p.link_facts(&new).unwrap();
    assert_eq!(facts.pairs, 0);
    let failure = &facts.exclusions[0];
    assert_eq!((failure.pod.name.as_str(), failure.reason), ("client", FailureReason::TooManyDestinations));
    assert_eq!(failure.node.as_deref(), Some("n1"));
    assert!(failure.message.contains("5 destinations") && failure.message.contains("limit of 4 per pod"));
    assert_eq!(condition(&p, &new, "Degraded").1, "TooManyDestinations");
    assert!(p.link_facts(&old).unwrap().exclusions.is_empty());

    // Higher priority ranks first: `new` is admitted, `old` now does not fit.
    let mut urgent = spec("client", "b", 20);
    urgent.priority = 5;
    let (_, v) = link("t", "new", 2, urgent);
    p.upsert_link(new.clone(), v);
    p.recompute();
    assert_eq!(destinations(&p, "n1", "client"), ["10.1.2.0/32 new", "10.1.2.1/32 new"]);
    assert_eq!(p.link_facts(&old).unwrap().exclusions[0].reason, FailureReason::TooManyDestinations);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());

    // A link whose destinations the pod already has adds none: it fits and competes for its pairs.
    let (same, v) = link("t", "same", 3, spec("client", "b", 30));
    p.upsert_link(same.clone(), v);
    p.recompute();
    let facts = p.link_facts(&same).unwrap();
    assert!(facts.exclusions.is_empty(), "{:?}", facts.exclusions);
    assert_eq!((facts.pairs, facts.overlaps.len()), (0, 1), "it loses both pairs to `new`");
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
}

/// A link asking for more pairs than the per-link limit is refused whole (`TooManyPairs`); links are admitted in
/// rank order while all their pairs fit the total, one that does not fit is refused whole until there is room,
/// and a higher-priority link takes its room first.
/// A symmetric link among one app's three pods claims each of a pod's two peers twice (forward as a `from` pod,
/// reverse as a `to` pod): the per-pod limit counts each peer once, so a limit of three admits the link.
#[test]
fn a_destination_claimed_by_both_sides_of_a_link_counts_once_against_the_per_pod_limit() {
    let mut p = Planner::with_limits(PlanLimits::new(3, 3).unwrap());
    for (name, node, ip) in [("a", "n1", "10.0.0.1"), ("b", "n1", "10.0.0.2"), ("c", "n2", "10.0.0.3")] {
        let (k, v) = pod("ns", name, "peer", node, &[ip]);
        p.upsert_pod(k, v);
    }
    let mut mesh = spec("peer", "peer", 10);
    mesh.symmetric = true;
    let (key, v) = link("ns", "mesh", 1, mesh);
    p.upsert_link(key.clone(), v);
    p.recompute();

    let facts = p.link_facts(&key).unwrap();
    assert_eq!(facts.refusal, None);
    assert_eq!(destinations(&p, "n1", "a"), ["10.0.0.2/32 mesh", "10.0.0.3/32 mesh"]);
    assert_eq!(facts.pairs, 6, "each pod to its two peers");
}

#[test]
fn pairs_are_capped_per_link_and_in_total_in_rank_order() {
    let limits = PlanLimits::new(8, 8).unwrap().with_pairs(6, 10).unwrap();
    let mut p = Planner::with_limits(limits);
    for i in 0..3 {
        let (k, v) = pod("t", &format!("client-{i}"), "client", "n1", &[&format!("10.0.0.{i}")]);
        p.upsert_pod(k, v);
    }
    servers(&mut p, "t", "a", 2, 1);
    servers(&mut p, "t", "b", 2, 2);
    servers(&mut p, "t", "c", 3, 3);
    // 3 clients × 2 = 6 pairs each for `first` and `second`; 3 × 3 = 9 for `wide`.
    let (first, v) = link("t", "first", 1, spec("client", "a", 10));
    p.upsert_link(first.clone(), v);
    let (second, v) = link("t", "second", 2, spec("client", "b", 20));
    p.upsert_link(second.clone(), v);
    let (wide, v) = link("t", "wide", 3, spec("client", "c", 30));
    p.upsert_link(wide.clone(), v);
    p.recompute();

    assert_eq!((p.link_facts(&first).unwrap().refusal, p.link_facts(&first).unwrap().pairs), (None, 6));
    assert_eq!(p.link_facts(&wide).unwrap().refusal, Some(Refusal::LinkPairs { pairs: 9, destinations: 3, limit: 6 }));
    let (status, reason, message) = condition(&p, &wide, "Ready");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "TooManyPairs"));
    assert!(message.contains("9 pairs") && message.contains("pairsPerLink"), "{message}");
    let facts = p.link_facts(&second).unwrap();
    assert_eq!(facts.refusal, Some(Refusal::TotalPairs { pairs: 6, admitted: 6, destinations: 2, limit: 10 }));
    assert_eq!((facts.pairs, facts.destinations), (0, 2));
    let (_, reason, message) = condition(&p, &second, "Degraded");
    assert!(reason == "TooManyPairs" && message.contains("pairsTotal"), "{reason}: {message}");
    assert_eq!(destinations(&p, "n1", "client-0"), ["10.1.1.0/32 first", "10.1.1.1/32 first"]);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());

    // Priority ranks first: `second` takes the room, `first` waits.
    let mut urgent = spec("client", "b", 20);
    urgent.priority = 5;
    let (_, v) = link("t", "second", 2, urgent);
    p.upsert_link(second.clone(), v);
    p.recompute();
    assert_eq!(destinations(&p, "n1", "client-0"), ["10.1.2.0/32 second", "10.1.2.1/32 second"]);
    assert!(matches!(p.link_facts(&first).unwrap().refusal, Some(Refusal::TotalPairs { admitted: 6, .. })));
    assert_eq!(p.link_facts(&second).unwrap().refusal, None);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());

    // Room again: with `second` gone, `first` is planned.
    p.delete_link(&second);
    p.recompute();
    assert_eq!(p.link_facts(&first).unwrap().refusal, None);
    assert_eq!(destinations(&p, "n1", "client-1"), ["10.1.1.0/32 first", "10.1.1.1/32 first"]);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());

    // A source pod going makes room too: with two clients `wide` asks for 6 pairs, within its per-link limit,
    // and beside `first`'s 4 within the total of 10.
    p.delete_pod(&ObjectKey::new("t", "client-2"));
    p.recompute();
    assert_eq!(p.link_facts(&wide).unwrap().refusal, None);
    assert_eq!(destinations(&p, "n1", "client-0").len(), 5);
    assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
}

/// 5,000 pods across 50 namespaces and one link `{}` → `{}` with `namespaceSelector: {}`: refused whole, so no
/// node plan grows; the links of the other namespaces, on the same nodes, keep all their pairs.
#[test]
fn a_link_selecting_every_pod_of_the_cluster_is_refused_and_others_keep_theirs() {
    let mut p = Planner::new();
    for ns in 0..50 {
        let name = format!("ns-{ns}");
        p.upsert_namespace(name.clone(), labels(&[("kubernetes.io/metadata.name", &name)]));
        for i in 0..100u32 {
            let ip = format!("10.{}.{}.{}", 64 + ns / 50, (ns * 100 + i) / 250, (ns * 100 + i) % 250 + 1);
            let role = if i % 2 == 0 { "client" } else { "server" };
            let (k, v) = pod(&format!("ns-{ns}"), &format!("pod-{i}"), role, &format!("node-{}", i % 10), &[&ip]);
            p.upsert_pod(k, v);
        }
    }
    for ns in 1..50 {
        let (k, v) = link(&format!("ns-{ns}"), "wan", 1, spec("client", "server", 40));
        p.upsert_link(k, v);
    }
    let mut everything = spec("client", "server", 100);
    everything.from.pod_selector = selector(&[]);
    everything.to.pod_selector = Some(selector(&[]));
    everything.to.namespace_selector = Some(selector(&[]));
    let (all, v) = link("ns-0", "everything", 2, everything);
    p.upsert_link(all.clone(), v);
    p.recompute();

    let facts = p.link_facts(&all).unwrap();
    assert_eq!(facts.refusal, Some(Refusal::LinkDestinations { destinations: 5000, limit: 512 }));
    assert_eq!(condition(&p, &all, "Ready").1, "TooManyDestinations");
    for ns in 1..50 {
        let key = ObjectKey::new(format!("ns-{ns}"), "wan");
        let facts = p.link_facts(&key).unwrap();
        assert_eq!((facts.refusal, facts.pairs), (None, 50 * 50), "{key}");
        assert!(facts.exclusions.is_empty(), "{key}: {:?}", facts.exclusions);
    }
    assert!(p.node_plans().flat_map(|n| &n.pods).all(|x| x.namespace != "ns-0"));
}

/// The largest node plan the default limits allow on a node with the kubelet's default 110 pods, names and
/// addresses at their longest and every impairment field set, is far below what an agent reads.
#[test]
fn the_largest_node_plan_within_the_default_limits_fits_the_agent_many_times() {
    let per_pod = PlanLimits::DEFAULT.per_pod();
    let ns = "n".repeat(63);
    let mut p = Planner::new();
    for i in 0..110u32 {
        let name = format!("{i:0>253}");
        let ip = format!("fd00::1:{i:x}");
        let (k, mut v) = pod(&ns, &name, "client", "node", &[&format!("10.0.{}.{}", i / 250, i % 250 + 1), &ip]);
        v.uid = format!("{i:0>36}");
        p.upsert_pod(k, v);
    }
    // As many destinations as a pod may have, in links of at most the per-link limit each.
    let per_link = PlanLimits::DEFAULT.per_link();
    for i in 0..per_pod {
        let (k, v) = pod(
            &ns,
            &format!("server-{i}"),
            &format!("server-{}", i / per_link),
            "elsewhere",
            &[&format!("fd00:ffff:ffff:ffff:ffff:ffff:ffff:{:x}", 0xf000 + i)],
        );
        p.upsert_pod(k, v);
    }
    let mut s = spec("client", "server-0", 1);
    s.impairment = Some(
        serde_json::from_value(serde_json::json!({
            "latency": "3599.999999s", "jitter": "2.147483647s", "jitterCorrelation": "99.999999%",
            "loss": {"percent": "99.999999%", "correlation": "99.999999%"},
            "duplicate": {"percent": "99.999999%", "correlation": "99.999999%"},
            "corrupt": {"percent": "99.999999%", "correlation": "99.999999%"},
            "reorder": {"percent": "99.999999%", "correlation": "99.999999%", "gap": 4294967295u32},
            "bandwidth": "999999999999bit", "burst": "1023MiB", "queueLimit": 1000000,
        }))
        .expect("a full impairment"),
    );
    for l in 0..per_pod.div_ceil(per_link) {
        let mut s = s.clone();
        s.to.pod_selector = Some(selector(&[("app", &format!("server-{l}"))]));
        let name = format!("{l}{}", "l".repeat(252));
        let (k, v) = link(&ns, &name, 1, s);
        p.upsert_link(k, v);
    }
    p.recompute();
    for l in 0..per_pod.div_ceil(per_link) {
        let facts = p.link_facts(&ObjectKey::new(&ns, format!("{l}{}", "l".repeat(252)))).unwrap();
        assert_eq!((&facts.error, facts.refusal, facts.exclusions.len()), (&None, None, 0));
    }
    let plan = p.node_plan("node").expect("a plan");
    assert_eq!(plan.pods.len(), 110);
    assert!(plan.pods.iter().all(|x| x.destinations.len() == per_pod as usize));
    let bytes = serde_json::to_vec(plan).unwrap().len();
    let limit = isthmus_agent_api::MAX_PLAN_BYTES;
    println!("110 pods x {per_pod} destinations: {bytes} bytes of JSON; the agent reads up to {limit}");
    assert!(bytes * 8 < limit, "{bytes} bytes is more than an eighth of the agent's {limit}");
}

mod admission {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    const POOL: [&str; 6] =
        ["203.0.113.0/32", "203.0.113.1/32", "203.0.113.2/32", "198.51.100.0/24", "2001:db8::/64", "2001:db8::1/128"];

    /// One link: its destinations (indexes into `POOL`), priority and creation time.
    type LinkCase = (BTreeSet<usize>, i32, i64);

    fn cases() -> impl Strategy<Value = (Vec<LinkCase>, PlanLimits)> {
        let link = (prop::collection::btree_set(0..POOL.len(), 1..=POOL.len()), 0..3i32, 0..3i64);
        let limits = (1u32..=4, 0u32..=2).prop_map(|(l, more)| PlanLimits::new(l, l + more).unwrap());
        (prop::collection::vec(link, 1..6), limits)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// One source pod, links towards `cidrs`: its plan is exactly what admitting the links one by one in rank
        /// order gives (a link over the per-link limit refused whole, one that would take the pod over the per-pod
        /// limit refused for the pod), and each refusal is reported on its link.
        #[test]
        fn a_pods_destinations_are_its_links_admitted_in_rank_order((links, limits) in cases()) {
            let mut p = Planner::with_limits(limits);
            let (k, v) = pod("t", "client", "client", "n1", &["10.0.0.1"]);
            p.upsert_pod(k, v);
            for (i, (dests, priority, created)) in links.iter().enumerate() {
                let mut s = spec("client", "none", 1);
                s.to.pod_selector = None;
                s.to.cidrs = dests.iter().map(|d| POOL[*d].into()).collect();
                s.priority = *priority;
                let (k, v) = link("t", &format!("l{i}"), *created, s);
                p.upsert_link(k, v);
            }
            p.recompute();

            // The model: rank order is priority (high first), creation, name.
            let mut order: Vec<usize> = (0..links.len()).collect();
            order.sort_by_key(|&i| (std::cmp::Reverse(links[i].1), links[i].2, format!("l{i}")));
            let mut admitted: BTreeSet<usize> = BTreeSet::new();
            for i in order {
                let facts = p.link_facts(&ObjectKey::new("t", format!("l{i}"))).unwrap();
                let dests = &links[i].0;
                if dests.len() > limits.per_link() as usize {
                    prop_assert!(facts.refusal.is_some(), "l{} is over the per-link limit", i);
                    continue;
                }
                prop_assert!(facts.refusal.is_none());
                let with: BTreeSet<usize> = admitted.union(dests).copied().collect();
                let refused_here = facts.exclusions.iter().any(|e| e.reason == FailureReason::TooManyDestinations);
                if with.len() > limits.per_pod() as usize {
                    prop_assert!(refused_here, "l{} must be refused for the pod", i);
                } else {
                    prop_assert!(!refused_here, "l{} fits", i);
                    admitted = with;
                }
            }
            let planned: BTreeSet<String> = p
                .node_plan("n1")
                .map(|n| n.pods[0].destinations.iter().map(|d| d.destination.to_string()).collect())
                .unwrap_or_default();
            let expected: BTreeSet<String> = admitted.iter().map(|d| POOL[*d].to_owned()).collect();
            prop_assert_eq!(planned, expected);
            prop_assert_eq!(p.snapshot(), compute_with(p.index().clone(), limits).snapshot());
        }
    }
}
