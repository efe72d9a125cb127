//! The operator's admission webhooks. The validating one for NetworkTopologies: a topology is admitted exactly
//! when the operator can expand it into its NetworkLinks, so that what the API server stores is what the operator
//! realises. How a topology's layers combine per ordered pair of regions (up to 32 × 32 pairs over up to 1,024
//! links) is past what a CEL rule can evaluate within its cost budget, so the webhook runs the expansion itself.
//! The mutating one for pods that opt into the hold: their first init container waits for their links.
//!
//! - [`review`]: the topology's pure decision, an AdmissionReview in, its answer out;
//! - [`hold`]: the pod's pure decision, the held pod as a JSON patch;
//! - [`links_applied`]: what the held pod's init container is told, from a watch of the held pods;
//! - [`server`]: the HTTPS listener the API server and the held pods call (every replica serves);
//! - [`upkeep`]: the serving certificate, issued from the operator's CA and renewed, and the CA bundle the API
//!   server trusts it with, written into the webhook configurations by the leader.

pub mod hold;
pub mod hold_flags;
pub mod links_applied;
pub mod review;
pub mod server;
pub mod upkeep;

/// The path of the pod webhook that holds opted-in pods ([`hold`]).
pub const HOLD_PATH: &str = "/mutate/pods";
/// The path the held pod's init container asks whether its links are applied.
pub const LINKS_APPLIED_PATH: &str = "/v1/links-applied";
/// The path of the NetworkTopology webhook (the chart's `clientConfig.service.path`).
pub const TOPOLOGIES_PATH: &str = "/validate/networktopologies";
