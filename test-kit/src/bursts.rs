//! Loss bursts: the maximal runs of consecutive lost sequence numbers, in sequence order. What a
//! Gilbert–Elliott link's bad state shows as; independent loss of the same ratio gives runs of about one.
//!
//! The input is one flag per sequence number sent, in sequence order: `true` where it was received (what
//! counts as received is the caller's: the probe counts a late reply as lost).

/// The length of each run of lost sequence numbers, in sequence order.
pub fn runs(received: impl IntoIterator<Item = bool>) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut run = 0;
    for got in received {
        if got {
            if run > 0 {
                runs.push(run);
            }
            run = 0;
        } else {
            run += 1;
        }
    }
    if run > 0 {
        runs.push(run);
    }
    runs
}

/// The runs of lost sequence numbers, summed up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossBursts {
    pub count: u64,
    /// Sequence numbers lost in all the runs: every one lost.
    pub lost: u64,
    pub max_length: u64,
}

impl LossBursts {
    pub fn of(received: impl IntoIterator<Item = bool>) -> LossBursts {
        runs(received).into_iter().fold(LossBursts::default(), |b, run| LossBursts {
            count: b.count + 1,
            lost: b.lost + run as u64,
            max_length: b.max_length.max(run as u64),
        })
    }

    /// The mean length of a run; `None` without any.
    pub fn mean_length(&self) -> Option<f64> {
        (self.count > 0).then(|| self.lost as f64 / self.count as f64)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn flags(received: &str) -> Vec<bool> {
        received.chars().map(|c| c == '+').collect()
    }

    #[test]
    fn runs_of_consecutive_losses_in_sequence_order() {
        // 10 sent; 3, 4 and 8 lost
        assert_eq!(runs(flags("+++--+++-+")), vec![2, 1]);
        // lost at both ends
        assert_eq!(runs(flags("-++---")), vec![1, 3]);
        assert_eq!(runs(flags("+++")), Vec::<usize>::new());
        assert_eq!(runs(flags("")), Vec::<usize>::new());
    }

    #[test]
    fn summed_up() {
        let b = LossBursts::of(flags("+--+++---+-"));
        assert_eq!(b, LossBursts { count: 3, lost: 6, max_length: 3 });
        assert_eq!(b.mean_length(), Some(2.0));
        assert_eq!(LossBursts::of(flags("---")), LossBursts { count: 1, lost: 3, max_length: 3 });
        assert_eq!(LossBursts::of(flags("++")).mean_length(), None);
    }

    proptest! {
        #[test]
        fn every_loss_is_in_exactly_one_run(received in prop::collection::vec(any::<bool>(), 0..300)) {
            let r = runs(received.iter().copied());
            let lost = received.iter().filter(|g| !**g).count();
            prop_assert_eq!(r.iter().sum::<usize>(), lost);
            prop_assert!(r.iter().all(|&n| n > 0));
            let starts = received.iter().enumerate().filter(|&(i, g)| !g && (i == 0 || received[i - 1])).count();
            prop_assert_eq!(r.len(), starts);
        }
    }
}
