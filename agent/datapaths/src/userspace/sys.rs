//! The userspace datapath's system calls, and the only `unsafe` code of that datapath.
//!
//! Invariants every block below relies on:
//! - every descriptor is created here, owned by an [`OwnedFd`] from the moment it exists, and closed only by it;
//! - every pointer handed to the kernel points at a live local or a slice borrowed for the whole call, and every
//!   length passed with it is that object's own size (`size_of`) or the slice's length;
//! - every structure the kernel reads is fully initialised (zeroed, then fields set); every one it writes is
//!   read only after the call succeeded, and only up to the length it reported.
//!
//! A socket belongs to the network namespace of the thread that created it, for its whole life: open each one on
//! a thread inside the namespace it is for (`crate::netns::Netns::run_inside`).

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::shard::Instruction;

// `RxSocket::open` hands a slice of `Instruction`s to the kernel as `sock_filter`s.
const _: () = assert!(
    size_of::<Instruction>() == size_of::<libc::sock_filter>()
        && std::mem::align_of::<Instruction>() == std::mem::align_of::<libc::sock_filter>()
);

/// `ETH_P_ALL` in network byte order, as `socket(AF_PACKET, …)` and `sockaddr_ll` want it.
const ALL_PROTOCOLS: u16 = (libc::ETH_P_ALL as u16).to_be();
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;

/// The legacy ethtool feature switches (`include/uapi/linux/ethtool.h`): every driver answers them through the
/// kernel's generic feature code, so a veth needs no driver support.
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_SSG: u32 = 0x19;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_SGSO: u32 = 0x24;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

fn owned(fd: RawFd) -> io::Result<OwnedFd> {
    check(fd)?;
    // SAFETY: `fd` was just returned by socket(2), is valid and owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What a packet socket read: the network-layer packet's length and its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub family: Family,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// Reads the network-layer packets that arrive on one interface (`AF_PACKET`, `SOCK_DGRAM`: the kernel strips
/// the link-layer header) and that its classic BPF filter accepts, non-blocking. Frames the interface sends, and
/// anything but IPv4 and IPv6, are skipped.
#[derive(Debug)]
pub struct RxSocket(OwnedFd);

impl RxSocket {
    /// On interface `ifindex` of the calling thread's namespace, queueing only what `program` accepts (it sees
    /// each packet from its network header on).
    pub fn open(ifindex: u32, program: &[Instruction]) -> io::Result<Self> {
        // Protocol 0: the socket receives nothing until bound, so no packet queues before the filter is on.
        // SAFETY: plain socket(2); the result is checked and owned at once.
        let fd = owned(unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
        })?;
        let fprog = libc::sock_fprog {
            len: u16::try_from(program.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            // `Instruction` is `#[repr(C)]` with sock_filter's fields in its order and sizes.
            filter: program.as_ptr().cast_mut().cast::<libc::sock_filter>(),
        };
        // SAFETY: `fprog` is a live local pointing at `program`, borrowed for the call with its length; the kernel
        // copies the program and writes nothing back.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&fprog as *const libc::sock_fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        check(rc)?;
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ALL_PROTOCOLS;
        addr.sll_ifindex = ifindex as i32;
        // SAFETY: `addr` is a live, initialised sockaddr_ll and the length is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        check(rc)?;
        Ok(RxSocket(fd))
    }

    /// The next IP packet into `buf`; `Ok(None)` when nothing is waiting. A packet longer than `buf` is cut
    /// (`len` is then `buf.len()`): size `buf` to the interface's MTU.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        loop {
            // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
            let mut from: libc::sockaddr_ll = unsafe { zeroed() };
            let mut from_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` is borrowed mutably for the call with its own length; `from` and `from_len` are live
            // locals of the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_TRUNC,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                return match err.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(err),
                };
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            let family = match u16::from_be(from.sll_protocol) {
                ETHERTYPE_IPV4 => Family::V4,
                ETHERTYPE_IPV6 => Family::V6,
                _ => continue,
            };
            return Ok(Some(Received { len: (n as usize).min(buf.len()), family }));
        }
    }
}

/// `PACKET_STATISTICS` (`include/uapi/linux/if_packet.h`) and what it reads.
const PACKET_STATISTICS: libc::c_int = 6;
#[repr(C)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

impl RxSocket {
    /// Packets the kernel dropped because the socket's receive buffer was full (the loop fell behind) since the
    /// last call: reading the statistics resets them.
    pub fn take_dropped(&self) -> io::Result<u64> {
        let mut stats = TpacketStats { tp_packets: 0, tp_drops: 0 };
        let mut len = size_of::<TpacketStats>() as libc::socklen_t;
        // SAFETY: `stats` is a live, initialised local of the size passed in `len`, which is live too.
        let rc = unsafe {
            libc::getsockopt(
                self.0.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                (&mut stats as *mut TpacketStats).cast(),
                &mut len,
            )
        };
        check(rc)?;
        Ok(u64::from(stats.tp_drops))
    }
}

impl AsRawFd for RxSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Sends whole IP packets (header included, as received) out of one interface, routed by the namespace's
/// routes through that interface only (`SO_BINDTODEVICE`): a route that sends the destination elsewhere, such as
/// the capture's own, is passed over. Neighbour resolution, netfilter and the interface's qdisc apply as to any
/// locally sent packet. Non-blocking: a full queue is an error the caller counts as a drop.
#[derive(Debug)]
pub struct TxSocket {
    v4: OwnedFd,
    v6: OwnedFd,
}

impl TxSocket {
    /// Out of `interface` of the calling thread's namespace.
    pub fn open(interface: &str) -> io::Result<Self> {
        let name = CString::new(interface).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let open = |family| -> io::Result<OwnedFd> {
            // SAFETY: plain socket(2); the result is checked and owned at once. IPPROTO_RAW implies that the
            // caller writes the IP header (IP_HDRINCL, and its IPv6 equivalent since Linux 4.5).
            let fd = owned(unsafe {
                libc::socket(family, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW)
            })?;
            let bytes = name.as_bytes_with_nul();
            // SAFETY: `bytes` is borrowed for the call with its own length.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_BINDTODEVICE,
                    bytes.as_ptr().cast(),
                    bytes.len() as libc::socklen_t,
                )
            };
            check(rc)?;
            Ok(fd)
        };
        Ok(TxSocket { v4: open(libc::AF_INET)?, v6: open(libc::AF_INET6)? })
    }

    /// Sends `packet`, an IP packet whose header names `destination`.
    pub fn send(&self, packet: &[u8], destination: IpAddr) -> io::Result<()> {
        match destination {
            IpAddr::V4(ip) => {
                // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
                let mut addr: libc::sockaddr_in = unsafe { zeroed() };
                addr.sin_family = libc::AF_INET as u16;
                addr.sin_addr.s_addr = u32::from(ip).to_be();
                send_to(&self.v4, packet, &addr)
            }
            IpAddr::V6(ip) => {
                // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
                let mut addr: libc::sockaddr_in6 = unsafe { zeroed() };
                addr.sin6_family = libc::AF_INET6 as u16;
                addr.sin6_addr.s6_addr = ip.octets();
                send_to(&self.v6, packet, &addr)
            }
        }
    }
}

/// `sendto(2)` of `packet` to `addr`, a socket address structure of the socket's family.
fn send_to<A>(fd: &OwnedFd, packet: &[u8], addr: &A) -> io::Result<()> {
    // SAFETY: `packet` is borrowed for the call with its own length; `addr` is a live, initialised socket address
    // whose size is passed.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            libc::MSG_DONTWAIT,
            (addr as *const A).cast(),
            size_of::<A>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Turns off checksum and segmentation offloads on `interface` of the calling thread's namespace, so that what
/// crosses it is what the wire carries: whole checksums, and no packet longer than the MTU (the kernel segments
/// and checksums in software before the interface). A raw socket sends exactly such packets.
pub fn disable_offloads(interface: &str) -> io::Result<()> {
    // SAFETY: plain socket(2); the result is checked and owned at once.
    let fd = owned(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    let name = interface.as_bytes();
    if name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for command in [ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SSG, ETHTOOL_STXCSUM] {
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        let mut value = EthtoolValue { cmd: command, data: 0 };
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        let mut request: libc::ifreq = unsafe { zeroed() };
        for (slot, byte) in request.ifr_name.iter_mut().zip(name) {
            *slot = *byte as libc::c_char;
        }
        request.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        // SAFETY: `request` is a live, initialised ifreq whose data pointer points at `value`, a live
        // ethtool_value, for the whole call; SIOCETHTOOL reads the command from it and writes nothing back for a
        // set. The request's type is libc's Ioctl: unsigned long in glibc, int in musl (the arm64 images).
        check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL as libc::Ioctl, &mut request) })?;
    }
    Ok(())
}

/// `poll(2)` on `fds` for input, for at most `timeout_ns` (None: until one is readable), with the precision of
/// a nanosecond timeout (`ppoll`): a delay line cannot wait on milliseconds. Returns which descriptors are
/// readable, in `fds`' order.
pub fn wait_readable(fds: &[RawFd], timeout_ns: Option<u64>, readable: &mut Vec<bool>) -> io::Result<()> {
    let mut polled: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let timeout = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let timeout_ptr = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `polled` is a live vector of `polled.len()` initialised pollfds; `timeout_ptr` is null or points at
    // the live local `timeout`; no signal mask is passed.
    let rc = unsafe { libc::ppoll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout_ptr, std::ptr::null()) };
    readable.clear();
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            readable.resize(fds.len(), false);
            return Ok(());
        }
        return Err(err);
    }
    readable.extend(polled.iter().map(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0));
    Ok(())
}
