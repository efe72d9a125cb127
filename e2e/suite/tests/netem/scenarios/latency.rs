//! Delay: a symmetric latency with and without jitter, an asymmetric access profile, and traffic to a Service.

use isthmus_e2e::verdict::{at_least, at_most, report};
use isthmus_e2e::*;

use crate::bands::{Baseline, SIGMAS, delay_floor};
use crate::fixture::{Fixture, assert_shaped, one_way_spec};

const LATENCY_MS: f64 = 40.0;
const JITTER_MS: f64 = 20.0;

/// 40 ms one way in both directions: every round trip takes at least 80 ms. With ±20 ms of
/// jitter on each direction (uniform), the round trip's extra delay is 80 ms plus the sum of two uniforms:
/// triangular on ±40 ms, whose p10 is 80 − 22.1 ms and whose p10–p90 spread is 2 · 40 · (1 − √0.2) = 44.2 ms.
pub fn latency_and_jitter(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let spec = |imp: &str| {
        format!(
            "  from: {{podSelector: {{matchLabels: {{app: client}}}}}}\n  to: {{podSelector: {{matchLabels: {{app: server}}}}}}\n\
             \x20 symmetric: true\n  impairment: {imp}\n"
        )
    };
    let link = f.link("lat", &spec("{latency: 40ms}"));
    assert_shaped(&f.client, &[("netem", "delay 40ms")]);
    assert_shaped(&f.server, &[("netem", "delay 40ms")]);
    let r = f.clean_run("40ms each way", RttRun::new(400));
    at_least("RTT p10, ms", r.ms("p10"), delay_floor(2.0 * LATENCY_MS), "80 ms: netem releases nothing early");
    report(
        "RTT p10, ms",
        r.ms("p10"),
        base.shifted_band(2.0 * LATENCY_MS, 2),
        "baseline p10..p90 + 80 ms + timer slack",
    );
    at_most("probes lost to a latency-only link", r.path_lost() as f64, 0.0, "latency drops nothing");

    f.apply_link("lat", &spec(&format!("{{latency: {LATENCY_MS}ms, jitter: {JITTER_MS}ms}}")));
    f.ns.wait_link_applied("lat");
    assert_shaped(&f.client, &[("netem", "delay 40ms 20ms")]);
    let n = 1000.0;
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(n as u32));
    println!("{LATENCY_MS}ms ± {JITTER_MS}ms each way: {}", r.describe());
    let half = 2.0 * JITTER_MS;
    // The triangular density at its p10 (and p90) is √(2·0.1)/half; a quantile's standard error is
    // √(q(1−q)/n) over it.
    let density = (2.0f64 * 0.1).sqrt() / half;
    let se_quantile = (0.1f64 * 0.9 / n).sqrt() / density;
    let p10_extra = 2.0 * LATENCY_MS - half * (1.0 - 0.2f64.sqrt());
    at_least(
        "RTT p10 with jitter, ms",
        r.ms("p10"),
        delay_floor(p10_extra) - SIGMAS * se_quantile,
        "80 ms − 22.1 ms (the triangular's p10), less 4.5 standard errors",
    );
    // Without jitter no round trip comes in under 80 ms; with it, one in eight has 20 ms less added
    // (P(T < −20 ms) = 20²/(2·40²)): about 125 of 1,000, every one of which load would have to slow by 20 ms less
    // its path's own round trip.
    at_most(
        "fastest RTT with jitter, ms",
        r.ms("min"),
        delay_floor(2.0 * LATENCY_MS),
        "jitter brings round trips under the 80 ms that bounds every un-jittered one",
    );
    let spread = 2.0 * half * (1.0 - 0.2f64.sqrt());
    let se = se_quantile * 2f64.sqrt();
    report(
        "RTT p90 - p10 with jitter, ms",
        r.ms("p90") - r.ms("p10"),
        (spread - SIGMAS * se, spread + SIGMAS * se + (base.p90 - base.p10)),
        "triangular ±40 ms: 44.2 ms ± 4.5 standard errors, plus the baseline's p10..p90 spread above",
    );
    drop(link);
}

/// Profile `lte`: uplink (client → server) 10 Mbit/s and 65 ms, downlink 50 Mbit/s and 50 ms. The round trip
/// pays both latencies; TCP never gets more than a direction's rate, and (a report) comes near it.
pub fn asymmetric_profile_lte(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let link = f.link(
        "lte",
        "  from: {podSelector: {matchLabels: {app: client}}}\n  to: {podSelector: {matchLabels: {app: server}}}\n  profile: lte\n",
    );
    assert_shaped(&f.client, &[("tbf", "rate 10Mbit"), ("netem", "delay 65ms")]);
    assert_shaped(&f.server, &[("tbf", "rate 50Mbit"), ("netem", "delay 50ms")]);
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(300));
    println!("lte: {}", r.describe());
    at_least("RTT p10, ms", r.ms("p10"), delay_floor(65.0 + 50.0), "65 ms up + 50 ms down");
    report("RTT p10, ms", r.ms("p10"), base.shifted_band(65.0 + 50.0, 2), "baseline + 65 ms up + 50 ms down");
    use crate::scenarios::throughput::assert_capped;
    assert_capped("uplink client -> server, lte 10Mbit", 10e6, f.ns.throughput_bps(&f.client.name, &f.server.ip, 6.0));
    assert_capped(
        "downlink server -> client, lte 50Mbit",
        50e6,
        f.ns.throughput_bps(&f.server.name, &f.client.ip, 6.0),
    );
    drop(link);
}

/// Traffic addressed to a destination's Service ClusterIP is impaired like traffic to the pod: the link adds the
/// ClusterIPs of Services that front only destination pods (`to.services: Matching`, the default).
pub fn service_traffic(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server_service_ip);
    let link = f.link("svc", &one_way_spec("client", "server", "{latency: 40ms}"));
    let r = f.ns.rtt_run(&f.client.name, &f.server_service_ip, RttRun::new(300));
    println!("to the ClusterIP {}: {}", f.server_service_ip, r.describe());
    at_least("RTT p10 via the ClusterIP, ms", r.ms("p10"), delay_floor(LATENCY_MS), "40 ms");
    report(
        "RTT p10 via the ClusterIP, ms",
        r.ms("p10"),
        base.shifted_band(LATENCY_MS, 1),
        "baseline via the ClusterIP + 40 ms",
    );
    let status = f.ns.json(&["get", "networklink", "svc"])["status"].clone();
    println!("status: {status}");
    drop(link);
}
