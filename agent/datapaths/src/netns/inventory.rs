//! What a namespace holds — its addresses and interfaces — read over netlink from inside it: how a pod's
//! namespace is recognised (it holds all the pod's IPs), and where adoption and cleanup look for trees.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};

use super::{Netns, NetnsId};

/// What a namespace holds: its addresses and interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub addresses: HashSet<IpAddr>,
    pub interfaces: Vec<String>,
}

impl Inventory {
    pub fn holds_all(&self, ips: &[IpAddr]) -> bool {
        !ips.is_empty() && ips.iter().all(|ip| self.addresses.contains(ip))
    }
}

/// Dumps links and addresses of the calling thread's namespace.
pub(super) fn read_inventory() -> io::Result<Inventory> {
    let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    let mut inventory = Inventory::default();
    for message in dump(&socket, RouteNetlinkMessage::GetLink(LinkMessage::default()), 1)? {
        if let RouteNetlinkMessage::NewLink(link) = message {
            for attribute in link.attributes {
                if let LinkAttribute::IfName(name) = attribute {
                    inventory.interfaces.push(name);
                }
            }
        }
    }
    for message in dump(&socket, RouteNetlinkMessage::GetAddress(AddressMessage::default()), 2)? {
        if let RouteNetlinkMessage::NewAddress(address) = message {
            for attribute in address.attributes {
                // IFA_LOCAL is the interface's own address on point-to-point links; IFA_ADDRESS elsewhere.
                if let AddressAttribute::Address(ip) | AddressAttribute::Local(ip) = attribute {
                    inventory.addresses.insert(ip);
                }
            }
        }
    }
    Ok(inventory)
}

fn dump(
    socket: &netlink_sys::Socket,
    request: RouteNetlinkMessage,
    sequence: u32,
) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = sequence;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
    message.finalize();
    let mut buffer = vec![0; message.buffer_len()];
    message.serialize(&mut buffer);
    socket.send(&buffer, 0)?;
    let mut replies = Vec::new();
    loop {
        let (bytes, _) = socket.recv_from_full()?;
        let mut offset = 0;
        while offset < bytes.len() {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[offset..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("netlink dump reply: {e}")))?;
            let length = reply.header.length as usize;
            if length == 0 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "netlink message of length 0"));
            }
            offset += (length + 3) & !3;
            match reply.payload {
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::Error(e) => {
                    return Err(e.code.map_or_else(
                        || io::Error::other("netlink dump acknowledged without data"),
                        |c| io::Error::from_raw_os_error(-c.get()),
                    ));
                }
                NetlinkPayload::InnerMessage(m) => replies.push(m),
                _ => {}
            }
        }
    }
}

/// Inventories of many namespaces, `parallelism` threads at a time. A namespace that cannot be entered maps
/// to `None` (it vanished, or we lack the privilege).
pub fn inventory_many<'a>(
    namespaces: impl Iterator<Item = &'a Netns>,
    parallelism: usize,
) -> HashMap<NetnsId, Option<Inventory>> {
    let namespaces: Vec<&Netns> = namespaces.collect();
    let mut out = HashMap::new();
    for chunk in namespaces.chunks(parallelism.max(1)) {
        let started: Vec<_> = chunk.iter().map(|ns| (ns.id(), ns.start_inside(read_inventory))).collect();
        for (id, inside) in started {
            let inventory = inside.and_then(|inside| inside.wait()).and_then(|read| read);
            let inventory = inventory
                .map_err(|e| tracing::debug!(netns = %id, error = %e, "cannot read the namespace's addresses"));
            out.insert(id, inventory.ok());
        }
    }
    out
}
