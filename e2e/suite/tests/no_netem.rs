//! End-to-end on nodes whose kernel has no sch_netem (this machine's, through the local provider): a link that
//! needs netem is refused for those nodes' pods with a status that says why, instead of an emulated link that
//! silently is not there. `e2e/suite/run` runs this binary only where a node-side probe finds no netem.

use isthmus_e2e::*;
use std::time::Duration;

mod common;
use common::two_nodes;

/// A latency link on a node without sch_netem: Degraded=True, reason KernelUnsupported, a message that names
/// sch_netem and what is lost; the pod's pairs are not counted as applied; `Conformant=False`, `Unmeasurable`.
#[test]
fn latency_link_is_degraded_without_netem() {
    let (n1, n2) = two_nodes();
    assert!(
        !node_has_netem(&n1),
        "{n1}'s kernel has sch_netem: this test is for nodes without it (e2e/suite/run chooses the binaries)"
    );
    let ns = TestNamespace::new("nonetem");
    ns.probe_deployment("client", Some(&n1));
    ns.probe_deployment("server", Some(&n2));
    ns.wait_ready_pod("client");
    ns.wait_ready_pod("server");
    ns.apply(&link_manifest("delay", "client", "server", "{latency: 40ms}", None));
    let degraded = wait_for("the latency link Degraded", Duration::from_secs(60), || {
        ns.link_condition("delay", "Degraded").filter(|c| c.0 == "True")
    });
    println!("Degraded={degraded:?}");
    assert_eq!(degraded.1, "KernelUnsupported", "{degraded:?}");
    assert!(degraded.2.contains("sch_netem"), "the Degraded message does not say netem is missing: {}", degraded.2);
    assert!(degraded.2.contains("latency"), "the Degraded message does not say what is lost: {}", degraded.2);
    let status = ns.json(&["get", "networklink", "delay"])["status"].clone();
    println!("status: {status}");
    assert_eq!(status["pairsApplied"].as_i64(), Some(0), "a pair counted as applied without netem: {status}");
    let failure = status["failures"].as_array().and_then(|f| f.first()).cloned().unwrap_or_default();
    assert_eq!(failure["reason"], "KernelUnsupported", "status.failures: {status}");
    // Nothing of the link is in force, so nothing can be measured on it, and the status never claims it conforms.
    let conformant = wait_for("Conformant=False (Unmeasurable)", Duration::from_secs(90), || {
        ns.link_condition("delay", "Conformant").filter(|c| c.0 == "False")
    });
    println!("Conformant={conformant:?}");
    assert_eq!(conformant.1, "Unmeasurable", "{conformant:?}");
}
