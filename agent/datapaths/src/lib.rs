//! isthmus's datapaths, apart from the agent that serves them: the tc datapath ([`datapath`]: pure tree
//! building, diffing and netlink encoding, plus a thin I/O shell), the userspace datapath ([`userspace`]: a
//! capture per pod and one loop running the [`emulator`]'s pure impairment pipeline), and the network
//! namespaces both work in ([`netns`]: identity, the one way in, finding a pod's, sockets opened inside one).
//!
//! Layers, each importing only those before it: `netns` → `datapath` → `emulator` → `userspace`. Nothing here
//! knows Kubernetes, the agent's API server or its node logic; the crate's `layers` test keeps it that way.

pub mod datapath;
pub mod emulator;
pub mod netns;
pub mod userspace;
