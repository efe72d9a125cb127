//! NetworkTopology against a real API server and garbage collector: admission, the links it owns, edits that
//! reach them, hand edits put back, regions removed, an invalid edit that leaves the links in force, a name
//! taken by a hand-written link, and deletion through owner references.

use std::time::Duration;

use isthmus_operator::api::NetworkLink;
use isthmus_operator::topology::expand::TOPOLOGY_LABEL;
use isthmus_operator::topology::{NetworkTopology, reconcile};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::cluster::*;

async fn install_topology_crd(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = isthmus_operator::topology::crd();
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(&name, &PatchParams::apply("isthmus-operator-it").force(), &Patch::Apply(&crd)).await.unwrap();
    eventually("topology CRD established", || async {
        let c = crds.get(&name).await.ok()?;
        c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
    })
    .await;
}

fn topology(name: &str, spec: Value) -> NetworkTopology {
    serde_json::from_value(json!({
        "apiVersion": "isthmus.dev/v1alpha1", "kind": "NetworkTopology", "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn ready(t: &NetworkTopology) -> Option<(String, String, String)> {
    let c = t.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn children(links: &Api<NetworkLink>, topology: &str) -> Vec<NetworkLink> {
    let lp = ListParams::default().labels(&format!("{TOPOLOGY_LABEL}={topology}"));
    links.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_topology_owns_its_links_and_keeps_them_true() {
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    install_topology_crd(&client).await;
    let ns = format!("op-it-topology-{}", std::process::id());
    namespace(&client, &ns).await;
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "topology", leader_rx.clone(), Duration::from_secs(3));
    let (stop_tx, stop_rx) = watch::channel(false);
    let reconciler = tokio::spawn(reconcile::run(client.clone(), leader_rx, stop_rx));
    let topologies: Api<NetworkTopology> = Api::namespaced(client.clone(), &ns);
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);

    // Admission: the CRD's rules name the field.
    let dry = PostParams { dry_run: true, ..Default::default() };
    let refused = |spec: Value| {
        let topologies = topologies.clone();
        let dry = dry.clone();
        async move { topologies.create(&dry, &topology("bad", spec)).await.unwrap_err().to_string() }
    };
    let e = refused(json!({"regionLabel": "region", "regions": [{"name": "eu", "podSelector": {}}]})).await;
    assert!(e.contains("spec.regionLabel") && e.contains("in one way"), "{e}");
    let e = refused(json!({"regionLabel": "region", "regions": [{"name": "eu"}], "links": [{"from": "eu", "to": "us", "roundTrip": "80ms"}]})).await;
    assert!(e.contains("spec.links") && e.contains("must name a region"), "{e}");
    let e = refused(json!({"regionLabel": "region", "regions": [{"name": "eu"}, {"name": "eu"}]})).await;
    assert!(e.contains("spec.regions[1]") && e.contains("Duplicate"), "{e}");
    let e = refused(json!({"regionLabel": "region", "regions": [{"name": "EU"}]})).await;
    assert!(e.contains("spec.regions[0].name"), "{e}");
    let e = refused(json!({"regionLabel": "region", "regions": [{"name": "eu", "datasetRegion": "westeurope"}]})).await;
    assert!(e.contains("spec.dataset"), "{e}");

    // A hand-written link holds the name one of the topology's links needs.
    let mut squatter = link("w.us.us", "1ms");
    squatter.metadata.name = Some("w.us.us".into());
    links.create(&PostParams::default(), &squatter).await.unwrap();

    let spec = json!({
        "regionLabel": "region",
        "regions": [{"name": "eu"}, {"name": "us"}],
        "default": {"latency": "30ms"},
        "intraRegion": {"latency": "1ms"},
        "links": [{"from": "eu", "to": "us", "roundTrip": "80ms"}],
    });
    topologies.create(&PostParams::default(), &topology("w", spec)).await.unwrap();
    let t = eventually("the name is reported taken", || async {
        let t = topologies.get("w").await.ok()?;
        (ready(&t)?.1 == "NameTaken").then_some(t)
    })
    .await;
    assert!(ready(&t).unwrap().2.contains("w.us.us"), "{:?}", ready(&t));
    links.delete("w.us.us", &DeleteParams::default()).await.unwrap();

    // Every ordered pair gets its link, owned and labelled; with no pod anywhere, each is Ready (NoPairs).
    let t = eventually("the topology is Ready", || async {
        let t = topologies.get("w").await.ok()?;
        (ready(&t)?.0 == "True").then_some(t)
    })
    .await;
    let status = t.status.clone().unwrap();
    assert_eq!((status.links, status.links_ready), (4, 4));
    assert_eq!(status.matrix[0].configured, vec!["2ms", "80ms"]);
    assert_eq!(status.matrix[1].configured, vec!["80ms", "2ms"]);
    let owned = children(&links, "w").await;
    assert_eq!(owned.len(), 4);
    for l in &owned {
        let owner = &l.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("NetworkTopology", "w", Some(true)));
        assert_eq!(l.spec.priority, -1000);
    }
    let eu_us = links.get("w.eu.us").await.unwrap();
    assert_eq!(eu_us.spec.impairment.as_ref().unwrap().latency.as_ref().unwrap().0, "40ms");

    // An edit of the topology reaches its links in place.
    let patch = json!({"spec": {"links": [{"from": "eu", "to": "us", "roundTrip": "100ms"}]}});
    topologies.patch("w", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the edit reaches w.us.eu", || async {
        let l = links.get("w.us.eu").await.ok()?;
        (l.spec.impairment?.latency?.0 == "50ms").then_some(())
    })
    .await;

    // A hand edit of a link is put back, fields the user added included; a deleted link comes back.
    let edit = json!({"spec": {"impairment": {"latency": "1ms", "loss": {"percent": "50%"}}, "priority": 5}});
    links.patch("w.eu.us", &PatchParams::default(), &Patch::Merge(&edit)).await.unwrap();
    eventually("the hand edit is reverted", || async {
        let l = links.get("w.eu.us").await.ok()?;
        let i = l.spec.impairment?;
        (i.latency?.0 == "50ms" && i.loss.is_none() && l.spec.priority == -1000).then_some(())
    })
    .await;
    links.delete("w.eu.eu", &DeleteParams::default()).await.unwrap();
    eventually("the deleted link is back", || async {
        let l = links.get_opt("w.eu.eu").await.ok()??;
        l.metadata.deletion_timestamp.is_none().then_some(())
    })
    .await;

    // A pod in a region is counted there (its region's own link has it as a source).
    running_pod(&client, &ns, "eu-0", "db", "ghost-node", "198.51.100.50").await;
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns);
    pods.patch("eu-0", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"region": "eu"}}})))
        .await
        .unwrap();
    eventually("eu counts its pod", || async {
        let t = topologies.get("w").await.ok()?;
        (t.status?.regions.iter().find(|r| r.name == "eu")?.pods == 1).then_some(())
    })
    .await;

    // An edit the code cannot realise (a link between two spokes) leaves the links in force and says why.
    let hubs = json!({"spec": {
        "regions": [{"name": "eu"}, {"name": "us"}, {"name": "ap"}],
        "routing": {"hubs": ["eu"]},
        "links": [{"from": "us", "to": "ap", "roundTrip": "100ms"}],
    }});
    topologies.patch("w", &PatchParams::default(), &Patch::Merge(&hubs)).await.unwrap();
    let t = eventually("InvalidSpec", || async {
        let t = topologies.get("w").await.ok()?;
        (ready(&t)?.1 == "InvalidSpec").then_some(t)
    })
    .await;
    assert!(ready(&t).unwrap().2.starts_with("spec.links[0]: "), "{:?}", ready(&t));
    assert_eq!(children(&links, "w").await.len(), 4, "the last valid links stay");

    // A region removed takes its links with it.
    let one = json!({"spec": {"regions": [{"name": "eu"}], "routing": null, "links": null}});
    topologies.patch("w", &PatchParams::default(), &Patch::Merge(&one)).await.unwrap();
    eventually("only eu's own link is left", || async {
        let names: Vec<String> = children(&links, "w").await.iter().map(|l| l.name_any()).collect();
        (names == ["w.eu.eu"]).then_some(())
    })
    .await;

    // Deleting the topology deletes its links (garbage collector, owner references).
    topologies.delete("w", &DeleteParams::default()).await.unwrap();
    eventually("the links are gone", || async { children(&links, "w").await.is_empty().then_some(()) }).await;

    let _ = stop_tx.send(true);
    reconciler.await.unwrap();
    running.stop().await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}
