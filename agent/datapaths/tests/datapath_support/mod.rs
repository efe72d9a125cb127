//! Throwaway network namespaces for the datapath's host-kernel tests and benchmarks (and the agent's
//! `explain_host.rs`, which includes this file by path): two namespaces joined by a veth (the test kit's
//! `VethPair`, which the kernel rig's guest tests use too), set up with iproute2 (an independent tool; the
//! product itself never shells out), removed on drop — also when a test fails. Traffic only ever flows between
//! addresses inside these namespaces, bounded in time.

#![allow(dead_code)]

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use isthmus_datapaths::datapath::Datapath;

#[path = "../goodput/mod.rs"]
pub mod goodput;
use isthmus_test_kit::netns::{self, VethPair};

pub fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Runs a command, panicking with its output when it fails.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tc ARGS` inside namespace `ns`.
pub fn tc(ns: &str, args: &[&str]) -> String {
    let mut full = vec!["ip", "netns", "exec", ns, "tc"];
    full.extend_from_slice(args);
    run(&full)
}

/// Runs `f` on a thread inside namespace `ns`; sockets it creates stay in `ns` afterwards.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let file = File::open(format!("/run/netns/{ns}")).unwrap();
    netns::run_in(file.as_fd(), f).unwrap()
}

/// Namespaces `a` (10.77.0.1, fd77::1 on `va`) and `b` (10.77.0.2, .3, fd77::2, ::3 on `vb`), by name.
pub struct Pair {
    pub a: String,
    pub b: String,
    /// Holds both namespaces; deletes them when the pair goes.
    veth: VethPair,
}

impl Pair {
    pub fn new(tag: &str) -> Pair {
        assert!(nix::unistd::geteuid().is_root(), "the datapath host-kernel tests need root (CI runs as root)");
        let addr = |a: &str, prefix| (a.parse().unwrap(), prefix);
        let veth = VethPair::new(
            &format!("isth-dp-{tag}-{}", std::process::id()),
            &[addr("10.77.0.1", 24), addr("fd77::1", 64)],
            &[addr("10.77.0.2", 24), addr("10.77.0.3", 24), addr("fd77::2", 64), addr("fd77::3", 64)],
        )
        .unwrap();
        Pair { a: veth.a.name().to_owned(), b: veth.b.name().to_owned(), veth }
    }

    pub async fn datapath(&self) -> Datapath {
        let file = File::open(format!("/run/netns/{}", self.a)).unwrap();
        Datapath::open(file.as_fd()).await.unwrap()
    }

    /// Steady-state TCP goodput from `a` to `dst` in bit/s: see [`goodput::steady_goodput_bps`].
    pub fn tcp_goodput_bps(&self, dst: IpAddr, port: u16) -> f64 {
        let listener = in_netns(&self.b, || TcpListener::bind((dst, port))).unwrap();
        let sender =
            in_netns(&self.a, || TcpStream::connect_timeout(&(dst, port).into(), Duration::from_secs(2))).unwrap();
        goodput::steady_goodput_bps(listener, sender)
    }

    /// TCP goodput from `a` to `dst` in bit/s for a transfer of exactly `bytes`, timed at the sender from the
    /// connection to the receiver's acknowledgement of end-of-stream. Reader stalls can only lower the figure;
    /// only a shaper's initial bucket can raise it (a few kB out of megabytes).
    pub fn tcp_transfer_bps(&self, dst: IpAddr, port: u16, bytes: u64) -> f64 {
        let listener = in_netns(&self.b, || TcpListener::bind((dst, port))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let receiver = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut received = 0u64;
            while Instant::now() < deadline {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => received += n as u64,
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    }
                    Err(e) => panic!("receive: {e}"),
                }
            }
            conn.write_all(&[1]).unwrap();
            received
        });
        let start = Instant::now();
        let mut sender =
            in_netns(&self.a, || TcpStream::connect_timeout(&(dst, port).into(), Duration::from_secs(2))).unwrap();
        sender.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
        let chunk = vec![0x5a_u8; 64 * 1024];
        let mut sent = 0u64;
        while sent < bytes && Instant::now() < deadline {
            let len = chunk.len().min((bytes - sent) as usize);
            match sender.write(&chunk[..len]) {
                Ok(n) => sent += n as u64,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        sender.shutdown(std::net::Shutdown::Write).unwrap();
        sender
            .set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
            .unwrap();
        let mut ack = [0u8; 1];
        sender.read_exact(&mut ack).expect("receiver's end-of-stream acknowledgement");
        let elapsed = start.elapsed();
        assert_eq!(receiver.join().unwrap(), bytes, "transfer incomplete within 30 s");
        bytes as f64 * 8.0 / elapsed.as_secs_f64()
    }

    /// Sends `count` small UDP datagrams from `a` to `dst` (port 9, discard) after resolving the neighbour, and
    /// waits until they have left the shaped queues.
    pub fn send_udp(&self, dst: IpAddr, count: usize) {
        let socket = in_netns(&self.a, || {
            let any: IpAddr = if dst.is_ipv4() { "0.0.0.0".parse().unwrap() } else { "::".parse().unwrap() };
            UdpSocket::bind((any, 0))
        })
        .unwrap();
        for _ in 0..count {
            socket.send_to(&[0u8; 100], (dst, 9)).unwrap();
            // Small pauses keep the first datagrams from overflowing the neighbour's unresolved queue.
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
