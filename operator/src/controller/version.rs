//! Plan versions and retry delays: the two pieces of arithmetic the node dispatcher depends on.
//!
//! The agent refuses a plan older than the one in force, so versions must grow across operator restarts and
//! leader hand-overs, not only within one process. A version is therefore the wall clock in milliseconds at
//! computation time, bumped by one when two plans for a node fall in the same millisecond. A new leader starts
//! from its own clock, which is ahead of anything its predecessor sent unless the clocks are skewed; for that
//! case the agent's stale reply carries the version in force, and [`PlanVersions::observe`] jumps past it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The versions handed out for one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanVersions {
    last: u64,
}

impl PlanVersions {
    /// The next version, given the wall clock in milliseconds: never lower than the clock, always above the last.
    pub fn next_at(&mut self, now_millis: u64) -> u64 {
        self.last = now_millis.max(self.last.saturating_add(1));
        self.last
    }

    pub fn next_now(&mut self) -> u64 {
        self.next_at(unix_millis())
    }

    /// Records a version the agent reports in force, so that the next plan is newer than it.
    pub fn observe(&mut self, in_force: u64) {
        self.last = self.last.max(in_force);
    }
}

pub fn unix_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Exponential backoff between failed calls to one agent: `initial · 2^(failures-1)`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(500), max: Duration::from_secs(60) }
    }
}

impl Backoff {
    /// The wait after `failures` consecutive failures (0 failures: no wait).
    pub fn delay(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(failures - 1).unwrap_or(u32::MAX);
        self.initial.checked_mul(factor).unwrap_or(self.max).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_follow_the_clock_and_never_repeat() {
        let mut v = PlanVersions::default();
        assert_eq!(v.next_at(1_000), 1_000);
        assert_eq!(v.next_at(1_000), 1_001, "same millisecond: bumped");
        assert_eq!(v.next_at(999), 1_002, "clock stepped back: still above the last");
        assert_eq!(v.next_at(5_000), 5_000, "clock ahead: jumps to it");
    }

    #[test]
    fn a_successor_starting_later_is_ahead_of_its_predecessor() {
        let mut old = PlanVersions::default();
        let sent: Vec<u64> = (0..50).map(|_| old.next_at(10_000)).collect();
        let mut new = PlanVersions::default();
        // The predecessor sent 50 plans in one millisecond; the successor's clock is past that burst.
        let first = new.next_at(10_100);
        assert!(sent.iter().all(|v| *v < first));
    }

    #[test]
    fn observing_a_newer_version_in_force_jumps_past_it() {
        let mut v = PlanVersions::default();
        v.next_at(1_000);
        v.observe(9_000);
        assert_eq!(v.next_at(1_001), 9_001);
        v.observe(10);
        assert_eq!(v.next_at(1_002), 9_002, "an older observation changes nothing");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(60) };
        let delays: Vec<u64> = (0..10).map(|n| b.delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [0, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]);
        assert_eq!(b.delay(40), Duration::from_secs(60), "huge failure counts do not overflow");
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(60));
    }
}
