//! Bandwidth traces in Mahimahi's format, replayed as rate windows. Pure.
//!
//! Each line of a trace is a time in ms at which one 1,500-byte packet may be delivered; several lines may name
//! the same ms, and the trace loops with a period of its last line's time. Replayed, the trace becomes one rate
//! per window of `window` ms: the window's opportunities × 1,500 bytes over its length. Within a window the
//! delivery is spread evenly (a TBF's rate), so the precision is one window: over any whole window the bytes
//! delivered match the trace's to one packet and the bucket's burst; inside a window the trace's own gaps and
//! bursts are smoothed away.

use isthmus_agent_api::schedule::MAX_PHASES;

/// Bytes one opportunity delivers (Mahimahi's MTU).
pub const OPPORTUNITY_BYTES: u64 = 1_500;
/// A window without opportunities still needs a rate: the lowest a link may have (100 bit/s, a packet in two
/// minutes) holds its packets in the queue until the next window, as Mahimahi holds them.
pub const STALLED_BPS: u64 = crate::unit_syntax::MIN_RATE_BPS as u64;
/// The most lines a trace may have (a ConfigMap holds at most 1 MiB anyway).
pub const MAX_TRACE_LINES: usize = 500_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {text:?} is not a time in ms (a whole number)")]
    NotANumber { line: usize, text: String },
    #[error("line {line}: {ms} ms comes before the line above it ({previous} ms); times never go back")]
    Backwards { line: usize, ms: u64, previous: u64 },
    #[error("the trace has no lines")]
    Empty,
    #[error("the trace's last time is 0 ms: a trace lasts at least 1 ms")]
    NoDuration,
    #[error("{lines} lines: at most {MAX_TRACE_LINES}")]
    TooLong { lines: usize },
    #[error(
        "{period_ms} ms in windows of {window_ms} ms is {windows} windows: at most {MAX_PHASES}; lengthen the window"
    )]
    TooManyWindows { period_ms: u64, window_ms: u64, windows: u64 },
}

/// A parsed trace: the opportunities' times and the period it loops with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    times_ms: Vec<u64>,
    period_ms: u64,
}

impl Trace {
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut times_ms = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            if times_ms.len() == MAX_TRACE_LINES {
                return Err(TraceError::TooLong { lines: text.lines().filter(|l| !l.trim().is_empty()).count() });
            }
            let ms: u64 = line
                .parse()
                .map_err(|_| TraceError::NotANumber { line: i + 1, text: line.chars().take(40).collect() })?;
            if let Some(&previous) = times_ms.last()
                && ms < previous
            {
                return Err(TraceError::Backwards { line: i + 1, ms, previous });
            }
            times_ms.push(ms);
        }
        let period_ms = *times_ms.last().ok_or(TraceError::Empty)?;
        if period_ms == 0 {
            return Err(TraceError::NoDuration);
        }
        Ok(Trace { times_ms, period_ms })
    }

    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// One window per `window_ms` of the period (the last one shorter when the period is not a whole number of
    /// windows): its length and its rate in bit/s. An opportunity at the period's own time is the next loop's
    /// first, at 0.
    pub fn windows(&self, window_ms: u64) -> Result<Vec<Window>, TraceError> {
        let window_ms = window_ms.max(1);
        let count = self.period_ms.div_ceil(window_ms);
        if count > MAX_PHASES as u64 {
            return Err(TraceError::TooManyWindows { period_ms: self.period_ms, window_ms, windows: count });
        }
        let mut opportunities = vec![0u64; count as usize];
        for &t in &self.times_ms {
            opportunities[((t % self.period_ms) / window_ms) as usize] += 1;
        }
        Ok(opportunities
            .into_iter()
            .enumerate()
            .map(|(k, n)| {
                let start = k as u64 * window_ms;
                let length_ms = window_ms.min(self.period_ms - start);
                let bps = (n * OPPORTUNITY_BYTES * 8 * 1_000).div_ceil(length_ms);
                Window { length_ms, opportunities: n, rate_bps: bps.max(STALLED_BPS) }
            })
            .collect())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub length_ms: u64,
    pub opportunities: u64,
    pub rate_bps: u64,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_steady_12_mbit_trace_is_one_rate_in_every_window() {
        // One opportunity a ms: 1,500 bytes a ms, 12 Mbit/s.
        let text: String = (1..=1_000).map(|t| format!("{t}\n")).collect();
        let trace = Trace::parse(&text).unwrap();
        assert_eq!(trace.period_ms(), 1_000);
        let w = trace.windows(100).unwrap();
        assert_eq!(w.len(), 10);
        assert!(w.iter().all(|w| *w == Window { length_ms: 100, opportunities: 100, rate_bps: 12_000_000 }), "{w:?}");
    }

    #[test]
    fn repeated_times_gaps_and_a_short_last_window() {
        // 250 ms: 3 opportunities at 10 ms, none from 100 to 199, one at 250 (the next loop's 0).
        let trace = Trace::parse("10\n10\n10\n\n250\n").unwrap();
        let w = trace.windows(100).unwrap();
        assert_eq!(w.iter().map(|w| (w.length_ms, w.opportunities)).collect::<Vec<_>>(), [(100, 4), (100, 0), (50, 0)]);
        assert_eq!(w[0].rate_bps, 4 * 12_000 * 1_000 / 100);
        assert_eq!(w[1].rate_bps, STALLED_BPS);
    }

    #[test]
    fn bad_traces_name_the_line() {
        assert_eq!(Trace::parse("1\n2\nx3\n"), Err(TraceError::NotANumber { line: 3, text: "x3".into() }));
        assert_eq!(Trace::parse("5\n4\n"), Err(TraceError::Backwards { line: 2, ms: 4, previous: 5 }));
        assert_eq!(Trace::parse("\n \n"), Err(TraceError::Empty));
        assert_eq!(Trace::parse("0\n0\n"), Err(TraceError::NoDuration));
        assert_eq!(Trace::parse("-1\n"), Err(TraceError::NotANumber { line: 1, text: "-1".into() }));
        let long = Trace::parse("1000000\n").unwrap();
        assert_eq!(
            long.windows(10),
            Err(TraceError::TooManyWindows { period_ms: 1_000_000, window_ms: 10, windows: 100_000 })
        );
    }

    proptest! {
        #[test]
        fn windows_keep_every_opportunity_and_cover_the_period(
            mut times in proptest::collection::vec(0u64..20_000, 1..2_000),
            window in 10u64..2_000,
        ) {
            times.sort();
            prop_assume!(*times.last().unwrap() > 0);
            let text: String = times.iter().map(|t| format!("{t}\n")).collect();
            let trace = Trace::parse(&text).unwrap();
            let w = trace.windows(window).unwrap();
            prop_assert_eq!(w.iter().map(|w| w.opportunities).sum::<u64>(), times.len() as u64);
            prop_assert_eq!(w.iter().map(|w| w.length_ms).sum::<u64>(), trace.period_ms());
            for w in &w {
                // The rate delivers the window's bytes within its length (rounded up to whole bits a second).
                let bits = w.opportunities * OPPORTUNITY_BYTES * 8;
                prop_assert!(w.rate_bps * w.length_ms >= bits * 1_000);
                prop_assert!(w.opportunities == 0 || (w.rate_bps - 1) * w.length_ms < bits * 1_000);
            }
        }
    }
}
