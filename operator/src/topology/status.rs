//! What a `NetworkTopology`'s status says, and how it is made from the expansion, the pods and the children's
//! own statuses (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::expand::{Expansion, TopologyError};
use crate::api::{NetworkLinkStatus, format_duration};
use crate::units::parse_duration;

/// What the operator made of a topology.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: every NetworkLink of the topology exists as specified and is Ready itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Regions and pods, for `kubectl get`: `3 regions, 12 pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Each region with its running pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionStatus>,
    /// NetworkLinks the topology owns.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub links: u32,
    /// Of those, the ones Ready.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub links_ready: u32,
    /// (source pod, destination) pairs its links' agents confirmed, over all its links.
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs_applied: u32,
    /// Pairs the agents could not apply (each link's status names the pods).
    #[serde(default)]
    #[schemars(range(max = 4294967295_u32))]
    pub pairs_failed: u32,
    /// The round trip between every ordered pair of regions: one row per `from` region, one cell per `to`
    /// region in the order of `regions` (`kubectl isthmus matrix` prints it as a table).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matrix: Vec<MatrixRow>,
}

/// A region and its pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegionStatus {
    pub name: String,
    /// Running pods in the region (host-network pods are never shaped and not counted).
    #[schemars(range(max = 4294967295_u32))]
    pub pods: u32,
}

/// The round trips from one region.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatrixRow {
    pub from: String,
    /// The configured round trip to each region (out with `from → to`, back with `to → from`), e.g. `80ms`.
    pub configured: Vec<String>,
    /// The median round trip the link `from → to` measured (its probes' `rttP50`, network included), `-`
    /// where nothing is measured (yet).
    pub measured: Vec<String>,
}

pub const READY: &str = "Ready";

/// Why the topology is, or is not, Ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyReason {
    /// Every link exists as specified and is Ready.
    Applied,
    /// Links are being created or updated, or their agents have not confirmed them yet.
    Pending,
    /// Some link is not Ready (its status says why).
    LinksNotReady,
    /// The spec cannot be realised (the message names the field).
    InvalidSpec,
    /// A NetworkLink by the name one of the topology's links needs exists and belongs to someone else.
    NameTaken,
    /// The API server refused to write one of the topology's links (the message has its answer).
    LinkRefused,
}

impl TopologyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "Applied",
            Self::Pending => "Pending",
            Self::LinksNotReady => "LinksNotReady",
            Self::InvalidSpec => "InvalidSpec",
            Self::NameTaken => "NameTaken",
            Self::LinkRefused => "LinkRefused",
        }
    }
}

/// A child as the reconciler found it on the server after its writes.
#[derive(Debug, Clone, Default)]
pub struct ChildState {
    /// Whether the child's spec is the one desired (otherwise a write is still due).
    pub in_sync: bool,
    pub status: Option<NetworkLinkStatus>,
    pub generation: Option<i64>,
}

/// What the status is made of.
pub struct StatusInput<'a> {
    pub generation: Option<i64>,
    pub expansion: Result<&'a Expansion, &'a TopologyError>,
    /// Children by name.
    pub children: &'a BTreeMap<String, ChildState>,
    /// Names of children the topology needs that another owner holds.
    pub taken: &'a [String],
    /// Children the API server refused to write, with its answer.
    pub refused: &'a [(String, String)],
    pub previous: Option<&'a NetworkTopologyStatus>,
    pub now: &'a Time,
}

/// The whole status.
pub fn topology_status(input: &StatusInput<'_>) -> NetworkTopologyStatus {
    let mut status = NetworkTopologyStatus { observed_generation: input.generation, ..Default::default() };
    let (reason, message) = match input.expansion {
        Err(e) => (TopologyReason::InvalidSpec, e.to_string()),
        Ok(exp) => {
            fill(&mut status, exp, input);
            readiness(&status, exp, input)
        }
    };
    let ready = reason == TopologyReason::Applied;
    let before = input.previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == READY));
    let status_text = if ready { "True" } else { "False" };
    status.conditions = vec![Condition {
        type_: READY.into(),
        status: status_text.into(),
        reason: reason.as_str().into(),
        message,
        observed_generation: input.generation,
        last_transition_time: match before {
            Some(b) if b.status == status_text => b.last_transition_time.clone(),
            _ => input.now.clone(),
        },
    }];
    status
}

fn fill(status: &mut NetworkTopologyStatus, exp: &Expansion, input: &StatusInput<'_>) {
    // A region's own link has every running pod of the region as a source.
    let pods = |i: usize| -> u32 {
        let child = input.children.get(&exp.child(i, i).name);
        child.and_then(|c| c.status.as_ref()).map_or(0, |s| s.source_pods)
    };
    status.regions =
        exp.regions.iter().enumerate().map(|(i, r)| RegionStatus { name: r.clone(), pods: pods(i) }).collect();
    let pods: u32 = status.regions.iter().map(|r| r.pods).sum();
    status.summary = Some(format!("{} regions, {pods} pods", exp.regions.len()));
    status.links = exp.children.len() as u32;
    for child in &exp.children {
        let Some(st) = input.children.get(&child.name).and_then(|c| c.status.as_ref()) else { continue };
        status.pairs_applied += st.pairs_applied;
        status.pairs_failed += st.pairs_failed;
        status.links_ready += u32::from(child_ready(input.children.get(&child.name)));
    }
    let cell = |name: &str| -> String {
        input
            .children
            .get(name)
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.measured.as_ref())
            .and_then(|m| m.forward.as_ref())
            .and_then(|f| f.rtt_p50.clone())
            .unwrap_or_else(|| "-".into())
    };
    status.matrix = exp
        .regions
        .iter()
        .enumerate()
        .map(|(i, from)| MatrixRow {
            from: from.clone(),
            configured: (0..exp.regions.len()).map(|j| format_duration(exp.round_trip(i, j))).collect(),
            measured: (0..exp.regions.len()).map(|j| cell(&exp.child(i, j).name)).collect(),
        })
        .collect();
}

/// A child is Ready when its status describes its current generation and says Ready.
fn child_ready(child: Option<&ChildState>) -> bool {
    let Some(child) = child else { return false };
    let Some(status) = &child.status else { return false };
    child.in_sync
        && status.observed_generation == child.generation
        && status.conditions.iter().any(|c| c.type_ == READY && c.status == "True")
}

fn readiness(status: &NetworkTopologyStatus, exp: &Expansion, input: &StatusInput<'_>) -> (TopologyReason, String) {
    if let Some(first) = input.taken.first() {
        let message = format!(
            "NetworkLink {first} exists and is not this topology's ({} such names); rename or delete it",
            input.taken.len()
        );
        return (TopologyReason::NameTaken, message);
    }
    if let Some((name, answer)) = input.refused.first() {
        let more = input.refused.len() - 1;
        return (TopologyReason::LinkRefused, format!("writing NetworkLink {name}: {answer} (and {more} more)"));
    }
    let missing = exp.children.iter().filter(|c| !input.children.get(&c.name).is_some_and(|s| s.in_sync)).count();
    if missing > 0 {
        return (TopologyReason::Pending, format!("{missing} of {} links still to write", exp.children.len()));
    }
    if status.links_ready == status.links {
        let pairs = status.pairs_applied;
        return (TopologyReason::Applied, format!("all {} links are Ready ({pairs} pairs applied)", status.links));
    }
    let not_ready = exp.children.iter().find(|c| !child_ready(input.children.get(&c.name)));
    let waiting = exp.children.iter().filter(|c| !child_ready(input.children.get(&c.name))).count();
    let first = not_ready.map(|c| {
        let reason = input
            .children
            .get(&c.name)
            .and_then(|s| s.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY))
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "no status yet".into());
        format!("{}: {reason}", c.name)
    });
    let first = first.unwrap_or_default();
    if status.pairs_failed > 0 {
        let msg = format!(
            "{waiting} of {} links not Ready, {} pairs failed; first {first}",
            status.links, status.pairs_failed
        );
        (TopologyReason::LinksNotReady, msg)
    } else {
        (TopologyReason::Pending, format!("{waiting} of {} links not Ready yet; first {first}", status.links))
    }
}

/// Parses a matrix cell back (for `kubectl isthmus matrix` and tests); `-` is `None`.
pub fn cell_duration(cell: &str) -> Option<std::time::Duration> {
    (cell != "-").then(|| parse_duration(cell).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::measured::{DirectionMeasured, MeasuredStatus};
    use crate::topology::spec::{DEFAULT_PRIORITY, NetworkTopologySpec, RegionSpec};

    fn expansion() -> Expansion {
        let spec = NetworkTopologySpec {
            region_label: Some("r".into()),
            regions: ["eu", "us"]
                .map(|n| RegionSpec { name: n.into(), pod_selector: None, dataset_region: None })
                .to_vec(),
            dataset: None,
            default: Some(crate::api::ImpairmentSpec { latency: Some("40ms".into()), ..Default::default() }),
            intra_region: None,
            links: vec![],
            routing: None,
            priority: DEFAULT_PRIORITY,
            verify: None,
        };
        crate::topology::expand("w", &spec).unwrap()
    }

    fn child(ready: bool, sources: u32, rtt: Option<&str>) -> ChildState {
        let cond = Condition {
            type_: READY.into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: if ready { "Applied" } else { "Failed" }.into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        let measured = rtt.map(|r| MeasuredStatus {
            forward: Some(DirectionMeasured { rtt_p50: Some(r.into()), ..Default::default() }),
            reverse: None,
        });
        let status = NetworkLinkStatus {
            observed_generation: Some(1),
            conditions: vec![cond],
            source_pods: sources,
            pairs_applied: if ready { 2 } else { 0 },
            pairs_failed: if ready { 0 } else { 2 },
            measured,
            ..Default::default()
        };
        ChildState { in_sync: true, status: Some(status), generation: Some(1) }
    }

    fn status_of(
        children: &BTreeMap<String, ChildState>,
        taken: &[String],
        refused: &[(String, String)],
    ) -> NetworkTopologyStatus {
        let exp = expansion();
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        topology_status(&StatusInput {
            generation: Some(2),
            expansion: Ok(&exp),
            children,
            taken,
            refused,
            previous: None,
            now: &now,
        })
    }

    fn reason(s: &NetworkTopologyStatus) -> (&str, &str) {
        (s.conditions[0].status.as_str(), s.conditions[0].reason.as_str())
    }

    #[test]
    fn ready_when_every_link_is_with_counts_and_the_matrix() {
        let mut children = BTreeMap::new();
        children.insert("w.eu.eu".into(), child(true, 3, Some("0.4ms")));
        children.insert("w.eu.us".into(), child(true, 3, Some("80.9ms")));
        children.insert("w.us.eu".into(), child(true, 2, None));
        children.insert("w.us.us".into(), child(true, 2, None));
        let s = status_of(&children, &[], &[]);
        assert_eq!(reason(&s), ("True", "Applied"));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.summary.as_deref(), Some("2 regions, 5 pods"));
        assert_eq!((s.links, s.links_ready, s.pairs_applied, s.pairs_failed), (4, 4, 8, 0));
        assert_eq!(s.matrix[0].configured, ["0", "80ms"]);
        assert_eq!(s.matrix[0].measured, ["0.4ms", "80.9ms"]);
        assert_eq!(s.matrix[1].measured, ["-", "-"]);
        assert_eq!(cell_duration("80.9ms"), Some(std::time::Duration::from_micros(80_900)));
        assert_eq!(cell_duration("-"), None);
    }

    #[test]
    fn not_ready_says_which_link_and_why() {
        let mut children = BTreeMap::new();
        for name in ["w.eu.eu", "w.us.eu", "w.us.us"] {
            children.insert(name.into(), child(true, 1, None));
        }
        let s = status_of(&children, &[], &[]);
        assert_eq!(reason(&s), ("False", "Pending"));
        assert!(s.conditions[0].message.contains("1 of 4 links still to write"), "{:?}", s.conditions[0]);
        children.insert("w.eu.us".into(), child(false, 1, None));
        let s = status_of(&children, &[], &[]);
        assert_eq!(reason(&s), ("False", "LinksNotReady"));
        assert!(s.conditions[0].message.contains("w.eu.us: Failed: m"), "{:?}", s.conditions[0]);
        children.get_mut("w.eu.us").unwrap().generation = Some(2);
        children.get_mut("w.eu.us").unwrap().status.as_mut().unwrap().pairs_failed = 0;
        let s = status_of(&children, &[], &[]);
        assert_eq!(reason(&s), ("False", "Pending"), "a status of an older generation is not Ready");
        let s = status_of(&children, &["w.eu.us".into()], &[]);
        assert_eq!(reason(&s), ("False", "NameTaken"));
        let s = status_of(&children, &[], &[("w.eu.us".into(), "denied".into())]);
        assert_eq!(reason(&s), ("False", "LinkRefused"));
        assert!(s.conditions[0].message.contains("w.eu.us: denied"));
    }

    #[test]
    fn an_invalid_spec_names_the_field_and_keeps_transition_times() {
        let err = TopologyError { field: "spec.links[0]".into(), message: "no".into() };
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let none = BTreeMap::new();
        let input = |previous| StatusInput {
            generation: Some(3),
            expansion: Err(&err),
            children: &none,
            taken: &[],
            refused: &[],
            previous,
            now: &now,
        };
        let s = topology_status(&input(None));
        assert_eq!(reason(&s), ("False", "InvalidSpec"));
        assert_eq!(s.conditions[0].message, "spec.links[0]: no");
        let mut earlier = s.clone();
        earlier.conditions[0].last_transition_time = Time(k8s_openapi::jiff::Timestamp::from_second(7).unwrap());
        let again = topology_status(&input(Some(&earlier)));
        assert_eq!(again.conditions[0].last_transition_time, earlier.conditions[0].last_transition_time);
    }
}
