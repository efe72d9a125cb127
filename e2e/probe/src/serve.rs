//! The server side: UDP echo and TCP echo on one port, TCP bulk sink on the next port.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{Context, ProbeError, Result};
use crate::wire::MAX_FRAME_LEN;

pub struct ServeOptions {
    pub listen: SocketAddr,
    pub max_connections: usize,
    pub idle_timeout: Duration,
}

/// Port of the bulk sink for an echo address: the next port up.
pub fn sink_address(echo: SocketAddr) -> Result<SocketAddr> {
    let port = echo.port().checked_add(1).filter(|_| echo.port() != 0).ok_or_else(|| {
        ProbeError::new(format!("--listen {echo}: the port must be between 1 and 65534 (the bulk sink uses port + 1)"))
    })?;
    Ok(SocketAddr::new(echo.ip(), port))
}

/// Binds everything, prints one JSON line with the bound addresses, then serves until killed.
pub fn serve(options: ServeOptions) -> Result<()> {
    let sink_addr = sink_address(options.listen)?;
    let udp = UdpSocket::bind(options.listen).context(|| format!("binding UDP echo on {}", options.listen))?;
    let tcp = TcpListener::bind(options.listen).context(|| format!("binding TCP echo on {}", options.listen))?;
    let sink = TcpListener::bind(sink_addr).context(|| format!("binding TCP bulk sink on {sink_addr}"))?;

    let ready = json!({
        "udp_echo": options.listen.to_string(),
        "tcp_echo": options.listen.to_string(),
        "tcp_sink": sink_addr.to_string(),
    });
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{ready}").and_then(|_| stdout.flush()).context(|| "writing to stdout".into())?;
    drop(stdout);

    let connections = Arc::new(AtomicUsize::new(0));
    let udp_thread = spawn("udp-echo", move || udp_echo(udp));
    let echo_thread = {
        let connections = connections.clone();
        let idle = options.idle_timeout;
        let max = options.max_connections;
        spawn("tcp-echo", move || accept_loop(tcp, connections, max, move |s| tcp_echo(s, idle)))
    };
    let sink_thread = {
        let idle = options.idle_timeout;
        let max = options.max_connections;
        spawn("tcp-sink", move || accept_loop(sink, connections, max, move |s| tcp_sink(s, idle)))
    };
    // Each loop runs forever; whichever returns first returns an error that ends the server.
    for handle in [udp_thread, echo_thread, sink_thread] {
        match handle.join() {
            Ok(result) => result?,
            Err(_) => return Err(ProbeError::new("a server thread panicked")),
        }
    }
    Ok(())
}

fn spawn(name: &str, body: impl FnOnce() -> Result<()> + Send + 'static) -> thread::JoinHandle<Result<()>> {
    thread::Builder::new().name(name.into()).spawn(body).expect("spawning a server thread")
}

fn udp_echo(socket: UdpSocket) -> Result<()> {
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf) {
            Ok(received) => received,
            Err(e) if is_transient(&e) => continue,
            Err(e) => return Err(e).context(|| "receiving on the UDP echo socket".into()),
        };
        // A full socket buffer or an unreachable peer loses this reply only; the prober counts it.
        let _ = socket.send_to(&buf[..len], peer);
    }
}

/// Accepts connections and serves each on its own thread, refusing (closing) any beyond `max`
/// open connections so that a misbehaving client cannot exhaust threads or memory.
fn accept_loop(
    listener: TcpListener,
    open: Arc<AtomicUsize>,
    max: usize,
    handler: impl Fn(TcpStream) + Send + Sync + Clone + 'static,
) -> Result<()> {
    loop {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if is_transient(&e) || e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) => return Err(e).context(|| "accepting a TCP connection".into()),
        };
        if open.fetch_add(1, Ordering::SeqCst) >= max {
            open.fetch_sub(1, Ordering::SeqCst);
            eprintln!("isthmus-probe serve: refusing a connection: {max} already open (--max-connections)");
            continue;
        }
        let open = open.clone();
        let handler = handler.clone();
        let spawned = thread::Builder::new().name("tcp-conn".into()).spawn(move || {
            handler(stream);
            open.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            // The closure (and its stream) was dropped: the connection is closed.
            eprintln!("isthmus-probe serve: cannot start a thread for a connection");
        }
    }
}

fn tcp_echo(mut stream: TcpStream, idle: Duration) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(idle));
    let _ = stream.set_write_timeout(Some(idle));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// Counts bytes until the sender shuts down its side, then answers with one JSON line:
/// `{"bytes": N, "seconds": S}`, where S runs from the first byte received to the end of stream.
fn tcp_sink(mut stream: TcpStream, idle: Duration) {
    let _ = stream.set_read_timeout(Some(idle));
    let _ = stream.set_write_timeout(Some(idle));
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes: u64 = 0;
    let mut first_byte: Option<Instant> = None;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                first_byte.get_or_insert_with(Instant::now);
                bytes += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Idle or reset: the sender is gone, nobody to report to.
            Err(_) => return,
        }
    }
    let seconds = first_byte.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let report = json!({ "bytes": bytes, "seconds": seconds });
    let _ = writeln!(stream, "{report}");
    let _ = stream.shutdown(Shutdown::Write);
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionReset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_is_on_the_next_port_and_port_bounds_are_checked() {
        let echo: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert_eq!(sink_address(echo).unwrap(), "10.0.0.1:7001".parse().unwrap());
        let err = sink_address("0.0.0.0:65535".parse().unwrap()).unwrap_err().to_string();
        assert!(err.contains("--listen"), "{err}");
        assert!(sink_address("0.0.0.0:0".parse().unwrap()).is_err(), "port 0 has no next port");
    }
}
