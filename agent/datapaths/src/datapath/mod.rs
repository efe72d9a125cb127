//! The tc datapath: per-destination impairment trees on one interface in one network namespace.
//!
//! Layers, from pure to I/O:
//! - [`model`]: typed kernel objects (qdiscs, classes, filters) exactly as they are installed and dumped, and the
//!   operations on them, each with its tc name.
//! - [`handles`]: disjoint handle ranges indexed by a destination's slot; slots stable across reconciles.
//! - [`tree`]: desired state (destinations → impairments, checked: `desired`) → the set of objects, with stable
//!   handles; [`units`]: an impairment in the kernel's units (TBF, netem) and back; [`psched`]: the kernel's tick
//!   arithmetic, which the userspace emulator's token bucket follows too; [`queue`]: the byte budgets every queue
//!   is held to.
//! - [`installed`]: what of a dump is isthmus's (whose root, which objects, which destination in which slot).
//! - [`diff`]: installed objects vs desired state → the minimal ordered list of operations (`operations`); checked
//!   in its tests against `sim_kernel`, an in-memory model of the kernel's tc rules (tests only).
//! - `netlink`: model objects ⇄ rtnetlink messages (hand-encoded htb, tbf, netem), extended acks.
//! - `batch`: mutations packed many to a `sendmsg` (as `tc -batch` does), refusals matched by sequence number.
//! - `reconcile`: the thin shell — dump, diff, send (`Datapath::reconcile`), or diff against the record of the
//!   last call and send (`Datapath::update`) — over the namespace's netlink sockets (`crate::netns::socket`);
//!   `read`: the views of a dump (`observe`, `installed`); [`explain`]: one destination address's path through
//!   the tree, for `isthmus-agent explain`.

mod batch;
mod desired;
pub mod diff;
pub mod error;
pub mod explain;
pub mod handles;
pub mod installed;
pub mod model;
pub mod netlink;
mod probe;
pub mod psched;
pub mod queue;
mod read;
mod reconcile;
#[cfg(test)]
mod sim_kernel;
pub mod tree;
pub mod units;

pub use desired::{DesiredState, check_representable};
pub use error::{DatapathError, Place};
pub use probe::probe;
pub use queue::{QueueBound, QueueBudget, QueueBudgetError};
pub use reconcile::{Datapath, ReconcileReport};
