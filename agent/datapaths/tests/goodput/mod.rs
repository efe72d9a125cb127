//! TCP goodput as the receiver sees it in steady state, and the check that a shaped flow gets its rate. Shared by
//! the datapath and agent tests so that both judge a shaper the same way.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// TCP payload per Ethernet frame that TBF counts (qdisc_pkt_len: 14 Ethernet + 20 IPv4 + 32 TCP with
/// timestamps + 1448 payload = 1514 bytes; GSO packets are counted per segment): the share of a shaped rate
/// that TCP goodput can reach. 10 Mbit/s on the wire is 9.56 Mbit/s of payload.
pub const TCP_PAYLOAD_SHARE: f64 = 1448.0 / 1514.0;

const TRANSFER: Duration = Duration::from_secs(3);
/// Slow start, the first burst out of the sender's socket buffer and the shaper's initial bucket all fall before
/// this; the end of the transfer falls after [`WINDOW_END`].
const WINDOW_START: Duration = Duration::from_millis(500);
const WINDOW_END: Duration = Duration::from_millis(2900);

/// Bulk transfer of about 3 s from `sender` to the peer accepted on `listener` (both already created in their
/// namespaces), in bit/s of payload, counted at the receiver between 0.5 s and 2.9 s after the first byte.
/// Reader stalls on a busy machine can only lower the figure; nothing can raise it above what the path delivers.
pub fn steady_goodput_bps(listener: TcpListener, sender: TcpStream) -> f64 {
    let (mut receiver, _) = listener.accept().unwrap();
    receiver.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    sender.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let writer = std::thread::spawn(move || {
        let mut sender = sender;
        let chunk = vec![0x5a_u8; 64 * 1024];
        let start = Instant::now();
        while start.elapsed() < TRANSFER {
            match sender.write(&chunk) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => break,
            }
        }
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    let (mut mark, mut last) = (None, None);
    let deadline = Instant::now() + TRANSFER + Duration::from_secs(2);
    while Instant::now() < deadline {
        let n = match receiver.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n as u64,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                continue;
            }
            Err(e) => panic!("receive: {e}"),
        };
        let now = Instant::now();
        let elapsed = now - *first.get_or_insert(now);
        total += n;
        // The read that crosses the window's start may carry bytes that piled up during a reader stall before
        // it: they belong before the mark.
        if elapsed >= WINDOW_START && mark.is_none() {
            mark = Some((now, total));
        }
        if elapsed > WINDOW_END {
            break;
        }
        last = Some((now, total));
    }
    drop(receiver);
    writer.join().unwrap();
    let ((t0, b0), (t1, b1)) = (mark.expect("no data 0.5 s after the first byte"), last.expect("no data"));
    // A flow stalled from before the window to after it (a retransmission timeout backed off) read nothing in it.
    if t1 <= t0 {
        return 0.0;
    }
    (b1 - b0) as f64 * 8.0 / (t1 - t0).as_secs_f64()
}

/// Asserts that a flow shaped to `rate_bps` (on the wire) gets that rate, and returns the best measurement. The
/// shaper never gives more than its rate, so every attempt must stay under it (5 % for timing); TCP can give
/// less (a retransmission timeout after a tail drop idles the link for 200 ms, more likely on a shared 2-core
/// machine), so one of up to three attempts must come within 15 % of it.
pub fn assert_shaped(what: &str, rate_bps: f64, measure: impl FnMut() -> f64) -> f64 {
    assert_rate_within(what, rate_bps, 0.15, measure)
}

/// [`assert_shaped`] with the shortfall one of the three attempts may have (a share of the rate).
pub fn assert_rate_within(what: &str, rate_bps: f64, shortfall: f64, mut measure: impl FnMut() -> f64) -> f64 {
    let expected = rate_bps * TCP_PAYLOAD_SHARE;
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let got = measure();
        eprintln!("{what}: {:.3} Mbit/s (payload ceiling {:.3})", got / 1e6, expected / 1e6);
        assert!(
            got < expected * 1.05,
            "{what}: {:.2} Mbit/s exceeds the shaped {:.2} Mbit/s",
            got / 1e6,
            expected / 1e6
        );
        attempts.push(got);
        if got > expected * (1.0 - shortfall) {
            return got;
        }
    }
    panic!(
        "{what}: goodput {:?} Mbit/s, expected {:.2} Mbit/s (-{:.0} %/+5 %)",
        attempts.iter().map(|a| (a / 1e5).round() / 10.0).collect::<Vec<_>>(),
        expected / 1e6,
        shortfall * 100.0
    );
}
