//! The cluster smoke test's checks (`make cluster-smoke` = e2e/cluster/smoke): every pass/fail decision of the
//! smoke. The script brings the cluster up and down, builds the image, takes the machine's snapshots and prints
//! diagnostics on failure; it runs this binary for each verdict. A plain binary (`harness = false`): one mode
//! per run, each printing a `PASS …` line per check passed (stderr, as the script's log) and, on a failed check,
//! a `FAIL …` line with its diagnostic and exit status 1.
//!
//! Modes:
//! - `image ARCHIVE1 DIGEST1 ARCHIVE2 DIGEST2`: two builds of the image gave the same digest and the same bytes.
//! - `checks`: the running cluster is a real one (`checks()` below): nodes Ready, at least 2 schedulable; pods
//!   a1, a2 on node A and b1 on node B from the image (which the script loaded); kubectl exec and logs; ping and
//!   TCP within and across nodes; two Services through their ClusterIP and their load balancing; the kubernetes
//!   Service from a pod; garbage collection; and, unless the provider is kind, the network safety properties.
//! - `nodes-ready LABEL`: every node Ready (after another `up`).
//! - `leaves-nothing LABEL BASE CUR`: the snapshot CUR (`e2e/cluster/lib/snapshot.sh take`, after a `down`)
//!   holds nothing of the cluster's that the snapshot BASE (before the first `up`) lacks (`isthmus_e2e::snapshot`).
//!
//! Environment (e2e/cluster/smoke sets each; the modes that ask the cluster need the first group):
//! - `KUBECONFIG`, `ISTHMUS_E2E_KUBECTL` (kubectl binary), `ISTHMUS_E2E_CLUSTER` (the e2e/cluster/cluster
//!   script, for `node-exec`), `ISTHMUS_E2E_PROVIDER` (`local`, `vm` or `kind`);
//! - `ISTHMUS_SMOKE_NAMESPACE` (the checks' namespace), `ISTHMUS_SMOKE_IMAGE` (the image the pods run, loaded on
//!   every node), `ISTHMUS_SMOKE_MARKER` (what the image's /etc/isthmus-smoke holds);
//! - unless the provider is kind, the address plan of e2e/cluster/lib/net.sh: `ISTHMUS_SMOKE_BRIDGE`,
//!   `ISTHMUS_SMOKE_BRIDGE_IP`, `ISTHMUS_SMOKE_API_PORT`, `ISTHMUS_SMOKE_KUBERNETES_SERVICE_IP`, and
//!   `ISTHMUS_SMOKE_BASE` (the snapshot taken before the first `up`: its `sysctls`);
//! - `ISTHMUS_SMOKE_T0` (optional): the script's start (seconds since the epoch), so that log lines count from it.
//!
//! Host facts are read with `ss`, `ip` and /proc/sys; nodes' through `cluster node-exec`. Every wait is bounded.

mod gc;
mod pods;
mod safety;
mod services;
mod snapshot;

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, ExitCode};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use isthmus_e2e::{Output, kubectl, kubectl_json, kubectl_raw};

const USAGE: &str = "usage: cluster_smoke image ARCHIVE1 DIGEST1 ARCHIVE2 DIGEST2 | checks | nodes-ready LABEL \
                     | leaves-nothing LABEL BASE CUR (see the header of e2e/suite/tests/cluster_smoke/main.rs)";

static T0: OnceLock<f64> = OnceLock::new();
/// Where the check that failed panicked.
static PLACE: Mutex<String> = Mutex::new(String::new());

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("a clock after 1970").as_secs_f64()
}

/// A line of the smoke's log (stderr): `[HH:MM:SS +SECONDS] text`, as e2e/cluster/lib/common.sh's `log`.
pub fn log(text: &str) {
    let t = now();
    let since = t - T0.get_or_init(now);
    let day = t as u64 % 86_400;
    eprintln!("[{:02}:{:02}:{:02} +{since:6.2}s] {text}", day / 3600, day / 60 % 60, day % 60);
}

pub fn pass(text: &str) {
    log(&format!("PASS {text}"));
}

/// Seconds since `t`, one decimal (e2e/cluster/lib/common.sh's `elapsed`).
pub fn elapsed(t: Instant) -> String {
    format!("{:.1}", t.elapsed().as_secs_f64())
}

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set (e2e/cluster/smoke sets it; see {USAGE})"))
}

pub fn sleep_s(seconds: f64) {
    std::thread::sleep(Duration::from_secs_f64(seconds));
}

/// A command on this machine; its output whatever its exit status.
pub fn host(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The checks' namespace and image, and kubectl in that namespace.
pub struct Smoke {
    pub ns: String,
    pub image: String,
}

impl Smoke {
    fn from_env() -> Smoke {
        Smoke { ns: env("ISTHMUS_SMOKE_NAMESPACE"), image: env("ISTHMUS_SMOKE_IMAGE") }
    }

    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["-n", self.ns.as_str()];
        all.extend_from_slice(args);
        all
    }

    /// `kubectl -n NS ARGS` that must succeed; its stdout.
    pub fn kn(&self, args: &[&str]) -> String {
        kubectl(&self.args(args))
    }

    /// `kubectl -n NS ARGS`, whatever its exit status.
    pub fn kn_raw(&self, args: &[&str]) -> Output {
        kubectl_raw(&self.args(args), None)
    }

    /// `kubectl -n NS exec POD -- CMD...`, whatever its exit status.
    pub fn exec(&self, pod: &str, cmd: &[&str]) -> Output {
        let mut all = vec!["exec", pod, "--"];
        all.extend_from_slice(cmd);
        self.kn_raw(&all)
    }
}

/// `kubectl apply -f -` of `manifest` (which names its namespace), which must succeed.
pub fn apply(manifest: &str) {
    let out = kubectl_raw(&["apply", "-f", "-"], Some(manifest));
    assert!(out.ok, "kubectl apply failed: {}{}", out.stdout, out.stderr);
}

/// The names of the nodes `kubectl get nodes ARGS` lists, in its order.
pub fn node_names(args: &[&str]) -> Vec<String> {
    let mut all = vec!["get", "nodes"];
    all.extend_from_slice(args);
    let v = kubectl_json(&all);
    v["items"]
        .as_array()
        .expect("a node list")
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .map(Into::into)
        .collect()
}

pub fn wait_nodes_ready() {
    kubectl(&["wait", "--for=condition=Ready", "node", "--all", "--timeout=60s"]);
}

/// Everything `checks` proves, in the order the bash version did.
fn checks() {
    let smoke = Smoke::from_env();
    let (a, b) = pods::schedulable_nodes();
    let pods = pods::start(&smoke, a, b);
    pods::exec_and_logs(&smoke);
    pods::connectivity(&smoke, &pods);
    services::services(&smoke, &pods);
    gc::garbage_collection(&smoke);
    if env("ISTHMUS_E2E_PROVIDER") != "kind" {
        safety::network_safety(&smoke, &pods);
    }
}

fn image(archive1: &str, digest1: &str, archive2: &str, digest2: &str) {
    let same_bytes = match (std::fs::read(archive1), std::fs::read(archive2)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    assert!(digest1 == digest2 && same_bytes, "two builds of one image differ ({digest1}, {digest2})");
    pass(&format!("image {} built twice with the same bytes ({digest1})", env("ISTHMUS_SMOKE_IMAGE")));
}

fn nodes_ready(label: &str) {
    wait_nodes_ready();
    pass(&format!("{label}: {} nodes Ready", kubectl(&["get", "nodes", "--no-headers"]).lines().count()));
}

fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

fn main() -> ExitCode {
    let start = std::env::var("ISTHMUS_SMOKE_T0").ok().and_then(|t| t.parse().ok()).unwrap_or_else(now);
    T0.set(start).expect("T0 set once");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run: Box<dyn FnOnce()> = match args.as_slice() {
        ["image", a1, d1, a2, d2] => Box::new(|| image(a1, d1, a2, d2)),
        ["checks"] => Box::new(checks),
        ["nodes-ready", label] => Box::new(|| nodes_ready(label)),
        ["leaves-nothing", label, base, cur] => Box::new(|| snapshot::leaves_nothing(label, base, cur)),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // A failed check is a verdict, not a crash: its message and place, without a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let place = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        *PLACE.lock().unwrap_or_else(|p| p.into_inner()) = place;
    }));
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(payload) => {
            let text = message(payload.as_ref());
            log(&format!("FAIL {text}"));
            // For e2e/failures.py, which sums up a failed `make test` stage.
            let place = PLACE.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("FAILED: cluster smoke {}: {folded} ({place})", args[0]);
            ExitCode::FAILURE
        }
    }
}
