//! Self-measurement: what a link's own probes report (`status.measured`, the `Conformant` condition) next to
//! isthmus-probe's measurement of the same pair, and the condition following the kernel when the impairment is
//! taken away behind the agent's back and put back by the agent's resync.
//!
//! Gates: the state the product reports (a measurement from ICMP echo, `Conformant=True` in some window, `False`
//! with reason `Faster` while the tree is kept away, `True` again and the tree back after the resync), a round
//! trip no shorter than the configured one less its sampling error (netem never delivers early), and the loss
//! within its binomial band (a busy machine delays probes, it does not drop them: a probe is lost after a second
//! and more). The agreement of the two medians is a report: both move with the machine's load.

use std::time::{Duration, Instant};

use isthmus_e2e::verdict::{at_least, report, within};
use isthmus_e2e::*;

use crate::bands::{Baseline, EARLY_MS, SIGMAS, TIMER_SLACK_MS, proportion_band};
use crate::fixture::Fixture;

const LATENCY_MS: f64 = 40.0;
const JITTER_MS: f64 = 10.0;
const LOSS: f64 = 0.05;
/// How often the agents resync in the suite's install (`agent.resyncSeconds`, set by e2e/suite/run).
const RESYNC: Duration = Duration::from_secs(10);
/// isthmus-probe's probes for the comparison, 5 ms apart (as the loss scenarios send them).
const PROBES: u32 = 2000;

/// How long the status takes to describe a change: the window in which it happened may be mixed, so the next
/// complete one and its probes' timeouts, plus the operator's poll and write (the e2e install polls every 3 s;
/// see e2e/suite/run).
fn settle(window: Duration) -> Duration {
    2 * window + Duration::from_secs(10)
}

fn window_of(m: &Measured) -> Duration {
    let s = m.raw["window"].as_str().unwrap_or_else(|| panic!("no window in {}", m.raw));
    Duration::from_secs_f64(parse_ms(s).unwrap_or_else(|| panic!("window {s}")) / 1e3)
}

/// Waits until `Conformant` reads `status` with `reason`, for up to `limit`. The condition is judged anew at
/// every window, each with a 99 % interval on the loss, so a conformant link reads `Lossier` or `LessLossy` in
/// about one window in fifty: the wait is for the state, not for its first window.
fn wait_conformant(f: &Fixture, link: &str, status: &str, reason: &str, limit: Duration) -> String {
    let what = format!("{link} Conformant={status} ({reason})");
    wait_for(&what, limit, || f.ns.link_condition(link, "Conformant").filter(|c| c.0 == status && c.1 == reason)).2
}

/// 40 ms ± 10 ms and 5 % loss each way. The link's own probes (ICMP echo from inside the client pod, the
/// baseline from its node) report the added round trip and the loss, and the link says it conforms; isthmus-probe
/// (UDP, from the same pod to the same server) measures the same. Then the client's tree is removed behind the
/// agent's back, as a tool fighting isthmus would, until the status says the link is `Faster`; left alone, the
/// agent's resync puts the tree back and the link conforms again.
pub fn measured_follows_the_link(f: &Fixture) {
    let before = Baseline::quiet_run(&f.ns, &f.client.name, &f.server.ip);
    let base = Baseline::of(&before);
    let since = Instant::now();
    let link = f.link(
        "measured",
        &format!(
            "  from: {{podSelector: {{matchLabels: {{app: client}}}}}}\n  to: {{podSelector: {{matchLabels: {{app: server}}}}}}\n\
             \x20 symmetric: true\n  impairment: {{latency: {LATENCY_MS}ms, jitter: {JITTER_MS}ms, loss: {{percent: {}%}}}}\n",
            LOSS * 100.0
        ),
    );
    let first = wait_for("measured forward", Duration::from_secs(120), || Measured::of(&f.ns, "measured", "forward"));
    let window = window_of(&first);
    // The first windows may have begun before the link was in force: wait for one that began after it.
    std::thread::sleep(settle(window).saturating_sub(since.elapsed()));
    let message = wait_conformant(f, "measured", "True", "Conformant", 2 * settle(window));
    println!("Conformant=True {:.0?} after the apply: {message}", since.elapsed());
    let m = Measured::of(&f.ns, "measured", "forward").expect("a conformant link has its measurement");
    println!("status.measured.forward: {}", m.raw);
    assert_eq!(m.probe.as_deref(), Some("IcmpEcho"), "the kernel answers echo requests: {}", m.raw);
    assert!(m.pairs >= 1 && m.samples > 0, "nothing probed: {}", m.raw);

    // The added round trip: 80 ms, a median of the sum of two uniforms on ±10 ms (triangular, density 1/20 per
    // ms at its middle), so its standard error is 10/√n ms.
    let se = |n: f64| JITTER_MS / n.max(1.0).sqrt();
    let rtt_p50 = m.rtt_p50_ms.expect("rttP50");
    at_least(
        "status's RTT p50, ms",
        rtt_p50,
        2.0 * LATENCY_MS - SIGMAS * se(m.samples as f64) - EARLY_MS,
        "the configured 80 ms less 4.5 standard errors of the median: no path is shorter than nothing",
    );
    // Loss: a probe is lost when its request or its answer is, 1 − 0.95² = 9.75 %, plus the path's own.
    let p = 1.0 - (1.0 - LOSS).powi(2) + base.loss;
    let status_loss = m.loss.expect("a measured loss");
    within("status's loss ratio", status_loss, proportion_band(p, m.samples as f64, 1.0), "9.75 %, ±4.5 σ binomial");

    let r = f.clean_run("isthmus-probe under the link", RttRun::new(PROBES).interval_ms(5));
    let probe_added = r.ms("p50") - before.ms("p50");
    let answered = (r.count("sent") - r.count("lost")) as f64;
    let band = SIGMAS * (se(m.samples as f64).powi(2) + se(answered).powi(2)).sqrt()
        + (base.p90 - base.p10)
        + 2.0 * TIMER_SLACK_MS;
    report(
        "status's added RTT, ms",
        m.added_ms(),
        (probe_added - band, probe_added + band),
        "isthmus-probe's added RTT ± 4.5 SE of both medians, the baseline's spread and 2 hops of timer slack",
    );
    report(
        "status's added RTT, ms",
        m.added_ms(),
        (2.0 * LATENCY_MS - band, 2.0 * LATENCY_MS + band),
        "the configured 80 ms, same band",
    );
    within("isthmus-probe's loss ratio", r.path_loss_ratio(), proportion_band(p, r.path_sent() as f64, 1.0), "same");

    // A window counts only once complete, so only a removal that outlasts one can be seen, while the resync puts
    // the tree back at a moment of its own (up to RESYNC after a removal): a loop on the node keeps removing it
    // until the status says so.
    let removed = Instant::now();
    let limit = 2 * settle(window);
    let away = KeptAway::start(&f.client.node, &f.client.ip, limit + Duration::from_secs(30));
    let faster = wait_for("Conformant=False (Faster) while the tree is kept away", limit, || {
        f.ns.link_condition("measured", "Conformant").filter(|c| c.0 == "False" && c.1 == "Faster")
    });
    let removals = away.removals();
    drop(away);
    println!(
        "Conformant=False (Faster) after {:.1?}, the tree removed {removals} time(s): {}",
        removed.elapsed(),
        faster.2
    );
    let left = Instant::now();
    let message = wait_conformant(f, "measured", "True", "Conformant", RESYNC + 2 * settle(window));
    println!("Conformant=True again {:.1?} after the tree was left alone: {message}", left.elapsed());
    assert_isthmus_installed(&f.client.node, &f.client.ip);
    drop(link);
}
