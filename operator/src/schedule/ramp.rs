//! A ramp's values and how long each holds. Pure, in whole units of the field (ns, bit/s, 10⁻⁹ %), so that every
//! step lands exactly on `from + k·step` and the last on `to`.

use isthmus_agent_api::schedule::MAX_PHASES;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub value: i128,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RampError {
    #[error("a step moves the value: it is above 0")]
    ZeroStep,
    #[error("{steps} steps: at most {max}; take longer steps", max = MAX_PHASES - 1)]
    TooManySteps { steps: u128 },
    #[error("{steps} steps over {over_ms} ms leave less than 1 ms to each; take longer steps or a longer ramp")]
    TooShort { steps: u128, over_ms: u64 },
}

/// `from`, `from ± step`, … each for an equal share of `over_ms` (the shares differ by at most 1 ms and add up to
/// `over_ms` exactly), then `to`, reached when `over_ms` has passed and held for one share (for ever when the
/// schedule holds its end).
pub fn steps(from: i128, to: i128, step: i128, over_ms: u64) -> Result<Vec<Step>, RampError> {
    if step <= 0 {
        return Err(RampError::ZeroStep);
    }
    let distance = (to - from).unsigned_abs();
    let n = distance.div_ceil(step as u128);
    if n == 0 {
        return Ok(vec![Step { value: to, duration_ms: over_ms.max(1) }]);
    }
    if n > (MAX_PHASES - 1) as u128 {
        return Err(RampError::TooManySteps { steps: n });
    }
    if u128::from(over_ms) < n {
        return Err(RampError::TooShort { steps: n, over_ms });
    }
    let sign = if to >= from { 1 } else { -1 };
    let share = |k: u128| (u128::from(over_ms) * k / n) as u64;
    let mut out: Vec<Step> = (0..n)
        .map(|k| Step { value: from + sign * (k as i128) * step, duration_ms: share(k + 1) - share(k) })
        .collect();
    out.push(Step { value: to, duration_ms: share(n) - share(n - 1) });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn latency_from_10_to_200_ms_in_10_ms_steps_over_a_minute() {
        let ms = 1_000_000i128;
        let s = steps(10 * ms, 200 * ms, 10 * ms, 60_000).unwrap();
        assert_eq!(s.len(), 20);
        assert_eq!(s[0], Step { value: 10 * ms, duration_ms: 3_157 });
        assert_eq!(s[18].value, 190 * ms);
        assert_eq!(s[19].value, 200 * ms);
        assert_eq!(s[..19].iter().map(|s| s.duration_ms).sum::<u64>(), 60_000);
    }

    #[test]
    fn a_last_step_short_of_a_whole_one_still_ends_on_to() {
        let s = steps(0, 25, 10, 3_000).unwrap();
        assert_eq!(s.iter().map(|s| s.value).collect::<Vec<_>>(), [0, 10, 20, 25]);
        let down = steps(25, 0, 10, 3_000).unwrap();
        assert_eq!(down.iter().map(|s| s.value).collect::<Vec<_>>(), [25, 15, 5, 0]);
        assert_eq!(steps(5, 5, 1, 100).unwrap(), [Step { value: 5, duration_ms: 100 }]);
    }

    #[test]
    fn impossible_ramps_say_why() {
        assert_eq!(steps(0, 10, 0, 1_000), Err(RampError::ZeroStep));
        assert_eq!(steps(0, 10_000, 1, 1_000_000), Err(RampError::TooManySteps { steps: 10_000 }));
        assert_eq!(steps(0, 100, 1, 99), Err(RampError::TooShort { steps: 100, over_ms: 99 }));
    }

    proptest! {
        #[test]
        fn every_step_is_exact_and_the_shares_add_up(
            from in -1_000_000i128..1_000_000,
            to in -1_000_000i128..1_000_000,
            step in 1i128..1_000_000,
            over in 1u64..10_000_000,
        ) {
            let whole = (to - from).unsigned_abs().div_ceil(step as u128);
            let s = match steps(from, to, step, over) {
                Ok(s) => s,
                Err(RampError::TooManySteps { steps }) => {
                    prop_assert!(steps == whole && whole > (MAX_PHASES - 1) as u128);
                    return Ok(());
                }
                Err(RampError::TooShort { steps, over_ms }) => {
                    prop_assert!(steps == whole && u128::from(over_ms) < whole);
                    return Ok(());
                }
                Err(RampError::ZeroStep) => return Err(TestCaseError::fail("a positive step refused")),
            };
            let n = s.len() - 1;
            prop_assert_eq!(n as u128, whole);
            prop_assert_eq!(s[n].value, to);
            let sign = if to >= from { 1 } else { -1 };
            for (k, st) in s[..n].iter().enumerate() {
                prop_assert_eq!(st.value, from + sign * k as i128 * step);
                prop_assert!(st.duration_ms >= 1);
                // Strictly between from and to, never past to.
                prop_assert!((to - st.value) * sign > 0);
            }
            if n > 0 {
                prop_assert_eq!(s[..n].iter().map(|s| s.duration_ms).sum::<u64>(), over);
                let (lo, hi) = (over / n as u64, over.div_ceil(n as u64));
                prop_assert!(s.iter().all(|st| st.duration_ms == lo || st.duration_ms == hi));
            }
        }
    }
}
