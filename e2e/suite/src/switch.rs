//! Where a run of probes switches to a delay for good, and whether the run can tell.
//!
//! Load only lengthens a round trip, so a probe answered faster than the delay's floor (or not answered) was not
//! delayed; the switch is the probe after the last such one. A switch is decided only with a sustained run of
//! delayed probes after it: a last probe that happens to spike above the floor on a busy machine is not one.

/// What a run of probes says about a switch to a delay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Switch {
    /// From probe `index` (sent `at_ms` after the first) to the end every probe was answered at or above the floor,
    /// and there are at least the required number of them.
    At { index: usize, at_ms: f64 },
    /// Only the last `run` probes (fewer than required) were delayed, from the one sent at `at_ms`: the window ended
    /// too soon after it to tell a switch from a spike.
    TooSoon { index: usize, at_ms: f64, run: usize },
    /// The last probe was not delayed.
    Never,
}

/// The switch in `samples` (each: sent ms after the first probe, round trip ms or None when lost) to round trips
/// of at least `floor_ms`, decided only with `min_run` delayed probes after it.
pub fn switch_to(samples: &[(f64, Option<f64>)], floor_ms: f64, min_run: usize) -> Switch {
    let delayed = |s: &(f64, Option<f64>)| s.1.is_some_and(|rtt| rtt >= floor_ms);
    let index = samples.iter().rposition(|s| !delayed(s)).map_or(0, |i| i + 1);
    let Some(&(at_ms, _)) = samples.get(index) else { return Switch::Never };
    let run = samples.len() - index;
    if run < min_run { Switch::TooSoon { index, at_ms, run } } else { Switch::At { index, at_ms } }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rtts: &[Option<f64>]) -> Vec<(f64, Option<f64>)> {
        rtts.iter().enumerate().map(|(i, r)| (i as f64 * 20.0, *r)).collect()
    }

    #[test]
    fn the_switch_is_after_the_last_fast_or_lost_probe() {
        let s = run(&[Some(2.0), Some(45.0), Some(3.0), None, Some(41.0), Some(42.0), Some(80.0)]);
        assert_eq!(switch_to(&s, 40.0, 3), Switch::At { index: 4, at_ms: 80.0 });
        // a spike before the switch cannot fake it, nor a lost probe after one
        assert_eq!(switch_to(&s, 40.0, 4), Switch::TooSoon { index: 4, at_ms: 80.0, run: 3 });
    }

    #[test]
    fn a_last_probe_that_spikes_is_not_a_switch() {
        let s = run(&[Some(2.0); 149].iter().copied().chain([Some(60.0)]).collect::<Vec<_>>());
        assert_eq!(switch_to(&s, 39.5, 50), Switch::TooSoon { index: 149, at_ms: 2980.0, run: 1 });
        assert_eq!(switch_to(&run(&[Some(2.0), Some(3.0)]), 39.5, 1), Switch::Never);
        assert_eq!(switch_to(&[], 39.5, 1), Switch::Never);
    }

    #[test]
    fn delayed_from_the_first_probe() {
        assert_eq!(switch_to(&run(&[Some(50.0); 5]), 40.0, 5), Switch::At { index: 0, at_ms: 0.0 });
    }
}
