//! Bounded traffic between the test namespaces and what it measures.
//!
//! Both ends run in the same guest kernel, so a sender timestamp in the payload gives the exact one-way
//! delay (no return path to subtract). Every datagram carries a sequence number and a checksum over its
//! whole payload, so one stream yields delay, loss, duplication, corruption and reordering.
//! Every loop here is bounded in packets and in time.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::netns::{Link, SOURCE_ADDR};
use crate::stats::Summary;

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
        let mut bursts = Vec::new();
        let mut run = 0;
        for g in got {
            if g {
                if run > 0 {
                    bursts.push(run);
                }
                run = 0;
            } else {
                run += 1;
            }
        }
        if run > 0 {
            bursts.push(run);
        }
        bursts
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
    pub fn start(link: &Link, destination: Ipv4Addr, port: u16, spec: &StreamSpec) -> anyhow::Result<Stream> {
        if spec.payload < HEADER + TRAILER {
            bail!("payload of {} bytes cannot hold the stream header", spec.payload);
        }
        let to = SocketAddrV4::new(destination, port);
        let rx = link.b.enter(move || {
            let s = UdpSocket::bind(to).with_context(|| format!("binding {to}"))?;
            // root in the guest: force a receive buffer that holds a whole bounded test stream
            set_int_opt(&s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20)?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            Ok(s)
        })?;
        let no_check = spec.no_udp_checksum;
        let tx = link.a.enter(move || {
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
pub fn stream(link: &Link, destination: Ipv4Addr, port: u16, spec: &StreamSpec) -> anyhow::Result<StreamResult> {
    Stream::start(link, destination, port, spec)?.finish()
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

/// The guest's CPU time, all CPUs together (`/proc/stat`'s first line, in clock ticks).
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    busy: u64,
    total: u64,
}

impl CpuTimes {
    pub fn now() -> anyhow::Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        CpuTimes::parse(stat.lines().next().context("an empty /proc/stat")?)
    }

    /// From `/proc/stat`'s `cpu` line.
    fn parse(line: &str) -> anyhow::Result<CpuTimes> {
        let ticks = line
            .split_whitespace()
            .skip(1)
            .map(|t| t.parse::<u64>().with_context(|| format!("/proc/stat's cpu line {line:?}")))
            .collect::<anyhow::Result<Vec<u64>>>()?;
        // user nice system idle iowait …: idle and iowait are the CPU's own waiting
        let waiting = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        let total = ticks.iter().sum::<u64>();
        Ok(CpuTimes { busy: total - waiting, total })
    }

    /// The busy share (0–1) of the CPU time since `earlier`.
    pub fn busy_since(&self, earlier: CpuTimes) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 { 0.0 } else { self.busy.saturating_sub(earlier.busy) as f64 / total as f64 }
    }
}

/// Packets the kernel dropped from its per-CPU input backlogs (`/proc/net/softnet_stat`, second column, all
/// CPUs): what a veth hands on faster than the receiving side takes it. The whole guest's, not one namespace's.
pub fn backlog_drops() -> anyhow::Result<u64> {
    let table = std::fs::read_to_string("/proc/net/softnet_stat").context("reading /proc/net/softnet_stat")?;
    table
        .lines()
        .map(|line| {
            let column = line.split_whitespace().nth(1).context("softnet_stat line without a drop column")?;
            u64::from_str_radix(column, 16).with_context(|| format!("softnet_stat drop column {column:?}"))
        })
        .sum()
}

/// TCP bulk transfer from `a` to a destination in `b` for a bounded time.
pub struct Bulk {
    client: JoinHandle<anyhow::Result<u64>>,
    server: JoinHandle<anyhow::Result<(u64, Duration)>>,
}

#[derive(Debug, Clone, Copy)]
pub struct BulkResult {
    pub bytes: u64,
    pub goodput_bps: f64,
}

impl Bulk {
    pub fn start(link: &Link, destination: Ipv4Addr, port: u16, duration: Duration) -> anyhow::Result<Bulk> {
        let at = SocketAddrV4::new(destination, port);
        let listener = link.b.enter(move || {
            let l = TcpListener::bind(at).with_context(|| format!("listening on {at}"))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        let deadline = Instant::now() + duration + Duration::from_secs(10);
        let server = std::thread::spawn(move || -> anyhow::Result<(u64, Duration)> {
            let mut conn = loop {
                match listener.accept() {
                    Ok((c, _)) => break c,
                    Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => return Err(e).context("accepting the bulk connection"),
                }
            };
            conn.set_nonblocking(false)?;
            conn.set_read_timeout(Some(Duration::from_millis(200)))?;
            let mut buf = vec![0u8; 1 << 16];
            let (mut bytes, mut first, mut last) = (0u64, None, Instant::now());
            while Instant::now() < deadline {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        first.get_or_insert_with(Instant::now);
                        last = Instant::now();
                        bytes += n as u64;
                    }
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    }
                    Err(e) => return Err(e).context("reading the bulk stream"),
                }
            }
            Ok((bytes, first.map(|f| last - f).unwrap_or_default()))
        });
        let client_ns = link.a.enter(move || {
            let s = TcpStream::connect_timeout(&at.into(), Duration::from_secs(5))
                .with_context(|| format!("connecting to {at}"))?;
            s.set_write_timeout(Some(Duration::from_millis(100)))?;
            Ok(s)
        });
        let mut conn = match client_ns {
            Ok(c) => c,
            Err(e) => {
                let _ = server.join();
                return Err(e);
            }
        };
        let client = std::thread::spawn(move || -> anyhow::Result<u64> {
            let buf = vec![0x5au8; 1 << 16];
            let end = Instant::now() + duration;
            let mut written = 0u64;
            while Instant::now() < end {
                match conn.write(&buf) {
                    Ok(n) => written += n as u64,
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    }
                    Err(e) => return Err(e).context("writing the bulk stream"),
                }
            }
            // unsent data is dropped with the socket: the server counts what arrived
            let _ = conn.shutdown(std::net::Shutdown::Both);
            Ok(written)
        });
        Ok(Bulk { client, server })
    }

    pub fn finish(self) -> anyhow::Result<BulkResult> {
        self.client.join().map_err(|_| anyhow::anyhow!("bulk client panicked"))??;
        let (bytes, span) = self.server.join().map_err(|_| anyhow::anyhow!("bulk server panicked"))??;
        let goodput_bps = if span.is_zero() { 0.0 } else { bytes as f64 * 8.0 / span.as_secs_f64() };
        Ok(BulkResult { bytes, goodput_bps })
    }
}

/// UDP datagrams of `payload` bytes from `a` to each of `destinations` in turn for `duration`, at most
/// `max_packets` spread evenly over it (as fast as the sender can where it cannot keep up); nobody receives them. Returns the datagrams handed to the
/// kernel (a qdisc's drop is not a send error for UDP). The socket never blocks and its send buffer is 64 MiB:
/// packets a TBF holds stay charged to it (netem's are not), and a full buffer would pace the whole flood to the
/// slowest destination.
pub fn flood(
    link: &Link,
    destinations: &[Ipv4Addr],
    port: u16,
    payload: usize,
    duration: Duration,
    max_packets: u64,
) -> anyhow::Result<u64> {
    let socket = link.a.enter(|| {
        let s = UdpSocket::bind(SocketAddrV4::new(SOURCE_ADDR, 0))?;
        set_int_opt(&s, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 64 << 20)?;
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

    #[test]
    fn cpu_busy_share_leaves_out_idle_and_iowait() {
        let before = CpuTimes::parse("cpu  100 0 50 800 50 0 0 0 0 0").expect("a cpu line");
        let after = CpuTimes::parse("cpu  160 0 70 900 70 0 0 0 0 0").expect("a cpu line");
        // 80 busy ticks (user 60, system 20) of 200
        assert!((after.busy_since(before) - 0.4).abs() < 1e-9);
        assert_eq!(before.busy_since(before), 0.0);
        assert!(CpuTimes::parse("cpu  1 x 3").is_err());
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

    #[test]
    fn checksum_detects_a_flipped_bit() {
        let mut data = vec![7u8; 64];
        let sum = fnv1a(&data);
        data[40] ^= 0x10;
        assert_ne!(fnv1a(&data), sum);
    }
}
