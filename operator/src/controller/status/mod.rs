//! A link's status from the plan's facts and the agents' replies: counts, failures and conditions. Pure, with
//! the agents' side in `progress.rs` (kept per node between batches by `ledger.rs`) and the conditions' reasons in
//! `reason.rs`; `writer.rs` queues and writes statuses.

use std::collections::BTreeMap;

use isthmus_agent_api::QueueCap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{MAX_STATUS_FAILURES, MAX_STATUS_OVERLAPS, NetworkLinkStatus, OverlapStatus, PodFailure};
use crate::plan::LinkFacts;

mod ledger;
mod measured;
mod progress;
mod reason;
pub mod schedule;
pub(super) mod writer;

pub use ledger::ProgressLedger;
pub use measured::{CONFORMANT, MeasuredPart, measured_part, place_measured};
pub use progress::{FailedPod, Outcome, Progress, judge_entry, node_progress, progress};
pub use reason::LinkReason;

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const OVERLAPPING: &str = "Overlapping";

/// The full status of a link. `previous` is the status on the server: conditions that keep their status keep
/// their `lastTransitionTime`.
pub fn link_status(
    facts: &LinkFacts,
    progress: Option<&Progress>,
    previous: Option<&NetworkLinkStatus>,
    now: &Time,
) -> NetworkLinkStatus {
    let mut status = NetworkLinkStatus::default();
    fill_status(facts, &mut status);
    let empty = Progress::default();
    let progress = progress.unwrap_or(&empty);
    status.pairs_applied = progress.applied;
    status.pairs_failed = progress.failed;
    status.pairs_emulated = progress.emulated;
    status.queue_limits_capped = progress.queue_limits_capped;
    let exclusions = status.failures.len() + status.failures_omitted as usize;
    let mut failures = std::mem::take(&mut status.failures);
    failures.extend(progress.failures.iter().cloned().map(PodFailure::from));
    let total_failures = exclusions + progress.failures.len();
    failures.truncate(MAX_STATUS_FAILURES);
    status.failures_omitted = (total_failures - failures.len()) as u32;
    status.failures = failures;

    // `Degraded` names the first failure of `status.failures`: the plan's exclusions come before the agents'.
    let first_failure = facts.exclusions.first().map(FailedPod::from).or_else(|| progress.failures.first().cloned());
    let mut conditions =
        conditions(facts, &status, total_failures, first_failure.as_ref(), progress.first_cap.as_ref());
    for c in &mut conditions {
        c.observed_generation = facts.generation;
        let before = previous.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match before {
            Some(b) if b.status == c.status => b.last_transition_time.clone(),
            _ => now.clone(),
        };
    }
    status.conditions = conditions;
    status
}

/// Writes what the plan knows into a status: observed generation, summaries, counts, overlaps and exclusions
/// (as failures). Conditions and the applied/failed counts come from the agents' replies.
pub fn fill_status(facts: &LinkFacts, status: &mut NetworkLinkStatus) {
    status.observed_generation = facts.generation;
    status.from = Some(facts.from_summary.clone());
    status.to = Some(facts.to_summary.clone());
    if let Some(s) = &facts.summary {
        status.latency = Some(s.latency.clone());
        status.loss = Some(s.loss.clone());
        status.bandwidth = Some(s.bandwidth.clone());
        status.expected_round_trip = Some(s.expected_round_trip.clone());
    }
    status.source_pods = facts.source_pods;
    status.destinations = facts.destinations;
    status.pairs = facts.pairs;
    status.overlaps = facts
        .overlaps
        .iter()
        .take(MAX_STATUS_OVERLAPS)
        .map(|o| OverlapStatus { link: o.link.name.clone(), won: o.won, lost: o.lost })
        .collect();
    status.failures =
        facts.exclusions.iter().take(MAX_STATUS_FAILURES).map(|e| PodFailure::from(FailedPod::from(e))).collect();
    status.failures_omitted = facts.exclusions.len().saturating_sub(MAX_STATUS_FAILURES) as u32;
}

/// Ready, Degraded and Overlapping (without times) for a status whose counts and failures are filled in, the
/// first of those failures being `first_failure`.
fn conditions(
    facts: &LinkFacts,
    status: &NetworkLinkStatus,
    total_failures: usize,
    first_failure: Option<&FailedPod>,
    first_cap: Option<&QueueCap>,
) -> Vec<Condition> {
    let mut conditions = Vec::with_capacity(3);
    if let Some(err) = &facts.error {
        let message = format!("{}: {}", err.field, err.message);
        conditions.push(cond(READY, false, LinkReason::InvalidSpec, &message));
        conditions.push(cond(DEGRADED, true, LinkReason::InvalidSpec, &message));
    } else if let Some(refusal) = &facts.refusal {
        let reason = LinkReason::Failure(refusal.reason());
        conditions.push(cond(READY, false, reason, &refusal.message()));
        conditions.push(cond(DEGRADED, true, reason, &refusal.message()));
    } else {
        let (pairs, applied, failed) = (status.pairs, status.pairs_applied, status.pairs_failed);
        conditions.push(if pairs == 0 {
            cond(READY, true, LinkReason::NoPairs, "no pod with an IP matches the link yet; nothing to apply")
        } else if applied == pairs {
            cond(
                READY,
                true,
                LinkReason::Applied,
                &format!("all {pairs} pairs are applied{}", capped(status, first_cap)),
            )
        } else if failed > 0 {
            cond(READY, false, LinkReason::Failed, &format!("{applied} of {pairs} pairs applied, {failed} failed"))
        } else {
            cond(
                READY,
                false,
                LinkReason::Pending,
                &format!("{applied} of {pairs} pairs applied, waiting for the node agents"),
            )
        });
        conditions.push(match first_failure {
            Some(first) => {
                let more = total_failures - 1;
                let tail = if more > 0 { format!(" (and {more} more)") } else { String::new() };
                let message = format!("{}: {}{tail}", first.pod, first.message);
                cond(DEGRADED, true, LinkReason::Failure(first.reason), &message)
            }
            None => cond(DEGRADED, false, LinkReason::AsExpected, "every selected pod is shaped"),
        });
    }
    conditions.push(if status.overlaps.is_empty() {
        cond(OVERLAPPING, false, LinkReason::NoOverlap, "no other NetworkLink covers these pairs")
    } else {
        let list: Vec<String> = status
            .overlaps
            .iter()
            .map(|o| format!("{} (this link wins {}, loses {})", o.link, o.won, o.lost))
            .collect();
        cond(OVERLAPPING, true, LinkReason::SharedPairs, &format!("pairs shared with {}", list.join(", ")))
    });
    conditions
}

/// What `Ready`'s message adds when queue budgets cut `queueLimit`s: a cut is the bound working, not a failure.
fn capped(status: &NetworkLinkStatus, first: Option<&QueueCap>) -> String {
    match (status.queue_limits_capped, first) {
        (0, _) | (_, None) => String::new(),
        (n, Some(cap)) => format!(
            "; the node's queue budget cut queueLimit on {n} of them (to {} packets from {} asked, e.g. towards {})",
            cap.installed_packets, cap.requested_packets, cap.destination
        ),
    }
}

fn cond(type_: &str, status: bool, reason: LinkReason, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// A condition that changed status between two statuses: (type, new status, reason, message).
pub fn transitions<'a>(
    before: Option<&NetworkLinkStatus>,
    after: &'a NetworkLinkStatus,
) -> impl Iterator<Item = &'a Condition> + 'a {
    let before: BTreeMap<String, (String, String)> = before
        .into_iter()
        .flat_map(|s| s.conditions.iter())
        .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone())))
        .collect();
    after.conditions.iter().filter(move |c| before.get(&c.type_) != Some(&(c.status.clone(), c.reason.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SpecError;
    use crate::failure::FailureReason;
    use crate::index::ObjectKey;
    use crate::plan::{Exclusion, Overlap};

    fn facts(pairs: u32) -> LinkFacts {
        LinkFacts {
            generation: Some(3),
            from_summary: "app=a".into(),
            to_summary: "app=b".into(),
            error: None,
            refusal: None,
            summary: None,
            source_pods: 2,
            destinations: 2,
            pairs,
            overlaps: vec![],
            exclusions: vec![],
        }
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn condition<'a>(s: &'a NetworkLinkStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn conditions_follow_progress_and_keep_their_transition_times() {
        let f = facts(5);
        let pending = link_status(&f, None, None, &time(100));
        assert_eq!(pending.observed_generation, Some(3));
        assert_eq!(condition(&pending, READY).status, "False");
        assert_eq!(condition(&pending, READY).reason, "Pending");
        assert_eq!(condition(&pending, READY).observed_generation, Some(3));
        assert_eq!(condition(&pending, DEGRADED).status, "False");
        assert_eq!(condition(&pending, OVERLAPPING).status, "False");

        let done = Progress { applied: 5, failed: 0, ..Default::default() };
        let ready = link_status(&f, Some(&done), Some(&pending), &time(200));
        assert_eq!(condition(&ready, READY).status, "True");
        assert_eq!(condition(&ready, READY).last_transition_time, time(200), "Ready changed");
        assert_eq!(condition(&ready, DEGRADED).last_transition_time, time(100), "Degraded did not change");
        assert_eq!(ready.pairs_applied, 5);
        let events: Vec<&str> = transitions(Some(&pending), &ready).map(|c| c.type_.as_str()).collect();
        assert_eq!(events, [READY]);

        let again = link_status(&f, Some(&done), Some(&ready), &time(300));
        assert_eq!(again, ready, "nothing changed: the same status, so no write");
        assert_eq!(transitions(Some(&ready), &again).count(), 0);
    }

    #[test]
    fn failures_make_the_link_degraded_and_are_bounded() {
        let mut f = facts(40);
        f.exclusions = vec![Exclusion {
            pod: ObjectKey::new("ns", "host"),
            node: Some("n1".into()),
            reason: FailureReason::HostNetwork,
            message: "uses the host network".into(),
        }];
        let failures: Vec<FailedPod> = (0..20)
            .map(|i| FailedPod {
                pod: format!("ns/p{i}"),
                node: Some("n2".into()),
                reason: FailureReason::AgentUnreachable,
                message: "down".into(),
            })
            .collect();
        let p = Progress { applied: 0, failed: 40, failures, ..Default::default() };
        let s = link_status(&f, Some(&p), None, &time(1));
        assert_eq!(s.failures.len(), MAX_STATUS_FAILURES);
        assert_eq!(s.failures_omitted, 21 - MAX_STATUS_FAILURES as u32);
        assert_eq!(s.failures[0].reason, "HostNetwork", "exclusions come first");
        let degraded = condition(&s, DEGRADED);
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "HostNetwork"));
        assert!(degraded.message.ends_with("(and 20 more)"), "{}", degraded.message);
        assert_eq!(condition(&s, READY).reason, "Failed");
    }

    #[test]
    fn an_invalid_spec_and_overlaps_show_in_conditions() {
        let mut f = facts(0);
        f.error = Some(SpecError { field: "spec.impairment.latency".into(), message: "bad".into() });
        f.overlaps = vec![Overlap { link: ObjectKey::new("ns", "other"), won: 1, lost: 2 }];
        let s = link_status(&f, None, None, &time(1));
        assert_eq!(condition(&s, READY).reason, "InvalidSpec");
        assert!(condition(&s, READY).message.contains("spec.impairment.latency"));
        assert_eq!(condition(&s, DEGRADED).status, "True");
        let o = condition(&s, OVERLAPPING);
        assert_eq!(o.status, "True");
        assert!(o.message.contains("other (this link wins 1, loses 2)"), "{}", o.message);

        let nothing = link_status(&facts(0), None, None, &time(1));
        assert_eq!(
            (condition(&nothing, READY).status.as_str(), condition(&nothing, READY).reason.as_str()),
            ("True", "NoPairs")
        );
    }

    #[test]
    fn ready_says_when_queue_budgets_cut_queue_limits() {
        let cap = QueueCap {
            destination: "10.0.0.9/32".parse().unwrap(),
            link: isthmus_agent_api::test_util::link("l"),
            requested_packets: 50_000,
            installed_packets: 11_081,
        };
        let done = Progress { applied: 5, queue_limits_capped: 2, first_cap: Some(cap), ..Default::default() };
        let s = link_status(&facts(5), Some(&done), None, &time(1));
        assert_eq!(s.queue_limits_capped, 2);
        let ready = condition(&s, READY);
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Applied"));
        assert!(ready.message.contains("cut queueLimit on 2 of them") && ready.message.contains("11081"), "{ready:?}");
        let plain = link_status(&facts(5), Some(&Progress { applied: 5, ..Default::default() }), None, &time(1));
        assert_eq!(condition(&plain, READY).message, "all 5 pairs are applied");
    }
}
