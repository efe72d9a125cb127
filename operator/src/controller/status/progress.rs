//! What the agents made of each link's pairs: applied, failed (with the reason per pod) or pending, from each
//! node's desired plan and the latest report of its agent. Pure. The readiness gate judges a pod's whole entry
//! with the same [`judge`], so that a pod and its links never disagree on what is applied.

use std::collections::BTreeMap;

use isthmus_agent_api::{
    DatapathKind, NodePlan, PodErrorKind, PodOutcome, PodPlan, PodResult, QueueCap, RefusedDestination,
};

use crate::api::PodFailure;
use crate::controller::nodes::NodeReport;
use crate::failure::FailureReason;
use crate::index::ObjectKey;
use crate::plan::Exclusion;

/// What the agents made of one link's pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub applied: u32,
    /// Of the applied pairs, those on nodes whose agent runs the userspace datapath.
    pub emulated: u32,
    pub failed: u32,
    pub failures: Vec<FailedPod>,
    /// Applied pairs whose `queueLimit` the agent cut to its queue budget, and the first such cut.
    pub queue_limits_capped: u32,
    pub first_cap: Option<QueueCap>,
}

/// A pod that is not shaped as one link asks: excluded by the plan or failed by its node's agent. The reason
/// stays typed until the status writes it as text ([`PodFailure`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FailedPod {
    /// `namespace/name`.
    pub pod: String,
    pub node: Option<String>,
    pub reason: FailureReason,
    pub message: String,
}

impl From<&Exclusion> for FailedPod {
    fn from(e: &Exclusion) -> Self {
        FailedPod { pod: e.pod.to_string(), node: e.node.clone(), reason: e.reason, message: e.message.clone() }
    }
}

impl From<FailedPod> for PodFailure {
    fn from(f: FailedPod) -> Self {
        PodFailure { pod: f.pod, node: f.node, reason: f.reason.to_string(), message: f.message }
    }
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
        for (link, share) in node_progress(plan, reports.get(&plan.node)) {
            out.entry(link).or_default().add(&share);
        }
    }
    out
}

impl Progress {
    /// Adds one node's share. Shares added in node order keep the failures in node order and the first node's
    /// queue cap as the first.
    pub fn add(&mut self, share: &Progress) {
        self.applied += share.applied;
        self.emulated += share.emulated;
        self.failed += share.failed;
        self.failures.extend(share.failures.iter().cloned());
        self.queue_limits_capped += share.queue_limits_capped;
        if self.first_cap.is_none() {
            self.first_cap = share.first_cap.clone();
        }
    }
}

/// One node's share of [`progress`]: its plan's pairs, per link, judged against its agent's report.
pub fn node_progress(plan: &NodePlan, report: Option<&NodeReport>) -> BTreeMap<ObjectKey, Progress> {
    let mut out: BTreeMap<ObjectKey, Progress> = BTreeMap::new();
    let emulating = report.and_then(|r| r.capabilities.as_ref()).is_some_and(|c| c.datapath == DatapathKind::Userspace);
    for pod in &plan.pods {
        let confirmed = confirmed_result(report, pod);
        for ((namespace, name), (pairs, needs_netem)) in pairs_per_link(pod) {
            let link = ObjectKey::new(namespace, name);
            let p = out.entry(link.clone()).or_default();
            match judge(&plan.node, report, confirmed.map(|r| &r.outcome), needs_netem) {
                Outcome::Applied => {
                    let refused: Vec<&RefusedDestination> =
                        confirmed.into_iter().flat_map(|r| &r.refused).filter(|d| link.names(&d.link)).collect();
                    let refused_pairs = (refused.len() as u32).min(pairs);
                    let applied = pairs - refused_pairs;
                    p.applied += applied;
                    if emulating {
                        p.emulated += applied;
                    }
                    let caps = confirmed.into_iter().flat_map(|r| &r.queue_caps);
                    for cap in caps.filter(|c| link.names(&c.link)) {
                        p.queue_limits_capped += 1;
                        p.first_cap.get_or_insert_with(|| cap.clone());
                    }
                    if let Some((reason, message)) = refusal(&refused) {
                        p.failed += refused_pairs;
                        p.failures.push(failure(&plan.node, pod, reason, message));
                    }
                }
                Outcome::Failed(reason, message) => {
                    p.failed += pairs;
                    p.failures.push(failure(&plan.node, pod, reason, message));
                }
                Outcome::Pending => {}
            }
        }
    }
    out
}

/// What the agents made of one pod's desired entry, or of the part of it that one link decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Applied,
    Failed(FailureReason, String),
    Pending,
}

/// The outcome of a pod's desired entry on `node`, from the agent's confirmation of exactly that entry
/// ([`confirmed_result`]) or else the node's delivery failure. `needs_netem`: whether the destinations judged
/// need netem, so that an agent's `KernelUnsupported` on a node without it says so.
pub fn judge(node: &str, report: Option<&NodeReport>, confirmed: Option<&PodOutcome>, needs_netem: bool) -> Outcome {
    match confirmed {
        Some(PodOutcome::Applied) => Outcome::Applied,
        Some(PodOutcome::Failed(err)) => {
            let no_netem = report.and_then(|r| r.capabilities.as_ref()).is_some_and(|c| !c.netem);
            let message = if err.kind == PodErrorKind::KernelUnsupported && no_netem && needs_netem {
                format!(
                    "node {node}'s kernel has no sch_netem and its agent runs the tc datapath: latency/loss cannot be applied (agent.datapath auto emulates them)"
                )
            } else {
                err.message.clone()
            };
            Outcome::Failed(err.kind.into(), message)
        }
        None => match report.and_then(|r| r.failure.as_ref()) {
            Some(f) => Outcome::Failed(f.reason, f.message.clone()),
            None => Outcome::Pending,
        },
    }
}

/// What the agent said of a pod's refused destinations (one link's, or all of them): the first one's reason and
/// message, with how many more there are.
pub fn refusal(refused: &[&RefusedDestination]) -> Option<(FailureReason, String)> {
    let first = refused.first()?;
    let mut message = format!("the node's agent installed nothing for this destination: {}", first.error.message);
    if refused.len() > 1 {
        message.push_str(&format!(" (and {} more destinations refused)", refused.len() - 1));
    }
    Some((first.error.kind.into(), message))
}

/// The outcome of a pod's whole desired entry: [`judge`]'s, except that an applied entry with a destination the
/// agent refused is not applied (the refusal's reason).
pub fn judge_entry(node: &str, report: Option<&NodeReport>, pod: &PodPlan, needs_netem: bool) -> Outcome {
    let confirmed = confirmed_result(report, pod);
    match judge(node, report, confirmed.map(|r| &r.outcome), needs_netem) {
        Outcome::Applied => {
            let refused: Vec<&RefusedDestination> = confirmed.into_iter().flat_map(|r| &r.refused).collect();
            match refusal(&refused) {
                Some((reason, message)) => Outcome::Failed(reason, message),
                None => Outcome::Applied,
            }
        }
        other => other,
    }
}

/// The pod's pairs per link (namespace, name), and whether any of them needs netem. Keyed by borrowed names: a
/// key made per destination cost two string copies per pair of the cluster at every status decision.
fn pairs_per_link(pod: &PodPlan) -> BTreeMap<(&str, &str), (u32, bool)> {
    let mut per_link: BTreeMap<(&str, &str), (u32, bool)> = BTreeMap::new();
    for d in &pod.destinations {
        let e = per_link.entry((&d.link.namespace, &d.link.name)).or_default();
        e.0 += 1;
        e.1 |= d.impairment.needs_netem();
    }
    per_link
}

/// The agent's result for the pod, if the plan it acknowledged holds exactly the pod's desired entry.
fn confirmed_result<'r>(report: Option<&'r NodeReport>, pod: &PodPlan) -> Option<&'r PodResult> {
    report?.applied.as_ref()?.confirmed(pod)
}

fn failure(node: &str, pod: &PodPlan, reason: FailureReason, message: String) -> FailedPod {
    FailedPod { pod: format!("{}/{}", pod.namespace, pod.name), node: Some(node.to_owned()), reason, message }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use isthmus_agent_api::test_util::{self, destination, impairment, link};
    use isthmus_agent_api::{ApplyReply, Capabilities, ImpairmentFields, PodError, PodResult};

    use super::*;
    use crate::controller::nodes::{AgentFailure, AppliedPlan};

    fn pod(name: &str, link_name: &str, dests: u8) -> PodPlan {
        let latency = impairment(ImpairmentFields { latency: Some(Duration::from_millis(10)), ..Default::default() });
        let destinations = (0..dests)
            .map(|i| {
                destination(format!("10.0.1.{i}/32").parse::<ipnet::IpNet>().unwrap(), latency.clone(), link(link_name))
            })
            .collect();
        test_util::pod(&format!("uid-{name}"), name, &["10.0.0.1".parse().unwrap()], destinations)
    }

    fn plan(node: &str, pods: Vec<PodPlan>) -> NodePlan {
        NodePlan { node: node.into(), version: 0, pods, ..Default::default() }
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
                    namespace: "default".into(),
                    name: (*name).into(),
                    outcome: outcome.clone(),
                    mutations: 1,
                    queue_caps: Vec::new(),
                    refused: Vec::new(),
                })
                .collect(),
            capabilities: caps.clone(),
            leftovers: Vec::new(),
        };
        NodeReport {
            applied: Some(AppliedPlan::new(Arc::new(plan.clone()), reply)),
            failure: None,
            capabilities: Some(caps),
        }
    }

    #[test]
    fn pairs_on_nodes_whose_agent_emulates_count_as_emulated() {
        let link = ObjectKey::new("default", "l");
        let (on_tc, on_userspace) = (plan("n1", vec![pod("a", "l", 2)]), plan("n2", vec![pod("b", "l", 3)]));
        let mut emulating = report(&on_userspace, &[("b", PodOutcome::Applied)], false);
        emulating.capabilities.as_mut().unwrap().datapath = DatapathKind::Userspace;
        let reports = BTreeMap::from([
            ("n1".to_owned(), report(&on_tc, &[("a", PodOutcome::Applied)], true)),
            ("n2".to_owned(), emulating),
        ]);
        let p = &progress([&on_tc, &on_userspace], &reports)[&link];
        assert_eq!((p.applied, p.emulated, p.failed), (5, 3, 0));
    }

    #[test]
    fn pairs_count_as_applied_only_when_the_agent_confirmed_the_desired_entry() {
        let link = ObjectKey::new("default", "l");
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
        let link = ObjectKey::new("default", "l");
        let desired = plan("n1", vec![pod("a", "l", 2)]);
        let failed =
            PodOutcome::Failed(PodError { kind: PodErrorKind::KernelUnsupported, message: "EOPNOTSUPP".into() });
        let reports = BTreeMap::from([("n1".to_string(), report(&desired, &[("a", failed)], false))]);
        let p = &progress([&desired], &reports)[&link];
        assert_eq!((p.applied, p.failed), (0, 2));
        assert_eq!(p.failures[0].reason.as_str(), "KernelUnsupported");
        assert_eq!(
            p.failures[0].message,
            "node n1's kernel has no sch_netem and its agent runs the tc datapath: latency/loss cannot be applied (agent.datapath auto emulates them)"
        );
        assert_eq!(p.failures[0].node.as_deref(), Some("n1"));
        assert_eq!(p.failures[0].pod, "default/a");
    }

    #[test]
    fn an_unreachable_agent_fails_the_pairs_it_has_not_confirmed() {
        let link = ObjectKey::new("default", "l");
        let desired = plan("n1", vec![pod("a", "l", 2)]);
        let reports = BTreeMap::from([(
            "n1".to_string(),
            NodeReport {
                failure: Some(AgentFailure {
                    reason: FailureReason::AgentUnreachable,
                    message: "connection refused".into(),
                }),
                ..Default::default()
            },
        )]);
        let p = &progress([&desired], &reports)[&link];
        assert_eq!((p.applied, p.failed), (0, 2));
        assert_eq!(p.failures[0].reason.as_str(), "AgentUnreachable");
    }

    #[test]
    fn cut_queue_limits_count_per_link_and_only_once_applied() {
        let (l, m) = (ObjectKey::new("default", "l"), ObjectKey::new("default", "m"));
        let mut a = pod("a", "l", 2);
        a.destinations.extend(pod("a", "m", 1).destinations.into_iter().map(|mut d| {
            d.destination = "10.0.9.9/32".parse().unwrap();
            d
        }));
        let desired = plan("n1", vec![a.clone()]);
        let cap = |dest: &str, link_name: &str| QueueCap {
            destination: dest.parse().unwrap(),
            link: link(link_name),
            requested_packets: 50_000,
            installed_packets: 11_081,
        };
        let mut r = report(&desired, &[("a", PodOutcome::Applied)], true);
        let applied = r.applied.as_mut().unwrap();
        applied.reply.pods[0].queue_caps = vec![cap("10.0.1.0/32", "l"), cap("10.0.1.1/32", "l")];
        let reports = BTreeMap::from([("n1".to_string(), r)]);
        let p = progress([&desired], &reports);
        assert_eq!((p[&l].applied, p[&l].queue_limits_capped), (2, 2));
        assert_eq!(p[&l].first_cap, Some(cap("10.0.1.0/32", "l")));
        assert_eq!((p[&m].applied, p[&m].queue_limits_capped, p[&m].first_cap.is_none()), (1, 0, true));

        // A pod whose desired entry changed since: pending, and its cuts no longer count.
        let mut changed = a;
        changed.destinations.pop();
        let p = progress([&plan("n1", vec![changed])], &reports);
        assert_eq!((p[&l].applied, p[&l].queue_limits_capped), (0, 0));
    }

    #[test]
    fn a_refused_destination_fails_alone_and_the_pods_other_pairs_count_as_applied() {
        let (l, m) = (ObjectKey::new("default", "l"), ObjectKey::new("default", "m"));
        let mut a = pod("a", "l", 3);
        a.destinations.extend(pod("a", "m", 1).destinations.into_iter().map(|mut d| {
            d.destination = "10.0.9.9/32".parse().unwrap();
            d
        }));
        let desired = plan("n1", vec![a.clone()]);
        let refused = |dest: &str| RefusedDestination {
            destination: dest.parse().unwrap(),
            link: link("l"),
            error: PodError {
                kind: PodErrorKind::InvalidPlan,
                message: format!("destination {dest}: bandwidth: 3200 bytes of burst take longer…"),
            },
        };
        let mut r = report(&desired, &[("a", PodOutcome::Applied)], true);
        r.applied.as_mut().unwrap().reply.pods[0].refused = vec![refused("10.0.1.0/32"), refused("10.0.1.2/32")];
        let reports = BTreeMap::from([("n1".to_string(), r)]);
        let p = progress([&desired], &reports);
        assert_eq!((p[&l].applied, p[&l].failed), (1, 2), "the refused pairs fail, the third is applied");
        assert_eq!(p[&l].failures.len(), 1, "one failure per pod and link");
        assert_eq!(p[&l].failures[0].reason.as_str(), "InvalidPlan");
        assert!(
            p[&l].failures[0].message.contains("10.0.1.0/32") && p[&l].failures[0].message.contains("1 more"),
            "{}",
            p[&l].failures[0].message
        );
        assert_eq!((p[&m].applied, p[&m].failed, p[&m].failures.len()), (1, 0, 0), "the other link is untouched");

        // The pod's whole entry (what its readiness gate judges) is not applied while a destination is refused.
        let outcome = judge_entry("n1", reports.get("n1"), &a, false);
        assert!(matches!(outcome, Outcome::Failed(FailureReason::InvalidPlan, _)), "{outcome:?}");
    }
}
