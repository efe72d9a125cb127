//! The userspace datapath on this machine's kernel (which has no sch_netem): a pod namespace's captured
//! destination is emulated by the agent's loop, the others are not, and when the agent's namespace goes the pod's
//! traffic flows unimpaired again. Needs root (CI runs as root); traffic stays between the test's namespaces.

#[path = "echo/mod.rs"]
mod echo;
#[path = "datapath_support/mod.rs"]
mod support;

use std::net::{IpAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use echo::{ECHO_PORT, Echo, WAIT, median, pipelined_round_trips, round_trips};
use isthmus_agent_api::test_util::rate;
use isthmus_agent_api::{Correlated, Impairment, ImpairmentFields, Loss, Percent};
use isthmus_datapaths::datapath::QueueBudget;
use isthmus_datapaths::netns::Netns;
use isthmus_datapaths::userspace::capture::{Capture, POD_END};
use isthmus_datapaths::userspace::pipeline::PodPipeline;
use isthmus_datapaths::userspace::sys::{MsgHeaders, RxSocket};
use isthmus_datapaths::userspace::{IoBatch, PodPath, Shell, budget, shard};
use support::goodput::assert_rate_within;
use support::{Pair, in_netns, net, run};

/// An echo server on `ip` inside namespace `ns`.
fn echo(ns: &str, ip: IpAddr) -> Echo {
    Echo::serve(in_netns(ns, || UdpSocket::bind((ip, ECHO_PORT))).unwrap())
}

/// Probes from namespace `ns` to `dst` (see [`round_trips`]).
fn probe(ns: &str, dst: IpAddr, count: u32, wait: Duration) -> Vec<Option<f64>> {
    round_trips(in_netns(ns, || UdpSocket::bind(("0.0.0.0", 0))).unwrap(), dst, count, wait)
}

fn impairment(fields: ImpairmentFields) -> Arc<Impairment> {
    Arc::new(Impairment::try_from(fields).expect("valid"))
}

/// A path for the capture's pod with `destinations`: its own sockets and pipeline.
async fn path(
    agent_ns: &Netns,
    pod_ns: &Netns,
    capture: &Capture,
    shell: &Shell,
    destinations: &[(ipnet::IpNet, Arc<Impairment>)],
) -> PodPath {
    let bound = QueueBudget::default().bound(destinations.len());
    let pipeline = PodPipeline::new(destinations.iter().map(|(n, i)| (n, i.as_ref())), bound, 1, shell.now());
    PodPath::open(agent_ns, pod_ns, capture, "va", pipeline).await.unwrap()
}

/// The capture and the loop for namespace `a` of `pair`, emulating `destinations`.
async fn start(pair: &Pair, destinations: &[(ipnet::IpNet, Arc<Impairment>)]) -> (Netns, Netns, Capture, Shell) {
    start_within(pair, destinations, budget::DEFAULT_BYTES).await
}

/// As [`start`], the loop's queues held to `budget_bytes` on the node.
async fn start_within(
    pair: &Pair,
    destinations: &[(ipnet::IpNet, Arc<Impairment>)],
    budget_bytes: u64,
) -> (Netns, Netns, Capture, Shell) {
    let agent_ns = Netns::scratch().await.unwrap();
    let pod_ns = Netns::open(format!("/run/netns/{}", pair.a).as_ref()).unwrap();
    let capture = Capture::attach(&agent_ns, &pod_ns, "va", "u-test").await.unwrap();
    let shell = Shell::start(budget_bytes, IoBatch::DEFAULT).unwrap();
    shell.attach("a", path(&agent_ns, &pod_ns, &capture, &shell, destinations).await);
    for (destination, _) in destinations {
        capture.route(*destination, Some("10.77.0.1".parse().unwrap())).await.unwrap();
    }
    (agent_ns, pod_ns, capture, shell)
}

#[tokio::test]
async fn a_captured_destination_is_delayed_its_neighbour_is_not_and_the_agents_end_takes_the_capture_with_it() {
    let pair = Pair::new("us-lat");
    let (impaired, free): (IpAddr, IpAddr) = ("10.77.0.2".parse().unwrap(), "10.77.0.3".parse().unwrap());
    let echoes = [echo(&pair.b, impaired), echo(&pair.b, free)];
    let latency = impairment(ImpairmentFields { latency: Some(Duration::from_millis(20)), ..Default::default() });
    let (agent_ns, pod_ns, capture, shell) = start(&pair, &[(net("10.77.0.2/32"), latency)]).await;

    let a = pair.a.clone();
    let (slow, fast) =
        tokio::task::spawn_blocking(move || (probe(&a, impaired, 100, WAIT), probe(&a, free, 100, WAIT)))
            .await
            .unwrap();
    let (slow, fast) = (median(&slow), median(&fast));
    println!("median RTT: {slow:.3} ms to the captured destination (20 ms one way), {fast:.3} ms to the other");
    // Never early; late by the loop's wake-up and the extra crossings (0.14-0.18 ms over five runs here, 2026-11-24,
    // `cargo test -p isthmus-datapaths --test userspace_host -- --nocapture`), or by the loop's thread waiting for one
    // of the two CPUs while the other tests of this file run: a median of the three milliseconds a busy scheduler's
    // slices allow would mean the loop itself is slow.
    assert!((20.0..23.0).contains(&slow), "captured destination: median {slow} ms, want 20 ms plus at most 3");
    assert!(fast < 3.0, "the other destination: median {fast} ms, want no delay");
    let (counters, loop_counters) = shell.counters("a").expect("attached");
    assert_eq!(counters.len(), 1);
    assert!(counters[0].1.packets >= 100, "the emulator saw {:?}", counters[0].1);
    assert_eq!(loop_counters.send_errors, 0, "{loop_counters:?}");

    // The agent goes: its loop, its sockets, its namespace. The pod end and its route go with them.
    drop(shell);
    drop(capture);
    drop(agent_ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while run(&["ip", "-n", &pair.a, "-o", "link"]).contains(POD_END) {
        assert!(Instant::now() < deadline, "the pod end outlived the agent's namespace by 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let routes = run(&["ip", "-n", &pair.a, "route", "show", "table", "all"]);
    assert!(!routes.lines().any(|r| r.starts_with("10.77.0.2 ")), "a capture route outlived it:\n{routes}");
    let a = pair.a.clone();
    let after = median(&tokio::task::spawn_blocking(move || probe(&a, impaired, 50, WAIT)).await.unwrap());
    println!("after the agent's namespace went: {after:.3} ms");
    assert!(after < 3.0, "the pod's traffic is still delayed ({after} ms) or gone after the agent");
    drop(pod_ns);
    drop(echoes);
}

/// The pod's routing as iproute2 reads it: every table's IPv4 and IPv6 routes, and the rules. Without the routes
/// of IPv6 link-local addresses: the kernel adds those on its own, some time after an interface comes up (a read
/// right after the pair was made lacked `local fe80::… dev va`, and one after the capture had it).
fn routing(ns: &str) -> String {
    let all: String = ["-4", "-6"]
        .iter()
        .map(|family| {
            run(&["ip", family, "-n", ns, "route", "show", "table", "all"])
                + &run(&["ip", family, "-n", ns, "rule", "show"])
        })
        .collect();
    all.lines().filter(|l| !l.starts_with("local fe80:")).map(|l| format!("{l}\n")).collect()
}

/// A destination equal to the pod's own default route (`to.cidrs: [0.0.0.0/0]`): captured and delayed, while the
/// pod's own routes stay as the CNI set them, and once the capture goes the pod's routing is exactly what it was
/// (before, the capture replaced the default route in `main` and its removal left the pod without one).
#[tokio::test]
async fn a_capture_of_every_destination_leaves_the_pods_own_routes_as_they_were() {
    let pair = Pair::new("us-dflt");
    run(&["ip", "-n", &pair.a, "route", "add", "default", "via", "10.77.0.3", "dev", "va"]);
    let before = routing(&pair.a);
    let impaired: IpAddr = "10.77.0.2".parse().unwrap();
    let _echo = echo(&pair.b, impaired);
    let latency = impairment(ImpairmentFields { latency: Some(Duration::from_millis(20)), ..Default::default() });
    let (_agent_ns, _pod_ns, capture, shell) = start(&pair, &[(net("0.0.0.0/0"), latency)]).await;
    let main = run(&["ip", "-n", &pair.a, "route", "show", "table", "main"]);
    assert!(main.contains("default via 10.77.0.3 dev va"), "the pod's default route was touched:\n{main}");
    let a = pair.a.clone();
    let slow = median(&tokio::task::spawn_blocking(move || probe(&a, impaired, 50, WAIT)).await.unwrap());
    println!("median RTT with 0.0.0.0/0 captured: {slow:.3} ms (20 ms one way)");
    assert!((20.0..23.0).contains(&slow), "median {slow} ms, want 20 ms plus at most 3");
    capture.detach().await.unwrap();
    drop(shell);
    assert_eq!(routing(&pair.a), before, "the pod's routing differs from before the capture");
    let a = pair.a.clone();
    let after = median(&tokio::task::spawn_blocking(move || probe(&a, impaired, 50, WAIT)).await.unwrap());
    assert!(after < 3.0, "after the capture: median {after} ms, want no delay");
}

/// A pod whose namespace filters reverse paths strictly (`rp_filter` 1 on `all` and on its interface, as on
/// RHEL-family and hardened nodes) is impaired, not cut off: the replies from a captured destination arrive on
/// its interface while the route back to their source goes through the capture, which strict filtering drops
/// (before: every probe lost). The interface is loose while captured and strict again after.
#[tokio::test]
async fn a_pod_with_strict_reverse_path_filtering_is_impaired_not_cut_off() {
    let pair = Pair::new("us-rpf");
    let sysctl = |key: &str| format!("/proc/sys/net/ipv4/conf/{key}/rp_filter");
    let read = |key: &str| in_netns(&pair.a, || std::fs::read_to_string(sysctl(key)).unwrap()).trim().to_owned();
    for key in ["all", "va"] {
        in_netns(&pair.a, || std::fs::write(sysctl(key), "1")).unwrap();
    }
    let before = routing(&pair.a);
    let impaired: IpAddr = "10.77.0.2".parse().unwrap();
    let _echo = echo(&pair.b, impaired);
    let latency = impairment(ImpairmentFields { latency: Some(Duration::from_millis(20)), ..Default::default() });
    let (_agent_ns, _pod_ns, capture, shell) = start(&pair, &[(net("10.77.0.2/32"), latency)]).await;
    assert_eq!(read("va"), "2", "the captured pod's interface filters loosely");
    let a = pair.a.clone();
    let rtts = tokio::task::spawn_blocking(move || probe(&a, impaired, 50, WAIT)).await.unwrap();
    let answered = rtts.iter().flatten().count();
    println!("strict rp_filter: {answered} of 50 probes answered, median {:.3} ms", median(&rtts));
    // Cut off is none answered; a probe answered later than `WAIT` (a stalled machine) counts as lost here.
    assert!(answered >= 45, "the replies were dropped: {rtts:?}");
    assert!((20.0..23.0).contains(&median(&rtts)), "median {} ms, want 20 ms plus at most 3", median(&rtts));
    capture.detach().await.unwrap();
    drop(shell);
    assert_eq!((read("all"), read("va")), ("1".to_owned(), "1".to_owned()), "strict again once the capture went");
    assert_eq!(routing(&pair.a), before, "the pod's routing differs from before the capture");
}

#[tokio::test]
async fn random_loss_drops_its_share_in_the_agents_loop() {
    let pair = Pair::new("us-loss");
    let impaired: IpAddr = "10.77.0.2".parse().unwrap();
    let _echo = echo(&pair.b, impaired);
    let half = Percent::new("loss", 30.0).unwrap();
    let lossy = impairment(ImpairmentFields {
        loss: Some(Loss::Random(Correlated { percent: half, correlation: Percent::ZERO })),
        ..Default::default()
    });
    let (_agent_ns, _pod_ns, capture, shell) = start(&pair, &[(net("10.77.0.2/32"), lossy)]).await;
    let a = pair.a.clone();
    let n = 600;
    let rtts = tokio::task::spawn_blocking(move || probe(&a, impaired, n, Duration::from_millis(50))).await.unwrap();
    let lost = rtts.iter().filter(|r| r.is_none()).count() as f64 / f64::from(n);
    // 30 % of the probes; their echoes are not captured. 4.5 binomial standard errors either side.
    let sigma = (0.3f64 * 0.7 / f64::from(n)).sqrt();
    println!("lost {lost:.3} of {n} probes (30 %, ±{:.3})", 4.5 * sigma);
    assert!((lost - 0.3).abs() <= 4.5 * sigma, "lost {lost}, want 0.3 ± {}", 4.5 * sigma);
    let (counters, loop_counters) = shell.counters("a").unwrap();
    let lost_at: Vec<usize> = rtts.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(i, _)| i).collect();
    assert_eq!(counters[0].1.drops as usize, lost_at.len(), "{counters:?} {loop_counters:?} lost {lost_at:?}");
    capture.detach().await.unwrap();
    drop(shell);
}

#[tokio::test]
async fn tcp_through_the_loop_gets_the_configured_rate() {
    let pair = Pair::new("us-rate");
    let (_agent_ns, _pod_ns, capture, shell) = start(&pair, &[(net("10.77.0.2/32"), Arc::new(rate(10_000_000)))]).await;
    // As the tc tree's test (datapath_host.rs): one of up to three transfers of about 3 s within 5 % below the
    // rate, none more than 5 % above it. Blocks the test's runtime, which has nothing else to do meanwhile: the
    // loop runs on its own thread.
    let mut port = 5400;
    assert_rate_within("10 Mbit/s through the loop", 10_000_000.0, 0.05, || {
        port += 1;
        pair.tcp_transfer_bps("10.77.0.2".parse().unwrap(), port, 3_600_000)
    });
    let (_, loop_counters) = shell.counters("a").unwrap();
    assert_eq!(loop_counters.send_errors, 0, "{loop_counters:?}");
    capture.detach().await.unwrap();
}

#[tokio::test]
async fn an_edit_lets_the_packets_already_delayed_leave_as_scheduled() {
    let pair = Pair::new("us-edit");
    let impaired: IpAddr = "10.77.0.2".parse().unwrap();
    let _echo = echo(&pair.b, impaired);
    let ms = |ms| impairment(ImpairmentFields { latency: Some(Duration::from_millis(ms)), ..Default::default() });
    let (_agent_ns, _pod_ns, capture, shell) = start(&pair, &[(net("10.77.0.2/32"), ms(100))]).await;
    // 200 probes 5 ms apart (about a second); 300 ms in, the destination's latency drops to 10 ms. Netem's
    // `change` keeps its queue: the probes already delayed by 100 ms still arrive, after the faster ones.
    let a = pair.a.clone();
    let prober = tokio::task::spawn_blocking(move || {
        let socket = in_netns(&a, || UdpSocket::bind(("0.0.0.0", 0))).unwrap();
        pipelined_round_trips(socket, impaired, 200, Duration::from_millis(5), WAIT)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let faster = ms(10);
    let bound = QueueBudget::default().bound(1);
    shell.retune("a", PodPipeline::new([(&net("10.77.0.2/32"), faster.as_ref())], bound, 1, shell.now()));
    let rtts = prober.await.unwrap();
    let lost = rtts.iter().filter(|r| r.is_none()).count();
    let (slow, fast) =
        (rtts.iter().flatten().filter(|r| **r >= 100.0).count(), rtts.iter().flatten().filter(|r| **r < 100.0).count());
    println!("across the edit: {slow} probes at 100 ms, {fast} at 10 ms, {lost} lost");
    assert_eq!(lost, 0, "the edit lost probes that were in the old delay line: {rtts:?}");
    assert!(slow > 20 && fast > 20, "the edit did not happen mid-run: {rtts:?}");
    assert!(rtts.iter().flatten().all(|r| *r >= 10.0), "a probe skipped the delay: {rtts:?}");
    capture.detach().await.unwrap();
}

/// A flood into a 10 s delay line holds no more than the node's budget, an edit's draining pipeline included;
/// what does not fit is dropped and counted, and the loop goes on (before the budget, the same flood held its
/// whole volume: the per-pod bound alone is 64 MiB).
#[tokio::test]
async fn a_flood_holds_the_nodes_queue_budget_and_no_more_draining_included() {
    const BUDGET: u64 = 2 << 20;
    let pair = Pair::new("us-budget");
    let (x, y) = (net("10.77.0.2/32"), net("10.77.0.3/32"));
    let long = impairment(ImpairmentFields { latency: Some(Duration::from_secs(10)), ..Default::default() });
    let (_agent_ns, _pod_ns, capture, shell) = start_within(&pair, &[(x, long.clone())], BUDGET).await;
    capture.route(y, Some("10.77.0.1".parse().unwrap())).await.unwrap();
    // 3,000 datagrams of 1,400 bytes, each way about 4.3 MiB: twice the budget, sent in bursts the capture's
    // sockets can take.
    let flood = |dst: IpAddr| {
        let socket = in_netns(&pair.a, || UdpSocket::bind(("0.0.0.0", 0))).unwrap();
        for i in 0..3000 {
            socket.send_to(&[0u8; 1400], (dst, 9)).unwrap();
            if i % 50 == 49 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    flood("10.77.0.2".parse().unwrap());
    let (_, first) = shell.counters("a").unwrap();
    println!("after the first flood: {first:?}");
    assert!(first.queued_bytes <= BUDGET, "{} bytes queued, budget {BUDGET}", first.queued_bytes);
    assert!(first.queued_bytes > BUDGET / 2, "the delay line took the flood: {first:?}");
    assert!(first.budget_drops > 0, "the flood was twice the budget: {first:?}");
    // An edit: x goes, y comes. x's packets drain apart, still in the budget, and y gets only what is left.
    let bound = QueueBudget::default().bound(1);
    shell.retune("a", PodPipeline::new([(&y, long.as_ref())], bound, 1, shell.now()));
    flood("10.77.0.3".parse().unwrap());
    let (counters, second) = shell.counters("a").unwrap();
    println!("after the edit and the second flood: {second:?}, y: {counters:?}");
    assert!(
        second.queued_bytes <= BUDGET,
        "{} bytes queued with the draining pipeline, budget {BUDGET}",
        second.queued_bytes
    );
    assert!(second.budget_drops > first.budget_drops, "y had no room beside x's draining queue: {second:?}");
    capture.detach().await.unwrap();
}

#[tokio::test]
async fn an_ipv6_destination_is_delayed_too() {
    let pair = Pair::new("us-v6");
    let impaired: IpAddr = "fd77::2".parse().unwrap();
    let _echo = echo(&pair.b, impaired);
    let latency = impairment(ImpairmentFields { latency: Some(Duration::from_millis(20)), ..Default::default() });
    let (_agent_ns, _pod_ns, capture, _shell) = start(&pair, &[(net("fd77::2/128"), latency)]).await;
    let a = pair.a.clone();
    let rtts = tokio::task::spawn_blocking(move || {
        let socket = in_netns(&a, || UdpSocket::bind(("::", 0))).unwrap();
        round_trips(socket, impaired, 100, WAIT)
    })
    .await
    .unwrap();
    let slow = median(&rtts);
    println!("median RTT to {impaired}: {slow:.3} ms (20 ms one way)");
    assert!((20.0..23.0).contains(&slow), "IPv6 destination: median {slow} ms, want 20 ms plus at most 3");
    capture.detach().await.unwrap();
}

/// The capture socket of `shard` on `vb` in namespace `ns`.
fn shard_socket(ns: &str, shard: u32) -> RxSocket {
    in_netns(ns, || {
        let index = nix::net::if_::if_nametoindex("vb").unwrap();
        RxSocket::open(index, &shard::filter(shard)).unwrap()
    })
}

/// Every IP packet waiting on `rx` now.
fn read_all(rx: &RxSocket) -> Vec<Vec<u8>> {
    let (mut slots, mut headers, mut got, mut all) =
        (vec![Vec::new(); 16], MsgHeaders::default(), Vec::new(), Vec::new());
    loop {
        got.clear();
        let n = rx.recv_batch(&mut slots, 2048, &mut headers, &mut got).unwrap();
        all.extend(got.iter().map(|&i| slots[i].clone()));
        if n < slots.len() {
            return all;
        }
    }
}

/// Everything waiting on `rx` now: the IPv4 packets' destinations, and how many others.
fn drain(rx: &RxSocket) -> (Vec<std::net::Ipv4Addr>, usize) {
    let (mut v4, mut others) = (Vec::new(), 0);
    for packet in read_all(rx) {
        if packet[0] >> 4 == 4 && packet.len() >= 20 {
            v4.push(std::net::Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]));
        } else {
            others += 1;
        }
    }
    (v4, others)
}

#[test]
fn a_destination_whose_capture_queue_overflows_holds_up_no_other() {
    let pair = Pair::new("us-shards");
    let sockets: Vec<_> = (0..shard::SHARDS).map(|s| shard_socket(&pair.b, s)).collect();
    let (busy, quiet): (IpAddr, IpAddr) = ("10.77.0.2".parse().unwrap(), "10.77.0.3".parse().unwrap());
    let (busy_shard, quiet_shard) = (shard::shard_of(busy) as usize, shard::shard_of(quiet) as usize);
    assert_ne!(busy_shard, quiet_shard, "neighbours share a shard");
    let socket = in_netns(&pair.a, || UdpSocket::bind(("0.0.0.0", 0))).unwrap();
    // The neighbours first (datagrams waiting for one are dropped before the wire), then a clean slate.
    for d in [busy, quiet] {
        socket.send_to(&[0u8; 100], (d, 9)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    for rx in &sockets {
        drain(rx);
        rx.take_dropped().unwrap();
    }
    // Nobody reads while the busy destination's queue overflows; then ten datagrams to the quiet one.
    for _ in 0..3000 {
        socket.send_to(&[0u8; 1400], (busy, 9)).unwrap();
    }
    for _ in 0..10 {
        socket.send_to(&[0u8; 1400], (quiet, 9)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let dropped: Vec<u64> = sockets.iter().map(|rx| rx.take_dropped().unwrap()).collect();
    let read: Vec<(Vec<std::net::Ipv4Addr>, usize)> = sockets.iter().map(drain).collect();
    println!(
        "dropped per shard {dropped:?}; IPv4 read per shard {:?}",
        read.iter().map(|r| r.0.len()).collect::<Vec<_>>()
    );
    assert!(dropped[busy_shard] > 0, "the busy destination's queue never filled");
    assert_eq!(dropped[quiet_shard], 0, "the quiet destination lost datagrams to the busy one's backlog");
    assert_eq!(read[quiet_shard].0, vec![quiet; 10], "the quiet destination's shard holds its ten datagrams, only");
    for (shard, (v4, _)) in read.iter().enumerate() {
        assert!(v4.iter().all(|d| shard::shard_of(IpAddr::V4(*d)) as usize == shard), "shard {shard} read {v4:?}");
    }
    let busy_read = read[busy_shard].0.len() as u64;
    assert!(busy_read + dropped[busy_shard] >= 3000, "{busy_read} read + {} dropped of 3000", dropped[busy_shard]);
}

#[test]
fn packets_the_kernel_drops_from_an_unread_capture_socket_are_counted_once() {
    let pair = Pair::new("us-overrun");
    // A packet socket on `vb` that nobody reads: its receive buffer (the kernel's default, a few hundred KB) fills.
    let rx = shard_socket(&pair.b, shard::shard_of("10.77.0.2".parse().unwrap()));
    let socket = in_netns(&pair.a, || UdpSocket::bind(("0.0.0.0", 0))).unwrap();
    // The neighbour first (datagrams waiting for it would be dropped before the wire), then a clean slate.
    socket.send_to(&[0u8; 100], ("10.77.0.2", 9)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    read_all(&rx);
    rx.take_dropped().unwrap();
    let sent = 3000;
    for _ in 0..sent {
        socket.send_to(&[0u8; 1400], ("10.77.0.2", 9)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let dropped = rx.take_dropped().unwrap();
    let read = read_all(&rx).len() as u64;
    println!("{sent} datagrams: {read} read from the socket, {dropped} dropped by the kernel");
    // Every datagram is either read or dropped; the link's own chatter (IPv6 neighbour discovery and multicast
    // reports) may add a few frames either way.
    assert!(dropped > 0, "the buffer never filled: {read} read");
    assert!(read + dropped >= sent && read + dropped <= sent + 8, "{read} read + {dropped} dropped of {sent}");
    assert_eq!(rx.take_dropped().unwrap(), 0, "reading the statistics resets them");
}
