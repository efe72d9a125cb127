//! The overlap rule: where several links give one source pod the same destination, one of them wins the pair —
//! higher priority, then older, then name; forward before reverse within one link — and every link involved
//! counts the pairs it won and lost. Before the contest, the pod's links are admitted in the same rank order
//! while the pod's destinations stay within the per-pod limit (limits.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{DestinationPlan, Impairment, LinkRef, PodPlan, default_interface};

use super::limits::Refusal;
use super::selection::{Resolution, Source};
use crate::index::{ObjectKey, Rank};

/// A link's pair and overlap counts for one source pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkStats {
    /// Pairs this link wins.
    pub pairs: u32,
    /// Other link → (pairs won against it, pairs lost to it).
    pub overlaps: BTreeMap<ObjectKey, (u32, u32)>,
    /// Set when the link is left out for this pod.
    pub refused: Option<Refusal>,
}

/// One source pod's plan and the per-link counts behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodOutput {
    pub node: String,
    pub plan: PodPlan,
    pub link_stats: BTreeMap<ObjectKey, LinkStats>,
}

#[derive(Clone, Copy)]
pub(super) struct Candidate<'a> {
    pub(super) link: &'a ObjectKey,
    pub(super) rank: &'a Rank,
    pub(super) impairment: &'a Arc<Impairment>,
    pub(super) link_ref: &'a Arc<LinkRef>,
}

impl Candidate<'_> {
    pub(super) fn beats(&self, other: &Candidate<'_>) -> bool {
        (self.rank.sort_key(), self.link_ref.direction) < (other.rank.sort_key(), other.link_ref.direction)
    }
}

/// Every admitted claim on the pod's destinations, sorted by destination; one destination's claims in the order
/// seen (the links in rank order, forward before reverse within one). A sorted vector rather than a map: a pod
/// has a hundred or more destinations and usually one link, whose sides' destinations are sorted already.
pub(super) struct Contest<'a> {
    claims: Vec<(IpNet, Candidate<'a>)>,
}

impl<'a> Contest<'a> {
    /// Each destination's claims, the first seen first; never an empty run.
    pub(super) fn entries(&self) -> impl Iterator<Item = &[(IpNet, Candidate<'a>)]> {
        self.claims.chunk_by(|a, b| a.0 == b.0)
    }

    fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// Computes one source pod's plan from the resolutions of the links that list it as a source, with at most
/// `per_pod` destinations; `None` when it has no destination.
pub fn compute_pod<'a>(
    pod: &ObjectKey,
    links: impl Iterator<Item = (&'a ObjectKey, &'a Resolution)>,
    per_pod: u32,
) -> Option<PodOutput> {
    let mut link_stats: BTreeMap<ObjectKey, LinkStats> = BTreeMap::new();
    let (source, contest) = candidates(pod, links, per_pod, &mut link_stats);
    let source = source?;
    if contest.is_empty() {
        // A refusal needs an admitted link with more destinations than the refused one can add: never empty.
        debug_assert!(link_stats.is_empty(), "refusals without an admitted link: {link_stats:?}");
        return None;
    }
    let mut destinations = Vec::with_capacity(contest.claims.len());
    // Pairs won, per link: a pod has a few links and a hundred or more pairs, so they are tallied here, by the
    // key's address (two tallies of one link add up the same), and added to the link's counts once.
    let mut won: Vec<(&ObjectKey, u32)> = Vec::new();
    for run in contest.entries() {
        let (dest, first) = &run[0];
        let winner = run[1..].iter().fold(first, |best, (_, c)| if c.beats(best) { c } else { best });
        match won.iter_mut().find(|(link, _)| std::ptr::eq(*link, winner.link)) {
            Some((_, pairs)) => *pairs += 1,
            None => won.push((winner.link, 1)),
        }
        if run.len() > 1 {
            count_overlaps(&mut link_stats, winner.link, run);
        }
        destinations.push(DestinationPlan {
            destination: *dest,
            impairment: winner.impairment.clone(),
            link: winner.link_ref.clone(),
        });
    }
    for (link, pairs) in won {
        link_stats_of(&mut link_stats, link).pairs += pairs;
    }
    Some(PodOutput {
        node: source.node.clone(),
        plan: PodPlan {
            uid: source.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            ips: source.ips.clone(),
            interface: default_interface(),
            host_network: false,
            destinations,
        },
        link_stats,
    })
}

/// The pod as a source (from the first link that lists it) and each admitted link's claim on each of its
/// destinations. Links are admitted in rank order while the pod's distinct destinations stay within `per_pod`;
/// each link left out gets its refusal in `stats`.
pub(super) fn candidates<'a>(
    pod: &ObjectKey,
    links: impl Iterator<Item = (&'a ObjectKey, &'a Resolution)>,
    per_pod: u32,
    stats: &mut BTreeMap<ObjectKey, LinkStats>,
) -> (Option<&'a Source>, Contest<'a>) {
    let mut links: Vec<(&ObjectKey, &Resolution)> = links.collect();
    links.sort_by(|(ka, a), (kb, b)| (a.rank.sort_key(), *ka).cmp(&(b.rank.sort_key(), *kb)));
    let mut source: Option<&Source> = None;
    let mut claims: Vec<(IpNet, Candidate<'a>)> = Vec::new();
    let mut admitted = Admitted::default();
    for (link, res) in links {
        let start = claims.len();
        for (_, side) in res.sides() {
            let Some(src) = side.source(pod) else { continue };
            source.get_or_insert(src);
            let cand = Candidate { link, rank: &res.rank, impairment: &side.impairment, link_ref: &side.link };
            // Traffic to the pod's own address never leaves it.
            let own = |dest: &&IpNet| dest.prefix_len() == dest.max_prefix_len() && src.ips.contains(&dest.addr());
            claims.reserve(side.destinations.len());
            claims.extend(side.destinations.iter().filter(|d| !own(d)).map(|dest| (*dest, cand)));
        }
        // Stable: a destination's claims keep the order seen (forward before reverse).
        sort_by_destination(&mut claims[start..]);
        let (before, new) = claims.split_at(start);
        if let Err(destinations) = admitted.admit(before, new, per_pod as usize) {
            let refusal = Refusal::PodDestinations { destinations: destinations as u32, limit: per_pod };
            link_stats_of(stats, link).refused = Some(refusal);
            claims.truncate(start);
        }
    }
    // Each link's claims are sorted; stable, so each destination's keep the links' rank order.
    sort_by_destination(&mut claims);
    (source, Contest { claims })
}

/// The distinct destinations of the links admitted so far, counted as cheaply as the per-pod limit allows: while
/// the sum of each link's distinct destinations fits, the sum decides (links with disjoint destinations, as a
/// topology's regions are, never need more); from the first link for which it does not, the exact sorted set is
/// kept. Merging each link into the set cost a pod of a 20-region topology a sort per link.
#[derive(Default)]
struct Admitted {
    /// At least the number of distinct destinations admitted; read only until `distinct` is kept.
    bound: usize,
    distinct: Option<Vec<IpNet>>,
}

impl Admitted {
    /// Admits the claims `new` (sorted by destination) after `before` (those admitted so far) when the distinct
    /// destinations stay within `per_pod`; otherwise leaves the count as it was and returns what it would be.
    fn admit(
        &mut self,
        before: &[(IpNet, Candidate<'_>)],
        new: &[(IpNet, Candidate<'_>)],
        per_pod: usize,
    ) -> Result<(), usize> {
        let count = new.chunk_by(|a, b| a.0 == b.0).count();
        if self.distinct.is_none() && self.bound + count <= per_pod {
            self.bound += count;
            return Ok(());
        }
        let distinct = self.distinct.get_or_insert_with(|| {
            let mut all: Vec<IpNet> = before.iter().map(|(dest, _)| *dest).collect();
            all.sort_unstable();
            all.dedup();
            all
        });
        let mut union = Vec::with_capacity(distinct.len() + new.len());
        union.extend(distinct.iter().copied().chain(new.iter().map(|(dest, _)| *dest)));
        // Two sorted runs: the stable sort merges them in linear time.
        union.sort();
        union.dedup();
        if union.len() > per_pod {
            return Err(union.len());
        }
        *distinct = union;
        Ok(())
    }
}

/// A stable sort by destination that leaves sorted claims (a side's destinations are sorted) alone at the cost of
/// one comparison each: the sort itself would take a scratch buffer first.
fn sort_by_destination(claims: &mut [(IpNet, Candidate<'_>)]) {
    if !claims.is_sorted_by_key(|(dest, _)| *dest) {
        claims.sort_by_key(|(dest, _)| *dest);
    }
}

/// Counts the overlap between a pair's winner and each link that lost the pair to it.
fn count_overlaps(stats: &mut BTreeMap<ObjectKey, LinkStats>, winner: &ObjectKey, run: &[(IpNet, Candidate<'_>)]) {
    let losers: BTreeSet<&ObjectKey> = run.iter().map(|(_, c)| c.link).filter(|l| *l != winner).collect();
    for loser in losers {
        link_stats_of(stats, winner).overlaps.entry(loser.clone()).or_default().0 += 1;
        link_stats_of(stats, loser).overlaps.entry(winner.clone()).or_default().1 += 1;
    }
}

/// The link's counts, made when it has none yet; its key (two strings) is cloned only then.
fn link_stats_of<'s>(stats: &'s mut BTreeMap<ObjectKey, LinkStats>, link: &ObjectKey) -> &'s mut LinkStats {
    if !stats.contains_key(link) {
        stats.insert(link.clone(), LinkStats::default());
    }
    stats.get_mut(link).expect("inserted above")
}

#[cfg(test)]
#[path = "winner_tests.rs"]
mod tests;
