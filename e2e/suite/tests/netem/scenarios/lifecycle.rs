//! The link over time: a replaced pod (new node, new IP, new sandbox) is impaired within a second of its Ready, an
//! edit is in force within a second of the link's Ready, and a deleted link leaves the path and the pod's kernel
//! as they were.

use std::time::{Duration, Instant};

use isthmus_e2e::verdict::{at_most, report};
use isthmus_e2e::*;

use crate::bands::{Baseline, delay_floor};
use crate::fixture::{Fixture, one_way_spec};

/// How soon the impairment must be in force: the issue's "within its first second".
pub(crate) const WITHIN_MS: f64 = 1000.0;
/// Probes 20 ms apart, delayed without a break, that make a switch: two seconds of them. A switch found only in
/// the window's last probes is a spike until this many follow it.
pub(crate) const SUSTAINED: usize = 100;
pub(crate) const INTERVAL_MS: u32 = 20;

/// Where a probing pod runs its prober.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prober {
    /// The first container, which holds its report in its log once done; the pod declares isthmus's readiness
    /// gate, so it becomes Ready only once its links are in force (docs/networklink.md, "Readiness gate"):
    /// without it, on nodes as slow as this rig's emulated ones, a new pod can be Ready a second before its
    /// impairment is installed.
    FirstContainer,
    /// An init container, which exits once done: the pod is `Pending` for the whole run. No readiness gate.
    Init,
    /// As [`Prober::Init`], in a pod that opts into the hold (`isthmus.dev/wait-for-links`): the hold's own init
    /// container runs before the prober, until the pod's links are applied.
    HeldInit,
}

/// A Deployment whose pods probe `target_ip` from the moment they start: the prober sends `count` probes, 20 ms
/// apart, and leaves its report in its log; a container that serves runs beside it (or after it).
pub(crate) fn probing_deployment(name: &str, node: &str, target_ip: &str, count: u32, prober: Prober) -> String {
    let image = probe_image();
    let restricted = "{allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}";
    // An init container's report is read after it ends; a long timeout keeps a probe that an emulated node starved of
    // the host's CPU answers late from counting as lost (the held pod's first probe must be answered).
    let hold = if prober == Prober::FirstContainer { ", --hold" } else { ", --timeout-ms, \"5000\"" };
    let probing = format!(
        r#"        - name: prober
          image: {image}
          args: [rtt, --target, "{target_ip}:7000", --count, "{count}", --interval-ms, "{INTERVAL_MS}", --samples{hold}]
          securityContext: {restricted}
"#
    );
    let serving = format!(
        r#"        - name: probe
          image: {image}
          args: [serve]
          readinessProbe: {{tcpSocket: {{port: 7000}}, periodSeconds: 1}}
          securityContext: {restricted}
"#
    );
    let (gate, containers) = match prober {
        Prober::FirstContainer => (
            "\n      readinessGates: [{conditionType: isthmus.dev/links-applied}]",
            format!("      containers:\n{probing}{serving}"),
        ),
        Prober::Init | Prober::HeldInit => {
            ("", format!("      initContainers:\n{probing}      containers:\n{serving}"))
        }
    };
    let held = if prober == Prober::HeldInit { ", isthmus.dev/wait-for-links: \"true\"" } else { "" };
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}{held}}}}}
    spec:
      nodeName: {node}{gate}
      terminationGracePeriodSeconds: 1
      securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}}
{containers}"#
    )
}

/// Seconds since the epoch of an RFC 3339 UTC time as Kubernetes writes it (`2026-11-23T21:55:27Z`).
pub(crate) fn unix_seconds(rfc3339: &str) -> i64 {
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

/// The pod's life as its node wrote it, in ms relative to `origin_ms` (the prober's first probe): when it started,
/// each condition's last transition, and each init container's and container's start.
pub(crate) fn pod_timeline(pod: &serde_json::Value, origin_ms: i64) -> String {
    let rel = |t: &serde_json::Value| t.as_str().map(|t| format!("{:+} ms", unix_seconds(t) * 1000 - origin_ms));
    let mut events = vec![format!("startTime {}", rel(&pod["status"]["startTime"]).unwrap_or_default())];
    for c in pod["status"]["conditions"].as_array().into_iter().flatten() {
        events.push(format!("{}={} {}", c["type"].as_str().unwrap_or("?"), c["status"].as_str().unwrap_or("?"), {
            rel(&c["lastTransitionTime"]).unwrap_or_default()
        }));
    }
    for (kind, statuses) in [("init container", "initContainerStatuses"), ("container", "containerStatuses")] {
        for c in pod["status"][statuses].as_array().into_iter().flatten() {
            let state = &c["state"];
            let started = rel(&state["running"]["startedAt"])
                .or_else(|| rel(&state["terminated"]["startedAt"]))
                .unwrap_or_else(|| "not started".into());
            events.push(format!("{kind} {} started {started}", c["name"].as_str().unwrap_or("?")));
        }
    }
    events.join("; ")
}

/// The source Deployment moves to the other node: the replacement pod (new IP, new sandbox) has the link's latency
/// no later than a second after its Ready, and keeps it. The prober starts with the pod and probes for 20 s, which
/// covers the pod's Ready with room on the emulated nodes (its containers start seconds before the pod is Running
/// and Ready); a window that ends before Ready and the sustained run after it is
/// inconclusive, a failure. The pod's Ready time is written by the same node's kubelet, on the same clock as the
/// prober's, truncated to the second (so the delay is measured from the earliest instant Ready can have been:
/// never generous). Lost probes decide nothing (the link loses none; an emulated node starved of the host's CPU
/// answers some after their timeout): the switch is the answered probes', and the lost after Ready are printed.
pub fn rescheduling(f: &Fixture) {
    assert_eq!(
        (
            unix_seconds("1970-01-01T00:00:00Z"),
            unix_seconds("2024-02-29T12:00:00Z"),
            unix_seconds("2026-11-23T21:55:27Z")
        ),
        (0, 1_709_208_000, 1_795_470_927)
    );
    f.ns.apply(&probing_deployment("mover", &f.n1, &f.server.ip, 1000, Prober::FirstContainer));
    let (first, first_ip, _) = f.ns.wait_ready_pod("mover");
    let link = f.one_way("follow", "mover", "server", "{latency: 40ms}");
    let patch = serde_json::json!({"spec": {"template": {"spec": {"nodeName": f.n2}}}});
    f.ns.kubectl(&["patch", "deployment", "mover", "--type=merge", "-p", &patch.to_string()]);
    let (moved, moved_ip, node) =
        wait_for("the moved pod Ready", Duration::from_secs(240), || f.ns.ready_pod("mover").filter(|p| p.0 != first));
    assert_ne!(moved_ip, first_ip, "the replacement pod kept the old pod's IP");
    let report_json = wait_for("the moved pod's prober report", Duration::from_secs(90), || {
        let log = kubectl_raw(&["logs", "-n", &f.ns.name, &moved, "-c", "prober"], None);
        serde_json::from_str::<serde_json::Value>(log.stdout.trim()).ok().map(RttReport)
    });
    println!("moved {first} ({first_ip}) -> {moved} ({moved_ip}) on {node}: {}", report_json.describe());
    let pod = f.ns.json(&["get", "pod", &moved]);
    let started = report_json.0["started_unix_ms"].as_i64().expect("started_unix_ms");
    println!("the moved pod, in ms from its first probe: {}", pod_timeline(&pod, started));
    let ready = pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .expect("the pod's Ready has a time");
    let ready_ms = unix_seconds(ready) * 1000 - started;
    let all = report_json.samples();
    let last_ms = all.last().expect("probes").0;
    let floor = delay_floor(40.0);
    // A lost probe says nothing of the delay: the link loses nothing, and a probe is lost when the emulated node,
    // starved of this machine's CPU, answers later than its timeout. The switch is decided on the answered ones;
    // the lost after Ready are listed.
    let lost_after_ready: Vec<String> =
        all.iter().filter(|s| s.1.is_none() && s.0 >= ready_ms as f64).map(|s| format!("+{:.0}", s.0)).collect();
    println!("probes lost after Ready, sent at (ms): {lost_after_ready:?}");
    let samples: Vec<(f64, Option<f64>)> = all.iter().copied().filter(|s| s.1.is_some()).collect();
    let undelayed: Vec<String> = samples
        .iter()
        .filter(|s| s.0 >= ready_ms as f64 && s.1.is_some_and(|rtt| rtt < floor))
        .map(|s| format!("+{:.0}: {:.1}", s.0, s.1.unwrap_or_default()))
        .collect();
    println!("answered under {floor:.1} ms after Ready (sent at: round trip, ms): {undelayed:?}");
    let needed_ms = ready_ms as f64 + WITHIN_MS + (SUSTAINED as f64) * f64::from(INTERVAL_MS);
    println!(
        "probes sent from +0 to +{last_ms} ms; Ready at +{ready_ms} ms (to the second); a round trip of at least {floor:.1} ms is delayed"
    );
    match switch_to(&samples, floor, SUSTAINED) {
        Switch::At { index, at_ms } => {
            let after_ready = at_ms - ready_ms as f64;
            println!(
                "delayed for good from probe #{index}, sent at +{at_ms} ms: {after_ready:.0} ms after Ready at the latest"
            );
            assert!(
                last_ms >= ready_ms as f64 + WITHIN_MS,
                "inconclusive: the probes ended at +{last_ms} ms, before a second after Ready (+{ready_ms} ms)"
            );
            at_most(
                "ms from the moved pod's Ready to its impairment (at most)",
                after_ready,
                WITHIN_MS,
                "within its first second",
            );
        }
        other if last_ms < needed_ms => panic!(
            "inconclusive: the probes ended at +{last_ms} ms, before Ready (+{ready_ms} ms) + 1 s + {SUSTAINED} delayed probes ({other:?})"
        ),
        other => {
            panic!("the moved pod was not impaired for good within a second of its Ready (+{ready_ms} ms): {other:?}")
        }
    }

    assert_isthmus_installed(&node, &moved_ip);
    drop(link);
    f.ns.delete_deployments(&["mover"]);
}

/// An edit (40 ms → 120 ms) while a prober runs: the round trips switch to 120 ms no later than a second after the
/// test sees the link Ready for the new generation, and stay there; deleting the link returns the round trip to
/// under the old delay and leaves no isthmus qdisc in the pod.
pub fn edit_and_delete(f: &Fixture) {
    let (before, after) = (40.0, 120.0);
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let link = f.one_way("edit", "client", "server", &format!("{{latency: {before}ms}}"));
    let run = RttRun::new(750).interval_ms(INTERVAL_MS).samples();
    let arrived = || udp_datagrams_in(f, &f.server.name);
    let before_run = arrived();
    let (report_json, exec_end, ready_seen) = std::thread::scope(|s| {
        let prober = s.spawn(|| {
            let r = f.ns.rtt_run(&f.client.name, &f.server.ip, run);
            (r, Instant::now())
        });
        // `kubectl exec` can take seconds to start the prober on an emulated node: the edit waits until the
        // server's kernel has seen probes arrive, so that it lands while probing, never before.
        wait_for("the prober's first probes at the server", Duration::from_secs(60), || {
            (arrived() > before_run + 10).then_some(())
        });
        f.apply_link("edit", &one_way_spec("client", "server", &format!("{{latency: {after}ms}}")));
        f.ns.wait_link_applied("edit");
        let ready_seen = Instant::now();
        // The client node's clock once the test has seen Ready: a one-probe run started after it, in the same
        // pod as the prober, so on the prober's clock. Never before Ready, later by kubectl exec's start.
        let after_ready = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(1));
        let after_ready_ms = after_ready.0["started_unix_ms"].as_f64().expect("started_unix_ms");
        let (r, end) = prober.join().expect("the prober");
        (r, end, (ready_seen, after_ready_ms))
    });
    let (ready_seen, after_ready_ms) = ready_seen;
    println!("while editing {before}ms -> {after}ms: {}", report_json.describe());
    let samples = report_json.samples();
    // On this machine's clock the first probe left no later than the run's end less the run's length (the
    // guests' clocks are not this machine's); the prober ran until the last echo arrived, and, when one was lost,
    // until its timeout after the last send.
    let last_sent = samples.last().expect("probes").0;
    let last_echo = samples.iter().filter_map(|(sent, rtt)| rtt.map(|r| sent + r)).fold(0.0, f64::max);
    let waited = if report_json.count("lost") > 0 {
        last_sent + report_json.0["timeout_ms"].as_f64().expect("timeout_ms")
    } else {
        0.0
    };
    let first_by = exec_end - Duration::from_secs_f64(last_echo.max(waited) / 1000.0);
    let ready_at = ready_seen.saturating_duration_since(first_by).as_secs_f64() * 1000.0;
    println!("probes sent from +0 to +{last_sent} ms; the test saw Ready at +{ready_at:.0} ms at the latest");
    match switch_to(&samples, delay_floor(after), SUSTAINED) {
        Switch::At { index, at_ms } => {
            assert!(index > 0, "the first probe already took {after} ms: the edit did not happen while probing");
            // Two readings of the lateness, one on each side of the truth: against this machine's clock, Ready
            // mapped onto the probes by the prober's end (kubectl exec returning late moves it earlier: too late
            // a switch), and against the client node's clock after Ready (kubectl exec starting late moves it
            // later: too early a switch). Only the second can gate: load cannot push it up.
            let late = (at_ms - ready_at).max(0.0);
            let started = report_json.0["started_unix_ms"].as_f64().expect("started_unix_ms");
            let late_at_least = started + at_ms - after_ready_ms;
            println!(
                "delayed by {after}ms for good from probe #{index} (+{at_ms} ms): {late:.0} ms after Ready at most \
                 (this machine's clock), {late_at_least:.0} ms at least (the client node's; negative = before it)"
            );
            at_most(
                "ms from the link's Ready to the switch (at least)",
                late_at_least,
                WITHIN_MS,
                "within a second of Ready",
            );
            report(
                "ms from the link's Ready to the switch (at most)",
                late,
                (0.0, WITHIN_MS),
                "within a second of Ready",
            );
        }
        other if last_sent < ready_at + WITHIN_MS + SUSTAINED as f64 * f64::from(INTERVAL_MS) => {
            panic!(
                "inconclusive: the probes ended at +{last_sent} ms, too soon after Ready (+{ready_at:.0} ms): {other:?}"
            )
        }
        other => panic!("the edit to {after}ms was not in force for good within a second of Ready: {other:?}"),
    }
    assert_isthmus_installed(&f.client.node, &f.client.ip);
    drop(link);
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(300).interval_ms(5));
    println!("after delete: {}", r.describe());
    // While the link stood no round trip could come in under the old delay; load would have to slow every one of
    // the 300 by that much for a removed link to look present.
    at_most("after delete: fastest RTT, ms", r.ms("min"), delay_floor(before), "under the old 40 ms");
    report("after delete: RTT p10, ms", r.ms("p10"), base.shifted_band(0.0, 0), "back to the baseline's p10..p90");
    assert_nothing_of_isthmus(&f.client.node, &f.client.ip);
}

/// UDP datagrams the pod's kernel has received (`Udp: InDatagrams` of its network namespace).
fn udp_datagrams_in(f: &Fixture, pod: &str) -> u64 {
    let counters = f.ns.counters(pod);
    counters["udp"]["InDatagrams"].as_u64().unwrap_or_else(|| panic!("no Udp InDatagrams in {counters}"))
}
