//! The pure plan: from the [`Index`](crate::index::Index) to each node's
//! [`NodePlan`](isthmus_agent_api::NodePlan) and each link's status facts.
//!
//! Two stages, both deterministic functions of the index:
//! 1. per link, a [`Resolution`] (`selection.rs`): its source pods (with node, UID, IPs), its destinations per
//!    direction, the pods it must leave alone and why;
//! 2. per node, the plan (`winner.rs`): every source pod on the node with the winning (destination, impairment,
//!    link) of each pair, after the overlap rule (higher priority, then older, then name; forward before reverse
//!    within one link), plus per-link pair and overlap counts.
//!
//! [`Planner`] (`planner.rs`) keeps both stages cached. An event marks the links it can affect as stale
//! (`events.rs`); [`Planner::recompute`] re-resolves those links and recomputes only the nodes whose inputs
//! actually changed. The result is always identical to computing everything from scratch ([`compute`]), which
//! the property tests check. [`LinkFacts`] (`facts.rs`) is what a link's status is made of;
//! [`PairExplanation`] (`explain.rs`) is the contest behind one pair, for `kubectl isthmus explain`.

mod events;
mod explain;
mod facts;
mod limits;
mod planner;
mod selection;
mod traces;
mod verify;
mod winner;

pub use explain::{Claim, Defeat, EntryContest, ExplainError, PairExplanation};
pub use facts::{LinkFacts, Overlap};
pub use limits::{
    DEFAULT_DESTINATIONS_PER_LINK, DEFAULT_DESTINATIONS_PER_POD, DEFAULT_PAIRS_PER_LINK, DEFAULT_PAIRS_TOTAL,
    PlanLimits, PlanLimitsError, Refusal,
};
pub use planner::{Changes, Planner, compute, compute_with};
pub use selection::{EndpointMemo, Exclusion, Resolution, Side, Source, host_network, resolve_link};
pub use winner::{LinkStats, PodOutput, compute_pod};
