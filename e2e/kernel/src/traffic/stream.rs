//! A UDP stream from one namespace to a destination in the other, and what its receiver saw.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use isthmus_test_kit::bursts;

use super::{HEADER, TRAILER, enter, fnv1a, now_ns, set_int_opt};
use crate::netns::{SOURCE_ADDR, VethPair};
use crate::stats::Summary;

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

#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub seq: u32,
    pub sent_ns: u64,
    pub received_ns: u64,
}

impl Arrival {
    pub fn delay_ms(&self) -> f64 {
        (self.received_ns as f64 - self.sent_ns as f64) / 1e6
    }
}

#[derive(Debug, Default)]
pub struct StreamResult {
    pub sent: u32,
    pub payload: usize,
    /// Intact datagrams in arrival order (duplicates included).
    pub arrivals: Vec<Arrival>,
    pub corrupted: u32,
    pub send_errors: u32,
    /// Datagrams the receiving socket's kernel queue dropped (`SK_MEMINFO_DROPS`): lost at the receiver, not on
    /// the link.
    pub receiver_drops: u32,
    /// From the first send to the last: a guest starved of CPU sends slower than asked.
    pub send_elapsed: Duration,
}

impl StreamResult {
    pub fn delays_ms(&self) -> Vec<f64> {
        self.first_arrivals().iter().map(Arrival::delay_ms).collect()
    }

    pub fn delay(&self) -> anyhow::Result<Summary> {
        Summary::of(&self.delays_ms()).context("no packet arrived")
    }

    /// The first intact copy of every sequence number that arrived.
    pub fn first_arrivals(&self) -> Vec<Arrival> {
        let mut seen = vec![false; self.sent as usize];
        self.arrivals
            .iter()
            .filter(|a| {
                let s = &mut seen[a.seq as usize];
                !std::mem::replace(s, true)
            })
            .copied()
            .collect()
    }

    pub fn unique_received(&self) -> usize {
        self.first_arrivals().len()
    }

    pub fn lost(&self) -> usize {
        self.sent as usize - self.unique_received()
    }

    pub fn loss_ratio(&self) -> f64 {
        self.lost() as f64 / f64::from(self.sent.max(1))
    }

    pub fn duplicates(&self) -> usize {
        self.arrivals.len() - self.unique_received()
    }

    pub fn duplicate_ratio(&self) -> f64 {
        self.duplicates() as f64 / f64::from(self.sent.max(1))
    }

    pub fn corrupt_ratio(&self) -> f64 {
        f64::from(self.corrupted) / f64::from(self.sent.max(1))
    }

    /// Arrivals that came after a packet sent later than them.
    pub fn out_of_order(&self) -> usize {
        let mut highest = None;
        let mut late = 0;
        for a in self.first_arrivals() {
            match highest {
                Some(h) if a.seq < h => late += 1,
                _ => highest = Some(a.seq),
            }
        }
        late
    }

    /// Lengths of the runs of consecutive lost sequence numbers.
    pub fn loss_bursts(&self) -> Vec<usize> {
        let mut got = vec![false; self.sent as usize];
        for a in &self.arrivals {
            got[a.seq as usize] = true;
        }
        bursts::runs(got)
    }

    /// Payload bits per second the sender managed to offer.
    pub fn offered_bps(&self) -> f64 {
        (u64::from(self.sent) * self.payload as u64 * 8) as f64 / self.send_elapsed.as_secs_f64().max(1e-9)
    }

    /// Payload bits per second at the receiver, over the arrivals after `skip` of the stream (to leave out a
    /// token bucket's initial burst).
    pub fn goodput_bps(&self, skip: Duration) -> Option<f64> {
        let first = self.arrivals.first()?.received_ns + skip.as_nanos() as u64;
        let window: Vec<&Arrival> = self.arrivals.iter().filter(|a| a.received_ns >= first).collect();
        if window.len() < 10 {
            return None;
        }
        let span = (window.last()?.received_ns - window[0].received_ns) as f64 / 1e9;
        Some(((window.len() - 1) * self.payload * 8) as f64 / span)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(seq: u32, delay_ms: u64) -> Arrival {
        Arrival {
            seq,
            sent_ns: u64::from(seq) * 1_000_000,
            received_ns: u64::from(seq) * 1_000_000 + delay_ms * 1_000_000,
        }
    }

    fn result(sent: u32, seqs: &[u32]) -> StreamResult {
        StreamResult {
            sent,
            payload: 100,
            arrivals: seqs.iter().map(|s| arrival(*s, 5)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn loss_duplicates_and_order_from_sequence_numbers() {
        // 10 sent; 3, 4 and 8 lost; 5 duplicated; 7 arrives before 6
        let r = result(10, &[0, 1, 2, 5, 5, 7, 6, 9]);
        assert_eq!(r.unique_received(), 7);
        assert_eq!(r.lost(), 3);
        assert_eq!(r.duplicates(), 1);
        assert_eq!(r.out_of_order(), 1);
        assert_eq!(r.loss_bursts(), vec![2, 1]);
        assert!((r.loss_ratio() - 0.3).abs() < 1e-9);
        assert!((r.duplicate_ratio() - 0.1).abs() < 1e-9);
    }

    #[test]
    fn delays_count_each_sequence_number_once() {
        let mut r = result(3, &[0, 1, 2]);
        r.arrivals.push(arrival(1, 50));
        assert_eq!(r.delays_ms(), vec![5.0, 5.0, 5.0]);
    }

    #[test]
    fn goodput_skips_the_start_and_counts_payload_bits() {
        // 1000-byte payloads every ms for 100 ms: 8 Mbit/s
        let arrivals = (0..100u32).map(|s| arrival(s, 1)).collect();
        let r = StreamResult { sent: 100, payload: 1000, arrivals, ..Default::default() };
        let bps = r.goodput_bps(Duration::from_millis(20)).unwrap();
        assert!((bps - 8e6).abs() < 1.0, "{bps}");
    }
}
