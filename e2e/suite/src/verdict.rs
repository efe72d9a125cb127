//! What a scenario decides, and what it only measures.
//!
//! The cluster's emulated nodes share two cores with the control plane: an unimpaired round trip between pods
//! spreads from 2 to 70 ms there, and a TCP flow gets what CPU is left. So a scenario asserts only what a busy CPU
//! cannot fake — a **gate**: a delay's floor (load only lengthens a round trip), a cap never exceeded, a count per
//! packet, state read from the node. Two-sided figures (a jitter's spread, goodput near a rate, a head-of-line
//! p90) are **reports**: printed beside their band and collected, never failing the gate; `make fidelity` runs the
//! scenarios several times and tabulates them (medians), and the stock-kernel rig proves the same bands where the
//! machine can deliver them (e2e/kernel).

use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gate,
    Report,
}

/// One figure a scenario measured, with the band it is judged against.
#[derive(Clone, Debug)]
pub struct Figure {
    pub what: String,
    pub measured: f64,
    pub band: (f64, f64),
    pub why: String,
    pub kind: Kind,
}

impl Figure {
    pub fn holds(&self) -> bool {
        self.band.0 <= self.measured && self.measured <= self.band.1
    }

    fn line(&self) -> String {
        let band = match self.band {
            (lo, hi) if hi == f64::INFINITY => format!(">= {lo:.3}"),
            (lo, hi) if lo == f64::NEG_INFINITY => format!("<= {hi:.3}"),
            (lo, hi) => format!("in [{lo:.3}, {hi:.3}]"),
        };
        format!("{}: {:.3} {band}  ({})", self.what, self.measured, self.why)
    }
}

static FIGURES: Mutex<Vec<Figure>> = Mutex::new(Vec::new());

fn record(figure: Figure) -> Figure {
    FIGURES.lock().unwrap_or_else(|e| e.into_inner()).push(figure.clone());
    figure
}

/// The figures recorded since the last call (the runner takes them after each scenario run).
pub fn take() -> Vec<Figure> {
    std::mem::take(&mut *FIGURES.lock().unwrap_or_else(|e| e.into_inner()))
}

fn gate(what: &str, measured: f64, band: (f64, f64), why: &str) {
    let f = record(Figure { what: what.into(), measured, band, why: why.into(), kind: Kind::Gate });
    println!("gate   {}", f.line());
    assert!(f.holds(), "{}", f.line());
}

/// Gate: `measured >= lo`.
pub fn at_least(what: &str, measured: f64, lo: f64, why: &str) {
    gate(what, measured, (lo, f64::INFINITY), why);
}

/// Gate: `measured <= hi`.
pub fn at_most(what: &str, measured: f64, hi: f64, why: &str) {
    gate(what, measured, (f64::NEG_INFINITY, hi), why);
}

/// Gate, two-sided: for counts per packet (a proportion's band from its sampling error), which CPU load does not
/// move.
pub fn within(what: &str, measured: f64, band: (f64, f64), why: &str) {
    gate(what, measured, band, why);
}

/// Report: printed and collected, never failing.
pub fn report(what: &str, measured: f64, band: (f64, f64), why: &str) {
    let f = record(Figure { what: what.into(), measured, band, why: why.into(), kind: Kind::Report });
    println!(
        "report {} -> {}",
        f.line(),
        if f.holds() { "in band" } else { "OUTSIDE the band (a report, not a gate)" }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_fail_reports_do_not_and_both_are_kept() {
        take();
        at_least("floor", 10.0, 9.0, "why");
        report("spread", 50.0, (40.0, 45.0), "why");
        let failed = std::panic::catch_unwind(|| at_most("cap", 11.0, 10.0, "why"));
        assert!(failed.is_err());
        let figures = take();
        assert_eq!(
            figures.iter().map(|f| (f.kind, f.holds())).collect::<Vec<_>>(),
            [(Kind::Gate, true), (Kind::Report, false), (Kind::Gate, false)]
        );
        assert!(take().is_empty());
    }
}
