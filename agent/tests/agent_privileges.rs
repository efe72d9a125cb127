//! Least privilege, checked by running the agent binary with capabilities dropped (capsh): NET_ADMIN,
//! SYS_ADMIN and SYS_PTRACE are enough for everything the tc datapath does, and each of them is needed for part
//! of the work; the userspace datapath needs NET_RAW as well.

mod agent_common;

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_common::{Agent, AgentOptions, Ns, TestCerts, effective_caps, ip, unique, veth};
use isthmus_agent_api::test_util::{destination, link, rate};
use isthmus_agent_api::{NodePlan, PodErrorKind, PodOutcome, PodPlan, PodResult};

const NODE: &str = "node-priv";

fn pod(uid: &str, ip: IpAddr, to: IpAddr) -> PodPlan {
    isthmus_agent_api::test_util::pod(uid, uid, &[ip], vec![destination(to, rate(5_000_000), link("l"))])
}

fn kind(results: &[PodResult], uid: &str) -> Option<PodErrorKind> {
    match &results.iter().find(|r| r.uid == uid).unwrap().outcome {
        PodOutcome::Applied => None,
        PodOutcome::Failed(e) => Some(e.kind),
    }
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_privileges_net_admin_sys_admin_sys_ptrace_suffice_and_each_is_needed() {
    let k = (std::process::id() % 200 + 20) as u8;
    let (work, pinned, proc_dir) = agent_common::agent_dirs("isth-priv-");

    // A pinned sandbox (like containerd's CRI netns mounts).
    let pinned_pod = Ns::new_pinned("isth-ap-pin-", &pinned);
    let peer = Ns::new("isth-ap-peer-");
    let pinned_ip: IpAddr = format!("10.246.{k}.2").parse().unwrap();
    let peer_ip: IpAddr = format!("10.246.{k}.1").parse().unwrap();
    veth(&pinned_pod, "eth0", pinned_ip, &peer, "eth0", peer_ip);

    // A container process running as another user (nobody) in a namespace reachable only through /proc.
    let sleeper = KillOnDrop(
        Command::new("unshare")
            .args([
                "--net",
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "sleep",
                "120",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = sleeper.0.id();
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    for _ in 0..200 {
        let uid_switched = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:") && l.contains("65534")));
        if uid_switched && std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|l| l != own) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let peer2 = Ns::new("isth-ap-peer2-");
    let inside = unique("vp");
    ip(&[
        "link",
        "add",
        &inside,
        "netns",
        &pid.to_string(),
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &peer2.name,
    ]);
    let process_ip: IpAddr = format!("10.247.{k}.2").parse().unwrap();
    for args in [
        vec!["link", "set", inside.as_str(), "name", "eth0"],
        vec!["addr", "add", &format!("{process_ip}/24"), "dev", "eth0"],
        vec!["link", "set", "eth0", "up"],
    ] {
        let mut all = vec!["-t".to_owned(), pid.to_string(), "-n".to_owned(), "ip".to_owned()];
        all.extend(args.iter().map(|a| a.to_string()));
        agent_common::run("nsenter", &all.iter().map(String::as_str).collect::<Vec<_>>());
    }
    // The agent's /proc shows only that process (the real /proc/<pid> through a link).
    std::os::unix::fs::symlink(format!("/proc/{pid}"), proc_dir.join(pid.to_string())).unwrap();

    let certs = TestCerts::new(NODE);
    let options = AgentOptions {
        node: NODE,
        tls_dir: &certs.agent_dir(),
        proc: &proc_dir,
        netns_dir: &pinned,
        log_dir: work.path(),
        extra_env: vec![],
    };
    let client = certs.operator();
    let mut version = 0;
    let mut apply_with = |caps: &'static [&'static str]| {
        version += 2;
        let version = version;
        let (client, options) = (&client, &options);
        async move {
            let agent = Agent::start_with_caps(options, Some(caps));
            let eff = effective_caps(agent.child.id());
            assert_eq!(eff.count_ones() as usize, caps.len(), "the agent runs with exactly {caps:?} ({eff:#x})");
            let plan = NodePlan {
                node: NODE.into(),
                version,
                pods: vec![pod("pinned", pinned_ip, peer_ip), pod("process", process_ip, peer_ip)],
                ..Default::default()
            };
            let reply = client.apply(agent.api, &plan).await.unwrap();
            // Leave nothing behind for the next agent (if this one may remove it).
            let _ = client
                .apply(
                    agent.api,
                    &NodePlan { node: NODE.into(), version: version + 1, pods: vec![], ..Default::default() },
                )
                .await;
            reply.pods
        }
    };

    let all = apply_with(&["cap_net_admin", "cap_sys_admin", "cap_sys_ptrace"]).await;
    assert_eq!((kind(&all, "pinned"), kind(&all, "process")), (None, None), "{all:?}");
    assert!(!pinned_pod.qdiscs("eth0").contains("htb"), "removed again");

    let no_ptrace = apply_with(&["cap_net_admin", "cap_sys_admin"]).await;
    assert_eq!(kind(&no_ptrace, "pinned"), None, "{no_ptrace:?}");
    assert_eq!(kind(&no_ptrace, "process"), Some(PodErrorKind::PodNotFound), "another user's process needs SYS_PTRACE");

    let no_sys_admin = apply_with(&["cap_net_admin", "cap_sys_ptrace"]).await;
    assert_eq!(
        kind(&no_sys_admin, "pinned"),
        Some(PodErrorKind::PodNotFound),
        "entering a namespace needs SYS_ADMIN: {no_sys_admin:?}"
    );

    let no_net_admin = apply_with(&["cap_sys_admin", "cap_sys_ptrace"]).await;
    assert_eq!(
        kind(&no_net_admin, "pinned"),
        Some(PodErrorKind::Kernel),
        "changing qdiscs needs NET_ADMIN: {no_net_admin:?}"
    );
    assert!(!pinned_pod.qdiscs("eth0").contains("htb"));
    drop(sleeper);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_privileges_the_userspace_datapath_needs_net_raw_as_well() {
    let k = (std::process::id() % 200 + 20) as u8;
    let dirs = agent_common::agent_dirs("isth-privu-");
    let pod_ns = Ns::new_pinned("isth-apu-pin-", &dirs.1);
    let peer = Ns::new("isth-apu-peer-");
    let (pod_ip, peer_ip): (IpAddr, IpAddr) =
        (format!("10.248.{k}.2").parse().unwrap(), format!("10.248.{k}.1").parse().unwrap());
    veth(&pod_ns, "eth0", pod_ip, &peer, "eth0", peer_ip);
    let certs = TestCerts::new(NODE);
    let tls_dir = certs.agent_dir();
    let options = AgentOptions::in_dirs(NODE, &tls_dir, &dirs, &[("ISTHMUS_DATAPATH", "userspace")]);
    let client = certs.operator();
    let apply_with = async |caps: &[&str], version: u64| {
        let agent = Agent::start_with_caps(&options, Some(caps));
        let plan =
            NodePlan { node: NODE.into(), version, pods: vec![pod("pinned", pod_ip, peer_ip)], ..Default::default() };
        let reply = client.apply(agent.api, &plan).await.unwrap();
        let empty = NodePlan { node: NODE.into(), version: version + 1, pods: vec![], ..Default::default() };
        client.apply(agent.api, &empty).await.unwrap();
        assert!(!ip(&["-n", &pod_ns.name, "-o", "link"]).contains("isth-u0"), "the capture stayed after an empty plan");
        reply.pods
    };
    let all = apply_with(&["cap_net_admin", "cap_net_raw", "cap_sys_admin", "cap_sys_ptrace"], 1).await;
    assert_eq!(kind(&all, "pinned"), None, "{all:?}");
    let no_raw = apply_with(&["cap_net_admin", "cap_sys_admin", "cap_sys_ptrace"], 3).await;
    assert_eq!(kind(&no_raw, "pinned"), Some(PodErrorKind::Kernel), "{no_raw:?}");
    let PodOutcome::Failed(error) = &no_raw[0].outcome else { unreachable!() };
    assert!(error.message.contains("packet socket"), "the failure names what needs NET_RAW: {}", error.message);
}
