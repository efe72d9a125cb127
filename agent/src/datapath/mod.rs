//! The tc datapath: per-destination impairment trees on one interface in one network namespace.
//!
//! Layers, from pure to I/O:
//! - [`model`]: typed kernel objects (qdiscs, classes, filters) exactly as they are installed and dumped, and the
//!   operations on them, each with its tc name.
//! - [`handles`]: disjoint handle ranges indexed by a destination's slot; slots stable across reconciles.
//! - [`tree`]: desired state (destinations → impairments) → the set of objects, with stable handles.
//! - [`diff`]: installed objects vs desired state → the minimal ordered list of operations (`plan`).
//! - `netlink`: model objects ⇄ rtnetlink messages (hand-encoded htb, tbf, netem), extended acks.
//! - `batch`: mutations packed many to a `sendmsg` (as `tc -batch` does), refusals matched by sequence number.
//! - `socket`: the netlink sockets, created inside the namespace (entered the one way `crate::netns` has).
//! - `reconcile`: the thin shell — dump, diff, send (`Datapath::reconcile`), or diff against the record of the
//!   last call and send (`Datapath::update`) — over those sockets.

mod batch;
pub mod diff;
pub mod error;
pub mod handles;
pub mod model;
pub mod netlink;
mod probe;
mod reconcile;
mod socket;
pub mod tree;

pub use error::{DatapathError, Place};
pub use probe::probe;
pub use reconcile::{Datapath, ReconcileReport};
pub use tree::DesiredState;
