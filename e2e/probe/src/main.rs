//! isthmus-probe: measures what a NetworkLink does to traffic between two pods.
//!
//! One pod runs `isthmus-probe serve`; another runs `rtt` or `throughput` against it and gets one
//! JSON object on stdout; `counters` prints the pod's own IP and UDP counters. Errors go to stderr with a non-zero exit status.

mod counters;
mod error;
mod rtt;
mod serve;
mod sockopt;
mod stats;
mod throughput;
mod wire;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::error::{ProbeError, Result};

#[derive(Parser, Debug)]
#[command(
    name = "isthmus-probe",
    version,
    about = "Round-trip and throughput probe for isthmus: run `serve` in one pod, `rtt` or `throughput` in another",
    long_about = "Round-trip and throughput probe for isthmus.\n\n\
        Run `isthmus-probe serve` in the receiving pod; it answers UDP and TCP echo on one port and \
        counts TCP bulk data on the next port. Run `isthmus-probe rtt` or `isthmus-probe throughput` in \
        the sending pod; each prints exactly one JSON object on stdout and exits 0, or prints an error \
        on stderr and exits non-zero. Every run is bounded in count and time."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Echo server and bulk sink; runs until killed (SIGTERM/SIGINT end it at once).
    ///
    /// Listens for UDP echo and TCP echo on --listen, and for TCP bulk data on the next port
    /// (--listen port + 1). Prints one JSON line when ready:
    /// {"udp_echo": ADDR, "tcp_echo": ADDR, "tcp_sink": ADDR}.
    /// The sink counts the bytes of each connection until the client shuts down its sending side,
    /// then answers {"bytes": N, "seconds": S} (S from the first byte received to the end of stream).
    Serve {
        /// Address for UDP and TCP echo; the bulk sink takes the next port.
        #[arg(long, default_value = "0.0.0.0:7000")]
        listen: SocketAddr,
        /// Open TCP connections (echo and sink together) beyond which new ones are closed at once.
        #[arg(long, default_value_t = 512)]
        max_connections: usize,
        /// A TCP connection silent for this long is closed.
        #[arg(long, default_value_t = 300)]
        idle_timeout_secs: u64,
    },
    /// Round trip: sends --count sequence-numbered, timestamped probes every --interval-ms to an echo.
    ///
    /// UDP: one datagram per probe. TCP: one connection, fixed-size frames echoed on the stream
    /// (TCP_NODELAY; a lost segment shows up as retransmission delay, not as loss).
    /// A probe counts as received when its first echo arrives within --timeout-ms of sending;
    /// echoes after that are `late` and count as lost. Prints:
    /// {"proto", "started_unix_ms", "target", "size", "interval_ms", "timeout_ms", "sent", "received", "lost", "late",
    /// "loss_ratio", "duplicates", "reordered", "corrupted", "loss_bursts",
    /// "rtt_ms": {"min", "mean", "p50", "p90", "p99", "max", "stddev", "jitter"}}.
    /// lost = sent - received; loss_ratio = lost / sent; duplicates = extra copies of an echo;
    /// reordered = first echoes arriving after an echo of a higher sequence number;
    /// percentiles are nearest-rank over received probes; jitter is the mean absolute difference of
    /// consecutive round trips in arrival order; rtt_ms fields are null when nothing was received.
    /// Runs for at most count × interval + timeout.
    Rtt {
        /// Echo address (`serve --listen`): IP:PORT. HOST:PORT needs name resolution, which the
        /// static images lack (no resolver libraries).
        #[arg(long)]
        target: String,
        #[arg(long, value_enum, default_value_t = ProtoArg::Udp)]
        proto: ProtoArg,
        /// Number of probes, 1 to 1000000.
        #[arg(long, default_value_t = 100)]
        count: u64,
        /// Milliseconds between probe sends (fixed schedule), 0 to 60000.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        /// Milliseconds an echo may take to count as received, 1 to 60000.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Probe size in bytes (UDP payload or TCP frame), 24 to 65507.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Also print every probe: "samples": [[sent ms after the first probe, rtt ms or null], ...].
        #[arg(long)]
        samples: bool,
        /// UDP without a checksum (IPv4): corrupted probes reach the echo instead of being dropped on the way, and
        /// replies whose bytes changed are counted as "corrupted".
        #[arg(long)]
        no_udp_checksum: bool,
        /// After printing the report, wait until terminated: a container that measures from its own start keeps
        /// running (and its report in its log) instead of being restarted.
        #[arg(long)]
        hold: bool,
    },
    /// This network namespace's IP and UDP counters (/proc/net/snmp) as JSON: where a corrupted datagram
    /// shows up at the receiver (`udp.InCsumErrors`, `ip.InHdrErrors`).
    Counters,
    /// Throughput: TCP bulk to the sink for --seconds, measured at the receiver.
    ///
    /// Each of --streams connections writes for --seconds, then shuts down its sending side and
    /// reads the sink's count. Prints:
    /// {"target", "seconds", "streams", "measured_at": "receiver", "bytes", "receiver_seconds",
    /// "bits_per_second", "bytes_sent", "sender_seconds", "sender_bits_per_second", "per_stream": [...]}.
    /// bytes and bits_per_second are what the sink received (total bytes over the longest stream's
    /// receive time, first byte to end of stream); the sender_* fields are what was queued locally.
    Throughput {
        /// Bulk sink address: the `serve --listen` port + 1 (7001 by default), IP:PORT (as for rtt,
        /// HOST:PORT needs name resolution).
        #[arg(long)]
        target: String,
        /// Seconds to send, up to 3600 (fractions allowed).
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Parallel TCP connections, 1 to 64.
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Milliseconds to wait for each connection to open.
        #[arg(long, default_value_t = 5000)]
        connect_timeout_ms: u64,
        /// Milliseconds to wait, after sending stopped, for the sink to receive what was queued and
        /// report. Raise it for slow links with large socket buffers.
        #[arg(long, default_value_t = 30000)]
        drain_timeout_ms: u64,
        /// Every this many ms, record each stream's bytes acknowledged by the sink (TCP_INFO) with the Unix
        /// time in ms: `acked_series` [[ms, bytes], ...] in each `per_stream` entry, 1 to 60000.
        #[arg(long)]
        series_ms: Option<u64>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ProtoArg {
    Udp,
    Tcp,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("isthmus-probe: {e}");
            ExitCode::FAILURE
        }
    }
}

fn execute(command: Command) -> Result<()> {
    match command {
        Command::Serve { listen, max_connections, idle_timeout_secs } => {
            exit_on_termination_signals();
            serve::serve(serve::ServeOptions {
                listen,
                max_connections,
                idle_timeout: Duration::from_secs(idle_timeout_secs.max(1)),
            })
        }
        Command::Counters => {
            println!("{}", counters::read()?);
            Ok(())
        }
        Command::Rtt { target, proto, count, interval_ms, timeout_ms, size, samples, no_udp_checksum, hold } => {
            if hold {
                exit_on_termination_signals();
            }
            let report = rtt::run(&rtt::RttOptions {
                target: resolve(&target)?,
                proto: match proto {
                    ProtoArg::Udp => rtt::Proto::Udp,
                    ProtoArg::Tcp => rtt::Proto::Tcp,
                },
                count,
                interval: Duration::from_millis(interval_ms),
                timeout: Duration::from_millis(timeout_ms),
                size,
                samples,
                no_udp_checksum,
            })?;
            println!("{report}");
            if hold {
                use std::io::Write;
                let _ = std::io::stdout().flush();
                loop {
                    std::thread::park();
                }
            }
            Ok(())
        }
        Command::Throughput { target, seconds, streams, connect_timeout_ms, drain_timeout_ms, series_ms } => {
            if !seconds.is_finite() || seconds <= 0.0 || seconds > 3600.0 {
                return Err(ProbeError::new(format!("--seconds {seconds}: must be above 0 and at most 3600")));
            }
            let report = throughput::run(&throughput::ThroughputOptions {
                target: resolve(&target)?,
                duration: Duration::from_secs_f64(seconds),
                streams,
                connect_timeout: Duration::from_millis(connect_timeout_ms.max(1)),
                drain_timeout: Duration::from_millis(drain_timeout_ms.max(1)),
                series: series_ms.map(Duration::from_millis),
            })?;
            println!("{report}");
            Ok(())
        }
    }
}

fn resolve(target: &str) -> Result<SocketAddr> {
    target
        .to_socket_addrs()
        .map_err(|e| ProbeError::new(format!("--target {target}: not an IP:PORT or resolvable HOST:PORT: {e}")))?
        .next()
        .ok_or_else(|| ProbeError::new(format!("--target {target}: resolves to no address")))
}

/// Inside a container the server is PID 1, and PID 1 ignores SIGTERM unless it installs a handler:
/// without one every pod deletion would wait out its whole grace period.
fn exit_on_termination_signals() {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    unsafe extern "C" {
        fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
        fn _exit(status: i32) -> !;
    }
    extern "C" fn exit_now(_signum: i32) {
        // Only async-signal-safe calls here; the server holds no state worth flushing.
        unsafe { _exit(0) }
    }
    // SAFETY: the handler only calls _exit, which is async-signal-safe.
    unsafe {
        signal(SIGTERM, exit_now);
        signal(SIGINT, exit_now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn unresolvable_targets_name_the_flag() {
        let err = resolve("not an address").unwrap_err().to_string();
        assert!(err.contains("--target"), "{err}");
        assert_eq!(resolve("127.0.0.1:7000").unwrap(), "127.0.0.1:7000".parse().unwrap());
    }
}
