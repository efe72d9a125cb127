//! The one socket option std does not offer: `SO_NO_CHECK`, UDP over IPv4 without a checksum. The only
//! `unsafe` of this crate besides the signal handler in main.rs.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;

use crate::error::{ProbeError, Result};

const SOL_SOCKET: i32 = 1;
const SO_NO_CHECK: i32 = 11;

unsafe extern "C" {
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
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
