//! The operator's validating admission webhook for NetworkTopologies: a topology is admitted exactly when the
//! operator can expand it into its NetworkLinks, so that what the API server stores is what the operator
//! realises. How a topology's layers combine per ordered pair of regions (up to 32 × 32 pairs over up to 1,024
//! links) is past what a CEL rule can evaluate within its cost budget, so the webhook runs the expansion itself.
//!
//! - [`review`]: the pure decision, an AdmissionReview in, its answer out;
//! - [`server`]: the HTTPS listener the API server calls (every replica serves; the decision needs no state);
//! - [`upkeep`]: the serving certificate, issued from the operator's CA and renewed, and the CA bundle the API
//!   server trusts it with, written into the ValidatingWebhookConfiguration by the leader.

pub mod review;
pub mod server;
pub mod upkeep;

/// The path of the NetworkTopology webhook (the chart's `clientConfig.service.path`).
pub const TOPOLOGIES_PATH: &str = "/validate/networktopologies";
