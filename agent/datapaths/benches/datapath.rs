//! Datapath benchmark (root; this machine's kernel: htb, tbf, u32). Prints markdown tables for
//! docs/benchmarks.md. Run: `cargo bench -p isthmus-datapaths --bench datapath` (optionally `-- --runs 7`).
//!
//! For 1, 100 and 1,000 rate-only destinations, side by side in one run and interleaved:
//! - install from an empty interface: isthmus (`Datapath::reconcile`), iproute2 `tc -batch` (one process), and
//!   iproute2 with one `tc` process per object (as tools that shell out do);
//! - change one destination's rate: isthmus's full path (`Datapath::reconcile`: dump + diff + send), isthmus's
//!   fast path (`Datapath::update`: diff against the record of the last call + send), one `tc qdisc change`
//!   process;
//! - re-apply the unchanged state: isthmus's full path (dump + diff, no mutation) and fast path (no mutation);
//! - TCP goodput to one (unshaped) destination with 1 vs 1,000 destinations installed.
//!
//! The iproute2 tree is the same as isthmus's: htb root, default class, per destination an htb class, a tbf
//! and a u32 entry in a hash table keyed on the last address byte, the hash link and a catch-all filter.

#[path = "../tests/datapath_support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use isthmus_agent_api::Impairment;
use isthmus_agent_api::test_util::rate;
use isthmus_datapaths::datapath::{Datapath, DesiredState};
use isthmus_test_kit::stats::median;
use support::Pair;

fn destination(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a10_0000 + i * 7)
}

fn rate_of(i: u32, bump: bool) -> u64 {
    1_000_000 + u64::from(i) * 1000 + if bump { 500_000 } else { 0 }
}

fn desired(n: u32, bump_first: bool) -> DesiredState {
    DesiredState::new(
        (0..n).map(|i| (IpNet::from(IpAddr::from(destination(i))), rate(rate_of(i, bump_first && i == 0)))),
    )
    .unwrap()
}

/// The same tree as isthmus installs, in iproute2's batch syntax (handles in hex, as tc reads them).
fn tc_commands(n: u32) -> Vec<String> {
    let mut c = vec![
        "qdisc add dev va root handle 1570: htb default 1 r2q 10 direct_qlen 1000".to_owned(),
        "class add dev va parent 1570: classid 1570:1 htb rate 100gbit ceil 100gbit quantum 65536".to_owned(),
    ];
    for i in 0..n {
        let (class, tbf) = (0x1000 + i, 0x2000 + i);
        let burst = (rate_of(i, false) / 8 * 5 / 1000).max(3200);
        let limit = burst + rate_of(i, false) / 8 / 10;
        c.push(format!(
            "class add dev va parent 1570: classid 1570:{class:x} htb rate 100gbit ceil 100gbit quantum 65536"
        ));
        c.push(format!(
            "qdisc add dev va parent 1570:{class:x} handle {tbf:x}: tbf rate {}bit burst {burst} limit {limit}",
            rate_of(i, false)
        ));
    }
    c.push("filter add dev va parent 1570: prio 1 handle 100: protocol ip u32 divisor 256".to_owned());
    for i in 0..n {
        let d = destination(i);
        c.push(format!(
            "filter add dev va parent 1570: prio 1 protocol ip u32 ht 100:{:x}: match ip dst {d}/32 flowid 1570:{:x}",
            d.octets()[3],
            0x1000 + i
        ));
    }
    c.push("filter add dev va parent 1570: prio 1 protocol ip u32 ht 800:: match ip dst 0.0.0.0/0 hashkey mask 0x000000ff at 16 link 100:".to_owned());
    c.push("filter add dev va parent 1570: prio 65535 protocol all u32 match u32 0 0 flowid 1570:1".to_owned());
    c
}

fn tc_ok(ns: &str, args: &[&str]) {
    let out = Command::new("tc").arg("-n").arg(ns).args(args).output().unwrap();
    assert!(out.status.success(), "tc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn clear(ns: &str) {
    let _ = Command::new("tc").args(["-n", ns, "qdisc", "del", "dev", "va", "root"]).output();
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; ignore it.
    let runs: usize = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(5);
    let per_object_runs = 1;
    let pair = Pair::new("bench");
    let datapath =
        Datapath::open(std::fs::File::open(format!("/run/netns/{}", pair.a)).unwrap().as_fd()).await.unwrap();
    let batch_path = std::env::temp_dir().join(format!("isthmus-bench-{}.tc", std::process::id()));

    let mut table = String::new();
    writeln!(table, "| destinations | objects | isthmus install | `tc -batch` install | `tc` per object install | isthmus change one: `reconcile` (full) | isthmus change one: `update` (fast) | `tc qdisc change` (1 process) | isthmus re-apply unchanged: `reconcile` (full) | isthmus re-apply unchanged: `update` (fast) |").unwrap();
    writeln!(table, "|---|---|---|---|---|---|---|---|---|---|").unwrap();
    for n in [1u32, 100, 1000] {
        let (base, bumped) = (desired(n, false), desired(n, true));
        let commands = tc_commands(n);
        std::fs::write(&batch_path, commands.join("\n") + "\n").unwrap();
        let (mut install, mut batch, mut per_object, mut change, mut tc_change, mut reapply) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut fast_change, mut fast_reapply) = (vec![], vec![]);
        for run in 0..runs {
            // isthmus: install, change one, re-apply unchanged, remove.
            clear(&pair.a);
            let t = Instant::now();
            let r = datapath.reconcile("va", &base).await.unwrap();
            install.push(t.elapsed());
            assert_eq!(r.added, commands.len());
            let t = Instant::now();
            let r = datapath.reconcile("va", &bumped).await.unwrap();
            change.push(t.elapsed());
            assert_eq!(r.mutations, 1);
            let t = Instant::now();
            let r = datapath.reconcile("va", &bumped).await.unwrap();
            reapply.push(t.elapsed());
            assert_eq!(r.mutations, 0);
            // The fast path, from the record the full reconciles above left: change the destination back.
            let t = Instant::now();
            let r = datapath.update("va", &base).await.unwrap();
            fast_change.push(t.elapsed());
            assert_eq!(r.mutations, 1);
            let t = Instant::now();
            let r = datapath.update("va", &base).await.unwrap();
            fast_reapply.push(t.elapsed());
            assert_eq!(r.mutations, 0);
            datapath.reconcile("va", &DesiredState::empty()).await.unwrap();

            // iproute2, one batch.
            let t = Instant::now();
            tc_ok(&pair.a, &["-batch", batch_path.to_str().unwrap()]);
            batch.push(t.elapsed());
            let burst = (rate_of(0, true) / 8 * 5 / 1000).max(3200);
            let change_args = format!(
                "qdisc change dev va parent 1570:1000 handle 2000: tbf rate {}bit burst {burst} limit {}",
                rate_of(0, true),
                burst + rate_of(0, true) / 8 / 10
            );
            let t = Instant::now();
            tc_ok(&pair.a, &change_args.split(' ').collect::<Vec<_>>());
            tc_change.push(t.elapsed());
            clear(&pair.a);

            // iproute2, one process per object (slow: fewer runs at 1,000).
            if run < per_object_runs.max(if n < 1000 { runs } else { 0 }) {
                let t = Instant::now();
                for c in &commands {
                    tc_ok(&pair.a, &c.split(' ').collect::<Vec<_>>());
                }
                per_object.push(t.elapsed());
                clear(&pair.a);
            }
        }
        writeln!(
            table,
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            commands.len(),
            ms(median(&install)),
            ms(median(&batch)),
            ms(median(&per_object)),
            ms(median(&change)),
            ms(median(&fast_change)),
            ms(median(&tc_change)),
            ms(median(&reapply)),
            ms(median(&fast_reapply))
        )
        .unwrap();
        eprintln!(
            "{n}: install {:.2}× faster than tc -batch",
            median(&batch).as_secs_f64() / median(&install).as_secs_f64()
        );
    }
    let _ = std::fs::remove_file(&batch_path);

    // Throughput to one destination (its own class, no shaping) with 1 and with 1,000 destinations installed;
    // the target is the last of 1,000 so a linear classifier would walk every other entry first.
    let target = net_of("10.77.0.2");
    let unshaped = Impairment::default();
    let one = DesiredState::new([(target, unshaped.clone())]).unwrap();
    let thousand = DesiredState::new(
        (0..999)
            .map(|i| (IpNet::from(IpAddr::from(destination(i))), rate(rate_of(i, false))))
            .chain([(target, unshaped)]),
    )
    .unwrap();
    let (mut with_one, mut with_thousand) = (vec![], vec![]);
    for run in 0..runs {
        for (state, results) in [(&one, &mut with_one), (&thousand, &mut with_thousand)] {
            datapath.reconcile("va", &DesiredState::empty()).await.unwrap();
            datapath.reconcile("va", state).await.unwrap();
            results.push(
                pair.tcp_goodput_bps("10.77.0.2".parse().unwrap(), 6000 + run as u16 * 2 + (state.len() > 1) as u16),
            );
        }
    }
    datapath.reconcile("va", &DesiredState::empty()).await.unwrap();
    let (g1, g1000) = (median(&with_one), median(&with_thousand));
    writeln!(table).unwrap();
    writeln!(table, "| TCP goodput to one destination | median Gbit/s | runs (Gbit/s) |").unwrap();
    writeln!(table, "|---|---|---|").unwrap();
    for (label, g, all) in
        [("1 destination installed", g1, &with_one), ("1,000 destinations installed", g1000, &with_thousand)]
    {
        let all: Vec<String> = all.iter().map(|v| format!("{:.1}", v / 1e9)).collect();
        writeln!(table, "| {label} | {:.2} | {} |", g / 1e9, all.join(", ")).unwrap();
    }
    writeln!(table, "| ratio 1,000 / 1 | {:.0} % | |", g1000 / g1 * 100.0).unwrap();
    println!("{table}");
}

fn net_of(s: &str) -> IpNet {
    IpNet::from(s.parse::<IpAddr>().unwrap())
}

use std::os::fd::AsFd;
