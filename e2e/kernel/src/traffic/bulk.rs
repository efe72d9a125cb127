//! TCP bulk from one namespace to the other for a bounded time.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::enter;
use crate::netns::VethPair;

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
    pub fn start(pair: &VethPair, destination: Ipv4Addr, port: u16, duration: Duration) -> anyhow::Result<Bulk> {
        let at = SocketAddrV4::new(destination, port);
        let listener = enter(&pair.b, move || {
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
        let client_ns = enter(&pair.a, move || {
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
