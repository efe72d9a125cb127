//! Commands on the cluster's nodes (`e2e/cluster/cluster node-exec`: the node's network namespace on the local
//! provider, the guest on the vm provider, the node container on kind), and what they tell about pods' kernel
//! state: the qdiscs isthmus installed, independent of isthmus's own reports.

use std::process::Command;

use serde_json::Value;

use crate::Output;

/// Runs `args` on `node` and returns its output.
pub fn node_exec(node: &str, args: &[&str]) -> Output {
    let cluster = std::env::var("ISTHMUS_E2E_CLUSTER")
        .expect("ISTHMUS_E2E_CLUSTER: the e2e/cluster/cluster script (e2e/suite/run sets it)");
    let out = Command::new(&cluster)
        .arg("node-exec")
        .arg(node)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cluster}: {e}"));
    Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Finds the network namespace whose eth0 holds $1 among the node's processes and runs the rest of the
/// arguments inside it; exits 3 when no namespace has the address.
const IN_POD: &str = r#"
ip=$1; shift
seen=" "
for p in /proc/[0-9]*; do
  ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
  case $seen in *" $ns "*) continue ;; esac
  seen="$seen$ns "
  if nsenter --net="$p/ns/net" ip -o -4 addr show dev eth0 2>/dev/null | grep -q " $ip/"; then
    exec nsenter --net="$p/ns/net" "$@"
  fi
done
exit 3
"#;

/// The datapath the suite's isthmus runs (`ISTHMUS_E2E_DATAPATH`, which `e2e/suite/run` sets from what it
/// installed; `tc` when unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datapath {
    Tc,
    Userspace,
}

pub fn datapath() -> Datapath {
    match std::env::var("ISTHMUS_E2E_DATAPATH").as_deref() {
        Ok("userspace") => Datapath::Userspace,
        Ok("tc") | Err(_) => Datapath::Tc,
        Ok(other) => panic!("ISTHMUS_E2E_DATAPATH={other}: tc or userspace"),
    }
}

/// Runs `args` inside the network namespace of the pod with IP `pod_ip` on `node`.
fn in_pod(node: &str, pod_ip: &str, args: &[&str]) -> String {
    let mut all = vec!["sh", "-c", IN_POD, "sh", pod_ip];
    all.extend_from_slice(args);
    let out = node_exec(node, &all);
    assert!(
        out.ok,
        "no network namespace on {node} has pod IP {pod_ip}, or {args:?} failed ({}{})",
        out.stdout, out.stderr
    );
    out.stdout
}

/// The interfaces in the pod's namespace.
fn pod_interfaces(node: &str, pod_ip: &str) -> Vec<String> {
    let out = in_pod(node, pod_ip, &["ip", "-j", "link", "show"]);
    let v: Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("ip -j link printed no JSON ({e}): {out}"));
    v.as_array()
        .expect("ip -j prints an array")
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

/// The userspace datapath's capture interface in a pod's namespace.
const CAPTURE: &str = "isth-u0";

/// The qdiscs on `eth0` of the pod with IP `pod_ip` on `node`, as `"<kind> <handle>"`, read with iproute2 on
/// the node: an independent reference for what isthmus installed.
pub fn pod_qdiscs(node: &str, pod_ip: &str) -> Vec<String> {
    let out = in_pod(node, pod_ip, &["tc", "-j", "qdisc", "show", "dev", "eth0"]);
    let v: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("tc -j qdisc show on {node} printed no JSON ({e}): {out}"));
    v.as_array()
        .expect("tc -j prints an array")
        .iter()
        .map(|q| format!("{} {}", q["kind"].as_str().unwrap_or("?"), q["handle"].as_str().unwrap_or("?")))
        .collect()
}

/// Asserts what the pod's tree on `node` says, read with iproute2 (`tc qdisc show dev eth0`, whitespace folded):
/// for each `(kind, words)`, a qdisc of that kind whose line holds those words as iproute2 prints them (e.g.
/// `("tbf", "rate 50Mbit")`, `("netem", "delay 40ms")`). The tc datapath only: the userspace datapath emulates in
/// the agent, and what the node shows of it is the capture interface, which is asserted instead.
pub fn assert_pod_shaped(node: &str, pod_ip: &str, expect: &[(&str, &str)]) {
    match datapath() {
        Datapath::Userspace => assert_isthmus_installed(node, pod_ip),
        Datapath::Tc => {
            let out = in_pod(node, pod_ip, &["tc", "qdisc", "show", "dev", "eth0"]);
            let lines: Vec<String> = out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
            for (kind, words) in expect {
                let found =
                    lines.iter().any(|l| l.starts_with(&format!("qdisc {kind} ")) && l.contains(&format!(" {words}")));
                assert!(found, "no {kind} qdisc with \"{words}\" on {pod_ip} eth0 ({node}, tc qdisc show): {lines:#?}");
            }
            println!("tree on {pod_ip} eth0 ({node}, tc): {expect:?} present");
        }
    }
}

fn is_isthmus(qdisc: &str) -> bool {
    ["htb", "tbf", "netem"].iter().any(|k| qdisc.starts_with(k))
}

/// The pod carries what the datapath installs while a link applies — tc: an HTB root on eth0; userspace: the
/// capture interface. Proves the node-side check sees the pod, so its later "nothing left" answer means something.
pub fn assert_isthmus_installed(node: &str, pod_ip: &str) {
    match datapath() {
        Datapath::Tc => {
            let qdiscs = pod_qdiscs(node, pod_ip);
            println!("qdiscs on {pod_ip} eth0 while linked ({node}, tc): {qdiscs:?}");
            assert!(
                qdiscs.iter().any(|q| q.starts_with("htb")),
                "no HTB root on {pod_ip} while a link applies: {qdiscs:?}"
            );
        }
        Datapath::Userspace => {
            let interfaces = pod_interfaces(node, pod_ip);
            println!("interfaces of {pod_ip} while linked ({node}, ip): {interfaces:?}");
            assert!(interfaces.iter().any(|i| i == CAPTURE), "no {CAPTURE} in {pod_ip}'s namespace: {interfaces:?}");
        }
    }
}

/// Nothing of isthmus is left on the pod: no isthmus qdisc (htb/tbf/netem) on eth0, no capture interface.
pub fn assert_nothing_of_isthmus(node: &str, pod_ip: &str) {
    let qdiscs = pod_qdiscs(node, pod_ip);
    let interfaces = pod_interfaces(node, pod_ip);
    println!("qdiscs on {pod_ip} eth0 ({node}, tc): {qdiscs:?}; interfaces: {interfaces:?}");
    assert!(!qdiscs.iter().any(|q| is_isthmus(q)), "isthmus qdiscs left on {pod_ip}: {qdiscs:?}");
    assert!(!interfaces.iter().any(|i| i == CAPTURE), "the capture interface left on {pod_ip}: {interfaces:?}");
}

/// Every network namespace on `node` with an isthmus qdisc on eth0 or the capture interface, as "ip: what"
/// lines (empty when none).
pub fn node_isthmus_left(node: &str) -> Vec<String> {
    const ALL: &str = r#"
seen=" "
for p in /proc/[0-9]*; do
  ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
  case $seen in *" $ns "*) continue ;; esac
  seen="$seen$ns "
  q=$(nsenter --net="$p/ns/net" tc qdisc show dev eth0 2>/dev/null | grep -E '^qdisc (htb|tbf|netem) ' | awk '{print $2, $3}')
  c=$(nsenter --net="$p/ns/net" ip -o link show isth-u0 2>/dev/null | awk -F': ' '{print $2}')
  [ -n "$q$c" ] || continue
  ip=$(nsenter --net="$p/ns/net" ip -o -4 addr show dev eth0 2>/dev/null | awk '{print $4}')
  echo "$ip:" $q $c
done
"#;
    let out = node_exec(node, &["sh", "-c", ALL]);
    assert!(out.ok, "listing qdiscs on {node}: {}{}", out.stdout, out.stderr);
    out.stdout.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
}

/// Whether `node`'s kernel refuses a duplicating netem beside another netem on one interface, as iproute2 meets
/// it on a throwaway veth pair on the node (the restriction reached some stable kernels as a backport,
/// so only asking the kernel tells).
pub fn node_restricts_duplicate_netem(node: &str) -> bool {
    const PROBE: &str = r#"
d=isth-dupprobe
ip link add $d type veth peer name isth-dupprob1 || exit 4
tc qdisc add dev $d root handle 1: htb && tc class add dev $d parent 1: classid 1:1 htb rate 1gbit &&
tc class add dev $d parent 1: classid 1:2 htb rate 1gbit &&
tc qdisc add dev $d parent 1:1 handle 10: netem delay 1ms || { ip link del $d; exit 4; }
out=$(tc qdisc add dev $d parent 1:2 handle 20: netem delay 1ms duplicate 1% 2>&1); rc=$?
ip link del $d
[ $rc -eq 0 ] && exit 0
case $out in *"duplicating netem"*) exit 1 ;; esac
echo "$out"; exit 4
"#;
    let out = node_exec(node, &["sh", "-c", PROBE]);
    match out.code {
        Some(0) => false,
        Some(1) => true,
        _ => panic!("probing {node}'s netem duplicate restriction failed: {}{}", out.stdout, out.stderr),
    }
}

/// Whether `node`'s kernel accepts a netem qdisc (tried on a throwaway veth pair on the node: every pod network
/// has veth, while some kernels, this machine's among them, have no dummy driver).
pub fn node_has_netem(node: &str) -> bool {
    const PROBE: &str = "ip link add isth-netemprobe type veth peer name isth-netemprob1 || exit 4
tc qdisc add dev isth-netemprobe root netem delay 1ms 2>/dev/null; rc=$?
ip link del isth-netemprobe; [ $rc -eq 0 ] && exit 0 || exit 1";
    let out = node_exec(node, &["sh", "-c", PROBE]);
    match out.code {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("probing {node} for sch_netem failed: {}{}", out.stdout, out.stderr),
    }
}

/// The shell that removes what the datapath installed in the pod's namespace, as an operator or a CNI might —
/// tc: the root HTB on eth0; userspace: the capture interface (its routes go with it) — printing `removed` when
/// there was something to remove.
fn removal_script() -> String {
    match datapath() {
        Datapath::Tc => {
            "tc qdisc show dev eth0 root | grep -q '^qdisc htb' || exit 0; tc qdisc del dev eth0 root && echo removed"
                .to_owned()
        }
        Datapath::Userspace => {
            format!("ip link show {CAPTURE} >/dev/null 2>&1 || exit 0; ip link del {CAPTURE} && echo removed")
        }
    }
}

/// Keeps what the datapath installed in the pod away behind the agent's back, from a loop on the node itself
/// that removes it every 0.2 s, until dropped or for `at_most`, whichever ends first.
///
/// Why on the node: the agent's resync puts the tree back within its interval, and a removal sent from here
/// waits for `node-exec`, which on an emulated node runs one command at a time and takes seconds to find the
/// pod's namespace. Removing from here once per poll left the tree in place for most of each window: a link
/// whose tree was fought over still measured conformant (e2e-vm, 2026-12-07: measured p50s of 74 ms against an
/// expected 84 ± 10 ms on passing runs, and a run that never saw `Faster` in 60 s).
pub struct KeptAway {
    node: String,
    /// On the node: the loop ends when this file appears; each removal adds a line to the count file.
    stop: String,
    count: String,
}

impl KeptAway {
    pub fn start(node: &str, pod_ip: &str, at_most: std::time::Duration) -> KeptAway {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let tag = format!("{}.{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        let (stop, count) =
            (format!("/tmp/isthmus-e2e-keep-away.{tag}.stop"), format!("/tmp/isthmus-e2e-keep-away.{tag}.count"));
        // Detached from the command that starts it (its output to /dev/null), so that node-exec returns at once.
        let script = format!(
            r#"end=$(( $(date +%s) + {secs} ))
( while [ ! -e {stop} ] && [ "$(date +%s)" -lt "$end" ]; do
    [ "$(sh -c "$0")" = removed ] && echo >>{count}
    sleep 0.2
  done
  rm -f {stop} ) </dev/null >/dev/null 2>&1 &
echo started"#,
            secs = at_most.as_secs().max(1),
        );
        let out = in_pod(node, pod_ip, &["sh", "-c", &script, &removal_script()]);
        assert_eq!(out.trim(), "started", "keeping isthmus away on {node} did not start: {out}");
        KeptAway { node: node.to_owned(), stop, count }
    }

    /// How many times the loop has removed the tree so far.
    pub fn removals(&self) -> usize {
        let out = node_exec(&self.node, &["sh", "-c", &format!("cat {} 2>/dev/null || true", self.count)]);
        out.stdout.lines().count()
    }
}

impl Drop for KeptAway {
    fn drop(&mut self) {
        let _ = node_exec(&self.node, &["sh", "-c", &format!("touch {}; rm -f {}", self.stop, self.count)]);
    }
}
