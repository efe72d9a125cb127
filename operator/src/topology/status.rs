//! What a `NetworkTopology`'s status says, and how it is made from the expansion, the pods and the children's
//! own statuses (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::expand::{Expansion, TopologyError};
use super::spec::{MAX_NAME as MAX_REGION_NAME, MAX_REGIONS};
use crate::api::bounds::{MAX_FIGURE, MAX_SUMMARY, cut, cut_conditions, cut_opt};
use crate::api::{NetworkLinkStatus, format_duration};
use crate::unit_syntax::parse_duration;

/// What the operator made of a topology.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: every NetworkLink of the topology exists as specified and is Ready itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::api::bounds::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Regions and pods, for `kubectl get`: `3 regions, 12 pods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUMMARY))]
    pub summary: Option<String>,
    /// Each region with its pods (pending or running, with an IP).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_REGIONS))]
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
    #[schemars(length(max = MAX_REGIONS))]
    pub matrix: Vec<MatrixRow>,
}

/// A region and its pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegionStatus {
    #[schemars(length(max = MAX_REGION_NAME))]
    pub name: String,
    /// Pods in the region, pending or running, with an IP (host-network pods are never shaped and not counted).
    #[schemars(range(max = 4294967295_u32))]
    pub pods: u32,
}

/// The round trips from one region.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatrixRow {
    #[schemars(length(max = MAX_REGION_NAME))]
    pub from: String,
    /// The configured round trip to each region (out with `from → to`, back with `to → from`), e.g. `80ms`.
    #[schemars(length(max = MAX_REGIONS), inner(length(max = MAX_FIGURE)))]
    pub configured: Vec<String>,
    /// The median round trip the link `from → to` measured (its probes' `rttP50`, network included), `-`
    /// where nothing is measured (yet).
    #[schemars(length(max = MAX_REGIONS), inner(length(max = MAX_FIGURE)))]
    pub measured: Vec<String>,
}

impl NetworkTopologyStatus {
    /// Cuts every string and list to the bound the CRD declares for it (crate::api::bounds): a condition may
    /// quote a child's condition or the API server's answer.
    pub fn bound(&mut self) {
        cut_conditions(&mut self.conditions);
        cut_opt(&mut self.summary, MAX_SUMMARY);
        self.regions.truncate(MAX_REGIONS);
        for r in &mut self.regions {
            cut(&mut r.name, MAX_REGION_NAME);
        }
        self.matrix.truncate(MAX_REGIONS);
        for row in &mut self.matrix {
            cut(&mut row.from, MAX_REGION_NAME);
            for cells in [&mut row.configured, &mut row.measured] {
                cells.truncate(MAX_REGIONS);
                cells.iter_mut().for_each(|c| cut(c, MAX_FIGURE));
            }
        }
    }
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
    status.bound();
    status
}

fn fill(status: &mut NetworkTopologyStatus, exp: &Expansion, input: &StatusInput<'_>) {
    // A region's own link has every pod of the region with an IP as a source.
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
#[path = "status_tests.rs"]
mod tests;
