//! Samples read out of a Prometheus/OpenMetrics text exposition (what the operator's and the agent's `/metrics`
//! serve).

/// The sum of the samples of metric `name` whose labels include every one of `labels` (each written `key="value"`,
/// as in the text); with no `labels`, of all its samples. A metric of another name that begins with `name` is not
/// counted. Label values are taken to hold no `,`, `{` or `}`, as isthmus's own do.
pub fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let has: Vec<&str> = match rest {
                "" => Vec::new(),
                _ => rest.strip_prefix('{')?.strip_suffix('}')?.split(',').collect(),
            };
            labels.iter().all(|l| has.contains(l)).then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_summed_over_their_series_and_only_those_with_the_labels_count() {
        let text = "# TYPE isthmus_operator_status_patches counter\n\
                    isthmus_operator_status_patches_total{result=\"ok\",kind=\"link\"} 120\n\
                    isthmus_operator_status_patches_total{result=\"ok\",kind=\"gate\"} 5\n\
                    isthmus_operator_status_patches_total{result=\"error\",kind=\"link\"} 3\n\
                    isthmus_operator_reconciles_total 17\n\
                    isthmus_operator_reconciles_total_other 5\n\
                    # HELP isthmus_operator_reconciles_total 99\n\
                    isthmus_operator_reconcile_duration_seconds_count 17\n# EOF\n";
        assert_eq!(sum(text, "isthmus_operator_status_patches_total", &["result=\"ok\""]), 125.0);
        assert_eq!(sum(text, "isthmus_operator_status_patches_total", &["kind=\"link\"", "result=\"ok\""]), 120.0);
        assert_eq!(sum(text, "isthmus_operator_status_patches_total", &[]), 128.0);
        assert_eq!(sum(text, "isthmus_operator_reconciles_total", &[]), 17.0);
        assert_eq!(sum(text, "isthmus_operator_reconciles_total", &["result=\"ok\""]), 0.0);
        assert_eq!(sum(text, "isthmus_operator_absent_total", &[]), 0.0);
    }
}
