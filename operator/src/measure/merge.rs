//! The nodes' windows of one link direction merged into one: counts add, histograms merge exactly (same
//! buckets), and windows too old to describe the present are left out. A link that changes with time has its
//! windows cut at its phases, so two nodes' latest windows may be of two phases: only the newest are merged.

use std::collections::BTreeMap;
use std::time::Duration;

use isthmus_agent_api::LinkRef;
use isthmus_agent_api::measure::{LinkMeasurement, MeasuredState, ProbeKind, ProbeWindow, Unmeasurable};

/// One link direction over every node that probes it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Merged {
    /// TCP SYN where any node had to fall back to it, else ICMP echo.
    pub probe: Option<ProbeKind>,
    pub pairs: u32,
    pub impaired: ProbeWindow,
    pub baseline: ProbeWindow,
    /// The longest window of the nodes merged.
    pub window: Duration,
    /// The newest window merged, as Unix milliseconds `[start, end)`: every merged node's for a link cut at its
    /// phases.
    pub bounds: Option<(u64, u64)>,
    pub last_answer_ms: Option<u64>,
    /// Nodes whose window was merged.
    pub nodes: u32,
    /// Nodes that said they could not measure; the first one's reason.
    pub unmeasurable: Option<Unmeasurable>,
    pub unmeasurable_nodes: u32,
    /// Nodes whose window was too old to use.
    pub stale_nodes: u32,
}

/// A window is stale when it ended more than two window lengths and one poll interval before `now_ms`: the
/// agent should have completed a newer one by then.
pub fn is_stale(m: &LinkMeasurement, now_ms: u64, poll_interval: Duration) -> bool {
    let length = m.window_end_ms.saturating_sub(m.window_start_ms);
    m.window_end_ms.saturating_add(2 * length).saturating_add(poll_interval.as_millis() as u64) < now_ms
}

/// Merges the nodes' latest states per link direction; of a link for which `cut` holds (it changes with time, so
/// its windows may be of different phases), only the windows that start last.
pub fn merge<'a>(
    states: impl IntoIterator<Item = &'a MeasuredState>,
    now_ms: u64,
    poll_interval: Duration,
    cut: impl Fn(&LinkRef) -> bool,
) -> BTreeMap<LinkRef, Merged> {
    let windows: Vec<&LinkMeasurement> =
        states.into_iter().filter(|s| s.enabled).flat_map(|s| s.links.iter()).collect();
    let usable = |m: &LinkMeasurement| !is_stale(m, now_ms, poll_interval) && m.unmeasurable.is_none();
    let mut newest: BTreeMap<&LinkRef, u64> = BTreeMap::new();
    for m in windows.iter().filter(|m| usable(m) && cut(&m.link)) {
        let start = newest.entry(&m.link).or_default();
        *start = (*start).max(m.window_start_ms);
    }
    let mut out: BTreeMap<LinkRef, Merged> = BTreeMap::new();
    for m in windows {
        let merged = out.entry(m.link.clone()).or_default();
        if is_stale(m, now_ms, poll_interval) {
            merged.stale_nodes += 1;
        } else if let Some(why) = &m.unmeasurable {
            merged.unmeasurable_nodes += 1;
            merged.unmeasurable.get_or_insert_with(|| why.clone());
        } else if newest.get(&m.link).is_none_or(|&start| start == m.window_start_ms) {
            merged.add(m);
        }
    }
    out
}

impl Merged {
    fn add(&mut self, m: &LinkMeasurement) {
        self.nodes += 1;
        self.probe = Some(match (self.probe, m.probe) {
            (Some(ProbeKind::TcpSyn), _) | (_, ProbeKind::TcpSyn) => ProbeKind::TcpSyn,
            _ => ProbeKind::IcmpEcho,
        });
        self.pairs = self.pairs.saturating_add(m.pairs);
        self.impaired.merge(&m.impaired);
        self.baseline.merge(&m.baseline);
        self.window = self.window.max(Duration::from_millis(m.window_end_ms.saturating_sub(m.window_start_ms)));
        if self.bounds.is_none_or(|(start, _)| m.window_start_ms > start) {
            self.bounds = Some((m.window_start_ms, m.window_end_ms));
        }
        self.last_answer_ms = self.last_answer_ms.max(m.last_answer_ms);
    }
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::Direction;
    use isthmus_agent_api::measure::UnmeasurableReason;

    use super::*;

    fn measurement(node_rtt_ms: u64, sent: u64, answered: u64, end_ms: u64) -> LinkMeasurement {
        let mut w = ProbeWindow { sent, answered, ..Default::default() };
        (0..answered).for_each(|_| w.rtt.record(Duration::from_millis(node_rtt_ms)));
        LinkMeasurement {
            link: LinkRef { namespace: "ns".into(), name: "l".into(), direction: Direction::Forward },
            probe: ProbeKind::IcmpEcho,
            pairs: 2,
            impaired: w.clone(),
            baseline: w,
            window_start_ms: end_ms - 30_000,
            window_end_ms: end_ms,
            last_answer_ms: Some(end_ms - 10),
            unmeasurable: None,
        }
    }

    fn state(node: &str, links: Vec<LinkMeasurement>) -> MeasuredState {
        MeasuredState { node: node.into(), version: 1, enabled: true, links }
    }

    #[test]
    fn nodes_add_up_and_stale_or_unmeasurable_windows_stay_out() {
        let now = 1_000_000;
        let poll = Duration::from_secs(10);
        let mut tcp = measurement(20, 10, 10, now - 1_000);
        tcp.probe = ProbeKind::TcpSyn;
        let mut broken = measurement(0, 10, 0, now);
        broken.unmeasurable = Some(Unmeasurable { reason: UnmeasurableReason::NoAnswer, message: "no".into() });
        let states = [
            state("n1", vec![measurement(10, 100, 90, now)]),
            state("n2", vec![tcp]),
            state("n3", vec![broken]),
            // Ended 70 s before now with a 30 s window: two windows and the poll interval have passed.
            state("n4", vec![measurement(500, 100, 100, now - 70_001)]),
            MeasuredState { enabled: false, ..state("n5", vec![measurement(500, 100, 100, now)]) },
        ];
        let merged = merge(&states, now, poll, |_| false);
        let m = &merged[&states[0].links[0].link];
        assert_eq!((m.nodes, m.unmeasurable_nodes, m.stale_nodes), (2, 1, 1));
        assert_eq!((m.impaired.sent, m.impaired.answered, m.pairs), (110, 100, 4));
        assert_eq!(m.probe, Some(ProbeKind::TcpSyn), "a fallback anywhere is reported");
        assert_eq!(m.window, Duration::from_secs(30));
        assert_eq!(m.last_answer_ms, Some(now - 10));
        assert_eq!(m.unmeasurable.as_ref().unwrap().reason, UnmeasurableReason::NoAnswer);
        assert!(!is_stale(&states[3].links[0], now - 1, poll));
        assert_eq!(m.bounds, Some((now - 30_000, now)), "the newest window");
    }

    #[test]
    fn a_link_cut_at_its_phases_merges_only_the_newest_windows() {
        let now = 1_000_000;
        let poll = Duration::from_secs(10);
        let phase = |start: u64, end: u64, rtt: u64| LinkMeasurement {
            window_start_ms: start,
            window_end_ms: end,
            ..measurement(rtt, 10, 10, end)
        };
        // n2 has not closed the phase that n1 and n3 closed last: its window is the phase before.
        let states = [
            state("n1", vec![phase(now - 8_000, now - 1_000, 200)]),
            state("n2", vec![phase(now - 19_000, now - 12_000, 10)]),
            state("n3", vec![phase(now - 8_000, now - 1_000, 200)]),
        ];
        let link = states[0].links[0].link.clone();
        let cut = merge(&states, now, poll, |l| *l == link);
        let m = &cut[&link];
        assert_eq!((m.nodes, m.impaired.sent, m.bounds), (2, 20, Some((now - 8_000, now - 1_000))));
        let whole = merge(&states, now, poll, |_| false);
        assert_eq!(whole[&link].nodes, 3, "a link without a schedule merges every node's latest window");
    }
}
