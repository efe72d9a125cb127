//! `kubectl isthmus explain`: the text. Everything here is pure — the operator's [`PairExplanation`], the
//! links' objects, and what the agent found in the pod's namespace — so each section has a golden test.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use isthmus_agent_api::Direction;
use isthmus_agent_api::explain::{ExplainReport, InstalledPath, KernelObject};
use isthmus_operator::api::NetworkLink;
use isthmus_operator::api::measured::DirectionMeasured;
use isthmus_operator::index::{ObjectKey, Rank};
use isthmus_operator::plan::{Claim, Defeat, PairExplanation};
use k8s_openapi::jiff::Timestamp;

use crate::impairment::describe;
use crate::table::Table;
use crate::target::Destination;

/// What the agent on the pod's node said, or why it could not be asked.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    /// The agent pod that was asked.
    pub pod: ObjectKey,
    /// The agent's `ISTHMUS_DATAPATH` setting (`auto`, `tc`, `userspace`), as its pod spec says.
    pub setting: Option<String>,
    pub report: Result<ExplainReport, String>,
}

/// Everything one answer is made of.
pub struct Answer<'a> {
    pub source: &'a ObjectKey,
    pub source_ips: &'a [IpAddr],
    pub destination: &'a Destination,
    pub explanation: &'a PairExplanation,
    /// The links of the source's namespace, for their age and status.
    pub links: &'a BTreeMap<ObjectKey, NetworkLink>,
    pub now: Timestamp,
    pub agent: Result<AgentView, String>,
}

pub fn render(a: &Answer<'_>) -> String {
    let e = a.explanation;
    let decisive = e.decisive();
    let winner = &decisive.winner;
    let mut out = String::new();
    let ips: Vec<String> = a.source_ips.iter().map(ToString::to_string).collect();
    let owner = a.destination.owner.as_ref().map(|o| format!(" ({o})")).unwrap_or_default();
    let _ = writeln!(out, "Pair:        {} ({}) → {}{owner}", a.source, ips.join(", "), a.destination.ip);
    let _ = writeln!(
        out,
        "Decided by:  NetworkLink {} ({}), entry {}",
        winner.link,
        direction(winner.direction),
        decisive.destination
    );
    let _ = writeln!(out, "Impairment:  {}", describe(&winner.impairment));
    let _ = writeln!(out, "Node:        {}", e.node);

    let _ = writeln!(
        out,
        "\nContest for {} (priority, then the older, then the name; forward before reverse):",
        decisive.destination
    );
    let mut table = Table::new(["LINK", "DIRECTION", "PRIORITY", "AGE", "RESULT"]);
    table.push(contestant(winner, a.now, "won".into()));
    for (claim, defeat) in &decisive.losers {
        table.push(contestant(claim, a.now, format!("lost: {}", why(defeat, &winner.rank, a.now))));
    }
    indent(&mut out, &table.render());
    for shadowed in &e.entries[1..] {
        let _ = writeln!(
            out,
            "  Shadowed: entry {} (won by {}) — the longer prefix {} matches first",
            shadowed.destination, shadowed.winner.link.name, decisive.destination
        );
    }
    for (link, refusal) in &e.refused {
        let _ = writeln!(out, "  Left out for this pod: {} — {}", link.name, refusal.message());
    }

    let status = a.links.get(&winner.link).and_then(|l| l.status.as_ref());
    let _ = writeln!(out, "\nDatapath:");
    let _ = writeln!(out, "{}", datapath(&a.agent, status.map(|s| (s.pairs_emulated, s.pairs_applied))));
    if let Ok(AgentView { report: Ok(report), .. }) = &a.agent {
        kernel(&mut out, report);
    }

    let _ = writeln!(out, "\nMeasured ({}):", winner.link.name);
    out.push_str(&measured(status));
    out
}

fn direction(d: Direction) -> &'static str {
    match d {
        Direction::Forward => "forward",
        Direction::Reverse => "reverse",
    }
}

fn contestant(c: &Claim, now: Timestamp, result: String) -> Vec<String> {
    let age = c.rank.created.as_ref().map_or_else(|| "-".into(), |t| age(now, t.0));
    vec![c.link.name.clone(), direction(c.direction).into(), c.rank.priority.to_string(), age, result]
}

fn why(defeat: &Defeat, winner: &Rank, now: Timestamp) -> String {
    match defeat {
        Defeat::Priority { winner, loser } => format!("priority {loser} < {winner}"),
        Defeat::Younger => format!(
            "same priority, younger than {} ({})",
            winner.name,
            winner.created.as_ref().map_or_else(|| "-".into(), |t| age(now, t.0))
        ),
        Defeat::Name => format!("same priority and age, {} sorts first by name", winner.name),
        Defeat::Direction => "the same link's reverse direction; forward wins".into(),
    }
}

/// `kubectl`'s ages: `45s`, `12m`, `5h`, `3d`.
pub fn age(now: Timestamp, then: Timestamp) -> String {
    let s = now.as_second().saturating_sub(then.as_second()).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn datapath(agent: &Result<AgentView, String>, emulated: Option<(u32, u32)>) -> String {
    let link = match emulated {
        Some((emulated, applied)) => {
            format!("  The link's status: {emulated} of {applied} applied pairs emulated in userspace, the rest in tc.")
        }
        None => "  The link has no status yet.".into(),
    };
    let agent = match agent {
        Err(why) => format!("  Not asked: {why}"),
        Ok(view) => {
            let setting = view.setting.as_deref().unwrap_or("auto");
            let found = match &view.report {
                Err(why) => format!("could not read the pod's namespace: {why}"),
                Ok(r) => match &r.path {
                    InstalledPath::Tc { .. } => format!("tc: an isthmus tree on {} in {}", r.interface, r.netns),
                    InstalledPath::TcDefault { .. } => format!(
                        "tc: an isthmus tree on {} in {}, but no entry for this address (default class, unimpaired)",
                        r.interface, r.netns
                    ),
                    InstalledPath::Userspace { capture_interface } => format!(
                        "userspace: the capture interface {capture_interface} is in {}; the agent's emulator shapes \
                         this pod (its counters are the agent's /metrics)",
                        r.netns
                    ),
                    InstalledPath::Foreign { root_kind } => format!(
                        "none: a foreign root qdisc ({root_kind}) is on {} in {}; isthmus never replaces it",
                        r.interface, r.netns
                    ),
                    InstalledPath::None => {
                        format!("none: nothing of isthmus's is in {} (not applied yet, or removed)", r.netns)
                    }
                },
            };
            format!("  Agent {} (datapath setting {setting}): {found}", view.pod)
        }
    };
    format!("{agent}\n{link}")
}

fn kernel(out: &mut String, report: &ExplainReport) {
    let objects: &[KernelObject] = match &report.path {
        InstalledPath::Tc { objects, .. } | InstalledPath::TcDefault { objects } => objects,
        _ => return,
    };
    if let InstalledPath::Tc { destination, impairment, .. } = &report.path {
        let read_back = impairment.as_deref().map_or_else(|| "not a valid impairment".into(), describe);
        let _ = writeln!(out, "\nKernel objects for {destination} (read back: {read_back}):");
    } else {
        let _ = writeln!(out, "\nKernel objects (the default path):");
    }
    let mut table = Table::new(["KIND", "HANDLE", "PARENT", "PARAMETERS", "SENT", "DROPPED", "OVERLIMITS"]);
    for o in objects {
        let (sent, dropped, over) = match &o.counters {
            Some(c) => (format!("{} pkt / {} B", c.packets, c.bytes), c.drops.to_string(), c.overlimits.to_string()),
            None => ("-".into(), "-".into(), "-".into()),
        };
        table.push(vec![o.kind.clone(), o.handle.clone(), o.parent.clone(), o.detail.clone(), sent, dropped, over]);
    }
    indent(out, &table.render());
}

fn measured(status: Option<&isthmus_operator::api::NetworkLinkStatus>) -> String {
    let Some(status) = status else { return "  nothing yet (the link has no status)\n".into() };
    let mut out = String::new();
    let sides = status.measured.as_ref().map(|m| [("forward", m.forward.as_ref()), ("reverse", m.reverse.as_ref())]);
    let mut any = false;
    for (name, side) in sides.into_iter().flatten() {
        if let Some(d) = side {
            any = true;
            let _ = writeln!(out, "  {name}: {}", one_direction(d));
        }
    }
    if !any {
        out.push_str("  nothing measured yet\n");
    }
    match status.conditions.iter().find(|c| c.type_ == "Conformant") {
        Some(c) => {
            let _ = writeln!(out, "  Conformant: {} ({}) {}", c.status, c.reason, c.message);
        }
        None => out.push_str("  Conformant: not judged yet\n"),
    }
    out
}

fn one_direction(d: &DirectionMeasured) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut s = format!("RTT p50 {} p90 {}, loss {}", opt(&d.rtt_p50), opt(&d.rtt_p90), opt(&d.loss));
    if let Some(i) = &d.loss_interval {
        s.push_str(&format!(" ({i})"));
    }
    if let Some(e) = &d.expected_rtt {
        s.push_str(&format!(", expected {e}"));
    }
    s.push_str(&format!(", {} samples over {} pairs", d.samples, d.pairs));
    if let Some(w) = &d.window {
        s.push_str(&format!(" in {w}"));
    }
    if let Some(p) = d.probe {
        s.push_str(&format!(", probe {p:?}"));
    }
    s
}

fn indent(out: &mut String, text: &str) {
    for line in text.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::Counters;
    use isthmus_operator::api::measured::MeasuredStatus;
    use isthmus_operator::api::{NetworkLinkSpec, NetworkLinkStatus};
    use isthmus_operator::index::{PodInfo, PodPhase};
    use isthmus_operator::plan::Planner;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn link(name: &str, age_s: i64, spec: serde_json::Value) -> NetworkLink {
        let spec: NetworkLinkSpec = serde_json::from_value(spec).unwrap();
        let mut l = NetworkLink::new(name, spec);
        l.metadata.namespace = Some("shop".into());
        l.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW - age_s).unwrap()));
        l
    }

    fn pod(app: &str, node: &str, ip: &str) -> PodInfo {
        PodInfo {
            uid: format!("uid-{app}"),
            labels: [("app".to_string(), app.to_string())].into(),
            node: Some(node.into()),
            ips: vec![ip.parse().unwrap()],
            phase: PodPhase::Running,
            terminating: false,
            host_network: false,
        }
    }

    /// Three links on client → server: a priority-5 one wins, an older priority-0 one loses on priority, and
    /// a CIDR link's /24 is shadowed by the host entry.
    fn fixture() -> (Planner, BTreeMap<ObjectKey, NetworkLink>) {
        let to_server = |extra: serde_json::Value| {
            let mut v = serde_json::json!({
                "from": {"podSelector": {"matchLabels": {"app": "client"}}},
                "to": {"podSelector": {"matchLabels": {"app": "server"}}},
            });
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        let mut winner = link(
            "slow-api",
            300,
            to_server(serde_json::json!({"priority": 5, "impairment": {"latency": "40ms", "bandwidth": "10Mbit"}})),
        );
        winner.status = Some(NetworkLinkStatus {
            pairs: 1,
            pairs_applied: 1,
            measured: Some(MeasuredStatus {
                forward: Some(DirectionMeasured {
                    rtt_p50: Some("40.3ms".into()),
                    rtt_p90: Some("41.0ms".into()),
                    expected_rtt: Some("40.1ms".into()),
                    loss: Some("0%".into()),
                    loss_interval: Some("0%–0.9%".into()),
                    samples: 600,
                    pairs: 1,
                    window: Some("30s".into()),
                    ..Default::default()
                }),
                reverse: None,
            }),
            conditions: vec![Condition {
                type_: "Conformant".into(),
                status: "True".into(),
                reason: "Conformant".into(),
                message: "RTT and loss within tolerance".into(),
                observed_generation: None,
                last_transition_time: Time(Timestamp::from_second(NOW).unwrap()),
            }],
            ..Default::default()
        });
        let loser = link("baseline", 7200 * 3, to_server(serde_json::json!({"impairment": {"latency": "5ms"}})));
        let subnet = link(
            "subnet",
            90,
            serde_json::json!({
                "from": {"podSelector": {"matchLabels": {"app": "client"}}},
                "to": {"cidrs": ["10.0.0.0/24"]},
                "priority": 9,
                "impairment": {"loss": {"percent": "1%"}},
            }),
        );
        let mut planner = Planner::new();
        planner.upsert_pod(ObjectKey::new("shop", "client"), pod("client", "n1", "10.0.0.1"));
        planner.upsert_pod(ObjectKey::new("shop", "server"), pod("server", "n2", "10.0.0.9"));
        let mut links = BTreeMap::new();
        for l in [winner, loser, subnet] {
            planner.apply_link(&l);
            links.insert(ObjectKey::new("shop", l.metadata.name.clone().unwrap()), l);
        }
        planner.recompute();
        (planner, links)
    }

    fn report() -> ExplainReport {
        let object = |kind: &str, handle: &str, parent: &str, detail: &str, counters: Option<Counters>| KernelObject {
            kind: kind.into(),
            handle: handle.into(),
            parent: parent.into(),
            detail: detail.into(),
            counters,
        };
        let sent = Counters { packets: 120, bytes: 98_000, drops: 1, overlimits: 3, ..Default::default() };
        ExplainReport {
            netns: "net:[4026532512]".into(),
            interface: "eth0".into(),
            path: InstalledPath::Tc {
                destination: "10.0.0.9/32".parse().unwrap(),
                impairment: None,
                objects: vec![
                    object("u32 filter", "pref 1 100:9:1", "1570:0", "flowid 1570:1000", None),
                    object("htb class", "1570:1000", "1570:0", "rate 1bit/s ceil 100Gbit/s", Some(sent)),
                    object("netem qdisc", "3000:0", "2000:1", "limit 1000 delay 40000us", Some(sent)),
                ],
            },
        }
    }

    fn answer(planner: &Planner, links: &BTreeMap<ObjectKey, NetworkLink>, agent: Result<AgentView, String>) -> String {
        let source = ObjectKey::new("shop", "client");
        let ips = ["10.0.0.1".parse().unwrap()];
        let dest = Destination { ip: "10.0.0.9".parse().unwrap(), owner: Some("pod shop/server".into()) };
        let explanation = planner.explain_pair(&source, dest.ip).unwrap();
        render(&Answer {
            source: &source,
            source_ips: &ips,
            destination: &dest,
            explanation: &explanation,
            links,
            now: Timestamp::from_second(NOW).unwrap(),
            agent,
        })
    }

    #[test]
    fn golden_answer_with_the_agents_tree() {
        let (planner, links) = fixture();
        let agent = AgentView {
            pod: ObjectKey::new("isthmus-system", "isthmus-agent-abcde"),
            setting: Some("auto".into()),
            report: Ok(report()),
        };
        let expected = "\
Pair:        shop/client (10.0.0.1) → 10.0.0.9 (pod shop/server)
Decided by:  NetworkLink shop/slow-api (forward), entry 10.0.0.9/32
Impairment:  delay 40ms, 10Mbit
Node:        n1

Contest for 10.0.0.9/32 (priority, then the older, then the name; forward before reverse):
  LINK       DIRECTION   PRIORITY   AGE   RESULT
  slow-api   forward     5          5m    won
  baseline   forward     0          6h    lost: priority 0 < 5
  Shadowed: entry 10.0.0.0/24 (won by subnet) — the longer prefix 10.0.0.9/32 matches first

Datapath:
  Agent isthmus-system/isthmus-agent-abcde (datapath setting auto): tc: an isthmus tree on eth0 in net:[4026532512]
  The link's status: 0 of 1 applied pairs emulated in userspace, the rest in tc.

Kernel objects for 10.0.0.9/32 (read back: not a valid impairment):
  KIND          HANDLE           PARENT   PARAMETERS                   SENT                DROPPED   OVERLIMITS
  u32 filter    pref 1 100:9:1   1570:0   flowid 1570:1000             -                   -         -
  htb class     1570:1000        1570:0   rate 1bit/s ceil 100Gbit/s   120 pkt / 98000 B   1         3
  netem qdisc   3000:0           2000:1   limit 1000 delay 40000us     120 pkt / 98000 B   1         3

Measured (slow-api):
  forward: RTT p50 40.3ms p90 41.0ms, loss 0% (0%–0.9%), expected 40.1ms, 600 samples over 1 pairs in 30s
  Conformant: True (Conformant) RTT and loss within tolerance
";
        assert_eq!(answer(&planner, &links, Ok(agent)), expected);
    }

    #[test]
    fn without_an_agent_the_answer_says_why_and_keeps_the_contest() {
        let (planner, mut links) = fixture();
        links.get_mut(&ObjectKey::new("shop", "slow-api")).unwrap().status = None;
        let out = answer(&planner, &links, Err("no agent pod runs on node n1".into()));
        assert!(out.contains("  Not asked: no agent pod runs on node n1\n  The link has no status yet.\n"), "{out}");
        assert!(!out.contains("Kernel objects"), "{out}");
        assert!(out.ends_with("Measured (slow-api):\n  nothing yet (the link has no status)\n"), "{out}");
    }

    #[test]
    fn losers_on_age_and_name_are_told_so() {
        let winner =
            Rank { priority: 0, created: Some(Time(Timestamp::from_second(NOW - 600).unwrap())), name: "a".into() };
        let now = Timestamp::from_second(NOW).unwrap();
        assert_eq!(why(&Defeat::Younger, &winner, now), "same priority, younger than a (10m)");
        assert_eq!(why(&Defeat::Name, &winner, now), "same priority and age, a sorts first by name");
        assert_eq!(age(now, Timestamp::from_second(NOW - 3 * 86400).unwrap()), "3d");
        assert_eq!(age(now, Timestamp::from_second(NOW - 59).unwrap()), "59s");
    }
}
