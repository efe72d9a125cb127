//! When each pair became applied, as a user sees it: from the instant its link was sent to the API server to
//! the first link status that counts it in `pairsApplied`, and when each link became Ready with every pair.
//!
//! The watch delivers statuses in order per link; a count that goes down (a pair failed, then recovered) is
//! not a pair applied again: a pair is timed once, when the count first reaches it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Progress {
    sent: Instant,
    expected: u32,
    /// The highest `pairsApplied` seen so far: pairs up to it are timed.
    timed: u32,
    ready_after: Option<Duration>,
}

/// A link's status as far as timing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub pairs: u32,
    pub pairs_applied: u32,
    /// The Ready condition is True.
    pub ready: bool,
}

#[derive(Debug, Default)]
pub struct PairClock {
    links: BTreeMap<String, Progress>,
    pairs: Vec<Duration>,
    /// When the watch last saw a link become Ready with every pair.
    last_ready: Option<Instant>,
}

impl PairClock {
    /// Link `name`, which should come to `expected` pairs, is being sent now (`at`); statuses seen before this
    /// are another run's and are not timed.
    pub fn sent(&mut self, name: &str, at: Instant, expected: u32) {
        self.links.insert(name.to_owned(), Progress { sent: at, expected, timed: 0, ready_after: None });
    }

    pub fn observe(&mut self, name: &str, at: Instant, seen: Seen) {
        let Some(link) = self.links.get_mut(name) else { return };
        let after = at.saturating_duration_since(link.sent);
        let applied = seen.pairs_applied.min(link.expected);
        if applied > link.timed {
            self.pairs.extend(std::iter::repeat_n(after, (applied - link.timed) as usize));
            link.timed = applied;
        }
        let complete = seen.ready && seen.pairs == link.expected && seen.pairs_applied == link.expected;
        if complete && link.ready_after.is_none() {
            link.ready_after = Some(after);
            self.last_ready = self.last_ready.max(Some(at));
        }
    }

    /// Every link sent is Ready with all its pairs.
    pub fn done(&self) -> bool {
        self.links.values().all(|l| l.ready_after.is_some())
    }

    /// Each applied pair's time from its link's sending, in the order they were seen.
    pub fn pair_times(&self) -> &[Duration] {
        &self.pairs
    }

    /// The instant the watch saw the last link become Ready with every pair, once every link sent has.
    pub fn all_ready_at(&self) -> Option<Instant> {
        self.last_ready.filter(|_| self.done())
    }

    /// Each Ready link's time from its sending.
    pub fn link_times(&self) -> Vec<Duration> {
        self.links.values().filter_map(|l| l.ready_after).collect()
    }

    /// The links not yet Ready with every pair, with what was last timed of them: (name, timed, expected).
    pub fn missing(&self) -> Vec<(String, u32, u32)> {
        self.links
            .iter()
            .filter(|(_, l)| l.ready_after.is_none())
            .map(|(name, l)| (name.clone(), l.timed, l.expected))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pairs: u32, pairs_applied: u32, ready: bool) -> Seen {
        Seen { pairs, pairs_applied, ready }
    }

    #[test]
    fn each_pair_is_timed_once_when_the_count_first_reaches_it() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = PairClock::default();
        c.sent("a", t0, 4);
        c.observe("a", ms(10), seen(4, 1, false));
        c.observe("a", ms(20), seen(4, 3, false));
        // A pair failed and came back: not timed again.
        c.observe("a", ms(30), seen(4, 2, false));
        c.observe("a", ms(40), seen(4, 3, false));
        assert!(!c.done());
        assert_eq!(c.missing(), vec![("a".to_owned(), 3, 4)]);
        c.observe("a", ms(50), seen(4, 4, true));
        let d = Duration::from_millis;
        assert_eq!(c.pair_times(), &[d(10), d(20), d(20), d(50)]);
        assert_eq!(c.link_times(), vec![d(50)]);
        assert!(c.done() && c.missing().is_empty());
    }

    #[test]
    fn a_link_is_ready_only_with_every_expected_pair_applied_and_its_condition_true() {
        let t0 = Instant::now();
        let mut c = PairClock::default();
        c.sent("a", t0, 4);
        c.sent("b", t0, 1);
        // Ready with fewer pairs than the world has (pods not yet seen by the operator): not done.
        c.observe("a", t0, seen(2, 2, true));
        // Every pair applied but the condition not yet True.
        c.observe("a", t0, seen(4, 4, false));
        assert!(!c.done());
        c.observe("b", t0 + Duration::from_millis(7), seen(1, 1, true));
        assert_eq!(c.all_ready_at(), None, "a is not Ready yet");
        c.observe("a", t0 + Duration::from_millis(5), seen(4, 4, true));
        // A later status of a link already Ready does not move its instant.
        c.observe("b", t0 + Duration::from_millis(9), seen(1, 1, true));
        assert_eq!(c.link_times(), vec![Duration::from_millis(5), Duration::from_millis(7)]);
        assert_eq!(c.all_ready_at(), Some(t0 + Duration::from_millis(7)), "the last link to become Ready: b");
    }

    #[test]
    fn statuses_of_links_not_sent_are_not_timed() {
        let t0 = Instant::now();
        let mut c = PairClock::default();
        c.observe("other", t0, seen(4, 4, true));
        assert!(c.pair_times().is_empty() && c.link_times().is_empty() && c.done());
        c.sent("a", t0, 1);
        assert!(!c.done());
    }
}
