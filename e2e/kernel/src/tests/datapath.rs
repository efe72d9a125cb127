//! The agent's datapaths against a real kernel: each test installs destinations → impairments on `va` in
//! namespace `a` — through the tc tree (`Datapath::reconcile`) or, for a `.userspace` test, through the
//! userspace datapath (`super::emulator`) — sends bounded traffic to namespace `b` and checks what arrives.
//! iproute2 in the guest is the independent witness of what the kernel holds.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use anyhow::{Context, ensure};
use ipnet::IpNet;
use isthmus_agent::datapath::{Datapath, DesiredState, probe};
use isthmus_agent_api::{Correlated, Impairment, ImpairmentFields, Loss, Percent, PodErrorKind, Reorder};

use super::expect;
use isthmus_agent::userspace::capture::POD_END;

use super::emulator::{Changes, Emulation};
use crate::harness::{Backend, Ctx, Outcome, Run, Test, Via};
use crate::netns::{Link, Netns, SOURCE_IF};
use crate::stats::{Summary, binomial_band};
use crate::traffic::{Bulk, CpuTimes, Stream, StreamResult, StreamSpec, UDP_L2_OVERHEAD, backlog_drops, stream};

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
    link: &Link,
    destinations: &[(Ipv4Addr, ImpairmentFields)],
) -> anyhow::Result<(Emulation, Changes)> {
    let emulation = Emulation::open(ctx, link, ctx.via)?;
    let changes = emulation.reconcile(ctx, &desired(destinations)?).context("reconcile")?;
    ctx.log(format!("{:?} reconcile {destinations:?}: {changes:?}", ctx.via));
    ctx.log(format!("installed:\n{}", emulation.show(link)?));
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

pub(super) fn warm_up(link: &Link, destination: Ipv4Addr, port: u16) -> anyhow::Result<()> {
    // resolves the neighbour, so no measured packet waits for ARP
    stream(link, destination, port, &StreamSpec::new(3, Duration::from_millis(5), Duration::from_millis(100)))?;
    Ok(())
}

/// A stream through `dp`, with where its packets were lost beside it (the sender, the datapath by reason, the
/// guest's input backlog, the receiver's socket) and how busy the guest's CPU was meanwhile: a failed attempt's
/// log names the place of its losses.
fn measured_stream(
    ctx: &mut Ctx,
    dp: &Emulation,
    link: &Link,
    destination: Ipv4Addr,
    port: u16,
    spec: &StreamSpec,
) -> anyhow::Result<(StreamResult, String)> {
    let (losses, backlog, cpu) = (dp.losses(ctx)?, backlog_drops()?, CpuTimes::now()?);
    let r = stream(link, destination, port, spec)?;
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
        Err(e) => Err(e),
    }
}

/// Latency: the median and mean one-way delay sit on the configured value; the kernel shows the datapath's state
/// (tc: an HTB root with that netem; userspace: the capture's interface and a route to the destination through
/// it); a second identical reconcile changes nothing; the counters saw every packet; tc's tree reads back;
/// reconcile(empty) removes everything.
fn delay(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("delay", 1)?;
    let dst = link.destinations[0];
    let imp = ImpairmentFields { latency: ms(20), ..Default::default() };
    let (dp, _) = install(ctx, &link, &[(dst, imp.clone())])?;
    let shown = dp.show(&link)?;
    let expected = match ctx.via {
        Via::Tc => shown.contains("qdisc htb") && shown.contains("netem") && shown.contains("delay 20"),
        Via::Userspace => dp.shows_state(&shown) && shown.contains(&format!("{dst} dev {POD_END}")),
    };
    ensure!(expected, "the kernel does not show the {:?} datapath's state for a 20 ms destination:\n{shown}", ctx.via);
    let r = ctx.with_retries("delay", |ctx| {
        let r = stream(&link, dst, 7100, &spec(300, 5000, 300))?;
        let s = r.delay()?;
        ctx.record("delay_ms", s);
        expect::delay_and_mean_near(ctx, "delay 20ms", &s, 20.0, 0.0)?;
        ensure!(r.lost() == 0, "lost {} packets with no loss configured", r.lost());
        Ok(r)
    })?;
    let again = dp.reconcile(ctx, &desired(&[(dst, imp.clone())])?)?;
    ensure!(again.made == 0, "a second identical reconcile changed {} things: {again:?}", again.made);
    let counted = dp.counters(ctx)?;
    ctx.log(format!("counters: {counted:?}"));
    let counters =
        counted.iter().find(|(d, _)| *d == host(dst)).map(|(_, c)| *c).context("no counters for the destination")?;
    ensure!(
        counters.packets >= u64::from(r.sent),
        "the datapath counts {} packets for the destination, {} were sent",
        counters.packets,
        r.sent
    );
    if let Some(installed) = dp.installed(ctx)? {
        ensure!(installed == desired(&[(dst, imp)])?, "installed() reads back {installed:?}");
    } else {
        ensure!(ctx.via == Via::Userspace, "installed() sees no isthmus tree");
    }
    dp.reconcile(ctx, &DesiredState::empty())?;
    let after = dp.show(&link)?;
    ensure!(!dp.shows_state(&after), "reconcile(empty) left:\n{after}");
    ensure!(dp.counters(ctx)?.is_empty(), "counters remain after reconcile(empty)");
    Ok(Outcome::Pass)
}

/// Jitter ±10 ms around 30 ms is uniform: sd 10/√3 ≈ 5.77 ms, p10…p90 about 16 ms wide.
fn jitter(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("jitter", 1)?;
    let dst = link.destinations[0];
    let _installed =
        install(ctx, &link, &[(dst, ImpairmentFields { latency: ms(30), jitter: ms(10), ..Default::default() })])?;
    ctx.with_retries("jitter", |ctx| {
        let r = stream(&link, dst, 7200, &spec(400, 5000, 300))?;
        let s = r.delay()?;
        ctx.record("delay_ms", s);
        expect::delay_and_mean_near(ctx, "jitter 30±10ms", &s, 30.0, 10.0)?;
        let want_sd = 10.0 / 3f64.sqrt();
        ctx.summarize(format!("sd {:.2} ms (uniform {want_sd:.2}), p90-p10 {:.1} ms", s.sd, s.p90 - s.p10));
        // Only a floor on the sd: a host stall adds a few late packets and no early ones, and four packets 50 ms
        // late in 400 raise the sd from 5.8 to 7.6 ms. Too wide a jitter fails the p90-p10 spread instead, which
        // such outliers do not move: twice the jitter reads about 32 ms there.
        ensure!(s.sd >= 0.75 * want_sd, "delay sd {:.2} ms is below {:.2} ms: jitter missing?", s.sd, 0.75 * want_sd);
        let spread = s.p90 - s.p10;
        ensure!((12.0..=21.0).contains(&spread), "p90-p10 spread {spread:.1} ms is not near 16 ms");
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

fn loss_random(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("loss", 1)?;
    let dst = link.destinations[0];
    let (dp, _) = install(
        ctx,
        &link,
        &[(dst, ImpairmentFields { loss: Some(Loss::Random(chance(10.0))), ..Default::default() })],
    )?;
    ctx.with_retries("loss", |ctx| {
        let before = drops(ctx, &dp, dst)?;
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7300, &spec(2000, 500, 300))?;
        ctx.record("loss_ratio", r.loss_ratio());
        expect::ratio_near(ctx, "loss", r.loss_ratio(), 0.10, r.sent as usize)?;
        // The datapath's own count of its drops is what status and metrics report: each lost packet once. A
        // packet lost outside it (the receiver's socket buffer on a stalled guest) makes it count fewer, so
        // only a tenth of the losses may be missing; none may be counted twice.
        let counted = (drops(ctx, &dp, dst)? - before) as usize;
        ctx.summarize(format!("{counted} drops counted"));
        ensure!(
            counted <= r.lost() && counted * 10 >= r.lost() * 9,
            "the datapath counts {counted} drops for {} lost packets",
            r.lost()
        );
        ensure!(
            r.duplicates() == 0 && r.corrupted == 0,
            "duplicates {} corrupted {} with only loss configured",
            r.duplicates(),
            r.corrupted
        );
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// Gilbert-Elliott p=5 %, r=40 %, all lost in the bad state, none in the good: a loss ratio of p/(p+r)
/// ≈ 11.1 % in bursts of mean length 1/r = 2.5 (independent loss of that ratio gives bursts of about 1.1).
fn loss_gilbert_elliott(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("gemodel", 1)?;
    let dst = link.destinations[0];
    let loss = Loss::GilbertElliott { p: pct(5.0), r: pct(40.0), loss_in_bad: pct(100.0), loss_in_good: pct(0.0) };
    let (dp, _) = install(ctx, &link, &[(dst, ImpairmentFields { loss: Some(loss), ..Default::default() })])?;
    ctx.with_retries("gemodel", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7400, &spec(3000, 500, 300))?;
        let bursts = r.loss_bursts();
        let mean_burst = bursts.iter().sum::<usize>() as f64 / bursts.len().max(1) as f64;
        ctx.record("loss_ratio", r.loss_ratio());
        ctx.record("mean_loss_burst", mean_burst);
        let expected = 5.0 / 45.0;
        // losses come in bursts, so a ratio varies about √(mean burst) times more than independent trials
        let band = binomial_band(expected, r.sent as usize) * 2.5_f64.sqrt() * 1.2;
        ctx.log(format!(
            "loss {:.4} (expected {expected:.4} ± {band:.4}), {} bursts, mean length {mean_burst:.2} (expected 2.5)",
            r.loss_ratio(),
            bursts.len()
        ));
        ctx.summarize(format!(
            "loss {:.2}% (cfg 11.11%), mean burst {mean_burst:.2} (cfg 2.5)",
            r.loss_ratio() * 100.0
        ));
        ensure!(
            (r.loss_ratio() - expected).abs() <= band,
            "loss ratio {:.4} outside {expected:.4} ± {band:.4}",
            r.loss_ratio()
        );
        ensure!((1.8..=3.4).contains(&mean_burst), "mean loss burst {mean_burst:.2} is not near 2.5");
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

fn duplicate(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("dup", 1)?;
    let dst = link.destinations[0];
    let (dp, _) =
        install(ctx, &link, &[(dst, ImpairmentFields { duplicate: Some(chance(10.0)), ..Default::default() })])?;
    ctx.with_retries("duplicate", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7500, &spec(2000, 500, 300))?;
        ctx.record("duplicate_ratio", r.duplicate_ratio());
        expect::ratio_near(ctx, "duplicates", r.duplicate_ratio(), 0.10, r.sent as usize)?;
        ensure!(r.lost() == 0, "lost {} packets with only duplication configured", r.lost());
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// netem flips one bit per corrupted frame anywhere in it; sent without a UDP checksum, a payload hit reaches
/// the receiver and fails the payload checksum, a header hit is dropped on the way (counted as lost).
fn corrupt(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("corrupt", 1)?;
    let dst = link.destinations[0];
    let (dp, _) =
        install(ctx, &link, &[(dst, ImpairmentFields { corrupt: Some(chance(10.0)), ..Default::default() })])?;
    ctx.with_retries("corrupt", |ctx| {
        let mut s = spec(2000, 500, 300);
        s.payload = 1000;
        s.no_udp_checksum = true;
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7600, &s)?;
        // a corrupted datagram never arrives intact, so it is among the lost ones
        let hit = r.loss_ratio();
        ctx.record("corrupt_ratio", r.corrupt_ratio());
        ctx.record("corrupt_or_lost_ratio", hit);
        expect::ratio_near(ctx, "corrupted or lost", hit, 0.10, r.sent as usize)?;
        let payload_share = 1000.0 / (1000 + UDP_L2_OVERHEAD) as f64;
        expect::ratio_near(ctx, "payload corrupted", r.corrupt_ratio(), 0.10 * payload_share, r.sent as usize)?;
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// Reordering 25 % with 20 ms latency: a quarter of the packets skip the delay (gap 0 means "any packet").
fn reorder(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("reorder", 1)?;
    let dst = link.destinations[0];
    let reorder = Reorder { percent: pct(25.0), correlation: Percent::ZERO, gap: 0 };
    let (dp, _) = install(
        ctx,
        &link,
        &[(dst, ImpairmentFields { latency: ms(20), reorder: Some(reorder), ..Default::default() })],
    )?;
    ctx.with_retries("reorder", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7700, &spec(1000, 2000, 300))?;
        let early = r.delays_ms().iter().filter(|d| **d < 10.0).count() as f64 / r.unique_received().max(1) as f64;
        ctx.record("undelayed_ratio", early);
        ctx.record("out_of_order", r.out_of_order());
        expect::ratio_near(ctx, "sent without delay", early, 0.25, r.unique_received())?;
        ctx.summarize(format!("{} arrivals out of order", r.out_of_order()));
        ensure!(r.out_of_order() > 0, "nothing arrived out of order");
        ensure!(r.lost() == 0, "lost {} packets with no loss configured", r.lost());
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// TBF at 3 Mbit/s counts Ethernet frames: 1400-byte UDP payloads arrive at 3 × 1400/1442 Mbit/s.
/// The rate is low and the bucket 32 kB because UML on a loaded host neither sends much faster than
/// ~9 Mbit/s nor wakes its timers on time: at 10 Mbit/s with the default bucket (5 ms at the rate) the
/// measurement showed the host's load, not TBF.
fn rate(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("rate", 1)?;
    let dst = link.destinations[0];
    let rate = 3_000_000u64;
    let (dp, _) = install(
        ctx,
        &link,
        &[(dst, ImpairmentFields { rate_bps: Some(rate), burst_bytes: Some(32_000), ..Default::default() })],
    )?;
    let expected = rate as f64 * 1400.0 / (1400 + UDP_L2_OVERHEAD) as f64;
    // set when the last attempt's guest could not even send faster than the rate
    let mut starved = None;
    let result = ctx.with_retries("rate", |ctx| {
        starved = None;
        // 4.5 Mbit/s offered for 2.5 s: the bucket's initial burst is skipped, then the queue stays busy
        let mut s = spec(1000, 2489, 500);
        s.payload = 1400;
        let (r, _) = measured_stream(ctx, &dp, &link, dst, 7800, &s)?;
        let offered = r.offered_bps();
        ctx.record("offered_bps", offered);
        if offered < 1.2 * expected {
            starved = Some(offered);
            anyhow::bail!("the sender offered only {:.2} Mbit/s, not above 1.2 × the rate", offered / 1e6);
        }
        let got = r.goodput_bps(Duration::from_millis(400)).context("too few packets arrived")?;
        ctx.record("goodput_bps", got);
        expect::rate_near(ctx, "udp goodput", got, expected)
    });
    match (result, starved) {
        (Ok(()), _) => Ok(Outcome::Pass),
        // TBF cannot be judged when the guest (UML on a busy host) cannot offer more than the rate: say so
        // (skipped natively; a failure in the rig's guests)
        (Err(_), Some(offered)) => Ok(Outcome::Skip(format!(
            "the guest offered only {:.2} Mbit/s (needs {:.2}): too starved of CPU to measure the bucket",
            offered / 1e6,
            1.2 * expected / 1e6
        ))),
        (Err(e), None) => Err(e),
    }
}

/// Three destinations behind one interface: each gets its own impairment, the unlisted one none.
fn per_destination_independence(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("indep", 3)?;
    let (d10, d40, free) = (link.destinations[0], link.destinations[1], link.destinations[2]);
    let _installed = install(
        ctx,
        &link,
        &[
            (d10, ImpairmentFields { latency: ms(10), ..Default::default() }),
            (d40, ImpairmentFields { latency: ms(40), loss: Some(Loss::Random(chance(20.0))), ..Default::default() }),
        ],
    )?;
    ctx.with_retries("independence", |ctx| {
        let streams = [(d10, 7901), (d40, 7902), (free, 7903)]
            .map(|(d, port)| Stream::start(&link, d, port, &spec(400, 5000, 300)));
        let [a, b, c] = streams;
        let (a, b, c) = (a?.finish()?, b?.finish()?, c?.finish()?);
        expect::concurrent_delay_near(ctx, "10ms dst", &a.delay()?, 10.0)?;
        expect::concurrent_delay_near(ctx, "40ms dst", &b.delay()?, 40.0)?;
        expect::ratio_near(ctx, "40ms dst loss", b.loss_ratio(), 0.20, b.sent as usize)?;
        let base = c.delay()?;
        ctx.summarize(format!("unlisted dst p50 {:.2} ms", base.p50));
        let limit = if ctx.backend == Backend::QemuTcg { 3.0 } else { 1.0 };
        ensure!(base.p50 <= limit, "the unlisted destination's median delay {:.2} ms is above {limit} ms", base.p50);
        ensure!(a.lost() == 0 && c.lost() == 0, "loss on destinations without loss: {} and {}", a.lost(), c.lost());
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// The regression behind the HTB root: a 200 ms destination loaded with TCP must not hold back a 1 ms one.
/// With a DRR root the 1 ms destination's median rose to tens of ms; with HTB it stays near 1 ms. The userspace
/// datapath keeps a queue per destination too, and is held to the same.
fn head_of_line(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("hol", 2)?;
    let (slow, fast) = (link.destinations[0], link.destinations[1]);
    let _installed = install(
        ctx,
        &link,
        &[
            (slow, ImpairmentFields { latency: ms(200), ..Default::default() }),
            (fast, ImpairmentFields { latency: ms(1), ..Default::default() }),
        ],
    )?;
    warm_up(&link, fast, 8000)?;
    ctx.with_retries("hol", |ctx| {
        let bulk = Bulk::start(&link, slow, 8001, Duration::from_millis(3500))?;
        std::thread::sleep(Duration::from_millis(500));
        let probe = stream(&link, fast, 8002, &spec(300, 10_000, 200))?;
        let bulk = bulk.finish()?;
        let s = probe.delay()?;
        ctx.record("fast_delay_ms", s);
        ctx.record("slow_goodput_bps", bulk.goodput_bps);
        ctx.record("slow_bytes", bulk.bytes);
        let (p50_hi, p90_hi) = match ctx.backend {
            Backend::QemuTcg => (1.0 + 5.0, 1.0 + 20.0),
            _ => (1.0 + 2.0, 1.0 + 8.0),
        };
        ctx.log(format!("1ms dst while 200ms dst carries TCP ({:.1} Mbit/s): {s}", bulk.goodput_bps / 1e6));
        ctx.summarize(format!(
            "1ms dst p50 {:.2} p90 {:.2} ms under load ({:.1} Mbit/s to 200ms dst)",
            s.p50,
            s.p90,
            bulk.goodput_bps / 1e6
        ));
        ensure!(
            bulk.goodput_bps > 1e6,
            "the TCP load to the 200 ms destination only reached {:.2} Mbit/s",
            bulk.goodput_bps / 1e6
        );
        ensure!(
            s.p50 >= 0.5 && s.p50 <= p50_hi,
            "1 ms destination: median {:.2} ms outside [0.5, {p50_hi}] (head-of-line blocking?)",
            s.p50
        );
        ensure!(s.p90 <= p90_hi, "1 ms destination: p90 {:.2} ms above {p90_hi} ms (head-of-line blocking?)", s.p90);
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// A duplicating destination beside another netem destination: a typed DuplicateRestriction on kernels
/// that refuse it (bookworm's 6.1), installed and working on the others (7.x).
fn duplicate_restriction(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("duprestr", 2)?;
    let (dup, plain) = (link.destinations[0], link.destinations[1]);
    let restricted = ctx.runtime.block_on(probe()).duplicate_restricted;
    let dp = ctx.runtime.block_on(Datapath::open(link.a.fd()))?;
    let state = desired(&[
        (dup, ImpairmentFields { latency: ms(5), duplicate: Some(chance(10.0)), ..Default::default() }),
        (plain, ImpairmentFields { latency: ms(10), ..Default::default() }),
    ])?;
    let result = ctx.runtime.block_on(dp.reconcile(SOURCE_IF, &state));
    ctx.log(format!("probe: duplicate_restricted={restricted}; reconcile: {result:?}"));
    let tc_says = duplicate_restricted_per_tc()?;
    ensure!(restricted == tc_says, "probe says duplicate_restricted={restricted}, tc shows {tc_says} in this kernel");
    match (restricted, result) {
        (true, Err(e)) => {
            ctx.summarize(format!("refused as {:?}: {e}", e.kind()));
            ensure!(
                e.kind() == PodErrorKind::DuplicateRestriction,
                "refused with kind {:?}, not DuplicateRestriction: {e}",
                e.kind()
            );
            ensure!(e.to_string().contains("duplicating"), "the error lost the kernel's text: {e}");
        }
        (true, Ok(report)) => {
            anyhow::bail!("this kernel refuses duplicating netems beside others, yet reconcile returned {report:?}")
        }
        (false, Err(e)) => {
            anyhow::bail!("this kernel accepts duplicating netems beside others, yet reconcile failed: {e}")
        }
        (false, Ok(_)) => {
            ctx.log(format!("tc qdisc show:\n{}", link.tc_show("qdisc")?));
            ctx.with_retries("both destinations", |ctx| {
                let a = Stream::start(&link, dup, 8101, &spec(1000, 1000, 300))?;
                let b = Stream::start(&link, plain, 8102, &spec(300, 3300, 300))?;
                let (a, b) = (a.finish()?, b.finish()?);
                expect::ratio_near(ctx, "duplicates", a.duplicate_ratio(), 0.10, a.sent as usize)?;
                expect::concurrent_delay_near(ctx, "plain 10ms dst", &b.delay()?, 10.0)?;
                ensure!(b.duplicates() == 0, "{} duplicates reached the plain destination", b.duplicates());
                Ok(())
            })?;
        }
    }
    Ok(Outcome::Pass)
}

/// Changing one destination's latency in place: the other destination's traffic loses nothing meanwhile.
fn latency_change_in_place(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    // a retry starts over in fresh namespaces: the change under traffic happens once per attempt
    ctx.with_retries("change", |ctx| {
        let link = Link::new("change", 2)?;
        let (changed, other) = (link.destinations[0], link.destinations[1]);
        let lat = |v| ImpairmentFields { latency: ms(v), ..Default::default() };
        let (dp, _) = install(ctx, &link, &[(changed, lat(10)), (other, lat(10))])?;
        warm_up(&link, other, 8200)?;
        warm_up(&link, changed, 8201)?;
        let steady = Stream::start(&link, other, 8202, &spec(1500, 2000, 300))?;
        let moving = Stream::start(&link, changed, 8203, &spec(600, 5000, 300))?;
        std::thread::sleep(Duration::from_millis(1000));
        let changed_at = std::time::Instant::now();
        let report = dp.reconcile(ctx, &desired(&[(changed, lat(30)), (other, lat(10))])?)?;
        let took = changed_at.elapsed();
        let (steady, moving) = (steady.finish()?, moving.finish()?);
        ctx.log(format!("change took {took:?}: {report:?}\n{}", dp.show(&link)?));
        ctx.record("change_ms", took.as_secs_f64() * 1e3);
        ctx.record("other_lost", steady.lost());
        ctx.record("changed_lost", moving.lost());
        ensure!(report.made >= 1, "the change changed nothing: {report:?}");
        ensure!(report.replaced == 0, "a latency change must be made in place, not by delete/add: {report:?}");
        ensure!(
            steady.duplicates() == 0 && moving.duplicates() == 0,
            "the change duplicated packets: {} to the unchanged destination, {} to the changed one",
            steady.duplicates(),
            moving.duplicates()
        );
        ctx.summarize(format!(
            "other dst lost {} of {}, changed dst lost {}",
            steady.lost(),
            steady.sent,
            moving.lost()
        ));
        ensure!(steady.lost() == 0, "the unchanged destination lost {} packets during the change", steady.lost());
        expect::concurrent_delay_near(ctx, "unchanged 10ms dst", &steady.delay()?, 10.0)?;
        let late: Vec<f64> = moving.first_arrivals().iter().filter(|a| a.seq >= 400).map(|a| a.delay_ms()).collect();
        let late = Summary::of(&late).context("nothing arrived after the change")?;
        expect::concurrent_delay_near(ctx, "changed dst after", &late, 30.0)
    })?;
    Ok(Outcome::Pass)
}

/// A long link: 5 Mbit/s with 4 s latency holds ~1,330 of the stream's frames in flight, beyond netem's default
/// queue of 1,000; the datapath sizes the queue from the bandwidth-delay product, so nothing is dropped (with
/// `queue_limit_packets: 1000` both datapaths drop a fifth of the stream, 2026-11-29).
fn queue_limit_from_bdp(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let link = Link::new("bdp", 1)?;
    let dst = link.destinations[0];
    let configured = 4000.0;
    let (dp, _) = install(
        ctx,
        &link,
        &[(dst, ImpairmentFields { latency: ms(4000), rate_bps: Some(5_000_000), ..Default::default() })],
    )?;
    warm_up(&link, dst, 8300)?;
    ctx.with_retries("bdp", |ctx| {
        // 3.8 Mbit/s of 1400-byte payloads (333 a second) for 5 s under a 5 Mbit/s rate: about 1,330 packets in
        // the delay line at once, more than netem's default limit of 1,000. Few packets a second and a long delay
        // rather than the reverse: each packet costs the userspace datapath's loop system calls, and in the
        // emulated guests the sender, the loop and the receiver share one emulated CPU; at 1,430 a second (16
        // Mbit/s under 1.5 s) that CPU ran busy throughout under UML, the sender fell seconds behind its schedule
        // and the loop behind its delay line (2026-11-29), which said nothing about the queue's limit.
        let mut s = spec(1650, 3000, 5000);
        s.payload = 1400;
        let (r, place) = measured_stream(ctx, &dp, &link, dst, 8301, &s)?;
        ctx.record("loss_ratio", r.loss_ratio());
        ctx.log(dp.show(&link)?);
        ctx.summarize(format!("lost {} of {} ({:.2}%): {place}", r.lost(), r.sent, r.loss_ratio() * 100.0));
        let planned = s.interval * (s.packets - 1);
        ensure!(
            r.send_elapsed.as_secs_f64() <= planned.as_secs_f64() * 1.2,
            "the sender took {:.2} s for {:.2} s of packets: the guest's CPU could not keep its schedule \
             ({}), so the stream did not load the queue as planned",
            r.send_elapsed.as_secs_f64(),
            planned.as_secs_f64(),
            place
        );
        ensure!(
            r.loss_ratio() < 0.01,
            "a link under its rate dropped {:.2} % (queue too short for its BDP?)",
            r.loss_ratio() * 100.0
        );
        let d = r.delay()?;
        ctx.summarize(format!("p50 {:.0} ms (cfg {configured})", d.p50));
        // 20 % above: a guest's scheduling delays packets, never hastens them; no delay, half or twice the delay
        // still fail, and a queue too short for the BDP fails the loss check.
        ensure!(
            (configured - 0.5..=configured * 1.2).contains(&d.p50),
            "median one-way delay {:.1} ms is not near {configured} ms",
            d.p50
        );
        Ok(())
    })?;
    Ok(Outcome::Pass)
}
