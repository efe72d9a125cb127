//! Conformance: what a link's probes measured against what its configuration predicts. Pure; the controller
//! polls the agents (`controller/measure.rs`) and writes the verdicts into `status.measured` and the
//! `Conformant` condition.
//!
//! - `merge.rs`: the nodes' windows of one link direction merged (histograms add exactly), stale ones left out;
//! - `expect.rs`: the expected RTT and loss of a round trip, the RTT tolerance and the loss's Wilson interval;
//! - `judge.rs`: one direction's verdict, the link's condition and the MEASURED column;
//! - `phase.rs`: which phase of a link that changes with time a window was probed in, and so what it is judged
//!   against;

pub mod expect;
pub mod judge;
pub mod merge;
pub mod phase;

pub use expect::RoundTrip;
pub use judge::{Judged, Verdict, judge, overall, summary, unjudged_scheduled};
pub use merge::{Merged, merge};
pub use phase::{Leg, phase_path};
