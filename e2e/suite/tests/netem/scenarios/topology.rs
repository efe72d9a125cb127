//! A NetworkTopology of three regions over the fixture's pods (client in `eu`, server in `us`, near in `ap`):
//! one the operator cannot expand refused at `kubectl apply` by its webhook, naming the field; its links made
//! and Ready, the configured matrix in its status and `kubectl isthmus matrix`, each pair's round
//! trip at least its configured one, and a pod relabelled into another region taking
//! that region's latency.

use std::time::Duration;

use isthmus_e2e::verdict::{at_least, report};
use isthmus_e2e::*;
use serde_json::Value;

use crate::bands::{Baseline, delay_floor};
use crate::fixture::Fixture;

const LABEL: &str = "isthmus.dev/region";
const TOPOLOGY: &str = "world";

/// The fixture's pods labelled into regions and the topology in place; both undone on drop, pass or fail.
struct Regions<'a> {
    f: &'a Fixture,
}

impl Drop for Regions<'_> {
    fn drop(&mut self) {
        let ns = &self.f.ns.name;
        let out = kubectl_raw(
            &["-n", ns, "delete", "networktopology", TOPOLOGY, "--wait", "--timeout=60s", "--ignore-not-found"],
            None,
        );
        if !out.ok {
            eprintln!("deleting topology {TOPOLOGY}: {}{}", out.stdout, out.stderr);
        }
        // Its links go through the garbage collector; the next scenario must not find them.
        let selector = format!("isthmus.dev/topology={TOPOLOGY}");
        let _ = kubectl_raw(&["-n", ns, "delete", "networklinks", "-l", &selector, "--wait", "--timeout=90s"], None);
        for pod in [&self.f.client.name, &self.f.server.name, &self.f.near.name] {
            let _ = kubectl_raw(&["-n", ns, "label", "pod", pod, &format!("{LABEL}-")], None);
        }
    }
}

fn label(f: &Fixture, pod: &str, region: &str) {
    f.ns.kubectl(&["label", "pod", pod, &format!("{LABEL}={region}"), "--overwrite"]);
}

fn topology(f: &Fixture) -> Value {
    f.ns.json(&["get", "networktopology", TOPOLOGY])
}

/// Waits until the topology is Ready for its generation and its link `from → to` has `destinations` applied.
fn wait_ready(f: &Fixture, from: &str, to: &str, destinations: u64) -> Value {
    let link = format!("{TOPOLOGY}.{from}.{to}");
    wait_for(&format!("topology Ready with {link} at {destinations} destinations"), Duration::from_secs(120), || {
        let t = topology(f);
        let c = t["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
        let fresh = c["observedGeneration"] == t["metadata"]["generation"];
        let l = f.ns.json(&["get", "networklink", &link]);
        let s = &l["status"];
        let applied = s["destinations"].as_u64() == Some(destinations) && s["pairsApplied"] == s["pairs"];
        (fresh && c["status"] == "True" && applied && s["observedGeneration"] == l["metadata"]["generation"])
            .then_some(t)
    })
}

/// A topology the schema admits and the operator cannot expand (jitter where no layer gives a pair a latency)
/// is refused by the chart's webhook, reached through its Service, naming the field; nothing is stored. Waits
/// while the call itself fails (a webhook not yet reachable is refused too, by its failure policy, but says so).
fn refused_at_admission(f: &Fixture) {
    let manifest = format!(
        "apiVersion: isthmus.dev/v1alpha1\nkind: NetworkTopology\nmetadata: {{name: {TOPOLOGY}}}\nspec:\n\
         \x20 regionLabel: {LABEL}\n  regions: [{{name: eu}}, {{name: us}}]\n  default: {{jitter: 2ms}}\n"
    );
    let ns = f.ns.name.as_str();
    let refusal = wait_for("the webhook to answer", Duration::from_secs(60), || {
        let out = kubectl_raw(&["-n", ns, "apply", "-f", "-"], Some(&manifest));
        assert!(!out.ok, "a topology whose jitter has no latency to vary around was admitted");
        (!out.stderr.contains("failed calling webhook")).then_some(out.stderr)
    });
    assert!(refusal.contains("denied the request: spec.default.jitter: eu → us: jitter needs a latency"), "{refusal}");
    assert!(!kubectl_raw(&["-n", ns, "get", "networktopology", TOPOLOGY], None).ok, "the refused topology is stored");
}

pub fn topology_matrix(f: &Fixture) {
    let base_us = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let base_ap = Baseline::measure(&f.ns, &f.client.name, &f.near.ip);
    let _undo = Regions { f };
    label(f, &f.client.name, "eu");
    label(f, &f.server.name, "us");
    label(f, &f.near.name, "ap");
    refused_at_admission(f);
    f.ns.apply(&format!(
        "apiVersion: isthmus.dev/v1alpha1\nkind: NetworkTopology\nmetadata: {{name: {TOPOLOGY}}}\nspec:\n\
         \x20 regionLabel: {LABEL}\n  regions: [{{name: eu}}, {{name: us}}, {{name: ap}}]\n\
         \x20 links:\n  - {{from: eu, to: us, roundTrip: 80ms}}\n  - {{from: eu, to: ap, roundTrip: 30ms}}\n\
         \x20 - {{from: us, to: ap, roundTrip: 20ms}}\n"
    ));
    // eu → us: the server's IP and the ClusterIP of Service `server` (it fronts only us pods).
    let t = wait_ready(f, "eu", "us", 2);
    let status = &t["status"];
    println!("topology: {}; matrix {}", status["summary"], status["matrix"]);
    assert_eq!(status["links"], 9, "3 regions: 9 links");
    let row = |from: &str| status["matrix"].as_array().unwrap().iter().find(|r| r["from"] == from).cloned().unwrap();
    assert_eq!(row("eu")["configured"], serde_json::json!(["0", "80ms", "30ms"]), "eu's row: {}", row("eu"));
    assert_eq!(row("us")["configured"], serde_json::json!(["80ms", "0", "20ms"]));
    let regions: Vec<(String, u64)> = status["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r["pods"].as_u64().unwrap()))
        .collect();
    assert_eq!(regions, [("eu".into(), 1), ("us".into(), 1), ("ap".into(), 1)]);
    let table = kubectl(&["isthmus", "matrix", TOPOLOGY, "-n", &f.ns.name]);
    println!("kubectl isthmus matrix:\n{table}");
    assert!(table.lines().nth(1).is_some_and(|l| l.starts_with("eu") && l.contains("80ms / ")), "{table}");

    let to_us = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(200));
    let to_ap = f.ns.rtt_run(&f.client.name, &f.near.ip, RttRun::new(200));
    println!("eu → us: {}\neu → ap: {}", to_us.describe(), to_ap.describe());
    at_least("eu → us RTT p10, ms", to_us.ms("p10"), delay_floor(80.0), "the 80 ms round trip");
    at_least("eu → ap RTT p10, ms", to_ap.ms("p10"), delay_floor(30.0), "the 30 ms round trip");
    report("eu → us RTT p10, ms", to_us.ms("p10"), base_us.shifted_band(80.0, 2), "baseline + 80 ms + timer slack");
    report("eu → ap RTT p10, ms", to_ap.ms("p10"), base_ap.shifted_band(30.0, 2), "baseline + 30 ms + timer slack");

    // near moves from ap to us: eu's link to us now has it (its IP added), and it answers 80 ms later, not 30.
    label(f, &f.near.name, "us");
    wait_ready(f, "eu", "us", 3);
    let moved = f.ns.rtt_run(&f.client.name, &f.near.ip, RttRun::new(200));
    println!("eu → near, now in us: {}", moved.describe());
    at_least("eu → near (relabelled into us) RTT p10, ms", moved.ms("p10"), delay_floor(80.0), "us's 80 ms");
    report(
        "eu → near (in us) RTT p10, ms",
        moved.ms("p10"),
        base_ap.shifted_band(80.0, 2),
        "baseline + 80 ms + timer slack",
    );
}
