//! `kubectl isthmus`: what each NetworkLink asks for against what it measured (`links`), and which link decides
//! a (pod, destination) pair, why, and what the node installed for it (`explain`); a NetworkTopology's round trips
//! between its regions (`matrix`).
//!
//! Everything it answers from Kubernetes objects goes through `isthmus-operator`'s own index and planner, so the
//! plugin cannot disagree with the operator. The modules that render are pure and tested with golden text.

pub mod cluster;
pub mod explain;
pub mod impairment;
pub mod links;
pub mod matrix;
pub mod table;
pub mod target;
