//! Order statistics of a sample, by one rank convention: nearest rank.
//!
//! The q-quantile (0 ≤ q ≤ 1) of n samples is the ⌈n·q⌉-th smallest, and the smallest when n·q < 1: the
//! smallest sample such that at least a fraction q of the samples are less than or equal to it. It is always
//! an observed value; the median (q = ½) is the middle sample of an odd count and the lower of the two middle
//! ones of an even count. The 0-based index is [`rank`]: ⌈n·q⌉ − 1, clamped to the samples.
//!
//! [`quantile`] and [`median`] take the samples in any order and sort a copy; [`Sorted`] sorts once for
//! several quantiles of one sample.

use std::cmp::Ordering;
use std::ops::Deref;
use std::time::Duration;

/// What a sample can hold: values with a total order (floating point by `total_cmp`, so NaN sorts last
/// instead of panicking).
pub trait Sample: Copy {
    fn order(&self, other: &Self) -> Ordering;
}

impl Sample for f64 {
    fn order(&self, other: &Self) -> Ordering {
        self.total_cmp(other)
    }
}

impl Sample for Duration {
    fn order(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

impl Sample for u64 {
    fn order(&self, other: &Self) -> Ordering {
        self.cmp(other)
    }
}

/// The 0-based index of the q-quantile among `n` ascending samples: ⌈n·q⌉ − 1, clamped to `0..n`.
///
/// # Panics
/// When `n` is 0: no sample has a rank.
pub fn rank(n: usize, q: f64) -> usize {
    assert!(n > 0, "a quantile of no samples");
    ((n as f64 * q).ceil() as usize).clamp(1, n) - 1
}

/// The q-quantile of `values`, in any order (a sorted copy is read).
///
/// # Panics
/// When `values` is empty.
pub fn quantile<T: Sample>(values: &[T], q: f64) -> T {
    Sorted::of(values).expect("a quantile of no samples").quantile(q)
}

/// The median of `values`, in any order: the 0.5-quantile.
///
/// # Panics
/// When `values` is empty.
pub fn median<T: Sample>(values: &[T]) -> T {
    quantile(values, 0.5)
}

/// The arithmetic mean, summed in the order given; NaN for no values.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The population standard deviation (squared deviations from the mean over n); NaN for no values.
pub fn std_dev(values: &[f64]) -> f64 {
    let m = mean(values);
    (values.iter().map(|x| (x - m).powi(2)).sum::<f64>() / values.len() as f64).sqrt()
}

/// At least one sample, in ascending order; a slice of them through `Deref`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sorted<T>(Vec<T>);

impl<T: Sample> Sorted<T> {
    /// `values` sorted; `None` when there are none.
    pub fn new(mut values: Vec<T>) -> Option<Sorted<T>> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(T::order);
        Some(Sorted(values))
    }

    /// A sorted copy of `values`; `None` when there are none.
    pub fn of(values: &[T]) -> Option<Sorted<T>> {
        Sorted::new(values.to_vec())
    }

    /// The q-quantile, by nearest rank ([`rank`]).
    pub fn quantile(&self, q: f64) -> T {
        self.0[rank(self.0.len(), q)]
    }

    pub fn median(&self) -> T {
        self.quantile(0.5)
    }

    pub fn min(&self) -> T {
        self.0[0]
    }

    pub fn max(&self) -> T {
        self.0[self.0.len() - 1]
    }
}

impl<T> Deref for Sorted<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&samples, 0.5), 50.0);
        assert_eq!(quantile(&samples, 0.9), 90.0);
        assert_eq!(quantile(&samples, 0.99), 99.0);
        assert_eq!(quantile(&samples, 1.0), 100.0);
        assert_eq!(quantile(&samples, 0.0), 1.0);
        let few = [10.0, 20.0, 30.0];
        assert_eq!(quantile(&few, 0.5), 20.0);
        assert_eq!(quantile(&few, 0.9), 30.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn the_median_of_an_even_count_is_the_lower_middle_sample() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[Duration::from_millis(9), Duration::from_millis(1)]), Duration::from_millis(1));
        assert_eq!(median(&[5u64, 3, 4]), 4);
    }

    #[test]
    fn sorted_reads_its_ends_and_refuses_no_samples() {
        let s = Sorted::of(&[3.0, -1.0, 2.0]).unwrap();
        assert_eq!((s.min(), s.median(), s.max(), s.len()), (-1.0, 2.0, 3.0, 3));
        assert_eq!(&s[..], &[-1.0, 2.0, 3.0]);
        assert_eq!(Sorted::<f64>::of(&[]), None);
    }

    #[test]
    #[should_panic(expected = "a quantile of no samples")]
    fn a_quantile_of_no_samples_panics() {
        median::<f64>(&[]);
    }

    #[test]
    fn mean_and_population_std_dev() {
        assert_eq!(mean(&[4.0, 2.0, 6.0, 8.0]), 5.0);
        assert!((std_dev(&[4.0, 2.0, 6.0, 8.0]) - 5.0f64.sqrt()).abs() < 1e-12);
        assert_eq!(std_dev(&[3.5]), 0.0);
    }

    fn samples() -> impl Strategy<Value = Vec<f64>> {
        prop::collection::vec(-1e6..1e6f64, 1..200)
    }

    proptest! {
        #[test]
        fn a_quantile_is_monotone_in_q(v in samples(), a in 0.0..=1.0f64, b in 0.0..=1.0f64) {
            let s = Sorted::of(&v).unwrap();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(s.quantile(lo) <= s.quantile(hi));
        }

        #[test]
        fn a_quantile_is_an_observed_value_within_min_and_max(v in samples(), q in 0.0..=1.0f64) {
            let x = quantile(&v, q);
            prop_assert!(v.contains(&x));
            let s = Sorted::of(&v).unwrap();
            prop_assert!(s.min() <= x && x <= s.max());
        }

        #[test]
        fn the_median_of_an_odd_count_is_the_middle_sample(mut v in samples()) {
            if v.len() % 2 == 0 {
                v.pop();
            }
            prop_assume!(!v.is_empty());
            v.sort_by(f64::total_cmp);
            prop_assert_eq!(median(&v), v[v.len() / 2]);
        }

        #[test]
        fn at_least_a_fraction_q_is_at_most_the_q_quantile(v in samples(), q in 0.0..=1.0f64) {
            let x = quantile(&v, q);
            let at_most = v.iter().filter(|&&s| s <= x).count();
            prop_assert!(at_most as f64 >= q * v.len() as f64 - 1e-9);
        }

        #[test]
        fn the_order_of_the_samples_does_not_matter(v in samples(), q in 0.0..=1.0f64) {
            let mut reversed = v.clone();
            reversed.reverse();
            prop_assert_eq!(quantile(&v, q), quantile(&reversed, q));
        }
    }
}
