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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::shard::Instruction;

mod batch;
pub use batch::{MsgHeaders, Outgoing};

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

/// The descriptors the loop waits on, kept between passes so that a pass allocates nothing.
#[derive(Debug, Default)]
pub struct PollSet(Vec<libc::pollfd>);

impl PollSet {
    /// Waits on `fds` from now on.
    pub fn set(&mut self, fds: impl IntoIterator<Item = RawFd>) {
        self.0.clear();
        self.0.extend(fds.into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
    }

    /// `poll(2)` for input, for at most `timeout_ns` (None: until one is readable), with the precision of a
    /// nanosecond timeout (`ppoll`): a delay line cannot wait on milliseconds. Afterwards [`PollSet::readable`]
    /// tells which descriptors are; none after an interruption.
    pub fn wait(&mut self, timeout_ns: Option<u64>) -> io::Result<()> {
        for p in &mut self.0 {
            p.revents = 0;
        }
        let timeout = timeout_ns.map(|ns| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as _,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        });
        let timeout_ptr = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `self.0` is a live vector of `self.0.len()` initialised pollfds; `timeout_ptr` is null or points
        // at the live local `timeout`; no signal mask is passed.
        let rc =
            unsafe { libc::ppoll(self.0.as_mut_ptr(), self.0.len() as libc::nfds_t, timeout_ptr, std::ptr::null()) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            return if err.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(err) };
        }
        Ok(())
    }

    /// Whether the `i`-th descriptor given to [`PollSet::set`] was readable (or in error) at the last wait.
    pub fn readable(&self, i: usize) -> bool {
        self.0.get(i).is_some_and(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0)
    }
}
