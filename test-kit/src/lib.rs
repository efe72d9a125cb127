//! What isthmus's tests, benchmarks and measuring tools share, each defined once. Never a dependency of the
//! product (the operator, the agent and its API crate): only of tests, benchmarks, the stock-kernel rig and
//! the probe. std only, so that the statically linked probe stays small.
//!
//! - [`stats`]: order statistics of a sample by one rank convention, **nearest rank**: the q-quantile of n
//!   samples is the ⌈n·q⌉-th smallest (the smallest when n·q < 1), always an observed value, so the median of
//!   an even count is the lower of the two middle samples. Every table of medians and percentiles in the
//!   repository uses it, and it is the rank the agent's `RttHistogram::quantile` picks;
//! - [`bursts`]: loss bursts, the runs of consecutive lost sequence numbers;
//! - [`netns`]: throwaway network namespaces joined by a veth pair, built with iproute2 and removed on drop;
//! - [`proc`]: a process's memory from `/proc/<pid>/status`;
//! - [`openmetrics`]: samples read out of a `/metrics` text.

pub mod bursts;
pub mod netns;
pub mod openmetrics;
pub mod proc;
pub mod stats;
