//! How a pod's destinations travel: grouped by (link, impairment), each group's impairment and link written
//! once, then its destinations.
//!
//! Why: written one by one, every destination repeats its link's namespace and name and the whole impairment,
//! some 800 bytes at their longest; 110 pods × 512 destinations would then be two thirds of the agent's body
//! limit, 1,024 beyond it. Grouped, a destination costs its address (docs/networklink.md#plan-limits). In memory the plan keeps
//! one [`DestinationPlan`] per destination, sorted by destination, as before.

use std::collections::HashMap;
use std::sync::Arc;

use ipnet::IpNet;
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{DestinationPlan, Impairment, LinkRef};

/// Destinations that share a link (and direction) and an impairment.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupRef<'a> {
    link: &'a LinkRef,
    impairment: &'a Impairment,
    destinations: Vec<&'a IpNet>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Group {
    link: LinkRef,
    impairment: Impairment,
    destinations: Vec<IpNet>,
}

/// Writes the destinations as groups, in the order each group first appears; destinations keep their order
/// within a group.
pub(crate) fn serialize<S: Serializer>(destinations: &[DestinationPlan], serializer: S) -> Result<S::Ok, S::Error> {
    let mut index: HashMap<(&LinkRef, &Impairment), usize> = HashMap::new();
    let mut groups: Vec<GroupRef<'_>> = Vec::new();
    for d in destinations {
        let i = *index.entry((&*d.link, &*d.impairment)).or_insert_with(|| {
            groups.push(GroupRef { link: &d.link, impairment: &d.impairment, destinations: Vec::new() });
            groups.len() - 1
        });
        groups[i].destinations.push(&d.destination);
    }
    let mut seq = serializer.serialize_seq(Some(groups.len()))?;
    for g in &groups {
        seq.serialize_element(g)?;
    }
    seq.end()
}

/// Reads groups back into one [`DestinationPlan`] per destination, sorted by destination (stable: a destination
/// listed twice stays twice, for the plan's checks to refuse).
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<DestinationPlan>, D::Error> {
    let groups = Vec::<Group>::deserialize(deserializer)?;
    let mut out: Vec<DestinationPlan> = Vec::with_capacity(groups.iter().map(|g| g.destinations.len()).sum());
    for g in groups {
        let (impairment, link) = (Arc::new(g.impairment), Arc::new(g.link));
        for destination in g.destinations {
            out.push(DestinationPlan { destination, impairment: impairment.clone(), link: link.clone() });
        }
    }
    out.sort_by_key(|d| d.destination);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use crate::{Direction, ImpairmentFields, PodPlan};

    use super::*;

    fn pod(destinations: Vec<DestinationPlan>) -> PodPlan {
        PodPlan {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "p".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            interface: "eth0".into(),
            host_network: false,
            destinations,
        }
    }

    fn link(name: &str, direction: Direction) -> LinkRef {
        LinkRef { namespace: "ns".into(), name: name.into(), direction }
    }

    fn latency_ms(ms: u64) -> Impairment {
        let fields = ImpairmentFields { latency: Some(std::time::Duration::from_millis(ms)), ..Default::default() };
        Impairment::try_from(fields).unwrap()
    }

    /// The wire form, byte for byte: one group per (link, impairment), each written once.
    #[test]
    fn golden() {
        let d = |ip: &str, ms: u64, name: &str| DestinationPlan {
            destination: ip.parse().unwrap(),
            impairment: latency_ms(ms).into(),
            link: link(name, Direction::Forward).into(),
        };
        let p = pod(vec![d("10.0.0.2/32", 5, "a"), d("10.0.0.3/32", 7, "b"), d("10.0.0.4/32", 5, "a")]);
        let value = serde_json::to_value(&p).unwrap();
        let group = |name: &str, ms: u64, ips: &[&str]| {
            json!({"link": {"namespace": "ns", "name": name, "direction": "forward"},
                   "impairment": serde_json::to_value(latency_ms(ms)).unwrap(), "destinations": ips})
        };
        assert_eq!(
            value["groups"],
            json!([group("a", 5, &["10.0.0.2/32", "10.0.0.4/32"]), group("b", 7, &["10.0.0.3/32"])])
        );
        assert!(value.get("destinations").is_none());
        assert_eq!(serde_json::from_value::<PodPlan>(value).unwrap(), p);
    }

    #[test]
    fn groups_are_refused_with_the_field() {
        let base = json!({"uid": "u", "namespace": "ns", "name": "p", "ips": ["10.0.0.1"]});
        let with = |groups: serde_json::Value| {
            let mut v = base.clone();
            v["groups"] = groups;
            serde_json::from_value::<PodPlan>(v).unwrap_err().to_string()
        };
        let link = json!({"namespace": "ns", "name": "a", "direction": "forward"});
        let text = with(json!([{"link": link, "impairment": {}, "destinations": ["not an ip"]}]));
        assert!(text.contains("invalid IP"), "{text}");
        let text = with(json!([{"link": link, "impairment": {}, "destinations": [], "extra": 1}]));
        assert!(text.contains("unknown field `extra`"), "{text}");
        let text = serde_json::from_value::<PodPlan>(base).unwrap_err().to_string();
        assert!(text.contains("missing field `groups`"), "{text}");
    }

    fn destination() -> impl Strategy<Value = DestinationPlan> {
        (any::<[u8; 4]>(), 0u64..3, 0usize..3, any::<bool>()).prop_map(|(ip, ms, name, reverse)| DestinationPlan {
            destination: IpNet::from(std::net::IpAddr::from(ip)),
            impairment: latency_ms(ms).into(),
            link: link(["a", "b", "c"][name], if reverse { Direction::Reverse } else { Direction::Forward }).into(),
        })
    }

    proptest! {
        /// Any sorted list of destinations reads back as it was written.
        #[test]
        fn round_trip(mut destinations in prop::collection::vec(destination(), 0..64)) {
            destinations.sort_by_key(|d| d.destination);
            let p = pod(destinations);
            let json = serde_json::to_string(&p).unwrap();
            prop_assert_eq!(serde_json::from_str::<PodPlan>(&json).unwrap(), p);
        }
    }
}
