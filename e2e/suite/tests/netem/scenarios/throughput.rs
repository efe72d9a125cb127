//! Bandwidth beside latency: a long fat network, and a slow busy destination beside a fast one.

use std::time::Duration;

use isthmus_e2e::verdict::{at_least, at_most, report};
use isthmus_e2e::*;

use crate::bands::{Baseline, TIMER_SLACK_MS, delay_floor};
use crate::fixture::{Fixture, Pod, assert_shaped};

/// A shaped rate's TCP goodput `got`: never more than 10 % above the payload ceiling (1448 B per 1514 B frame;
/// the 10 % is the token bucket's burst and the reading's edges), a gate. How near it comes from below is a
/// report: a sender on an emulated node gets what CPU the machine has left (`make fidelity`, and the stock-kernel
/// rig, where the same tree's goodput is held to a two-sided band).
pub fn assert_capped(what: &str, rate_bps: f64, got: f64) {
    let ceiling = expected_goodput_bps(rate_bps);
    println!("{what}: {} ({:+.1} % of the {} ceiling)", mbit(got), (got / ceiling - 1.0) * 100.0, mbit(ceiling));
    at_most(&format!("{what}, Mbit/s"), got / 1e6, ceiling * 1.10 / 1e6, "never above the payload ceiling + 10 %");
    report(
        &format!("{what}, Mbit/s"),
        got / 1e6,
        (ceiling * 0.85 / 1e6, ceiling * 1.10 / 1e6),
        "within 15 % below the payload ceiling",
    );
}

/// 100 Mbit/s with 50 ms one way: a bandwidth-delay product of 625 kB. The tree on the node says so, TCP never
/// gets more than the rate, and (a report) with buffers raised by the pods' own sysctls reaches 85 % of it:
/// neither netem's queue (sized from the same product) nor the token bucket's may be what limits it.
pub fn long_fat_network(f: &Fixture) {
    // A pair of its own: the socket buffer sysctls are set per pod.
    let sysctls = "[{name: net.ipv4.tcp_rmem, value: '4096 131072 16777216'}, {name: net.ipv4.tcp_wmem, value: '4096 65536 16777216'}]";
    for (app, node) in [("lfn-client", &f.n1), ("lfn-server", &f.n2)] {
        f.ns.apply(&probe_deployment_manifest(app, Some(node), Some(sysctls)));
    }
    let pod = |app: &str| {
        let (name, ip, node) = f.ns.wait_ready_pod(app);
        Pod { name, ip, node }
    };
    let (client, server) = (pod("lfn-client"), pod("lfn-server"));
    let link = f.one_way("lfn", "lfn-client", "lfn-server", "{bandwidth: 100Mbit, latency: 50ms}");
    assert_shaped(&client, &[("tbf", "rate 100Mbit"), ("netem", "delay 50ms")]);
    assert_capped("long fat network, 100Mbit + 50ms", 100e6, f.ns.throughput_bps(&client.name, &server.ip, 8.0));
    drop(link);
    f.ns.delete_deployments(&["lfn-client", "lfn-server"]);
}

/// The client keeps a 200 ms destination busy with TCP bulk while probing a 1 ms one. Each destination has its
/// own place in the pod's tree (read on the node), and the 1 ms one's round trips carry its own delay. That they
/// carry nothing of the 200 ms one's (a classful root that serves destinations round-robin from their children
/// stalls every destination behind the slowest: a p90 around 150 ms) is a two-sided figure, the p90 beside the
/// same load: a report here, a gate in the stock-kernel rig (`head_of_line`, through both datapaths, and the
/// DRR regression), where nothing else shares the CPU.
pub fn no_head_of_line_blocking(f: &Fixture) {
    let loaded = |f: &Fixture| {
        std::thread::scope(|s| {
            let bulk = s.spawn(|| f.ns.throughput_bps(&f.client.name, &f.server.ip, 8.0));
            std::thread::sleep(Duration::from_secs(2));
            let r = f.ns.rtt_run(&f.client.name, &f.near.ip, RttRun::new(400));
            let bps = bulk.join().expect("the bulk transfer");
            println!("while {} flowed to the far destination: {}", mbit(bps), r.describe());
            r
        })
    };
    // The loaded baseline: the 1 ms destination's round trip beside the same bulk through the far link, before the
    // near link exists. The node's work for the bulk is in both readings, so the band holds only what sharing the
    // pod's datapath with the busy destination costs.
    let far = f.one_way("far", "client", "server", "{latency: 200ms}");
    let loaded_base = Baseline::of(&loaded(f));
    let near = f.one_way("near", "client", "near", "{latency: 1ms}");
    assert_shaped(&f.client, &[("netem", "delay 200ms"), ("netem", "delay 1ms")]);
    let r = loaded(f);
    at_least(
        "1ms destination RTT p10 beside a busy 200ms one, ms",
        r.ms("p10"),
        delay_floor(1.0),
        "1 ms: netem releases nothing early",
    );
    report(
        "1ms destination RTT p90 beside a busy 200ms one, ms",
        r.ms("p90"),
        (delay_floor(1.0), loaded_base.p90 + 1.0 + TIMER_SLACK_MS),
        "the p90 beside the same bulk before the near link + 1 ms + timer slack",
    );
    drop((far, near));
}
