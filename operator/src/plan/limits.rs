//! How large the plan may grow: destinations per link and per pod, pairs per link and in all. Pure.
//!
//! Why: a link whose selectors match every pod of every namespace asks for `pods × destinations` pairs, which
//! the operator would hold in memory and send to every node. The limits bound what one link can ask for and
//! what one pod's interface can carry, so that one tenant's link cannot exhaust the operator or a node's
//! agent, and every node plan stays far below the agent's body limit (docs/networklink.md#plan-limits):
//! - a link selecting more destinations (both directions together) than `per_link` is refused whole: nothing is
//!   planned for it and its status says `TooManyDestinations`;
//! - a pod's links are admitted in rank order (the overlap rule's) while the pod's distinct destinations stay
//!   within `per_pod`; a link that would take the pod beyond it is refused for that pod only, and the pod is a
//!   `TooManyDestinations` failure in that link's status. Links already in place keep their pairs when a
//!   lower-ranked link arrives.
//!
//! - a link whose sources times destinations (both directions, before overlaps) exceed `pairs_per_link` is
//!   refused whole (`TooManyPairs`): a link's destinations are bounded, its sources are not, and a few links
//!   over many pods would otherwise plan millions of pairs, which the operator holds in memory (and with it the
//!   signer and every finalizer);
//! - links are admitted in rank order while the pairs of all admitted links stay within `pairs_total`; a link
//!   beyond it is refused whole (`TooManyPairs`) until room is made. The links already in force keep theirs
//!   when a lower-ranked link arrives; a higher-ranked one that arrives takes its room first.
//!
//! `per_pod ≥ per_link` so that a pod's highest-ranked link always fits, and `pairs_total ≥ pairs_per_link` so
//! that the highest-ranked link does.

use isthmus_agent_api::MAX_DESTINATIONS_PER_INTERFACE;

use crate::failure::FailureReason;

/// Default most destinations of one link (both directions together).
pub const DEFAULT_DESTINATIONS_PER_LINK: u32 = 512;
/// Default most destinations of one pod (all its links together).
pub const DEFAULT_DESTINATIONS_PER_POD: u32 = 1024;
/// Default most pairs of one link: 1,000 source pods at the per-link destination limit.
pub const DEFAULT_PAIRS_PER_LINK: u32 = 512_000;
/// Default most pairs of all links together: twice a 20-region topology of 50 pods per region, and well within
/// the operator's default memory limit (docs/networklink.md#plan-limits has the bytes per pair).
pub const DEFAULT_PAIRS_TOTAL: u32 = 2_000_000;

/// The plan's size limits, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    per_link: u32,
    per_pod: u32,
    pairs_per_link: u32,
    pairs_total: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanLimitsError {
    #[error("destinations per link: 0 would refuse every link")]
    ZeroPerLink,
    #[error(
        "destinations per pod: {per_pod} is beyond the {MAX_DESTINATIONS_PER_INTERFACE} destinations an agent can \
         install on one interface"
    )]
    PerPodBeyondAgent { per_pod: u32 },
    #[error(
        "destinations per pod: {per_pod} is less than destinations per link ({per_link}): a pod's highest-ranked \
         link must always fit"
    )]
    PerPodBelowPerLink { per_pod: u32, per_link: u32 },
    #[error("pairs per link: 0 would refuse every link with a pair")]
    ZeroPairsPerLink,
    #[error(
        "pairs in total: {pairs_total} is less than pairs per link ({pairs_per_link}): the highest-ranked link must \
         always fit"
    )]
    TotalBelowPerLink { pairs_total: u32, pairs_per_link: u32 },
}

impl Default for PlanLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl PlanLimits {
    pub const DEFAULT: PlanLimits = PlanLimits {
        per_link: DEFAULT_DESTINATIONS_PER_LINK,
        per_pod: DEFAULT_DESTINATIONS_PER_POD,
        pairs_per_link: DEFAULT_PAIRS_PER_LINK,
        pairs_total: DEFAULT_PAIRS_TOTAL,
    };

    /// Destination limits, with the default pair limits.
    pub fn new(per_link: u32, per_pod: u32) -> Result<Self, PlanLimitsError> {
        if per_link == 0 {
            return Err(PlanLimitsError::ZeroPerLink);
        }
        if per_pod as usize > MAX_DESTINATIONS_PER_INTERFACE {
            return Err(PlanLimitsError::PerPodBeyondAgent { per_pod });
        }
        if per_pod < per_link {
            return Err(PlanLimitsError::PerPodBelowPerLink { per_pod, per_link });
        }
        Ok(Self { per_link, per_pod, ..Self::DEFAULT })
    }

    /// These limits with other pair limits.
    pub fn with_pairs(self, pairs_per_link: u32, pairs_total: u32) -> Result<Self, PlanLimitsError> {
        if pairs_per_link == 0 {
            return Err(PlanLimitsError::ZeroPairsPerLink);
        }
        if pairs_total < pairs_per_link {
            return Err(PlanLimitsError::TotalBelowPerLink { pairs_total, pairs_per_link });
        }
        Ok(Self { pairs_per_link, pairs_total, ..self })
    }

    pub fn pairs_per_link(&self) -> u32 {
        self.pairs_per_link
    }

    pub fn pairs_total(&self) -> u32 {
        self.pairs_total
    }

    pub fn per_link(&self) -> u32 {
        self.per_link
    }

    pub fn per_pod(&self) -> u32 {
        self.per_pod
    }
}

/// Why a link, or a link for one pod, is left out of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// The link selects `destinations` (both directions together), more than `limit` per link.
    LinkDestinations { destinations: u32, limit: u32 },
    /// With this link the pod would have `destinations`, more than `limit` per pod.
    PodDestinations { destinations: u32, limit: u32 },
    /// The link asks for `pairs` (sources × destinations, both directions), more than `limit` per link; it
    /// selects `destinations`.
    LinkPairs { pairs: u64, destinations: u32, limit: u32 },
    /// The link's `pairs` would take the links admitted before it (higher-ranked), holding `admitted`, beyond
    /// `limit` in total; it selects `destinations`.
    TotalPairs { pairs: u64, admitted: u64, destinations: u32, limit: u32 },
}

impl Refusal {
    /// The reason the link's status gives.
    pub fn reason(&self) -> FailureReason {
        match self {
            Refusal::LinkDestinations { .. } | Refusal::PodDestinations { .. } => FailureReason::TooManyDestinations,
            Refusal::LinkPairs { .. } | Refusal::TotalPairs { .. } => FailureReason::TooManyPairs,
        }
    }

    /// The destinations a link refused whole selects.
    pub fn destinations(&self) -> Option<u32> {
        match *self {
            Refusal::LinkDestinations { destinations, .. }
            | Refusal::LinkPairs { destinations, .. }
            | Refusal::TotalPairs { destinations, .. } => Some(destinations),
            Refusal::PodDestinations { .. } => None,
        }
    }

    /// The status message, naming the limit and the chart value that sets it.
    pub fn message(&self) -> String {
        match *self {
            Refusal::LinkDestinations { destinations, limit } => format!(
                "the link selects {destinations} destinations, more than the limit of {limit} per link \
                 (operator.limits.destinationsPerLink); nothing is applied for it"
            ),
            Refusal::PodDestinations { destinations, limit } => format!(
                "with this link the pod would have {destinations} destinations, more than the limit of {limit} per \
                 pod (operator.limits.destinationsPerPod); its higher-ranked links keep theirs, this one is left out"
            ),
            Refusal::LinkPairs { pairs, limit, .. } => format!(
                "the link asks for {pairs} pairs (source pods × destinations), more than the limit of {limit} per \
                 link (operator.limits.pairsPerLink); nothing is applied for it"
            ),
            Refusal::TotalPairs { pairs, admitted, limit, .. } => format!(
                "the link's {pairs} pairs would take the cluster's to {}, beyond the limit of {limit} in all \
                 (operator.limits.pairsTotal; {admitted} are taken by links that rank before it); nothing is \
                 applied for it until there is room",
                admitted + pairs
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        assert_eq!(PlanLimits::new(512, 1024), Ok(PlanLimits::DEFAULT));
        assert_eq!(PlanLimits::new(0, 10), Err(PlanLimitsError::ZeroPerLink));
        assert_eq!(PlanLimits::new(10, 9), Err(PlanLimitsError::PerPodBelowPerLink { per_pod: 9, per_link: 10 }));
        let beyond = MAX_DESTINATIONS_PER_INTERFACE as u32 + 1;
        let err = PlanLimits::new(10, beyond).unwrap_err();
        assert!(err.to_string().contains("destinations per pod") && err.to_string().contains("4095"), "{err}");
        assert!(PlanLimits::new(4095, 4095).is_ok());
        let limits = PlanLimits::DEFAULT;
        assert_eq!(limits.with_pairs(0, 10), Err(PlanLimitsError::ZeroPairsPerLink));
        assert_eq!(
            limits.with_pairs(10, 9),
            Err(PlanLimitsError::TotalBelowPerLink { pairs_total: 9, pairs_per_link: 10 })
        );
        let pairs = limits.with_pairs(10, 10).unwrap();
        assert_eq!((pairs.pairs_per_link(), pairs.pairs_total(), pairs.per_link()), (10, 10, 512));
    }

    #[test]
    fn messages_name_the_limit_and_its_value() {
        let link = Refusal::LinkDestinations { destinations: 5000, limit: 1000 }.message();
        assert!(link.contains("5000") && link.contains("1000") && link.contains("destinationsPerLink"), "{link}");
        let pod = Refusal::PodDestinations { destinations: 1001, limit: 1000 }.message();
        assert!(pod.contains("1001") && pod.contains("destinationsPerPod"), "{pod}");
        let pairs = Refusal::LinkPairs { pairs: 200_000, destinations: 400, limit: 100_000 };
        assert!(pairs.message().contains("200000") && pairs.message().contains("pairsPerLink"), "{}", pairs.message());
        assert_eq!(pairs.reason(), FailureReason::TooManyPairs);
        let total = Refusal::TotalPairs { pairs: 10, admitted: 95, destinations: 2, limit: 100 };
        let text = total.message();
        assert!(text.contains("105") && text.contains("95") && text.contains("pairsTotal"), "{text}");
    }
}
