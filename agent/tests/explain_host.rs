//! `isthmus-agent explain` on this machine's kernel: a rate-only tree installed by the datapath in a throwaway
//! namespace is found by the pod's address through the agent's resolver and read back entry by entry, with
//! counters that move with real traffic. Needs root (CI runs as root).

// The datapaths crate's namespace pair: the datapath installs the tree that `explain` reads back.
#[path = "../datapaths/tests/datapath_support/mod.rs"]
mod support;

use std::net::IpAddr;
use std::path::PathBuf;

use isthmus_agent::explain::{ExplainRequest, explain};
use isthmus_agent_api::explain::InstalledPath;
use isthmus_agent_api::test_util::rate;
use isthmus_datapaths::datapath::DesiredState;
use isthmus_datapaths::netns::Sources;
use support::{Pair, net, run};

fn request(ip: IpAddr, destination: &str) -> ExplainRequest {
    ExplainRequest {
        uid: "uid-explain".into(),
        ips: vec![ip],
        interface: "va".into(),
        destination: destination.parse().unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_finds_the_pod_by_address_and_reads_the_entry_the_address_meets() {
    let pair = Pair::new("explain");
    // An address no other namespace on this machine holds (other tests' pairs use 10.77.0.1), so the search
    // by address finds exactly this one.
    let own: IpAddr =
        format!("10.78.{}.{}", (std::process::id() >> 8) & 0xff, std::process::id() & 0xff).parse().unwrap();
    run(&["ip", "-n", &pair.a, "addr", "add", &format!("{own}/32"), "dev", "va"]);
    let sources = || Sources {
        proc_root: PathBuf::from("/proc"),
        netns_dirs: vec![PathBuf::from("/run/netns")],
        cgroup_filter: None,
    };

    // Nothing installed yet.
    let report = explain(sources(), request(own, "10.77.0.2")).await.unwrap();
    assert_eq!(report.path, InstalledPath::None);
    assert_eq!(report.interface, "va");

    let datapath = pair.datapath().await;
    let desired =
        DesiredState::new([(net("10.77.0.2/32"), rate(10_000_000)), (net("10.77.0.0/24"), rate(5_000_000))]).unwrap();
    datapath.reconcile("va", &desired).await.unwrap();
    pair.send_udp("10.77.0.2".parse().unwrap(), 20);

    let report = explain(sources(), request(own, "10.77.0.2")).await.unwrap();
    let InstalledPath::Tc { destination, impairment, objects } = &report.path else { panic!("{report:?}") };
    assert_eq!(destination.to_string(), "10.77.0.2/32");
    assert_eq!(impairment.as_ref().unwrap().fields().rate_bps, Some(10_000_000));
    let kinds: Vec<&str> = objects.iter().map(|o| o.kind.as_str()).collect();
    assert_eq!(kinds[..3], ["u32 filter", "htb class", "tbf qdisc"], "{objects:?}");
    let class = &objects[1];
    assert!(class.counters.unwrap().packets >= 20, "the class counted the datagrams: {class:?}");

    // Another address of the /24 meets the CIDR entry; one outside both, the default class.
    let report = explain(sources(), request(own, "10.77.0.3")).await.unwrap();
    assert!(
        matches!(&report.path, InstalledPath::Tc { destination, .. } if destination.to_string() == "10.77.0.0/24"),
        "{report:?}"
    );
    let report = explain(sources(), request(own, "192.0.2.1")).await.unwrap();
    assert!(matches!(report.path, InstalledPath::TcDefault { .. }), "{report:?}");

    // A pod whose address no namespace holds is an error that says so.
    let err = explain(sources(), request("10.79.255.254".parse().unwrap(), "10.77.0.2")).await.unwrap_err();
    assert!(err.to_string().contains("no network namespace on this node holds"), "{err}");
    datapath.reconcile("va", &DesiredState::empty()).await.unwrap();
}
