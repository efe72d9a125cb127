//! The test registry, the per-test context and the runner that turns each test into one protocol line.

use std::fmt::Write as _;
use std::time::Instant;

use serde::Serialize;

use isthmus_kernel_tests::protocol::{TestOutcome, TestRecord, USERSPACE_SUFFIX, emit};

/// How the guest kernel runs; timing tolerances depend on it (QEMU TCG adds about 1–2 ms to every delay and
/// more under host load; UML is within a fraction of a millisecond on a quiet host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    QemuTcg,
    Uml,
    /// Anything else (a real machine): judged like UML.
    Native,
}

impl Backend {
    pub fn parse(s: &str) -> anyhow::Result<Backend> {
        match s {
            "qemu-tcg" => Ok(Backend::QemuTcg),
            "uml" => Ok(Backend::Uml),
            "native" => Ok(Backend::Native),
            other => anyhow::bail!("--backend: unknown backend {other:?} (qemu-tcg, uml, native)"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::QemuTcg => "qemu-tcg",
            Backend::Uml => "uml",
            Backend::Native => "native",
        }
    }
}

/// Which of the agent's datapaths a test drives (kernel checks drive none and say `Tc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The tc tree: HTB, netem, TBF, u32.
    Tc,
    /// The userspace datapath, for kernels without netem: a test of this kind is named `<name>.userspace`
    /// ([`isthmus_kernel_tests::protocol::USERSPACE_SUFFIX`]).
    Userspace,
}

pub enum Outcome {
    Pass,
    Skip(String),
}

/// A test's body.
pub type Run = fn(&mut Ctx) -> anyhow::Result<Outcome>;

pub struct Test {
    pub name: &'static str,
    pub run: Run,
    pub via: Via,
}

impl Test {
    pub const fn tc(name: &'static str, run: Run) -> Test {
        Test { name, run, via: Via::Tc }
    }

    /// `name` ends in [`USERSPACE_SUFFIX`].
    pub const fn userspace(name: &'static str, run: Run) -> Test {
        Test { name, run, via: Via::Userspace }
    }
}

pub struct Ctx {
    pub kernel: String,
    pub backend: Backend,
    pub via: Via,
    pub runtime: tokio::runtime::Runtime,
    output: String,
    summary: Vec<String>,
    /// Each failed attempt of a measurement that was taken again: `<what> attempt <n>: <why>`.
    retries: Vec<String>,
    measurements: serde_json::Map<String, serde_json::Value>,
}

/// How many times a measurement is taken before its failure counts (see [`Ctx::with_retries`]).
pub const MEASUREMENT_ATTEMPTS: u32 = 3;

impl Ctx {
    pub fn log(&mut self, line: impl AsRef<str>) {
        let _ = writeln!(self.output, "{}", line.as_ref());
    }

    /// A figure for the protocol line's `measurements` (and the README's tables).
    pub fn record(&mut self, key: &str, value: impl Serialize) {
        let value = serde_json::to_value(value).expect("measurements serialize");
        self.measurements.insert(key.to_owned(), value);
    }

    /// Adds a phrase to the one-line summary the host prints in its table.
    pub fn summarize(&mut self, phrase: impl Into<String>) {
        self.summary.push(phrase.into());
    }

    /// Runs a measurement with its assertions until it passes, at most [`MEASUREMENT_ATTEMPTS`] times, logging
    /// why each failed attempt failed and naming it in the test's summary line. This is the rig's one level of
    /// retries: `make kernel-test` does not boot a kernel again for failed tests. Timing on shared CPUs has outliers that last seconds (UML's timers wait for
    /// the host's scheduler: at host load 2–4 from other builds, single attempts read a 20 ms netem's median as
    /// 28 ms and a 10 ms one beside another stream as 15 ms); a real regression fails every attempt.
    pub fn with_retries<T>(
        &mut self,
        what: &str,
        mut attempt: impl FnMut(&mut Ctx) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut failed = 0;
        loop {
            match attempt(self) {
                Ok(v) => return Ok(v),
                Err(e) if failed + 1 < MEASUREMENT_ATTEMPTS => {
                    failed += 1;
                    self.log(format!(
                        "{what}: attempt {failed} of {MEASUREMENT_ATTEMPTS} failed: {e:#}; measuring once more"
                    ));
                    self.record(&format!("{what}.retried"), failed);
                    self.retries.push(format!("{what} attempt {failed}: {}", first_line(&format!("{e:#}"))));
                    self.summary.clear();
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The test's line in the host's table: its phrases, the failure's note first when it did not pass, and every
/// failed attempt that was taken again.
fn summary_line(phrases: &[String], retries: &[String], outcome: TestOutcome, note: Option<String>) -> String {
    let mut summary = phrases.join("; ");
    if outcome != TestOutcome::Pass {
        let note = note.unwrap_or_default();
        summary = if summary.is_empty() { note } else { format!("{note} [{summary}]") };
    }
    if !retries.is_empty() {
        summary = format!("{summary} (retried: {})", retries.join("; "));
    }
    summary
}

/// The first line of an error's text, at most 160 characters.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

pub struct RunConfig {
    pub kernel: String,
    pub backend: Backend,
}

/// Tests whose name equals one of the comma-separated filters (a tc test's name selects its userspace twin
/// too); a filter that names no test exactly selects every test whose name contains it.
pub fn select<'a>(tests: &'a [Test], filter: Option<&str>) -> anyhow::Result<Vec<&'a Test>> {
    let Some(filter) = filter else { return Ok(tests.iter().collect()) };
    let mut chosen = Vec::new();
    for f in filter.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let twin = format!("{f}{USERSPACE_SUFFIX}");
        let exact: Vec<&Test> = tests.iter().filter(|t| t.name == f || t.name == twin).collect();
        let matched = if exact.is_empty() { tests.iter().filter(|t| t.name.contains(f)).collect() } else { exact };
        if matched.is_empty() {
            anyhow::bail!("--test: no test matches {f:?}");
        }
        for t in matched {
            if !chosen.iter().any(|c: &&Test| c.name == t.name) {
                chosen.push(t);
            }
        }
    }
    Ok(chosen)
}

/// Runs the tests one after the other, each emitting its protocol line; true when none failed.
pub fn run(tests: &[&Test], config: &RunConfig) -> bool {
    let mut all_ok = true;
    for test in tests {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let mut ctx = Ctx {
            kernel: config.kernel.clone(),
            backend: config.backend,
            via: test.via,
            runtime,
            output: String::new(),
            summary: Vec::new(),
            retries: Vec::new(),
            measurements: serde_json::Map::new(),
        };
        let start = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (test.run)(&mut ctx)));
        let duration_ms = start.elapsed().as_millis() as u64;
        let (outcome, note) = match result {
            Ok(Ok(Outcome::Pass)) => (TestOutcome::Pass, None),
            // A test skips only what the host it runs on cannot have; in the rig's guests everything it needs
            // is there, so a skip there is a measurement not made, and fails.
            Ok(Ok(Outcome::Skip(why))) if config.backend == Backend::Native => (TestOutcome::Skip, Some(why)),
            Ok(Ok(Outcome::Skip(why))) => {
                (TestOutcome::Fail, Some(format!("skipped in the rig's guest, where it must measure: {why}")))
            }
            Ok(Err(e)) => (TestOutcome::Fail, Some(format!("{e:#}"))),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panic".to_owned());
                (TestOutcome::Fail, Some(format!("panicked: {msg}")))
            }
        };
        if let Some(note) = &note {
            ctx.log(format!("{outcome:?}: {note}"));
        }
        let summary = summary_line(&ctx.summary, &ctx.retries, outcome, note);
        all_ok &= outcome != TestOutcome::Fail;
        // the runtime (and with it any datapath connection) goes before the next test's namespaces appear
        let Ctx { output, measurements, runtime, kernel, .. } = ctx;
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        emit(&TestRecord {
            test: test.name.to_owned(),
            kernel,
            backend: config.backend.name().to_owned(),
            outcome,
            duration_ms,
            summary,
            output,
            measurements,
        });
    }
    all_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: &mut Ctx) -> anyhow::Result<Outcome> {
        Ok(Outcome::Pass)
    }

    #[test]
    fn every_retry_is_in_the_summary_line() {
        let phrases = vec!["delay 20ms p50 20.1 ms".to_owned()];
        assert_eq!(summary_line(&phrases, &[], TestOutcome::Pass, None), "delay 20ms p50 20.1 ms");
        let retries = vec!["delay attempt 1: p50 28.0 ms above 25.0 ms".to_owned()];
        assert_eq!(
            summary_line(&phrases, &retries, TestOutcome::Pass, None),
            "delay 20ms p50 20.1 ms (retried: delay attempt 1: p50 28.0 ms above 25.0 ms)"
        );
        let failed = summary_line(&[], &retries, TestOutcome::Fail, Some("p50 29 ms".into()));
        assert_eq!(failed, "p50 29 ms (retried: delay attempt 1: p50 28.0 ms above 25.0 ms)");
        assert_eq!(first_line(&format!("{}\nsecond", "x".repeat(200))).chars().count(), 161);
    }

    #[test]
    fn selection_by_exact_name_substring_and_list() {
        let tests = [
            Test::tc("loss_random", noop),
            Test::tc("loss_gilbert_elliott", noop),
            Test::tc("delay", noop),
            Test::userspace("delay.userspace", noop),
        ];
        let names = |f| select(&tests, Some(f)).unwrap().iter().map(|t| t.name).collect::<Vec<_>>();
        assert_eq!(names("delay"), ["delay", "delay.userspace"]);
        assert_eq!(names("delay.userspace"), ["delay.userspace"]);
        assert_eq!(names(".userspace"), ["delay.userspace"]);
        assert_eq!(names("loss"), ["loss_random", "loss_gilbert_elliott"]);
        assert_eq!(names("delay,loss_random,delay"), ["delay", "delay.userspace", "loss_random"]);
        assert!(select(&tests, Some("nothing")).is_err());
        assert_eq!(select(&tests, None).unwrap().len(), 4);
    }
}
