//! Step 1 of an apply: every entry of the plan checked on its own, so that one pod's error is that pod's only;
//! and the per-pod results the apply reports.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use isthmus_agent_api::{
    LinkRef, PodError, PodErrorKind, PodOutcome, PodPlan, PodResult, QueueCap, RefusedDestination,
};

use super::PodJob;
use crate::node::plan::{Destination, PlanPod};
use crate::node::state::desired_state;
use crate::node::timing::Timelines;
use isthmus_datapaths::datapath::units::queue_cap;
use isthmus_datapaths::datapath::{QueueBound, QueueBudget, check_representable};

/// The pods of one plan as the apply goes: a result per entry of the plan (`None` while the pod is worked on),
/// the pods still to reconcile, and the pods whose installed tree stays as it is.
pub(super) struct Progress {
    pub results: Vec<Option<PodResult>>,
    pub jobs: Vec<PodJob>,
    pub keep_as_is: HashSet<String>,
}

impl Progress {
    /// Step 1: every entry checked on its own, with the impairments in force at `now_ms`; of each pod, only what
    /// the apply needs is kept.
    pub fn check(pods: Vec<PlanPod>, budget: QueueBudget, timelines: &Timelines, now_ms: u64) -> Self {
        let mut progress =
            Progress { results: Vec::with_capacity(pods.len()), jobs: Vec::new(), keep_as_is: HashSet::new() };
        let mut seen = HashSet::new();
        for (index, entry) in pods.into_iter().enumerate() {
            match check_pod(index, entry, &mut seen, budget, timelines, now_ms) {
                Ok(job) => {
                    progress.results.push(None);
                    progress.jobs.push(job);
                }
                Err(Refused { result, keep_installed }) => {
                    if keep_installed {
                        progress.keep_as_is.insert(result.uid.clone());
                    }
                    progress.results.push(Some(*result));
                }
            }
        }
        progress
    }

    pub fn fail(&mut self, job: &PodJob, kind: PodErrorKind, message: String) {
        self.results[job.index] = Some(failed_pod(&job.pod, kind, message));
    }

    pub fn into_results(self) -> Vec<PodResult> {
        self.results.into_iter().map(|r| r.expect("every pod has a result")).collect()
    }
}

/// Why a plan entry is not reconciled, and whether what is installed for the pod stays.
struct Refused {
    /// Boxed: a result is large, and refusals are the rare path.
    result: Box<PodResult>,
    keep_installed: bool,
}

fn check_pod(
    index: usize,
    entry: PlanPod,
    seen: &mut HashSet<String>,
    budget: QueueBudget,
    timelines: &Timelines,
    now_ms: u64,
) -> Result<PodJob, Refused> {
    let (pod, destinations) = match entry {
        PlanPod::Valid { pod, destinations } => (pod, destinations),
        PlanPod::Malformed(bad) => {
            return Err(Refused { result: Box::new(bad.result(index)), keep_installed: true });
        }
    };
    let refuse = |kind, message, keep_installed| {
        Err(Refused { result: Box::new(failed_pod(&pod, kind, message)), keep_installed })
    };
    if !seen.insert(pod.uid.clone()) {
        return refuse(PodErrorKind::InvalidPlan, format!("pods[{index}].uid: {} appears twice", pod.uid), false);
    }
    if pod.host_network {
        let message = "the pod uses the host network; isthmus never shapes it".to_owned();
        return refuse(PodErrorKind::HostNetwork, message, false);
    }
    if let Err(message) = check_interface_name(&pod.interface) {
        return refuse(PodErrorKind::InvalidPlan, format!("pods[{index}].interface: {message}"), true);
    }
    let (destinations, refused) = split_refused(destinations, timelines);
    let in_force = timelines.in_force(&destinations, now_ms);
    match desired_state(&in_force, budget) {
        Ok(desired) => {
            let queue_caps = queue_caps(&in_force, desired.queue_bound());
            Ok(PodJob { index, pod, destinations, desired, queue_caps, refused })
        }
        Err(e) => refuse(e.kind(), format!("pods[{index}]: {e}"), true),
    }
}

/// The destinations the kernel can hold, and the ones it cannot — in the link's own impairment or in any phase
/// its schedule can put in force — each refused alone with why. A link's phases are checked once per pod, however
/// many of its destinations the pod has.
fn split_refused(destinations: Vec<Destination>, timelines: &Timelines) -> (Vec<Destination>, Vec<RefusedDestination>) {
    // Whether each link's phases all fit, by the link's one allocation (the plan interns them); a link's whose
    // do not is checked again for each of its destinations, so that every message names its own (the rare path).
    let mut phases_fit: HashMap<*const LinkRef, bool> = HashMap::new();
    let check_phases = |net, link: &LinkRef| {
        timelines.phase_impairments(link).try_for_each(|phase| {
            check_representable(net, phase.fields()).map_err(|e| format!("a phase of the link's schedule: {e}"))
        })
    };
    let mut kept = Vec::with_capacity(destinations.len());
    let mut refused = Vec::new();
    for (net, impairment, link) in destinations {
        let verdict = check_representable(net, impairment.fields()).map_err(|e| e.to_string()).and_then(|()| {
            let fits = *phases_fit.entry(Arc::as_ptr(&link)).or_insert_with(|| check_phases(net, &link).is_ok());
            if fits { Ok(()) } else { check_phases(net, &link) }
        });
        match verdict {
            Ok(()) => kept.push((net, impairment, link)),
            Err(message) => refused.push(RefusedDestination {
                destination: net,
                link: (*link).clone(),
                error: PodError { kind: PodErrorKind::InvalidPlan, message },
            }),
        }
    }
    (kept, refused)
}

/// The destinations whose `queueLimit` `bound` cuts.
fn queue_caps(destinations: &[Destination], bound: QueueBound) -> Vec<QueueCap> {
    destinations
        .iter()
        .filter_map(|(destination, impairment, link)| {
            let (requested_packets, installed_packets) = queue_cap(impairment.fields(), bound)?;
            Some(QueueCap { destination: *destination, link: (**link).clone(), requested_packets, installed_packets })
        })
        .collect()
}

/// Linux interface names: 1 to 15 bytes, no `/`, no whitespace, not `.` or `..`.
fn check_interface_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("{name:?} must be 1 to 15 bytes long"));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Err(format!("{name:?} is not a valid interface name"));
    }
    Ok(())
}

pub(super) fn applied_pod(
    pod: &PodPlan,
    mutations: usize,
    queue_caps: Vec<QueueCap>,
    refused: Vec<RefusedDestination>,
) -> PodResult {
    PodResult { mutations: mutations as u64, queue_caps, refused, ..PodResult::of(pod, PodOutcome::Applied) }
}

pub(super) fn failed_pod(pod: &PodPlan, kind: PodErrorKind, message: String) -> PodResult {
    PodResult::of(pod, PodOutcome::Failed(PodError { kind, message }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use isthmus_agent_api::test_util::{destination, impairment, link, pod};
    use isthmus_agent_api::{ImpairmentFields, NodePlan};

    use super::*;
    use crate::node::plan::RawNodePlan;

    #[test]
    fn a_cut_queue_limit_is_reported_with_its_destination_and_link() {
        let hour = Some(Duration::from_secs(3600));
        let asked =
            impairment(ImpairmentFields { latency: hour, queue_limit_packets: Some(50_000), ..Default::default() });
        let derived = impairment(ImpairmentFields { latency: hour, ..Default::default() });
        let destinations = vec![
            destination("10.0.0.2".parse::<std::net::IpAddr>().unwrap(), asked, link("long")),
            destination("10.0.0.3".parse::<std::net::IpAddr>().unwrap(), derived, link("long")),
        ];
        let plan = NodePlan {
            node: "n".into(),
            version: 1,
            pods: vec![pod("u", "p", &["10.0.0.1".parse().unwrap()], destinations)],
            ..Default::default()
        };
        // Two destinations: each gets min(per destination, per pod / 2) = 4 MiB = 2,770 frames.
        let budget = QueueBudget::new(8 << 20, 8 << 20).unwrap();
        let progress = Progress::check(RawNodePlan::from(&plan).pods, budget, &Timelines::default(), 0);
        let [job] = progress.jobs.as_slice() else { panic!("one pod to reconcile") };
        assert_eq!(
            job.queue_caps,
            [QueueCap {
                destination: "10.0.0.2/32".parse().unwrap(),
                link: link("long"),
                requested_packets: 50_000,
                installed_packets: 2770,
            }],
            "only the explicit queueLimit is reported; the derived queue is cut silently"
        );
    }

    #[test]
    fn a_destination_the_kernel_cannot_hold_is_refused_alone_in_its_own_impairment_or_a_phase() {
        use isthmus_agent_api::LinkTimeline;
        use isthmus_agent_api::schedule::{End, Phase, Timeline, TimelineFields};
        use isthmus_agent_api::test_util::rate;

        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        // 8 bit/s: the default bucket (3,200 bytes) would take 3,200 s to refill, the kernel holds 275 s.
        let destinations = vec![
            destination(ip("10.0.0.2"), rate(1_000_000), link("fine")),
            destination(ip("10.0.0.3"), rate(8), link("crawl")),
            destination(ip("10.0.0.4"), rate(1_000_000), link("flaps")),
            destination(ip("10.0.0.5"), rate(1_000_000), link("flaps")),
        ];
        let phase = |impairment| Phase { duration_ms: 1000, impairment: Arc::new(impairment), name: String::new() };
        let fields = TimelineFields {
            start_unix_ms: 0,
            phases: vec![phase(rate(2_000_000)), phase(rate(8))],
            end: End::Repeat,
            jitter: None,
        };
        let timelines =
            Timelines::new(vec![LinkTimeline { link: link("flaps"), timeline: Timeline::try_from(fields).unwrap() }]);
        let plan = NodePlan {
            node: "n".into(),
            version: 1,
            pods: vec![pod("u", "p", &[ip("10.0.0.1")], destinations)],
            ..Default::default()
        };
        // At 0 ms the first phase (2 Mbit/s) is in force; the second is refused all the same.
        let progress = Progress::check(RawNodePlan::from(&plan).pods, QueueBudget::DEFAULT, &timelines, 0);
        let [job] = progress.jobs.as_slice() else { panic!("the pod is reconciled: {:?}", progress.results) };
        let kept: Vec<String> = job.destinations.iter().map(|d| d.0.to_string()).collect();
        assert_eq!(kept, ["10.0.0.2/32"]);
        assert_eq!(job.desired.len(), 1);
        let refused: Vec<(String, &str)> =
            job.refused.iter().map(|r| (r.destination.to_string(), r.link.name.as_str())).collect();
        assert_eq!(
            refused,
            [("10.0.0.3/32".into(), "crawl"), ("10.0.0.4/32".into(), "flaps"), ("10.0.0.5/32".into(), "flaps")]
        );
        assert!(job.refused.iter().all(|r| r.error.kind == PodErrorKind::InvalidPlan));
        let own = &job.refused[0].error.message;
        assert!(own.contains("10.0.0.3/32") && own.contains("bandwidth") && own.contains("275 s"), "{own}");
        let phased = &job.refused[1].error.message;
        assert!(phased.contains("a phase of the link's schedule") && phased.contains("10.0.0.4/32"), "{phased}");
    }
}
