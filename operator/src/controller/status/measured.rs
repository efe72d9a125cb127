//! The measured part of a link's status — `status.measured`, `status.measuredSummary` and the `Conformant`
//! condition — from the directions' verdicts (`crate::measure`), and when to write it. Pure.
//!
//! Measurements change with every window of every node, so writing each change would patch every verified link
//! every few seconds. A new measured part replaces the one on the server only when the condition's status or
//! reason changes, when the server has none, or when the last one written is at least a window old.

use std::time::Duration;

use isthmus_agent_api::Direction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::NetworkLinkStatus;
use crate::api::measured::{ConformanceReason, MeasuredStatus};
use crate::measure::{Verdict, overall, summary};

pub const CONFORMANT: &str = "Conformant";

/// The measured part of a status.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredPart {
    pub measured: MeasuredStatus,
    pub summary: Option<String>,
    /// Without its transition time (set when merged into a status).
    pub condition: Condition,
}

/// The measured part from the forward verdict and, where the link has a reverse direction, the reverse one.
pub fn measured_part(forward: &Verdict, reverse: Option<&Verdict>) -> MeasuredPart {
    let mut directions = vec![(Direction::Forward, forward)];
    directions.extend(reverse.map(|r| (Direction::Reverse, r)));
    let (reason, message) = overall(&directions);
    let measured =
        MeasuredStatus { forward: forward.measured.clone(), reverse: reverse.and_then(|r| r.measured.clone()) };
    MeasuredPart {
        summary: summary(measured.forward.as_ref(), reverse.map(|_| measured.reverse.as_ref())),
        measured,
        condition: Condition {
            type_: CONFORMANT.into(),
            status: if reason == ConformanceReason::Conformant { "True" } else { "False" }.into(),
            reason: reason.as_str().into(),
            message: message.chars().take(32_000).collect(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        },
    }
}

/// Puts the measured part into `status` (whose other conditions are set): `fresh` when it matters or is due,
/// else the part `previous` (the server's status) carries. `since_written` is how long ago this replica last
/// wrote a fresh part for the link (`None`: never). True when `fresh` went in and differs from `previous`.
pub fn place_measured(
    status: &mut NetworkLinkStatus,
    fresh: MeasuredPart,
    previous: Option<&NetworkLinkStatus>,
    since_written: Option<Duration>,
    min_gap: Duration,
    now: &Time,
) -> bool {
    let old_condition = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == CONFORMANT));
    let old_measured = previous.and_then(|p| p.measured.as_ref());
    let material = match (old_condition, old_measured) {
        (Some(c), Some(_)) => c.status != fresh.condition.status || c.reason != fresh.condition.reason,
        _ => true,
    };
    let due = since_written.is_none_or(|d| d >= min_gap);
    if let (false, false, Some(prev), Some(cond)) = (material, due, previous, old_condition) {
        status.measured = prev.measured.clone();
        status.measured_summary = prev.measured_summary.clone();
        status.conditions.push(cond.clone());
        return false;
    }
    let mut condition = fresh.condition;
    condition.observed_generation = status.observed_generation;
    condition.last_transition_time = match old_condition {
        Some(c) if c.status == condition.status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let changed = old_measured != Some(&fresh.measured) || old_condition != Some(&condition);
    status.measured = Some(fresh.measured);
    status.measured_summary = fresh.summary;
    status.conditions.push(condition);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::measured::DirectionMeasured;

    fn verdict(reason: ConformanceReason, p50: &str) -> Verdict {
        Verdict {
            reason,
            message: format!("p50 {p50}"),
            measured: Some(DirectionMeasured {
                rtt_p50: Some(p50.into()),
                loss: Some("0%".into()),
                ..Default::default()
            }),
            expected_added_rtt: Duration::from_millis(100),
            expected_loss: 0.0,
        }
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn placed(
        fresh: MeasuredPart,
        previous: Option<&NetworkLinkStatus>,
        since: Option<u64>,
        now: i64,
    ) -> (NetworkLinkStatus, bool) {
        let mut s = NetworkLinkStatus { observed_generation: Some(4), ..Default::default() };
        let used = place_measured(
            &mut s,
            fresh,
            previous,
            since.map(Duration::from_secs),
            Duration::from_secs(30),
            &time(now),
        );
        (s, used)
    }

    #[test]
    fn the_condition_summarizes_both_directions() {
        let f = verdict(ConformanceReason::Conformant, "101ms");
        let r = verdict(ConformanceReason::Slower, "180ms");
        let part = measured_part(&f, Some(&r));
        assert_eq!((part.condition.status.as_str(), part.condition.reason.as_str()), ("False", "Slower"));
        assert_eq!(part.summary.as_deref(), Some("101ms 0%/180ms 0%"));
        assert!(part.condition.message.contains("reverse: p50 180ms"), "{}", part.condition.message);
        let one = measured_part(&f, None);
        assert_eq!((one.condition.status.as_str(), one.summary.as_deref()), ("True", Some("101ms 0%")));
        assert!(one.measured.reverse.is_none());
    }

    #[test]
    fn small_changes_wait_for_the_window_and_reason_changes_do_not() {
        let first = measured_part(&verdict(ConformanceReason::Conformant, "101ms"), None);
        let (written, used) = placed(first, None, None, 100);
        assert!(used, "nothing on the server yet");
        let c = written.conditions.iter().find(|c| c.type_ == CONFORMANT).unwrap();
        assert_eq!((c.last_transition_time.clone(), c.observed_generation), (time(100), Some(4)));

        // A new p50 ten seconds later: the server's part stays.
        let drift = measured_part(&verdict(ConformanceReason::Conformant, "102ms"), None);
        let (kept, used) = placed(drift.clone(), Some(&written), Some(10), 110);
        assert!(!used);
        assert_eq!(
            (kept.measured.clone(), kept.conditions.clone()),
            (written.measured.clone(), written.conditions.clone())
        );
        // A window later it goes in, keeping the transition time.
        let (due, used) = placed(drift, Some(&written), Some(30), 130);
        assert!(used);
        assert_eq!(due.measured_summary.as_deref(), Some("102ms 0%"));
        assert_eq!(due.conditions[0].last_transition_time, time(100));
        // A verdict that changes goes in at once, with a new transition time.
        let slow = measured_part(&verdict(ConformanceReason::Slower, "150ms"), None);
        let (now_slow, used) = placed(slow, Some(&due), Some(1), 131);
        assert!(used);
        assert_eq!(
            (now_slow.conditions[0].reason.as_str(), now_slow.conditions[0].last_transition_time.clone()),
            ("Slower", time(131))
        );
        // The same part again is no change at all.
        let again = measured_part(&verdict(ConformanceReason::Slower, "150ms"), None);
        assert!(!placed(again, Some(&now_slow), Some(40), 171).1);
    }
}
