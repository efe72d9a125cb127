//! What `isthmus-agent explain` prints (one JSON object on stdout) and `kubectl isthmus explain` reads: what is
//! installed in one pod's network namespace for one destination address, read back from the kernel.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{Counters, Impairment};

/// How the pod's egress towards the address is impaired, as found in its namespace (not as planned).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum InstalledPath {
    /// An isthmus tc tree is on the interface and one of its entries matches the address.
    Tc {
        /// The matching entry's destination network (the longest prefix that holds the address).
        destination: IpNet,
        /// What its TBF and netem implement, read back in the kernel's units; `None` when they do not read
        /// back as a valid impairment.
        impairment: Option<Box<Impairment>>,
        /// The filter, the class and its qdiscs, in the order a packet meets them.
        objects: Vec<KernelObject>,
    },
    /// An isthmus tc tree is on the interface, but no entry matches the address: the catch-all filter sends
    /// it to the default class, unimpaired.
    TcDefault { objects: Vec<KernelObject> },
    /// The userspace datapath's capture interface is in the namespace: impaired destinations are routed to the
    /// agent's emulator, whose counters are the agent's metrics (no kernel qdisc holds them).
    Userspace { capture_interface: String },
    /// Another root qdisc is on the interface (a CNI's own, for example); isthmus never replaces it.
    Foreign { root_kind: String },
    /// Nothing of isthmus's is in the namespace.
    None,
}

/// One qdisc, class or filter, as `tc` would list it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelObject {
    /// `u32 filter`, `htb class`, `tbf qdisc`, `netem qdisc`, …
    pub kind: String,
    /// `1570:12`, or for a filter its priority and u32 handle (`pref 1 800::1`).
    pub handle: String,
    pub parent: String,
    /// Its parameters in tc's words, e.g. `rate 10Mbit`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Counters where the kernel keeps them (qdiscs and classes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExplainReport {
    /// The pod's network namespace, as /proc shows it (`net:[4026532512]`).
    pub netns: String,
    pub interface: String,
    pub path: InstalledPath,
}
