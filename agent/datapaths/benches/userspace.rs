//! Userspace datapath benchmark (root; this machine's kernel, which has no netem). Prints a markdown table for
//! docs/benchmarks.md. Run: `cargo bench -p isthmus-datapaths --bench userspace` (optionally `-- --runs 5`).
//!
//! Each run takes fresh pairs of namespaces (`a` → `b` over a veth), captures two destinations of `a` through
//! the loop (the capture, the pipeline and the sockets the agent uses, without its API) and measures, the
//! unimpaired path beside it in the same run:
//! - the round trip a 0 ms destination adds: UDP ping-pong medians, captured minus unimpaired;
//! - the error of a 20 ms destination (one way): p50 and p99 of the round trip minus 20 ms minus the unimpaired
//!   median;
//! - TCP goodput of one flow to a destination with 1 Gbit/s configured, at 0 ms and at 50 ms one way, with 0 ms and
//!   no rate (the loop's own ceiling), and to the unimpaired one;
//! - the loop's ceiling shared: four flows of one pod, and one flow each of two pods on the same loop;
//! - the loop thread's CPU time per Gbit/s moved during the 0 ms flow, and during the 0 ms flow with no rate.
//!
//! Every run measures the loop twice, side by side: as the agent runs it (up to `IoBatch::DEFAULT` packets per
//! system call) and moving one packet per call (`IoBatch::ONE`, what `recvfrom` and `sendto` did before).

#[path = "../tests/echo/mod.rs"]
mod echo;
#[path = "../tests/datapath_support/mod.rs"]
mod support;

use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use echo::{ECHO_PORT, Echo, round_trips};
use ipnet::IpNet;
use isthmus_agent_api::{Impairment, ImpairmentFields};
use isthmus_datapaths::datapath::QueueBudget;
use isthmus_datapaths::netns::Netns;
use isthmus_datapaths::userspace::capture::Capture;
use isthmus_datapaths::userspace::pipeline::PodPipeline;
use isthmus_datapaths::userspace::{IoBatch, PodPath, Shell};
use isthmus_test_kit::stats::quantile;
use support::{Pair, in_netns, net};

const PROBES: u32 = 2000;

fn impairment(latency_ms: u64, rate_bps: Option<u64>) -> Arc<Impairment> {
    let fields = ImpairmentFields { latency: Some(Duration::from_millis(latency_ms)), rate_bps, ..Default::default() };
    Arc::new(Impairment::try_from(fields).unwrap())
}

fn rtts(pair: &Pair, dst: IpAddr) -> Vec<f64> {
    let socket = in_netns(&pair.a, || UdpSocket::bind(("0.0.0.0", 0))).unwrap();
    let got: Vec<f64> = round_trips(socket, dst, PROBES, Duration::from_millis(300)).into_iter().flatten().collect();
    assert!(got.len() as u32 > PROBES * 99 / 100, "more than 1 % of the probes to {dst} lost");
    got
}

/// User + system CPU seconds of this process's thread named `name`.
fn thread_cpu_seconds(name: &str) -> f64 {
    let tick = 100.0; // USER_HZ
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
            let (utime, stime): (f64, f64) = (fields[11].parse().unwrap(), fields[12].parse().unwrap());
            return (utime + stime) / tick;
        }
    }
    panic!("no thread {name}");
}

struct Run {
    added_rtt_ms: f64,
    error_p50_ms: f64,
    error_p99_ms: f64,
    goodput_0ms: f64,
    goodput_50ms: f64,
    goodput_free: f64,
    goodput_unlimited: f64,
    goodput_four_flows: f64,
    goodput_two_pods: f64,
    cpu_per_gbit: f64,
    cpu_per_gbit_unlimited: f64,
}

/// The loop's ceiling: one TCP flow per `(pair, port)` at once to 10.77.0.2, 0 ms and no rate; their sum.
fn parallel_goodput(flows: &[(&Pair, u16)]) -> f64 {
    let to: IpAddr = "10.77.0.2".parse().unwrap();
    std::thread::scope(|s| {
        let flows: Vec<_> = flows.iter().map(|(pair, port)| s.spawn(move || pair.tcp_goodput_bps(to, *port))).collect();
        flows.into_iter().map(|f| f.join().unwrap()).sum()
    })
}

async fn one_run(i: usize, batch: IoBatch) -> Run {
    let pair = Pair::new(&format!("usb{i}"));
    let other = Pair::new(&format!("usc{i}"));
    let ips: Vec<IpAddr> = ["10.77.0.2", "10.77.0.3"].iter().map(|s| s.parse().unwrap()).collect();
    let _echoes: Vec<Echo> =
        ips.iter().map(|ip| Echo::serve(in_netns(&pair.b, || UdpSocket::bind((*ip, ECHO_PORT))).unwrap())).collect();
    let agent_ns = Netns::scratch().await.unwrap();
    let pod_ns = Netns::open(format!("/run/netns/{}", pair.a).as_ref()).unwrap();
    let other_ns = Netns::open(format!("/run/netns/{}", other.a).as_ref()).unwrap();
    let capture = Capture::attach(&agent_ns, &pod_ns, "va", "u-bench").await.unwrap();
    let other_capture = Capture::attach(&agent_ns, &other_ns, "va", "u-bench2").await.unwrap();
    let shell = Shell::start(isthmus_datapaths::userspace::budget::DEFAULT_BYTES, batch).unwrap();
    let attach = async |pod: &str, ns: &Netns, capture: &Capture, destinations: &[(IpNet, Arc<Impairment>)]| {
        let bound = QueueBudget::default().bound(destinations.len());
        let pipeline = PodPipeline::new(destinations.iter().map(|(n, i)| (n, i.as_ref())), bound, 1, shell.now());
        shell.attach(pod, PodPath::open(&agent_ns, ns, capture, "va", pipeline).await.unwrap());
        for (d, _) in destinations {
            capture.route(*d, None).await.unwrap();
        }
    };
    let one = async |destinations: &[(IpNet, Arc<Impairment>)]| attach("a", &pod_ns, &capture, destinations).await;
    // 10.77.0.2 captured; 10.77.0.3 the unimpaired path. The capture's route goes first, then the latency.
    one(&[(net("10.77.0.2/32"), impairment(0, None))]).await;
    let free = rtts(&pair, ips[1]);
    let zero = rtts(&pair, ips[0]);
    let base = quantile(&free, 0.5);
    let added_rtt_ms = quantile(&zero, 0.5) - base;

    one(&[(net("10.77.0.2/32"), impairment(20, None))]).await;
    let twenty: Vec<f64> = rtts(&pair, ips[0]).iter().map(|r| r - 20.0 - base).collect();

    one(&[(net("10.77.0.2/32"), impairment(0, Some(1_000_000_000)))]).await;
    // The goodput is measured over part of the transfer; the CPU over all of it: per Gbit/s of the flow's rate.
    let with_cpu = |flow: &dyn Fn() -> f64| {
        let cpu_before = thread_cpu_seconds("isthmus-us-loop");
        let wall = std::time::Instant::now();
        let goodput = flow();
        let cpu = thread_cpu_seconds("isthmus-us-loop") - cpu_before;
        (goodput, cpu / wall.elapsed().as_secs_f64() / (goodput / 1e9))
    };
    let (goodput_0ms, cpu_per_gbit) = with_cpu(&|| pair.tcp_goodput_bps(ips[0], 5500));

    one(&[(net("10.77.0.2/32"), impairment(0, None))]).await;
    let (goodput_unlimited, cpu_per_gbit_unlimited) = with_cpu(&|| pair.tcp_goodput_bps(ips[0], 5503));
    let goodput_four_flows = parallel_goodput(&[(&pair, 5510), (&pair, 5511), (&pair, 5512), (&pair, 5513)]);
    attach("b", &other_ns, &other_capture, &[(net("10.77.0.2/32"), impairment(0, None))]).await;
    let goodput_two_pods = parallel_goodput(&[(&pair, 5520), (&other, 5521)]);

    one(&[(net("10.77.0.2/32"), impairment(50, Some(1_000_000_000)))]).await;
    let goodput_50ms = pair.tcp_goodput_bps(ips[0], 5501);
    let goodput_free = pair.tcp_goodput_bps(ips[1], 5502);
    capture.detach().await.unwrap();
    other_capture.detach().await.unwrap();
    Run {
        added_rtt_ms,
        error_p50_ms: quantile(&twenty, 0.5),
        error_p99_ms: quantile(&twenty, 0.99),
        goodput_0ms,
        goodput_50ms,
        goodput_free,
        goodput_unlimited,
        goodput_four_flows,
        goodput_two_pods,
        cpu_per_gbit,
        cpu_per_gbit_unlimited,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)).map_or(5, |r| r.parse().unwrap());
    let (mut batched, mut single) = (Vec::new(), Vec::new());
    for i in 0..runs {
        // Alternated, so that a slow spell of the machine falls on both.
        batched.push(one_run(2 * i, IoBatch::DEFAULT).await);
        single.push(one_run(2 * i + 1, IoBatch::ONE).await);
        eprintln!("run {} of {runs} done", i + 1);
    }
    type Row = (&'static str, &'static str, fn(&Run) -> f64, &'static str);
    let rows: [Row; 11] = [
        ("round trip added, 0 ms configured", "µs", (|r| r.added_rtt_ms * 1000.0), "≤ 50 µs (p50)"),
        ("latency error at 20 ms, p50", "µs", (|r| r.error_p50_ms * 1000.0), ""),
        ("latency error at 20 ms, p99", "µs", (|r| r.error_p99_ms * 1000.0), "≤ 1 ms"),
        ("one TCP flow, 1 Gbit/s at 0 ms", "Mbit/s", (|r| r.goodput_0ms / 1e6), "the rate: 956 (payload of 1 Gbit/s)"),
        ("one TCP flow, 1 Gbit/s at 50 ms", "Mbit/s", (|r| r.goodput_50ms / 1e6), ""),
        ("one TCP flow, 0 ms and no rate: the loop's ceiling", "Mbit/s", (|r| r.goodput_unlimited / 1e6), "≥ 5000"),
        ("four TCP flows of one pod, 0 ms and no rate: their sum", "Mbit/s", (|r| r.goodput_four_flows / 1e6), ""),
        ("one TCP flow each of two pods on one loop: their sum", "Mbit/s", (|r| r.goodput_two_pods / 1e6), ""),
        ("one TCP flow, not captured (reference)", "Mbit/s", (|r| r.goodput_free / 1e6), ""),
        ("loop thread CPU per Gbit/s (1 Gbit/s flow at 0 ms)", "cores", (|r| r.cpu_per_gbit), "≤ 0.2"),
        ("loop thread CPU per Gbit/s (0 ms, no rate)", "cores", (|r| r.cpu_per_gbit_unlimited), "≤ 0.2"),
    ];
    let median = |all: &[Run], f: fn(&Run) -> f64| {
        let values: Vec<f64> = all.iter().map(f).collect();
        let shown: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
        (shown.join(", "), quantile(&values, 0.5))
    };
    println!(
        "| quantity | unit | batched: runs | batched: median | one packet per call: runs | one per call: median | \
         target |\n|---|---|---|---|---|---|---|"
    );
    for (what, unit, f, target) in rows {
        let ((b_runs, b), (s_runs, s)) = (median(&batched, f), median(&single, f));
        println!("| {what} | {unit} | {b_runs} | {b:.2} | {s_runs} | {s:.2} | {target} |");
    }
}
