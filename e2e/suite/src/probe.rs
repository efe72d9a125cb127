//! isthmus-probe run inside pods (`kubectl exec`): round trips, throughput, and the pod's own counters.

use serde_json::Value;

use crate::TestNamespace;

/// How an `isthmus-probe rtt` run probes.
#[derive(Clone, Copy, Debug)]
pub struct RttRun {
    pub count: u32,
    pub interval_ms: u32,
    /// UDP payload bytes.
    pub size: u32,
    pub timeout_ms: u32,
    /// Report every probe's send time and round trip (`samples`).
    pub samples: bool,
    /// UDP without a checksum, corrupted replies counted (`corrupted`).
    pub no_udp_checksum: bool,
}

impl RttRun {
    /// `count` probes every 10 ms, 64 bytes, a 2 s timeout.
    pub fn new(count: u32) -> RttRun {
        RttRun { count, interval_ms: 10, size: 64, timeout_ms: 2000, samples: false, no_udp_checksum: false }
    }

    pub fn interval_ms(self, interval_ms: u32) -> RttRun {
        RttRun { interval_ms, ..self }
    }

    pub fn size(self, size: u32) -> RttRun {
        RttRun { size, ..self }
    }

    pub fn samples(self) -> RttRun {
        RttRun { samples: true, ..self }
    }

    pub fn no_udp_checksum(self) -> RttRun {
        RttRun { no_udp_checksum: true, ..self }
    }

    /// How long the run lasts at most.
    pub fn duration(&self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(self.count * self.interval_ms + self.timeout_ms))
    }
}

/// An `isthmus-probe rtt` report.
#[derive(Clone, Debug)]
pub struct RttReport(pub Value);

impl RttReport {
    /// A round-trip statistic in ms: `p10`, `p50`, `p90`, `mean`, `stddev`, …
    pub fn ms(&self, stat: &str) -> f64 {
        self.0["rtt_ms"][stat].as_f64().unwrap_or_else(|| panic!("no rtt_ms.{stat} in {}", self.0))
    }

    pub fn count(&self, field: &str) -> u64 {
        self.0[field].as_u64().unwrap_or_else(|| panic!("no {field} in {}", self.0))
    }

    pub fn loss_ratio(&self) -> f64 {
        self.0["loss_ratio"].as_f64().expect("loss_ratio")
    }

    /// Datagrams a full receive buffer dropped at either end of a counted run
    /// ([`TestNamespace::rtt_run_counted`]).
    pub fn buffer_drops(&self) -> u64 {
        self.0["receive_buffer_drops"].as_u64().expect("receive_buffer_drops (a counted run: rtt_run_counted)")
    }

    /// Probes that no full buffer dropped: what the link decided.
    pub fn path_sent(&self) -> u64 {
        self.count("sent").saturating_sub(self.buffer_drops())
    }

    /// Probes the path lost: those lost less the ones a full buffer dropped.
    pub fn path_lost(&self) -> u64 {
        self.count("lost").saturating_sub(self.buffer_drops())
    }

    pub fn path_loss_ratio(&self) -> f64 {
        self.path_lost() as f64 / self.path_sent().max(1) as f64
    }

    /// (count, mean length) of runs of consecutive lost probes.
    pub fn loss_bursts(&self) -> (u64, f64) {
        let b = &self.0["loss_bursts"];
        (b["count"].as_u64().expect("loss_bursts.count"), b["mean_length"].as_f64().unwrap_or(0.0))
    }

    /// (sent ms after the first probe, round trip ms or None when lost), in sequence order.
    pub fn samples(&self) -> Vec<(f64, Option<f64>)> {
        self.0["samples"]
            .as_array()
            .expect("samples (run with RttRun::samples)")
            .iter()
            .map(|s| (s[0].as_f64().expect("send time"), s[1].as_f64()))
            .collect()
    }

    /// One line for the test's log.
    pub fn describe(&self) -> String {
        let rtt = &self.0["rtt_ms"];
        let drops = self.0["receive_buffer_drops"]
            .as_u64()
            .map_or(String::new(), |n| format!("; {n} of them dropped by a full receive buffer"));
        format!(
            "sent {} lost {} ({:.2} %{drops}) dup {} reordered {} corrupted {}; rtt p10 {} p50 {} p90 {} mean {} ms",
            self.0["sent"],
            self.0["lost"],
            self.loss_ratio() * 100.0,
            self.0["duplicates"],
            self.0["reordered"],
            self.0["corrupted"],
            rtt["p10"],
            rtt["p50"],
            rtt["p90"],
            rtt["mean"]
        )
    }
}

fn parse(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("probe output is not JSON ({e}): {out}"))
}

impl TestNamespace {
    /// TCP bulk from `pod` to `target_ip`'s sink for `seconds`; bits per second received.
    pub fn throughput_bps(&self, pod: &str, target_ip: &str, seconds: f64) -> f64 {
        let target = format!("{target_ip}:7001");
        let secs = seconds.to_string();
        let out =
            self.kubectl(&["exec", pod, "--", "isthmus-probe", "throughput", "--target", &target, "--seconds", &secs]);
        parse(&out)["bits_per_second"].as_f64().unwrap_or_else(|| panic!("no bits_per_second in {out}"))
    }

    /// [`throughput_bps`](Self::throughput_bps) with the bytes the sink acknowledged every `every_ms` on the
    /// sender's clock: (Unix ms, bytes acknowledged) in time order.
    pub fn acked_series(&self, pod: &str, target_ip: &str, seconds: f64, every_ms: u64) -> Vec<(f64, f64)> {
        let target = format!("{target_ip}:7001");
        let (secs, every) = (seconds.to_string(), every_ms.to_string());
        let args = ["exec", pod, "--", "isthmus-probe", "throughput", "--target", &target, "--seconds", &secs];
        let out = self.kubectl(&[&args[..], &["--series-ms", &every]].concat());
        let series = parse(&out)["per_stream"][0]["acked_series"].clone();
        let points = series.as_array().unwrap_or_else(|| panic!("no acked_series in {out}"));
        points.iter().map(|p| (p[0].as_f64().expect("ms"), p[1].as_f64().expect("bytes"))).collect()
    }

    /// UDP echo round trips from `pod` to the echo at `target_ip`:7000, `count` probes 10 ms apart.
    pub fn rtt(&self, pod: &str, target_ip: &str, count: u32) -> Value {
        self.rtt_run(pod, target_ip, RttRun::new(count)).0
    }

    /// UDP echo round trips from `pod` to the echo at `target_ip`:7000.
    pub fn rtt_run(&self, pod: &str, target_ip: &str, run: RttRun) -> RttReport {
        let target = format!("{target_ip}:7000");
        let (count, interval, size, timeout) =
            (run.count.to_string(), run.interval_ms.to_string(), run.size.to_string(), run.timeout_ms.to_string());
        let mut args = vec!["exec", pod, "--", "isthmus-probe", "rtt", "--target", &target, "--count", &count];
        args.extend(["--interval-ms", &interval, "--size", &size, "--timeout-ms", &timeout]);
        if run.samples {
            args.push("--samples");
        }
        if run.no_udp_checksum {
            args.push("--no-udp-checksum");
        }
        RttReport(parse(&self.kubectl(&args)))
    }

    /// The pod's own IP and UDP counters (`/proc/net/snmp` of its network namespace).
    pub fn counters(&self, pod: &str) -> Value {
        parse(&self.kubectl(&["exec", pod, "--", "isthmus-probe", "counters"]))
    }

    /// [`rtt_run`](Self::rtt_run) from `pod` to `target_pod`'s echo at `target_ip`, counting what the machine lost
    /// rather than the link: the datagrams that either pod's kernel dropped meanwhile because the receiving
    /// socket's buffer was full (`Udp: RcvbufErrors` of each network namespace), as `receive_buffer_drops` in the
    /// report. An emulated node stalls for hundreds of ms on a busy machine, and a socket whose reader waits for a
    /// CPU that long overflows; each such drop loses one probe, unless the link duplicated it and a copy got through.
    pub fn rtt_run_counted(&self, pod: &str, target_pod: &str, target_ip: &str, run: RttRun) -> RttReport {
        let ends = [pod, target_pod];
        let before = ends.map(|p| self.counters(p));
        let mut report = self.rtt_run(pod, target_ip, run);
        let after = ends.map(|p| self.counters(p));
        let drops: u64 = (0..2)
            .map(|i| udp_counter(&after[i], "RcvbufErrors").saturating_sub(udp_counter(&before[i], "RcvbufErrors")))
            .sum();
        report.0["receive_buffer_drops"] = drops.into();
        report
    }
}

fn udp_counter(counters: &Value, name: &str) -> u64 {
    counters["udp"][name].as_u64().unwrap_or_else(|| panic!("no Udp {name} in {counters}"))
}
