//! The plan's JSON, decoded pod by pod so that one malformed pod does not reject the whole plan, and compactly:
//! each destination keeps its address plus an impairment and a link shared with every other destination of the
//! plan that has the same one.

use std::collections::HashSet;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use isthmus_agent_api::{
    Impairment, ImpairmentFields, LinkId, LinkRef, LinkTimeline, NodePlan, PodError, PodErrorKind, PodOutcome, PodPlan,
    PodResult,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::timing::Timelines;

/// What the plan says must not be probed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProbeFilter {
    pub unverified: Vec<LinkId>,
    pub unprobed: Vec<IpNet>,
}

impl ProbeFilter {
    pub(crate) fn skips_link(&self, link: &LinkRef) -> bool {
        self.unverified.iter().any(|l| l.namespace == link.namespace && l.name == link.name)
    }

    pub(crate) fn skips_address(&self, ip: IpAddr) -> bool {
        self.unprobed.iter().any(|net| net.contains(&ip))
    }
}

/// A plan whose pods are parsed one by one, so that one malformed pod does not reject the whole plan.
#[derive(Debug)]
pub struct RawNodePlan {
    pub node: String,
    pub version: u64,
    pub pods: Vec<PlanPod>,
    /// What the prober must leave alone (`unverified` links, `unprobed` destinations).
    pub probe_filter: ProbeFilter,
    /// The links whose impairment changes with time.
    pub timelines: Timelines,
}

/// One entry of a plan's `pods`.
#[derive(Debug)]
pub enum PlanPod {
    /// `pod.destinations` is empty: they are in `destinations`, sorted by destination, each impairment and link
    /// shared with every other destination of the plan that has the same one.
    Valid { pod: PodPlan, destinations: Vec<Destination> },
    /// The entry is not a valid pod plan.
    Malformed(MalformedPod),
}

/// A plan entry that is not a valid pod plan: `message` says which field and why; the identity is what could be
/// read.
#[derive(Debug)]
pub struct MalformedPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub message: String,
}

impl MalformedPod {
    /// The agent's answer for the entry at `index` in the plan's `pods`: failed as `InvalidPlan`, the parser's
    /// reason after the entry's place (`pods[i]: `), under the identity that could be read.
    pub fn result(&self, index: usize) -> PodResult {
        PodResult {
            uid: self.uid.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            outcome: PodOutcome::Failed(PodError {
                kind: PodErrorKind::InvalidPlan,
                message: format!("pods[{index}]: {}", self.message),
            }),
            mutations: 0,
            queue_caps: Vec::new(),
            refused: Vec::new(),
        }
    }
}

/// One destination of a pod, compact: 10,000 of them are held for a node of 100 pods.
pub type Destination = (IpNet, Arc<Impairment>, Arc<LinkRef>);

/// The plan as it arrives, its pods still JSON text: slices of the request body, not copies.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    node: String,
    version: u64,
    #[serde(default, borrow)]
    pods: Vec<&'a RawValue>,
    #[serde(default)]
    unverified: Vec<LinkId>,
    #[serde(default)]
    unprobed: Vec<IpNet>,
    #[serde(default)]
    timelines: Vec<LinkTimeline>,
}

impl RawNodePlan {
    /// Parses a plan pod by pod, sharing equal impairments and links between all its pods.
    pub fn from_json(json: &[u8]) -> Result<Self, serde_json::Error> {
        let envelope: Envelope<'_> = serde_json::from_slice(json)?;
        let mut interner = Interner::default();
        let pods = envelope.pods.into_iter().map(|pod| PlanPod::parse(pod, &mut interner)).collect();
        let probe_filter = ProbeFilter { unverified: envelope.unverified, unprobed: envelope.unprobed };
        let timelines = Timelines::new(envelope.timelines);
        Ok(Self { node: envelope.node, version: envelope.version, pods, probe_filter, timelines })
    }
}

impl From<&NodePlan> for RawNodePlan {
    fn from(plan: &NodePlan) -> Self {
        let mut interner = Interner::default();
        Self {
            node: plan.node.clone(),
            version: plan.version,
            pods: plan.pods.iter().cloned().map(|pod| PlanPod::valid(pod, &mut interner)).collect(),
            probe_filter: ProbeFilter { unverified: plan.unverified.clone(), unprobed: plan.unprobed.clone() },
            timelines: Timelines::new(plan.timelines.clone()),
        }
    }
}

impl PlanPod {
    /// One pod's JSON as a value tree (kilobytes), then typed and made compact; the value tree of the whole
    /// plan (several times its JSON) and its typed destinations (280 bytes each) are never held at once.
    fn parse(json: &RawValue, interner: &mut Interner) -> Self {
        let value: serde_json::Value = match serde_json::from_str(json.get()) {
            Ok(value) => value,
            // Only a pod nested deeper than serde_json's recursion limit gets here: the plan itself parsed.
            Err(e) => {
                return PlanPod::Malformed(MalformedPod {
                    uid: "".into(),
                    namespace: "".into(),
                    name: "".into(),
                    message: e.to_string(),
                });
            }
        };
        match PodPlan::deserialize(&value) {
            Ok(pod) => PlanPod::valid(pod, interner),
            Err(e) => {
                let (uid, namespace, name) = identity_of(&value);
                let message = invalid_impairment(&value).unwrap_or_else(|| e.to_string());
                PlanPod::Malformed(MalformedPod { uid, namespace, name, message })
            }
        }
    }

    fn valid(mut pod: PodPlan, interner: &mut Interner) -> Self {
        let mut destinations: Vec<Destination> = std::mem::take(&mut pod.destinations)
            .into_iter()
            .map(|d| (d.destination, interner.impairment(d.impairment), interner.link(d.link)))
            .collect();
        destinations.sort_by_key(|d| d.0);
        PlanPod::Valid { pod, destinations }
    }
}

/// The links and impairments of one plan, each kept once: 10,000 destinations asked for by 100 links hold 100
/// `LinkRef`s and as many distinct impairments as the plan has.
#[derive(Default)]
struct Interner {
    links: HashSet<Arc<LinkRef>>,
    impairments: HashSet<Arc<Impairment>>,
}

impl Interner {
    fn link(&mut self, link: Arc<LinkRef>) -> Arc<LinkRef> {
        intern(&mut self.links, link)
    }

    fn impairment(&mut self, impairment: Arc<Impairment>) -> Arc<Impairment> {
        intern(&mut self.impairments, impairment)
    }
}

/// The one shared allocation of `value` in `set`: the first one seen. (Each pod's entry arrives with its own.)
fn intern<T: Eq + Hash>(set: &mut HashSet<Arc<T>>, value: Arc<T>) -> Arc<T> {
    if let Some(existing) = set.get(&*value) {
        return existing.clone();
    }
    set.insert(value.clone());
    value
}

/// The pod's identity from a pod entry that did not parse, as far as it can be read.
fn identity_of(value: &serde_json::Value) -> (String, String, String) {
    let field = |name: &str| value.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    (field("uid"), field("namespace"), field("name"))
}

/// The first group of a pod entry whose impairment's fields are not a valid impairment, named by its first
/// destination, and why: serde's message names the field inside the impairment but not the destination.
fn invalid_impairment(pod: &serde_json::Value) -> Option<String> {
    pod.get("groups")?.as_array()?.iter().find_map(|group| {
        let fields = ImpairmentFields::deserialize(group.get("impairment")?).ok()?;
        let error = Impairment::try_from(fields).err()?;
        let first = group.get("destinations")?.as_array()?.first()?;
        let destination = IpNet::deserialize(first).ok()?.trunc();
        Some(format!("destination {destination}: {error}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_parses_pod_by_pod_and_shares_equal_links_and_impairments() {
        let destination = |ip: &str, rate: u64, link: &str| {
            serde_json::json!({
                "destinations": [ip],
                "impairment": {"rateBps": rate},
                "link": {"namespace": "default", "name": link, "direction": "forward"},
            })
        };
        let pod = |uid: &str, destinations: Vec<serde_json::Value>| serde_json::json!({"uid": uid, "namespace": "default", "name": uid, "ips": ["10.0.0.1"], "groups": destinations});
        let json = serde_json::json!({
            "node": "n",
            "version": 7,
            "pods": [
                pod("a", vec![destination("10.0.0.3/32", 1000, "l1"), destination("10.0.0.2/32", 1000, "l1")]),
                {"uid": "bad", "namespace": "default", "name": "bad", "ips": "not a list"},
                pod("c", vec![destination("10.0.0.2/32", 2000, "l1")]),
                pod("zero", vec![destination("10.0.0.1/32", 0, "l1")]),
            ],
        });
        let plan = RawNodePlan::from_json(json.to_string().as_bytes()).unwrap();
        assert_eq!((plan.node.as_str(), plan.version, plan.pods.len()), ("n", 7, 4));
        let PlanPod::Valid { destinations: a, .. } = &plan.pods[0] else { panic!("{:?}", plan.pods[0]) };
        let PlanPod::Valid { destinations: c, .. } = &plan.pods[2] else { panic!("{:?}", plan.pods[2]) };
        assert_eq!(a.iter().map(|d| d.0.to_string()).collect::<Vec<_>>(), ["10.0.0.2/32", "10.0.0.3/32"], "sorted");
        assert!(Arc::ptr_eq(&a[0].2, &a[1].2) && Arc::ptr_eq(&a[0].2, &c[0].2), "one link, one allocation");
        assert!(Arc::ptr_eq(&a[0].1, &a[1].1), "equal impairments share one allocation");
        assert!(!Arc::ptr_eq(&a[0].1, &c[0].1), "different impairments do not");
        match &plan.pods[1] {
            PlanPod::Malformed(MalformedPod { uid, message, .. }) => {
                assert_eq!(uid, "bad");
                assert!(message.contains("sequence"), "{message}");
            }
            other => panic!("expected a malformed pod, got {other:?}"),
        }
        // Its answer: failed as an invalid plan, under its identity, the reason after its place.
        let PlanPod::Malformed(bad) = &plan.pods[1] else { panic!("{:?}", plan.pods[1]) };
        let answer = bad.result(1);
        assert_eq!((answer.uid.as_str(), answer.name.as_str(), answer.mutations), ("bad", "bad", 0));
        match &answer.outcome {
            PodOutcome::Failed(e) => assert!(
                e.kind == PodErrorKind::InvalidPlan
                    && e.message.starts_with("pods[1]: ")
                    && e.message.contains("sequence"),
                "{e:?}"
            ),
            other => panic!("{other:?}"),
        }
        // An invalid impairment is the pod's error, naming the destination and the field.
        match &plan.pods[3] {
            PlanPod::Malformed(MalformedPod { uid, message, .. }) => {
                assert_eq!(uid, "zero");
                assert!(message.contains("10.0.0.1/32") && message.contains("rate"), "{message}");
            }
            other => panic!("expected a malformed pod, got {other:?}"),
        }
    }

    mod decoding {
        //! The plan decoder against input it was not written for: arbitrary bytes, damaged plans and plans of
        //! the right shape with values of the wrong kind. It never panics; a plan that parses has every pod either
        //! valid (destinations sorted) or malformed with a message.

        use isthmus_agent_api::test_util;
        use proptest::prelude::*;

        use super::*;

        fn plan(pods: usize, destinations: usize) -> Vec<u8> {
            let pods = (0..pods)
                .map(|p| {
                    let dests = (0..destinations)
                        .map(|d| {
                            let ip = std::net::IpAddr::from([10, 1, p as u8, d as u8]);
                            let impairment = test_util::rate(1_000_000 * (1 + d as u64 % 3));
                            test_util::destination(ip, impairment, test_util::link(&format!("l{}", d % 2)))
                        })
                        .collect();
                    test_util::pod(&format!("u{p}"), &format!("p{p}"), &["10.0.0.1".parse().unwrap()], dests)
                })
                .collect();
            serde_json::to_vec(&NodePlan { node: "n".into(), version: 3, pods, ..Default::default() }).unwrap()
        }

        fn check(plan: &RawNodePlan) -> Result<(), TestCaseError> {
            for pod in &plan.pods {
                match pod {
                    PlanPod::Valid { destinations, .. } => {
                        prop_assert!(destinations.windows(2).all(|w| w[0].0 <= w[1].0), "sorted");
                    }
                    PlanPod::Malformed(bad) => prop_assert!(!bad.message.is_empty()),
                }
            }
            Ok(())
        }

        /// Any JSON value, nested a few levels, with the keys a plan uses among others.
        fn json() -> impl Strategy<Value = serde_json::Value> {
            let key = prop_oneof![
                Just("node"),
                Just("version"),
                Just("pods"),
                Just("uid"),
                Just("namespace"),
                Just("name"),
                Just("ips"),
                Just("groups"),
                Just("link"),
                Just("impairment"),
                Just("destinations"),
                Just("rateBps"),
                Just("latency"),
                Just("direction"),
                Just("x"),
            ];
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                any::<f64>().prop_map(serde_json::Value::from),
                "[a-z0-9./:]{0,12}".prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(5, 64, 6, move |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                    prop::collection::btree_map(key.clone(), inner, 0..6).prop_map(|m| {
                        serde_json::Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                    }),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2048))]

            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(plan) = RawNodePlan::from_json(&bytes) {
                    check(&plan)?;
                }
            }

            /// A valid plan with bytes overwritten, cut short or spliced.
            #[test]
            fn damaged_plans_never_panic(
                pods in 1usize..4,
                destinations in 1usize..5,
                edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                cut in any::<prop::sample::Index>(),
                truncate in any::<bool>(),
            ) {
                let mut bytes = plan(pods, destinations);
                for (at, byte) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                if truncate {
                    bytes.truncate(cut.index(bytes.len()));
                }
                if let Ok(plan) = RawNodePlan::from_json(&bytes) {
                    check(&plan)?;
                }
            }

            /// Plan-shaped JSON with values of any kind: pods that do not read are malformed, never a panic.
            #[test]
            fn plan_shaped_json_never_panics(pods in prop::collection::vec(json(), 0..4), version in any::<u64>()) {
                let value = serde_json::json!({"node": "n", "version": version, "pods": pods});
                let plan = RawNodePlan::from_json(value.to_string().as_bytes());
                let plan = plan.expect("the envelope is valid; only its pods may not be");
                prop_assert_eq!(plan.pods.len(), pods.len());
                check(&plan)?;
            }
        }

        #[test]
        fn an_undamaged_plan_reads_back_whole() {
            let plan = RawNodePlan::from_json(&plan(3, 4)).unwrap();
            assert_eq!(plan.pods.len(), 3);
            assert!(
                plan.pods.iter().all(|p| matches!(p, PlanPod::Valid { destinations, .. } if destinations.len() == 4))
            );
        }
    }
}
