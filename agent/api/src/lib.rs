//! The vocabulary shared by the operator and the agent: a validated [`Impairment`] for one direction of a link,
//! and the per-node plan the operator sends to the agent with the agent's replies.
//!
//! Everything here is plain data with serde; nothing knows about Kubernetes selectors or tc handles.

#[cfg(feature = "client")]
pub mod client;
pub mod explain;
mod groups;
pub mod identity;
pub mod impairment;
pub mod measure;
#[cfg(feature = "metrics-auth")]
pub mod metrics_auth;
pub mod plan;
pub mod reply;
pub mod schedule;
#[cfg(feature = "test-util")]
pub mod test_util;
#[cfg(feature = "tls")]
pub mod tls;

pub use impairment::{
    Correlated, Impairment, ImpairmentError, ImpairmentFields, Loss, MAX_BUCKET_TIME, MAX_QUEUE_LIMIT_PACKETS, Percent,
    Reorder,
};
pub use plan::*;
pub use reply::*;

/// The wall clock in Unix milliseconds: the unit of the timelines (`schedule`) and of the measurements' windows,
/// read the same way by the operator, the agent and the tools.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
