//! The `NetworkTopology` custom resource (`isthmus.dev/v1alpha1`): regions of pods and the network between
//! them, realised as NetworkLinks it owns. Doc comments here become `kubectl explain`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::dataset::DatasetRegion;
use super::status::NetworkTopologyStatus;
use crate::api::ImpairmentSpec;
use crate::api::quantity::DurationValue;

/// The most regions one topology may have: 32 regions are 1,024 NetworkLinks (every ordered pair and each
/// region with itself).
pub const MAX_REGIONS: usize = 32;
/// Links between regions are ordered pairs of regions, each at most once.
pub const MAX_LINKS: usize = MAX_REGIONS * MAX_REGIONS;
/// Topology and region names become NetworkLink names (`<topology>.<from>.<to>`) and label values.
pub const MAX_NAME: usize = 63;

/// A world of regions in one object: which pods are in which region, and the network between every ordered
/// pair of regions (latency, jitter, loss, bandwidth, … or a round trip split into halves), typed here, taken
/// from a built-in dataset of real inter-region round trips, or routed through hubs. The operator realises it
/// as one NetworkLink per ordered region pair and one per region (traffic within it), owned by the topology:
/// `kubectl get nl -l isthmus.dev/topology=<name>` lists them, each with its own status.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[allow(clippy::duplicated_attributes, reason = "each printcolumn names its own type_")]
#[kube(
    group = "isthmus.dev",
    version = "v1alpha1",
    kind = "NetworkTopology",
    plural = "networktopologies",
    singular = "networktopology",
    namespaced,
    shortname = "ntopo",
    category = "isthmus",
    status = "NetworkTopologyStatus",
    derive = "PartialEq",
    printcolumn(name = "Regions", type_ = "string", json_path = ".status.summary"),
    printcolumn(name = "Links", type_ = "integer", json_path = ".status.links"),
    printcolumn(name = "Applied", type_ = "integer", json_path = ".status.pairsApplied"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.pairsFailed"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("has(self.regionLabel) ? !self.regions.exists(r, has(r.podSelector)) : self.regions.all(r, has(r.podSelector))")
    .message("say where the pods of a region are in one way: either regionLabel (a pod label whose value names its region) or a podSelector on every region")
    .field_path(".regionLabel"))]
#[x_kube(validation = Rule::new("!has(self.links) || self.links.all(l, self.regions.exists(r, r.name == l.from) && self.regions.exists(r, r.name == l.to))")
    .message("every link's from and to must name a region listed in regions")
    .field_path(".links"))]
#[x_kube(validation = Rule::new("!has(self.routing) || !has(self.routing.hubs) || self.routing.hubs.all(h, self.regions.exists(r, r.name == h))")
    .message("every hub must name a region listed in regions")
    .field_path(".routing.hubs"))]
#[x_kube(validation = Rule::new("!has(self.dataset) || self.regions.exists(r, has(r.datasetRegion))")
    .message("a dataset needs regions that name their datasetRegion")
    .field_path(".dataset"))]
#[x_kube(validation = Rule::new("has(self.dataset) || !self.regions.exists(r, has(r.datasetRegion))")
    .message("datasetRegion names a region of the dataset: set dataset too")
    .field_path(".dataset"))]
#[serde(rename_all = "camelCase")]
pub struct NetworkTopologySpec {
    /// A pod label whose value names the pod's region, e.g. `topology.kubernetes.io/region` or
    /// `isthmus.dev/region`: a pod labelled with a region's name is in that region. Relabelling a pod moves it.
    /// Exclusive with `regions[].podSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub region_label: Option<String>,
    /// The regions, each with a unique name (a DNS label). Pods are those of the topology's namespace.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub regions: Vec<RegionSpec>,
    /// A built-in dataset of real round trips between cloud regions: every pair of regions that both name
    /// their `datasetRegion` gets the dataset's round trip, split into halves (one per direction), unless a
    /// link overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<Dataset>,
    /// What every ordered pair of distinct regions gets where neither a link nor the dataset says otherwise;
    /// absent leaves such pairs unimpaired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<ImpairmentSpec>,
    /// What traffic between two pods of the same region gets (each region's own link); absent leaves it
    /// unimpaired. A link whose `from` and `to` are the same region overrides it for that region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_region: Option<ImpairmentSpec>,
    /// The network between ordered pairs of regions, each pair at most once. A field set here overrides the
    /// same field of the dataset or `default`; fields left out keep theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["from", "to"]))]
    pub links: Vec<RegionLinkSpec>,
    /// How traffic between regions travels: directly (the default, a full mesh), or through hubs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingSpec>,
    /// The priority of every NetworkLink this topology makes (see NetworkLink `spec.priority`). The default,
    /// -1000, is below a hand-written link's default of 0, so one hand-written link can override single pairs.
    #[serde(default = "default_priority")]
    #[schemars(range(min = -2147483648, max = 2147483647))]
    pub priority: i32,
    /// Whether the topology's links probe themselves (NetworkLink `spec.verify`; default `true`): the matrix
    /// in the status then shows measured round trips next to the configured ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<bool>,
}

pub const DEFAULT_PRIORITY: i32 = -1000;

fn default_priority() -> i32 {
    DEFAULT_PRIORITY
}

/// One region.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RegionSpec {
    /// The region's name: with `regionLabel`, the label value its pods carry. A DNS label (lowercase letters,
    /// digits and `-`), at most 63 characters.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The region's pods, in the topology's namespace (instead of `regionLabel`). A pod two regions select
    /// takes the links of both; the status counts it in both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::selector::optional_schema")]
    pub pod_selector: Option<LabelSelector>,
    /// The dataset's region this one stands for, e.g. `westeurope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_region: Option<DatasetRegion>,
}

/// The network from one region to another (or, with `from` = `to`, within one region).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(self.roundTrip) || !has(self.impairment) || !has(self.impairment.latency)")
    .message("roundTrip sets the latency of both directions to half of it; leave impairment.latency out")
    .field_path(".roundTrip"))]
#[x_kube(validation = Rule::new("has(self.roundTrip) || has(self.impairment)")
    .message("set roundTrip, impairment, or both"))]
#[serde(rename_all = "camelCase")]
pub struct RegionLinkSpec {
    /// The sending region.
    #[schemars(length(min = 1, max = 63))]
    pub from: String,
    /// The receiving region.
    #[schemars(length(min = 1, max = 63))]
    pub to: String,
    /// The round trip between the two regions, split into halves: `from → to` and `to → from` each get half as
    /// latency (the reverse pair only where it has no link of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip: Option<DurationValue>,
    /// What happens to packets from `from` to `to` (one way), as in a NetworkLink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impairment: Option<ImpairmentSpec>,
}

/// A built-in dataset of round trips between cloud regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Dataset {
    /// Microsoft's published Azure inter-region round-trip medians (docs/topology.md#datasets has the source,
    /// date and licence).
    Azure,
}

/// How traffic between regions travels.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSpec {
    /// Hub regions: traffic between two regions that are not hubs goes through the hub that gives it the
    /// shortest latency, so it pays both legs (latencies and jitters add, losses compound, the smaller
    /// bandwidth wins). Links may then only join a hub with another region. Absent or empty: a full mesh.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 63)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub hubs: Vec<String>,
}
