//! End-to-end: isthmus installed by the chart on a real cluster (`make e2e`), measured from inside pods with
//! isthmus-probe. Run one at a time (`--test-threads=1`): throughput figures must not share the CPU.

use isthmus_e2e::*;
use std::time::{Duration, Instant};

/// Measured goodput must be within this fraction of the configured rate's expected goodput.
const RATE_TOLERANCE: f64 = 0.10;

fn nodes() -> Vec<String> {
    let v = kubectl_json(&["get", "nodes"]);
    let mut names: Vec<String> =
        v["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

/// (first node, the other node or the first again on a one-node cluster)
fn two_nodes() -> (String, String) {
    let n = nodes();
    (n[0].clone(), n.get(1).unwrap_or(&n[0]).clone())
}

fn assert_rate(what: &str, measured: f64, configured_bps: f64) {
    let expected = expected_goodput_bps(configured_bps);
    let off = (measured - expected).abs() / expected;
    println!(
        "{what}: measured {} vs expected {} ({:+.1} %)",
        mbit(measured),
        mbit(expected),
        (measured / expected - 1.0) * 100.0
    );
    assert!(
        off <= RATE_TOLERANCE,
        "{what}: {} is more than {:.0} % off {}",
        mbit(measured),
        RATE_TOLERANCE * 100.0,
        mbit(expected)
    );
}

/// Like [`assert_rate`] on `measure()`, but a reading *below* the tolerance is taken once more: on a loaded
/// machine a starved sender falls short of the cap, which says nothing about the cap. Above the cap fails at once.
fn assert_rate_measured(what: &str, configured_bps: f64, mut measure: impl FnMut() -> f64) {
    let expected = expected_goodput_bps(configured_bps);
    let first = measure();
    if first < expected * (1.0 - RATE_TOLERANCE) {
        println!("{what}: {} is below the tolerance (sender starved?); measuring once more", mbit(first));
        assert_rate(what, measure(), configured_bps);
    } else {
        assert_rate(what, first, configured_bps);
    }
}

/// bandwidth-only: the cap is measured (±10 %), the reverse direction is untouched, an edit while the link is in
/// place is followed, and deleting the link gives the baseline back.
#[test]
fn bandwidth_link_measured_edited_and_removed() {
    let ns = TestNamespace::new("bw");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (client, client_ip, _) = ns.wait_ready_pod("client");
    let (server, server_ip, _) = ns.wait_ready_pod("server");
    let baseline = ns.throughput_bps(&client, &server_ip, 3.0);
    println!("baseline client -> server ({n1} -> {n2}): {}", mbit(baseline));
    assert!(baseline > 3.0 * 50e6, "baseline {} too slow to show a 50 Mbit/s cap", mbit(baseline));

    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 50Mbit}", None));
    let t = Instant::now();
    let pairs = ns.wait_link_applied("cap");
    println!("link Ready (Applied, {pairs} pair) {:?} after apply", t.elapsed());
    assert_eq!(pairs, 1);
    assert_isthmus_qdisc_local(&client_ip);
    assert_rate_measured("client -> server, 50Mbit", 50e6, || ns.throughput_bps(&client, &server_ip, 5.0));
    let reverse = ns.throughput_bps(&server, &client_ip, 3.0);
    println!("server -> client (not capped): {}", mbit(reverse));
    assert!(reverse > 3.0 * 50e6, "the reverse direction is capped too: {}", mbit(reverse));

    ns.kubectl(&[
        "patch",
        "networklink",
        "cap",
        "--type=merge",
        "-p",
        r#"{"spec":{"impairment":{"bandwidth":"20Mbit"}}}"#,
    ]);
    ns.wait_link_applied("cap");
    assert_rate_measured("client -> server after edit to 20Mbit", 20e6, || ns.throughput_bps(&client, &server_ip, 5.0));

    ns.kubectl(&["delete", "networklink", "cap", "--wait", "--timeout=60s"]);
    let after = ns.throughput_bps(&client, &server_ip, 3.0);
    println!("after delete: {} (baseline {})", mbit(after), mbit(baseline));
    assert!(after > 3.0 * 50e6 && after > 0.5 * baseline, "throughput did not return to baseline: {}", mbit(after));
    assert_no_isthmus_qdisc_local(&client_ip);
}

/// A latency link: where the node kernel has sch_netem the RTT grows by the latency; where it has not (this
/// machine's kernel), the link says Degraded with a message naming sch_netem.
#[test]
fn latency_link_is_measured_or_degraded_without_netem() {
    let ns = TestNamespace::new("lat");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (client, _, _) = ns.wait_ready_pod("client");
    let (_, server_ip, _) = ns.wait_ready_pod("server");
    ns.apply(&link_manifest("delay", "client", "server", "{latency: 40ms}", None));
    let (ready, degraded) = wait_for("the latency link to settle (Ready or Degraded)", Duration::from_secs(60), || {
        let ready = ns.link_condition("delay", "Ready")?;
        let degraded = ns.link_condition("delay", "Degraded")?;
        let settled = ready.0 == "True" && ready.1 == "Applied" || degraded.0 == "True";
        settled.then_some((ready, degraded))
    });
    println!("Ready={ready:?}\nDegraded={degraded:?}");
    if degraded.0 == "True" {
        assert_eq!(degraded.1, "KernelUnsupported", "{degraded:?}");
        assert!(degraded.2.contains("sch_netem"), "the Degraded message does not say netem is missing: {}", degraded.2);
        assert!(degraded.2.contains("latency"), "the Degraded message does not say what is lost: {}", degraded.2);
        println!("skipping the RTT measurement: node kernel lacks sch_netem (status Degraded, as required)");
    } else {
        let rtt = ns.rtt(&client, &server_ip, 100);
        let p50 = rtt["rtt_ms"]["p50"].as_f64().expect("rtt p50");
        println!("UDP RTT p50 with 40ms one-way latency: {p50} ms");
        assert!((40.0..50.0).contains(&p50), "RTT p50 {p50} ms, expected 40-50 ms");
    }
}

/// Follow the workload: the client pod is replaced on the other node (new IP) and is capped again right after
/// it becomes Ready.
#[test]
fn replacement_pod_is_impaired_again() {
    let ns = TestNamespace::new("follow");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (old, old_ip, _) = ns.wait_ready_pod("client");
    let (_, server_ip, _) = ns.wait_ready_pod("server");
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 20Mbit}", None));
    ns.wait_link_applied("cap");
    assert_rate_measured("before replacement", 20e6, || ns.throughput_bps(&old, &server_ip, 3.0));

    // Moving the Deployment to the other node replaces the pod there (a new pod, a new IP).
    let patch = format!(r#"{{"spec":{{"template":{{"spec":{{"nodeName":"{n2}"}}}}}}}}"#);
    ns.kubectl(&["patch", "deployment", "client", "--type=merge", "-p", &patch]);
    let (new, new_ip, node) = wait_for("the replacement client pod Ready", Duration::from_secs(120), || {
        ns.ready_pod("client").filter(|(name, _, _)| *name != old)
    });
    let ready_at = Instant::now();
    println!("replacement {new} ({new_ip}) on {node}, was {old} ({old_ip}) on {n1}");
    assert_ne!(new_ip, old_ip);
    let first = ns.throughput_bps(&new, &server_ip, 1.0);
    let first_done = ready_at.elapsed();
    let second_start = ready_at.elapsed();
    let second = ns.throughput_bps(&new, &server_ip, 2.0);
    println!(
        "throughput in [~0, {first_done:.1?}] after Ready: {}; in [{second_start:.1?}, {:.1?}]: {}",
        mbit(first),
        ready_at.elapsed(),
        mbit(second)
    );
    assert!(second_start <= Duration::from_millis(2500), "measurement started late: {second_start:?}");
    // A 1 s average at the cap means the cap was there from the start of the transfer, well within 2 s of Ready.
    assert!(first_done <= Duration::from_millis(2500), "first measurement ended late: {first_done:?}");
    assert_rate("replacement pod, the first second after Ready", first, 20e6);
    assert_rate("replacement pod, the next 2 s", second, 20e6);
    assert_isthmus_qdisc_local(&new_ip);
    ns.wait_link_applied("cap");
}

/// Two links over the same pair: the higher priority one is applied, both say Overlapping.
#[test]
fn overlapping_links_higher_priority_wins() {
    let ns = TestNamespace::new("overlap");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (client, _, _) = ns.wait_ready_pod("client");
    let (_, server_ip, _) = ns.wait_ready_pod("server");
    ns.apply(&link_manifest("low", "client", "server", "{bandwidth: 50Mbit}", Some(1)));
    ns.apply(&link_manifest("high", "client", "server", "{bandwidth: 20Mbit}", Some(10)));
    for link in ["low", "high"] {
        let c = wait_for(&format!("{link} Overlapping=True"), Duration::from_secs(60), || {
            ns.link_condition(link, "Overlapping").filter(|c| c.0 == "True")
        });
        println!("{link}: Overlapping {c:?}");
        let other = if link == "low" { "high" } else { "low" };
        assert!(c.2.contains(other), "{link}'s Overlapping message does not name {other}: {}", c.2);
    }
    ns.wait_link_applied("high");
    assert_rate_measured("overlap, priority 10 (20Mbit) over priority 1 (50Mbit)", 20e6, || {
        ns.throughput_bps(&client, &server_ip, 4.0)
    });
}

/// Invalid NetworkLinks are refused by the API server, and the refusal names the field.
#[test]
fn invalid_links_are_refused_naming_the_field() {
    let ns = TestNamespace::new("bad");
    let cases = [
        ("{bandwidth: 50mbps}", "spec.impairment.bandwidth"),
        ("{latency: 40 ms}", "spec.impairment.latency"),
        ("{loss: {percent: 150%}}", "spec.impairment.loss.percent"),
        ("{burst: 32KiB}", "spec.impairment.burst"),
        ("{queueLimit: 0}", "spec.impairment.queueLimit"),
        ("{duplicate: {percent: 5}}", "spec.impairment.duplicate.percent"),
        ("{delay: 10ms}", "delay"),
    ];
    for (impairment, field) in cases {
        let manifest = link_manifest("bad", "client", "server", impairment, None);
        let out = kubectl_raw(
            &["apply", "--dry-run=server", "--validate=strict", "-n", &ns.name, "-f", "-"],
            Some(&manifest),
        );
        assert!(!out.ok, "accepted: impairment {impairment}");
        let first = out.stderr.lines().next().unwrap_or_default();
        println!("{impairment} -> {}", first.chars().take(300).collect::<String>());
        assert!(out.stderr.contains(field), "refusal of {impairment} does not name {field}: {}", out.stderr);
    }
    let no_from = "apiVersion: isthmus.dev/v1alpha1\nkind: NetworkLink\nmetadata: {name: bad}\nspec:\n  to: {podSelector: {}}\n  impairment: {latency: 1ms}\n";
    let out = kubectl_raw(&["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"], Some(no_from));
    assert!(!out.ok && out.stderr.contains("spec.from"), "a link without from: {}", out.stderr);
}

/// helm uninstall leaves nothing: with links deleted first (the chart's uninstall hook is off where its image
/// cannot be pulled), no isthmus pod remains and no pod keeps an isthmus qdisc. Uninstalls isthmus, so it is
/// ignored in the normal run; e2e/suite/run runs it last.
#[test]
#[ignore = "uninstalls isthmus: run last by e2e/suite/run (--ignored helm_uninstall)"]
fn helm_uninstall_leaves_nothing() {
    let helm = std::env::var("ISTHMUS_E2E_HELM").expect("ISTHMUS_E2E_HELM: the helm binary (e2e/suite/run sets it)");
    let ns = TestNamespace::new("uninstall");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (client, client_ip, _) = ns.wait_ready_pod("client");
    let (server, server_ip, _) = ns.wait_ready_pod("server");
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 20Mbit}", None));
    ns.apply(&link_manifest("back", "server", "client", "{bandwidth: 20Mbit}", None));
    ns.wait_link_applied("cap");
    ns.wait_link_applied("back");
    assert_rate_measured("before uninstall", 20e6, || ns.throughput_bps(&client, &server_ip, 3.0));
    assert_isthmus_qdisc_local(&client_ip);
    assert_isthmus_qdisc_local(&server_ip);

    kubectl(&["delete", "networklinks", "--all-namespaces", "--all", "--wait", "--timeout=60s"]);
    let out = std::process::Command::new(&helm)
        .args(["uninstall", "isthmus", "-n", "isthmus-system", "--wait", "--timeout", "120s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
    wait_for("no isthmus pod left", Duration::from_secs(120), || {
        let pods = kubectl_json(&["get", "pods", "-A", "-l", "app.kubernetes.io/part-of=isthmus"]);
        let pods2 = kubectl_json(&["get", "pods", "-n", "isthmus-system"]);
        (pods["items"].as_array()?.is_empty() && pods2["items"].as_array()?.is_empty()).then_some(())
    });
    for ip in [&client_ip, &server_ip] {
        assert_no_isthmus_qdisc_local(ip);
    }
    let free = ns.throughput_bps(&client, &server_ip, 3.0);
    let back = ns.throughput_bps(&server, &client_ip, 3.0);
    println!("after uninstall: client -> server {}, server -> client {}", mbit(free), mbit(back));
    assert!(free > 3.0 * 20e6 && back > 3.0 * 20e6, "still capped after uninstall");
}
