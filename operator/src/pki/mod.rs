//! The operator as the isthmus certificate authority.
//!
//! - [`ca`]: the CA as data (generation, rotation, issuing); pure.
//! - [`handover`]: whether every agent has moved off the retired CAs (after the CA Secret was deleted); pure.
//! - [`names`]: the Service DNS names the operator is configured with, checked once.
//! - [`review`]: whether an agent's CertificateSigningRequest is approved; pure.
//! - [`store`]: the CA Secret, the bundle ConfigMap, the operator's in-memory client certificate and the metrics
//!   scraper's Secret.
//! - [`waiting`]: the requests waiting for the signer, by pod: only a pod's newest is signed; pure.
//! - [`signer`]: the controller that approves and signs agents' requests (signer `isthmus.dev/agent-serving`).
//!
//! Why the operator and not Helm: a CA made at render time (`genCA`) is written into every Helm release revision,
//! a Secret readable by anyone who can read the release; a CA the operator creates through the API lives in one
//! Secret only the operator may read. Why CSRs: an agent proves which node it runs on with its pod-bound
//! ServiceAccount token (the API server records the node and pod in the request), so each agent gets a
//! certificate for its own node and no other.

pub mod ca;
pub mod handover;
pub mod names;
pub mod review;
pub mod signer;
pub mod store;
pub mod waiting;
