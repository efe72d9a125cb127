//! TCP bulk transfer to the sink, measured where the bytes arrive.
//!
//! Each stream writes for the requested seconds, shuts down its sending side and waits for the
//! sink's report (`{"bytes", "seconds"}` counted by the receiver from its first byte to the end of
//! stream). The figure that matters, `bits_per_second`, is the receiver's: bytes still queued in
//! the sender's socket buffer when the clock stops are neither counted as delivered nor lost.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::error::{Context, ProbeError, Result};

pub struct ThroughputOptions {
    pub target: SocketAddr,
    pub duration: Duration,
    pub streams: usize,
    pub connect_timeout: Duration,
    /// How long to wait, after sending stopped, for the sink to drain and report.
    pub drain_timeout: Duration,
    /// Every this long, each stream's bytes acknowledged by the sink (`TCP_INFO`) with the Unix time in ms: the
    /// goodput over time on the sender's clock, to set beside a schedule evaluated on the same clock.
    pub series: Option<Duration>,
}

struct StreamResult {
    /// (Unix ms, bytes acknowledged), when a series was asked for.
    acked_series: Vec<(u64, u64)>,
    bytes_sent: u64,
    sender_seconds: f64,
    bytes_received: u64,
    receiver_seconds: f64,
}

pub fn validate(options: &ThroughputOptions) -> Result<()> {
    if options.duration.is_zero() || options.duration > Duration::from_secs(3600) {
        return Err(ProbeError::new("--seconds: must be between 0.001 and 3600"));
    }
    if options.series.is_some_and(|s| s < Duration::from_millis(1) || s > Duration::from_secs(60)) {
        return Err(ProbeError::new("--series-ms: must be between 1 and 60000"));
    }
    if options.streams == 0 || options.streams > 64 {
        return Err(ProbeError::new(format!("--streams {}: must be between 1 and 64", options.streams)));
    }
    Ok(())
}

pub fn run(options: &ThroughputOptions) -> Result<Value> {
    validate(options)?;
    let results: Vec<Result<StreamResult>> = thread::scope(|scope| {
        let handles: Vec<_> = (0..options.streams).map(|_| scope.spawn(|| one_stream(options))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(ProbeError::new("a sending thread panicked"))))
            .collect()
    });
    let results = results.into_iter().collect::<Result<Vec<_>>>()?;

    let bytes: u64 = results.iter().map(|r| r.bytes_received).sum();
    let bytes_sent: u64 = results.iter().map(|r| r.bytes_sent).sum();
    // Streams run side by side; dividing the total by the longest one is the conservative rate.
    let receiver_seconds = results.iter().map(|r| r.receiver_seconds).fold(0.0, f64::max);
    let sender_seconds = results.iter().map(|r| r.sender_seconds).fold(0.0, f64::max);
    let per_stream: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut stream = json!({
                "bytes": r.bytes_received,
                "bytes_sent": r.bytes_sent,
                "receiver_seconds": r.receiver_seconds,
                "sender_seconds": r.sender_seconds,
                "bits_per_second": rate(r.bytes_received, r.receiver_seconds),
            });
            if options.series.is_some() {
                stream["acked_series"] = json!(r.acked_series.iter().map(|&(t, b)| [t, b]).collect::<Vec<_>>());
            }
            stream
        })
        .collect();
    Ok(json!({
        "target": options.target.to_string(),
        "seconds": options.duration.as_secs_f64(),
        "streams": options.streams,
        "measured_at": "receiver",
        "bytes": bytes,
        "receiver_seconds": receiver_seconds,
        "bits_per_second": rate(bytes, receiver_seconds),
        "bytes_sent": bytes_sent,
        "sender_seconds": sender_seconds,
        "sender_bits_per_second": rate(bytes_sent, sender_seconds),
        "per_stream": per_stream,
    }))
}

fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { (bytes as f64 * 8.0 / seconds).round() } else { 0.0 }
}

fn one_stream(options: &ThroughputOptions) -> Result<StreamResult> {
    let target = options.target;
    let stream = TcpStream::connect_timeout(&target, options.connect_timeout)
        .context(|| format!("connecting to the TCP bulk sink at {target}"))?;
    let Some(every) = options.series else { return send_and_report(options, stream) };
    let sampled = stream.try_clone().context(|| "a second handle on the stream for TCP_INFO".into())?;
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        // Bounded: the sender sets `stop` when it returns, which is within the duration and the drain timeout.
        let sampler = scope.spawn(|| {
            let mut series = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(acked) = crate::sockopt::tcp_bytes_acked(&sampled) {
                    series.push((unix_ms(), acked));
                }
                thread::sleep(every);
            }
            series
        });
        let result = send_and_report(options, stream);
        stop.store(true, Ordering::Relaxed);
        let series = sampler.join().unwrap_or_default();
        result.map(|r| StreamResult { acked_series: series, ..r })
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn send_and_report(options: &ThroughputOptions, mut stream: TcpStream) -> Result<StreamResult> {
    let target = options.target;
    let chunk = vec![0x5au8; 128 * 1024];
    let start = Instant::now();
    let deadline = start + options.duration;
    let mut bytes_sent: u64 = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left < Duration::from_micros(1) {
            break;
        }
        // A blocked write must not outlive the deadline: on a slow link it returns what it queued.
        stream.set_write_timeout(Some(left)).context(|| "setting the TCP write timeout".into())?;
        match stream.write(&chunk) {
            Ok(0) => {
                return Err(ProbeError::new(format!("the sink at {target} stopped accepting data")));
            }
            Ok(n) => bytes_sent += n as u64,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context(|| format!("sending to the sink at {target}")),
        }
    }
    let sender_seconds = start.elapsed().as_secs_f64();
    stream.shutdown(Shutdown::Write).context(|| "ending the bulk stream".into())?;

    stream.set_read_timeout(Some(options.drain_timeout)).context(|| "setting the TCP read timeout".into())?;
    let mut line = String::new();
    // The report is one short line; take at most 4 KiB of it.
    let read = BufReader::new(io::Read::take(&stream, 4096)).read_line(&mut line);
    match read {
        Ok(0) => {
            return Err(ProbeError::new(format!("the sink at {target} closed without a report")));
        }
        Ok(_) => {}
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
            return Err(ProbeError::new(format!(
                "the sink at {target} did not report within {:?} of the end of sending (raise --drain-timeout-ms \
                 on slow links with large buffers)",
                options.drain_timeout
            )));
        }
        Err(e) => return Err(e).context(|| format!("reading the sink report from {target}")),
    }
    let (bytes_received, receiver_seconds) = parse_report(&line)
        .ok_or_else(|| ProbeError::new(format!("the sink at {target} sent a malformed report: {line:?}")))?;
    Ok(StreamResult { acked_series: Vec::new(), bytes_sent, sender_seconds, bytes_received, receiver_seconds })
}

fn parse_report(line: &str) -> Option<(u64, f64)> {
    let report: Value = serde_json::from_str(line.trim()).ok()?;
    Some((report.get("bytes")?.as_u64()?, report.get("seconds")?.as_f64()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sink_report() {
        assert_eq!(parse_report("{\"bytes\":1000,\"seconds\":0.5}\n"), Some((1000, 0.5)));
        assert_eq!(parse_report("{\"bytes\":-1,\"seconds\":0.5}"), None);
        assert_eq!(parse_report("garbage"), None);
    }

    #[test]
    fn rate_is_bits_per_second_and_zero_without_time() {
        assert_eq!(rate(1_000_000, 1.0), 8_000_000.0);
        assert_eq!(rate(125, 0.5), 2000.0);
        assert_eq!(rate(10, 0.0), 0.0);
    }

    fn options() -> ThroughputOptions {
        ThroughputOptions {
            target: "127.0.0.1:7001".parse().unwrap(),
            duration: Duration::from_secs(1),
            streams: 1,
            connect_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            series: None,
        }
    }

    #[test]
    fn bad_options_are_rejected_naming_the_flag() {
        assert!(validate(&options()).is_ok());
        for (bad, flag) in [
            (ThroughputOptions { streams: 0, ..options() }, "--streams"),
            (ThroughputOptions { streams: 65, ..options() }, "--streams"),
            (ThroughputOptions { duration: Duration::ZERO, ..options() }, "--seconds"),
            (ThroughputOptions { duration: Duration::from_secs(3601), ..options() }, "--seconds"),
            (ThroughputOptions { series: Some(Duration::ZERO), ..options() }, "--series-ms"),
        ] {
            let err = validate(&bad).unwrap_err().to_string();
            assert!(err.contains(flag), "{err} should name {flag}");
        }
    }
}
