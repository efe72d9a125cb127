//! Packets moved in batches: one `recvmmsg` or `sendmmsg` for many, through headers kept between calls. The
//! invariants of the parent module hold here too.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use super::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, RxSocket, TxSocket};

/// The headers one `recvmmsg` or `sendmmsg` fills or reads, kept between calls so that a batch allocates nothing.
/// They point into the buffers of the call that set them last, and are set again by every call before the
/// kernel reads them.
#[derive(Default)]
pub struct MsgHeaders {
    headers: Vec<libc::mmsghdr>,
    iovecs: Vec<libc::iovec>,
    /// Senders' addresses for a receive, destinations for a send; `sockaddr_storage` holds any family's.
    addresses: Vec<libc::sockaddr_storage>,
}

impl MsgHeaders {
    /// At least `n` entries, the first `n` of them each naming its own address and iovec, with no flags.
    fn prepare(&mut self, n: usize) {
        if self.headers.len() < n {
            // SAFETY: mmsghdr, iovec and sockaddr_storage are plain data; all-zero is a valid value of each.
            let (header, iovec, address) = unsafe { (zeroed(), zeroed(), zeroed()) };
            self.headers.resize(n, header);
            self.iovecs.resize(n, iovec);
            self.addresses.resize(n, address);
        }
        let entries = self.headers.iter_mut().zip(&mut self.iovecs).zip(&mut self.addresses).take(n);
        for ((h, iov), address) in entries {
            h.msg_hdr.msg_name = (address as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
    }
}

impl std::fmt::Debug for MsgHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MsgHeaders").field("capacity", &self.headers.capacity()).finish_non_exhaustive()
    }
}

impl RxSocket {
    /// Reads the packets waiting, at most `slots.len()`, with one `recvmmsg`: each into its slot, whose length
    /// becomes what arrived, cut at `len` bytes (size `len` to the interface's MTU). Appends to `got` the index
    /// of each slot that holds an IP packet; a frame the interface sent, or anything else, is skipped and its
    /// slot left as it was. Returns how many were read: fewer than `slots.len()` once the queue is empty.
    pub fn recv_batch(
        &self,
        slots: &mut [Vec<u8>],
        len: usize,
        batch: &mut MsgHeaders,
        got: &mut Vec<usize>,
    ) -> io::Result<usize> {
        batch.prepare(slots.len());
        for (slot, iov) in slots.iter_mut().zip(&mut batch.iovecs) {
            slot.clear();
            slot.reserve(len);
            iov.iov_base = slot.as_mut_ptr().cast();
            iov.iov_len = len;
        }
        let read = loop {
            // SAFETY: each of the `slots.len()` headers points at its own live iovec and address in `batch`, each
            // iovec at `len` bytes of its slot's reserved capacity, borrowed mutably for the call; no timeout.
            let n = unsafe {
                libc::recvmmsg(
                    self.0.as_raw_fd(),
                    batch.headers.as_mut_ptr(),
                    slots.len() as libc::c_uint,
                    (libc::MSG_DONTWAIT | libc::MSG_TRUNC) as _,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        };
        for (i, (slot, header)) in slots.iter_mut().zip(&batch.headers).enumerate().take(read) {
            // SAFETY: the kernel wrote the first `msg_len` bytes of the slot, at most `len` of them (MSG_TRUNC
            // reports the packet's whole length), within the capacity reserved above.
            unsafe { slot.set_len((header.msg_len as usize).min(len)) };
            // SAFETY: the kernel wrote a sockaddr_ll, the packet's, into the address this header names.
            let from = unsafe { &*(&batch.addresses[i] as *const libc::sockaddr_storage).cast::<libc::sockaddr_ll>() };
            let ip = matches!(u16::from_be(from.sll_protocol), ETHERTYPE_IPV4 | ETHERTYPE_IPV6);
            if ip && from.sll_pkttype != libc::PACKET_OUTGOING {
                got.push(i);
            }
        }
        Ok(read)
    }
}

/// A packet for [`TxSocket::send_batch`]: a whole IP packet and the destination its header names.
pub trait Outgoing {
    fn packet(&self) -> &[u8];
    fn destination(&self) -> IpAddr;
}

impl TxSocket {
    /// Sends `packets` in their order, with one `sendmmsg` for each run of one family (more when the kernel
    /// stops part way). Returns how many the kernel refused (a full queue, no route out of the interface); the
    /// others are sent.
    pub fn send_batch<P: Outgoing>(&self, packets: &[P], batch: &mut MsgHeaders) -> u64 {
        let mut refused = 0;
        for run in packets.chunk_by(|a, b| a.destination().is_ipv6() == b.destination().is_ipv6()) {
            let fd = if run[0].destination().is_ipv6() { &self.v6 } else { &self.v4 };
            refused += send_run(fd, run, batch);
        }
        refused
    }
}

/// `sendmmsg(2)` of `packets`, all of the socket's family.
fn send_run<P: Outgoing>(fd: &OwnedFd, packets: &[P], batch: &mut MsgHeaders) -> u64 {
    batch.prepare(packets.len());
    for (i, p) in packets.iter().enumerate() {
        let bytes = p.packet();
        batch.iovecs[i].iov_base = bytes.as_ptr().cast_mut().cast();
        batch.iovecs[i].iov_len = bytes.len();
        let storage = &mut batch.addresses[i];
        let len = match p.destination() {
            IpAddr::V4(ip) => {
                // SAFETY: sockaddr_in is plain data; all-zero is a valid value.
                let mut addr: libc::sockaddr_in = unsafe { zeroed() };
                addr.sin_family = libc::AF_INET as u16;
                addr.sin_addr.s_addr = u32::from(ip).to_be();
                // SAFETY: sockaddr_storage is larger than and aligned for every socket address, sockaddr_in too.
                unsafe { (storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(addr) };
                size_of::<libc::sockaddr_in>()
            }
            IpAddr::V6(ip) => {
                // SAFETY: sockaddr_in6 is plain data; all-zero is a valid value.
                let mut addr: libc::sockaddr_in6 = unsafe { zeroed() };
                addr.sin6_family = libc::AF_INET6 as u16;
                addr.sin6_addr.s6_addr = ip.octets();
                // SAFETY: as above, for sockaddr_in6.
                unsafe { (storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>().write(addr) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        batch.headers[i].msg_hdr.msg_namelen = len as libc::socklen_t;
    }
    let mut refused = 0;
    let mut at = 0;
    while at < packets.len() {
        let rest = &mut batch.headers[at..packets.len()];
        // SAFETY: each header of `rest` points at its own live iovec and address in `batch`, set above; each iovec
        // at a packet of `packets`, borrowed for the call, with its length. The kernel writes only `msg_len`.
        let n = unsafe {
            libc::sendmmsg(fd.as_raw_fd(), rest.as_mut_ptr(), rest.len() as libc::c_uint, libc::MSG_DONTWAIT as _)
        };
        if n > 0 {
            at += n as usize;
        } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            // The packet at `at` was refused (after a partial send, the kernel reports its error only when
            // asked again, as here); the rest of the run is tried after it.
            refused += 1;
            at += 1;
        }
    }
    refused
}
