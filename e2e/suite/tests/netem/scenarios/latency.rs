//! Delay: a symmetric latency with and without jitter, an asymmetric access profile, and traffic to a Service.

use isthmus_e2e::*;

use crate::bands::{Baseline, SIGMAS, within};
use crate::fixture::{Fixture, one_way_spec};

const LATENCY_MS: f64 = 40.0;
/// Large beside the emulated nodes' own spread: with the machine busy elsewhere (as CI's stop runs found it) the
/// unimpaired round trip's p10..p90 spread 7–27 ms, so ±10 ms (a 20 ms effect) was refused as too noisy.
const JITTER_MS: f64 = 20.0;

/// 40 ms one way in both directions: the median round trip is 80 ms above the baseline. With ±20 ms of jitter
/// on each direction (uniform), the round trip's extra delay is the sum of two uniforms: triangular on ±40 ms,
/// whose p10–p90 spread is 2 · 40 · (1 − √0.2) = 44.2 ms.
pub fn latency_and_jitter(f: &Fixture) {
    let base = Baseline::measure_quiet(&f.ns, &f.client.name, &f.server.ip, 2.0 * JITTER_MS);
    let spec = |imp: &str| {
        format!(
            "  from: {{podSelector: {{matchLabels: {{app: client}}}}}}\n  to: {{podSelector: {{matchLabels: {{app: server}}}}}}\n\
             \x20 symmetric: true\n  impairment: {imp}\n"
        )
    };
    let link = f.link("lat", &spec("{latency: 40ms}"));
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(400));
    println!("40ms each way: {}", r.describe());
    within(
        "RTT p10, ms",
        r.ms("p10"),
        base.shifted_band(2.0 * LATENCY_MS, 2),
        "baseline p10..p90 + 80 ms + timer slack",
    );
    assert_eq!(r.count("lost"), 0, "a latency-only link lost probes: {}", r.describe());

    f.apply_link("lat", &spec(&format!("{{latency: {LATENCY_MS}ms, jitter: {JITTER_MS}ms}}")));
    f.ns.wait_link_applied("lat");
    let n = 1000.0;
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(n as u32));
    println!("{LATENCY_MS}ms ± {JITTER_MS}ms each way: {}", r.describe());
    let half = 2.0 * JITTER_MS;
    let spread = 2.0 * half * (1.0 - 0.2f64.sqrt());
    // The quantile's standard error: √(q(1−q)/n) over the triangular density at p90, √(2·0.1)/half; the spread's
    // is √2 times that. The baseline's own spread can only widen it.
    let se = (0.1f64 * 0.9 / n).sqrt() / ((2.0f64 * 0.1).sqrt() / half) * 2f64.sqrt();
    within(
        "RTT p90 - p10 with jitter, ms",
        r.ms("p90") - r.ms("p10"),
        (spread - SIGMAS * se, spread + SIGMAS * se + (base.p90 - base.p10)),
        "triangular ±40 ms: 44.2 ms ± 4.5 standard errors, plus the baseline's p10..p90 spread above",
    );
    drop(link);
}

/// Profile `lte`: uplink (client → server) 10 Mbit/s and 65 ms, downlink 50 Mbit/s and 50 ms. The round trip
/// pays both latencies; TCP goodput in each direction comes near its own rate.
pub fn asymmetric_profile_lte(f: &Fixture) {
    let base = Baseline::measure_quiet(&f.ns, &f.client.name, &f.server.ip, 50.0);
    let link = f.link(
        "lte",
        "  from: {podSelector: {matchLabels: {app: client}}}\n  to: {podSelector: {matchLabels: {app: server}}}\n  profile: lte\n",
    );
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(300));
    println!("lte: {}", r.describe());
    within("RTT p10, ms", r.ms("p10"), base.shifted_band(65.0 + 50.0, 2), "baseline + 65 ms up + 50 ms down");
    crate::scenarios::throughput::assert_rate("uplink client -> server, lte 10Mbit", 10e6, || {
        f.ns.throughput_bps(&f.client.name, &f.server.ip, 6.0)
    });
    crate::scenarios::throughput::assert_rate("downlink server -> client, lte 50Mbit", 50e6, || {
        f.ns.throughput_bps(&f.server.name, &f.client.ip, 6.0)
    });
    drop(link);
}

/// Traffic addressed to a destination's Service ClusterIP is impaired like traffic to the pod: the link adds the
/// ClusterIPs of Services that front only destination pods (`to.services: Matching`, the default).
pub fn service_traffic(f: &Fixture) {
    let base = Baseline::measure_quiet(&f.ns, &f.client.name, &f.server_service_ip, LATENCY_MS);
    let link = f.link("svc", &one_way_spec("client", "server", "{latency: 40ms}"));
    let r = f.ns.rtt_run(&f.client.name, &f.server_service_ip, RttRun::new(300));
    println!("to the ClusterIP {}: {}", f.server_service_ip, r.describe());
    within(
        "RTT p10 via the ClusterIP, ms",
        r.ms("p10"),
        base.shifted_band(LATENCY_MS, 1),
        "baseline via the ClusterIP + 40 ms",
    );
    let status = f.ns.json(&["get", "networklink", "svc"])["status"].clone();
    println!("status: {status}");
    drop(link);
}
