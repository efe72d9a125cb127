//! Why one (source pod, destination address) pair gets the impairment it gets: every link that claims a plan
//! entry covering the address, who wins each entry and why the others lose. It runs the planner's own contest
//! (`winner.rs`: admission within the per-pod limit, then [`Candidate::beats`]) on the cached resolutions, so it
//! explains exactly the plan the operator sends, for `kubectl isthmus explain`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{Direction, Impairment};

use super::limits::Refusal;
use super::planner::Planner;
use super::winner::{Candidate, candidates};
use crate::index::{ObjectKey, Rank};

/// One link's claim on a plan entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub link: ObjectKey,
    pub direction: Direction,
    pub rank: Rank,
    pub impairment: Arc<Impairment>,
}

/// Why a claim lost its entry to the winner: the first element of the overlap order where they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defeat {
    /// The winner's priority is higher.
    Priority { winner: i32, loser: i32 },
    /// Same priority; the winner is older (a link without a creation time counts as the youngest).
    Younger,
    /// Same priority and creation time; the winner's name sorts first.
    Name,
    /// The same link's other direction: forward wins within one link.
    Direction,
}

/// One plan entry (a destination network) covering the address, with its contest.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryContest {
    pub destination: IpNet,
    pub winner: Claim,
    /// In the overlap order, best first.
    pub losers: Vec<(Claim, Defeat)>,
}

/// The whole answer for one pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PairExplanation {
    /// The node whose plan holds the source pod.
    pub node: String,
    /// Entries covering the address, longest prefix first: the kernel's filters (and the userspace datapath's
    /// routes) match the longest prefix, so the first entry decides and the others are shadowed.
    pub entries: Vec<EntryContest>,
    /// Links left out for this pod by the per-pod destination limit; whether they would have covered the
    /// address is not known, since their claims are never admitted.
    pub refused: Vec<(ObjectKey, Refusal)>,
}

impl PairExplanation {
    /// The entry that decides the pair.
    pub fn decisive(&self) -> &EntryContest {
        &self.entries[0]
    }
}

/// Why no explanation exists.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("no NetworkLink shapes the egress of pod {0}: none selects it as a source, or it is not running")]
    NotASource(ObjectKey),
    #[error("no NetworkLink decides the pair {pod} → {destination}: the pod's links do not cover that address")]
    NotCovered { pod: ObjectKey, destination: IpAddr },
}

impl Planner {
    /// Explains the pair (pod → `destination`) from the cached resolutions, as [`Planner::recompute`] left them.
    pub fn explain_pair(&self, pod: &ObjectKey, destination: IpAddr) -> Result<PairExplanation, ExplainError> {
        if !self.pod_links.contains_key(pod) {
            return Err(ExplainError::NotASource(pod.clone()));
        }
        let mut stats = BTreeMap::new();
        let (source, contest) = candidates(pod, self.admitted_links(pod), self.limits.per_pod(), &mut stats);
        let source = source.ok_or_else(|| ExplainError::NotASource(pod.clone()))?;
        let mut entries: Vec<EntryContest> =
            contest.entries().filter(|run| run[0].0.contains(&destination)).map(entry).collect();
        if entries.is_empty() {
            return Err(ExplainError::NotCovered { pod: pod.clone(), destination });
        }
        entries.sort_by_key(|e| std::cmp::Reverse(e.destination.prefix_len()));
        let refused = stats.into_iter().filter_map(|(link, s)| Some((link, s.refused?))).collect();
        Ok(PairExplanation { node: source.node.clone(), entries, refused })
    }
}

/// One destination's claims, as `Contest::entries` gives them.
fn entry(run: &[(IpNet, Candidate<'_>)]) -> EntryContest {
    let destination = run[0].0;
    let mut all: Vec<Candidate<'_>> = run.iter().map(|(_, c)| *c).collect();
    // `beats` is the planner's order; sorting by it puts the winner `compute_pod` picks first.
    all.sort_by(|a, b| {
        if a.beats(b) {
            std::cmp::Ordering::Less
        } else if b.beats(a) {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    });
    let claim = |c: &Candidate<'_>| Claim {
        link: c.link.clone(),
        direction: c.link_ref.direction,
        rank: c.rank.clone(),
        impairment: c.impairment.clone(),
    };
    let winner = &all[0];
    let losers = all[1..].iter().map(|c| (claim(c), defeat(winner, c))).collect();
    EntryContest { destination, winner: claim(winner), losers }
}

/// The first element of the order `beats` compares where winner and loser differ.
fn defeat(winner: &Candidate<'_>, loser: &Candidate<'_>) -> Defeat {
    let (w, l) = (winner.rank.sort_key(), loser.rank.sort_key());
    if w.0 != l.0 {
        Defeat::Priority { winner: winner.rank.priority, loser: loser.rank.priority }
    } else if (w.1, w.2) != (l.1, l.2) {
        Defeat::Younger
    } else if w.3 != l.3 {
        Defeat::Name
    } else {
        Defeat::Direction
    }
}
