//! The line protocol between the guest and the rig on the host: the guest binary writes it, the rig
//! (`src/rig`) reads it back from the guest's serial console.
//!
//! One line per test: `ISTHMUS-RESULT ` followed by one JSON object, written with a single write so nothing
//! else on the console can split it; `/init` adds `ISTHMUS-EXIT N` when the binary ended. Anything else on the
//! console (kernel messages, `/init`'s `ISTHMUS-LOG` lines) is kept in the log and never parsed.

use std::io::Write;

use serde::{Deserialize, Serialize};

pub const RESULT_PREFIX: &str = "ISTHMUS-RESULT ";
pub const EXIT_PREFIX: &str = "ISTHMUS-EXIT ";
/// The suffix naming a fidelity test's run through the userspace datapath; without it, the same test through
/// the tc tree.
pub const USERSPACE_SUFFIX: &str = ".userspace";

/// The benchmark's quantities (`--bench`, src/tests/bench.rs), in its table's order: the measurement key of each
/// one's median (its runs are under `<key>.runs`), and what it is.
pub const BENCH_QUANTITIES: [(&str, &str); 9] = [
    ("added_us", "one-way delay added, 0 ms configured, p50 (µs)"),
    ("error_p50_us", "error at 20 ms, p50 (µs)"),
    ("error_p99_us", "error at 20 ms, p99 (µs)"),
    ("tcp_1g_0ms_mbps", "one TCP flow, 1 Gbit/s at 0 ms (Mbit/s)"),
    ("tcp_1g_50ms_mbps", "one TCP flow, 1 Gbit/s at 50 ms (Mbit/s)"),
    ("tcp_ceiling_mbps", "one TCP flow, 0 ms and no rate (Mbit/s)"),
    ("tcp_free_mbps", "one TCP flow, not impaired (Mbit/s)"),
    ("cpu_per_gbit", "kernel-wide CPU per Gbit/s, 1 Gbit/s 0 ms flow (cores)"),
    ("cpu_per_gbit_free", "kernel-wide CPU per Gbit/s, not impaired (cores)"),
];

/// How one test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TestOutcome {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestRecord {
    pub test: String,
    pub kernel: String,
    pub backend: String,
    /// `verdict` on the wire and in `summary.json`.
    #[serde(rename = "verdict")]
    pub outcome: TestOutcome,
    pub duration_ms: u64,
    /// One line for the host's table: the figures that decided the verdict.
    pub summary: String,
    /// Everything the test logged: configuration, measurements, iproute2 cross-checks, the failure.
    pub output: String,
    #[serde(default)]
    pub measurements: serde_json::Map<String, serde_json::Value>,
}

pub fn emit(record: &TestRecord) {
    let json = serde_json::to_string(record).expect("a test record always serializes");
    let line = format!("{RESULT_PREFIX}{json}\n");
    let mut out = std::io::stdout().lock();
    // A failed console write leaves the host without this result; it reports the test as missing.
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

/// What one console line says, if anything. A kernel message can land in front of a line on the console, so
/// the prefixes are searched for, not anchored.
#[derive(Debug)]
pub enum ConsoleLine {
    Result(Box<TestRecord>),
    /// A result line whose JSON did not parse: the reason.
    Unparsable(String),
    Exit(i32),
    Other,
}

pub fn parse_line(line: &str) -> ConsoleLine {
    if let Some(at) = line.find(RESULT_PREFIX) {
        return match serde_json::from_str(&line[at + RESULT_PREFIX.len()..]) {
            Ok(record) => ConsoleLine::Result(Box::new(record)),
            Err(e) => ConsoleLine::Unparsable(e.to_string()),
        };
    }
    if let Some(at) = line.find(EXIT_PREFIX)
        && let Some(Ok(code)) = line[at + EXIT_PREFIX.len()..].split_whitespace().next().map(str::parse)
    {
        return ConsoleLine::Exit(code);
    }
    ConsoleLine::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_line_round_trips_behind_a_kernel_message() {
        let record = TestRecord {
            test: "delay".into(),
            kernel: "sid-uml-7.2".into(),
            backend: "uml".into(),
            outcome: TestOutcome::Pass,
            duration_ms: 5300,
            summary: "delay 20ms p50 20.5".into(),
            output: "line one\nline two".into(),
            measurements: serde_json::Map::new(),
        };
        let line = format!("[  3.1] veth: link up{RESULT_PREFIX}{}", serde_json::to_string(&record).unwrap());
        match parse_line(&line) {
            ConsoleLine::Result(r) => {
                assert_eq!(r.test, "delay");
                assert_eq!(r.outcome, TestOutcome::Pass);
                assert_eq!(r.output, "line one\nline two");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse_line("ISTHMUS-EXIT 1"), ConsoleLine::Exit(1)));
        assert!(matches!(parse_line("xx ISTHMUS-EXIT 0 \r"), ConsoleLine::Exit(0)));
        assert!(matches!(parse_line("ISTHMUS-EXIT x"), ConsoleLine::Other));
        assert!(matches!(parse_line("ISTHMUS-RESULT {\"test\":"), ConsoleLine::Unparsable(_)));
        assert!(matches!(parse_line("Linux version 6.1"), ConsoleLine::Other));
    }
}
