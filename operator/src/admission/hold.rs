//! The hold: a pod that opts in (label `isthmus.dev/wait-for-links: "true"`) gets, at admission, a first init
//! container that waits until the pod's `isthmus.dev/links-applied` condition is True, and the readiness gate that
//! makes the operator write that condition. Nothing of the pod runs before its links are in force; after the
//! timeout the container fails, so the pod never runs unimpaired (docs/networklink.md, "Impaired from the first
//! packet"). Pure: a pod and the hold's configuration in, the JSON patch out.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodReadinessGate, ResourceRequirements, SeccompProfile,
    SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};

use crate::gate::CONDITION_TYPE;

/// The label a pod opts in with; only the value `"true"` holds it.
pub const HOLD_LABEL: &str = "isthmus.dev/wait-for-links";
/// The annotation that overrides the wait's timeout for one pod: a duration in the links' units (`90s`, `300s`).
pub const TIMEOUT_ANNOTATION: &str = "isthmus.dev/wait-for-links-timeout";
/// The init container's name, reserved: a pod that has a container of its own by this name is refused.
pub const CONTAINER_NAME: &str = "isthmus-wait-for-links";
/// The operator's subcommand the container runs.
pub const WAIT_COMMAND: &str = "wait-for-links";

/// The environment the container reads (see [`crate::wait_for_links`]).
pub mod env {
    pub const URL: &str = "ISTHMUS_LINKS_APPLIED_URL";
    pub const ADDRESS: &str = "ISTHMUS_OPERATOR_ADDRESS";
    pub const CA_BUNDLE: &str = "ISTHMUS_CA_BUNDLE_PEM";
    pub const NAMESPACE: &str = "ISTHMUS_POD_NAMESPACE";
    pub const NAME: &str = "ISTHMUS_POD_NAME";
    pub const UID: &str = "ISTHMUS_POD_UID";
    pub const TIMEOUT: &str = "ISTHMUS_WAIT_TIMEOUT_SECONDS";
}

/// What the injected container needs to know, fixed by the operator's flags and its CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldConfig {
    /// The operator's image (the container runs `isthmus-operator wait-for-links`).
    pub image: String,
    /// The operator's own pull policy (`IfNotPresent`, `Always`, `Never`).
    pub image_pull_policy: String,
    /// `https://<service>.<namespace>.svc:<port>/v1/links-applied`: the certificate is checked under its host.
    pub url: String,
    /// `<ClusterIP>:<port>` of the webhook Service: connected to instead of resolving the URL's host, so the
    /// wait needs no cluster DNS (the pod may run before DNS answers, or in a cluster without it).
    pub address: Option<String>,
    /// The operator's CA certificate (PEM), which signs the webhook's serving certificate.
    pub ca_bundle: String,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
}

/// Why a pod that opted in is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HoldError {
    #[error("{field}: {CONTAINER_NAME} is reserved for isthmus's hold (label {HOLD_LABEL}); rename this container")]
    ReservedName { field: String },
    #[error("metadata.annotations[{TIMEOUT_ANNOTATION}]: {value:?}: {reason}")]
    Timeout { value: String, reason: String },
    #[error("the operator cannot read this pod: {0}")]
    Unreadable(String),
}

/// Whether the pod opted in.
pub fn opted_in(pod: &Pod) -> bool {
    pod.metadata.labels.as_ref().and_then(|l| l.get(HOLD_LABEL)).is_some_and(|v| v == "true")
}

/// The wait's timeout for this pod: its annotation, or the default; within 1 s and the maximum.
pub fn timeout_of(pod: &Pod, config: &HoldConfig) -> Result<Duration, HoldError> {
    let Some(value) = pod.metadata.annotations.as_ref().and_then(|a| a.get(TIMEOUT_ANNOTATION)) else {
        return Ok(config.default_timeout);
    };
    let refuse = |reason: String| HoldError::Timeout { value: value.clone(), reason };
    let timeout = crate::unit_syntax::parse_duration(value).map_err(|e| refuse(e.to_string()))?;
    if timeout < Duration::from_secs(1) || timeout > config.max_timeout {
        return Err(refuse(format!("must be from 1s to {}s (the operator's maximum)", config.max_timeout.as_secs())));
    }
    Ok(timeout)
}

/// The pod as the hold wants it: the init container first, exactly once, and the readiness gate. `None` when the
/// pod needs no change (not opted in, or already held: the webhook is called again after later webhooks changed
/// the pod, `reinvocationPolicy: IfNeeded`, and moves its container back to the front if one was put before it).
pub fn held(pod: &Pod, config: &HoldConfig) -> Result<Option<Pod>, HoldError> {
    if !opted_in(pod) {
        return Ok(None);
    }
    let timeout = timeout_of(pod, config)?;
    let ours = container(config, timeout);
    let spec = pod.spec.clone().unwrap_or_default();
    if let Some(i) = spec.containers.iter().position(|c| c.name == CONTAINER_NAME) {
        return Err(HoldError::ReservedName { field: format!("spec.containers[{i}].name") });
    }
    let mut init = spec.init_containers.clone().unwrap_or_default();
    let found: Vec<usize> = init.iter().enumerate().filter(|(_, c)| c.name == CONTAINER_NAME).map(|(i, _)| i).collect();
    match found.as_slice() {
        [] => init.insert(0, ours),
        // Ours as injected before (same image and command): moved back to the front if it is not there.
        [i] if init[*i].image == ours.image && init[*i].args == ours.args => {
            let c = init.remove(*i);
            init.insert(0, c);
        }
        [i, ..] => return Err(HoldError::ReservedName { field: format!("spec.initContainers[{i}].name") }),
    }
    let mut gates = spec.readiness_gates.clone().unwrap_or_default();
    if !gates.iter().any(|g| g.condition_type == CONDITION_TYPE) {
        gates.push(PodReadinessGate { condition_type: CONDITION_TYPE.to_owned() });
    }
    if Some(&init) == spec.init_containers.as_ref() && Some(&gates) == spec.readiness_gates.as_ref() {
        return Ok(None);
    }
    let mut out = pod.clone();
    let out_spec = out.spec.get_or_insert_with(Default::default);
    out_spec.init_containers = Some(init);
    out_spec.readiness_gates = Some(gates);
    Ok(Some(out))
}

/// The injected container: the operator's own binary, as unprivileged as a container can be.
fn container(config: &HoldConfig, timeout: Duration) -> Container {
    let value = |name: &str, value: &str| EnvVar { name: name.into(), value: Some(value.into()), value_from: None };
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), api_version: None }),
            ..Default::default()
        }),
    };
    let mut vars = vec![value(env::URL, &config.url)];
    if let Some(address) = &config.address {
        vars.push(value(env::ADDRESS, address));
    }
    vars.extend([
        value(env::CA_BUNDLE, &config.ca_bundle),
        field(env::NAMESPACE, "metadata.namespace"),
        field(env::NAME, "metadata.name"),
        field(env::UID, "metadata.uid"),
        value(env::TIMEOUT, &timeout.as_secs().to_string()),
    ]);
    let quantity = |s: &str| Quantity(s.to_owned());
    Container {
        name: CONTAINER_NAME.into(),
        image: Some(config.image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        args: Some(vec![WAIT_COMMAND.into()]),
        env: Some(vars),
        resources: Some(ResourceRequirements {
            requests: Some([("cpu".to_owned(), quantity("10m")), ("memory".to_owned(), quantity("16Mi"))].into()),
            limits: Some([("memory".to_owned(), quantity("64Mi"))].into()),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..Default::default()
        }),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// The answer to a pod's admission: admitted with a patch that holds it, admitted unchanged, or refused naming
/// the field. Anything but a create passes (a pod's init containers cannot change after it is created).
pub fn decide(request: &AdmissionRequest<DynamicObject>, config: &HoldConfig) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if request.operation != Operation::Create {
        return response;
    }
    let Some(object) = &request.object else {
        return response.deny("the request holds no object");
    };
    let before = match serde_json::to_value(object) {
        Ok(v) => v,
        Err(e) => return response.deny(HoldError::Unreadable(e.to_string())),
    };
    let pod: Pod = match serde_json::from_value(before.clone()) {
        Ok(p) => p,
        Err(e) => return response.deny(HoldError::Unreadable(e.to_string())),
    };
    match held(&pod, config) {
        Ok(None) => response,
        Ok(Some(pod)) => {
            let after = serde_json::to_value(&pod).expect("a pod serializes");
            match response.with_patch(json_patch::diff(&before, &after)) {
                Ok(r) => r,
                Err(e) => AdmissionResponse::from(request).deny(HoldError::Unreadable(e.to_string())),
            }
        }
        Err(e) => response.deny(e),
    }
}

#[cfg(test)]
#[path = "hold_tests.rs"]
mod tests;
