//! UDP round trips between test namespaces: an echo server and a prober, each on a socket the caller bound
//! inside its namespace. Bounded: the server stops when dropped (two minutes at most), each probe waits a set
//! time for its echo.

#![allow(dead_code)]

use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub const ECHO_PORT: u16 = 7007;
/// How long a probe waits for its echo: far beyond any round trip of these tests but a lost one.
pub const WAIT: Duration = Duration::from_millis(300);

/// Answers every datagram on its socket with the same bytes, until dropped.
pub struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    /// Serves on `socket` (bound by the caller, inside the destination's namespace, to port [`ECHO_PORT`]).
    pub fn serve(socket: UdpSocket) -> Echo {
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let until = Instant::now() + Duration::from_secs(120);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stopped.load(Ordering::Relaxed) && Instant::now() < until {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(&buf[..n], from);
                }
            }
        });
        Echo { stop, thread: Some(thread) }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Round trips (ms) of `count` numbered probes from `socket` (bound by the caller inside the source's
/// namespace) to `dst`, 5 ms apart; lost ones are `None`. Each probe waits at most `wait` for its echo.
pub fn round_trips(socket: UdpSocket, dst: IpAddr, count: u32, wait: Duration) -> Vec<Option<f64>> {
    socket.connect((dst, ECHO_PORT)).unwrap();
    socket.set_read_timeout(Some(wait)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 64];
    for n in 0..count {
        let sent = Instant::now();
        socket.send(&n.to_be_bytes()).unwrap();
        let mut rtt = None;
        while sent.elapsed() < wait {
            match socket.recv(&mut buf) {
                Ok(4) if buf[..4] == n.to_be_bytes() => {
                    rtt = Some(sent.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        out.push(rtt);
        std::thread::sleep(Duration::from_millis(5));
    }
    out
}

/// The median of the answered round trips (the test kit's nearest rank).
pub fn median(rtts: &[Option<f64>]) -> f64 {
    let v: Vec<f64> = rtts.iter().flatten().copied().collect();
    assert!(!v.is_empty(), "every probe was lost");
    isthmus_test_kit::stats::median(&v)
}

/// As [`round_trips`], but sent on a fixed schedule (`interval` apart) without waiting for the echoes, so that
/// many are in flight at once; each echo counts if it comes within `wait` of the last send.
pub fn pipelined_round_trips(
    socket: UdpSocket,
    dst: IpAddr,
    count: u32,
    interval: Duration,
    wait: Duration,
) -> Vec<Option<f64>> {
    socket.connect((dst, ECHO_PORT)).unwrap();
    let receiver = socket.try_clone().unwrap();
    let start = Instant::now();
    let sends: Vec<Duration> = (0..count).map(|n| interval * n).collect();
    let deadline = start + sends.last().copied().unwrap_or_default() + wait;
    let listen = std::thread::spawn(move || {
        let mut arrivals = vec![None; count as usize];
        let mut buf = [0u8; 64];
        while Instant::now() < deadline {
            receiver
                .set_read_timeout(Some(
                    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)),
                ))
                .unwrap();
            if let Ok(4) = receiver.recv(&mut buf) {
                let n = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if n < arrivals.len() && arrivals[n].is_none() {
                    arrivals[n] = Some(start.elapsed());
                }
            }
        }
        arrivals
    });
    for (n, at) in sends.iter().enumerate() {
        std::thread::sleep((start + *at).saturating_duration_since(Instant::now()));
        socket.send(&(n as u32).to_be_bytes()).unwrap();
    }
    let arrivals = listen.join().unwrap();
    // Round trips from the scheduled send time: a late send only lengthens them.
    arrivals.iter().zip(&sends).map(|(a, s)| a.map(|a| a.saturating_sub(*s).as_secs_f64() * 1000.0)).collect()
}
