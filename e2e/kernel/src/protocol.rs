//! The line protocol between the guest and the rig on the host (parsed by e2e/kernel/rigtool.py).
//!
//! One line per test on stdout (the guest's serial console): `ISTHMUS-RESULT ` followed by one JSON object.
//! The line is written with a single write so nothing else on the console can split it.

use std::io::Write;

use serde::Serialize;

pub const RESULT_PREFIX: &str = "ISTHMUS-RESULT ";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Serialize)]
pub struct TestRecord {
    pub test: &'static str,
    pub kernel: String,
    pub backend: String,
    pub verdict: Verdict,
    pub duration_ms: u64,
    /// One line for the host's table: the figures that decided the verdict.
    pub summary: String,
    /// Everything the test logged: configuration, measurements, iproute2 cross-checks, the failure.
    pub output: String,
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
