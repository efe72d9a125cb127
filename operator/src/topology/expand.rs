//! A topology's spec → the NetworkLinks that realise it, one per ordered pair of regions (a region with itself
//! included). Pure: the reconciler writes what this returns, the status reads its matrix.
//!
//! Each ordered pair's impairment is layered, later layers overriding earlier ones field by field: `default`
//! (or `intraRegion` for a region with itself), the dataset's round trip split into halves, the reverse pair's
//! `roundTrip`, the pair's own link. With hubs, a pair of two spokes takes the leg to the hub and the leg from
//! it, composed ([`super::route`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::dataset;
use super::route::{compose, exact_duration};
use super::spec::{MAX_NAME, MAX_REGIONS, NetworkTopologySpec};
use crate::api::{FromSpec, ImpairmentSpec, NetworkLinkSpec, ServiceInclusion, ToSpec};

/// Labels every child carries: the topology's name and its two regions.
pub const TOPOLOGY_LABEL: &str = "isthmus.dev/topology";
pub const FROM_REGION_LABEL: &str = "isthmus.dev/from-region";
pub const TO_REGION_LABEL: &str = "isthmus.dev/to-region";

/// Why a topology cannot be realised; `field` is the JSON path in the object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TopologyError {
    pub field: String,
    pub message: String,
}

fn error(field: impl Into<String>, message: impl Into<String>) -> TopologyError {
    TopologyError { field: field.into(), message: message.into() }
}

/// One NetworkLink of the topology.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    pub name: String,
    pub from: String,
    pub to: String,
    pub spec: NetworkLinkSpec,
}

impl Child {
    pub fn labels(&self, topology: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (TOPOLOGY_LABEL.to_owned(), topology.to_owned()),
            (FROM_REGION_LABEL.to_owned(), self.from.clone()),
            (TO_REGION_LABEL.to_owned(), self.to.clone()),
        ])
    }
}

/// The links of a topology: `children[i * n + j]` is region `i` → region `j`, in the order of `regions`.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    pub regions: Vec<String>,
    pub children: Vec<Child>,
    /// One-way latency of each child, same order.
    latency: Vec<Duration>,
}

impl Expansion {
    pub fn child(&self, from: usize, to: usize) -> &Child {
        &self.children[from * self.regions.len() + to]
    }

    pub fn latency(&self, from: usize, to: usize) -> Duration {
        self.latency[from * self.regions.len() + to]
    }

    /// Out with `from → to`, back with `to → from`.
    pub fn round_trip(&self, from: usize, to: usize) -> Duration {
        self.latency(from, to) + self.latency(to, from)
    }
}

/// The name of the child `from → to` of topology `topology`: dots cannot occur in region names, so the name
/// says which pair it is.
pub fn child_name(topology: &str, from: &str, to: &str) -> String {
    format!("{topology}.{from}.{to}")
}

/// Expands `spec` of the topology named `name`.
pub fn expand(name: &str, spec: &NetworkTopologySpec) -> Result<Expansion, TopologyError> {
    let layout = Layout::check(name, spec)?;
    let n = layout.regions.len();
    let mut children = Vec::with_capacity(n * n);
    let mut latency = Vec::with_capacity(n * n);
    for i in 0..n {
        for j in 0..n {
            let (impairment, origin) = layout.path(i, j)?;
            let from = &layout.regions[i];
            let to = &layout.regions[j];
            let child_spec = NetworkLinkSpec {
                from: FromSpec { pod_selector: layout.selector(i) },
                to: ToSpec {
                    pod_selector: Some(layout.selector(j)),
                    namespace_selector: None,
                    cidrs: vec![],
                    services: ServiceInclusion::Matching,
                },
                impairment: Some(impairment),
                reverse: None,
                symmetric: false,
                one_way: true,
                profile: None,
                priority: spec.priority,
                verify: spec.verify,
                schedule: None,
            };
            let resolved = child_spec.resolve().map_err(|e| {
                let below = e.field.strip_prefix("spec.impairment").unwrap_or("");
                error(format!("{origin}{below}"), format!("{from} → {to}: {}", e.message))
            })?;
            latency.push(resolved.forward.fields().latency.unwrap_or_default());
            children.push(Child {
                name: child_name(name, from, to),
                from: from.clone(),
                to: to.clone(),
                spec: child_spec,
            });
        }
    }
    Ok(Expansion { regions: layout.regions, children, latency })
}

/// The spec checked, with its regions and links indexed.
struct Layout<'a> {
    spec: &'a NetworkTopologySpec,
    regions: Vec<String>,
    /// (from, to) → the link's index in `spec.links`.
    links: BTreeMap<(usize, usize), usize>,
    hubs: Vec<usize>,
}

impl<'a> Layout<'a> {
    fn check(name: &str, spec: &'a NetworkTopologySpec) -> Result<Self, TopologyError> {
        if name.len() > MAX_NAME {
            return Err(error(
                "metadata.name",
                format!("at most {MAX_NAME} characters: it is a label value of its links"),
            ));
        }
        if spec.regions.is_empty() || spec.regions.len() > MAX_REGIONS {
            return Err(error("spec.regions", format!("1 to {MAX_REGIONS} regions")));
        }
        let mut index = BTreeMap::new();
        for (k, r) in spec.regions.iter().enumerate() {
            let field = format!("spec.regions[{k}]");
            if !is_dns_label(&r.name) {
                return Err(error(
                    format!("{field}.name"),
                    "a DNS label: lowercase letters, digits and '-', at most 63",
                ));
            }
            if index.insert(r.name.as_str(), k).is_some() {
                return Err(error(format!("{field}.name"), format!("region {} is listed twice", r.name)));
            }
            if spec.region_label.is_some() == r.pod_selector.is_some() {
                return Err(error(
                    format!("{field}.podSelector"),
                    "say where a region's pods are in one way: regionLabel or a podSelector on every region",
                ));
            }
            if let Some(dr) = &r.dataset_region {
                let Some(ds) = spec.dataset else {
                    return Err(error(format!("{field}.datasetRegion"), "names a dataset's region: set dataset"));
                };
                if !dataset::table(ds).regions().contains(&dr.0) {
                    return Err(error(
                        format!("{field}.datasetRegion"),
                        format!("{:?} is not in the {ds:?} dataset", dr.0),
                    ));
                }
            }
        }
        let region = |field: String, name: &str| -> Result<usize, TopologyError> {
            index.get(name).copied().ok_or_else(|| error(field, format!("{name:?} is not a region of spec.regions")))
        };
        let hubs = match &spec.routing {
            None => vec![],
            Some(r) => r
                .hubs
                .iter()
                .enumerate()
                .map(|(k, h)| region(format!("spec.routing.hubs[{k}]"), h))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let mut links = BTreeMap::new();
        for (k, l) in spec.links.iter().enumerate() {
            let field = format!("spec.links[{k}]");
            let from = region(format!("{field}.from"), &l.from)?;
            let to = region(format!("{field}.to"), &l.to)?;
            if links.insert((from, to), k).is_some() {
                return Err(error(field, format!("{} → {} is listed twice", l.from, l.to)));
            }
            if from != to && !hubs.is_empty() && !hubs.contains(&from) && !hubs.contains(&to) {
                return Err(error(
                    field,
                    format!(
                        "{} and {} are spokes: with routing.hubs their traffic goes through a hub, so set the legs to and from the hubs",
                        l.from, l.to
                    ),
                ));
            }
            if l.round_trip.is_none() && l.impairment.is_none() {
                return Err(error(field, "set roundTrip, impairment, or both"));
            }
            if l.round_trip.is_some() && l.impairment.as_ref().is_some_and(|i| i.latency.is_some()) {
                return Err(error(
                    format!("{field}.roundTrip"),
                    "sets the latency of both directions: leave impairment.latency out",
                ));
            }
        }
        let regions = spec.regions.iter().map(|r| r.name.clone()).collect();
        Ok(Layout { spec, regions, links, hubs })
    }

    fn selector(&self, i: usize) -> LabelSelector {
        match (&self.spec.region_label, &self.spec.regions[i].pod_selector) {
            (_, Some(sel)) => sel.clone(),
            (Some(key), None) => LabelSelector {
                match_labels: Some(BTreeMap::from([(key.clone(), self.regions[i].clone())])),
                match_expressions: None,
            },
            (None, None) => unreachable!("checked: every region has a podSelector without regionLabel"),
        }
    }

    /// The impairment of `i → j` along its route, and the field of the spec that decides its last layer.
    fn path(&self, i: usize, j: usize) -> Result<(ImpairmentSpec, String), TopologyError> {
        let direct = i == j || self.hubs.is_empty() || self.hubs.contains(&i) || self.hubs.contains(&j);
        if direct {
            return self.leg(i, j);
        }
        let mut best: Option<(Duration, ImpairmentSpec)> = None;
        for &h in &self.hubs {
            let (out, _) = self.leg(i, h)?;
            let (back, _) = self.leg(h, j)?;
            let (a, b, hub) = (&self.regions[i], &self.regions[j], &self.regions[h]);
            let composed = compose(&out, &back).map_err(|field| {
                error(
                    "spec.routing.hubs",
                    format!("{a} → {b} goes through {hub}, and a leg sets {field}, which does not add up over two legs (latency, jitter, loss.percent and bandwidth do)"),
                )
            })?;
            let total = composed.latency.as_ref().and_then(|l| l.parse().ok()).unwrap_or_default();
            if best.as_ref().is_none_or(|(d, _)| total < *d) {
                best = Some((total, composed));
            }
        }
        let (_, composed) = best.expect("a spoke pair has hubs");
        Ok((composed, "spec.routing.hubs".into()))
    }

    /// The direct impairment of `i → j`, layer over layer.
    fn leg(&self, i: usize, j: usize) -> Result<(ImpairmentSpec, String), TopologyError> {
        let (mut imp, mut origin) = if i == j {
            (self.spec.intra_region.clone().unwrap_or_default(), "spec.intraRegion".to_owned())
        } else {
            (self.spec.default.clone().unwrap_or_default(), "spec.default".to_owned())
        };
        if i != j
            && let Some(ds) = self.spec.dataset
            && let (Some(a), Some(b)) = (&self.spec.regions[i].dataset_region, &self.spec.regions[j].dataset_region)
        {
            let rtt = dataset::table(ds).round_trip(&a.0, &b.0).ok_or_else(|| {
                error(
                    format!("spec.regions[{i}].datasetRegion"),
                    format!("the {ds:?} dataset has no {} → {}", a.0, b.0),
                )
            })?;
            imp.latency = Some(exact_duration(rtt / 2));
            origin = format!("spec.regions[{i}].datasetRegion");
        }
        if i != j
            && !self.links.contains_key(&(i, j))
            && let Some(&k) = self.links.get(&(j, i))
            && let Some(rtt) = &self.spec.links[k].round_trip
        {
            imp.latency = Some(half(rtt, &format!("spec.links[{k}].roundTrip"))?);
            origin = format!("spec.links[{k}]");
        }
        if let Some(&k) = self.links.get(&(i, j)) {
            let link = &self.spec.links[k];
            if let Some(over) = &link.impairment {
                overlay(&mut imp, over);
            }
            if let Some(rtt) = &link.round_trip {
                imp.latency = Some(half(rtt, &format!("spec.links[{k}].roundTrip"))?);
            }
            origin = format!("spec.links[{k}].impairment");
        }
        Ok((imp, origin))
    }
}

fn half(
    rtt: &crate::api::quantity::DurationValue,
    field: &str,
) -> Result<crate::api::quantity::DurationValue, TopologyError> {
    let d = rtt.parse().map_err(|e| error(field, e.to_string()))?;
    Ok(exact_duration(d / 2))
}

/// Every field `over` sets replaces the one in `base`.
fn overlay(base: &mut ImpairmentSpec, over: &ImpairmentSpec) {
    let ImpairmentSpec {
        latency,
        jitter,
        jitter_correlation,
        loss,
        duplicate,
        corrupt,
        reorder,
        bandwidth,
        burst,
        queue_limit,
    } = over.clone();
    macro_rules! take {
        ($($f:ident),*) => { $( if $f.is_some() { base.$f = $f; } )* };
    }
    take!(latency, jitter, jitter_correlation, loss, duplicate, corrupt, reorder, bandwidth, burst, queue_limit);
}

fn is_dns_label(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes().all(|c| ok(c) || c == b'-')
        && ok(s.as_bytes()[0])
        && ok(s.as_bytes()[s.len() - 1])
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;
