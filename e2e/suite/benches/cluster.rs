//! Cluster benchmark (issue 7): on a real cluster with 20 probe pods (10 `src`, 10 `dst`, one NetworkLink
//! src → dst = 100 pairs),
//!   1. `kubectl apply` of a link (create, then an edit) → the link's `Ready=True/Applied` for that generation
//!      with `pairsApplied == pairs`, as seen by a `kubectl get --watch` started beforehand;
//!   2. a replacement `src` pod's `Ready=True` (seen by a pod watch) → its impairment really in its kernel, read
//!      host-side with iproute2 in the pod's network namespace, independent of the agent: on the tc datapath
//!      isthmus's HTB root and one TBF per destination on eth0 (`tc -j qdisc show`), on the userspace datapath a
//!      route through the capture (`isth-u0`) for every destination address in the capture's table (polled as
//!      fast as `nsenter` runs; local provider only: it needs the pods' namespaces on this machine).
//!
//! Prints a table (n, median, p90, p99, max). Not a test: nothing here asserts a time.
//!
//! Run through `make bench-cluster` (= `ISTHMUS_E2E_BENCH=1 e2e/suite/run`: cluster, images, chart, then this).
//! `BENCH_APPLIES` (default 30) and `BENCH_REPLACEMENTS` (default 25) set the sample counts;
//! `ISTHMUS_E2E_DATAPATH` (`tc`, the default, or `userspace`) the datapath the chart was installed with, whose
//! state this bench reads (`make bench-cluster BENCH_DATAPATH=userspace`).

use isthmus_e2e::{TestNamespace, kubectl, kubectl_raw, link_manifest, probe_image};
use isthmus_test_kit::stats::Sorted;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

const SOURCES: usize = 10;
const DESTINATIONS: usize = 10;
const LINK: &str = "bench";

/// `kubectl get <what> --watch -o json --output-watch-events`; every event arrives with the instant it was read.
struct Watch {
    child: Child,
    events: Receiver<(Instant, Value)>,
}

impl Watch {
    fn start(namespace: &str, what: &str) -> Self {
        let bin = std::env::var("ISTHMUS_E2E_KUBECTL").unwrap_or_else(|_| "kubectl".into());
        let mut child = Command::new(&bin)
            .args(["-n", namespace, "get", what, "--watch", "-o", "json", "--output-watch-events"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, events) = channel();
        std::thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>();
            for event in stream {
                let Ok(event) = event else { break };
                if tx.send((Instant::now(), event)).is_err() {
                    break;
                }
            }
        });
        Watch { child, events }
    }

    /// Events until `done` returns Some (panics after `timeout`, naming `what`).
    fn until<T>(&self, what: &str, timeout: Duration, mut done: impl FnMut(Instant, &Value) -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok((at, event)) => {
                    if let Some(v) = done(at, &event) {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("timed out after {timeout:?} waiting for {what}"),
                Err(RecvTimeoutError::Disconnected) => panic!("the watch ended while waiting for {what}"),
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The link is Ready=True/Applied for its current generation with every pair applied: Some(pairs).
fn link_applied(link: &Value) -> Option<i64> {
    let generation = link["metadata"]["generation"].as_i64()?;
    let ready = link["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
    let pairs = link["status"]["pairs"].as_i64()?;
    (ready["observedGeneration"].as_i64() == Some(generation)
        && ready["status"] == "True"
        && ready["reason"] == "Applied"
        && link["status"]["pairsApplied"].as_i64() == Some(pairs))
    .then_some(pairs)
}

fn pod_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// A process whose network namespace has `ip` as a local address (`/proc/<pid>/net/fib_trie`: the address
/// followed by `/32 host LOCAL`); its `/proc/<pid>/ns/net` is the pod's namespace.
fn netns_of_ip(ip: &str) -> Option<String> {
    let needle = format!("-- {ip}\n");
    let mut seen = HashSet::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let dir = entry.path();
        let Ok(ns) = std::fs::read_link(dir.join("ns/net")) else { continue };
        if !seen.insert(ns) {
            continue;
        }
        let Ok(trie) = std::fs::read_to_string(dir.join("net/fib_trie")) else { continue };
        if let Some(at) = trie.find(&needle)
            && trie[at + needle.len()..].lines().next().is_some_and(|l| l.contains("/32 host LOCAL"))
        {
            return Some(dir.join("ns/net").display().to_string());
        }
    }
    None
}

/// The datapath the agents give the pods, so which kernel state says a pod is impaired (docs/datapaths.md).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Datapath {
    Tc,
    Userspace,
}

impl Datapath {
    fn from_env() -> Self {
        match std::env::var("ISTHMUS_E2E_DATAPATH").as_deref() {
            Err(_) | Ok("tc") => Self::Tc,
            Ok("userspace") => Self::Userspace,
            Ok(other) => panic!("ISTHMUS_E2E_DATAPATH={other}: must be tc or userspace"),
        }
    }

    /// How the pod's kernel shows it impaired, for the table's row.
    fn evidence(self) -> &'static str {
        match self {
            Self::Tc => "HTB + 10 TBF in its netns",
            Self::Userspace => "a capture route per destination in its netns",
        }
    }
}

/// The userspace datapath's routing table in a pod's namespace (agent/datapaths/src/userspace/routing.rs).
const CAPTURE_TABLE: &str = "26995";
const CAPTURE_DEVICE: &str = "isth-u0";

fn in_netns(netns: &str, args: &[&str]) -> Option<Value> {
    let out = Command::new("nsenter").arg(format!("--net={netns}")).args(args).output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// How many of `destinations` (addresses) the namespace `netns` impairs, read with iproute2 (independent of the
/// agent): on the tc datapath the TBFs under an HTB root on eth0 (one per destination pod), on the userspace
/// datapath the destinations with a route through the capture in its table, IPv4 and IPv6.
fn impaired_destinations(netns: &str, datapath: Datapath, destinations: &HashSet<String>) -> Option<usize> {
    match datapath {
        Datapath::Tc => {
            let qdiscs = in_netns(netns, &["tc", "-j", "qdisc", "show", "dev", "eth0"])?;
            let kinds: Vec<&str> = qdiscs.as_array()?.iter().filter_map(|q| q["kind"].as_str()).collect();
            let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
            Some(if count("htb") >= 1 { count("tbf") } else { 0 })
        }
        Datapath::Userspace => {
            let mut routed = 0;
            for family in ["-4", "-6"] {
                // A namespace never captured has no such table: `ip` says so and prints no JSON, which is 0 routes.
                let Some(routes) = in_netns(netns, &["ip", "-j", family, "route", "show", "table", CAPTURE_TABLE])
                else {
                    continue;
                };
                routed += routes
                    .as_array()?
                    .iter()
                    .filter(|r| {
                        r["dev"] == CAPTURE_DEVICE
                            && r["dst"].as_str().is_some_and(|d| destinations.contains(strip_prefix_len(d)))
                    })
                    .count();
            }
            Some(routed)
        }
    }
}

/// `10.0.0.7/32` → `10.0.0.7` (iproute2 prints host routes without the length, others with it).
fn strip_prefix_len(dst: &str) -> &str {
    dst.split_once('/').map_or(dst, |(addr, _)| addr)
}

/// Every address of the pods selected by `selector`, as the link's destinations.
fn addresses(ns: &TestNamespace, selector: &str) -> HashSet<String> {
    ns.json(&["get", "pods", "-l", selector])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .flat_map(|p| p["status"]["podIPs"].as_array().cloned().unwrap_or_default())
        .filter_map(|ip| ip["ip"].as_str().map(str::to_owned))
        .collect()
}

/// A thread that finds the namespace of `ip` and returns the first instant it impairs every destination.
fn spawn_impairment_poller(ip: String, target: Target) -> std::thread::JoinHandle<Instant> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        let netns = loop {
            if let Some(n) = netns_of_ip(&ip) {
                break n;
            }
            assert!(Instant::now() < deadline, "no network namespace has {ip}");
            std::thread::sleep(Duration::from_millis(5));
        };
        loop {
            if target.fully_impaired(&netns) {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "{ip} not impaired within 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// What a source pod impairs once its links are in its kernel.
#[derive(Clone)]
struct Target {
    datapath: Datapath,
    destinations: std::sync::Arc<HashSet<String>>,
}

impl Target {
    /// The count `impaired_destinations` reads when every destination is impaired: a TBF per destination pod on
    /// the tc datapath, a route per destination address on the userspace datapath.
    fn expected(&self) -> usize {
        match self.datapath {
            Datapath::Tc => DESTINATIONS,
            Datapath::Userspace => self.destinations.len(),
        }
    }

    fn impaired(&self, netns: &str) -> Option<usize> {
        impaired_destinations(netns, self.datapath, &self.destinations)
    }

    fn fully_impaired(&self, netns: &str) -> bool {
        self.impaired(netns) == Some(self.expected())
    }
}

/// Signed milliseconds from `from` to `to` (negative: `to` came first).
fn ms_between(from: Instant, to: Instant) -> f64 {
    if to >= from {
        to.duration_since(from).as_secs_f64() * 1e3
    } else {
        -(from.duration_since(to).as_secs_f64() * 1e3)
    }
}

fn row(what: &str, samples: &[f64], target: &str) -> String {
    let Some(s) = Sorted::of(samples) else {
        return format!("| {what} | 0 | – | – | – | – | {target} |");
    };
    format!(
        "| {what} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {target} |",
        s.len(),
        s.median(),
        s.quantile(0.9),
        s.quantile(0.99),
        s.max()
    )
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn manifest(rate: &str) -> String {
    link_manifest(LINK, "src", "dst", &format!("{{bandwidth: {rate}}}"), None)
}

/// `kubectl apply` of the link; returns the instant just before kubectl started and how long it ran.
fn apply_link(ns: &TestNamespace, rate: &str) -> (Instant, f64) {
    let started = Instant::now();
    ns.apply(&manifest(rate));
    (started, ms_between(started, Instant::now()))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and friends: nothing to enumerate
    }
    if isthmus_e2e::provider() != "local" {
        eprintln!("the cluster bench reads pods' kernel state from this machine's /proc: it needs the local provider");
        std::process::exit(2);
    }
    let applies = env_count("BENCH_APPLIES", 30);
    let replacements = env_count("BENCH_REPLACEMENTS", 25);
    let ns = TestNamespace::new("bench");
    for app in ["src", "dst"] {
        ns.probe_deployment(app, None);
    }
    ns.kubectl(&["scale", "deployment/src", &format!("--replicas={SOURCES}")]);
    ns.kubectl(&["scale", "deployment/dst", &format!("--replicas={DESTINATIONS}")]);
    let pods = Watch::start(&ns.name, "pods");
    let mut ready_pods: HashMap<String, String> = HashMap::new(); // name -> app
    pods.until("20 Ready probe pods", Duration::from_secs(300), |_, e| {
        let pod = &e["object"];
        let name = pod["metadata"]["name"].as_str()?.to_owned();
        if e["type"] == "DELETED" || !pod_ready(pod) {
            ready_pods.remove(&name);
        } else {
            ready_pods.insert(name, pod["metadata"]["labels"]["app"].as_str()?.to_owned());
        }
        (ready_pods.len() == SOURCES + DESTINATIONS).then_some(())
    });
    println!("{} pods Ready ({} image {})", ready_pods.len(), ns.name, probe_image());
    let target = Target { datapath: Datapath::from_env(), destinations: addresses(&ns, "app=dst").into() };
    println!(
        "datapath {:?}: a source pod is impaired when its kernel has {}",
        target.datapath,
        target.datapath.evidence()
    );
    let links = Watch::start(&ns.name, "networklinks");

    // 1. apply → Ready (create, then edit), then delete → gone.
    let (mut from_create, mut from_create_seen, mut delete_to_gone) = (vec![], vec![], vec![]);
    let (mut from_edit, mut from_edit_seen) = (vec![], vec![]);
    // How long the `kubectl apply` process itself ran (start-up, discovery, OpenAPI for client-side apply).
    let (mut create_kubectl, mut edit_kubectl) = (vec![], vec![]);
    for round in 0..applies {
        let (started, kubectl_ms) = apply_link(&ns, "20Mbit");
        create_kubectl.push(kubectl_ms);
        let mut created_seen = None;
        let pairs = links.until("the new link Ready", Duration::from_secs(60), |at, e| {
            let link = &e["object"];
            if e["type"] == "ADDED" && created_seen.is_none() {
                created_seen = Some(at);
            }
            link_applied(link).map(|pairs| (at, pairs))
        });
        let (ready_at, pairs) = pairs;
        assert_eq!(pairs as usize, SOURCES * DESTINATIONS, "pairs of the link");
        from_create.push(ms_between(started, ready_at));
        from_create_seen.push(ms_between(created_seen.unwrap_or(started), ready_at));
        if round == 0 {
            // Once: is Ready truthful? Every source pod's kernel must already hold the tree.
            let src = ns.json(&["get", "pods", "-l", "app=src"]);
            for p in src["items"].as_array().into_iter().flatten() {
                let ip = p["status"]["podIP"].as_str().unwrap_or_default();
                let netns = netns_of_ip(ip).unwrap_or_else(|| panic!("no network namespace has {ip}"));
                let impaired = target.impaired(&netns);
                assert_eq!(
                    impaired,
                    Some(target.expected()),
                    "src pod {ip} right after Ready: destinations impaired in its kernel"
                );
            }
            println!("round 0: at Ready every src pod's kernel already had {}", target.datapath.evidence());
        }
        let (started, kubectl_ms) = apply_link(&ns, "30Mbit");
        edit_kubectl.push(kubectl_ms);
        let mut edit_seen = None;
        let ready_at = links.until("the edited link Ready", Duration::from_secs(60), |at, e| {
            let link = &e["object"];
            if link["metadata"]["generation"].as_i64() != Some(2) {
                return None;
            }
            edit_seen.get_or_insert(at);
            link_applied(link).is_some().then_some(at)
        });
        from_edit.push(ms_between(started, ready_at));
        from_edit_seen.push(ms_between(edit_seen.unwrap_or(started), ready_at));
        let started = Instant::now();
        let out = kubectl_raw(&["-n", &ns.name, "delete", "networklink", LINK, "--wait=false"], None);
        assert!(out.ok, "kubectl delete: {}", out.stderr);
        let gone =
            links.until("the link deleted", Duration::from_secs(60), |at, e| (e["type"] == "DELETED").then_some(at));
        delete_to_gone.push(ms_between(started, gone));
        eprintln!(
            "apply {round}: create→Ready {:.0} ms (watch-seen→Ready {:.0}), edit→Ready {:.0} ms (seen→Ready {:.0}), \
             delete→gone {:.0} ms",
            from_create[round], from_create_seen[round], from_edit[round], from_edit_seen[round], delete_to_gone[round]
        );
    }

    // 2. replacement pod Ready → its impairment in its kernel.
    apply_link(&ns, "20Mbit");
    links.until("the link Ready", Duration::from_secs(60), |at, e| link_applied(&e["object"]).map(|_| at));
    let mut replacement_ms = vec![];
    let mut applied_before_ready = 0;
    let mut known: HashSet<String> = ready_pods.keys().cloned().collect();
    for round in 0..replacements {
        let victim = ns.json(&["get", "pods", "-l", "app=src"])["items"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| pod_ready(p)).cloned())
            .expect("a Ready src pod");
        let victim = victim["metadata"]["name"].as_str().unwrap().to_owned();
        kubectl(&["-n", &ns.name, "delete", "pod", &victim, "--wait=false"]);
        // The new pod: once the watch shows its IP, a thread finds its netns and polls its kernel state; the same
        // watch gives the instant it is Ready (possibly in the very event that first carries the IP).
        let mut new_pod: Option<(String, String)> = None;
        let mut poller = None;
        let ready_at = pods.until("the replacement pod Ready", Duration::from_secs(120), |at, e| {
            let pod = &e["object"];
            let name = pod["metadata"]["name"].as_str()?;
            if new_pod.is_none() {
                if known.contains(name) || pod["metadata"]["labels"]["app"] != "src" {
                    return None;
                }
                let ip = pod["status"]["podIP"].as_str()?.to_owned();
                poller = Some(spawn_impairment_poller(ip.clone(), target.clone()));
                new_pod = Some((name.to_owned(), ip));
            }
            (new_pod.as_ref().is_some_and(|(n, _)| n == name) && pod_ready(pod)).then_some(at)
        });
        let (name, ip) = new_pod.expect("the replacement pod");
        known.insert(name.clone());
        let applied = poller.expect("a poller for the replacement pod");
        let applied_at = applied.join().expect("impairment poller");
        let ms = ms_between(ready_at, applied_at);
        if ms < 0.0 {
            applied_before_ready += 1;
        }
        replacement_ms.push(ms);
        eprintln!("replacement {round}: {name} ({ip}) Ready → impaired {ms:.0} ms");
        // Let the old pod go, so every round starts with 10 sources (its DELETED event may already have passed
        // the watch while this round waited for the new pod, so ask the API server).
        isthmus_e2e::wait_for(&format!("pod {victim} deleted"), Duration::from_secs(120), || {
            (!kubectl_raw(&["-n", &ns.name, "get", "pod", &victim], None).ok).then_some(())
        });
    }

    println!("\nload average at the end: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!("\n| measurement (ms) | n | median | p90 | p99 | max | target |");
    println!("|---|---|---|---|---|---|---|");
    println!("{}", row("`kubectl apply` (create) → Ready, 100 pairs applied", &from_create, "p50 ≤ 300, p99 ≤ 1000"));
    println!("{}", row("link ADDED seen by a watch → Ready", &from_create_seen, ""));
    println!(
        "{}",
        row("`kubectl apply` (edit rate) → Ready for the new generation", &from_edit, "p50 ≤ 300, p99 ≤ 1000")
    );
    println!("{}", row("the `kubectl apply` (create) process alone", &create_kubectl, ""));
    println!("{}", row("the `kubectl apply` (edit) process alone", &edit_kubectl, ""));
    println!("{}", row("edit (generation 2) seen by a watch → Ready", &from_edit_seen, ""));
    println!("{}", row("`kubectl delete` → link gone (finalizer done)", &delete_to_gone, ""));
    let replaced = format!("replacement pod Ready → {}", target.datapath.evidence());
    println!("{}", row(&replaced, &replacement_ms, "p50 ≤ 300, p99 ≤ 1000"));
    println!(
        "(replacement: {applied_before_ready} of {} impaired before the watch saw Ready: negative)",
        replacement_ms.len()
    );
    let _ = kubectl_raw(&["-n", &ns.name, "delete", "networklink", LINK, "--wait=false"], None);
}
