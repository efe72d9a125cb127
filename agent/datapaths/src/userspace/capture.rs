//! Takes a pod's impaired destinations out of its egress path, by routing.
//!
//! A veth pair: its pod end ([`POD_END`]) in the pod's namespace, its agent end in the agent's own namespace, one
//! that no path on the node pins, so it lives only as long as the agent holds it. Each impaired destination gets
//! a route through the pod end, in a table of isthmus's own ([`super::routing`]), so the pod's own stack hands
//! the agent those packets (and only those): whole,
//! checksummed, no longer than the MTU (offloads are off on the pod end). The agent sends them on out of the
//! pod's interface with a socket bound to it, which the capture's routes do not apply to.
//!
//! Fail-open by construction: when the agent dies, its namespace goes, with it the agent end, with that the pair
//! and every route through it, and the pod's traffic takes its ordinary routes again, unimpaired.

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

use super::routing::{self, RpFilter, TABLE};
use super::sys;
use crate::netns::Netns;
use crate::netns::socket::open_in;

/// The name of the capture's interface in a pod's namespace.
pub const POD_END: &str = "isth-u0";

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{action}: {source}")]
    Netlink { action: &'static str, source: rtnetlink::Error },
    #[error("{action}: {source}")]
    System { action: &'static str, source: std::io::Error },
    #[error("the pod has no interface {0}")]
    NoInterface(String),
}

fn netlink(action: &'static str) -> impl FnOnce(rtnetlink::Error) -> CaptureError {
    move |source| CaptureError::Netlink { action, source }
}

fn system(action: &'static str) -> impl FnOnce(std::io::Error) -> CaptureError {
    move |source| CaptureError::System { action, source }
}

/// An rtnetlink handle inside `netns`, its connection driven by the runtime until the handle is dropped.
pub(super) async fn handle_in(netns: &Netns) -> Result<Handle, CaptureError> {
    let socket = open_in(netns).await.map_err(|e| CaptureError::System {
        action: "open a netlink socket in the namespace",
        source: std::io::Error::other(e.to_string()),
    })?;
    let (connection, handle, _) = rtnetlink::from_socket(socket.socket);
    tokio::spawn(connection);
    Ok(handle)
}

async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<LinkMessage>, CaptureError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(link) => Ok(link),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(netlink("look up an interface")(e)),
    }
}

fn mtu(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| if let LinkAttribute::Mtu(m) = a { Some(*m) } else { None })
}

/// One pod's capture: the pair, and the agent end's index for the socket that reads it.
#[derive(Debug)]
pub struct Capture {
    pod: Handle,
    pod_end: u32,
    /// The agent end, in the agent's namespace.
    pub agent_end: u32,
    /// The MTU of the pod's interface, which the pair copies: no captured packet is longer.
    pub mtu: u32,
    /// What the capture changed in the pod interface's reverse-path filter, set back on [`Capture::detach`].
    rp_filter: (RpFilter, Option<u32>),
}

impl Capture {
    /// The pair for the pod in `pod_ns` whose traffic leaves by `interface`; `agent_end` names its end in
    /// `agent_ns` (unique there). An earlier capture's pod end is replaced.
    pub async fn attach(
        agent_ns: &Netns,
        pod_ns: &Netns,
        interface: &str,
        agent_end: &str,
    ) -> Result<Capture, CaptureError> {
        let (agent, pod) = (handle_in(agent_ns).await?, handle_in(pod_ns).await?);
        let shaped = link_by_name(&pod, interface).await?.ok_or_else(|| CaptureError::NoInterface(interface.into()))?;
        let mtu = mtu(&shaped).unwrap_or(1500);
        if let Some(old) = link_by_name(&pod, POD_END).await? {
            pod.link().del(old.header.index).execute().await.map_err(netlink("remove an earlier capture"))?;
        }
        // The pod end is made under a name unique in the agent's namespace (pods are attached in parallel there),
        // moved into the pod's namespace, and named there.
        let moving = format!("{agent_end}p");
        agent
            .link()
            .add(LinkVeth::new(agent_end, &moving).mtu(mtu).build())
            .execute()
            .await
            .map_err(netlink("create the capture's veth pair"))?;
        let peer = link_by_name(&agent, &moving).await?.ok_or_else(|| CaptureError::NoInterface(moving.clone()))?;
        agent
            .link()
            .set(LinkUnspec::new_with_index(peer.header.index).mtu(mtu).setns_by_fd(raw(pod_ns)).build())
            .execute()
            .await
            .map_err(netlink("move the capture's end into the pod"))?;
        let moved = link_by_name(&pod, &moving).await?.ok_or_else(|| CaptureError::NoInterface(moving.clone()))?;
        pod.link()
            .set(LinkUnspec::new_with_index(moved.header.index).name(POD_END).build())
            .execute()
            .await
            .map_err(netlink("name the capture's end in the pod"))?;
        let ours = link_by_name(&agent, agent_end).await?.ok_or_else(|| CaptureError::NoInterface(agent_end.into()))?;
        agent
            .link()
            .set(LinkUnspec::new_with_index(ours.header.index).up().build())
            .execute()
            .await
            .map_err(netlink("bring the agent's end up"))?;
        let pod_end = link_by_name(&pod, POD_END).await?.ok_or_else(|| CaptureError::NoInterface(POD_END.into()))?;
        pod_ns
            .run_inside(|| sys::disable_offloads(POD_END))
            .await
            .map_err(system("enter the pod's namespace"))?
            .map_err(system("turn the capture's offloads off"))?;
        // No ARP: the pod's stack sends to the pair without asking who holds the address.
        pod.link()
            .set(LinkUnspec::new_with_index(pod_end.header.index).arp(false).up().build())
            .execute()
            .await
            .map_err(netlink("bring the capture's end up"))?;
        let rp_filter = routing::enter(&pod, pod_ns, interface).await?;
        Ok(Capture { pod, pod_end: pod_end.header.index, agent_end: ours.header.index, mtu, rp_filter })
    }

    /// Routes `destination` through the capture, in the capture's own table (a route of the same prefix in the
    /// pod's `main` stays as it is); `source` (the pod's address of that family) is the source address new
    /// connections to it take, as they would through the pod's own interface.
    pub async fn route(&self, destination: IpNet, source: Option<IpAddr>) -> Result<(), CaptureError> {
        let message = self.route_message(destination, source);
        self.pod.route().add(message).replace().execute().await.map_err(netlink("route a destination to the capture"))
    }

    /// Withdraws `destination`'s route: its packets take the pod's ordinary route again.
    pub async fn unroute(&self, destination: IpNet) -> Result<(), CaptureError> {
        match self.pod.route().del(self.route_message(destination, None)).execute().await {
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ESRCH => Ok(()),
            other => other.map_err(netlink("withdraw a destination's route")),
        }
    }

    fn route_message(&self, destination: IpNet, source: Option<IpAddr>) -> netlink_packet_route::route::RouteMessage {
        let builder = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(destination.network(), destination.prefix_len())
            .expect("an IpNet's address and prefix are of one family")
            .output_interface(self.pod_end)
            .table_id(TABLE)
            .scope(RouteScope::Link);
        match source.filter(|s| s.is_ipv4() == destination.addr().is_ipv4()) {
            Some(s) => builder.pref_source(s).expect("checked to be of the destination's family").build(),
            None => builder.build(),
        }
    }

    /// Whether the pod end is still there (something outside isthmus may have deleted it).
    pub async fn present(&self) -> Result<bool, CaptureError> {
        Ok(link_by_name(&self.pod, POD_END).await?.is_some_and(|l| l.header.index == self.pod_end))
    }

    /// Removes the pair (and so every route through it) now, rather than when the agent ends, and undoes what
    /// the capture changed in the pod's routing rules and reverse-path filter.
    pub async fn detach(self) -> Result<(), CaptureError> {
        match self.pod.link().del(self.pod_end).execute().await {
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {}
            other => other.map_err(netlink("remove the capture"))?,
        }
        routing::leave(&self.pod, self.rp_filter.0, self.rp_filter.1).await
    }
}

/// Removes every interface but the loopback from the agent's namespace `agent_ns`: each is a capture's agent end,
/// and removing it removes its pod end and every route through that. Returns how many it removed.
pub async fn remove_all(agent_ns: &Netns) -> Result<usize, CaptureError> {
    let handle = handle_in(agent_ns).await?;
    let links: Vec<LinkMessage> =
        handle.link().get().execute().try_collect().await.map_err(netlink("list the captures"))?;
    let mut removed = 0;
    for link in links.iter().filter(|l| !l.attributes.contains(&LinkAttribute::IfName("lo".into()))) {
        match handle.link().del(link.header.index).execute().await {
            Ok(()) => removed += 1,
            // Its pod's namespace went, and the pair with it, since the list was read.
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {}
            Err(e) => return Err(netlink("remove a capture")(e)),
        }
    }
    Ok(removed)
}

fn raw(netns: &Netns) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    netns.fd().as_raw_fd()
}
