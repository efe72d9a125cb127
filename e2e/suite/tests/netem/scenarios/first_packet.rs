//! Impaired from the first packet: a pod is planned as soon as its sandbox has an IP, so what it sends while still
//! `Pending` — its init containers' traffic — crosses its links; a pod that opts into the hold runs nothing of its
//! own before its links are applied (docs/networklink.md, "Impaired from the first packet").

use isthmus_e2e::verdict::{at_least, report};
use isthmus_e2e::*;

use crate::bands::delay_floor;
use crate::fixture::{Fixture, one_way_spec, wait_condition};
use crate::scenarios::lifecycle::{INTERVAL_MS, Prober, SUSTAINED, WITHIN_MS, pod_timeline, probing_deployment};

/// The init container's probes, 20 ms apart: ten seconds, over which its pod stays `Pending`.
const COUNT: u32 = 500;

/// A pod that did not opt into anything, whose init container probes from its first instruction: its probes are
/// impaired for good (the last two seconds of them without a break) while it runs, that is while the pod is
/// `Pending` — a pod planned only once `Running` would see none impaired. How long after the first probe the
/// impairment came (the IP's report by the kubelet, the plan, the apply) is printed, never gated: the first
/// container's first packets may precede the links, a race the hold closes. Lost probes decide nothing
/// (the link loses none; an emulated node starved of the host's CPU answers some after their timeout).
pub fn impaired_while_pending(f: &Fixture) {
    let link = f.link_unchecked("early", &one_way_spec("early", "server", "{latency: 40ms}"));
    // The link is in force before the pod exists, as a test that applies its links first has them.
    wait_condition(&f.ns, "early", "Ready", "True", "NoPairs");
    f.ns.apply(&probing_deployment("early", &f.n1, &f.server.ip, COUNT, Prober::Init));
    let (pod, ip, node) = f.ns.wait_ready_pod("early");
    let probes = init_probes(f, &pod, &ip, &node);
    let all = probes.samples();
    let lost: Vec<String> = all.iter().filter(|s| s.1.is_none()).map(|s| format!("+{:.0}", s.0)).collect();
    println!("probes lost, sent at (ms): {lost:?}");
    let answered: Vec<(f64, Option<f64>)> = all.iter().copied().filter(|s| s.1.is_some()).collect();
    let floor = delay_floor(40.0);
    let last_ms = all.last().expect("probes").0;
    match switch_to(&answered, floor, SUSTAINED) {
        Switch::At { index, at_ms } => {
            println!(
                "delayed for good from probe #{index}, sent at +{at_ms} ms, of probes sent from +0 to +{last_ms} ms \
                 by an init container ({:?} datapath)",
                datapath()
            );
            report(
                "ms from an init container's first probe to its impairment",
                at_ms,
                (0.0, WITHIN_MS),
                "the IP's report, the plan and the apply",
            );
        }
        other => panic!(
            "the init container's probes (+0 to +{last_ms} ms, {INTERVAL_MS} ms apart) were not delayed to at least \
             {floor:.1} ms for good while the pod was Pending: {other:?}"
        ),
    }
    assert_isthmus_installed(&node, &ip);
    f.ns.delete_deployments(&["early"]);
    drop(link);
}

/// Probes of a held pod's init container: fewer are needed, every one is judged.
const HELD_COUNT: u32 = 100;

/// A pod that opts into the hold, whose own first init container probes from its first instruction: every probe is
/// delayed, the first included, and none is lost (an unanswered first probe would prove nothing). The hold's
/// container ran first and said so in its log. Then the Deployment moves to the other node: its new pod (new IP,
/// new sandbox, new node's agent) is held anew, and again every probe is delayed.
pub fn held_from_the_first_packet(f: &Fixture) {
    let link = f.link_unchecked("held", &one_way_spec("held", "server", "{latency: 40ms}"));
    wait_condition(&f.ns, "held", "Ready", "True", "NoPairs");
    f.ns.apply(&probing_deployment("held", &f.n1, &f.server.ip, HELD_COUNT, Prober::HeldInit));
    let (first, _, _) = every_probe_delayed(f, None);
    let patch = serde_json::json!({"spec": {"template": {"spec": {"nodeName": f.n2}}}});
    f.ns.kubectl(&["patch", "deployment", "held", "--type=merge", "-p", &patch.to_string()]);
    let (_, moved_ip, node) = every_probe_delayed(f, Some(&first));
    assert_eq!(node, f.n2, "the Deployment moved to {}", f.n2);
    assert_isthmus_installed(&node, &moved_ip);
    f.ns.delete_deployments(&["held"]);
    drop(link);
}

/// Waits for the held Deployment's Ready pod (another than `not`), checks its hold and its prober's probes: (name, IP,
/// node).
fn every_probe_delayed(f: &Fixture, not: Option<&str>) -> (String, String, String) {
    let (pod, ip, node) = wait_for("the held pod Ready", std::time::Duration::from_secs(240), || {
        f.ns.ready_pod("held").filter(|p| Some(p.0.as_str()) != not)
    });
    let json = f.ns.json(&["get", "pod", &pod]);
    let inits: Vec<&str> = json["spec"]["initContainers"]
        .as_array()
        .expect("init containers")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(inits, ["isthmus-wait-for-links", "prober"], "the hold's container first, once");
    let waited = kubectl_raw(&["logs", "-n", &f.ns.name, &pod, "-c", "isthmus-wait-for-links"], None).stdout;
    println!("the hold's container of {pod}:\n{}", waited.trim());
    assert!(waited.contains("the pod's links are applied"), "the hold ended as it should: {waited}");
    let probes = init_probes(f, &pod, &ip, &node);
    let all = probes.samples();
    let floor = delay_floor(40.0);
    let lost: Vec<String> = all.iter().filter(|s| s.1.is_none()).map(|s| format!("+{:.0}", s.0)).collect();
    let undelayed: Vec<String> =
        all.iter().filter_map(|s| s.1.filter(|rtt| *rtt < floor).map(|rtt| format!("+{:.0}: {rtt:.1}", s.0))).collect();
    println!("{:?} datapath: lost {lost:?}; under {floor:.1} ms (sent at: round trip, ms) {undelayed:?}", datapath());
    assert!(undelayed.is_empty(), "probes of the held pod {pod} were not delayed: {undelayed:?}");
    assert!(lost.is_empty(), "probes of the held pod {pod} were lost, so not seen delayed: {lost:?}");
    at_least(
        "ms of the held pod's first round trip",
        all[0].1.expect("answered"),
        floor,
        "the first packet crosses the link",
    );
    (pod, ip, node)
}

/// The report of a pod's init container `prober`, with the pod's timeline printed against its first probe.
fn init_probes(f: &Fixture, pod: &str, ip: &str, node: &str) -> RttReport {
    let log = kubectl_raw(&["logs", "-n", &f.ns.name, pod, "-c", "prober"], None);
    let probes = serde_json::from_str::<serde_json::Value>(log.stdout.trim())
        .map(RttReport)
        .unwrap_or_else(|e| panic!("the init container's report: {e}: {:?} {:?}", log.stdout, log.stderr));
    println!("init container of {pod} ({ip}) on {node}: {}", probes.describe());
    let started = probes.0["started_unix_ms"].as_i64().expect("started_unix_ms");
    println!("the pod, in ms from its first probe: {}", pod_timeline(&f.ns.json(&["get", "pod", pod]), started));
    probes
}
