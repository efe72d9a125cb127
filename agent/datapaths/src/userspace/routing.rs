//! Where the capture's routes live in a pod's namespace, and what they ask of its reverse-path filter.
//!
//! The routes go in a table of isthmus's own, [`TABLE`], which one rule (IPv4 and IPv6) looks up before `main`.
//! The pod's own routes, the CNI's, are never touched, whatever the destinations (`0.0.0.0/0` included), and
//! the capture takes its destinations even where `main` holds a longer prefix. Once the capture's pair is
//! removed, the kernel flushes every route through it: the table is empty and the pod routes as before. The
//! packets the loop sends back out are bound to the pod's interface, and a route through the capture never
//! matches a lookup bound to another interface, so they fall through to `main`.
//!
//! Strict reverse-path filtering (`rp_filter` 1, set on RHEL-family and hardened nodes and inherited by every new
//! namespace) would drop every reply from a captured destination: it arrives on the pod's interface while the
//! route back to its source goes through the capture. While a capture is in place its interface is set to loose
//! (2) and set back when the capture goes. The rule is what outlives an agent that died without removing it (it
//! then looks up an empty table), so its preference records what was changed, for the next agent to set back:
//! [`RpFilter::preference`].

use futures::TryStreamExt;
use netlink_packet_core::{DefaultNla, NLA_F_NESTED};
use netlink_packet_route::link::{AfSpecInet, AfSpecUnspec, LinkAttribute, LinkMessage};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::{Handle, IpVersion};

use super::capture::CaptureError;
use crate::netns::Netns;

/// The routing table of the capture's routes in every pod's namespace ("is").
pub const TABLE: u32 = 0x6973;

/// The preference of the rule when the reverse-path filter was left alone; [`RpFilter::preference`].
const PREFERENCE: u32 = 32000;

/// What the capture changed in the pod interface's `rp_filter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpFilter {
    /// Not strict (or no IPv4 on the interface): left alone.
    Untouched,
    /// Strict: the interface was set to loose; `was` is its own value before (0 or 1, `all` making it strict).
    Loosened { was: u8 },
}

impl RpFilter {
    /// The rule's preference, which records the change: 32000 untouched, 32001 loosened from 0, 32002 from 1.
    pub fn preference(self) -> u32 {
        match self {
            RpFilter::Untouched => PREFERENCE,
            RpFilter::Loosened { was } => PREFERENCE + 1 + u32::from(was.min(1)),
        }
    }

    /// The change a rule of this preference records; `None` for a rule that is not the capture's.
    pub fn from_preference(preference: u32) -> Option<RpFilter> {
        match preference.checked_sub(PREFERENCE)? {
            0 => Some(RpFilter::Untouched),
            d @ (1 | 2) => Some(RpFilter::Loosened { was: (d - 1) as u8 }),
            _ => None,
        }
    }

    /// What to do to an interface whose `rp_filter` reads `own`, under `conf/all` reading `all` (the kernel
    /// filters by the larger), given what an earlier capture recorded (`earlier`): a change already made stands
    /// (the interface reads 2 now, and only the record knows what it was).
    pub fn decide(all: u8, own: u8, earlier: Option<RpFilter>) -> RpFilter {
        match earlier {
            Some(loosened @ RpFilter::Loosened { .. }) => loosened,
            _ if all.max(own) == 1 => RpFilter::Loosened { was: own },
            _ => RpFilter::Untouched,
        }
    }
}

/// The `rp_filter` of one IPv4 interface, or of `all`, as `/proc/sys` reads it in the calling thread's namespace
/// (a container's `/proc/sys` is read-only: it is only read, and set through rtnetlink, [`set_rp_filter`]).
fn read_rp_filter(key: &str) -> std::io::Result<u8> {
    let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{key}/rp_filter"))?;
    text.trim().parse().map_err(|_| std::io::Error::other(format!("rp_filter of {key} reads {text:?}")))
}

/// `IFLA_INET_CONF` in `IFLA_AF_SPEC`'s `AF_INET` entry, and its `IPV4_DEVCONF_RP_FILTER` (linux/ip.h).
const IFLA_INET_CONF: u16 = 1;
const IPV4_DEVCONF_RP_FILTER: u16 = 8;

/// The `AF_INET` part of an `RTM_SETLINK` that sets only `rp_filter`: one attribute in `IFLA_INET_CONF`, the
/// kernel's per-interface IPv4 settings (the crate's request form leaves out zero values, so it cannot set 0).
fn rp_filter_attribute(value: u8) -> LinkAttribute {
    let mut conf = Vec::with_capacity(8);
    conf.extend_from_slice(&8u16.to_ne_bytes());
    conf.extend_from_slice(&IPV4_DEVCONF_RP_FILTER.to_ne_bytes());
    conf.extend_from_slice(&u32::from(value).to_ne_bytes());
    let inet = AfSpecInet::Other(DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, conf));
    LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![inet])])
}

/// Sets the IPv4 `rp_filter` of interface `index` in the pod's namespace.
async fn set_rp_filter(pod: &Handle, index: u32, value: u8) -> Result<(), rtnetlink::Error> {
    let mut message = LinkMessage::default();
    message.header.index = index;
    message.attributes.push(rp_filter_attribute(value));
    pod.link().set(message).execute().await
}

fn system(action: &'static str) -> impl FnOnce(std::io::Error) -> CaptureError {
    move |source| CaptureError::System { action, source }
}

fn netlink(action: &'static str) -> impl FnOnce(rtnetlink::Error) -> CaptureError {
    move |source| CaptureError::Netlink { action, source }
}

/// The capture's rules in the pod's namespace: (family, preference, the rule).
async fn rules(pod: &Handle) -> Result<Vec<RuleMessage>, CaptureError> {
    let mut ours = Vec::new();
    for version in [IpVersion::V4, IpVersion::V6] {
        let all: Vec<RuleMessage> = match pod.rule().get(version).execute().try_collect().await {
            Ok(all) => all,
            // A namespace without IPv6.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::EAFNOSUPPORT => continue,
            Err(e) => return Err(netlink("list the pod's routing rules")(e)),
        };
        ours.extend(all.into_iter().filter(|r| r.attributes.contains(&RuleAttribute::Table(TABLE))));
    }
    Ok(ours)
}

fn preference(rule: &RuleMessage) -> Option<u32> {
    rule.attributes.iter().find_map(|a| if let RuleAttribute::Priority(p) = a { Some(*p) } else { None })
}

/// Sends the pod's lookups to [`TABLE`] first and makes its interface's reverse-path filter let the captured
/// destinations' replies in. Returns what it changed, and the index of the interface to set back.
pub async fn enter(pod: &Handle, pod_ns: &Netns, interface: &str) -> Result<(RpFilter, Option<u32>), CaptureError> {
    let existing = rules(pod).await?;
    let earlier = existing.iter().filter_map(preference).filter_map(RpFilter::from_preference).max_by_key(|r| {
        // A loosened record wins over an untouched one: it is the one that knows the original value.
        r.preference()
    });
    let name = interface.to_owned();
    let read = pod_ns
        .run_inside(move || -> std::io::Result<Option<(u8, u8, u32)>> {
            let own = match read_rp_filter(&name) {
                Ok(own) => own,
                // The interface has no IPv4: nothing to filter.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            let c_name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
            // SAFETY: a NUL-terminated name; the call only reads it.
            let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
            if index == 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Some((read_rp_filter("all")?, own, index)))
        })
        .await
        .map_err(system("enter the pod's namespace"))?
        .map_err(system("read the pod interface's rp_filter"))?;
    let (change, loosened) = match read {
        None => (RpFilter::Untouched, None),
        Some((all, own, index)) => {
            let change = RpFilter::decide(all, own, earlier);
            if matches!(change, RpFilter::Loosened { .. }) && own != 2 {
                set_rp_filter(pod, index, 2).await.map_err(netlink("set the pod interface's rp_filter to loose"))?;
            }
            (change, Some(index))
        }
    };
    for stale in existing.into_iter().filter(|r| preference(r) != Some(change.preference())) {
        delete(pod, stale).await?;
    }
    for version in [IpVersion::V4, IpVersion::V6] {
        let add = pod.rule().add().table_id(TABLE).priority(change.preference()).action(RuleAction::ToTable);
        let added = match version {
            IpVersion::V4 => add.v4().execute().await,
            IpVersion::V6 => add.v6().execute().await,
        };
        match added {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e))
                if e.raw_code() == -libc::EEXIST
                    || (e.raw_code() == -libc::EAFNOSUPPORT && version == IpVersion::V6) => {}
            Err(e) => return Err(netlink("add the capture's routing rule")(e)),
        }
    }
    Ok((change, loosened))
}

/// Undoes [`enter`] once the capture's pair (and with it every route in [`TABLE`]) is gone: the rules go, and
/// the interface's `rp_filter` is set back.
pub async fn leave(pod: &Handle, change: RpFilter, interface: Option<u32>) -> Result<(), CaptureError> {
    for rule in rules(pod).await? {
        delete(pod, rule).await?;
    }
    if let (RpFilter::Loosened { was }, Some(index)) = (change, interface) {
        match set_rp_filter(pod, index, was).await {
            Ok(()) => {}
            // The interface went with the pod.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {}
            Err(e) => return Err(netlink("set the pod interface's rp_filter back")(e)),
        }
    }
    Ok(())
}

async fn delete(pod: &Handle, rule: RuleMessage) -> Result<(), CaptureError> {
    match pod.rule().del(rule).execute().await {
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENOENT => Ok(()),
        other => other.map_err(netlink("remove the capture's routing rule")),
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::Emitable;

    use super::*;

    /// IFLA_AF_SPEC (26) { AF_INET (2) { IFLA_INET_CONF (1, nested) { IPV4_DEVCONF_RP_FILTER (8): u32 } } }, as
    /// `iproute2`'s headers lay it out; nothing else, so that no other setting of the interface is written.
    #[test]
    fn the_rp_filter_request_carries_that_one_setting() {
        for value in [0u8, 1, 2] {
            let attribute = rp_filter_attribute(value);
            let mut bytes = vec![0; attribute.buffer_len()];
            attribute.emit(&mut bytes);
            let mut want = Vec::new();
            for (len, kind) in [(20u16, 26u16), (16, 2), (12, 1 | 0x8000), (8, 8)] {
                want.extend_from_slice(&len.to_ne_bytes());
                want.extend_from_slice(&kind.to_ne_bytes());
            }
            want.extend_from_slice(&u32::from(value).to_ne_bytes());
            assert_eq!(bytes, want, "rp_filter {value}");
        }
    }

    #[test]
    fn the_rules_preference_records_the_change_and_reads_back() {
        for change in [RpFilter::Untouched, RpFilter::Loosened { was: 0 }, RpFilter::Loosened { was: 1 }] {
            assert_eq!(RpFilter::from_preference(change.preference()), Some(change));
        }
        for foreign in [0, 31999, 32003, 32766] {
            assert_eq!(RpFilter::from_preference(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn only_a_strict_filter_is_loosened_and_an_earlier_record_stands() {
        for all in 0..=2u8 {
            for own in 0..=2u8 {
                let change = RpFilter::decide(all, own, None);
                let strict = all.max(own) == 1;
                assert_eq!(change, if strict { RpFilter::Loosened { was: own } } else { RpFilter::Untouched });
                // An agent that died left the interface loose (2): its record says what it was.
                for earlier in [RpFilter::Loosened { was: 0 }, RpFilter::Loosened { was: 1 }] {
                    assert_eq!(RpFilter::decide(all, 2, Some(earlier)), earlier);
                }
                assert_eq!(RpFilter::decide(all, own, Some(RpFilter::Untouched)), change);
            }
        }
    }
}
