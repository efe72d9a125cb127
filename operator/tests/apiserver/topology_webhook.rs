//! The NetworkTopology admission webhook (`isthmus_operator::admission`) called by a real API server: the
//! operator's own listener and decision, registered as the chart registers it (its rules, match condition
//! and failure policy), reached by URL on this machine and limited to one namespace so that nothing else in
//! the cluster depends on it.

use std::sync::Arc;
use std::time::Duration;

use isthmus_operator::admission::review::AdmissionOutcome;
use isthmus_operator::admission::server::{ServingCertificate, bind};
use isthmus_operator::admission::{TOPOLOGIES_PATH, upkeep};
use isthmus_operator::metrics::{AdmissionOutcomeLabels, Metrics};
use isthmus_operator::pki::ca::{Authority, CaSet};
use isthmus_operator::topology::NetworkTopology;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

/// The webhook as the chart registers it (charts/isthmus/templates/topology-webhook.yaml), with a URL for
/// the service and a namespace selector.
fn registration(name: &str, ns: &str, port: u16, ca_bundle: &str) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "networktopologies.isthmus.dev",
            "clientConfig": {
                "url": format!("https://localhost:{port}{TOPOLOGIES_PATH}"),
                "caBundle": k8s_openapi::ByteString(ca_bundle.as_bytes().to_vec()),
            },
            "rules": [{
                "apiGroups": ["isthmus.dev"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["networktopologies"], "scope": "Namespaced",
            }],
            "matchConditions": [{
                "name": "spec-written",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
            }],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))
    .expect("a valid ValidatingWebhookConfiguration")
}

/// The operator's webhook listening on loopback, registered for namespace `ns` alone.
pub struct Webhook {
    pub client: Client,
    pub ns: String,
    name: String,
    stop: tokio::sync::watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl Webhook {
    /// Serves, registers and waits until the API server calls it.
    pub async fn start(client: &Client, ns: &str) -> Webhook {
        super::create_namespace(client, ns).await;
        let ca = CaSet::new(Authority::generate(time::OffsetDateTime::now_utc(), Duration::from_secs(86_400)).unwrap());
        let (_, key) = upkeep::issue(&ca, "localhost", Duration::from_secs(3600)).unwrap();
        let certificate = Arc::new(ServingCertificate::default());
        certificate.set(key);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        let (addr, serving) =
            bind("127.0.0.1:0".parse().unwrap(), certificate, metrics.clone(), None, stopped).await.unwrap();
        tokio::spawn(serving);
        let name = format!("isthmus-it-{ns}");
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let _ = api.delete(&name, &DeleteParams::default()).await;
        api.create(&PostParams::default(), &registration(&name, ns, addr.port(), &ca.bundle())).await.unwrap();
        let webhook = Webhook { client: client.clone(), ns: ns.to_owned(), name, stop, metrics };
        // The API server picks a new configuration up from its informer, within about a second.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            match webhook.create_dry("probe", jitter_without_latency()).await {
                Err(e) if e.contains("spec.default.jitter") => return webhook,
                other => assert!(tokio::time::Instant::now() < deadline, "the webhook is not called: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The reviews answered with `verdict`.
    fn answered(&self, verdict: AdmissionOutcome) -> u64 {
        self.metrics.admission_reviews.get_or_create(&AdmissionOutcomeLabels { verdict: verdict.as_str() }).get()
    }

    pub fn topologies(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.ns, &ApiResource::erase::<NetworkTopology>(&()))
    }

    async fn create(&self, name: &str, spec: Value, dry_run: bool) -> Result<DynamicObject, String> {
        let mut object = DynamicObject::new(name, &ApiResource::erase::<NetworkTopology>(&())).within(&self.ns);
        object.data = json!({"spec": spec});
        let params = PostParams { dry_run, ..PostParams::default() };
        self.topologies().create(&params, &object).await.map_err(|e| e.to_string())
    }

    pub async fn create_dry(&self, name: &str, spec: Value) -> Result<DynamicObject, String> {
        self.create(name, spec, true).await
    }

    /// Stops the listener; the registration stays, as when the operator is down.
    fn stop_serving(&self) {
        let _ = self.stop.send(true);
    }

    pub async fn remove(self) {
        self.stop_serving();
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        api.delete(&self.name, &DeleteParams::default()).await.unwrap();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.ns, &DeleteParams::default()).await;
    }
}

fn regions(default: Value) -> Value {
    json!({"regionLabel": "region", "regions": [{"name": "eu"}, {"name": "us"}], "default": default})
}

/// A spec the schema and its CEL rules admit and the operator cannot expand: jitter where no layer gives
/// the pair a latency.
fn jitter_without_latency() -> Value {
    regions(json!({"jitter": "2ms"}))
}

#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation of main.rs"]
async fn a_topology_the_operator_cannot_expand_is_refused_at_admission_naming_the_field() {
    let (client, ns) = super::client_and_namespace().await;
    let webhook = Webhook::start(&client, &format!("{ns}-refused")).await;
    let refused = webhook.create("world", jitter_without_latency(), false).await.unwrap_err();
    assert!(
        refused.contains("admission webhook \"networktopologies.isthmus.dev\" denied the request: spec.default.jitter: eu → us: jitter needs a latency"),
        "{refused}"
    );
    // The same layer over a dataset's latency expands, and is stored.
    let mut spec = jitter_without_latency();
    spec["dataset"] = json!("Azure");
    spec["regions"] = json!([{"name": "eu", "datasetRegion": "westeurope"}, {"name": "us", "datasetRegion": "eastus"}]);
    webhook.create("world", spec, false).await.unwrap();
    // The probe that found the webhook called, the refusal and the admission above, each counted.
    assert!(webhook.answered(AdmissionOutcome::Refused) >= 2 && webhook.answered(AdmissionOutcome::Admitted) == 1);
    assert_eq!(webhook.answered(AdmissionOutcome::Unreadable), 0);
    webhook.remove().await;
}

/// The chart's failure policy is Fail, so that nothing unexpandable is stored while the operator is down;
/// its match condition keeps the webhook out of every update that leaves the spec alone, so that finalizers,
/// labels and status are written whether or not the operator serves.
#[tokio::test]
#[ignore = "needs a kube-apiserver: see the module documentation of main.rs"]
async fn while_the_webhook_is_down_only_spec_writes_are_refused() {
    let (client, ns) = super::client_and_namespace().await;
    let webhook = Webhook::start(&client, &format!("{ns}-down")).await;
    webhook.create("world", regions(json!({"latency": "40ms"})), false).await.unwrap();
    webhook.stop_serving();
    let api = webhook.topologies();
    let params = PatchParams::default();
    let metadata = json!({"metadata": {"labels": {"team": "a"}, "finalizers": ["isthmus.dev/test"]}});
    api.patch("world", &params, &Patch::Merge(&metadata)).await.expect("a metadata update passes");
    let status = json!({"status": {"summary": "eu, us"}});
    api.patch_status("world", &params, &Patch::Merge(&status)).await.expect("a status update passes");
    let spec = json!({"spec": {"default": {"latency": "50ms"}}});
    let refused = api.patch("world", &params, &Patch::Merge(&spec)).await.unwrap_err().to_string();
    assert!(refused.contains("failed calling webhook"), "{refused}");
    api.patch("world", &params, &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await.unwrap();
    api.delete("world", &DeleteParams::default()).await.expect("a delete passes");
    webhook.remove().await;
}
