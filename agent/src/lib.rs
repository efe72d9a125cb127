//! isthmus node agent: the tc datapath (pure tree building, diffing and netlink encoding, plus a thin I/O
//! shell), network-namespace resolution, and the service the operator calls.

pub mod auth;
pub mod ca_bundle;
pub mod csr;
pub mod datapath;
pub mod emulator;
pub mod explain;
pub mod measure;
pub mod metrics;
pub mod netns;
pub mod node;
pub mod server;
pub mod userspace;
