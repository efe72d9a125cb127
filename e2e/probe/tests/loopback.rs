//! Runs the real binary on 127.0.0.1: `serve`, then `rtt` and `throughput` against it, and checks
//! that the JSON reports are complete and add up. Loopback only; every run is bounded.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_isthmus-probe");

/// --timeout-ms for the runs that must lose nothing: an echo later than the timeout counts as lost, and a process
/// on a loaded 2-core machine (this binary runs its tests in parallel) can be descheduled for more than the
/// default 2 s. Loopback drops nothing that arrives late, so only a real loss or a missing echo fails these runs;
/// a run that gets every echo ends at once, so the longer timeout costs nothing when it passes.
const LOSSLESS_TIMEOUT_MS: &str = "10000";

/// A running `serve`, killed when dropped (also when the test fails).
struct Server {
    child: Child,
    echo_port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn echo(&self) -> String {
        format!("127.0.0.1:{}", self.echo_port)
    }

    fn sink(&self) -> String {
        format!("127.0.0.1:{}", self.echo_port + 1)
    }
}

/// Starts `serve` on a free port pair, retrying when another process takes the port first.
fn start_server() -> Server {
    for _ in 0..20 {
        let port = free_port_pair();
        let mut child = Command::new(PROBE)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting isthmus-probe serve");
        let stdout = child.stdout.take().unwrap();
        let server = Server { child, echo_port: port };
        if let Some(ready) = ready_line(stdout) {
            let ready: Value = serde_json::from_str(&ready).expect("ready line is JSON");
            assert_eq!(ready["udp_echo"], format!("127.0.0.1:{port}"));
            assert_eq!(ready["tcp_echo"], format!("127.0.0.1:{port}"));
            assert_eq!(ready["tcp_sink"], format!("127.0.0.1:{}", port + 1));
            return server;
        }
    }
    panic!("could not start isthmus-probe serve on a free port in 20 attempts");
}

/// The first stdout line, or None if the server exited first (port taken).
fn ready_line(stdout: ChildStdout) -> Option<String> {
    let mut line = String::new();
    match BufReader::new(stdout).read_line(&mut line) {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

fn free_port_pair() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if port < 65534
            && TcpListener::bind(("127.0.0.1", port + 1)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
}

fn probe(args: &[&str]) -> Output {
    Command::new(PROBE).args(args).output().expect("running isthmus-probe")
}

fn probe_json(args: &[&str]) -> Value {
    let out = probe(args);
    assert!(out.status.success(), "isthmus-probe {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "exactly one JSON object on stdout: {stdout}");
    serde_json::from_str(&stdout).expect("stdout is JSON")
}

/// `rtt` with [`LOSSLESS_TIMEOUT_MS`], so that a late echo is not taken for a lost one; `extra` adds flags.
fn rtt_lossless(target: &str, proto: &str, count: &str, interval_ms: &str, extra: &[&str]) -> Value {
    let mut args = vec!["rtt", "--target", target, "--proto", proto, "--count", count, "--interval-ms", interval_ms];
    args.extend(["--timeout-ms", LOSSLESS_TIMEOUT_MS]);
    args.extend_from_slice(extra);
    probe_json(&args)
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn assert_complete_rtt_report(report: &Value, proto: &str, count: u64) {
    assert_eq!(report["proto"], proto);
    assert_eq!(u(report, "sent"), count);
    assert_eq!(u(report, "received") + u(report, "lost"), u(report, "sent"), "{report}");
    assert!(u(report, "late") <= u(report, "lost"), "{report}");
    let expected_ratio = u(report, "lost") as f64 / count as f64;
    assert!((f(report, "loss_ratio") - expected_ratio).abs() < 1e-9, "{report}");
    let rtt = &report["rtt_ms"];
    let fields = ["min", "mean", "p50", "p90", "p99", "max", "stddev", "jitter"];
    let keys: Vec<&str> = rtt.as_object().unwrap().keys().map(String::as_str).collect();
    for field in fields {
        assert!(keys.contains(&field), "rtt_ms.{field} missing in {report}");
    }
}

fn assert_lossless_loopback(report: &Value, count: u64) {
    assert_eq!(u(report, "received"), count, "{report}");
    assert_eq!((u(report, "lost"), u(report, "late"), u(report, "duplicates")), (0, 0, 0), "{report}");
    assert_eq!(f(report, "loss_ratio"), 0.0);
    let rtt = &report["rtt_ms"];
    let (min, p50, p90, p99, max) = (f(rtt, "min"), f(rtt, "p50"), f(rtt, "p90"), f(rtt, "p99"), f(rtt, "max"));
    assert!(0.0 <= min && min <= p50 && p50 <= p90 && p90 <= p99 && p99 <= max, "{report}");
    assert!(min <= f(rtt, "mean") && f(rtt, "mean") <= max, "{report}");
    assert!(f(rtt, "stddev") >= 0.0 && f(rtt, "jitter") >= 0.0, "{report}");
    // Round trips are measured against the timeout: none may exceed it.
    assert!(max <= f(report, "timeout_ms"), "{report}");
}

#[test]
fn udp_round_trip_on_loopback_loses_nothing() {
    let server = start_server();
    let report = rtt_lossless(&server.echo(), "udp", "50", "2", &[]);
    assert_complete_rtt_report(&report, "udp", 50);
    assert_lossless_loopback(&report, 50);
    assert_eq!(report["target"], server.echo());
}

#[test]
fn tcp_round_trip_on_loopback_loses_nothing() {
    let server = start_server();
    let report = rtt_lossless(&server.echo(), "tcp", "50", "2", &["--size", "1000"]);
    assert_complete_rtt_report(&report, "tcp", 50);
    assert_lossless_loopback(&report, 50);
    assert_eq!(u(&report, "size"), 1000);
}

#[test]
fn back_to_back_probes_from_many_clients_are_all_answered() {
    let server = start_server();
    let target = server.echo();
    thread::scope(|scope| {
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let proto = if i % 2 == 0 { "udp" } else { "tcp" };
                let target = &target;
                scope.spawn(move || (proto, rtt_lossless(target, proto, "200", "0", &[])))
            })
            .collect();
        for run in runs {
            let (proto, report) = run.join().unwrap();
            assert_complete_rtt_report(&report, proto, 200);
            // Loopback UDP may drop under a burst from six clients on a loaded machine: counts
            // must add up; TCP must deliver every probe.
            if proto == "tcp" {
                assert_lossless_loopback(&report, 200);
            }
            assert_eq!(u(&report, "duplicates"), 0, "{report}");
        }
    });
}

#[test]
fn tcp_back_to_back_beyond_the_socket_buffers_completes() {
    // 20 MB of probes with no pause: far more than both ends' socket buffers hold, so a prober
    // that did not bound what it has in flight would stall with the echo server.
    let server = start_server();
    let report = rtt_lossless(&server.echo(), "tcp", "20000", "0", &["--size", "1000"]);
    assert_complete_rtt_report(&report, "tcp", 20000);
    assert_lossless_loopback(&report, 20000);
}

#[test]
fn unanswered_udp_probes_are_all_lost_with_null_round_trips() {
    // A bound socket nobody reads from: probes vanish without an ICMP error.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = silent.local_addr().unwrap().to_string();
    let report = probe_json(&["rtt", "--target", &target, "--count", "5", "--interval-ms", "1", "--timeout-ms", "100"]);
    assert_complete_rtt_report(&report, "udp", 5);
    assert_eq!((u(&report, "received"), u(&report, "lost")), (0, 5), "{report}");
    assert_eq!(f(&report, "loss_ratio"), 1.0);
    assert!(report["rtt_ms"].as_object().unwrap().values().all(Value::is_null), "{report}");
}

#[test]
fn throughput_counts_at_the_receiver_what_the_sender_sent() {
    let server = start_server();
    let report = probe_json(&["throughput", "--target", &server.sink(), "--seconds", "0.5", "--streams", "2"]);
    assert_eq!(report["measured_at"], "receiver");
    assert_eq!(u(&report, "streams"), 2);
    assert!(u(&report, "bytes") > 0, "{report}");
    // The sink reads to the end of each stream, so everything sent arrives.
    assert_eq!(u(&report, "bytes"), u(&report, "bytes_sent"), "{report}");
    assert!(f(&report, "bits_per_second") > 0.0 && f(&report, "receiver_seconds") > 0.0, "{report}");
    let expected_bps = u(&report, "bytes") as f64 * 8.0 / f(&report, "receiver_seconds");
    assert!((f(&report, "bits_per_second") - expected_bps).abs() <= 1.0, "{report}");
    let streams = report["per_stream"].as_array().unwrap();
    assert_eq!(streams.len(), 2);
    assert_eq!(streams.iter().map(|s| u(s, "bytes")).sum::<u64>(), u(&report, "bytes"));
    // Sending stops at the requested time (a write in flight may finish just after it).
    assert!(f(&report, "sender_seconds") >= 0.5 && f(&report, "sender_seconds") < 5.0, "{report}");
}

#[test]
fn failures_exit_non_zero_with_a_message_naming_the_cause() {
    // Port 0: nothing can listen there, so the connection is refused whatever else runs. (A port freed by a
    // dropped listener could be taken by a test running in parallel, and then the connection would succeed.)
    let closed = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let out = probe(&["rtt", "--target", &closed.to_string(), "--proto", "tcp", "--count", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to the TCP echo"), "{out:?}");
    assert!(out.stdout.is_empty(), "no report on failure");

    let out = probe(&["throughput", "--target", &closed.to_string(), "--seconds", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bulk sink"), "{out:?}");

    let out = probe(&["rtt", "--target", "127.0.0.1:9", "--count", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--count"), "{out:?}");

    let out = probe(&["throughput", "--target", "127.0.0.1:9", "--seconds=0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seconds"), "{out:?}");
}

#[test]
fn sigterm_ends_the_server_at_once() {
    let mut server = start_server();
    let pid = server.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "serve exits 0 on SIGTERM, got {status}");
            break;
        }
        assert!(Instant::now() < deadline, "serve still running 5 s after SIGTERM");
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn help_documents_every_subcommand_and_field() {
    let out = probe(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "rtt", "throughput"] {
        assert!(help.contains(word), "--help lacks {word}: {help}");
    }
    let out = probe(&["rtt", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["loss_ratio", "duplicates", "reordered", "p99", "--timeout-ms", "--interval-ms"] {
        assert!(help.contains(word), "rtt --help lacks {word}: {help}");
    }
    let out = probe(&["throughput", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("bits_per_second") && help.contains("receiver"), "{help}");
}
