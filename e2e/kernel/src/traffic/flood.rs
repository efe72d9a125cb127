//! Datagrams nobody receives, to fill a queue.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{enter, set_int_opt};
use crate::netns::{SOURCE_ADDR, VethPair};

/// `linux/udp.h` (not in every libc target's bindings).
const UDP_SEGMENT: i32 = 103;

/// What a GSO sender hands the kernel: datagrams of `segments` × `segment` bytes that the stack keeps whole
/// (`UDP_SEGMENT`) until a device or qdisc cuts them into `segment`-byte datagrams.
#[derive(Debug, Clone, Copy)]
pub struct Gso {
    pub segment: u16,
    pub segments: u16,
}

/// UDP datagrams of `payload` bytes from `a` to each of `destinations` in turn for `duration`, at most
/// `max_packets` spread evenly over it (as fast as the sender can where it cannot keep up); nobody receives them. Returns the datagrams handed to the
/// kernel (a qdisc's drop is not a send error for UDP). The socket never blocks and its send buffer is 64 MiB:
/// packets a TBF holds stay charged to it (netem's are not), and a full buffer would pace the whole flood to the
/// slowest destination.
pub fn flood(
    pair: &VethPair,
    destinations: &[Ipv4Addr],
    port: u16,
    payload: usize,
    duration: Duration,
    max_packets: u64,
) -> anyhow::Result<u64> {
    flood_with(pair, destinations, port, payload, None, duration, max_packets)
}

/// [`flood`] by a GSO sender: each datagram is `gso.segments` datagrams of `gso.segment` bytes in one send.
pub fn flood_gso(
    pair: &VethPair,
    destinations: &[Ipv4Addr],
    port: u16,
    gso: Gso,
    duration: Duration,
    max_packets: u64,
) -> anyhow::Result<u64> {
    let payload = usize::from(gso.segment) * usize::from(gso.segments);
    flood_with(pair, destinations, port, payload, Some(gso), duration, max_packets)
}

fn flood_with(
    pair: &VethPair,
    destinations: &[Ipv4Addr],
    port: u16,
    payload: usize,
    gso: Option<Gso>,
    duration: Duration,
    max_packets: u64,
) -> anyhow::Result<u64> {
    let socket = enter(&pair.a, move || {
        let s = UdpSocket::bind(SocketAddrV4::new(SOURCE_ADDR, 0))?;
        set_int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 64 << 20)?;
        if let Some(gso) = gso {
            set_int_opt(&s, libc::SOL_UDP, UDP_SEGMENT, i32::from(gso.segment))?;
        }
        s.set_nonblocking(true)?;
        Ok(s)
    })?;
    let targets: Vec<SocketAddrV4> = destinations.iter().map(|d| SocketAddrV4::new(*d, port)).collect();
    if targets.is_empty() {
        bail!("a flood needs a destination");
    }
    let buf = vec![0x5au8; payload];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < max_packets {
        let elapsed = start.elapsed();
        if elapsed >= duration {
            break;
        }
        let due = (u128::from(max_packets) * elapsed.as_nanos() / duration.as_nanos()) as u64;
        if sent > due {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if socket.send_to(&buf, targets[(sent % targets.len() as u64) as usize]).is_ok() {
            sent += 1;
        }
    }
    Ok(sent)
}
