//! Bounded traffic between the test namespaces and what it measures.
//!
//! Both ends run in the same guest kernel, so a sender timestamp in the payload gives the exact one-way
//! delay (no return path to subtract). Every datagram carries a sequence number and a checksum over its
//! whole payload, so one stream yields delay, loss, duplication, corruption and reordering.
//! Every loop here is bounded in packets and in time.
//!
//! - `stream`: a UDP stream, its sender and its receiver;
//! - `result`: what the receiver saw and the figures read from it (delay, loss and its bursts, duplication,
//!   corruption, order, goodput), pure;
//! - `bulk`: TCP bulk for a bounded time;
//! - `flood`: datagrams nobody receives, to fill a queue;
//! - `guest`: the guest kernel's own counters read around a stream (CPU time, input backlog drops).

use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::time::Instant;

use anyhow::Context;

use crate::netns::Netns;

mod bulk;
mod flood;
mod guest;
mod result;
mod stream;

pub use bulk::Bulk;
pub use flood::{Gso, flood, flood_gso};
pub use guest::{CpuTimes, backlog_drops};
pub use result::StreamResult;
pub use stream::{Stream, StreamSpec, stream};

const HEADER: usize = 16; // seq u32, packets in the stream u32, send time u64
const TRAILER: usize = 8; // FNV-1a over everything before it
/// Ethernet + IPv4 + UDP headers: what TBF counts on a veth besides the payload.
pub const UDP_L2_OVERHEAD: usize = 14 + 20 + 8;

/// The clock of every arrival's `sent_ns` and `received_ns`: nanoseconds since the first reading in this process.
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Runs `f` on a thread inside `ns` (`isthmus_test_kit::netns::run_in`), with anyhow's errors.
fn enter<T: Send>(ns: &Netns, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    ns.enter(f)?
}

fn set_int_opt(sock: &impl AsRawFd, level: i32, name: i32, value: i32) -> anyhow::Result<()> {
    // SAFETY: plain setsockopt with a pointer to a live i32 and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("setsockopt({level}, {name})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_detects_a_flipped_bit() {
        let mut data = vec![7u8; 64];
        let sum = fnv1a(&data);
        data[40] ^= 0x10;
        assert_ne!(fnv1a(&data), sum);
    }
}
