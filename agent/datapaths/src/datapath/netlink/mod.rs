//! The tc netlink codec: [`model`](super::model) objects ⇄ rtnetlink messages. Pure functions, no I/O.
//!
//! # Public API (contract with the reconcile shell)
//! - [`encode`]`(&Operation, ifindex) -> Result<NetlinkMessage<RouteNetlinkMessage>, EncodeError>`: one request,
//!   finalized (length and type set); the sender sets sequence number and port. Flags:
//!   - `Add`: `NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL` (`tc … add`).
//!   - `Change`: `NLM_F_REQUEST | NLM_F_ACK` — `tc … change`. For a qdisc whose handle exists at that parent the
//!     kernel (`tc_modify_qdisc`) calls the qdisc's `change` in place, keeping its children; without CREATE a
//!     missing object is ENOENT instead of being created behind the diff's back. In-place change works for
//!     tbf, netem, htb classes and the classid/link of u32 key nodes, not for an htb qdisc nor a u32 selector:
//!     see [`changes_in_place`].
//!   - `Delete`: `NLM_F_REQUEST | NLM_F_ACK`, RTM_DEL*; a qdisc or class by parent + handle, a filter by parent,
//!     priority, protocol, handle and kind (a u32 table can only go once no link points at it).
//!   - Filters: `tcm_info = prio << 16 | htons(protocol)`.
//!   - `Err` only for values the kernel would silently alter (so a dump would never equal the model) and for
//!     `Foreign` kinds, which isthmus never creates (deleting them is fine).
//! - [`decode_qdisc`], [`decode_class`] (object + [`Counters`]), [`decode_filter`], [`ifindex`]: from dumped
//!   `TcMessage`s (and from requests, which is how the golden tests read iproute2's). Unknown kinds decode to
//!   `Foreign(kind)`; a known kind with settings the model cannot express is [`DecodeError::Unsupported`] naming
//!   the attribute, never a silently lossy object.
//! - [`KernelError`]: errno + extack text of a refused request. On a socket set up with
//!   `crate::netns::socket::enable_extended_ack` (EXT_ACK + CAP_ACK), rtnetlink's `Error::NetlinkError(e)`
//!   parses with `KernelError::from_error_message(&e, true)`; a whole reply with `KernelError::from_netlink_message`.
//! - [`changes_in_place`]: whether `Change` can turn one object into another, or the diff must delete + add.
//!
//! Round-trip invariant: for every object `x` the encoder accepts, decoding what the kernel dumps after
//! installing `encode(Add(x))` yields `x` exactly (checked against this kernel for htb, tbf and u32, and against
//! netem dumps of stock 6.1 and 7.2 kernels), provided `x` is stated the way the kernel reports it:
//! - a top-level HTB class has `parent: Handle::ROOT` (`htb_dump_class`);
//! - a u32 key node has `hash_table: Some(table | bucket)` and `handle == table | bucket | node`; nodes sent
//!   without a table land in their priority's generated root table, which the kernel numbers `800:`, `801:`, …
//!   in the order priorities are created.
//!
//! Dumps also hold objects nobody sent: TBF's internal class (`<tbf major>:1`, `Foreign("tbf")`), and per u32
//! priority one entry with handle 0 (no options) and its generated root table (`divisor: Some(1)`).
//! Per-kind rules are in [`htb`], [`tbf`], [`netem`], [`u32`](mod@u32).

mod attrs;
pub mod extack;
#[cfg(test)]
mod golden;
pub mod htb;
#[cfg(test)]
mod live;
pub mod netem;
mod stats;
pub mod tbf;
#[cfg(test)]
mod tests;
pub mod u32;

use isthmus_agent_api::Counters;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};

pub use self::extack::KernelError;
use super::model::{Class, ClassKind, Filter, FilterKind, Handle, Operation, Qdisc, QdiscKind, TcObject};

/// `TCA_OPTIONS`, sent as a raw attribute for the kinds netlink-packet-route does not model.
const TCA_OPTIONS: u16 = 2;
const TC_LINKLAYER_ETHERNET: u8 = 1;

/// A dumped (or requested) tc object the codec cannot turn into a model object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{object}: {field} has {got} bytes, expected {expected}")]
    Length { object: &'static str, field: &'static str, expected: usize, got: usize },
    #[error("{object}: {field} is missing")]
    Missing { object: &'static str, field: &'static str },
    #[error("{object}: malformed attributes: {detail}")]
    Malformed { object: &'static str, detail: String },
    #[error("{object}: {field} ({detail}) is set, which isthmus does not model")]
    Unsupported { object: &'static str, field: &'static str, detail: String },
}

/// An operation the codec refuses to encode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error(
        "cannot create or change a foreign {object} of kind {kind:?}: isthmus installs only htb, tbf, netem and u32"
    )]
    Foreign { object: &'static str, kind: String },
    #[error("{object}: {field} = {value}: {reason}")]
    OutOfRange { object: &'static str, field: &'static str, value: String, reason: &'static str },
}

impl EncodeError {
    fn out_of_range(object: &'static str, field: &'static str, value: impl ToString, reason: &'static str) -> Self {
        EncodeError::OutOfRange { object, field, value: value.to_string(), reason }
    }
}

/// `struct tc_ratespec` for an Ethernet-link-layer rate (no overhead, mpu or rate table), saturated to u32 as
/// the kernel wants when the 64-bit attribute carries the rate.
fn ratespec(rate_bytes_per_sec: u64) -> [u8; 12] {
    let mut spec = [0u8; 12];
    spec[1] = TC_LINKLAYER_ETHERNET;
    let rate = u32::try_from(rate_bytes_per_sec).unwrap_or(u32::MAX);
    spec[8..12].copy_from_slice(&rate.to_ne_bytes());
    spec
}

fn ratespec_rate(spec: &[u8]) -> u64 {
    u64::from(attrs::u32_at(spec, 8))
}

/// The interface a dumped tc message belongs to.
pub fn ifindex(message: &TcMessage) -> u32 {
    message.header.index as u32
}

/// Whether `Operation::Change` can turn the installed object `from` into `to` in place (same handle, parent and
/// kind, and the kernel honours every differing field on change). When false, the diff must delete and re-add.
pub fn changes_in_place(from: &TcObject, to: &TcObject) -> bool {
    match (from, to) {
        (TcObject::Qdisc(a), TcObject::Qdisc(b)) => {
            a.handle == b.handle
                && a.parent == b.parent
                && matches!(
                    (&a.kind, &b.kind),
                    (QdiscKind::Tbf(_), QdiscKind::Tbf(_)) | (QdiscKind::Netem(_), QdiscKind::Netem(_))
                )
        }
        (TcObject::Class(a), TcObject::Class(b)) => {
            a.handle == b.handle
                && a.parent == b.parent
                && matches!((&a.kind, &b.kind), (ClassKind::Htb(_), ClassKind::Htb(_)))
        }
        (TcObject::Filter(a), TcObject::Filter(b)) => match (&a.kind, &b.kind) {
            (FilterKind::U32(x), FilterKind::U32(y)) => {
                a.parent == b.parent
                    && a.priority == b.priority
                    && a.protocol == b.protocol
                    && x.handle == y.handle
                    && x.divisor.is_none()
                    && y.divisor.is_none()
                    && x.hash_table == y.hash_table
                    && x.selector == y.selector
            }
            _ => false,
        },
        _ => false,
    }
}

/// One rtnetlink request for `operation` on interface `ifindex`. See the module documentation for flags.
pub fn encode(operation: &Operation, ifindex: u32) -> Result<NetlinkMessage<RouteNetlinkMessage>, EncodeError> {
    const CREATE: u16 = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    const CHANGE: u16 = NLM_F_REQUEST | NLM_F_ACK;
    const DELETE: u16 = NLM_F_REQUEST | NLM_F_ACK;
    let (flags, inner) = match operation {
        Operation::Add(object) => (CREATE, new_message(object, ifindex)?),
        Operation::Change(object) => (CHANGE, new_message(object, ifindex)?),
        Operation::Delete(object) => (DELETE, delete_message(object, ifindex)),
    };
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
    message.finalize();
    Ok(message)
}

fn tc_header(ifindex: u32, handle: u32, parent: Handle) -> TcMessage {
    let mut message = TcMessage::with_index(ifindex as i32);
    message.header.handle = TcHandle::from(handle);
    message.header.parent = TcHandle::from(parent.0);
    message
}

fn filter_header(ifindex: u32, filter: &Filter, handle: u32) -> TcMessage {
    let mut message = tc_header(ifindex, handle, filter.parent);
    // TC_H_MAKE(prio << 16, htons(protocol)): the protocol is big-endian in the low 16 bits.
    message.header.info = (u32::from(filter.priority) << 16) | u32::from(filter.protocol.to_be());
    message
}

fn raw_options(kind: &str, options: Vec<u8>) -> Vec<TcAttribute> {
    vec![
        TcAttribute::Kind(kind.to_string()),
        TcAttribute::Other(netlink_packet_core::DefaultNla::new(TCA_OPTIONS, options)),
    ]
}

fn new_message(object: &TcObject, ifindex: u32) -> Result<RouteNetlinkMessage, EncodeError> {
    Ok(match object {
        TcObject::Qdisc(qdisc) => {
            let mut message = tc_header(ifindex, qdisc.handle.0, qdisc.parent);
            message.attributes = match &qdisc.kind {
                QdiscKind::Htb(htb) => raw_options(qdisc.kind.name(), htb::encode_qdisc(htb)?),
                QdiscKind::Tbf(tbf) => raw_options(qdisc.kind.name(), tbf::encode(tbf)?),
                QdiscKind::Netem(netem) => raw_options(qdisc.kind.name(), netem::encode(netem)?),
                QdiscKind::Foreign(kind) => {
                    return Err(EncodeError::Foreign { object: "qdisc", kind: kind.clone() });
                }
            };
            RouteNetlinkMessage::NewQueueDiscipline(message)
        }
        TcObject::Class(class) => {
            let mut message = tc_header(ifindex, class.handle.0, class.parent);
            message.attributes = match &class.kind {
                ClassKind::Htb(htb) => raw_options(class.kind.name(), htb::encode_class(htb)?),
                ClassKind::Foreign(kind) => {
                    return Err(EncodeError::Foreign { object: "class", kind: kind.clone() });
                }
            };
            RouteNetlinkMessage::NewTrafficClass(message)
        }
        TcObject::Filter(filter) => {
            let FilterKind::U32(u32_filter) = &filter.kind else {
                let FilterKind::Foreign(kind) = &filter.kind else { unreachable!() };
                return Err(EncodeError::Foreign { object: "filter", kind: kind.clone() });
            };
            let mut message = filter_header(ifindex, filter, u32_filter.handle);
            message.attributes = vec![
                TcAttribute::Kind(filter.kind.name().to_owned()),
                TcAttribute::Options(u32::encode(u32_filter).into_iter().map(TcOption::U32).collect()),
            ];
            RouteNetlinkMessage::NewTrafficFilter(message)
        }
    })
}

fn delete_message(object: &TcObject, ifindex: u32) -> RouteNetlinkMessage {
    match object {
        TcObject::Qdisc(qdisc) => {
            RouteNetlinkMessage::DelQueueDiscipline(tc_header(ifindex, qdisc.handle.0, qdisc.parent))
        }
        TcObject::Class(class) => {
            RouteNetlinkMessage::DelTrafficClass(tc_header(ifindex, class.handle.0, class.parent))
        }
        TcObject::Filter(filter) => {
            let handle = match &filter.kind {
                FilterKind::U32(u) => u.handle,
                // A foreign filter's handle is not in the model: handle 0 deletes its whole priority.
                FilterKind::Foreign(_) => 0,
            };
            let mut message = filter_header(ifindex, filter, handle);
            message.attributes = vec![TcAttribute::Kind(filter.kind.name().to_owned())];
            RouteNetlinkMessage::DelTrafficFilter(message)
        }
    }
}

fn kind_of(message: &TcMessage) -> Option<&str> {
    message.attributes.iter().find_map(|a| match a {
        TcAttribute::Kind(kind) => Some(kind.as_str()),
        _ => None,
    })
}

/// The raw TCA_OPTIONS payload of a kind netlink-packet-route does not model (it parses it into a single
/// `TcOption::Other` holding the whole payload; a request built by [`encode`] holds it as `TcAttribute::Other`).
fn raw_options_of(message: &TcMessage) -> Option<Vec<u8>> {
    message.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(options) => match options.as_slice() {
            [TcOption::Other(nla)] => Some(attrs::default_nla_value(nla)),
            _ => None,
        },
        TcAttribute::Other(nla) if netlink_packet_core::Nla::kind(nla) == TCA_OPTIONS => {
            Some(attrs::default_nla_value(nla))
        }
        _ => None,
    })
}

fn required_options(message: &TcMessage, object: &'static str) -> Result<Vec<u8>, DecodeError> {
    raw_options_of(message).ok_or(DecodeError::Missing { object, field: "TCA_OPTIONS" })
}

/// A dumped qdisc and its counters.
pub fn decode_qdisc(message: &TcMessage) -> Result<(Qdisc, Counters), DecodeError> {
    let kind = match kind_of(message) {
        Some("htb") => QdiscKind::Htb(htb::decode_qdisc(&required_options(message, "htb qdisc")?)?),
        Some("tbf") => QdiscKind::Tbf(tbf::decode(&required_options(message, "tbf")?)?),
        Some("netem") => QdiscKind::Netem(netem::decode(&required_options(message, "netem")?)?),
        Some(other) => QdiscKind::Foreign(other.to_string()),
        None => {
            return Err(DecodeError::Missing { object: "qdisc", field: "TCA_KIND" });
        }
    };
    let qdisc =
        Qdisc { handle: Handle(message.header.handle.into()), parent: Handle(message.header.parent.into()), kind };
    Ok((qdisc, stats::counters(&message.attributes)))
}

/// A dumped class and its counters.
pub fn decode_class(message: &TcMessage) -> Result<(Class, Counters), DecodeError> {
    let kind = match kind_of(message) {
        Some("htb") => ClassKind::Htb(htb::decode_class(&required_options(message, "htb class")?)?),
        Some(other) => ClassKind::Foreign(other.to_string()),
        None => {
            return Err(DecodeError::Missing { object: "class", field: "TCA_KIND" });
        }
    };
    let class =
        Class { handle: Handle(message.header.handle.into()), parent: Handle(message.header.parent.into()), kind };
    Ok((class, stats::counters(&message.attributes)))
}

/// A dumped filter.
pub fn decode_filter(message: &TcMessage) -> Result<Filter, DecodeError> {
    let info = message.header.info;
    let handle: u32 = message.header.handle.into();
    let kind = match kind_of(message) {
        Some("u32") => {
            let options: Vec<_> = message
                .attributes
                .iter()
                .filter_map(|a| match a {
                    TcAttribute::Options(options) => Some(options),
                    _ => None,
                })
                .flatten()
                .map(|option| match option {
                    TcOption::U32(u) => Ok(u.clone()),
                    _ => Err(DecodeError::Malformed { object: "u32 filter", detail: format!("option {option:?}") }),
                })
                .collect::<Result<_, _>>()?;
            FilterKind::U32(u32::decode(handle, &options)?)
        }
        Some(other) => FilterKind::Foreign(other.to_string()),
        None => {
            return Err(DecodeError::Missing { object: "filter", field: "TCA_KIND" });
        }
    };
    Ok(Filter {
        parent: Handle(message.header.parent.into()),
        priority: (info >> 16) as u16,
        protocol: u16::from_be(info as u16),
        kind,
    })
}
