//! Plan computation at the scales of issue 5, printed as a table:
//! `cargo bench -p isthmus-operator --bench plan`.
//!
//! - 1,000 pods × 100 links: 10 namespaces × 100 pods on 20 nodes; in each namespace 10 apps of 10 pods, each
//!   with a Service, and 10 links `app-j → app-(j+1)`; dual-stack pods.
//! - 200-pod full mesh: one link `{} → {}` in one namespace: 200 × 199 = 39,800 directed pairs.
//! - one-pod update at 1,000 pods × 100 links: a destination pod changes its IP, then `recompute`.
//! - NetworkTopology of issue 16: 20 regions (the Azure dataset's) × 50 pods, expanded into 400 NetworkLinks
//!   (380 directed region pairs and 20 intra-region), then the full plan: 1,000 pods, 999 destinations each.
//! - 10,000 pods × 100 links (issue 32): the same namespaces, links and Services with 100 pods per app, single-stack,
//!   on 100 nodes (100 pods each): 100 sources × 101 destinations per link, 1,010,000 pairs, within the default
//!   total pair limit; the full plan and the one-pod update as above.
//! - memory: bytes held by the planner after the full computation and the allocation peak during it (a
//!   counting allocator), for the 1,000 and the 10,000 pod worlds, and the process's peak RSS; and bytes held per pair for one link at the default
//!   per-link limit: 1,000 source pods × 512 destinations (256 dual-stack pods), 512,000 pairs; and the
//!   planner at the default total pair limit: five such links in five namespaces ask for 2,560,000 pairs, of
//!   which the first four, 2,048,000 pairs, would exceed 2,000,000: three are admitted and two refused.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use isthmus_operator::api::{ImpairmentSpec, NetworkLink};
use isthmus_operator::index::{Index, LinkInfo, ObjectKey};
use isthmus_operator::plan::{PlanLimits, Planner, compute, compute_with};
use isthmus_test_kit::stats::Sorted;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

#[path = "support/worlds.rs"]
mod worlds;
use worlds::{labels, link, pod, selector, ten_thousand_pods_hundred_links, thousand_pods_hundred_links};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn mesh(pods: u32) -> Index {
    let mut index = Index::default();
    for i in 0..pods {
        let (k, mut v) = pod("mesh", &format!("peer-{i:03}"), "peer", (i as usize) % 10, i + 1);
        v.ips.truncate(1);
        index.pods.insert(k, v);
    }
    let (k, v) = link("mesh", "mesh", LabelSelector::default(), LabelSelector::default());
    index.links.insert(k, v);
    index
}

struct Row {
    scenario: &'static str,
    median: Duration,
    max: Duration,
    target: Duration,
    detail: String,
}

/// One link from 1,000 pods to 256 dual-stack pods (512 destinations, the default per-link limit).
fn wide() -> Index {
    wide_namespaces(1)
}

/// `count` namespaces like [`wide`]'s, each with its own 1,000 × 512 link.
fn wide_namespaces(count: u32) -> Index {
    let mut index = Index::default();
    for w in 0..count {
        let ns = if w == 0 { "wide".to_owned() } else { format!("wide-{w}") };
        index.namespaces.insert(ns.clone(), labels(&[("kubernetes.io/metadata.name", &ns)]));
        for n in 0..1256u32 {
            let app = if n < 1000 { "client" } else { "server" };
            let (k, v) = pod(&ns, &format!("{app}-{n}"), app, (n as usize) % 20, w * 1256 + n + 1);
            index.pods.insert(k, v);
        }
        let (k, v) = link(&ns, "wan", selector(&[("app", "client")]), selector(&[("app", "server")]));
        index.links.insert(k, v);
    }
    index
}

/// 20 regions × 50 single-stack pods labelled `isthmus.dev/region`, and the NetworkTopology over them.
fn topology_world() -> (Index, isthmus_operator::topology::NetworkTopologySpec) {
    use isthmus_operator::topology::dataset::{DatasetRegion, table};
    use isthmus_operator::topology::spec::{DEFAULT_PRIORITY, Dataset, RegionSpec};
    let mut index = Index::default();
    index.namespaces.insert("world".into(), labels(&[("kubernetes.io/metadata.name", "world")]));
    let regions: Vec<String> = table(Dataset::Azure).regions().iter().take(20).cloned().collect();
    let mut n = 0;
    for (r, region) in regions.iter().enumerate() {
        for i in 0..50 {
            n += 1;
            let (k, mut v) = pod("world", &format!("{region}-{i}"), "db", (n as usize) % 20, n);
            v.ips.truncate(1);
            v.labels.insert("isthmus.dev/region".into(), format!("r{r}"));
            index.pods.insert(k, v);
        }
    }
    let spec = isthmus_operator::topology::NetworkTopologySpec {
        region_label: Some("isthmus.dev/region".into()),
        regions: regions
            .iter()
            .enumerate()
            .map(|(r, d)| RegionSpec {
                name: format!("r{r}"),
                pod_selector: None,
                dataset_region: Some(DatasetRegion(d.clone())),
            })
            .collect(),
        dataset: Some(Dataset::Azure),
        default: None,
        intra_region: Some(ImpairmentSpec { latency: Some("1ms".into()), ..Default::default() }),
        links: vec![],
        routing: None,
        priority: DEFAULT_PRIORITY,
        verify: None,
    };
    (index, spec)
}

/// Expansion of the topology into its links, then the full plan over them.
fn topology_plan(world: &(Index, isthmus_operator::topology::NetworkTopologySpec), runs: usize) -> Row {
    let mut samples = Vec::with_capacity(runs);
    let (mut pairs, mut links, mut max_per_pod) = (0, 0, 0);
    for _ in 0..runs {
        let mut index = world.0.clone();
        let start = Instant::now();
        let expansion = isthmus_operator::topology::expand("world", &world.1).expect("the world expands");
        for child in &expansion.children {
            let mut l = NetworkLink::new(&child.name, child.spec.clone());
            l.metadata.namespace = Some("world".into());
            l.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()));
            let (k, v) = LinkInfo::from_link(&l);
            index.links.insert(k, v);
        }
        let planner = compute(index);
        samples.push(start.elapsed());
        links = expansion.children.len();
        let per_pod: Vec<usize> = planner.node_plans().flat_map(|p| &p.pods).map(|p| p.destinations.len()).collect();
        pairs = per_pod.iter().sum();
        max_per_pod = per_pod.iter().copied().max().unwrap_or(0);
    }
    let (median, max) = median_of(samples);
    Row {
        scenario: "topology: expand + full plan, 20 regions × 50 pods",
        median,
        max,
        target: Duration::from_millis(50),
        detail: format!("{links} links, {pairs} pairs, ≤ {max_per_pod} destinations per pod, {runs} runs"),
    }
}

fn median_of(samples: Vec<Duration>) -> (Duration, Duration) {
    let sorted = Sorted::new(samples).expect("at least one run");
    (sorted.median(), sorted.max())
}

fn full(scenario: &'static str, index: &Index, runs: usize, target: Duration) -> Row {
    let mut samples = Vec::with_capacity(runs);
    let mut pairs = 0;
    for _ in 0..runs {
        let input = index.clone();
        let start = Instant::now();
        let planner = compute(input);
        samples.push(start.elapsed());
        pairs = planner.node_plans().map(|p| p.pods.iter().map(|p| p.destinations.len()).sum::<usize>()).sum();
    }
    let (median, max) = median_of(samples);
    Row { scenario, median, max, target, detail: format!("{pairs} pairs, {runs} runs") }
}

fn one_pod_update(scenario: &'static str, index: &Index, runs: usize, target: Duration) -> Row {
    let mut planner = compute(index.clone());
    let key = ObjectKey::new("ns-3", "app-4-7");
    let original = planner.index().pods[&key].clone();
    let mut moved = original.clone();
    let new_ips = ["10.200.0.1".parse().unwrap(), "fd00::ffff".parse().unwrap()];
    moved.ips = new_ips[..original.ips.len()].to_vec();
    let mut samples = Vec::with_capacity(runs);
    let mut nodes = 0;
    for i in 0..runs {
        let next = if i % 2 == 0 { moved.clone() } else { original.clone() };
        let start = Instant::now();
        planner.upsert_pod(key.clone(), next);
        let changes = planner.recompute();
        samples.push(start.elapsed());
        nodes = changes.nodes.len();
    }
    let (median, max) = median_of(samples);
    Row {
        scenario,
        median,
        max,
        target,
        detail: format!("destination pod IP change; {nodes} node plans changed; {runs} runs"),
    }
}

/// What the planner holds after the full computation over `index`, and the allocation peak during it.
fn memory(index: &Index) -> (usize, usize) {
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let planner: Planner = compute(index.clone());
    let held = CURRENT.load(Ordering::Relaxed) - before;
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(planner);
    (held, peak)
}

fn peak_rss_kib() -> Option<u64> {
    isthmus_test_kit::proc::status_kib(&std::fs::read_to_string("/proc/self/status").ok()?, "VmHWM")
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing else: run a single quick pass then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 1 } else { 31 };

    let big = thousand_pods_hundred_links();
    let huge = ten_thousand_pods_hundred_links();
    let mesh = mesh(200);
    let updates = if quick { 2 } else { 1001 };
    let rows = [
        full("full plan, 1,000 pods × 100 links", &big, runs, Duration::from_millis(20)),
        full("full plan, 200-pod full mesh", &mesh, runs, Duration::from_millis(200)),
        one_pod_update("one-pod update (1,000 pods × 100 links)", &big, updates, Duration::from_millis(1)),
        topology_plan(&topology_world(), runs),
        full("full plan, 10,000 pods × 100 links", &huge, if quick { 1 } else { 11 }, Duration::from_millis(100)),
        one_pod_update("one-pod update (10,000 pods × 100 links)", &huge, updates, Duration::from_micros(200)),
    ];

    // Memory: what the planner keeps, and the allocation peak while computing, for the 1,000 × 100 world.
    let (held, peak) = memory(&big);
    let (huge_held, huge_peak) = memory(&huge);
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mesh_planner = compute(mesh.clone());
    let mesh_held = CURRENT.load(Ordering::Relaxed) - before;
    let mesh_peak = PEAK.load(Ordering::Relaxed) - before;
    drop(mesh_planner);
    let wide = wide();
    let before = CURRENT.load(Ordering::Relaxed);
    let wide_planner = compute(wide);
    let wide_held = CURRENT.load(Ordering::Relaxed) - before;
    let wide_pairs: usize = wide_planner.node_plans().flat_map(|n| &n.pods).map(|p| p.destinations.len()).sum();
    drop(wide_planner);
    // At the default total: what the pair limit lets the operator hold, however many links ask.
    let capped = wide_namespaces(5);
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let capped_planner = compute_with(capped, PlanLimits::DEFAULT);
    let capped_held = CURRENT.load(Ordering::Relaxed) - before;
    let capped_peak = PEAK.load(Ordering::Relaxed) - before;
    let capped_pairs: usize = capped_planner.node_plans().flat_map(|n| &n.pods).map(|p| p.destinations.len()).sum();
    drop(capped_planner);

    println!("| scenario | median | max | target | notes |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        let ok = if r.median <= r.target { "" } else { " **over target**" };
        println!(
            "| {} | {:.3} ms | {:.3} ms | ≤ {} ms{ok} | {} |",
            r.scenario,
            r.median.as_secs_f64() * 1e3,
            r.max.as_secs_f64() * 1e3,
            r.target.as_secs_f64() * 1e3,
            r.detail
        );
    }
    println!(
        "| memory, 1,000 pods × 100 links | {:.1} MiB held | {:.1} MiB peak alloc | ≤ 100 MiB | planner with index, resolutions and node plans |",
        mib(held),
        mib(peak)
    );
    println!(
        "| memory, 10,000 pods × 100 links | {:.1} MiB held | {:.1} MiB peak alloc | ≤ 256 MiB (chart default) | single-stack pods, 1,010,000 pairs |",
        mib(huge_held),
        mib(huge_peak)
    );
    println!(
        "| memory, 200-pod mesh | {:.1} MiB held | {:.1} MiB peak alloc | ≤ 100 MiB | |",
        mib(mesh_held),
        mib(mesh_peak)
    );
    println!(
        "| memory per pair, 1,000 sources × 512 destinations | {:.0} B/pair | {:.1} MiB held | ≤ 64 B/pair | {wide_pairs} pairs, one link |",
        wide_held as f64 / wide_pairs as f64,
        mib(wide_held)
    );
    println!(
        "| memory at the default total pair limit ({} pairs) | {:.1} MiB held | {:.1} MiB peak alloc | ≤ 256 MiB (chart default) | {capped_pairs} pairs planned, five 512,000-pair links asking |",
        PlanLimits::DEFAULT.pairs_total(),
        mib(capped_held),
        mib(capped_peak)
    );
    if let Some(kib) = peak_rss_kib() {
        println!("| process peak RSS (whole benchmark) | {:.1} MiB | | ≤ 100 MiB | VmHWM |", kib as f64 / 1024.0);
    }
}
