//! `make fidelity`: every selected scenario run several times, then one table of every figure it measured — the
//! band it is judged against beside the median measured — gates and reports alike. Not a gate: a report outside its
//! band, or a failed run, is a row of the table (docs/benchmarks.md keeps a dated copy).

use isthmus_e2e::verdict::Kind;
use isthmus_test_kit::stats::median;

use crate::fixture::Fixture;
use crate::{Outcome, Scenario, run_one};

pub fn run(fixture: &Fixture, selected: &[&Scenario], runs: u32) -> String {
    let mut outcomes = Vec::new();
    for scenario in selected {
        for i in 1..=runs {
            println!("\nfidelity: {} run {i} of {runs}", scenario.0);
            outcomes.push(run_one(fixture, scenario));
        }
    }
    table(&outcomes)
}

fn fmt(x: f64) -> String {
    match x {
        f64::INFINITY => "∞".into(),
        f64::NEG_INFINITY => "−∞".into(),
        x => format!("{x:.2}"),
    }
}

/// The table, in markdown: a row per scenario and figure, in the order they were first measured.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut rows = vec![
        "| scenario | figure | kind | band (median of the runs') | measured: median (min–max) | in band | runs |"
            .to_owned(),
        "|---|---|---|---|---|---|---|".to_owned(),
    ];
    let mut scenarios: Vec<&str> = Vec::new();
    for o in outcomes {
        if !scenarios.contains(&o.name) {
            scenarios.push(o.name);
        }
    }
    for name in scenarios {
        let runs: Vec<&Outcome> = outcomes.iter().filter(|o| o.name == name).collect();
        let mut figures: Vec<(&str, Kind)> = Vec::new();
        for f in runs.iter().flat_map(|o| &o.figures) {
            if !figures.contains(&(f.what.as_str(), f.kind)) {
                figures.push((f.what.as_str(), f.kind));
            }
        }
        for &(what, kind) in &figures {
            let seen: Vec<_> =
                runs.iter().flat_map(|o| &o.figures).filter(|f| f.what == what && f.kind == kind).collect();
            let measured: Vec<f64> = seen.iter().map(|f| f.measured).collect();
            let bands: (Vec<f64>, Vec<f64>) = seen.iter().map(|f| f.band).unzip();
            let (lo, hi) = (median(&bands.0), median(&bands.1));
            let (min, max) =
                measured.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &m| (a.min(m), b.max(m)));
            rows.push(format!(
                "| {name} | {what} | {} | [{}, {}] | {} ({}–{}) | {} of {} | {} |",
                if kind == Kind::Gate { "gate" } else { "report" },
                fmt(lo),
                fmt(hi),
                fmt(median(&measured)),
                fmt(min),
                fmt(max),
                seen.iter().filter(|f| f.holds()).count(),
                seen.len(),
                runs.len()
            ));
        }
        if figures.is_empty() {
            // e.g. a refusal read from the link's status: checked, but nothing measured
            let passed = runs.iter().filter(|o| o.failure.is_none()).count();
            rows.push(format!(
                "| {name} | checks without a figure | gate | | | {passed} of {} | {} |",
                runs.len(),
                runs.len()
            ));
        }
        let failed: Vec<&&Outcome> = runs.iter().filter(|o| o.failure.is_some()).collect();
        if let Some(first) = failed.first() {
            rows.push(format!(
                "| {name} | runs that failed | gate | | first: {} | {} of {} passed | {} |",
                first.failure.as_deref().unwrap_or_default().replace('|', "/"),
                runs.len() - failed.len(),
                runs.len(),
                runs.len()
            ));
        }
    }
    rows.join("\n")
}
