//! A UDP stream from one namespace to a destination in the other: the sender, the receiver and their sockets.
//! What the receiver saw is a [`StreamResult`] (`result.rs`).

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::result::{Arrival, StreamResult};
use super::{HEADER, TRAILER, enter, fnv1a, now_ns, set_int_opt};
use crate::netns::{SOURCE_ADDR, VethPair};

#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub packets: u32,
    pub interval: Duration,
    pub payload: usize,
    /// Send without a UDP checksum, so corrupted payloads reach the receiver instead of being dropped by it.
    pub no_udp_checksum: bool,
    /// How long the receiver keeps listening after the last packet was sent.
    pub drain: Duration,
}

impl StreamSpec {
    pub fn new(packets: u32, interval: Duration, drain: Duration) -> StreamSpec {
        StreamSpec { packets, interval, payload: 200, no_udp_checksum: false, drain }
    }
}

/// A UDP stream running from namespace `a` to one destination in `b`.
pub struct Stream {
    sender: JoinHandle<(u32, u32, Duration)>,
    receiver: JoinHandle<anyhow::Result<Received>>,
    payload: usize,
}

impl Stream {
    pub fn start(pair: &VethPair, destination: Ipv4Addr, port: u16, spec: &StreamSpec) -> anyhow::Result<Stream> {
        if spec.payload < HEADER + TRAILER {
            bail!("payload of {} bytes cannot hold the stream header", spec.payload);
        }
        let to = SocketAddrV4::new(destination, port);
        let rx = enter(&pair.b, move || {
            let s = UdpSocket::bind(to).with_context(|| format!("binding {to}"))?;
            // root in the guest: force a receive buffer that holds a whole bounded test stream
            set_int_opt(&s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20)?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(s)
        })?;
        let no_check = spec.no_udp_checksum;
        let tx = enter(&pair.a, move || {
            let s = UdpSocket::bind(SocketAddrV4::new(SOURCE_ADDR, 0))?;
            s.connect(to)?;
            if no_check {
                set_int_opt(&s, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)?;
            }
            Ok(s)
        })?;
        let done_at = Arc::new(AtomicU64::new(0));
        let spec = spec.clone();
        let receiver = {
            let done_at = done_at.clone();
            let (payload, drain, sent) = (spec.payload, spec.drain, spec.packets);
            std::thread::spawn(move || receive(rx, payload, drain, sent, &done_at))
        };
        let payload = spec.payload;
        let sender = std::thread::spawn(move || {
            let result = send(&tx, &spec);
            done_at.store(now_ns(), Ordering::SeqCst);
            result
        });
        Ok(Stream { sender, receiver, payload })
    }

    pub fn finish(self) -> anyhow::Result<StreamResult> {
        let (sent, send_errors, send_elapsed) = self.sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))?;
        let Received { arrivals, corrupted, drops } =
            self.receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??;
        Ok(StreamResult {
            sent,
            payload: self.payload,
            arrivals,
            corrupted,
            send_errors,
            receiver_drops: drops,
            send_elapsed,
        })
    }
}

/// Starts a stream and waits for it.
pub fn stream(pair: &VethPair, destination: Ipv4Addr, port: u16, spec: &StreamSpec) -> anyhow::Result<StreamResult> {
    Stream::start(pair, destination, port, spec)?.finish()
}

fn send(socket: &UdpSocket, spec: &StreamSpec) -> (u32, u32, Duration) {
    let mut buf = vec![0u8; spec.payload];
    let start = Instant::now();
    let mut errors = 0;
    for seq in 0..spec.packets {
        let due = start + spec.interval * seq;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        buf[0..4].copy_from_slice(&seq.to_le_bytes());
        buf[4..8].copy_from_slice(&spec.packets.to_le_bytes());
        buf[8..16].copy_from_slice(&now_ns().to_le_bytes());
        for (i, b) in buf[HEADER..spec.payload - TRAILER].iter_mut().enumerate() {
            *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
        }
        let sum = fnv1a(&buf[..spec.payload - TRAILER]);
        let n = spec.payload;
        buf[n - TRAILER..].copy_from_slice(&sum.to_le_bytes());
        if socket.send(&buf).is_err() {
            errors += 1;
        }
    }
    (spec.packets, errors, start.elapsed())
}

/// What the receiving end of a stream saw.
struct Received {
    arrivals: Vec<Arrival>,
    corrupted: u32,
    /// The socket's own drops (its queue full).
    drops: u32,
}

/// `SK_MEMINFO_DROPS` of `socket` (`SO_MEMINFO`, include/uapi/linux/sock_diag.h): datagrams its queue refused.
fn socket_drops(socket: &impl AsRawFd) -> anyhow::Result<u32> {
    const SO_MEMINFO: libc::c_int = 55;
    const SK_MEMINFO_DROPS: usize = 8;
    let mut info = [0u32; 9];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a live local array of the size passed in `len`, which is live too; the kernel writes at
    // most `len` bytes and updates it.
    let rc = unsafe {
        libc::getsockopt(socket.as_raw_fd(), libc::SOL_SOCKET, SO_MEMINFO, info.as_mut_ptr().cast(), &mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("getsockopt(SO_MEMINFO)");
    }
    Ok(info[SK_MEMINFO_DROPS])
}

fn receive(
    socket: UdpSocket,
    payload: usize,
    drain: Duration,
    sent: u32,
    done_at: &AtomicU64,
) -> anyhow::Result<Received> {
    let mut buf = vec![0u8; 65536];
    let mut arrivals = Vec::new();
    let mut corrupted = 0;
    loop {
        let done = done_at.load(Ordering::SeqCst);
        if done != 0 && now_ns() > done + drain.as_nanos() as u64 {
            break;
        }
        match socket.recv(&mut buf) {
            Ok(n) => {
                let received_ns = now_ns();
                let p = &buf[..n];
                let intact = n == payload && fnv1a(&p[..n - TRAILER]).to_le_bytes() == p[n - TRAILER..];
                let seq = u32::from_le_bytes(p[0..4].try_into().unwrap_or_default());
                if intact && seq < sent {
                    let sent_ns = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
                    arrivals.push(Arrival { seq, sent_ns, received_ns });
                } else {
                    corrupted += 1;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(e) => return Err(e).context("receiving the test stream"),
        }
    }
    Ok(Received { arrivals, corrupted, drops: socket_drops(&socket)? })
}
