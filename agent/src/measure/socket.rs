//! Probe sockets: ICMP echo over raw sockets, and TCP SYN. A socket is created in the namespace of the thread
//! that creates it and stays there, so the caller creates it on a thread inside the source pod's namespace
//! (`Netns::run_inside`) and then uses it from the async runtime. Nothing here decides what to probe.
//!
//! A raw ICMP socket receives every ICMP message of its namespace; replies are matched to probes by the peer,
//! the echo identifier (one per socket) and the sequence number, and everything else is ignored.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::time::Instant;

use isthmus_datapaths::netns::Netns;

const ECHO_REQUEST_V4: u8 = 8;
const ECHO_REPLY_V4: u8 = 0;
const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
/// Bytes after the 8-byte ICMP header: small, so that the probes cost little (docs/benchmarks.md).
pub const PAYLOAD: usize = 16;

/// An echo reply read from a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EchoReply {
    pub socket: u64,
    pub peer: IpAddr,
    pub id: u16,
    pub seq: u16,
    pub at: Instant,
}

/// A raw ICMP (or ICMPv6) socket with the task that reads its replies; dropping it stops the task and closes
/// the socket.
#[derive(Debug)]
pub struct IcmpSocket {
    fd: Arc<AsyncFd<Socket>>,
    pub key: u64,
    pub id: u16,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for IcmpSocket {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Creates a socket in `netns` (the caller's own namespace when `None`).
pub async fn create_in(
    netns: Option<&Arc<Netns>>,
    create: impl FnOnce() -> io::Result<Socket> + Send + 'static,
) -> io::Result<Socket> {
    match netns {
        Some(netns) => netns.run_inside(create).await?,
        None => create(),
    }
}

/// A raw, non-blocking ICMP socket for `v6` or IPv4, in the calling thread's namespace.
pub fn raw_icmp(v6: bool) -> io::Result<Socket> {
    let (domain, protocol) = if v6 { (Domain::IPV6, Protocol::ICMPV6) } else { (Domain::IPV4, Protocol::ICMPV4) };
    Socket::new(domain, Type::RAW.nonblocking().cloexec(), Some(protocol))
}

/// A non-blocking TCP socket that resets its connection when closed (no FIN, no TIME_WAIT).
pub fn tcp(v6: bool) -> io::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(domain, Type::STREAM.nonblocking().cloexec(), Some(Protocol::TCP))?;
    socket.set_linger(Some(Duration::ZERO))?;
    Ok(socket)
}

impl IcmpSocket {
    /// Starts reading `socket`'s echo replies with identifier `id` into `replies`, tagged with `key`.
    pub fn start(socket: Socket, key: u64, id: u16, replies: mpsc::Sender<EchoReply>) -> io::Result<Self> {
        let v6 = socket.domain()? == Domain::IPV6;
        let fd = Arc::new(register(socket, Interest::READABLE)?);
        let reader = tokio::spawn(read_replies(fd.clone(), v6, key, id, replies));
        Ok(IcmpSocket { fd, key, id, reader })
    }

    /// Sends one echo request; the kernel routes it as any packet of the socket's namespace.
    pub fn send(&self, to: IpAddr, seq: u16) -> io::Result<()> {
        let packet = echo_request(to.is_ipv6(), self.id, seq);
        self.fd.get_ref().send_to(&packet, &SockAddr::from(SocketAddr::new(to, 0))).map(drop)
    }
}

async fn read_replies(fd: Arc<AsyncFd<Socket>>, v6: bool, key: u64, id: u16, replies: mpsc::Sender<EchoReply>) {
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    loop {
        let Ok(mut guard) = fd.readable().await else { return };
        let (n, from) = match guard.try_io(|inner| inner.get_ref().recv_from(&mut buf)) {
            Ok(Ok(received)) => received,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "reading a probe socket");
                continue;
            }
            Err(_would_block) => continue,
        };
        let at = Instant::now();
        // SAFETY: recv_from initialised the first n bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
        let Some(peer) = from.as_socket().map(|a| a.ip()) else { continue };
        let Some((reply_id, seq)) = parse_reply(v6, bytes) else { continue };
        if reply_id != id {
            continue;
        }
        // A full channel means the prober is far behind; the probe then times out and counts as lost.
        let _ = replies.try_send(EchoReply { socket: key, peer, id, seq, at });
    }
}

/// A TCP SYN to `to` from a socket made in `netns`: the round trip to the SYN-ACK or the reset, whichever comes
/// (the connection is reset at once either way); `None` when neither came within `timeout` or the network said
/// the destination is unreachable.
pub async fn tcp_syn(netns: Option<Arc<Netns>>, to: SocketAddr, timeout: Duration) -> io::Result<Option<Duration>> {
    let v6 = to.is_ipv6();
    let socket = create_in(netns.as_ref(), move || tcp(v6)).await?;
    let started = Instant::now();
    match socket.connect(&SockAddr::from(to)) {
        Ok(()) => return Ok(Some(started.elapsed())),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => return Ok(Some(started.elapsed())),
        Err(_) => return Ok(None),
    }
    let fd = register(socket, Interest::WRITABLE)?;
    let Ok(guard) = tokio::time::timeout(timeout, fd.writable()).await else { return Ok(None) };
    let rtt = started.elapsed();
    drop(guard);
    match fd.get_ref().take_error()? {
        None => Ok(Some(rtt)),
        Some(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => Ok(Some(rtt)),
        Some(_) => Ok(None),
    }
}

/// Registers `socket` with the runtime's reactor.
fn register(socket: Socket, interest: Interest) -> io::Result<AsyncFd<Socket>> {
    // SAFETY: a `Socket` owns its descriptor and returns that same one for as long as it lives; the `AsyncFd`
    // owns the `Socket`, so the descriptor stays open until the registration is dropped with it.
    Ok(unsafe { AsyncFd::register_with_interest(socket, interest) }?)
}

/// An echo request: type, code, checksum, identifier, sequence, then [`PAYLOAD`] zero bytes. ICMPv6's
/// checksum covers a pseudo-header with the addresses, which the kernel fills in for raw ICMPv6 sockets.
pub fn echo_request(v6: bool, id: u16, seq: u16) -> Vec<u8> {
    let mut packet = vec![0u8; 8 + PAYLOAD];
    packet[0] = if v6 { ECHO_REQUEST_V6 } else { ECHO_REQUEST_V4 };
    packet[4..6].copy_from_slice(&id.to_be_bytes());
    packet[6..8].copy_from_slice(&seq.to_be_bytes());
    if !v6 {
        let sum = checksum(&packet);
        packet[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    packet
}

/// The (identifier, sequence) of an echo reply; `None` for anything else. A raw IPv4 socket reads the IP header
/// too, a raw ICMPv6 socket does not.
pub fn parse_reply(v6: bool, bytes: &[u8]) -> Option<(u16, u16)> {
    let icmp = if v6 {
        bytes
    } else {
        let header = usize::from(bytes.first()? & 0x0f) * 4;
        bytes.get(header..)?
    };
    let expected = if v6 { ECHO_REPLY_V6 } else { ECHO_REPLY_V4 };
    if icmp.len() < 8 || icmp[0] != expected || icmp[1] != 0 {
        return None;
    }
    Some((u16::from_be_bytes([icmp[4], icmp[5]]), u16::from_be_bytes([icmp[6], icmp[7]])))
}

/// The Internet checksum (RFC 1071).
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_request_checks_out_and_its_reply_parses() {
        let request = echo_request(false, 0xbeef, 7);
        assert_eq!(request.len(), 8 + PAYLOAD);
        assert_eq!(checksum(&request), 0, "a packet with its checksum sums to zero");
        // The reply as a raw IPv4 socket reads it: a 20-byte IP header, then the echoed message as type 0.
        let mut reply = vec![0x45u8; 20];
        reply.extend_from_slice(&request);
        reply[20] = ECHO_REPLY_V4;
        assert_eq!(parse_reply(false, &reply), Some((0xbeef, 7)));
        // Our own request (looped back in a namespace that pings itself) is not a reply.
        let mut looped = vec![0x45u8; 20];
        looped.extend_from_slice(&request);
        assert_eq!(parse_reply(false, &looped), None);
        let mut v6 = echo_request(true, 1, 2);
        assert_eq!(v6[0], ECHO_REQUEST_V6);
        v6[0] = ECHO_REPLY_V6;
        assert_eq!(parse_reply(true, &v6), Some((1, 2)));
        assert_eq!(parse_reply(true, &v6[..7]), None, "truncated");
        assert_eq!(parse_reply(false, &[0x4f]), None, "a header longer than the packet");
    }

    #[test]
    fn the_checksum_is_rfc_1071s() {
        // RFC 1071's example: 0x0001 f203 f4f5 f6f7 sums to 0xddf2, whose complement is 0x220d.
        assert_eq!(checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]), 0x220d);
        assert_eq!(checksum(&[0xff]), !0xff00);
    }
}
