//! The agent's datapaths against a real kernel: each test installs destinations → impairments on `va` in
//! namespace `a` — through the tc tree (`Datapath::reconcile`) or, for a `.userspace` test, through the
//! userspace datapath (`super::emulator`) — sends bounded traffic to namespace `b` and checks what arrives.
//! iproute2 in the guest is the independent witness of what the kernel holds.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context, ensure};
use ipnet::IpNet;
use isthmus_agent_api::{Correlated, Impairment, ImpairmentFields, Percent};
use isthmus_datapaths::datapath::{Datapath, DesiredState, probe};

use super::expect;
use isthmus_datapaths::userspace::capture::POD_END;

use super::emulator::{Changes, Emulation};
use crate::harness::{Backend, Ctx, Outcome, Run, Test, Via};
use crate::netns::{Netns, SOURCE_IF, VethPair};
use crate::stats::{Summary, binomial_band};
use crate::traffic::{Bulk, CpuTimes, Stream, StreamResult, StreamSpec, UDP_L2_OVERHEAD, backlog_drops, stream};

mod destinations;
mod fidelity;

use destinations::{
    duplicate_restriction, head_of_line, latency_change_in_place, per_destination_independence, queue_limit_from_bdp,
};
use fidelity::{corrupt, delay, duplicate, jitter, loss_gilbert_elliott, loss_random, rate, reorder};

pub fn tests() -> Vec<Test> {
    let mut tests = vec![Test::tc("probe_capabilities", probe_capabilities)];
    // The fidelity tests, through the tc tree and through the userspace datapath (the parity table).
    let both: [(&'static str, &'static str, Run); 12] = [
        ("delay", "delay.userspace", delay),
        ("jitter", "jitter.userspace", jitter),
        ("loss_random", "loss_random.userspace", loss_random),
        ("loss_gilbert_elliott", "loss_gilbert_elliott.userspace", loss_gilbert_elliott),
        ("duplicate", "duplicate.userspace", duplicate),
        ("corrupt", "corrupt.userspace", corrupt),
        ("reorder", "reorder.userspace", reorder),
        ("rate", "rate.userspace", rate),
        ("per_destination_independence", "per_destination_independence.userspace", per_destination_independence),
        ("head_of_line", "head_of_line.userspace", head_of_line),
        ("latency_change_in_place", "latency_change_in_place.userspace", latency_change_in_place),
        ("queue_limit_from_bdp", "queue_limit_from_bdp.userspace", queue_limit_from_bdp),
    ];
    for (tc, userspace, run) in both {
        tests.extend([Test::tc(tc, run), Test::userspace(userspace, run)]);
    }
    tests.push(Test::tc("duplicate_restriction", duplicate_restriction));
    tests
}

fn host(ip: Ipv4Addr) -> IpNet {
    IpNet::from(IpAddr::V4(ip))
}

fn pct(v: f64) -> Percent {
    Percent::new("test", v).expect("a valid test percentage")
}

fn ms(v: u64) -> Option<Duration> {
    Some(Duration::from_millis(v))
}

fn chance(v: f64) -> Correlated {
    Correlated { percent: pct(v), correlation: Percent::ZERO }
}

pub(super) fn desired(destinations: &[(Ipv4Addr, ImpairmentFields)]) -> anyhow::Result<DesiredState> {
    let checked = destinations.iter().map(|(d, i)| Ok((host(*d), Impairment::try_from(i.clone())?)));
    Ok(DesiredState::new(checked.collect::<anyhow::Result<Vec<_>>>()?)?)
}

/// Opens the test's datapath (`ctx.via`) in namespace `a` and installs `destinations`; logs what it did and the
/// kernel's view. The userspace datapath ends when the returned emulation is dropped.
#[must_use = "the userspace datapath ends when its emulation is dropped"]
pub(super) fn install(
    ctx: &mut Ctx,
    pair: &VethPair,
    destinations: &[(Ipv4Addr, ImpairmentFields)],
) -> anyhow::Result<(Emulation, Changes)> {
    let emulation = Emulation::open(ctx, pair, ctx.via)?;
    let changes = emulation.reconcile(ctx, &desired(destinations)?).context("reconcile")?;
    ctx.log(format!("{:?} reconcile {destinations:?}: {changes:?}", ctx.via));
    ctx.log(format!("installed:\n{}", emulation.show(pair)?));
    Ok((emulation, changes))
}

/// The datapath's drop count for `destination`.
fn drops(ctx: &Ctx, dp: &Emulation, destination: Ipv4Addr) -> anyhow::Result<u64> {
    let counters = dp.counters(ctx)?;
    counters
        .iter()
        .find(|(d, _)| *d == host(destination))
        .map(|(_, c)| c.drops)
        .context("no counters for the destination")
}

pub(super) fn warm_up(pair: &VethPair, destination: Ipv4Addr, port: u16) -> anyhow::Result<()> {
    // resolves the neighbour, so no measured packet waits for ARP
    stream(pair, destination, port, &StreamSpec::new(3, Duration::from_millis(5), Duration::from_millis(100)))?;
    Ok(())
}

/// A stream through `dp`, with where its packets were lost beside it (the sender, the datapath by reason, the
/// guest's input backlog, the receiver's socket) and how busy the guest's CPU was meanwhile: a failed attempt's
/// log names the place of its losses.
fn measured_stream(
    ctx: &mut Ctx,
    dp: &Emulation,
    pair: &VethPair,
    destination: Ipv4Addr,
    port: u16,
    spec: &StreamSpec,
) -> anyhow::Result<(StreamResult, String)> {
    let (losses, backlog, cpu) = (dp.losses(ctx)?, backlog_drops()?, CpuTimes::now()?);
    let r = stream(pair, destination, port, spec)?;
    let busy = CpuTimes::now()?.busy_since(cpu);
    let (losses, backlog) = (dp.losses(ctx)? - losses, backlog_drops()? - backlog);
    let place = format!(
        "sender errors {}, datapath: {losses}, input backlog {backlog}, receiver socket {}; guest CPU busy {:.0} %",
        r.send_errors,
        r.receiver_drops,
        busy * 100.0
    );
    ctx.log(format!(
        "sent {} lost {} ({:.3} %) in {:.2} s; {place}",
        r.sent,
        r.lost(),
        r.loss_ratio() * 100.0,
        r.send_elapsed.as_secs_f64()
    ));
    Ok((r, place))
}

pub(super) fn spec(packets: u32, interval_us: u64, drain_ms: u64) -> StreamSpec {
    StreamSpec::new(packets, Duration::from_micros(interval_us), Duration::from_millis(drain_ms))
}

/// probe() reports what the kernel can do; its duplicate restriction agrees with what iproute2's tc meets in
/// the same kernel (the independent reference: which kernels refuse it is a property of their build, e.g. the
/// restriction was backported to 6.1.x, so no version rule could say it).
fn probe_capabilities(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let caps = ctx.runtime.block_on(probe());
    ctx.log(format!("probe(): {caps:?}"));
    ctx.record("capabilities", &caps);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?.trim().to_owned();
    ensure!(caps.kernel_release == release, "probe says kernel {:?}, the kernel says {release:?}", caps.kernel_release);
    ensure!(caps.htb && caps.tbf && caps.netem && caps.u32, "probe misses a capability this kernel has: {caps:?}");
    let tc_says = duplicate_restricted_per_tc()?;
    ctx.log(format!("tc: duplicating netem beside another netem is {}", if tc_says { "refused" } else { "accepted" }));
    ctx.summarize(format!("duplicate_restricted probe={} tc={tc_says}", caps.duplicate_restricted));
    ensure!(
        caps.duplicate_restricted == tc_says,
        "probe says duplicate_restricted={}, tc shows {tc_says}",
        caps.duplicate_restricted
    );
    Ok(Outcome::Pass)
}

fn duplicate_restricted_per_tc() -> anyhow::Result<bool> {
    let ns = Netns::create(format!("isth-dupprobe-{}", std::process::id()))?;
    ns.ip(&["link", "add", "d0", "type", "dummy"])?;
    ns.tc(&["qdisc", "add", "dev", "d0", "root", "handle", "1:", "prio"])?;
    ns.tc(&["qdisc", "add", "dev", "d0", "parent", "1:1", "handle", "10:", "netem", "delay", "1ms"])?;
    match ns.tc(&[
        "qdisc",
        "add",
        "dev",
        "d0",
        "parent",
        "1:2",
        "handle",
        "20:",
        "netem",
        "delay",
        "1ms",
        "duplicate",
        "1%",
    ]) {
        Ok(_) => Ok(false),
        Err(e) if format!("{e:#}").contains("cannot mix duplicating netems") => Ok(true),
        Err(e) => Err(e.into()),
    }
}
