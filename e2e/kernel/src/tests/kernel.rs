//! Checks of the guest kernel and of the rig itself, independent of the datapath library: the modules are
//! loaded, iproute2 can build every object the datapath uses, and the measurement code reads a known tree
//! (installed by `tc`) correctly. When one of these fails, datapath failures on the same kernel mean little.

use std::time::Duration;

use anyhow::{Context, ensure};

use super::expect;
use crate::harness::{Backend, Ctx, Outcome, Test};
use crate::netns::{Netns, SOURCE_IF, VethPair};
use crate::traffic::{StreamSpec, stream};

pub fn tests() -> Vec<Test> {
    vec![
        Test::tc("kernel_modules_loaded", kernel_modules_loaded),
        Test::tc("kernel_objects_iproute2", kernel_objects_iproute2),
        Test::tc("baseline_no_qdisc", baseline_no_qdisc),
        Test::tc("reference_tree_iproute2", reference_tree_iproute2),
    ]
}

/// Every module the rig put into the initramfs (its /modules/load.order) is live in the kernel.
fn kernel_modules_loaded(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let Ok(order) = std::fs::read_to_string("/modules/load.order") else {
        return Ok(Outcome::Skip("not in the rig's guest (no /modules/load.order)".into()));
    };
    let live = std::fs::read_to_string("/proc/modules").context("reading /proc/modules")?;
    let live: Vec<&str> = live.lines().filter_map(|l| l.split_whitespace().next()).collect();
    let wanted: Vec<String> = order.lines().map(|m| m.trim_end_matches(".ko").replace('-', "_")).collect();
    let missing: Vec<&String> = wanted.iter().filter(|m| !live.contains(&m.as_str())).collect();
    ctx.log(format!("kernel {}: wanted {wanted:?}", ctx.kernel));
    ctx.record("modules", &wanted);
    ctx.summarize(format!("{} modules live", wanted.len() - missing.len()));
    ensure!(missing.is_empty(), "modules not loaded: {missing:?}");
    Ok(Outcome::Pass)
}

/// iproute2 builds each kind of object the datapath may install, on a dummy device in a scratch namespace.
fn kernel_objects_iproute2(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let ns = Netns::create(format!("isth-objects-{}", std::process::id()))?;
    ns.ip(&["link", "add", "d0", "type", "dummy"])?;
    ns.ip(&["link", "set", "d0", "up"])?;
    let steps: &[&[&str]] = &[
        &["qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb", "default", "1"],
        &["class", "add", "dev", "d0", "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit"],
        &["class", "add", "dev", "d0", "parent", "1:", "classid", "1:2", "htb", "rate", "10gbit"],
        &[
            "qdisc", "add", "dev", "d0", "parent", "1:2", "handle", "10:", "tbf", "rate", "10mbit", "burst", "32kb",
            "latency", "400ms",
        ],
        &[
            "qdisc", "add", "dev", "d0", "parent", "10:1", "handle", "20:", "netem", "delay", "10ms", "1ms", "loss",
            "1%",
        ],
        &[
            "filter",
            "add",
            "dev",
            "d0",
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "dst",
            "10.9.0.2/32",
            "flowid",
            "1:2",
        ],
        &[
            "filter", "add", "dev", "d0", "parent", "1:", "protocol", "ip", "prio", "2", "flower", "dst_ip",
            "10.9.0.3", "classid", "1:2",
        ],
        &["filter", "add", "dev", "d0", "parent", "1:", "protocol", "all", "prio", "3", "matchall", "classid", "1:1"],
        &["qdisc", "del", "dev", "d0", "root"],
        &["qdisc", "add", "dev", "d0", "root", "handle", "1:", "drr"],
        &["qdisc", "replace", "dev", "d0", "root", "handle", "2:", "prio"],
        &["qdisc", "del", "dev", "d0", "root"],
    ];
    for step in steps {
        let out = ns.tc(step).with_context(|| format!("tc {}", step.join(" ")))?;
        ctx.log(format!("ok: tc {} {}", step.join(" "), out.trim()));
    }
    ctx.summarize("htb tbf netem u32 flower matchall drr prio: all accepted");
    Ok(Outcome::Pass)
}

fn probe_spec() -> StreamSpec {
    StreamSpec::new(300, Duration::from_millis(5), Duration::from_millis(300))
}

/// The veth path without any qdisc: the base one-way delay the other tests' tolerances sit on.
fn baseline_no_qdisc(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("baseline", 1)?;
    let dst = pair.destinations[0];
    ctx.with_retries("baseline", |ctx| {
        let r = stream(&pair, dst, 7000, &probe_spec())?;
        let d = r.delay()?;
        ctx.record("delay_ms", d);
        ctx.log(format!(
            "one-way delay without qdisc: {d}; lost {} dup {} corrupt {} send errors {}",
            r.lost(),
            r.duplicates(),
            r.corrupted,
            r.send_errors
        ));
        ctx.summarize(format!("base p50 {:.3} ms mean {:.3} ms p90 {:.3} ms", d.p50, d.mean, d.p90));
        let limit = if ctx.backend == Backend::QemuTcg { 3.0 } else { 1.0 };
        ensure!(
            r.lost() == 0 && r.duplicates() == 0 && r.corrupted == 0,
            "an unimpaired path lost {}, duplicated {}, corrupted {}",
            r.lost(),
            r.duplicates(),
            r.corrupted
        );
        ensure!(d.p50 <= limit, "base median one-way delay {:.3} ms is above {limit} ms", d.p50);
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// The research's tree installed by `tc` (HTB → TBF → netem 20 ms, u32 on the destination, catch-all): shows
/// the rig measures a known configuration correctly, whatever state the datapath library is in.
fn reference_tree_iproute2(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("reference", 1)?;
    let dst = pair.destinations[0].to_string();
    let d = SOURCE_IF;
    for step in [
        vec!["qdisc", "add", "dev", d, "root", "handle", "1:", "htb", "default", "2"],
        vec!["class", "add", "dev", d, "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit"],
        vec!["class", "add", "dev", d, "parent", "1:", "classid", "1:2", "htb", "rate", "10gbit"],
        vec![
            "qdisc", "add", "dev", d, "parent", "1:1", "handle", "10:", "tbf", "rate", "100mbit", "burst", "32kb",
            "latency", "400ms",
        ],
        vec!["qdisc", "add", "dev", d, "parent", "10:1", "handle", "20:", "netem", "delay", "20ms"],
        vec![
            "filter",
            "add",
            "dev",
            d,
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "dst",
            &format!("{dst}/32"),
            "flowid",
            "1:1",
        ],
    ] {
        pair.a.tc(&step)?;
    }
    ctx.with_retries("reference", |ctx| {
        let r = stream(&pair, pair.destinations[0], 7001, &probe_spec())?;
        let s = r.delay()?;
        ctx.record("delay_ms", s);
        expect::delay_and_mean_near(ctx, "netem 20ms via tc", &s, 20.0, 0.0)?;
        ensure!(r.lost() == 0, "lost {} of {} packets with no loss configured", r.lost(), r.sent);
        Ok(())
    })?;
    ctx.log(pair.tc_show("qdisc")?);
    Ok(Outcome::Pass)
}
