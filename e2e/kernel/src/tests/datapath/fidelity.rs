//! One destination's impairment, field by field, measured from a stream through it: the parity table's rows.

use std::time::Duration;

use anyhow::{Context, ensure};
use isthmus_agent_api::{ImpairmentFields, Loss, Reorder};

use super::*;

/// Latency: the median and mean one-way delay sit on the configured value; the kernel shows the datapath's state
/// (tc: an HTB root with that netem; userspace: the capture's interface and a route to the destination through
/// it); a second identical reconcile changes nothing; the counters saw every packet; tc's tree reads back;
/// reconcile(empty) removes everything.
pub(super) fn delay(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("delay", 1)?;
    let dst = pair.destinations[0];
    let imp = ImpairmentFields { latency: ms(20), ..Default::default() };
    let (dp, _) = install(ctx, &pair, &[(dst, imp.clone())])?;
    let shown = dp.show(&pair)?;
    let expected = match ctx.via {
        Via::Tc => shown.contains("qdisc htb") && shown.contains("netem") && shown.contains("delay 20"),
        Via::Userspace => dp.shows_state(&shown) && shown.contains(&format!("{dst} dev {POD_END}")),
    };
    ensure!(expected, "the kernel does not show the {:?} datapath's state for a 20 ms destination:\n{shown}", ctx.via);
    let r = ctx.with_retries("delay", |ctx| {
        let r = stream(&pair, dst, 7100, &spec(300, 5000, 300))?;
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
    let after = dp.show(&pair)?;
    ensure!(!dp.shows_state(&after), "reconcile(empty) left:\n{after}");
    ensure!(dp.counters(ctx)?.is_empty(), "counters remain after reconcile(empty)");
    Ok(Outcome::Pass)
}

/// Jitter ±10 ms around 30 ms is uniform: sd 10/√3 ≈ 5.77 ms, p10…p90 about 16 ms wide.
pub(super) fn jitter(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("jitter", 1)?;
    let dst = pair.destinations[0];
    let _installed =
        install(ctx, &pair, &[(dst, ImpairmentFields { latency: ms(30), jitter: ms(10), ..Default::default() })])?;
    ctx.with_retries("jitter", |ctx| {
        let r = stream(&pair, dst, 7200, &spec(400, 5000, 300))?;
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

pub(super) fn loss_random(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("loss", 1)?;
    let dst = pair.destinations[0];
    let (dp, _) = install(
        ctx,
        &pair,
        &[(dst, ImpairmentFields { loss: Some(Loss::Random(chance(10.0))), ..Default::default() })],
    )?;
    ctx.with_retries("loss", |ctx| {
        let before = drops(ctx, &dp, dst)?;
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7300, &spec(2000, 500, 300))?;
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
pub(super) fn loss_gilbert_elliott(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("gemodel", 1)?;
    let dst = pair.destinations[0];
    let loss = Loss::GilbertElliott { p: pct(5.0), r: pct(40.0), loss_in_bad: pct(100.0), loss_in_good: pct(0.0) };
    let (dp, _) = install(ctx, &pair, &[(dst, ImpairmentFields { loss: Some(loss), ..Default::default() })])?;
    ctx.with_retries("gemodel", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7400, &spec(3000, 500, 300))?;
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

pub(super) fn duplicate(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("dup", 1)?;
    let dst = pair.destinations[0];
    let (dp, _) =
        install(ctx, &pair, &[(dst, ImpairmentFields { duplicate: Some(chance(10.0)), ..Default::default() })])?;
    ctx.with_retries("duplicate", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7500, &spec(2000, 500, 300))?;
        ctx.record("duplicate_ratio", r.duplicate_ratio());
        expect::ratio_near(ctx, "duplicates", r.duplicate_ratio(), 0.10, r.sent as usize)?;
        ensure!(r.lost() == 0, "lost {} packets with only duplication configured", r.lost());
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

/// netem flips one bit per corrupted frame anywhere in it; sent without a UDP checksum, a payload hit reaches
/// the receiver and fails the payload checksum, a header hit is dropped on the way (counted as lost).
pub(super) fn corrupt(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("corrupt", 1)?;
    let dst = pair.destinations[0];
    let (dp, _) =
        install(ctx, &pair, &[(dst, ImpairmentFields { corrupt: Some(chance(10.0)), ..Default::default() })])?;
    ctx.with_retries("corrupt", |ctx| {
        let mut s = spec(2000, 500, 300);
        s.payload = 1000;
        s.no_udp_checksum = true;
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7600, &s)?;
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
pub(super) fn reorder(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("reorder", 1)?;
    let dst = pair.destinations[0];
    let reorder = Reorder { percent: pct(25.0), correlation: Percent::ZERO, gap: 0 };
    let (dp, _) = install(
        ctx,
        &pair,
        &[(dst, ImpairmentFields { latency: ms(20), reorder: Some(reorder), ..Default::default() })],
    )?;
    ctx.with_retries("reorder", |ctx| {
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7700, &spec(1000, 2000, 300))?;
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
pub(super) fn rate(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("rate", 1)?;
    let dst = pair.destinations[0];
    let rate = 3_000_000u64;
    let (dp, _) = install(
        ctx,
        &pair,
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
        let (r, _) = measured_stream(ctx, &dp, &pair, dst, 7800, &s)?;
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
