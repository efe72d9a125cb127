//! Bandwidth beside latency: a long fat network, and a slow busy destination that must not hold up a fast one.

use std::time::Duration;

use isthmus_e2e::*;

use crate::bands::{Baseline, TIMER_SLACK_MS, within};
use crate::fixture::Fixture;

/// A shaped rate's TCP goodput: never more than 10 % above the payload ceiling (1448 B per 1514 B frame), and
/// within 15 % below it on one of up to three readings (slow start, a tail drop's retransmission timeout, a
/// sender starved of CPU on emulated nodes). Returns the accepted reading.
pub fn assert_rate(what: &str, rate_bps: f64, mut measure: impl FnMut() -> f64) -> f64 {
    let ceiling = expected_goodput_bps(rate_bps);
    let mut readings = Vec::new();
    for _ in 0..3 {
        let got = measure();
        readings.push(got);
        println!("{what}: {} ({:+.1} % of the {} ceiling)", mbit(got), (got / ceiling - 1.0) * 100.0, mbit(ceiling));
        assert!(got <= ceiling * 1.10, "{what}: {} is more than 10 % above {}", mbit(got), mbit(ceiling));
        if got >= ceiling * 0.85 {
            return got;
        }
    }
    panic!("{what}: every reading ({readings:?}) is more than 15 % below {}", mbit(ceiling));
}

/// 100 Mbit/s with 50 ms one way: a bandwidth-delay product of 625 kB. TCP with buffers raised by the pods' own
/// sysctls reaches at least 85 % of the payload ceiling: neither netem's queue (sized from the same product) nor
/// the token bucket's may be what limits it.
pub fn long_fat_network(f: &Fixture) {
    // A pair of its own: the socket buffer sysctls are set per pod.
    let sysctls = "[{name: net.ipv4.tcp_rmem, value: '4096 131072 16777216'}, {name: net.ipv4.tcp_wmem, value: '4096 65536 16777216'}]";
    for (app, node) in [("lfn-client", &f.n1), ("lfn-server", &f.n2)] {
        f.ns.apply(&probe_deployment_manifest(app, Some(node), Some(sysctls)));
    }
    let (client, _, _) = f.ns.wait_ready_pod("lfn-client");
    let (_, server_ip, _) = f.ns.wait_ready_pod("lfn-server");
    let link = f.one_way("lfn", "lfn-client", "lfn-server", "{bandwidth: 100Mbit, latency: 50ms}");
    let got = assert_rate("long fat network, 100Mbit + 50ms", 100e6, || f.ns.throughput_bps(&client, &server_ip, 8.0));
    println!("long fat network: {}", mbit(got));
    drop(link);
    f.ns.delete_deployments(&["lfn-client", "lfn-server"]);
}

/// The client keeps a 200 ms destination busy with TCP bulk while probing a 1 ms one: the 1 ms destination's
/// p90 stays near its own latency. (A classful root that serves destinations round-robin from their children
/// stalls every destination behind the slowest: p90 around 150 ms; see docs and the kernel rig's test.)
pub fn no_head_of_line_blocking(f: &Fixture) {
    // The same load without links: the round trip the busy client gets anyway on this machine.
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
    // What this test must tell apart is 1 ms from the ~150 ms p90 a blocked destination would see. The bulk
    // flow saturates the guest's one CPU, which spreads the loaded round trip more at some moments than others.
    let base = Baseline::quiet_for(150.0, || Baseline::of(&loaded(f)));
    let far = f.one_way("far", "client", "server", "{latency: 200ms}");
    let near = f.one_way("near", "client", "near", "{latency: 1ms}");
    let r = loaded(f);
    within(
        "1ms destination RTT p90 beside a busy 200ms one, ms",
        r.ms("p90"),
        (0.0, base.p90 + 1.0 + TIMER_SLACK_MS),
        "the loaded baseline's p90 + 1 ms + timer slack",
    );
    drop((far, near));
}
