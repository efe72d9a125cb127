//! The datapaths' benchmark, side by side in one kernel (`rig bench`; e2e/kernel/README.md, "Benchmark"): not
//! tests — nothing here judges a figure, a run fails only when it could not measure. Each datapath gets
//! [`RUNS`] runs in fresh namespaces; each run measures, beside an unimpaired destination on the same interface:
//! - the one-way delay a 0 ms destination adds (median, µs): the only captured direction, so the round trip adds
//!   the same;
//! - the error of a 20 ms destination: p50 and p99 of the one-way delay minus 20 ms minus the unimpaired median;
//! - TCP goodput of one flow with 1 Gbit/s configured at 0 ms and at 50 ms one way, with 0 ms and no rate (the
//!   datapath's own ceiling), and unimpaired;
//! - the CPU the whole kernel spends per Gbit/s moved during the 1 Gbit/s, 0 ms flow (sender, receiver and
//!   datapath alike, from /proc/stat: the datapaths differ by what they add).
//!
//! The records carry each quantity's median and its runs; the rig prints them as one table.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use isthmus_agent_api::ImpairmentFields;
use isthmus_test_kit::stats::{median, quantile};

use isthmus_kernel_tests::protocol::BENCH_QUANTITIES as QUANTITIES;

use super::emulator::Emulation;
use crate::harness::{Ctx, Outcome, Test};
use crate::netns::VethPair;
use crate::traffic::{Bulk, StreamSpec, stream};

pub const RUNS: usize = 3;

pub fn benches() -> Vec<Test> {
    vec![Test::tc("bench", bench), Test::userspace("bench.userspace", bench)]
}

fn bench(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let mut runs: Vec<[f64; QUANTITIES.len()]> = Vec::new();
    for i in 0..RUNS {
        let run = one_run(ctx, i).with_context(|| format!("run {}", i + 1))?;
        ctx.log(format!("run {}: {run:?}", i + 1));
        runs.push(run);
    }
    for (q, (key, _)) in QUANTITIES.iter().enumerate() {
        let values: Vec<f64> = runs.iter().map(|r| r[q]).collect();
        ctx.record(&format!("{key}.runs"), &values);
        ctx.record(key, median(&values));
    }
    let m = |q: usize| median(&runs.iter().map(|r| r[q]).collect::<Vec<_>>());
    ctx.summarize(format!(
        "medians of {RUNS}: added {:.0} µs; error p50 {:.0} p99 {:.0} µs; TCP 1G@0ms {:.0}, 1G@50ms {:.0}, ceiling {:.0}, \
         free {:.0} Mbit/s",
        m(0),
        m(1),
        m(2),
        m(3),
        m(4),
        m(5),
        m(6)
    ));
    Ok(Outcome::Pass)
}

fn ms(v: u64) -> Option<Duration> {
    Some(Duration::from_millis(v))
}

/// One-way delays (ms) of 1,000 datagrams 1 ms apart; every one must arrive.
fn delays(pair: &VethPair, destination: Ipv4Addr, port: u16) -> anyhow::Result<Vec<f64>> {
    let r =
        stream(pair, destination, port, &StreamSpec::new(1000, Duration::from_millis(1), Duration::from_millis(300)))?;
    ensure!(r.lost() == 0, "{} of {} datagrams to {destination} lost: no delay figure", r.lost(), r.sent);
    Ok(r.delays_ms())
}

/// Busy jiffies of all CPUs (everything but idle and iowait).
fn busy_jiffies() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().context("/proc/stat is empty")?;
    let fields: Vec<u64> = cpu.split_whitespace().skip(1).map(str::parse).collect::<Result<_, _>>()?;
    ensure!(fields.len() >= 5, "/proc/stat's cpu line is short: {cpu}");
    Ok(fields.iter().sum::<u64>() - fields[3] - fields[4])
}

/// Goodput (Mbit/s) of one TCP flow for `secs`, and the cores the kernel was busy meanwhile per Gbit/s.
fn tcp(pair: &VethPair, destination: Ipv4Addr, port: u16, secs: u64) -> anyhow::Result<(f64, f64)> {
    let (busy, start) = (busy_jiffies()?, Instant::now());
    let r = Bulk::start(pair, destination, port, Duration::from_secs(secs))?.finish()?;
    let cores = (busy_jiffies()? - busy) as f64 / 100.0 / start.elapsed().as_secs_f64();
    ensure!(r.goodput_bps > 0.0, "nothing arrived over TCP to {destination}");
    Ok((r.goodput_bps / 1e6, cores / (r.goodput_bps / 1e9)))
}

fn one_run(ctx: &mut Ctx, i: usize) -> anyhow::Result<[f64; QUANTITIES.len()]> {
    let pair = VethPair::new(&format!("bench{i}"), 5)?;
    let [zero, twenty, gig, gig50, free] =
        <[Ipv4Addr; 5]>::try_from(pair.destinations.clone()).map_err(|_| anyhow::anyhow!("five destinations"))?;
    let gbit = Some(1_000_000_000);
    let impaired = [
        (zero, ImpairmentFields { latency: ms(0), ..Default::default() }),
        (twenty, ImpairmentFields { latency: ms(20), ..Default::default() }),
        (gig, ImpairmentFields { latency: ms(0), rate_bps: gbit, ..Default::default() }),
        (gig50, ImpairmentFields { latency: ms(50), rate_bps: gbit, ..Default::default() }),
    ];
    let emulation = Emulation::open(ctx, &pair, ctx.via)?;
    emulation.reconcile(ctx, &super::datapath::desired(&impaired)?)?;
    let base = median(&delays(&pair, free, 9100)?);
    let added = median(&delays(&pair, zero, 9101)?) - base;
    let errors: Vec<f64> = delays(&pair, twenty, 9102)?.iter().map(|d| d - 20.0 - base).collect();
    let (tcp_gig, cpu) = tcp(&pair, gig, 9103, 3)?;
    let (tcp_gig50, _) = tcp(&pair, gig50, 9104, 4)?;
    let (ceiling, _) = tcp(&pair, zero, 9105, 3)?;
    let (tcp_free, cpu_free) = tcp(&pair, free, 9106, 3)?;
    Ok([
        added * 1e3,
        quantile(&errors, 0.5) * 1e3,
        quantile(&errors, 0.99) * 1e3,
        tcp_gig,
        tcp_gig50,
        ceiling,
        tcp_free,
        cpu,
        cpu_free,
    ])
}
