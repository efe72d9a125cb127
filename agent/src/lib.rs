//! isthmus node agent: the service the operator calls (mutual TLS), the node's plans applied on its datapath
//! (`isthmus-datapaths`: tc trees or the userspace loop), its links' self-measurement, metrics, and its serving
//! certificate.

pub mod auth;
pub mod ca_bundle;
pub mod csr;
pub mod explain;
pub mod measure;
pub mod metrics;
pub mod node;
pub mod probe_path;
pub mod server;
