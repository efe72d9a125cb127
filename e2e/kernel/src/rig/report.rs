//! From the guests' consoles to a verdict: one table per kernel (each test's verdict and the figures that
//! decided it), the failed tests' full logs, `summary.json` and `junit.xml`. Pure: the caller reads the
//! consoles and writes the files.

use std::fmt::Write as _;

use serde::Serialize;

use super::rules::Resolved;
use crate::protocol::{ConsoleLine, TestOutcome, TestRecord, parse_line};

/// How one boot went, as the host saw it.
#[derive(Debug, Clone, Serialize)]
pub struct VmStatus {
    pub kernel: String,
    pub backend: String,
    /// The host's 1-minute load average before..after: timing under TCG and UML degrades with it.
    pub host_load: String,
    /// The VM process's exit status; 124/137 are `timeout`'s.
    pub vm_rc: i32,
    pub wall_s: f64,
}

/// One kernel's part of the report.
#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    pub kernel: String,
    /// The packages this kernel came from: the rules' choices, with versions and hashes.
    pub packages: Vec<Resolved>,
    pub status: Option<VmStatus>,
    pub guest_exit: Option<i32>,
    /// Why the kernel's results are incomplete or missing: no packages, a timeout, a guest that died.
    pub problem: Option<String>,
    pub console: String,
    pub results: Vec<Row>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub record: TestRecord,
    /// A test that failed and was run again in a fresh boot keeps its first record here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_boot: Option<TestRecord>,
}

impl KernelReport {
    /// A kernel that could not be booted at all (a rule no package satisfies): every expected test fails
    /// with that reason, so nothing is silently missing.
    pub fn unavailable(kernel: &str, expected: &[String], problem: String) -> KernelReport {
        let results = expected
            .iter()
            .map(|t| Row { record: missing(t, kernel, &format!("no result: {problem}")), first_boot: None })
            .collect();
        KernelReport {
            kernel: kernel.into(),
            packages: Vec::new(),
            status: None,
            guest_exit: None,
            problem: Some(problem),
            console: String::new(),
            results,
        }
    }

    /// The results read from a console, against the tests that were expected to run.
    pub fn from_console(
        expected: &[String],
        status: VmStatus,
        packages: Vec<Resolved>,
        console: &str,
        text: &str,
    ) -> Self {
        let mut found: Vec<TestRecord> = Vec::new();
        let mut guest_exit = None;
        for line in text.lines() {
            match parse_line(line.trim_end_matches('\r')) {
                ConsoleLine::Result(r) => {
                    found.retain(|f| f.test != r.test);
                    found.push(*r);
                }
                ConsoleLine::Unparsable(why) => {
                    let mut r = missing("<protocol>", &status.kernel, &format!("unparsable result line: {why}"));
                    r.output = line.to_owned();
                    found.push(r);
                }
                ConsoleLine::Exit(code) => guest_exit = Some(code),
                ConsoleLine::Other => {}
            }
        }
        let problem = match (status.vm_rc, guest_exit) {
            (124 | 137, _) => Some(format!("VM timed out (timeout rc {})", status.vm_rc)),
            (rc, None) => {
                Some(format!("VM ended without the test binary finishing (no ISTHMUS-EXIT line, VM rc {rc})"))
            }
            _ => None,
        };
        let mut results: Vec<Row> = expected
            .iter()
            .map(|name| {
                found.iter().find(|r| &r.test == name).cloned().unwrap_or_else(|| {
                    let why = problem.as_ref().map(|p| format!("no result: {p}")).unwrap_or_else(|| "no result".into());
                    missing(name, &status.kernel, &why)
                })
            })
            .map(|record| Row { record, first_boot: None })
            .collect();
        results.extend(
            found.into_iter().filter(|r| !expected.contains(&r.test)).map(|record| Row { record, first_boot: None }),
        );
        KernelReport {
            kernel: status.kernel.clone(),
            packages,
            status: Some(status),
            guest_exit,
            problem,
            console: console.into(),
            results,
        }
    }

    pub fn failed(&self) -> Vec<&str> {
        self.results.iter().filter(|r| r.record.outcome == TestOutcome::Fail).map(|r| r.record.test.as_str()).collect()
    }

    pub fn ok(&self) -> bool {
        self.problem.is_none() && self.failed().is_empty()
    }

    /// One `FAILED: <kernel>/<test>: <figures>` line per failed test (and one for a boot's problem): what the
    /// end of `make test` repeats for a failed stage (e2e/failures.py).
    pub fn failure_lines(&self) -> Vec<String> {
        let problem = self.problem.iter().map(|p| format!("FAILED: {}: {p}", self.kernel));
        let tests = self
            .results
            .iter()
            .filter(|r| r.record.outcome == TestOutcome::Fail)
            .map(|r| format!("FAILED: {}/{}: {}", self.kernel, r.record.test, r.record.summary));
        problem.chain(tests).collect()
    }

    /// Whether a fresh boot may judge its failed tests again: only a boot that ran to its end, with
    /// results, whose failures are single tests (a datapath fault fails the second boot too; a guest that
    /// crashed or a kernel without packages is not retried).
    pub fn retriable(&self) -> bool {
        self.problem.is_none() && !self.failed().is_empty()
    }

    /// Folds in a fresh boot's results for the tests that failed here: its verdict counts, the first
    /// boot's record is kept beside it and named in the summary.
    pub fn merge_rerun(&mut self, rerun: KernelReport) {
        for row in &mut self.results {
            if row.record.outcome != TestOutcome::Fail {
                continue;
            }
            let again = rerun.results.iter().find(|r| r.record.test == row.record.test).map(|r| r.record.clone());
            let again = again.unwrap_or_else(|| {
                let why = rerun.problem.clone().unwrap_or_else(|| "no result".into());
                missing(&row.record.test, &rerun.kernel, &format!("no result in the fresh boot: {why}"))
            });
            let first = std::mem::replace(&mut row.record, again);
            row.record.summary = format!(
                "{} in a fresh boot: {} [first boot failed: {}]",
                if row.record.outcome == TestOutcome::Fail { "failed again" } else { "passed" },
                row.record.summary,
                first.summary
            );
            row.first_boot = Some(first);
        }
        if let Some(p) = rerun.problem {
            self.problem.get_or_insert(format!("fresh boot: {p}"));
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let n_fail = self.failed().len();
        let status = self.status.as_ref().map_or_else(String::new, |s| {
            let exit = self.guest_exit.map_or_else(|| "none".to_owned(), |e| e.to_string());
            format!(" ({}): VM wall {:.1} s, host load {}, guest exit {exit},", s.backend, s.wall_s, s.host_load)
        });
        let _ =
            write!(out, "\n== {}{status} {} of {} ok", self.kernel, self.results.len() - n_fail, self.results.len());
        if let Some(p) = &self.problem {
            let _ = write!(out, " -- {p}");
        }
        out.push('\n');
        for p in &self.packages {
            let _ = writeln!(
                out,
                "  package {} {} ({}, {}, sha256 {})",
                p.package,
                p.version,
                p.suite,
                source(p),
                p.sha256
            );
        }
        let width = self.results.iter().map(|r| r.record.test.len()).max().unwrap_or(0).max(4);
        let _ = writeln!(out, "  {:<width$}  verdict  time(s)  summary", "test");
        for r in &self.results {
            let r = &r.record;
            let outcome = format!("{:?}", r.outcome).to_lowercase();
            let _ = writeln!(
                out,
                "  {:<width$}  {outcome:<7}  {:7.1}  {}",
                r.test,
                r.duration_ms as f64 / 1000.0,
                r.summary
            );
        }
        for r in self.results.iter().filter(|r| r.record.outcome == TestOutcome::Fail && !r.record.output.is_empty()) {
            let _ = writeln!(out, "\n  --- {} output ---", r.record.test);
            for l in r.record.output.lines() {
                let _ = writeln!(out, "  | {l}");
            }
        }
        if !self.console.is_empty() {
            let _ = writeln!(out, "  console: {}", self.console);
        }
        out
    }
}

fn source(p: &Resolved) -> &'static str {
    match p.source {
        super::rules::Source::Cache => "cached",
        super::rules::Source::Archive => "downloaded",
    }
}

fn missing(test: &str, kernel: &str, why: &str) -> TestRecord {
    TestRecord {
        test: test.into(),
        kernel: kernel.into(),
        backend: String::new(),
        outcome: TestOutcome::Fail,
        duration_ms: 0,
        summary: why.into(),
        output: String::new(),
        measurements: serde_json::Map::new(),
    }
}

pub fn summary_json(kernels: &[KernelReport]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "kernels": kernels })).expect("the report serializes")
}

/// XML 1.0 text: escaped, and without the control characters it cannot carry at all.
fn xml(text: &str) -> String {
    text.chars().filter(|&c| !c.is_control() || matches!(c, '\t' | '\n' | '\r')).fold(
        String::with_capacity(text.len()),
        |mut s, c| {
            match c {
                '&' => s.push_str("&amp;"),
                '<' => s.push_str("&lt;"),
                '>' => s.push_str("&gt;"),
                '"' => s.push_str("&quot;"),
                c => s.push(c),
            }
            s
        },
    )
}

pub fn junit(kernels: &[KernelReport]) -> String {
    let mut x = String::from("<?xml version='1.0' encoding='utf-8'?>\n<testsuites name=\"isthmus-kernel-tests\">");
    for k in kernels {
        let skipped = k.results.iter().filter(|r| r.record.outcome == TestOutcome::Skip).count();
        let _ = write!(
            x,
            "<testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{skipped}\">",
            xml(&k.kernel),
            k.results.len(),
            k.failed().len()
        );
        for r in k.results.iter().map(|r| &r.record) {
            let _ = write!(
                x,
                "<testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\">",
                xml(&k.kernel),
                xml(&r.test),
                r.duration_ms as f64 / 1000.0
            );
            match r.outcome {
                TestOutcome::Fail => {
                    let _ = write!(x, "<failure message=\"{}\">{}</failure>", xml(&r.summary), xml(&r.output));
                }
                TestOutcome::Skip => {
                    let _ = write!(x, "<skipped message=\"{}\" />", xml(&r.summary));
                }
                TestOutcome::Pass => {}
            }
            let _ = write!(x, "<system-out>{}</system-out></testcase>", xml(&r.output));
        }
        if let Some(p) = &k.problem {
            let _ = write!(
                x,
                "<testcase classname=\"{}\" name=\"&lt;vm&gt;\"><error message=\"{}\" /></testcase>",
                xml(&k.kernel),
                xml(p)
            );
        }
        x.push_str("</testsuite>");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(vm_rc: i32) -> VmStatus {
        VmStatus {
            kernel: "sid-uml-7.2".into(),
            backend: "uml".into(),
            host_load: "1.0..1.2".into(),
            vm_rc,
            wall_s: 60.0,
        }
    }

    fn line(test: &str, verdict: &str, summary: &str) -> String {
        format!(
            "ISTHMUS-RESULT {{\"test\":\"{test}\",\"kernel\":\"k\",\"backend\":\"uml\",\"verdict\":\"{verdict}\",\
             \"duration_ms\":1200,\"summary\":\"{summary}\",\"output\":\"log of {test}\",\"measurements\":{{}}}}"
        )
    }

    fn expected() -> Vec<String> {
        ["delay", "jitter", "rate_tbf"].map(String::from).to_vec()
    }

    #[test]
    fn missing_results_and_a_dead_guest_are_failures_with_the_reason() {
        let console = format!(
            "boot noise\n{}\n[ 1.2] oops{}\n",
            line("delay", "pass", "p50 20.5"),
            line("rate_tbf", "skip", "slow")
        );
        let k = KernelReport::from_console(&expected(), status(0), vec![], "c", &console);
        assert_eq!(
            k.problem.as_deref(),
            Some("VM ended without the test binary finishing (no ISTHMUS-EXIT line, VM rc 0)")
        );
        assert_eq!(k.failed(), ["jitter"]);
        assert!(k.results[1].record.summary.starts_with("no result: VM ended"));
        assert!(!k.ok() && !k.retriable(), "a guest that died is not retried");

        let k = KernelReport::from_console(&expected(), status(124), vec![], "c", "ISTHMUS-EXIT 0\n");
        assert_eq!(k.problem.as_deref(), Some("VM timed out (timeout rc 124)"));
        assert_eq!(k.failed().len(), 3);
        assert_eq!(k.failure_lines().len(), 4, "the boot's problem and each test: {:?}", k.failure_lines());
        assert_eq!(k.failure_lines()[0], "FAILED: sid-uml-7.2: VM timed out (timeout rc 124)");
    }

    #[test]
    fn a_fresh_boot_decides_a_failed_test_and_both_boots_are_kept() {
        let first = format!(
            "{}\n{}\n{}\nISTHMUS-EXIT 1\n",
            line("delay", "fail", "p50 28 ms"),
            line("jitter", "pass", "ok"),
            line("rate_tbf", "fail", "8.1 Mbit/s")
        );
        let mut k = KernelReport::from_console(&expected(), status(0), vec![], "c", &first);
        assert!(k.retriable());
        assert_eq!(k.failed(), ["delay", "rate_tbf"]);
        assert_eq!(
            k.failure_lines(),
            ["FAILED: sid-uml-7.2/delay: p50 28 ms", "FAILED: sid-uml-7.2/rate_tbf: 8.1 Mbit/s"]
        );
        let again = format!(
            "{}\n{}\nISTHMUS-EXIT 1\n",
            line("delay", "pass", "p50 20.4 ms"),
            line("rate_tbf", "fail", "8.0 Mbit/s")
        );
        let rerun = KernelReport::from_console(&["delay".into(), "rate_tbf".into()], status(0), vec![], "c2", &again);
        k.merge_rerun(rerun);
        assert_eq!(k.failed(), ["rate_tbf"]);
        assert_eq!(k.results[0].record.summary, "passed in a fresh boot: p50 20.4 ms [first boot failed: p50 28 ms]");
        assert_eq!(k.results[0].first_boot.as_ref().unwrap().summary, "p50 28 ms");
        assert!(k.results[2].record.summary.starts_with("failed again in a fresh boot"));
        let json = summary_json(std::slice::from_ref(&k));
        assert!(json.contains("\"first_boot\""), "{json}");
        assert!(k.render().contains("failed again"));
    }

    #[test]
    fn junit_is_escaped_and_counts() {
        let console = format!("{}\nISTHMUS-EXIT 1\n", line("delay", "fail", "a < b & \\u0001"));
        let k = KernelReport::from_console(&["delay".into()], status(0), vec![], "c", &console);
        let x = junit(&[
            k,
            KernelReport::unavailable("bookworm", &["delay".into()], "rule bookworm-kernel cannot be met".into()),
        ]);
        assert!(x.contains("<failure message=\"a &lt; b &amp; \">"), "{x}");
        assert!(x.contains("<testsuite name=\"bookworm\" tests=\"1\" failures=\"1\" skipped=\"0\">"), "{x}");
        assert!(x.contains("name=\"&lt;vm&gt;\"><error message=\"rule bookworm-kernel cannot be met\""), "{x}");
    }
}
