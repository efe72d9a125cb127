//! A trace replayed (`spec.schedule.trace`, issue 17): the agent turns each window of the trace into a rate and
//! sets it in place at the window's boundary through the datapath's reconcile. Here the same reconciles at the
//! same boundaries, under a stream offered above every window's rate, and each window's delivered bytes held
//! two-sided to what its rate allows — the precision the cluster suite can only report (docs/networklink.md,
//! "Trace replay").

use std::time::Duration;

use anyhow::ensure;
use isthmus_agent_api::ImpairmentFields;
use isthmus_datapaths::datapath::units::burst_bytes;

use super::datapath::{desired, install, spec, warm_up};
use crate::harness::{Ctx, Outcome, Test};
use crate::netns::VethPair;
use crate::traffic::{Stream, UDP_L2_OVERHEAD, now_ns};

pub fn tests() -> Vec<Test> {
    vec![Test::tc("rate_windows", rate_windows), Test::userspace("rate_windows.userspace", rate_windows)]
}

/// Each window's length; the rates are low enough for an emulated guest to offer more than the highest.
const WINDOW: Duration = Duration::from_millis(1500);
const RATES_BPS: [u64; 4] = [1_000_000, 3_000_000, 1_500_000, 3_500_000];
/// What the stream offers: 1400-byte payloads every 2,489 µs, 4.5 Mbit/s.
const PAYLOAD: usize = 1400;
const INTERVAL_US: u64 = 2489;

fn fields(bps: u64) -> ImpairmentFields {
    ImpairmentFields { rate_bps: Some(bps), ..Default::default() }
}

fn rate_windows(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let pair = VethPair::new("windows", 1)?;
    let dst = pair.destinations[0];
    let (dp, _) = install(ctx, &pair, &[(dst, fields(RATES_BPS[0]))])?;
    warm_up(&pair, dst, 8400)?;
    let frame = (PAYLOAD + UDP_L2_OVERHEAD) as f64;
    ctx.with_retries("windows", |ctx| {
        // a retry starts from the first window's rate, as a trace's next loop does
        dp.reconcile(ctx, &desired(&[(dst, fields(RATES_BPS[0]))])?)?;
        let span = WINDOW * RATES_BPS.len() as u32 + Duration::from_millis(300);
        let mut s = spec((span.as_micros() as u64 / INTERVAL_US) as u32, INTERVAL_US, 500);
        s.payload = PAYLOAD;
        let stream = Stream::start(&pair, dst, 8401, &s)?;
        // the window k runs from bounds[k] to bounds[k + 1]; each switch is taken to happen when its reconcile
        // returned, and the time it took is allowed at both rates
        let start = now_ns();
        let (mut bounds, mut took) = (vec![start], vec![0u64]);
        for (k, &bps) in RATES_BPS.iter().enumerate().skip(1) {
            sleep_until(start + k as u64 * WINDOW.as_nanos() as u64);
            let before = now_ns();
            dp.reconcile(ctx, &desired(&[(dst, fields(bps))])?)?;
            bounds.push(now_ns());
            took.push(now_ns() - before);
        }
        sleep_until(start + RATES_BPS.len() as u64 * WINDOW.as_nanos() as u64);
        bounds.push(now_ns());
        took.push(0);
        let r = stream.finish()?;
        let offered = r.offered_bps();
        let highest = *RATES_BPS.iter().max().unwrap_or(&0) as f64;
        ensure!(
            offered >= 1.2 * highest,
            "the guest offered only {:.2} Mbit/s, not 1.2 × the highest window's rate: the windows were not loaded",
            offered / 1e6
        );
        let mut lines = Vec::new();
        let mut ratios = Vec::new();
        let mut outside = Vec::new();
        for (k, &bps) in RATES_BPS.iter().enumerate() {
            let (from, to) = (bounds[k], bounds[k + 1]);
            let arrived = r.arrivals.iter().filter(|a| (from..to).contains(&a.received_ns)).count();
            let delivered = (arrived * PAYLOAD) as f64;
            let seconds = (to - from) as f64 / 1e9;
            let expected = bps as f64 / 8.0 * seconds * PAYLOAD as f64 / frame;
            // a bucket and a frame at each end of the window, and the switch's own time at the faster rate; 5 %
            // beyond it for the kernel's timers (the rate test's tolerance)
            let switch = |i: usize| took[i] as f64 / 1e9 * highest / 8.0;
            let slack = 0.05 * expected + burst_bytes(&fields(bps)) as f64 + 2.0 * frame + switch(k) + switch(k + 1);
            let line = format!(
                "window {} at {:.1} Mbit/s for {seconds:.3} s: {delivered:.0} B delivered, {expected:.0} ± {slack:.0} B expected",
                k + 1,
                bps as f64 / 1e6,
            );
            ctx.record(&format!("window_{}_ratio", k + 1), delivered / expected);
            ratios.push(format!("{:.3}", delivered / expected));
            if (delivered - expected).abs() > slack {
                outside.push(line.clone());
            }
            lines.push(line);
        }
        ctx.log(lines.join("\n"));
        ctx.summarize(format!("delivered/expected per window {}", ratios.join(" / ")));
        ensure!(outside.is_empty(), "windows outside their bounds: {}", outside.join("; "));
        Ok(())
    })?;
    Ok(Outcome::Pass)
}

fn sleep_until(at_ns: u64) {
    let now = now_ns();
    if at_ns > now {
        std::thread::sleep(Duration::from_nanos(at_ns - now));
    }
}
