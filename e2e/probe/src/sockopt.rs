//! The socket options std does not offer: `SO_NO_CHECK` (UDP over IPv4 without a checksum) and `TCP_INFO`'s
//! bytes acknowledged. The only `unsafe` of this crate besides the signal handler in main.rs.

use std::net::{TcpStream, UdpSocket};
use std::os::fd::AsRawFd;

use crate::error::{ProbeError, Result};

const SOL_SOCKET: i32 = 1;
const SO_NO_CHECK: i32 = 11;

const IPPROTO_TCP: i32 = 6;
const TCP_INFO: i32 = 11;
/// `tcpi_bytes_acked` in `struct tcp_info` (linux/tcp.h, since 4.1): 8 bytes of u8 fields, 24 u32s, then the u64s
/// `tcpi_pacing_rate` and `tcpi_max_pacing_rate`.
const BYTES_ACKED_OFFSET: usize = 8 + 24 * 4 + 2 * 8;

unsafe extern "C" {
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
    fn getsockopt(fd: i32, level: i32, name: i32, value: *mut std::ffi::c_void, len: *mut u32) -> i32;
}

/// The bytes of `stream`'s data the peer has acknowledged: what reached it, on the sender's clock.
pub fn tcp_bytes_acked(stream: &TcpStream) -> Result<u64> {
    let mut info = [0u8; 256];
    let mut len = info.len() as u32;
    // SAFETY: the fd is open while `stream` lives; the kernel writes at most `len` bytes into `info` and the
    // length it wrote into `len`.
    let rc = unsafe { getsockopt(stream.as_raw_fd(), IPPROTO_TCP, TCP_INFO, info.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return Err(ProbeError::new(format!("TCP_INFO: {}", std::io::Error::last_os_error())));
    }
    let end = BYTES_ACKED_OFFSET + 8;
    if (len as usize) < end {
        return Err(ProbeError::new(format!("TCP_INFO: {len} bytes, too short for tcpi_bytes_acked (kernel < 4.1)")));
    }
    Ok(u64::from_ne_bytes(info[BYTES_ACKED_OFFSET..end].try_into().expect("8 bytes")))
}

pub fn disable_udp_checksum(socket: &UdpSocket) -> Result<()> {
    if socket.local_addr().is_ok_and(|a| a.is_ipv6()) {
        return Err(ProbeError::new("--no-udp-checksum: IPv6 requires the UDP checksum"));
    }
    let one: i32 = 1;
    // SAFETY: the fd is open for the socket's lifetime, and the value points at an i32 of the length given.
    let rc = unsafe {
        setsockopt(socket.as_raw_fd(), SOL_SOCKET, SO_NO_CHECK, (&one as *const i32).cast(), size_of::<i32>() as u32)
    };
    if rc != 0 {
        return Err(ProbeError::new(format!("--no-udp-checksum: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn bytes_acked_counts_what_the_peer_took() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut receiver, _) = listener.accept().unwrap();
        // Some kernels count the SYN's sequence number: what matters is the growth.
        let base = tcp_bytes_acked(&sender).unwrap();
        assert!(base <= 1, "{base}");
        sender.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        receiver.read_exact(&mut got).unwrap();
        // The ack of the last segment may trail the read by a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tcp_bytes_acked(&sender).unwrap() < base + 100_000 {
            assert!(std::time::Instant::now() < deadline, "acked {}", tcp_bytes_acked(&sender).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(tcp_bytes_acked(&sender).unwrap(), base + 100_000);
    }
}
