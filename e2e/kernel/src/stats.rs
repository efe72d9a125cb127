//! Order statistics of a sample: what the tests assert on (means, medians, spreads, ratios; never maxima).
//! Quantiles by the test kit's one rank convention (nearest rank, `isthmus_test_kit::stats`).

use isthmus_test_kit::stats::{Sorted, mean, std_dev};
use serde::Serialize;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub sd: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Summary> {
        let v = Sorted::of(values)?;
        Some(Summary {
            n: v.len(),
            mean: mean(values),
            sd: std_dev(values),
            p10: v.quantile(0.1),
            p50: v.median(),
            p90: v.quantile(0.9),
        })
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} mean={:.2} sd={:.2} p10={:.2} p50={:.2} p90={:.2}",
            self.n, self.mean, self.sd, self.p10, self.p50, self.p90
        )
    }
}

/// How far an observed ratio of `n` independent trials may stray from `p` before we call it wrong:
/// 4.5 standard deviations of the binomial proportion (a false alarm about once in 150 000 runs), plus a
/// little slack for the trials the measurement itself disturbs.
pub fn binomial_band(p: f64, n: usize) -> f64 {
    4.5 * (p * (1.0 - p) / n.max(1) as f64).sqrt() + 0.003
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_a_uniform_sample() {
        // nearest rank: the p-th percentile of 1..=100 is p
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!((s.n, s.p10, s.p50, s.p90), (100, 10.0, 50.0, 90.0));
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert!((s.sd - 28.866).abs() < 1e-3, "{}", s.sd);
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn binomial_band_narrows_with_trials() {
        assert!(binomial_band(0.1, 100) > binomial_band(0.1, 10_000));
        assert!((binomial_band(0.1, 2000) - 0.0332).abs() < 1e-3);
    }
}
