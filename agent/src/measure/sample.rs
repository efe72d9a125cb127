//! Which (source pod, destination) pairs of each link direction this node probes. Pure.
//!
//! Only what the probes may and can reach: destinations that are single host addresses (a network is not a
//! pod), not among the plan's `unprobed` (Service ClusterIPs, `to.cidrs` networks: isthmus sends nothing outside
//! the cluster's pods), of links not in `unverified` (`spec.verify: false`). Of each link direction at most
//! `per_link` pairs, chosen by a stable hash of (pod uid, destination, link) so that the same pairs stay chosen
//! from one plan to the next (a plan that adds a pod moves at most the pairs the new pod wins), and spread over
//! the source pods: every pod with a candidate gets one pair before any pod gets a second.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{Direction, Impairment, LinkRef};

use crate::node::{Destination, ProbeFilter};

/// A source pod of the applied plan, as the sampler sees it.
#[derive(Debug, Clone, Copy)]
pub struct SourcePod<'a> {
    pub uid: &'a str,
    /// Sorted by destination, as the node keeps them.
    pub destinations: &'a [Destination],
}

/// One sampled pair: `pod` is the index of its source pod in the sampler's input.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub pod: usize,
    pub destination: IpAddr,
    pub link: Arc<LinkRef>,
    pub impairment: Arc<Impairment>,
}

/// The pairs to probe, grouped by link direction (links in order), at most `per_link` of each.
pub fn sample(pods: &[SourcePod<'_>], filter: &ProbeFilter, per_link: usize) -> Vec<Pair> {
    struct Candidate {
        rank_in_pod: usize,
        hash: u64,
        pair: Pair,
    }
    let mut by_link: BTreeMap<Arc<LinkRef>, Vec<Candidate>> = BTreeMap::new();
    for (index, pod) in pods.iter().enumerate() {
        let mut own: BTreeMap<&Arc<LinkRef>, Vec<(u64, Pair)>> = BTreeMap::new();
        for (destination, impairment, link) in pod.destinations {
            let Some(ip) = host_address(destination) else { continue };
            if filter.skips_address(ip) || filter.skips_link(link) {
                continue;
            }
            let pair = Pair { pod: index, destination: ip, link: link.clone(), impairment: impairment.clone() };
            own.entry(link).or_default().push((pair_hash(pod.uid, ip, link), pair));
        }
        for (link, mut candidates) in own {
            candidates.sort_by_key(|(hash, pair)| (*hash, pair.destination));
            let list = by_link.entry(link.clone()).or_default();
            list.extend(candidates.into_iter().enumerate().map(|(rank_in_pod, (hash, pair))| Candidate {
                rank_in_pod,
                hash,
                pair,
            }));
        }
    }
    let mut pairs = Vec::new();
    for (_, mut candidates) in by_link {
        // Ties in the hash (vanishingly rare) fall back to the input order, itself deterministic.
        candidates.sort_by_key(|c| (c.rank_in_pod, c.hash, c.pair.pod, c.pair.destination));
        pairs.extend(candidates.into_iter().take(per_link).map(|c| c.pair));
    }
    pairs
}

/// The address of a destination that is one host (`/32`, `/128`); `None` for a network.
fn host_address(destination: &IpNet) -> Option<IpAddr> {
    (destination.prefix_len() == destination.max_prefix_len()).then(|| destination.addr())
}

/// FNV-1a over the pair's identity: stable across runs, builds and Rust versions, unlike std's hasher.
fn pair_hash(uid: &str, ip: IpAddr, link: &LinkRef) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so that ("ab", "c") and ("a", "bc") differ.
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    };
    eat(uid.as_bytes());
    match ip {
        IpAddr::V4(v4) => eat(&v4.octets()),
        IpAddr::V6(v6) => eat(&v6.octets()),
    }
    eat(link.namespace.as_bytes());
    eat(link.name.as_bytes());
    eat(match link.direction {
        Direction::Forward => b"forward",
        Direction::Reverse => b"reverse",
    });
    hash
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use isthmus_agent_api::LinkId;
    use isthmus_agent_api::test_util::rate;
    use proptest::prelude::*;

    use super::*;

    fn link(name: &str, direction: Direction) -> Arc<LinkRef> {
        Arc::new(LinkRef { namespace: "ns".into(), name: name.into(), direction })
    }

    fn destinations(ips: &[&str], link: &Arc<LinkRef>) -> Vec<Destination> {
        let impairment = Arc::new(rate(1_000_000));
        let mut d: Vec<Destination> =
            ips.iter().map(|ip| (ip.parse::<IpNet>().unwrap(), impairment.clone(), link.clone())).collect();
        d.sort_by_key(|d| d.0);
        d
    }

    fn pods<'a>(uids: &'a [String], destinations: &'a [Vec<Destination>]) -> Vec<SourcePod<'a>> {
        uids.iter().zip(destinations).map(|(uid, d)| SourcePod { uid, destinations: d }).collect()
    }

    #[test]
    fn networks_unprobed_addresses_and_unverified_links_are_never_sampled() {
        let (wan, quiet) = (link("wan", Direction::Forward), link("quiet", Direction::Forward));
        let mut d = destinations(&["10.0.0.2/32", "10.0.1.0/24", "10.96.0.10/32", "fd00::2/128", "fd00::/64"], &wan);
        d.extend(destinations(&["10.0.0.9/32"], &quiet));
        d.sort_by_key(|d| d.0);
        let filter = ProbeFilter {
            unverified: vec![LinkId { namespace: "ns".into(), name: "quiet".into() }],
            unprobed: vec!["10.96.0.0/12".parse().unwrap()],
        };
        let uids = ["a".to_owned()];
        let picked = sample(&pods(&uids, std::slice::from_ref(&d)), &filter, 10);
        let ips: BTreeSet<String> = picked.iter().map(|p| p.destination.to_string()).collect();
        assert_eq!(ips, BTreeSet::from(["10.0.0.2".to_owned(), "fd00::2".to_owned()]));
        assert!(picked.iter().all(|p| p.link == wan));
        // Without the filter the unverified link and the ClusterIP are back.
        assert_eq!(sample(&pods(&uids, &[d]), &ProbeFilter::default(), 10).len(), 4);
    }

    #[test]
    fn each_pod_gets_a_pair_before_any_gets_a_second_and_directions_count_apart() {
        let (fwd, rev) = (link("wan", Direction::Forward), link("wan", Direction::Reverse));
        let uids: Vec<String> = (0..3).map(|i| format!("pod-{i}")).collect();
        let ips: Vec<String> = (1..=20).map(|i| format!("10.0.0.{i}/32")).collect();
        let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
        let mut all: Vec<Vec<Destination>> = uids.iter().map(|_| destinations(&ips, &fwd)).collect();
        all[0].extend(destinations(&["10.1.0.1/32", "10.1.0.2/32"], &rev));
        all[0].sort_by_key(|d| d.0);
        let picked = sample(&pods(&uids, &all), &ProbeFilter::default(), 4);
        let forward: Vec<&Pair> = picked.iter().filter(|p| p.link == fwd).collect();
        let reverse: Vec<&Pair> = picked.iter().filter(|p| p.link == rev).collect();
        assert_eq!((forward.len(), reverse.len()), (4, 2));
        let mut per_pod: HashMap<usize, usize> = HashMap::new();
        forward.iter().for_each(|p| *per_pod.entry(p.pod).or_default() += 1);
        let mut counts: Vec<usize> = per_pod.into_values().collect();
        counts.sort();
        assert_eq!(counts, [1, 1, 2], "4 pairs over 3 pods");
    }

    #[test]
    fn the_hash_is_the_same_in_every_build() {
        // A regression anchor: a change of the hash reshuffles every node's pairs on upgrade.
        let l = LinkRef { namespace: "ns".into(), name: "wan".into(), direction: Direction::Forward };
        assert_eq!(
            pair_hash("uid", "10.0.0.1".parse().unwrap(), &l),
            pair_hash("uid", "10.0.0.1".parse().unwrap(), &l)
        );
        assert_ne!(
            pair_hash("uid", "10.0.0.1".parse().unwrap(), &l),
            pair_hash("uid", "10.0.0.2".parse().unwrap(), &l)
        );
        assert_ne!(pair_hash("ab", "10.0.0.1".parse().unwrap(), &l), pair_hash("a", "10.0.0.1".parse().unwrap(), &l));
    }

    fn arbitrary_node() -> impl Strategy<Value = (Vec<String>, Vec<Vec<Destination>>)> {
        let links = [link("a", Direction::Forward), link("a", Direction::Reverse), link("b", Direction::Forward)];
        proptest::collection::vec(proptest::collection::btree_map((0u8..40, 8u8..=32), 0usize..3, 0..30), 1..8)
            .prop_map(move |per_pod| {
                let uids = (0..per_pod.len()).map(|i| format!("uid-{i}")).collect();
                let impairment = Arc::new(rate(1_000_000));
                let destinations = per_pod
                    .into_iter()
                    .map(|m| {
                        m.into_iter()
                            .map(|((host, prefix), l)| {
                                let net = IpNet::new(IpAddr::from([10, 0, 0, host]), prefix).unwrap();
                                (net, impairment.clone(), links[l].clone())
                            })
                            .collect()
                    })
                    .collect();
                (uids, destinations)
            })
    }

    proptest! {
        #[test]
        fn sampling_is_bounded_valid_deterministic_and_stable((uids, all) in arbitrary_node(), per_link in 1usize..6, drop in 0usize..8) {
            let input = pods(&uids, &all);
            let picked = sample(&input, &ProbeFilter::default(), per_link);
            prop_assert_eq!(&picked, &sample(&input, &ProbeFilter::default(), per_link), "deterministic");
            let mut per: HashMap<&LinkRef, Vec<&Pair>> = HashMap::new();
            for pair in &picked {
                per.entry(&pair.link).or_default().push(pair);
                // Every pair is a host destination the pod really has, with its own link.
                let d = &all[pair.pod];
                prop_assert!(d.iter().any(|(net, _, l)| net.prefix_len() == 32 && net.addr() == pair.destination && *l == pair.link));
            }
            for (link, pairs) in &per {
                let candidates: Vec<(usize, IpAddr)> = all.iter().enumerate().flat_map(|(i, d)| {
                    d.iter().filter(|(net, _, l)| net.prefix_len() == 32 && &**l == *link).map(move |(net, _, _)| (i, net.addr()))
                }).collect();
                prop_assert_eq!(pairs.len(), per_link.min(candidates.len()));
                // Spread: no pod has two pairs while a pod with a candidate has none.
                let pods_with: BTreeSet<usize> = candidates.iter().map(|c| c.0).collect();
                let chosen: BTreeSet<usize> = pairs.iter().map(|p| p.pod).collect();
                if chosen.len() < pairs.len() {
                    prop_assert_eq!(&chosen, &pods_with);
                }
            }
            // Stability: removing one pod only moves the pairs that pod held (plus the ones that replace them).
            if uids.len() > 1 {
                let gone = drop % uids.len();
                let mut fewer_uids = uids.clone();
                let mut fewer = all.clone();
                fewer_uids.remove(gone);
                fewer.remove(gone);
                let after = sample(&pods(&fewer_uids, &fewer), &ProbeFilter::default(), per_link);
                let key = |p: &Pair, uids: &[String]| (uids[p.pod].clone(), p.destination, p.link.clone());
                let after: BTreeSet<_> = after.iter().map(|p| key(p, &fewer_uids)).collect();
                for pair in picked.iter().filter(|p| p.pod != gone) {
                    let k = key(pair, &uids);
                    // A kept pod's pair can only fall out if its rank in its pod exceeds what is needed now,
                    // which removing a pod never causes.
                    prop_assert!(after.contains(&k), "{:?} lost when pod {} left", k, gone);
                }
            }
        }
    }
}
