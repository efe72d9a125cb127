//! The link over time: a replaced pod (new node, new IP, new sandbox) is impaired from its first second, an
//! edit is in force within a second of the link's Ready, and a deleted link leaves the path and the pod's kernel
//! as they were.

use std::time::{Duration, Instant};

use isthmus_e2e::*;

use crate::bands::{Baseline, EARLY_MS, within};
use crate::fixture::{Fixture, one_way_spec};

/// How soon the impairment must be in force: the issue's "within its first second".
const WITHIN_MS: f64 = 1000.0;

/// Where the samples switch to `latency_ms` for good: the index after the last sample below it (lost or faster),
/// and that sample's send time (ms after the first probe). Noise can only lengthen a round trip, so a spike before
/// the switch cannot fake it; None when the last sample is still below.
fn first_impaired(samples: &[(f64, Option<f64>)], latency_ms: f64) -> Option<(usize, f64)> {
    let below = |s: &(f64, Option<f64>)| s.1.is_none_or(|r| r < latency_ms - EARLY_MS);
    let from = samples.iter().rposition(below).map_or(0, |i| i + 1);
    samples.get(from).map(|s| (from, s.0))
}

/// From sample `from` on, every probe is answered and carries at least `latency_ms`.
fn assert_impaired_from(what: &str, samples: &[(f64, Option<f64>)], from: usize, latency_ms: f64) {
    for (i, (sent, rtt)) in samples.iter().enumerate().skip(from) {
        let rtt = rtt.unwrap_or_else(|| panic!("{what}: probe {i} (sent at +{sent} ms) was lost"));
        assert!(
            rtt >= latency_ms - EARLY_MS,
            "{what}: probe {i} (sent at +{sent} ms) took {rtt} ms, under {latency_ms} ms"
        );
    }
}

/// A Deployment whose pods probe `target_ip` from the moment they start: the first container runs the prober
/// (150 probes, 20 ms apart, then it holds its report in its log), the second serves. The pods declare isthmus's
/// readiness gate, so they become Ready only once their links are in force (docs/networklink.md, "Readiness
/// gate"): without it, on nodes as slow as this rig's emulated ones, a new pod can be Ready a second before its
/// impairment is installed.
fn probing_deployment(name: &str, node: &str, target_ip: &str) -> String {
    let image = probe_image();
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      nodeName: {node}
      readinessGates: [{{conditionType: isthmus.dev/links-applied}}]
      terminationGracePeriodSeconds: 1
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}}
      containers:
        - name: prober
          image: {image}
          args: [rtt, --target, "{target_ip}:7000", --count, "150", --interval-ms, "20", --samples, --hold]
          securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
        - name: probe
          image: {image}
          args: [serve]
          readinessProbe: {{tcpSocket: {{port: 7000}}, periodSeconds: 1}}
          securityContext: {{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {{drop: [ALL]}}}}
"#
    )
}

/// Seconds since the epoch of an RFC 3339 UTC time as Kubernetes writes it (`2026-11-23T21:55:27Z`).
fn unix_seconds(rfc3339: &str) -> i64 {
    let n = |a: usize, b: usize| rfc3339[a..b].parse::<i64>().unwrap_or_else(|_| panic!("not a timestamp: {rfc3339}"));
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    // days from civil (Howard Hinnant's algorithm)
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    days * 86_400 + n(11, 13) * 3600 + n(14, 16) * 60 + n(17, 19)
}

/// The source Deployment moves to the other node: the replacement pod (new IP, new sandbox) has the link's latency
/// no later than a second after its Ready. The prober starts with the pod, so its samples cover the time before
/// and after Ready; the pod's Ready time is written by the same node's kubelet, on the same clock as the prober's,
/// truncated to the second (so the delay is measured from the earliest instant Ready can have been: never generous).
pub fn rescheduling(f: &Fixture) {
    assert_eq!(
        (
            unix_seconds("1970-01-01T00:00:00Z"),
            unix_seconds("2024-02-29T12:00:00Z"),
            unix_seconds("2026-11-23T21:55:27Z")
        ),
        (0, 1_709_208_000, 1_795_470_927)
    );
    f.ns.apply(&probing_deployment("mover", &f.n1, &f.server.ip));
    let (first, first_ip, _) = f.ns.wait_ready_pod("mover");
    let link = f.one_way("follow", "mover", "server", "{latency: 40ms}");
    let patch = serde_json::json!({"spec": {"template": {"spec": {"nodeName": f.n2}}}});
    f.ns.kubectl(&["patch", "deployment", "mover", "--type=merge", "-p", &patch.to_string()]);
    let (moved, moved_ip, node) =
        wait_for("the moved pod Ready", Duration::from_secs(240), || f.ns.ready_pod("mover").filter(|p| p.0 != first));
    assert_ne!(moved_ip, first_ip, "the replacement pod kept the old pod's IP");
    let report = wait_for("the moved pod's prober report", Duration::from_secs(60), || {
        let log = kubectl_raw(&["logs", "-n", &f.ns.name, &moved, "-c", "prober"], None);
        serde_json::from_str::<serde_json::Value>(log.stdout.trim()).ok().map(RttReport)
    });
    println!("moved {first} ({first_ip}) -> {moved} ({moved_ip}) on {node}: {}", report.describe());
    let pod = f.ns.json(&["get", "pod", &moved]);
    let condition = |t: &str| {
        pod["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .cloned()
            .unwrap_or_default()
    };
    println!("gate: {}; Ready: {}", condition("isthmus.dev/links-applied"), condition("Ready"));
    let ready_ms = unix_seconds(condition("Ready")["lastTransitionTime"].as_str().expect("Ready has a time")) * 1000;
    let samples = report.samples();
    let (i, at) = first_impaired(&samples, 40.0)
        .unwrap_or_else(|| panic!("the moved pod was never impaired in 3 s of probing: {}", report.describe()));
    let started = report.0["started_unix_ms"].as_i64().expect("started_unix_ms");
    // Ready is at or after the second it is written with: measured from that second, the delay is an upper bound.
    let after_ready = (started + at as i64 - ready_ms) as f64;
    println!(
        "first probe for good at the latency: #{i}, {at} ms after the pod's first probe, {after_ready:.0} ms after Ready at the latest"
    );
    within(
        "ms from the moved pod's Ready to its impairment (at most)",
        after_ready,
        (f64::NEG_INFINITY, WITHIN_MS),
        "within its first second",
    );
    assert_impaired_from("moved pod", &samples, i, 40.0);
    assert_isthmus_installed(&node, &moved_ip);
    drop(link);
    f.ns.delete_deployments(&["mover"]);
}

/// An edit (40 ms → 120 ms) while a prober runs: the round trips switch to 120 ms no later than a second after the
/// test sees the link Ready for the new generation, and stay there; deleting the link returns the round trip to
/// the baseline and leaves no isthmus qdisc in the pod.
pub fn edit_and_delete(f: &Fixture) {
    // The smallest effect to tell apart is the first latency (a delete that left it behind): large beside the
    // emulated nodes' spread on a busy machine (p10..p90 up to 27 ms in CI's stop runs; 20 ms was refused).
    let (before, after) = (40.0, 120.0);
    let base = Baseline::measure_quiet(&f.ns, &f.client.name, &f.server.ip, before);
    let link = f.one_way("edit", "client", "server", &format!("{{latency: {before}ms}}"));
    let run = RttRun::new(400).interval_ms(20).samples();
    let (report, exec_end, ready_seen) = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let r = f.ns.rtt_run(&f.client.name, &f.server.ip, run);
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_secs(3));
        f.apply_link("edit", &one_way_spec("client", "server", &format!("{{latency: {after}ms}}")));
        f.ns.wait_link_applied("edit");
        let ready_seen = Instant::now();
        let (r, end) = prober.join().expect("the prober");
        (r, end, ready_seen)
    });
    println!("while editing {before}ms -> {after}ms: {}", report.describe());
    let samples = report.samples();
    let (i, at) = first_impaired(&samples, after)
        .unwrap_or_else(|| panic!("the edit to {after}ms never showed in 8 s of probing: {}", report.describe()));
    assert!(i > 0, "the first probe already took {after} ms: the edit did not happen while probing");
    assert_impaired_from("after the edit", &samples, i, after);
    // On this machine's clock the first probe left no later than the run's end less the run's length (the
    // guests' clocks are not this machine's); the switch, `at` after it, must come within a second of Ready. The
    // prober ran until the last echo arrived, and, when one was lost, until its timeout after the last send.
    let last_sent = samples.last().expect("probes").0;
    let last_echo = samples.iter().filter_map(|(sent, rtt)| rtt.map(|r| sent + r)).fold(0.0, f64::max);
    let waited =
        if report.count("lost") > 0 { last_sent + report.0["timeout_ms"].as_f64().expect("timeout_ms") } else { 0.0 };
    let first_by = exec_end - Duration::from_secs_f64(last_echo.max(waited) / 1000.0);
    let switch_by = first_by + Duration::from_secs_f64(at / 1000.0);
    let late_ms = switch_by.saturating_duration_since(ready_seen).as_secs_f64() * 1000.0;
    println!("the switch to {after}ms came at most {late_ms:.0} ms after the test saw Ready (0 = before it)");
    within("ms from the link's Ready to the switch (at most)", late_ms, (0.0, WITHIN_MS), "within a second of Ready");
    assert_isthmus_installed(&f.client.node, &f.client.ip);
    drop(link);
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(300).interval_ms(5));
    println!("after delete: {}", r.describe());
    within("after delete: RTT p10, ms", r.ms("p10"), base.shifted_band(0.0, 0), "back to the baseline's p10..p90");
    assert_nothing_of_isthmus(&f.client.node, &f.client.ip);
}
