//! Typed tc objects as isthmus installs them and as the kernel dumps them back.
//!
//! This is the common language of the tree builder, the diff and the netlink codec. Every field holds the value
//! in the unit the kernel reports in a dump, so `decode(encode(x)) == x` and a desired object compares equal to
//! the installed one without tolerance. Conversions from user units (bytes, percent, durations) to kernel units
//! happen once, in the tree builder.

use std::fmt;

/// A tc handle: 16-bit major, 16-bit minor (`major:minor` in iproute2's hex notation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(pub u32);

impl Handle {
    /// TC_H_ROOT: the parent of a root qdisc.
    pub const ROOT: Handle = Handle(0xFFFF_FFFF);
    /// TC_H_UNSPEC.
    pub const UNSPEC: Handle = Handle(0);

    pub const fn new(major: u16, minor: u16) -> Self {
        Handle(((major as u32) << 16) | minor as u32)
    }
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub const fn minor(self) -> u16 {
        self.0 as u16
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Handle::ROOT => f.write_str("root"),
            _ => write!(f, "{:x}:{:x}", self.major(), self.minor()),
        }
    }
}

/// Any tc object isthmus installs on an interface.
#[derive(Debug, Clone, PartialEq)]
pub enum TcObject {
    Qdisc(Qdisc),
    Class(Class),
    Filter(Filter),
}

impl TcObject {
    /// The object's kind as tc spells it (`htb`, `netem`, `u32`…), for messages and error classification.
    pub fn kind_name(&self) -> &str {
        match self {
            TcObject::Qdisc(q) => q.kind.name(),
            TcObject::Class(c) => c.kind.name(),
            TcObject::Filter(f) => f.kind.name(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Qdisc {
    pub handle: Handle,
    pub parent: Handle,
    pub kind: QdiscKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum QdiscKind {
    Htb(HtbQdisc),
    Tbf(Tbf),
    Netem(Netem),
    /// Any kind isthmus does not install (noqueue, fq_codel, a CNI's own root…), seen only in dumps.
    Foreign(String),
}

impl QdiscKind {
    /// `TCA_KIND`: the name tc and the kernel know the kind by.
    pub fn name(&self) -> &str {
        match self {
            QdiscKind::Htb(_) => "htb",
            QdiscKind::Tbf(_) => "tbf",
            QdiscKind::Netem(_) => "netem",
            QdiscKind::Foreign(kind) => kind,
        }
    }
}

/// `TCA_HTB_INIT` (`struct tc_htb_glob`), plus `TCA_HTB_DIRECT_QLEN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtbQdisc {
    /// Minor of the class that takes unclassified packets.
    pub default_class: u32,
    pub rate2quantum: u32,
    pub direct_qlen: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Class {
    pub handle: Handle,
    pub parent: Handle,
    pub kind: ClassKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ClassKind {
    Htb(HtbClass),
    Foreign(String),
}

impl ClassKind {
    /// `TCA_KIND` of the class's qdisc.
    pub fn name(&self) -> &str {
        match self {
            ClassKind::Htb(_) => "htb",
            ClassKind::Foreign(kind) => kind,
        }
    }
}

/// An HTB class (`struct tc_htb_opt` + RATE64/CEIL64). Rates in bytes per second; buffers in psched ticks as
/// the kernel dumps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HtbClass {
    pub rate_bytes_per_sec: u64,
    pub ceil_bytes_per_sec: u64,
    pub buffer_ticks: u32,
    pub cbuffer_ticks: u32,
    pub quantum: u32,
    pub prio: u32,
}

/// TBF (`TCA_TBF_PARMS` + RATE64). Rate in bytes per second; the bucket as psched ticks at that rate (the
/// kernel converts `TCA_TBF_BURST` bytes to this and dumps only ticks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tbf {
    pub rate_bytes_per_sec: u64,
    pub buffer_ticks: u32,
    /// Byte limit of TBF's own fifo; ignored by the kernel once netem is TBF's child, still reported.
    pub limit_bytes: u32,
    /// A second bucket of one packet at a higher rate: what caps TBF's largest packet (`max_size`) at a frame
    /// while the main bucket is deeper, so that TBF segments GSO packets before its child queues them.
    pub peak: Option<TbfPeak>,
}

/// TBF's peak rate and its bucket (`mtu`), as psched ticks at the peak rate; the kernel dumps only ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfPeak {
    pub rate_bytes_per_sec: u64,
    pub mtu_ticks: u32,
}

/// netem. Probabilities on the kernel's u32 scale (u32::MAX = 100 %); delays in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Netem {
    pub latency_ns: i64,
    pub jitter_ns: i64,
    pub limit_packets: u32,
    pub gap: u32,
    pub duplicate: u32,
    pub delay_correlation: u32,
    pub loss: NetemLoss,
    pub duplicate_correlation: u32,
    pub reorder: u32,
    pub reorder_correlation: u32,
    pub corrupt: u32,
    pub corrupt_correlation: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NetemLoss {
    #[default]
    None,
    /// qopt.loss + CORR.loss_corr.
    Random { probability: u32, correlation: u32 },
    /// `TCA_NETEM_LOSS` / `NETEM_LOSS_GE` (`struct tc_netem_gemodel {p, r, h, k1}`).
    GilbertElliott { p: u32, r: u32, h: u32, k1: u32 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    /// The qdisc or class the filter is attached to.
    pub parent: Handle,
    pub priority: u16,
    /// Ethernet protocol in host byte order (ETH_P_IP, ETH_P_IPV6, ETH_P_ALL); the codec converts.
    pub protocol: u16,
    pub kind: FilterKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FilterKind {
    U32(U32Filter),
    Foreign(String),
}

impl FilterKind {
    /// `TCA_KIND` of the classifier.
    pub fn name(&self) -> &str {
        match self {
            FilterKind::U32(_) => "u32",
            FilterKind::Foreign(kind) => kind,
        }
    }
}

/// A u32 filter node. The same kernel kind serves three roles: a hash table (`divisor` set), a link from one
/// table into another (`link` + a hashing selector), and a matching entry (`selector` + `class_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct U32Filter {
    /// `htid:hash:node` (12:8:12 bits).
    pub handle: u32,
    pub divisor: Option<u32>,
    pub link: Option<u32>,
    /// TCA_U32_HASH: the table (and bucket) the node is inserted into.
    pub hash_table: Option<u32>,
    pub selector: Option<U32Selector>,
    pub class_id: Option<Handle>,
}

/// `struct tc_u32_sel` with its keys. Values and masks in host order; offsets in bytes from the network header.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct U32Selector {
    pub terminal: bool,
    pub hash_mask: u32,
    pub hash_offset: i16,
    pub keys: Vec<U32Key>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct U32Key {
    pub mask: u32,
    pub value: u32,
    pub offset: i32,
}

pub const ETH_P_ALL: u16 = 0x0003;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;

/// One mutation of the installed tree, as the diff emits it and the netlink shell sends it.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    /// Create an object that does not exist (NLM_F_CREATE | NLM_F_EXCL).
    Add(TcObject),
    /// Change an existing object's parameters in place, keeping its handle and its children.
    Change(TcObject),
    /// Remove an object (and, for qdiscs and classes, everything below it).
    Delete(TcObject),
}

impl Operation {
    /// The object added, changed or deleted.
    pub fn object(&self) -> &TcObject {
        match self {
            Operation::Add(o) | Operation::Change(o) | Operation::Delete(o) => o,
        }
    }
}

/// As tc would say it, for error messages: "add qdisc netem 3000: parent 2000:1".
impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self {
            Operation::Add(_) => "add",
            Operation::Change(_) => "change",
            Operation::Delete(_) => "delete",
        };
        match self.object() {
            TcObject::Qdisc(q) => write!(f, "{verb} qdisc {} {} parent {}", q.kind.name(), q.handle, q.parent),
            TcObject::Class(c) => write!(f, "{verb} class {} parent {}", c.handle, c.parent),
            TcObject::Filter(filter) => {
                write!(f, "{verb} filter u32 ")?;
                match &filter.kind {
                    FilterKind::U32(u) => write!(f, "{:x}", u.handle)?,
                    FilterKind::Foreign(kind) => f.write_str(kind)?,
                }
                write!(f, " prio {} protocol {:#06x} parent {}", filter.priority, filter.protocol, filter.parent)
            }
        }
    }
}
