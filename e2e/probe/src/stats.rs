//! Accounting of probe replies (loss, duplicates, reordering, late replies) and round-trip statistics.

pub use isthmus_test_kit::bursts::LossBursts;
use isthmus_test_kit::stats::{Sorted, mean, std_dev};
use serde_json::{Value, json};

/// What happened to one probe sequence number so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SeqState {
    Unanswered,
    Answered,
    /// The first reply came after the timeout: the probe counts as lost.
    AnsweredLate,
}

/// How one arriving reply was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// First reply for this sequence number, within the timeout.
    Fresh { reordered: bool },
    /// First reply for this sequence number, after the timeout.
    Late,
    /// Another copy of a sequence number already answered (in time or late).
    Duplicate,
    /// A sequence number this run never sent: ignored.
    Unknown,
}

/// Tracks replies by sequence number. A reply is *reordered* when it is the first reply for its
/// sequence number and a higher sequence number was already answered (RFC 4737's "reordered"
/// singleton definition, applied to the echoed stream as the prober sees it).
#[derive(Debug)]
pub struct SequenceTracker {
    states: Vec<SeqState>,
    sent: u64,
    received: u64,
    late: u64,
    duplicates: u64,
    reordered: u64,
    highest_answered: Option<u64>,
}

impl SequenceTracker {
    pub fn new(capacity: u64) -> Self {
        SequenceTracker {
            states: vec![SeqState::Unanswered; capacity as usize],
            sent: 0,
            received: 0,
            late: 0,
            duplicates: 0,
            reordered: 0,
            highest_answered: None,
        }
    }

    /// Records that the probe with the next sequence number went out; returns that number.
    pub fn record_sent(&mut self) -> u64 {
        let seq = self.sent;
        self.sent += 1;
        seq
    }

    pub fn record_reply(&mut self, seq: u64, in_time: bool) -> ReplyKind {
        if seq >= self.sent {
            return ReplyKind::Unknown;
        }
        let state = &mut self.states[seq as usize];
        match *state {
            SeqState::Answered | SeqState::AnsweredLate => {
                self.duplicates += 1;
                ReplyKind::Duplicate
            }
            SeqState::Unanswered if !in_time => {
                *state = SeqState::AnsweredLate;
                self.late += 1;
                ReplyKind::Late
            }
            SeqState::Unanswered => {
                *state = SeqState::Answered;
                self.received += 1;
                let reordered = self.highest_answered.is_some_and(|highest| seq < highest);
                if reordered {
                    self.reordered += 1;
                }
                self.highest_answered = Some(self.highest_answered.map_or(seq, |h| h.max(seq)));
                ReplyKind::Fresh { reordered }
            }
        }
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// Probes without a reply in time: never answered, or answered after the timeout.
    pub fn lost(&self) -> u64 {
        self.sent - self.received
    }

    /// Probes sent and not answered yet, in time or late.
    pub fn outstanding(&self) -> u64 {
        self.sent - self.received - self.late
    }

    pub fn late(&self) -> u64 {
        self.late
    }

    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    pub fn reordered(&self) -> u64 {
        self.reordered
    }

    pub fn loss_ratio(&self) -> f64 {
        if self.sent == 0 { 0.0 } else { self.lost() as f64 / self.sent as f64 }
    }

    /// Runs of consecutive lost probes (never answered, or answered late), in sequence order: what a
    /// Gilbert–Elliott link's bad state shows as.
    pub fn loss_bursts(&self) -> LossBursts {
        LossBursts::of(self.states.iter().take(self.sent as usize).map(|s| *s == SeqState::Answered))
    }
}

/// `loss_bursts` in the report: count, mean length (null without any) and longest run.
pub fn bursts_json(bursts: LossBursts) -> Value {
    json!({"count": bursts.count, "mean_length": bursts.mean_length(), "max_length": bursts.max_length})
}

/// Summary of round-trip samples, in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct RttSummary {
    pub min: f64,
    pub mean: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    /// Population standard deviation.
    pub stddev: f64,
    /// Mean absolute difference between consecutive samples in arrival order (RFC 3550's
    /// inter-arrival jitter without its smoothing): what a configured netem jitter shows as.
    pub jitter: f64,
}

impl RttSummary {
    /// `samples` in arrival order. None when there are none.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        let sorted = Sorted::of(samples)?;
        let n = samples.len() as f64;
        let jitter = if samples.len() < 2 {
            0.0
        } else {
            samples.windows(2).map(|w| (w[1] - w[0]).abs()).sum::<f64>() / (n - 1.0)
        };
        Some(RttSummary {
            min: sorted.min(),
            mean: mean(samples),
            p10: sorted.quantile(0.10),
            p50: sorted.median(),
            p90: sorted.quantile(0.90),
            p99: sorted.quantile(0.99),
            max: sorted.max(),
            stddev: std_dev(samples),
            jitter,
        })
    }

    pub fn to_json(summary: Option<&Self>) -> Value {
        match summary {
            Some(s) => json!({
                "min": round_us(s.min),
                "mean": round_us(s.mean),
                "p10": round_us(s.p10),
                "p50": round_us(s.p50),
                "p90": round_us(s.p90),
                "p99": round_us(s.p99),
                "max": round_us(s.max),
                "stddev": round_us(s.stddev),
                "jitter": round_us(s.jitter),
            }),
            None => json!({
                "min": null, "mean": null, "p10": null, "p50": null, "p90": null, "p99": null,
                "max": null, "stddev": null, "jitter": null,
            }),
        }
    }
}

/// Milliseconds rounded to the microsecond: finer digits are clock noise and bloat the output.
fn round_us(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(n: u64) -> SequenceTracker {
        let mut t = SequenceTracker::new(n);
        for _ in 0..n {
            t.record_sent();
        }
        t
    }

    #[test]
    fn summary_of_known_samples() {
        // Arrival order matters for jitter only.
        let s = RttSummary::from_samples(&[4.0, 2.0, 6.0, 8.0]).unwrap();
        assert_eq!(s.min, 2.0);
        assert_eq!(s.max, 8.0);
        assert_eq!(s.mean, 5.0);
        assert_eq!(s.p10, 2.0);
        assert_eq!(s.p50, 4.0);
        assert_eq!(s.p90, 8.0);
        assert!((s.stddev - 5.0f64.sqrt()).abs() < 1e-12);
        // |2-4| + |6-2| + |8-6| = 8 over 3 differences.
        assert!((s.jitter - 8.0 / 3.0).abs() < 1e-12);
        assert_eq!(RttSummary::from_samples(&[]), None);
        let one = RttSummary::from_samples(&[3.5]).unwrap();
        assert_eq!((one.stddev, one.jitter, one.p99), (0.0, 0.0, 3.5));
    }

    #[test]
    fn empty_summary_serializes_as_nulls_with_the_same_fields() {
        let some = RttSummary::to_json(RttSummary::from_samples(&[1.0]).as_ref());
        let none = RttSummary::to_json(None);
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&some), keys(&none));
        assert!(none.as_object().unwrap().values().all(Value::is_null));
    }

    #[test]
    fn in_order_replies_are_all_fresh() {
        let mut t = sent(5);
        for seq in 0..5 {
            assert_eq!(t.record_reply(seq, true), ReplyKind::Fresh { reordered: false });
        }
        assert_eq!((t.received(), t.lost(), t.duplicates(), t.reordered()), (5, 0, 0, 0));
        assert_eq!(t.loss_ratio(), 0.0);
    }

    #[test]
    fn missing_replies_are_lost() {
        let mut t = sent(4);
        t.record_reply(0, true);
        t.record_reply(3, true);
        assert_eq!((t.sent(), t.received(), t.lost()), (4, 2, 2));
        assert_eq!(t.loss_ratio(), 0.5);
    }

    #[test]
    fn duplicates_are_counted_once_each_and_not_as_received() {
        let mut t = sent(3);
        t.record_reply(0, true);
        assert_eq!(t.record_reply(0, true), ReplyKind::Duplicate);
        assert_eq!(t.record_reply(0, true), ReplyKind::Duplicate);
        t.record_reply(1, true);
        assert_eq!((t.received(), t.duplicates(), t.lost()), (2, 2, 1));
    }

    #[test]
    fn an_earlier_sequence_after_a_later_one_is_reordered() {
        let mut t = sent(5);
        t.record_reply(0, true);
        t.record_reply(2, true);
        assert_eq!(t.record_reply(1, true), ReplyKind::Fresh { reordered: true });
        t.record_reply(4, true);
        assert_eq!(t.record_reply(3, true), ReplyKind::Fresh { reordered: true });
        assert_eq!((t.received(), t.reordered(), t.lost()), (5, 2, 0));
        // A duplicate of an old sequence is a duplicate, not a reordering.
        assert_eq!(t.record_reply(1, true), ReplyKind::Duplicate);
        assert_eq!(t.reordered(), 2);
    }

    #[test]
    fn late_replies_count_as_lost_and_their_copies_as_duplicates() {
        let mut t = SequenceTracker::new(3);
        t.record_sent();
        t.record_sent();
        assert_eq!(t.record_reply(0, false), ReplyKind::Late);
        assert_eq!(t.record_reply(0, true), ReplyKind::Duplicate);
        t.record_reply(1, true);
        assert_eq!((t.received(), t.late(), t.lost(), t.duplicates()), (1, 1, 1, 1));
        assert_eq!(t.outstanding(), 0);
        t.record_sent();
        assert_eq!(t.outstanding(), 1);
    }

    #[test]
    fn replies_to_unsent_sequences_are_ignored() {
        let mut t = SequenceTracker::new(3);
        t.record_sent();
        assert_eq!(t.record_reply(1, true), ReplyKind::Unknown);
        assert_eq!(t.record_reply(99, true), ReplyKind::Unknown);
        assert_eq!((t.received(), t.duplicates()), (0, 0));
    }

    #[test]
    fn loss_bursts_are_runs_of_consecutive_lost_probes() {
        let mut t = sent(10);
        // answered: 0 3 4 8; lost: 1-2 (run of 2), 5-7 (run of 3, 6 late), 9 (run of 1, at the end)
        for seq in [0, 3, 4, 8] {
            t.record_reply(seq, true);
        }
        t.record_reply(6, false);
        let b = t.loss_bursts();
        assert_eq!((b.count, b.lost, b.max_length), (3, 6, 3));
        assert_eq!(b.lost, t.lost());
        assert_eq!(bursts_json(b)["mean_length"], json!(2.0));
        let none = sent(3);
        let mut all = sent(3);
        (0..3).for_each(|s| {
            all.record_reply(s, true);
        });
        assert_eq!(none.loss_bursts(), LossBursts { count: 1, lost: 3, max_length: 3 });
        assert_eq!(bursts_json(all.loss_bursts())["mean_length"], Value::Null);
    }

    #[test]
    fn nothing_sent_is_no_loss() {
        let t = SequenceTracker::new(0);
        assert_eq!((t.lost(), t.loss_ratio()), (0, 0.0));
    }
}
