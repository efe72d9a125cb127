//! `status.schedule` and the PhaseChanged Events of a flapping link, against a real API server: the operator's
//! tick refreshes the phase on its own, with no watch event to wake it.

use std::time::Duration;

use isthmus_operator::api::{NetworkLink, ScheduleState};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use super::cluster::*;

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_flapping_link_shows_its_phase_and_publishes_each_change() {
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-schedule-{}", std::process::id());
    namespace(&client, &ns).await;
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);

    links.create(&PostParams::default(), &link("flapping", "10ms")).await.unwrap();
    // Phases of 6 s: longer than the operator's refresh bound (5 s), so every phase shows.
    let flap = json!({"spec": {"schedule": {"flap": {"up": "6s", "down": "6s"}}}});
    links.patch("flapping", &PatchParams::default(), &Patch::Merge(flap)).await.unwrap();
    let phase = |want: &'static str| {
        let links = links.clone();
        async move {
            let l = links.get("flapping").await.ok()?;
            let s = l.status?.schedule?;
            (s.phase.as_deref() == Some(want)).then_some(s)
        }
    };
    let up = eventually("status.schedule: up", || phase("up")).await;
    assert_eq!(up.state, ScheduleState::Running);
    let (since, next) = (up.since.expect("since").0, up.next_change.expect("nextChange").0);
    assert_eq!(next.as_second() - since.as_second(), 6, "an up phase lasts 6 s: {since} → {next}");
    let down = eventually("status.schedule: down", || phase("down")).await;
    assert_eq!(down.since.map(|t| t.0), Some(next), "down begins where up ended");
    eventually("a PhaseChanged Event", || async {
        event_reasons(&client, &ns, "flapping").await.iter().any(|r| r == "PhaseChanged").then_some(())
    })
    .await;

    // The schedule removed: the status says nothing of one.
    let plain = json!({"spec": {"schedule": null}});
    links.patch("flapping", &PatchParams::default(), &Patch::Merge(plain)).await.unwrap();
    eventually("status.schedule gone", || async {
        let s = links.get("flapping").await.ok()?.status?;
        s.schedule.is_none().then_some(())
    })
    .await;

    links.delete("flapping", &DeleteParams::default()).await.unwrap();
    running.stop().await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}

#[tokio::test]
#[ignore = "needs a real API server: make operator-it starts one"]
async fn a_trace_is_read_from_its_labelled_configmap_and_its_absence_named() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = client().await.expect("ISTHMUS_TEST_KUBECONFIG: a real API server (make operator-it sets it)");
    let _serial = SERIAL.lock().await;
    install_crd(&client).await;
    let ns = format!("op-it-trace-{}", std::process::id());
    namespace(&client, &ns).await;
    let (_leader_tx, leader_rx) = watch::channel(true);
    let running = start(&client, &ns, "solo", leader_rx, Duration::from_secs(3));
    let links: Api<NetworkLink> = Api::namespaced(client.clone(), &ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    links.create(&PostParams::default(), &link("replay", "10ms")).await.unwrap();
    let trace = json!({"spec": {"schedule": {"trace": {"configMap": "lte", "uplink": "up", "window": "1s"}}}});
    links.patch("replay", &PatchParams::default(), &Patch::Merge(trace)).await.unwrap();
    let refused = |want: &'static str| {
        let links = links.clone();
        async move {
            let l = links.get("replay").await.ok()?;
            let (status, reason) = condition(&l, "Ready")?;
            let message = l.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?.message;
            (status == "False" && reason == "InvalidSpec" && message.contains(want)).then_some(message)
        }
    };
    eventually("no ConfigMap: refused", || refused("spec.schedule.trace.configMap")).await;

    // An unlabelled ConfigMap of that name is not read.
    let lines: String = (1..=100).map(|ms| format!("{}\n", ms * 10)).collect();
    let map = |labelled: bool| -> ConfigMap {
        let labels = if labelled { json!({"isthmus.dev/trace": "lte"}) } else { json!({}) };
        serde_json::from_value(json!({"metadata": {"name": "lte", "labels": labels}, "data": {"up": lines}})).unwrap()
    };
    maps.create(&PostParams::default(), &map(false)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    refused("labelled isthmus.dev/trace").await.expect("an unlabelled ConfigMap is not a trace");

    maps.replace("lte", &PostParams::default(), &map(true)).await.unwrap();
    let s = eventually("the trace replayed", || async {
        let s = links.get("replay").await.ok()?.status?.schedule?;
        (s.state == ScheduleState::Running).then_some(s)
    })
    .await;
    assert!(s.phase.as_deref().is_some_and(|p| p.starts_with("window ")), "{s:?}");

    maps.delete("lte", &DeleteParams::default()).await.unwrap();
    eventually("the ConfigMap gone: refused again", || refused("spec.schedule.trace.configMap")).await;

    links.delete("replay", &DeleteParams::default()).await.unwrap();
    running.stop().await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}
