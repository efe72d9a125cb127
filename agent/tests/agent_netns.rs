//! Finding pods' network namespaces among real namespaces on this machine (root required).

mod agent_common;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use agent_common::{Ns, add_addr, ip, unique, veth};
use isthmus_datapaths::netns::{PodIdentity, ResolveError, Resolver, Sources};

fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pod(uid: &str, ips: &[&str]) -> PodIdentity {
    PodIdentity { uid: uid.to_owned(), ips: ips.iter().map(|s| addr(s)).collect() }
}

/// A subnet third octet unlikely to clash with other tests running at the same time.
fn octet() -> u8 {
    (std::process::id() % 200 + 20) as u8
}

fn only_run_netns() -> Sources {
    Sources { proc_root: PathBuf::from("/proc"), netns_dirs: vec![PathBuf::from("/run/netns")], cgroup_filter: None }
}

#[test]
fn agent_netns_pod_is_found_by_all_its_ips_and_not_by_a_partial_match() {
    let k = octet();
    let pod_ns = Ns::new("isth-an-pod-");
    let peer_ns = Ns::new("isth-an-peer-");
    let other_ns = Ns::new("isth-an-oth-");
    let other_peer = Ns::new("isth-an-op-");
    let pod_v4 = format!("10.231.{k}.2");
    let pod_v6 = format!("fd31:{k}::2");
    veth(&pod_ns, "eth0", addr(&pod_v4), &peer_ns, "eth0", addr(&format!("10.231.{k}.1")));
    add_addr(&pod_ns, "eth0", addr(&pod_v6));
    // Another namespace holds the pod's IPv6 address but not its IPv4 one: never a match.
    veth(&other_ns, "eth0", addr(&format!("10.232.{k}.2")), &other_peer, "eth0", addr(&format!("10.232.{k}.1")));
    add_addr(&other_ns, "eth0", addr(&pod_v6));

    let mut resolver = Resolver::new(only_run_netns()).unwrap();
    let found = resolver.resolve(&[
        pod("uid-a", &[&pod_v4, &pod_v6]),
        pod("uid-partial", &[&format!("10.232.{k}.2"), &format!("10.231.{k}.1")]),
        pod("uid-nowhere", &[&format!("10.233.{k}.9")]),
        pod("uid-empty", &[]),
    ]);
    let ns = found["uid-a"].as_ref().expect("pod found");
    assert_eq!(ns.id().inode, pod_ns.inode(), "the namespace holding both IPs");
    assert!(matches!(found["uid-partial"], Err(ResolveError::NotFound(_))), "{:?}", found["uid-partial"]);
    assert!(matches!(found["uid-nowhere"], Err(ResolveError::NotFound(_))), "{:?}", found["uid-nowhere"]);
    assert_eq!(found["uid-empty"].as_ref().unwrap_err(), &ResolveError::NoIps);

    // The IPv6 address alone is in two namespaces: refused rather than guessed.
    let ambiguous = resolver.resolve(&[pod("uid-v6", &[&pod_v6])]);
    assert!(matches!(ambiguous["uid-v6"], Err(ResolveError::Ambiguous { count: 2, .. })), "{:?}", ambiguous["uid-v6"]);
}

#[test]
fn agent_netns_restarted_sandbox_with_the_same_ip_is_noticed() {
    let k = octet();
    let pod_ip = format!("10.234.{k}.2");
    let peer_ip = addr(&format!("10.234.{k}.1"));
    let mut resolver = Resolver::new(only_run_netns()).unwrap();
    let first_inode;
    {
        let sandbox = Ns::new("isth-an-sb1-");
        let peer = Ns::new("isth-an-sp1-");
        veth(&sandbox, "eth0", addr(&pod_ip), &peer, "eth0", peer_ip);
        let found = resolver.resolve(&[pod("uid-r", &[&pod_ip])]);
        first_inode = found["uid-r"].as_ref().unwrap().id().inode;
        assert_eq!(first_inode, sandbox.inode());
        // Unchanged: the cached namespace is verified again and kept.
        let again = resolver.resolve(&[pod("uid-r", &[&pod_ip])]);
        assert_eq!(again["uid-r"].as_ref().unwrap().id().inode, first_inode);
    } // the sandbox's namespace is deleted here (the resolver still holds it open)
    let sandbox = Ns::new("isth-an-sb2-");
    let peer = Ns::new("isth-an-sp2-");
    veth(&sandbox, "eth0", addr(&pod_ip), &peer, "eth0", peer_ip);
    let found = resolver.resolve(&[pod("uid-r", &[&pod_ip])]);
    let ns = found["uid-r"].as_ref().expect("the new sandbox is found");
    assert_eq!(ns.id().inode, sandbox.inode());
    assert_ne!(ns.id().inode, first_inode);
}

#[test]
fn agent_netns_found_through_a_process_without_any_pinned_path() {
    let k = octet();
    // A "container": a process in a fresh network namespace, not pinned anywhere.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let sleeper = Kill(Command::new("unshare").args(["--net", "sleep", "60"]).stdout(Stdio::null()).spawn().unwrap());
    let pid = sleeper.0.id().to_string();
    // Wait for unshare to have switched namespace.
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    for _ in 0..100 {
        if std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|l| l != own) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let peer = Ns::new("isth-an-pp-");
    let inside = unique("vi");
    ip(&["link", "add", &inside, "netns", &pid, "type", "veth", "peer", "name", "eth0", "netns", &peer.name]);
    let pod_ip = format!("10.235.{k}.2");
    let run_in_pid = |args: &[&str]| {
        let mut all = vec!["-t", pid.as_str(), "-n", "ip"];
        all.extend_from_slice(args);
        agent_common::run("nsenter", &all)
    };
    run_in_pid(&["addr", "add", &format!("{pod_ip}/24"), "dev", &inside]);
    run_in_pid(&["link", "set", &inside, "up"]);

    let sources = Sources { proc_root: PathBuf::from("/proc"), netns_dirs: vec![], cgroup_filter: None };
    let mut resolver = Resolver::new(sources).unwrap();
    let found = resolver.resolve(&[pod("uid-p", &[&pod_ip])]);
    let ns = found["uid-p"].as_ref().expect("found through /proc/<pid>/ns/net");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(ns.id().inode, std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap().ino());
    drop(sleeper);
}

#[test]
fn agent_netns_host_network_pod_is_refused() {
    // An address of the agent's own namespace (this test's): the pod would be a host-network pod.
    let k = octet();
    let host = Ns::new("isth-an-h-");
    let peer = Ns::new("isth-an-hp-");
    veth(&host, "eth0", addr(&format!("10.236.{k}.2")), &peer, "eth0", addr(&format!("10.236.{k}.1")));
    // The "agent" runs inside `host`: resolve from a thread in that namespace.
    let pod_ip = format!("10.236.{k}.2");
    let result = host
        .run_in(move || {
            let mut resolver = Resolver::new(only_run_netns()).unwrap();
            resolver.resolve(&[pod("uid-h", &[&pod_ip])]).remove("uid-h").unwrap().map(|ns| ns.id().inode)
        })
        .join()
        .unwrap();
    assert!(matches!(result, Err(ResolveError::HostNetwork(_))), "{result:?}");
}

/// A process inside `ns`, in a throwaway cgroup `<root>/pod<uid>` (as kubelet names a pod's cgroup), so that the
/// namespace belongs to that pod; killed and its cgroups removed on drop.
struct PodProcess {
    child: std::process::Child,
    dirs: Vec<PathBuf>,
}

impl PodProcess {
    fn start(ns: &Ns, root: &str, uid: &str) -> Self {
        // cgroup v2's single hierarchy, or v1's cpu one.
        let hierarchy = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            PathBuf::from("/sys/fs/cgroup/cpu")
        };
        let base = hierarchy.join(root);
        let dir = base.join(format!("pod{uid}"));
        std::fs::create_dir_all(&dir).unwrap();
        // `ip netns exec` executes the command in its own process: the child's PID is the sleeper's.
        let child =
            Command::new("ip").args(["netns", "exec", &ns.name, "sleep", "120"]).stdout(Stdio::null()).spawn().unwrap();
        let process = PodProcess { child, dirs: vec![dir.clone(), base] };
        std::fs::write(dir.join("cgroup.procs"), process.child.id().to_string()).unwrap();
        let ns_link = std::fs::read_link(format!("/run/netns/{}", ns.name)).ok();
        for _ in 0..100 {
            let inside = std::fs::metadata(format!("/proc/{}/ns/net", process.child.id()))
                .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == ns.inode());
            if inside {
                return process;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("the sleeper never entered {} ({ns_link:?})", ns.name);
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

const UID_A: &str = "0b4e5d2c-1111-4a5b-9c8d-0123456789ab";
const UID_B: &str = "7f00aa11-2222-4b6c-8d9e-abcdefabcdef";

#[test]
fn agent_netns_a_reused_ip_never_gives_one_pod_another_pods_namespace() {
    let k = octet();
    let root = unique("isth-an-cg-");
    let sources = Sources {
        proc_root: PathBuf::from("/proc"),
        netns_dirs: vec![PathBuf::from("/run/netns")],
        // Only this test's processes count, as the agent's --cgroup-filter does for a node.
        cgroup_filter: Some(format!("/{root}/")),
    };
    let mut resolver = Resolver::new(sources).unwrap();
    let pod_ip = format!("10.237.{k}.2");
    let peer_ip = addr(&format!("10.237.{k}.1"));

    // Pod A's sandbox holds the IP, and A is found there.
    let a_sandbox = Ns::new("isth-an-ra-");
    let a_peer = Ns::new("isth-an-rap-");
    veth(&a_sandbox, "eth0", addr(&pod_ip), &a_peer, "eth0", peer_ip);
    let a_process = PodProcess::start(&a_sandbox, &root, UID_A);
    let found = resolver.resolve(&[pod(UID_A, &[&pod_ip])]);
    assert_eq!(found[UID_A].as_ref().expect("A in its own sandbox").id().inode, a_sandbox.inode());

    // A is deleted; its IP goes to pod B's new sandbox before the operator's plan drops A.
    drop(a_process);
    drop((a_sandbox, a_peer));
    let b_sandbox = Ns::new("isth-an-rb-");
    let b_peer = Ns::new("isth-an-rbp-");
    veth(&b_sandbox, "eth0", addr(&pod_ip), &b_peer, "eth0", peer_ip);
    let _b_process = PodProcess::start(&b_sandbox, &root, UID_B);
    let found = resolver.resolve(&[pod(UID_A, &[&pod_ip]), pod(UID_B, &[&pod_ip])]);
    assert_eq!(found[UID_B].as_ref().expect("B in its own sandbox").id().inode, b_sandbox.inode());
    match &found[UID_A] {
        Err(ResolveError::OwnedByAnotherPod { owner, .. }) => assert_eq!(owner, UID_B),
        other => panic!("A must not get B's namespace: {other:?}"),
    }
    // A alone in a plan (B not yet in it): still refused, by the processes' cgroups.
    let found = resolver.resolve(&[pod(UID_A, &[&pod_ip])]);
    assert!(matches!(found[UID_A], Err(ResolveError::OwnedByAnotherPod { .. })), "{:?}", found[UID_A]);
    assert!(found[UID_A].as_ref().unwrap_err().to_string().contains(UID_B));
}

#[test]
fn agent_netns_two_pods_in_one_namespace_that_nothing_names_are_both_refused() {
    let k = octet();
    let sandbox = Ns::new("isth-an-sh-");
    let peer = Ns::new("isth-an-shp-");
    let pod_ip = format!("10.238.{k}.2");
    veth(&sandbox, "eth0", addr(&pod_ip), &peer, "eth0", addr(&format!("10.238.{k}.1")));
    // A pinned namespace without processes: nothing says whose it is.
    let mut resolver = Resolver::new(only_run_netns()).unwrap();
    let found = resolver.resolve(&[pod(UID_A, &[&pod_ip]), pod(UID_B, &[&pod_ip])]);
    for uid in [UID_A, UID_B] {
        match &found[uid] {
            Err(ResolveError::SharedByPods { uids, .. }) => assert_eq!(uids.len(), 2, "{uids:?}"),
            other => panic!("{uid}: {other:?}"),
        }
    }
    // Alone, the same pod is found as before.
    let found = resolver.resolve(&[pod(UID_B, &[&pod_ip])]);
    assert_eq!(found[UID_B].as_ref().unwrap().id().inode, sandbox.inode());
}
