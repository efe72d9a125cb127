//! The network safety properties of the providers that share this machine's network (local, vm; not kind):
//! the cluster's processes listen only on loopback and the rig's bridge; the nodes only on loopback and their own
//! addresses; the cluster's ranges stay on the bridge or are unreachable; nodes and pods have no way out; the
//! host's `net.ipv4.ip_forward` is what it was before `up`. Host facts through `ss`, `ip` and /proc/sys; the nodes'
//! through `cluster node-exec`.

use std::path::Path;

use isthmus_e2e::node_exec;
use isthmus_e2e::smoke::{
    apiserver_listens, cluster_routes, global_addresses, node_sockets_outside, routed_elsewhere, sockets_outside,
    sysctl_in,
};

use crate::pods::Pods;
use crate::{Smoke, env, host, node_names, pass};

/// An address in the range the nodes are given no route to.
const OUTSIDE: &str = "203.0.113.1";

pub fn network_safety(smoke: &Smoke, pods: &Pods) {
    let bridge = env("ISTHMUS_SMOKE_BRIDGE");
    let bridge_ip = env("ISTHMUS_SMOKE_BRIDGE_IP");
    let nodes = node_names(&[]);
    host_sockets(&bridge, &bridge_ip, &env("ISTHMUS_SMOKE_API_PORT"));
    node_sockets(&nodes);
    routes(smoke, pods, &bridge, &env("ISTHMUS_SMOKE_KUBERNETES_SERVICE_IP"), &nodes);
    sysctls(Path::new(&env("ISTHMUS_SMOKE_BASE")));
}

/// Our processes listen only on loopback and the rig's bridge; nothing on the machine's own addresses.
fn host_sockets(bridge: &str, bridge_ip: &str, api_port: &str) {
    let external = global_addresses(&host("ip", &["-o", "-4", "addr", "show", "scope", "global"]).stdout, bridge);
    let bad = sockets_outside(&host("ss", &["-lntupH"]).stdout, bridge_ip);
    assert!(
        bad.is_empty(),
        "cluster sockets outside loopback and {bridge_ip} (wildcards included):{}",
        bad.iter().map(|l| format!("\n    {l}")).collect::<String>()
    );
    let out = host("ss", &["-lntpH"]);
    assert!(
        out.ok && apiserver_listens(&out.stdout, bridge_ip, api_port),
        "ss does not show kube-apiserver on {bridge_ip}:{api_port}"
    );
    pass(&format!(
        "host: cluster sockets only on 127.0.0.1 and {bridge_ip}, none on a wildcard or on {}",
        external.join(" ")
    ));
}

fn node_sockets(nodes: &[String]) {
    for node in nodes {
        let out = node_exec(node, &["ss", "-lntuH"]);
        assert!(out.ok, "node {node}: `ss -lntuH` failed, so its sockets cannot be judged: {}", out.stderr.trim());
        let bad = node_sockets_outside(&out.stdout);
        assert!(bad.is_empty(), "node {node} listens outside its own addresses: {}", bad.join("\n"));
    }
    pass("nodes: sockets only on loopback and node addresses");
}

/// `ip route get ADDR`, stdout and stderr: an unreachable route makes it fail, saying so.
fn route_get(addr: &str) -> String {
    let out = host("ip", &["route", "get", addr]);
    format!("{}{}", out.stdout, out.stderr)
}

fn routes(smoke: &Smoke, pods: &Pods, bridge: &str, kubernetes_service_ip: &str, nodes: &[String]) {
    assert!(
        route_get("198.19.250.1").contains("No route to host"),
        "unallocated pod address not unreachable on the host"
    );
    assert!(route_get(kubernetes_service_ip).contains("No route to host"), "service range not unreachable on the host");
    let out = host("ip", &["route", "get", &pods.ip_a1]);
    assert!(out.ok && out.stdout.contains(&format!("dev {bridge}")), "pod a1 not routed through {bridge}");
    let table = host("ip", &["route", "show"]).stdout;
    assert!(
        !routed_elsewhere(&table, bridge),
        "a cluster range is routed elsewhere: {}",
        cluster_routes(&table).join("\n")
    );
    for node in nodes {
        let out = node_exec(node, &["sh", "-c", &format!("ip route get {OUTSIDE} 2>&1 || true")]);
        assert!(out.ok && out.stdout.contains("Network is unreachable"), "node {node} has a route out");
    }
    assert!(!smoke.exec("a1", &["ping", "-c", "1", "-W", "1", OUTSIDE]).ok, "pod a1 reached {OUTSIDE}");
    pass(&format!("routes: cluster ranges stay on {bridge} or are unreachable; nodes and pods have no way out"));
}

fn sysctl(key: &str) -> Option<String> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::read_to_string(path).ok().map(|v| v.trim().to_owned())
}

/// `base`: the snapshot taken before the first `up`.
fn sysctls(base: &Path) {
    let was = std::fs::read_to_string(base.join("sysctls")).ok().and_then(|s| sysctl_in(&s, "ip_forward"));
    let is = sysctl("net.ipv4.ip_forward");
    assert!(is.is_some() && is == was, "host net.ipv4.ip_forward changed");
    let now: Vec<String> = ["vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops", "net.ipv4.ip_forward"]
        .iter()
        .filter_map(|k| sysctl(k))
        .collect();
    pass(&format!("host sysctls untouched while up: {}", now.join(" ")));
}
