//! A link's status from the plan's facts and the agents' replies: counts, failures and conditions. Pure.

use std::collections::BTreeMap;

use isthmus_agent_api::{NodePlan, PodErrorKind, PodOutcome};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::nodes::NodeReport;
use crate::api::{MAX_STATUS_FAILURES, NetworkLinkStatus, PodFailure};
use crate::index::ObjectKey;
use crate::plan::LinkFacts;

/// What the agents made of one link's pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub applied: u32,
    pub failed: u32,
    pub failures: Vec<PodFailure>,
}

/// Sorts every desired pair into applied, failed or (neither) pending, per link, from each node's desired plan
/// and the latest report of its agent. A pod counts as applied only when the agent confirmed exactly the entry
/// that is desired now.
pub fn progress<'a>(
    desired: impl IntoIterator<Item = &'a NodePlan>,
    reports: &BTreeMap<String, NodeReport>,
) -> BTreeMap<ObjectKey, Progress> {
    let mut out: BTreeMap<ObjectKey, Progress> = BTreeMap::new();
    for plan in desired {
        let node = &plan.node;
        let report = reports.get(node);
        for pod in &plan.pods {
            let mut per_link: BTreeMap<ObjectKey, (u32, bool)> = BTreeMap::new();
            for d in &pod.destinations {
                let e = per_link.entry(ObjectKey::new(&d.link.namespace, &d.link.name)).or_default();
                e.0 += 1;
                e.1 |= d.impairment.needs_netem();
            }
            let confirmed = report.and_then(|r| r.applied.as_ref()).and_then(|a| {
                let same = a.plan.pods.iter().any(|p| p == pod);
                let result = a
                    .reply
                    .pods
                    .iter()
                    .find(|r| r.uid == pod.uid && r.namespace == pod.namespace && r.name == pod.name);
                if same { result.map(|r| &r.outcome) } else { None }
            });
            let pod_name = format!("{}/{}", pod.namespace, pod.name);
            for (link, (pairs, needs_netem)) in per_link {
                let p = out.entry(link).or_default();
                let failure = |reason: &str, message: String| PodFailure {
                    pod: pod_name.clone(),
                    node: Some(node.clone()),
                    reason: reason.to_owned(),
                    message,
                };
                match confirmed {
                    Some(PodOutcome::Applied) => p.applied += pairs,
                    Some(PodOutcome::Failed(err)) => {
                        p.failed += pairs;
                        let no_netem = report.and_then(|r| r.capabilities.as_ref()).is_some_and(|c| !c.netem);
                        let message = if err.kind == PodErrorKind::KernelUnsupported && no_netem && needs_netem {
                            format!("node {node}'s kernel has no sch_netem: latency/loss cannot be applied")
                        } else {
                            err.message.clone()
                        };
                        p.failures.push(failure(kind_reason(err.kind), message));
                    }
                    None => {
                        if let Some(f) = report.and_then(|r| r.failure.as_ref()) {
                            p.failed += pairs;
                            p.failures.push(failure(f.reason, f.message.clone()));
                        }
                    }
                }
            }
        }
    }
    out
}

fn kind_reason(kind: PodErrorKind) -> &'static str {
    match kind {
        PodErrorKind::InvalidPlan => "InvalidPlan",
        PodErrorKind::PodNotFound => "PodNotFound",
        PodErrorKind::HostNetwork => "HostNetwork",
        PodErrorKind::InterfaceNotFound => "InterfaceNotFound",
        PodErrorKind::ForeignQdisc => "ForeignQdisc",
        PodErrorKind::KernelUnsupported => "KernelUnsupported",
        PodErrorKind::DuplicateRestriction => "DuplicateRestriction",
        PodErrorKind::Kernel => "Kernel",
    }
}

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
    facts.fill_status(&mut status);
    let empty = Progress::default();
    let progress = progress.unwrap_or(&empty);
    status.pairs_applied = progress.applied;
    status.pairs_failed = progress.failed;
    let exclusions = status.failures.len() + status.failures_omitted as usize;
    let mut failures = std::mem::take(&mut status.failures);
    failures.extend(progress.failures.iter().cloned());
    let total_failures = exclusions + progress.failures.len();
    failures.truncate(MAX_STATUS_FAILURES);
    status.failures_omitted = (total_failures - failures.len()) as u32;
    status.failures = failures;

    let mut conditions = Vec::with_capacity(3);
    if let Some(err) = &facts.error {
        let message = format!("{}: {}", err.field, err.message);
        conditions.push(cond(READY, false, "InvalidSpec", &message));
        conditions.push(cond(DEGRADED, true, "InvalidSpec", &message));
    } else {
        let (pairs, applied, failed) = (status.pairs, status.pairs_applied, status.pairs_failed);
        conditions.push(if pairs == 0 {
            cond(READY, true, "NoPairs", "no running pod matches the link yet; nothing to apply")
        } else if applied == pairs {
            cond(READY, true, "Applied", &format!("all {pairs} pairs are applied"))
        } else if failed > 0 {
            cond(READY, false, "Failed", &format!("{applied} of {pairs} pairs applied, {failed} failed"))
        } else {
            cond(READY, false, "Pending", &format!("{applied} of {pairs} pairs applied, waiting for the node agents"))
        });
        conditions.push(match status.failures.first() {
            Some(first) => {
                let more = total_failures - 1;
                let tail = if more > 0 { format!(" (and {more} more)") } else { String::new() };
                cond(DEGRADED, true, &first.reason, &format!("{}: {}{tail}", first.pod, first.message))
            }
            None => cond(DEGRADED, false, "AsExpected", "every selected pod is shaped"),
        });
    }
    conditions.push(if status.overlaps.is_empty() {
        cond(OVERLAPPING, false, "NoOverlap", "no other NetworkLink covers these pairs")
    } else {
        let list: Vec<String> = status
            .overlaps
            .iter()
            .map(|o| format!("{} (this link wins {}, loses {})", o.link, o.won, o.lost))
            .collect();
        cond(OVERLAPPING, true, "SharedPairs", &format!("pairs shared with {}", list.join(", ")))
    });
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

fn cond(type_: &str, status: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
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
    use std::sync::Arc;
    use std::time::Duration;

    use isthmus_agent_api::{
        ApplyReply, Capabilities, DestinationPlan, Direction, Impairment, LinkRef, PodError, PodPlan, PodResult,
    };

    use super::*;
    use crate::api::SpecError;
    use crate::controller::nodes::{AgentFailure, AppliedPlan};
    use crate::plan::{Exclusion, ExclusionReason, Overlap};

    fn pod(name: &str, link: &str, dests: u8) -> PodPlan {
        PodPlan {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            interface: "eth0".into(),
            host_network: false,
            destinations: (0..dests)
                .map(|i| DestinationPlan {
                    destination: format!("10.0.1.{i}/32").parse().unwrap(),
                    impairment: Impairment { latency: Some(Duration::from_millis(10)), ..Default::default() },
                    link: LinkRef { namespace: "ns".into(), name: link.into(), direction: Direction::Forward },
                })
                .collect(),
        }
    }

    fn plan(node: &str, pods: Vec<PodPlan>) -> NodePlan {
        NodePlan { node: node.into(), version: 0, pods }
    }

    fn report(plan: &NodePlan, outcomes: &[(&str, PodOutcome)], netem: bool) -> NodeReport {
        let caps = Capabilities { netem, htb: true, tbf: true, u32: true, ..Default::default() };
        let reply = ApplyReply {
            node: plan.node.clone(),
            version: 7,
            stale: false,
            pods: outcomes
                .iter()
                .map(|(name, outcome)| PodResult {
                    uid: format!("uid-{name}"),
                    namespace: "ns".into(),
                    name: (*name).into(),
                    outcome: outcome.clone(),
                    mutations: 1,
                })
                .collect(),
            capabilities: caps.clone(),
        };
        NodeReport {
            applied: Some(AppliedPlan { plan: Arc::new(plan.clone()), reply }),
            failure: None,
            capabilities: Some(caps),
        }
    }

    fn facts(pairs: u32) -> LinkFacts {
        LinkFacts {
            generation: Some(3),
            from_summary: "app=a".into(),
            to_summary: "app=b".into(),
            error: None,
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
    fn pairs_count_as_applied_only_when_the_agent_confirmed_the_desired_entry() {
        let link = ObjectKey::new("ns", "l");
        let desired = plan("n1", vec![pod("a", "l", 2), pod("b", "l", 3)]);
        let mut reports = BTreeMap::new();
        assert_eq!(progress([&desired], &reports).get(&link), Some(&Progress::default()), "no report: all pending");

        reports.insert("n1".into(), report(&desired, &[("a", PodOutcome::Applied), ("b", PodOutcome::Applied)], true));
        let p = &progress([&desired], &reports)[&link];
        assert_eq!((p.applied, p.failed), (5, 0));

        // The desired entry of pod b changed since the agent confirmed it: b is pending again.
        let newer = plan("n1", vec![pod("a", "l", 2), pod("b", "l", 4)]);
        let p = &progress([&newer], &reports)[&link];
        assert_eq!((p.applied, p.failed), (2, 0));
    }

    #[test]
    fn a_kernel_without_netem_is_named_in_the_failure() {
        let link = ObjectKey::new("ns", "l");
        let desired = plan("n1", vec![pod("a", "l", 2)]);
        let failed =
            PodOutcome::Failed(PodError { kind: PodErrorKind::KernelUnsupported, message: "EOPNOTSUPP".into() });
        let reports = BTreeMap::from([("n1".to_string(), report(&desired, &[("a", failed)], false))]);
        let p = &progress([&desired], &reports)[&link];
        assert_eq!((p.applied, p.failed), (0, 2));
        assert_eq!(p.failures[0].reason, "KernelUnsupported");
        assert_eq!(p.failures[0].message, "node n1's kernel has no sch_netem: latency/loss cannot be applied");
        assert_eq!(p.failures[0].node.as_deref(), Some("n1"));
        assert_eq!(p.failures[0].pod, "ns/a");
    }

    #[test]
    fn an_unreachable_agent_fails_the_pairs_it_has_not_confirmed() {
        let link = ObjectKey::new("ns", "l");
        let desired = plan("n1", vec![pod("a", "l", 2)]);
        let reports = BTreeMap::from([(
            "n1".to_string(),
            NodeReport {
                failure: Some(AgentFailure { reason: "AgentUnreachable", message: "connection refused".into() }),
                ..Default::default()
            },
        )]);
        let p = &progress([&desired], &reports)[&link];
        assert_eq!((p.applied, p.failed), (0, 2));
        assert_eq!(p.failures[0].reason, "AgentUnreachable");
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

        let done = Progress { applied: 5, failed: 0, failures: vec![] };
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
            reason: ExclusionReason::HostNetwork,
            message: "uses the host network".into(),
        }];
        let failures: Vec<PodFailure> = (0..20)
            .map(|i| PodFailure {
                pod: format!("ns/p{i}"),
                node: Some("n2".into()),
                reason: "AgentUnreachable".into(),
                message: "down".into(),
            })
            .collect();
        let p = Progress { applied: 0, failed: 40, failures };
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
}
