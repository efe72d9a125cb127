//! The round-trip prober: sequence-numbered, timestamped probes at a fixed interval, echoed back.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::error::{Context, ProbeError, Result};
use crate::stats::{ReplyKind, RttSummary, SequenceTracker, bursts_json};
use crate::wire::{HEADER_LEN, MAX_FRAME_LEN, Probe, fill_padding, padding_intact};

/// Probe bytes a TCP run may have sent and not yet seen echoed.
const TCP_BYTES_IN_FLIGHT: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
        }
    }
}

pub struct RttOptions {
    pub target: SocketAddr,
    pub proto: Proto,
    pub count: u64,
    pub interval: Duration,
    pub timeout: Duration,
    pub size: usize,
    /// Report every probe: when it was sent (ms after the first) and its round trip (null if lost).
    pub samples: bool,
    /// Send UDP without a checksum (IPv4), so a corrupted probe reaches the echo instead of being dropped by the
    /// first kernel that checks it; corrupted replies are then counted (`corrupted`).
    pub no_udp_checksum: bool,
}

/// Sends and receives whole probe frames.
trait Transport {
    fn send(&mut self, frame: &[u8]) -> Result<()>;
    /// The next frame received before `deadline`, or None when the deadline passed first.
    fn recv(&mut self, deadline: Instant) -> Result<Option<&[u8]>>;
}

struct UdpTransport {
    socket: UdpSocket,
    buf: Vec<u8>,
    len: usize,
}

impl Transport for UdpTransport {
    fn send(&mut self, frame: &[u8]) -> Result<()> {
        match self.socket.send(frame) {
            Ok(_) => Ok(()),
            // An earlier ICMP error (nothing listening yet, unreachable) surfaces on a later send:
            // this probe is lost, which is what the run reports.
            Err(e) if is_lossy(&e) => Ok(()),
            Err(e) => Err(e).context(|| "sending a UDP probe".into()),
        }
    }

    fn recv(&mut self, deadline: Instant) -> Result<Option<&[u8]>> {
        loop {
            let Some(wait) = remaining(deadline) else {
                return Ok(None);
            };
            self.socket.set_read_timeout(Some(wait)).context(|| "setting the UDP read timeout".into())?;
            match self.socket.recv(&mut self.buf) {
                Ok(len) => {
                    self.len = len;
                    return Ok(Some(&self.buf[..self.len]));
                }
                Err(e) if is_timeout(&e) || is_lossy(&e) => continue,
                Err(e) => return Err(e).context(|| "receiving a UDP reply".into()),
            }
        }
    }
}

struct TcpTransport {
    stream: TcpStream,
    frame_len: usize,
    /// Bytes received and not yet handed out; at most one partial frame plus one read.
    pending: Vec<u8>,
    frame: Vec<u8>,
    read_buf: Vec<u8>,
}

impl Transport for TcpTransport {
    fn send(&mut self, frame: &[u8]) -> Result<()> {
        self.stream.write_all(frame).context(|| "sending a TCP probe".into())
    }

    fn recv(&mut self, deadline: Instant) -> Result<Option<&[u8]>> {
        while self.pending.len() < self.frame_len {
            let Some(wait) = remaining(deadline) else {
                return Ok(None);
            };
            self.stream.set_read_timeout(Some(wait)).context(|| "setting the TCP read timeout".into())?;
            match self.stream.read(&mut self.read_buf) {
                Ok(0) => return Err(ProbeError::new("the echo server closed the TCP connection")),
                Ok(n) => self.pending.extend_from_slice(&self.read_buf[..n]),
                Err(e) if is_timeout(&e) => continue,
                Err(e) => return Err(e).context(|| "receiving a TCP echo".into()),
            }
        }
        self.frame.clear();
        self.frame.extend(self.pending.drain(..self.frame_len));
        Ok(Some(&self.frame))
    }
}

pub fn validate(options: &RttOptions) -> Result<()> {
    if options.count == 0 || options.count > 1_000_000 {
        return Err(ProbeError::new(format!("--count {}: must be between 1 and 1000000", options.count)));
    }
    if options.interval > Duration::from_secs(60) {
        return Err(ProbeError::new("--interval-ms: must be at most 60000"));
    }
    if options.timeout.is_zero() || options.timeout > Duration::from_secs(60) {
        return Err(ProbeError::new("--timeout-ms: must be between 1 and 60000"));
    }
    if options.size < HEADER_LEN || options.size > MAX_FRAME_LEN {
        return Err(ProbeError::new(format!(
            "--size {}: must be between {HEADER_LEN} (the probe header) and {MAX_FRAME_LEN}",
            options.size
        )));
    }
    Ok(())
}

/// Runs the probes and returns the JSON report. Takes at most
/// connect + count × interval + timeout (plus scheduling slack).
pub fn run(options: &RttOptions) -> Result<Value> {
    validate(options)?;
    let target = options.target;
    let mut transport: Box<dyn Transport> = match options.proto {
        Proto::Udp => {
            let local: SocketAddr =
                if target.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
            let socket = UdpSocket::bind(local).context(|| "binding a UDP socket".into())?;
            socket.connect(target).context(|| format!("setting the UDP peer {target}"))?;
            if options.no_udp_checksum {
                crate::sockopt::disable_udp_checksum(&socket)?;
            }
            Box::new(UdpTransport { socket, buf: vec![0; MAX_FRAME_LEN], len: 0 })
        }
        Proto::Tcp => {
            let stream = TcpStream::connect_timeout(&target, options.timeout.max(Duration::from_secs(5)))
                .context(|| format!("connecting to the TCP echo at {target}"))?;
            stream.set_nodelay(true).context(|| "setting TCP_NODELAY".into())?;
            stream
                .set_write_timeout(Some(options.timeout.max(Duration::from_secs(5))))
                .context(|| "setting the TCP write timeout".into())?;
            Box::new(TcpTransport {
                stream,
                frame_len: options.size,
                pending: Vec::with_capacity(2 * options.size),
                frame: Vec::with_capacity(options.size),
                read_buf: vec![0; options.size],
            })
        }
    };

    // Over TCP the echo comes back on the same stream: if the prober sent without reading, both
    // sides' buffers would fill and each would wait on the other. Bounding the bytes in flight
    // keeps back-to-back runs (interval 0) safe; UDP needs no bound, excess datagrams just drop.
    let window = match options.proto {
        Proto::Tcp => (TCP_BYTES_IN_FLIGHT / options.size as u64).max(1),
        Proto::Udp => u64::MAX,
    };
    let run_id = run_id();
    let mut tracker = SequenceTracker::new(options.count);
    let mut samples_ms = Vec::with_capacity(options.count as usize);
    // per sequence number: (sent, ms after start; round trip in ms when answered in time)
    let mut per_probe: Vec<(f64, Option<f64>)> = Vec::with_capacity(options.count as usize);
    // first replies whose padding changed on the way
    let mut corrupted = 0u64;
    let mut frame = vec![0u8; options.size];
    let start = Instant::now();
    // This machine's wall clock at the first probe, for lining the samples up with other events on it.
    let started_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut next_send = start;
    let mut last_send = start;

    loop {
        let now = Instant::now();
        let window_full = tracker.outstanding() >= window;
        if tracker.sent() < options.count && now >= next_send && !window_full {
            let seq = tracker.record_sent();
            Probe { run_id, seq, sent_ns: nanos_since(start, now) }.encode(&mut frame);
            fill_padding(&mut frame, seq);
            per_probe.push((nanos_since(start, now) as f64 / 1e6, None));
            transport.send(&frame)?;
            last_send = now;
            // A fixed schedule: a late send does not push the later ones back, so the run's length
            // stays count × interval.
            next_send += options.interval;
            continue;
        }
        let all_sent = tracker.sent() == options.count;
        let wait_until = if all_sent {
            last_send + options.timeout
        } else if window_full {
            now + options.timeout
        } else {
            next_send
        };
        if all_sent && (now >= wait_until || tracker.received() == options.count) {
            break;
        }
        let Some(reply) = transport.recv(wait_until)? else {
            if window_full && !all_sent {
                return Err(ProbeError::new(format!(
                    "no TCP echo from {target} within --timeout-ms {} while {} probes were outstanding",
                    options.timeout.as_millis(),
                    tracker.outstanding()
                )));
            }
            continue;
        };
        let arrived = Instant::now();
        let Some(probe) = Probe::decode(reply, run_id) else {
            continue;
        };
        let intact = padding_intact(reply, probe.seq);
        let rtt = Duration::from_nanos(nanos_since(start, arrived).saturating_sub(probe.sent_ns));
        let kind = tracker.record_reply(probe.seq, rtt <= options.timeout);
        if !intact && matches!(kind, ReplyKind::Fresh { .. } | ReplyKind::Late) {
            corrupted += 1;
        }
        if let ReplyKind::Fresh { .. } = kind {
            samples_ms.push(rtt.as_secs_f64() * 1000.0);
            per_probe[probe.seq as usize].1 = Some(rtt.as_secs_f64() * 1000.0);
        }
    }

    let summary = RttSummary::from_samples(&samples_ms);
    let mut report = json!({
        "proto": options.proto.name(),
        "started_unix_ms": started_unix_ms,
        "target": target.to_string(),
        "size": options.size,
        "interval_ms": options.interval.as_secs_f64() * 1000.0,
        "timeout_ms": options.timeout.as_secs_f64() * 1000.0,
        "sent": tracker.sent(),
        "received": tracker.received(),
        "lost": tracker.lost(),
        "late": tracker.late(),
        "loss_ratio": tracker.loss_ratio(),
        "duplicates": tracker.duplicates(),
        "reordered": tracker.reordered(),
        "corrupted": corrupted,
        "loss_bursts": bursts_json(tracker.loss_bursts()),
        "rtt_ms": RttSummary::to_json(summary.as_ref()),
    });
    if options.samples {
        let round = |ms: f64| (ms * 1000.0).round() / 1000.0;
        report["samples"] = per_probe.iter().map(|(at, rtt)| json!([round(*at), rtt.map(round)])).collect();
    }
    Ok(report)
}

fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    // set_read_timeout rejects zero; anything below a microsecond is "now".
    (left >= Duration::from_micros(1)).then_some(left)
}

fn nanos_since(start: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(start).as_nanos() as u64
}

/// Distinguishes this run's replies from stray ones (an earlier run's late echoes to a reused port).
fn run_id() -> u32 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    nanos ^ std::process::id().rotate_left(16)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted)
}

fn is_lossy(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable
    ) || e.raw_os_error() == Some(105) // ENOBUFS: the local queue is full, the probe is dropped.
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> RttOptions {
        RttOptions {
            target: "127.0.0.1:7000".parse().unwrap(),
            proto: Proto::Udp,
            count: 10,
            interval: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            size: 64,
            samples: false,
            no_udp_checksum: false,
        }
    }

    #[test]
    fn bad_options_are_rejected_naming_the_flag() {
        type BreakOption = fn(&mut RttOptions);
        let cases: [(BreakOption, &str); 4] = [
            (|o| o.count = 0, "--count"),
            (|o| o.size = HEADER_LEN - 1, "--size"),
            (|o| o.timeout = Duration::ZERO, "--timeout-ms"),
            (|o| o.interval = Duration::from_secs(61), "--interval-ms"),
        ];
        for (break_it, flag) in cases {
            let mut o = options();
            break_it(&mut o);
            let err = validate(&o).unwrap_err().to_string();
            assert!(err.contains(flag), "{err} should name {flag}");
        }
        assert!(validate(&options()).is_ok());
    }
}
