//! End-to-end: isthmus installed by the chart on a real cluster (`make e2e`), measured from inside pods with
//! isthmus-probe. Run one at a time (`--test-threads=1`): throughput figures must not share the CPU.

use isthmus_e2e::*;
use std::time::{Duration, Instant};

mod common;
use common::{nodes, two_nodes};

/// A shaper never gives more than its rate: a reading above the expected goodput by more than this fraction fails
/// at once (the probe counts at the receiver, first byte to end of stream, so only the bucket's 5 ms burst and
/// timer granularity can raise it).
const RATE_ABOVE: f64 = 0.10;
/// TCP can give less than the rate (slow start, a tail drop's 200 ms retransmission timeout, a sender starved of
/// CPU on a shared 2-core machine): how far below it a reading is, is a report, not a gate.
const RATE_BELOW: f64 = 0.15;

/// Fails if `measured` exceeds what a cap of `configured_bps` lets through; returns the measured/expected ratio.
fn assert_not_above_cap(what: &str, measured: f64, configured_bps: f64) -> f64 {
    let expected = expected_goodput_bps(configured_bps);
    let ratio = measured / expected;
    println!("{what}: measured {} vs expected {} ({:+.1} %)", mbit(measured), mbit(expected), (ratio - 1.0) * 100.0);
    assert!(
        ratio <= 1.0 + RATE_ABOVE,
        "{what}: {} is more than {:.0} % above the cap's {}",
        mbit(measured),
        RATE_ABOVE * 100.0,
        mbit(expected)
    );
    ratio
}

/// The cap `configured_bps` on the pod with IP `pod_ip` on `node`: its tree on the node holds a TBF at that rate
/// (read with iproute2) and `measured` stays under it (+10 %), both gates; that the reading comes within 15 % of
/// the cap is a report (a sender on a shared 2-core machine gets what CPU is left).
fn assert_rate_measured(what: &str, configured_bps: f64, (node, pod_ip): (&str, &str), measured: f64) {
    assert_pod_shaped(node, pod_ip, &[("tbf", &format!("rate {}Mbit", configured_bps / 1e6))]);
    let ratio = assert_not_above_cap(what, measured, configured_bps);
    verdict::report(
        &format!("{what}, share of the cap"),
        ratio,
        (1.0 - RATE_BELOW, 1.0 + RATE_ABOVE),
        "within 15 % below",
    );
}

/// bandwidth-only: the cap is in the pod's tree and never exceeded (how near TCP comes is reported), the reverse
/// direction is untouched, an edit while the link is in place is followed, and deleting the link uncaps it.
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
    assert_isthmus_installed(&n1, &client_ip);
    assert_rate_measured(
        "client -> server, 50Mbit",
        50e6,
        (&n1, &client_ip),
        ns.throughput_bps(&client, &server_ip, 5.0),
    );
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
    let after_edit = ns.throughput_bps(&client, &server_ip, 5.0);
    assert_rate_measured("client -> server after edit to 20Mbit", 20e6, (&n1, &client_ip), after_edit);

    ns.kubectl(&["delete", "networklink", "cap", "--wait", "--timeout=60s"]);
    let after = ns.throughput_bps(&client, &server_ip, 3.0);
    println!("after delete: {} (baseline {})", mbit(after), mbit(baseline));
    // Uncapped, not "near the baseline": CPU-bound veth throughput on a shared machine varies by more than 2x
    // between two readings, while a cap left in place reads 20 Mbit/s, far below this bound.
    assert!(after > 3.0 * 50e6, "throughput did not return to uncapped: {}", mbit(after));
    assert_nothing_of_isthmus(&n1, &client_ip);
}

/// A one-second reading right after Ready says something about the cap at Ready only if it ended this soon after
/// the test saw Ready (`kubectl exec` start-up included) ...
const FIRST_SECOND_ENDS_BY: Duration = Duration::from_millis(2500);
/// ... and traffic flowed for most of that second (a sender starved of CPU moves little either way).
const FIRST_SECOND_MIN_SHARE: f64 = 0.5;
/// Replacements tried until one gives a conclusive first-second reading.
const REPLACEMENTS: usize = 3;

/// A bandwidth-only link measures itself: its probes, far too small to queue behind the cap, see the path's own
/// round trip; the status reports the baseline beside it, expects the baseline plus the probe's serialization at
/// the cap (98 bytes at 50 Mbit/s: 16 µs), and says the link conforms.
#[test]
fn bandwidth_only_link_reports_its_baseline_and_conforms() {
    let ns = TestNamespace::new("measure");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    ns.wait_ready_pod("client");
    ns.wait_ready_pod("server");
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 50Mbit}", None));
    ns.wait_link_applied("cap");
    let t = Instant::now();
    let conformant = wait_for("Conformant=True", Duration::from_secs(120), || {
        ns.link_condition("cap", "Conformant").filter(|c| c.0 == "True")
    });
    println!("Conformant=True {:.1?} after Ready: {conformant:?}", t.elapsed());
    let m = Measured::of(&ns, "cap", "forward").expect("status.measured.forward of a conformant link");
    println!("measured: {}", m.raw);
    let (baseline, expected) = (m.baseline_p50_ms.expect("baselineP50"), m.expected_rtt_ms.expect("expectedRtt"));
    assert!(m.samples > 0 && m.rtt_p50_ms.is_some(), "no round trip measured: {}", m.raw);
    assert!(
        (expected - baseline - 0.016).abs() < 0.05,
        "expected RTT {expected} ms is not the baseline {baseline} ms plus 16 µs of serialization: {}",
        m.raw
    );
}

/// Follow the workload: the client pod is replaced on the other node (new IP) and is capped again right after
/// it becomes Ready. A one-second transfer started as soon as the test sees Ready must not exceed the cap: an
/// uncapped moment of even 2 % of it, at the > 150 Mbit/s a pod gets here, would push the average over. Above the
/// cap fails at once, whenever measured. Whether a reading at or under the cap proves the cap was there from Ready
/// depends on how soon `kubectl exec` started and on the sender getting CPU; when a reading is inconclusive on
/// either count, the pod is replaced again (up to three times), so a slow machine does not fail the test and a
/// missing cap still does.
#[test]
fn replacement_pod_is_impaired_again() {
    let ns = TestNamespace::new("follow");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (mut current, mut current_ip, mut current_node) = ns.wait_ready_pod("client");
    let (_, server_ip, _) = ns.wait_ready_pod("server");
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 20Mbit}", None));
    ns.wait_link_applied("cap");
    let before = ns.throughput_bps(&current, &server_ip, 3.0);
    assert_rate_measured("before replacement", 20e6, (&current_node, &current_ip), before);

    let mut inconclusive = Vec::new();
    for replacement in 1..=REPLACEMENTS {
        // Moving the Deployment to the other node replaces the pod there (a new pod, a new IP); the annotation
        // changes the template even when both nodes are one (a one-node cluster) or the pod is back on its node.
        let target = if replacement % 2 == 1 { &n2 } else { &n1 };
        let patch = serde_json::json!({"spec": {"template": {
            "metadata": {"annotations": {"isthmus.dev/e2e-replacement": replacement.to_string()}},
            "spec": {"nodeName": target},
        }}});
        ns.kubectl(&["patch", "deployment", "client", "--type=merge", "-p", &patch.to_string()]);
        let (new, new_ip, node) = wait_for("the replacement client pod Ready", Duration::from_secs(120), || {
            ns.ready_pod("client").filter(|(name, _, _)| *name != current)
        });
        let ready_at = Instant::now();
        let first = ns.throughput_bps(&new, &server_ip, 1.0);
        let first_done = ready_at.elapsed();
        println!(
            "replacement {replacement}: {new} ({new_ip}) on {node}, was {current} ({current_ip}) on {current_node}; \
             1 s transfer ended {first_done:.1?} after Ready: {}",
            mbit(first)
        );
        assert_ne!(new_ip, current_ip, "the replacement pod kept the old pod's IP");
        let share = assert_not_above_cap("replacement pod, the first second after Ready", first, 20e6);
        if first_done <= FIRST_SECOND_ENDS_BY && share >= FIRST_SECOND_MIN_SHARE {
            let after = ns.throughput_bps(&new, &server_ip, 2.0);
            assert_rate_measured("replacement pod, after its first second", 20e6, (&node, &new_ip), after);
            assert_isthmus_installed(&node, &new_ip);
            ns.wait_link_applied("cap");
            return;
        }
        let why = format!(
            "replacement {replacement}: ended {first_done:.1?} after Ready (needs {FIRST_SECOND_ENDS_BY:?}), \
             {} ({:.0} % of the cap, needs {:.0} %)",
            mbit(first),
            share * 100.0,
            FIRST_SECOND_MIN_SHARE * 100.0
        );
        println!("inconclusive, replacing the pod again: {why}");
        inconclusive.push(why);
        (current, current_ip, current_node) = (new, new_ip, node);
    }
    panic!("no replacement pod could be measured in its first second after Ready: {inconclusive:#?}");
}

/// Two links over the same pair: the higher priority one is applied, both say Overlapping.
#[test]
fn overlapping_links_higher_priority_wins() {
    let ns = TestNamespace::new("overlap");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    let (client, client_ip, _) = ns.wait_ready_pod("client");
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
    let reading = ns.throughput_bps(&client, &server_ip, 4.0);
    assert_rate_measured("overlap, priority 10 (20Mbit) over priority 1 (50Mbit)", 20e6, (&n1, &client_ip), reading);
    // `kubectl isthmus explain` names the same winner from the objects, and the agent, through exec, shows the
    // winner's TBF at 20 Mbit/s on the client's interface, with counters the measurement above moved.
    let out = kubectl(&["isthmus", "explain", &client, &server_ip, "-n", &ns.name]);
    println!("{out}");
    for expected in [
        format!("Decided by:  NetworkLink {}/high (forward)", ns.name),
        "lost: priority 1 < 10".to_string(),
        format!("Node:        {n1}"),
        "tc: an isthmus tree on eth0".to_string(),
        "tbf qdisc".to_string(),
        "rate 20000000bit/s".to_string(),
    ] {
        assert!(out.contains(&expected), "kubectl isthmus explain lacks {expected:?}:\n{out}");
    }
    let links = kubectl(&["isthmus", "links", "-n", &ns.name]);
    println!("{links}");
    assert!(links.lines().any(|l| l.starts_with("high ") && l.contains("20Mbit")), "{links}");
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

/// Every agent obtained its serving certificate through a CertificateSigningRequest that the operator approved
/// and signed, for exactly its own node's name and the agents' shared metrics name (real kubelets, pod-bound
/// tokens); no Secret of the release holds a CA key except the operator's own CA Secret, which Helm never rendered.
#[test]
fn agents_hold_certificates_for_their_own_node_only() {
    // Besides its node's name, each agent's certificate carries the one name all agents share (their metrics
    // Service's), which the chart gives the agents and the operator alike.
    let daemonset = kubectl_json(&["-n", "isthmus-system", "get", "daemonset", "isthmus-agent"]);
    let shared = daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "ISTHMUS_SHARED_DNS_NAME")
        .and_then(|e| e["value"].as_str())
        .expect("the agent DaemonSet sets ISTHMUS_SHARED_DNS_NAME")
        .to_owned();
    for node in nodes() {
        let csrs = kubectl_json(&["get", "csr", "-l", &format!("isthmus.dev/node={node}")]);
        let issued: Vec<&serde_json::Value> = csrs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| {
                c["spec"]["signerName"] == "isthmus.dev/agent-serving" && c["status"]["certificate"].is_string()
            })
            .collect();
        assert!(!issued.is_empty(), "no signed certificate request for node {node}: {csrs}");
        for csr in issued {
            let approved = csr["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "Approved");
            assert!(approved, "{}", csr["metadata"]["name"]);
            let encoded = csr["status"]["certificate"].as_str().unwrap();
            let mut openssl = std::process::Command::new("sh")
                .args(["-c", "base64 -d | openssl x509 -noout -ext subjectAltName"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(&mut openssl.stdin.take().unwrap(), encoded.as_bytes()).unwrap();
            let out = String::from_utf8(openssl.wait_with_output().unwrap().stdout).unwrap();
            let sans: Vec<&str> = out.lines().skip(1).flat_map(|l| l.split(',')).map(str::trim).collect();
            println!("node {node}: CSR {} signed for {sans:?}", csr["metadata"]["name"]);
            assert_eq!(sans, [format!("DNS:{node}.node.isthmus"), format!("DNS:{shared}")], "node {node}");
        }
    }
    let secrets = kubectl_json(&["-n", "isthmus-system", "get", "secrets"]);
    for s in secrets["items"].as_array().unwrap() {
        let name = s["metadata"]["name"].as_str().unwrap();
        let holds_ca_key = s["data"].as_object().is_some_and(|d| d.contains_key("ca.key"));
        assert!(!holds_ca_key || name == "isthmus-ca", "Secret {name} holds a CA key");
    }
}

/// The CA Secret deleted on a live cluster (how an administrator replaces a leaked CA key): links keep
/// reconciling through the hand-over. An edit and a new link made at once are applied; every agent moves to the
/// new CA and the old one leaves the bundle within minutes; an edit after that, with only the new CA trusted on
/// either side, is applied too.
#[test]
fn a_deleted_ca_is_replaced_while_links_keep_reconciling() {
    let ns = TestNamespace::new("ca");
    let (n1, n2) = two_nodes();
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    ns.wait_ready_pod("client");
    ns.wait_ready_pod("server");
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 20Mbit}", None));
    ns.wait_link_applied("cap");
    let bundle = || kubectl_json(&["-n", "isthmus-system", "get", "configmap", "isthmus-ca-bundle"])["data"].clone();
    let old = bundle()["ca.crt"].as_str().expect("the bundle's ca.crt").to_owned();

    let deleted = Instant::now();
    kubectl(&["-n", "isthmus-system", "delete", "secret", "isthmus-ca"]);
    // Whether the hand-over is still under way when the new bundle is first read depends on the machine's pace;
    // chart-lint checks the retired CA's part step by step, here it is only reported.
    let retired = wait_for("a new CA in the bundle", Duration::from_secs(30), || {
        let data = bundle();
        let retired = data["retired.crt"].as_str().map(str::to_owned);
        (data["ca.crt"].as_str()? != old).then_some(retired)
    });
    println!(
        "a new CA {:.1?} after the deletion; the old one {}",
        deleted.elapsed(),
        if retired.is_some_and(|r| old.contains(&r)) { "retired, still trusted" } else { "already dropped" }
    );
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 10Mbit}", None));
    ns.apply(&link_manifest("back", "server", "client", "{bandwidth: 10Mbit}", None));
    ns.wait_link_applied("cap");
    ns.wait_link_applied("back");
    println!("an edit and a new link applied {:.1?} after the CA Secret was deleted", deleted.elapsed());
    wait_for("every agent on the new CA, and the old one dropped", Duration::from_secs(180), || {
        let data = bundle();
        (data.get("retired.crt").is_none() && !data["ca.crt"].as_str()?.contains(&old)).then_some(())
    });
    println!("every agent moved and the old CA left the bundle {:.1?} after the deletion", deleted.elapsed());
    ns.apply(&link_manifest("cap", "client", "server", "{bandwidth: 5Mbit}", None));
    ns.wait_link_applied("cap");
    println!("an edit after the hand-over applied {:.1?} after the deletion", deleted.elapsed());
}

/// `helm uninstall` with the chart's uninstall hook leaves no impairment in any pod on any node: the links stay in
/// place up to the uninstall, and the hook (the operator image's `uninstall` subcommand) must have the operator
/// remove them from every node before the agents go. Uninstalls isthmus, so it is ignored in the normal run;
/// e2e/suite/run runs it last.
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
    assert_rate_measured("before uninstall", 20e6, (&n1, &client_ip), ns.throughput_bps(&client, &server_ip, 3.0));
    assert_isthmus_installed(&n1, &client_ip);
    assert_isthmus_installed(&n2, &server_ip);

    // No link is deleted by hand: removing them is the hook's job.
    let out = std::process::Command::new(&helm)
        .args(["uninstall", "isthmus", "-n", "isthmus-system", "--wait", "--timeout", "300s"])
        .output()
        .unwrap();
    println!("helm uninstall: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "helm uninstall: {}", String::from_utf8_lossy(&out.stderr));
    let links = kubectl_json(&["get", "networklinks", "-A"]);
    assert!(
        links["items"].as_array().is_none_or(Vec::is_empty),
        "NetworkLinks outlived the uninstall: {}",
        links["items"]
    );
    wait_for("no isthmus pod left", Duration::from_secs(120), || {
        let pods = kubectl_json(&["get", "pods", "-A", "-l", "app.kubernetes.io/part-of=isthmus"]);
        let pods2 = kubectl_json(&["get", "pods", "-n", "isthmus-system"]);
        (pods["items"].as_array()?.is_empty() && pods2["items"].as_array()?.is_empty()).then_some(())
    });
    assert_nothing_of_isthmus(&n1, &client_ip);
    assert_nothing_of_isthmus(&n2, &server_ip);
    for node in nodes() {
        let left = node_isthmus_left(&node);
        assert!(left.is_empty(), "isthmus qdiscs left on {node}: {left:?}");
    }
    let free = ns.throughput_bps(&client, &server_ip, 3.0);
    let back = ns.throughput_bps(&server, &client_ip, 3.0);
    println!("after uninstall: client -> server {}, server -> client {}", mbit(free), mbit(back));
    assert!(free > 3.0 * 20e6 && back > 3.0 * 20e6, "still capped after uninstall");
}
