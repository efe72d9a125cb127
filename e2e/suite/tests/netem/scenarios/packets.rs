//! Duplication, corruption and reordering, counted at the receiver: duplicates and reordering by the probes'
//! sequence numbers, corruption by the destination pod's own checksum counters; and the kernel-dependent
//! restriction on duplicating netems.

use isthmus_e2e::verdict::{at_least, at_most, report, within};
use isthmus_e2e::*;
use isthmus_test_kit::stats::median;

use crate::bands::{Baseline, delay_floor, proportion_band};
use crate::fixture::{Fixture, one_way_spec, wait_condition};

const PROBES: u32 = 2000;

/// 10 % of the requests are duplicated: the echo answers each copy, and the prober counts the extra copies.
/// The link leaves the Service's ClusterIP out (`services: Ignore`): as a second destination it would be a second
/// duplicating netem on the client's interface, which some kernels refuse (the last scenario tests that).
pub fn duplication(f: &Fixture) {
    let spec = one_way_spec("client", "server", "{duplicate: {percent: 10%}}").replace(
        "  to: {podSelector: {matchLabels: {app: server}}}",
        "  to: {podSelector: {matchLabels: {app: server}}, services: Ignore}",
    );
    let link = f.link("dup", &spec);
    let r = f.clean_run("10% duplicate", RttRun::new(PROBES).interval_ms(5));
    let received = r.count("received") as f64;
    within(
        "duplicates per received probe",
        r.count("duplicates") as f64 / received,
        proportion_band(0.10, received, 1.0),
        "10 %, ±4.5 σ binomial",
    );
    // A clean run: no full buffer dropped anything, so every lost probe was lost on the path, which loses none.
    assert_eq!(r.path_lost(), 0, "duplication lost probes: {}", r.describe());
    drop(link);
}

/// 10 % of the requests get one bit flipped somewhere in their 1,042-byte frame (1,000 bytes of payload). With the
/// UDP checksum on, a corrupted datagram never reaches the destination pod in a cluster: the sending node's
/// connection tracking finds the checksum wrong and kube-proxy's rules drop it as INVALID. So the probes go
/// without a checksum: a flip in the probe's padding (976 of the 1,042 bytes) reaches the echo and comes back,
/// where the prober finds the padding changed; one in the headers loses the probe. A probe or echo dropped by a
/// full socket buffer while its pod waited for a CPU (1,000-byte datagrams fill one sooner than the 64-byte ones
/// of the other scenarios) is the machine's doing, counted by the pods' kernels, and left out.
pub fn corruption(f: &Fixture) {
    let link = f.one_way("corrupt", "client", "server", "{corrupt: {percent: 10%}}");
    let r = f.rtt_counted(&f.server, RttRun::new(PROBES).interval_ms(5).size(1000).no_udp_checksum());
    println!("10% corrupt: {}", r.describe());
    let n = r.path_sent() as f64;
    within(
        "corrupted echoes per probe",
        r.count("corrupted") as f64 / n,
        proportion_band(0.10 * 976.0 / 1042.0, n, 1.0),
        "10 % × 976/1042 (the padding's share of the frame), ±4.5 σ binomial, over the probes no full buffer dropped",
    );
    within(
        "corrupted or lost per probe",
        (r.count("corrupted") + r.path_lost()) as f64 / n,
        proportion_band(0.10, n, 1.0),
        "every flip corrupts the echo or loses the probe: 10 %, ±4.5 σ binomial, same probes",
    );
    drop(link);
}

/// 50 ms of latency, 25 % of packets sent at once instead: a quarter of the round trips miss the 50 ms, and those
/// overtake earlier probes still in the delay line. A round trip under 50 ms cannot have been delayed, but load
/// can slow an undelayed one past 50 ms (stop 37's CI counted 18.7 % on an emulated node whose unimpaired p90 was
/// 32 ms): the share under 50 ms is a gate from above only, and a report around 25 %; the stock-kernel rig,
/// which times each direction, gates it from both sides (`reorder`).
pub fn reordering(f: &Fixture) {
    let base = Baseline::measure(&f.ns, &f.client.name, &f.server.ip);
    let link = f.one_way("reorder", "client", "server", "{latency: 50ms, reorder: {percent: 25%}}");
    let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(PROBES).interval_ms(5).samples());
    println!("50ms, 25% reordered: {}", r.describe());
    let rtts: Vec<f64> = r.samples().iter().filter_map(|s| s.1).collect();
    let n = rtts.len() as f64;
    let delayed: Vec<f64> = rtts.iter().copied().filter(|&rtt| rtt >= delay_floor(50.0)).collect();
    let undelayed = n - delayed.len() as f64;
    let band = proportion_band(0.25, n, 1.0);
    at_most("share of round trips under 50 ms", undelayed / n, band.1, "25 % + 4.5 σ binomial: no more skip it");
    report("share of round trips under 50 ms", undelayed / n, band, "25 %, ±4.5 σ binomial, on a quiet machine");
    report("delayed round trips' median, ms", median(&delayed), base.shifted_band(50.0, 1), "baseline + 50 ms");
    // A probe every 5 ms and a 50 ms delay: every undelayed probe overtakes the (about seven) delayed ones ahead of
    // it in the delay line, unless the one before it was undelayed too.
    at_least(
        "arrivals out of order per undelayed round trip",
        r.count("reordered") as f64 / undelayed.max(1.0),
        0.5,
        "each undelayed probe overtakes those in the delay line",
    );
    drop(link);
}

/// A duplicating destination beside another netem destination on one pod: kernels that refuse the combination
/// (Debian bookworm's 6.1 among them, by a backport) make the pod's tree fail with `DuplicateRestriction` in the
/// links' status; the others apply both and each is measured. The userspace datapath has no such restriction.
/// `dupl` leaves the Service's ClusterIP out, so that it alone is one duplicating netem and the refusal can only
/// come from `plain` beside it; the refusal is then read from both links, each condition and its `failures` from
/// one read of the link (CI of c600f72: with the ClusterIP, `dupl` alone was refused, and the plan that added
/// `plain` turned its status back to Pending between the condition's read and the failures').
pub fn duplicate_restriction_follows_the_kernel(f: &Fixture) {
    let restricted = datapath() == Datapath::Tc && node_restricts_duplicate_netem(&f.n1);
    println!(
        "{} ({:?} datapath): a duplicating destination beside others {}",
        f.n1,
        datapath(),
        if restricted { "refused (iproute2 on the node meets the restriction)" } else { "accepted" }
    );
    // Measured before the links, used only where the kernel lets both destinations work.
    let base = (!restricted).then(|| Baseline::measure(&f.ns, &f.client.name, &f.near.ip));
    let dupl_spec = one_way_spec("client", "server", "{latency: 5ms, duplicate: {percent: 10%}}").replace(
        "  to: {podSelector: {matchLabels: {app: server}}}",
        "  to: {podSelector: {matchLabels: {app: server}}, services: Ignore}",
    );
    let _dupl = f.link_unchecked("dupl", &dupl_spec);
    let _plain = f.link_unchecked("plain", &one_way_spec("client", "near", "{latency: 10ms}"));
    if restricted {
        for link in ["plain", "dupl"] {
            let status = wait_condition(&f.ns, link, "Degraded", "True", "DuplicateRestriction");
            let failure = status["failures"].as_array().and_then(|v| v.first()).cloned().unwrap_or_default();
            println!("{link}: Degraded, DuplicateRestriction: {}", failure["message"]);
            assert_eq!(failure["reason"], "DuplicateRestriction", "{link}: status.failures: {status}");
            assert!(
                failure["message"].as_str().unwrap_or_default().contains("duplicating"),
                "{link}: the failure lost the kernel's words: {status}"
            );
        }
    } else {
        f.ns.wait_link_applied("dupl");
        f.ns.wait_link_applied("plain");
        let r = f.ns.rtt_run(&f.client.name, &f.server.ip, RttRun::new(PROBES).interval_ms(5));
        within(
            "duplicates per received probe",
            r.count("duplicates") as f64 / r.count("received") as f64,
            proportion_band(0.10, r.count("received") as f64, 1.0),
            "10 %, ±4.5 σ binomial",
        );
        let near = f.ns.rtt_run(&f.client.name, &f.near.ip, RttRun::new(300));
        let base = base.expect("measured on an unrestricted kernel");
        at_least(
            "RTT p10 to the plain destination, ms",
            near.ms("p10"),
            delay_floor(10.0),
            "10 ms: netem releases nothing early",
        );
        report("RTT p10 to the plain destination, ms", near.ms("p10"), base.shifted_band(10.0, 1), "baseline + 10 ms");
    }
}
