//! The parity table: each fidelity test through the tc tree and through the userspace datapath, side by side,
//! per kernel (the same traffic and tolerances; `tests/emulator.rs`). Pure: rendered from the kernels' reports.

use std::fmt::Write as _;

use super::report::KernelReport;
use crate::protocol::{BENCH_QUANTITIES, TestOutcome, TestRecord, USERSPACE_SUFFIX};

/// The longest part of a summary shown in a cell: the figures that decided the verdict come first.
const CELL: usize = 58;

/// The tests that have a userspace twin in any report, in the order they ran.
fn paired(kernels: &[KernelReport]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for k in kernels {
        for r in &k.results {
            if let Some(base) = r.record.test.strip_suffix(USERSPACE_SUFFIX)
                && !names.iter().any(|n| n == base)
            {
                names.push(base.to_owned());
            }
        }
    }
    names
}

fn find<'a>(kernel: &'a KernelReport, test: &str) -> Option<&'a TestRecord> {
    kernel.results.iter().map(|r| &r.record).find(|r| r.test == test)
}

fn cell(record: Option<&TestRecord>) -> String {
    let Some(r) = record else { return "-".to_owned() };
    let outcome = format!("{:?}", r.outcome).to_lowercase();
    let summary: String = r.summary.chars().take(CELL).collect();
    let cut = if r.summary.chars().count() > CELL { "…" } else { "" };
    format!("{outcome} {summary}{cut}")
}

/// One row per paired test and kernel: the tc run's verdict and figures, then the userspace run's; `-` where a
/// kernel did not run that side (the host has no netem, so no tc column). Empty when nothing is paired.
pub fn render(kernels: &[KernelReport]) -> String {
    let tests = paired(kernels);
    if tests.is_empty() {
        return String::new();
    }
    let test_w = tests.iter().map(String::len).max().unwrap_or(4).max(4);
    let kernel_w = kernels.iter().map(|k| k.kernel.len()).max().unwrap_or(6).max(6);
    let tc_w = CELL + 6;
    let mut out =
        String::from("\n== parity: each fidelity test through both datapaths (same traffic, same tolerances)\n");
    let _ = writeln!(out, "  {:<test_w$}  {:<kernel_w$}  {:<tc_w$}  userspace", "test", "kernel", "tc");
    for test in &tests {
        for k in kernels {
            let twin = format!("{test}{USERSPACE_SUFFIX}");
            let (tc, us) = (find(k, test), find(k, &twin));
            if tc.is_none() && us.is_none() {
                continue;
            }
            let _ = writeln!(out, "  {test:<test_w$}  {:<kernel_w$}  {:<tc_w$}  {}", k.kernel, cell(tc), cell(us));
        }
    }
    out
}

/// The benchmark's table: one row per quantity, one column per kernel and datapath that ran it, each cell the
/// median of the runs (`failed` where the run could not measure).
pub fn render_bench(kernels: &[KernelReport]) -> String {
    let mut columns: Vec<(String, &TestRecord)> = Vec::new();
    for k in kernels {
        for r in &k.results {
            let datapath = if r.record.test.ends_with(USERSPACE_SUFFIX) { "userspace" } else { "tc" };
            let short = k.kernel.split('-').next().unwrap_or(&k.kernel);
            columns.push((format!("{short} {datapath}"), &r.record));
        }
    }
    if columns.is_empty() {
        return String::new();
    }
    let width = BENCH_QUANTITIES.iter().map(|(_, what)| what.chars().count()).max().unwrap_or(8);
    let mut out = String::from("\n== benchmark: medians per kernel and datapath\n");
    let _ = write!(out, "  {:<width$}", "quantity");
    for (name, _) in &columns {
        let _ = write!(out, "  {name:>18}");
    }
    out.push('\n');
    for (key, what) in BENCH_QUANTITIES {
        let _ = write!(out, "  {what:<width$}", width = width);
        for (_, record) in &columns {
            let value = record.measurements.get(key).and_then(serde_json::Value::as_f64);
            let cell = match (record.outcome, value) {
                (TestOutcome::Pass, Some(v)) if v.abs() < 10.0 => format!("{v:.2}"),
                (TestOutcome::Pass, Some(v)) => format!("{v:.0}"),
                _ => "failed".to_owned(),
            };
            let _ = write!(out, "  {cell:>18}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig::report::VmStatus;

    fn kernel(name: &str, lines: &[(&str, &str, &str)]) -> KernelReport {
        let console: String = lines
            .iter()
            .map(|(t, v, s)| {
                format!(
                    "ISTHMUS-RESULT {{\"test\":\"{t}\",\"kernel\":\"{name}\",\"backend\":\"uml\",\"verdict\":\"{v}\",\
                     \"duration_ms\":1,\"summary\":\"{s}\",\"output\":\"\"}}\n"
                )
            })
            .collect::<String>()
            + "ISTHMUS-EXIT 0\n";
        let expected: Vec<String> = lines.iter().map(|(t, _, _)| t.to_string()).collect();
        let status =
            VmStatus { kernel: name.into(), backend: "uml".into(), host_load: "1..1".into(), vm_rc: 0, wall_s: 1.0 };
        KernelReport::from_console(&expected, status, vec![], "", &console)
    }

    #[test]
    fn twins_sit_side_by_side_per_kernel_and_unpaired_tests_stay_out() {
        let sid = kernel(
            "sid",
            &[
                ("probe_capabilities", "pass", "x"),
                ("delay", "pass", "p50 20.1"),
                ("delay.userspace", "fail", "p50 29.0"),
                ("jitter", "pass", "sd 5.7"),
            ],
        );
        let host = kernel("host", &[("delay.userspace", "pass", "p50 20.0")]);
        let table = render(&[sid, host]);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("  delay")).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].contains("sid") && rows[0].contains("pass p50 20.1") && rows[0].ends_with("fail p50 29.0"));
        assert!(rows[1].contains("host") && rows[1].contains(" - ") && rows[1].ends_with("pass p50 20.0"));
        assert!(!table.contains("jitter") && !table.contains("probe_capabilities"), "{table}");
        assert_eq!(render(&[kernel("sid", &[("delay", "pass", "x")])]), "");
    }

    #[test]
    fn the_benchmark_table_has_a_column_per_kernel_and_datapath() {
        let mut sid = kernel("sid-uml-7.2", &[("bench", "pass", "x"), ("bench.userspace", "fail", "y")]);
        sid.results[0].record.measurements.insert("added_us".into(), serde_json::json!(41.6));
        sid.results[0].record.measurements.insert("cpu_per_gbit".into(), serde_json::json!(0.934));
        let table = render_bench(&[sid]);
        assert!(table.contains("sid tc") && table.contains("sid userspace"), "{table}");
        let added = table.lines().find(|l| l.contains("one-way delay added")).unwrap();
        assert!(added.trim_end().ends_with("42              failed"), "{table}");
        let cpu = table.lines().find(|l| l.contains("1 Gbit/s 0 ms flow")).unwrap();
        assert!(cpu.contains(" 0.93 "), "{table}");
        assert_eq!(render_bench(&[]), "");
    }

    #[test]
    fn a_long_summary_is_cut_with_a_mark() {
        let long = "x".repeat(CELL + 10);
        let k = kernel("sid", &[("delay", "pass", &long), ("delay.userspace", "pass", "short")]);
        let table = render(&[k]);
        assert!(table.contains(&format!("pass {}…", "x".repeat(CELL))), "{table}");
    }
}
