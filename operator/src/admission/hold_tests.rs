use serde_json::{Value, json};

use super::*;

fn config() -> HoldConfig {
    HoldConfig {
        image: "registry.example/isthmus-operator:1.0".into(),
        image_pull_policy: "IfNotPresent".into(),
        url: "https://isthmus-webhook.isthmus-system.svc:9443/v1/links-applied".into(),
        address: Some("10.96.0.20:9443".into()),
        ca_bundle: "-----BEGIN CERTIFICATE-----\n…\n-----END CERTIFICATE-----\n".into(),
        default_timeout: Duration::from_secs(120),
        max_timeout: Duration::from_secs(600),
    }
}

fn pod(extra: Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": "api-0", "namespace": "shop", "labels": {"app": "api", HOLD_LABEL: "true"}},
        "spec": {"containers": [{"name": "api", "image": "registry.example/api:1.4"}]},
    });
    json_patch::merge(&mut pod, &extra);
    serde_json::from_value(pod).unwrap()
}

fn names(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().init_containers.iter().flatten().map(|c| c.name.clone()).collect()
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().unwrap().readiness_gates.iter().flatten().map(|g| g.condition_type.clone()).collect()
}

fn env_of(pod: &Pod) -> Vec<(String, String)> {
    let c = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let from = e.value_from.as_ref().and_then(|f| f.field_ref.as_ref()).map(|f| format!("<{}>", f.field_path));
            (e.name.clone(), e.value.clone().or(from).unwrap_or_default())
        })
        .collect()
}

#[test]
fn an_opted_in_pod_gets_the_wait_first_and_the_gate_exactly_once() {
    let p = pod(json!({"spec": {"initContainers": [{"name": "migrate", "image": "registry.example/migrate:2"}]}}));
    let once = held(&p, &config()).unwrap().expect("a change");
    assert_eq!(names(&once), [CONTAINER_NAME, "migrate"]);
    assert_eq!(gates(&once), [CONDITION_TYPE]);
    let c = &once.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
    assert_eq!(c.image.as_deref(), Some("registry.example/isthmus-operator:1.0"));
    assert_eq!(c.args.as_deref(), Some(&[WAIT_COMMAND.to_string()][..]));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.run_as_non_root, sc.allow_privilege_escalation, sc.read_only_root_filesystem),
        (Some(true), Some(false), Some(true))
    );
    assert_eq!(
        env_of(&once),
        [
            (env::URL.into(), "https://isthmus-webhook.isthmus-system.svc:9443/v1/links-applied".into()),
            (env::ADDRESS.into(), "10.96.0.20:9443".into()),
            (env::CA_BUNDLE.into(), config().ca_bundle),
            (env::NAMESPACE.into(), "<metadata.namespace>".into()),
            (env::NAME.into(), "<metadata.name>".into()),
            (env::UID.into(), "<metadata.uid>".into()),
            (env::TIMEOUT.into(), "120".into()),
        ]
    );
    // Called again (reinvocation): nothing more to do.
    assert_eq!(held(&once, &config()).unwrap(), None);
}

#[test]
fn a_container_put_before_ours_by_a_later_webhook_moves_behind_it_again() {
    let p = pod(json!({}));
    let once = held(&p, &config()).unwrap().unwrap();
    let mut other = once.clone();
    let init = other.spec.as_mut().unwrap().init_containers.as_mut().unwrap();
    init.insert(0, Container { name: "istio-init".into(), ..Default::default() });
    let again = held(&other, &config()).unwrap().expect("moved");
    assert_eq!(names(&again), [CONTAINER_NAME, "istio-init"]);
    assert_eq!(gates(&again), [CONDITION_TYPE], "the gate is not added twice");
}

#[test]
fn a_pod_that_did_not_opt_in_is_left_alone() {
    for labels in [json!({HOLD_LABEL: null}), json!({HOLD_LABEL: "false"}), json!({HOLD_LABEL: "yes"})] {
        let p = pod(json!({"metadata": {"labels": labels}}));
        assert_eq!(held(&p, &config()).unwrap(), None, "{labels}");
    }
}

#[test]
fn an_existing_gate_is_kept_and_not_repeated() {
    let p = pod(
        json!({"spec": {"readinessGates": [{"conditionType": "example.com/warm"}, {"conditionType": CONDITION_TYPE}]}}),
    );
    let once = held(&p, &config()).unwrap().unwrap();
    assert_eq!(gates(&once), ["example.com/warm", CONDITION_TYPE]);
}

#[test]
fn the_timeout_annotation_is_read_within_its_bounds_and_refused_naming_it_outside() {
    let with = |t: &str| pod(json!({"metadata": {"annotations": {TIMEOUT_ANNOTATION: t}}}));
    let timeout = |t: &str| {
        let once = held(&with(t), &config())?.unwrap();
        Ok::<_, HoldError>(env_of(&once).into_iter().find(|e| e.0 == env::TIMEOUT).unwrap().1)
    };
    assert_eq!(timeout("90s").unwrap(), "90");
    assert_eq!(timeout("600s").unwrap(), "600");
    for (bad, reason) in
        [("601s", "must be from 1s to 600s"), ("500ms", "must be from 1s to 600s"), ("10m", "use s for long durations")]
    {
        let e = timeout(bad).unwrap_err().to_string();
        assert!(e.starts_with(&format!("metadata.annotations[{TIMEOUT_ANNOTATION}]: \"{bad}\": ")), "{e}");
        assert!(e.contains(reason), "{e}");
    }
}

#[test]
fn a_container_of_the_reserved_name_is_refused_naming_its_field() {
    let mine = json!([{"name": CONTAINER_NAME, "image": "registry.example/mine:1"}]);
    let e = held(&pod(json!({"spec": {"initContainers": mine}})), &config()).unwrap_err();
    assert_eq!(e, HoldError::ReservedName { field: "spec.initContainers[0].name".into() });
    let mine = json!([{"name": "api", "image": "a"}, {"name": CONTAINER_NAME, "image": "b"}]);
    let e = held(&pod(json!({"spec": {"containers": mine}})), &config()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "spec.containers[1].name: {CONTAINER_NAME} is reserved for isthmus's hold (label {HOLD_LABEL}); rename this container"
        )
    );
}

fn review(operation: &str, object: Value) -> AdmissionRequest<DynamicObject> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "r-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "api-0", "namespace": "shop", "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": object, "dryRun": false,
        }
    });
    serde_json::from_value::<kube::core::admission::AdmissionReview<DynamicObject>>(review).unwrap().try_into().unwrap()
}

#[test]
fn a_create_is_answered_with_a_json_patch_that_makes_the_held_pod() {
    let before = serde_json::to_value(pod(json!({}))).unwrap();
    let answer = decide(&review("CREATE", before.clone()), &config());
    assert!(answer.allowed);
    let patch: json_patch::Patch = serde_json::from_slice(answer.patch.as_ref().expect("a patch")).unwrap();
    let mut after = before;
    json_patch::patch(&mut after, &patch).unwrap();
    let after: Pod = serde_json::from_value(after).unwrap();
    assert_eq!(Some(after), held(&pod(json!({})), &config()).unwrap());
}

#[test]
fn only_creates_are_changed_and_a_refusal_names_the_field() {
    let held_pod = serde_json::to_value(pod(json!({}))).unwrap();
    let update = decide(&review("UPDATE", held_pod), &config());
    assert!(update.allowed && update.patch.is_none());
    let bad = pod(json!({"metadata": {"annotations": {TIMEOUT_ANNOTATION: "7200s"}}}));
    let refused = decide(&review("CREATE", serde_json::to_value(bad).unwrap()), &config());
    assert!(!refused.allowed);
    assert!(refused.result.message.starts_with("metadata.annotations[isthmus.dev/wait-for-links-timeout]"));
    let plain = pod(json!({"metadata": {"labels": {HOLD_LABEL: null}}}));
    let untouched = decide(&review("CREATE", serde_json::to_value(plain).unwrap()), &config());
    assert!(untouched.allowed && untouched.patch.is_none());
}
