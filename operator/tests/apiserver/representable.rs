//! What the API server admits, the operator represents: specs generated from the CRD's own schema
//! ([`super::schema_values`]) go to the real API server as server-side dry runs, and every one it admits must
//! resolve in the operator exactly as the controller resolves it ([`super::operator_resolves`]), with the
//! trace a schedule names present; every NetworkTopology admitted (the operator's webhook among the admission
//! steps, as installed) must expand into its links. An admitted spec the operator refuses would sit
//! `InvalidSpec` with nothing for the user to see at `kubectl apply`; the shrunk spec in the failure names the
//! gap between the schema and the code. A ramp's values are drawn in the unit of its field ([`wire_ramp`]), a
//! topology's links and hubs name its regions ([`wire_regions`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use isthmus_operator::api::NetworkLink;
use isthmus_operator::topology::NetworkTopologySpec;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};
use serde_json::Value;

use super::schema_values::values;
use super::topology_webhook::Webhook;
use super::{client_and_namespace, operator_resolves};

/// Cases per run: a dry run takes a few milliseconds, so this is seconds.
const CASES: u32 = 2000;
/// Values a ramp's `from`, `to` and `step` take, by the unit of its `field` (the schema cannot say that a
/// string's format depends on a sibling): the edges the rules look at (0, netem's widest jitter, the longest
/// delay, the bandwidth bounds) and ordinary values.
const RAMP_DURATIONS: &[&str] = &["0", "1ns", "100us", "1ms", "1.5ms", "10ms", "250ms", "2.147483647s", "3s", "3600s"];
const RAMP_PERCENTS: &[&str] = &["0%", "0.000000001%", "0.5%", "10%", "33.3%", "100%"];
const RAMP_RATES: &[&str] = &["100bit", "1kbit", "64kbit", "1Mbit", "10.5Mbit", "1Gbit", "1000Gbit"];
/// What a ramp's `over` takes: the shortest a step may last, and long enough for most ramps.
const RAMP_OVERS: &[&str] = &["999us", "1ms", "10ms", "1s", "60s", "3600s"];
/// How many times a refused spec is tried again without the fields the refusal names.
const REPAIRS: usize = 4;

/// How a generated spec fared.
enum Outcome {
    Refused,
    Represented,
}

/// A generated ramp's `from`, `to` and `step` replaced by values in the unit of its `field`, and its `over` by
/// one of [`RAMP_OVERS`], each chosen by a hash of the generated string: else a ramp is all but never admitted, and nothing tested beyond its format.
fn wire_ramp(spec: &mut Value) {
    let Some(ramp) = spec.pointer_mut("/schedule/ramp").and_then(Value::as_object_mut) else { return };
    let pool = match ramp.get("field").and_then(Value::as_str) {
        Some("Latency" | "Jitter") => RAMP_DURATIONS,
        Some("Loss") => RAMP_PERCENTS,
        _ => RAMP_RATES,
    };
    for (name, pool) in [("from", pool), ("to", pool), ("step", pool), ("over", RAMP_OVERS)] {
        if let Some(v) = ramp.get_mut(name) {
            *v = Value::from(pool[hash(v) % pool.len()]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn every_spec_the_api_server_admits_resolves_in_the_operator() {
    let strategy = values(&spec_schema()).prop_map(|mut spec| {
        wire_ramp(&mut spec);
        spec
    });
    let (client, ns) = client_and_namespace().await;
    let (admitted, tried) = admitted_specs_are_represented(&links(client, &ns), strategy, CASES).await;
    // The test proves something only about what is admitted: a generator that the server refuses wholesale
    // (a schema change it does not follow) must fail here, not pass empty.
    assert!(admitted * 10 >= tried, "only {admitted} of {tried} generated specs admitted");
}

/// A ramp is one schedule of four, under an optional field: the first test admits too few to cover its rules
/// across the link's own impairment, so this one gives every generated spec a ramp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn every_ramp_the_api_server_admits_resolves_in_the_operator() {
    let schema = spec_schema();
    let ramp = &schema["properties"]["schedule"]["properties"]["ramp"];
    let strategy = (values(&schema), values(ramp)).prop_map(|(mut spec, ramp)| {
        spec["schedule"] = serde_json::json!({"ramp": ramp});
        wire_ramp(&mut spec);
        spec
    });
    let (client, ns) = client_and_namespace().await;
    let (admitted, tried) = admitted_specs_are_represented(&links(client, &ns), strategy, CASES / 2).await;
    assert!(admitted * 20 >= tried, "only {admitted} of {tried} generated ramps admitted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: see the module documentation"]
async fn every_topology_the_api_server_admits_expands_in_the_operator() {
    let (client, ns) = client_and_namespace().await;
    let webhook = Webhook::start(&client, &format!("{ns}-topologies")).await;
    let resource = ApiResource::erase::<isthmus_operator::topology::NetworkTopology>(&());
    let target = Target { api: webhook.topologies(), resource, ns: webhook.ns.clone(), represents: topology_expands };
    let crd = serde_json::to_value(isthmus_operator::topology::crd()).unwrap();
    let strategy =
        values(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]).prop_map(|mut spec| {
            wire_regions(&mut spec);
            spec
        });
    let (admitted, tried) = admitted_specs_are_represented(&target, strategy, CASES).await;
    assert!(admitted * 10 >= tried, "only {admitted} of {tried} generated topologies admitted");
    webhook.remove().await;
}

/// Links and hubs name regions: a generated name is replaced by one of the generated regions' (by a hash of
/// it), else almost every topology with links would be refused for naming no region, and nothing tested beyond.
fn wire_regions(spec: &mut Value) {
    let names: Vec<Value> =
        spec["regions"].as_array().into_iter().flatten().filter_map(|r| r.get("name").cloned()).collect();
    if names.is_empty() {
        return;
    }
    let pick = |v: &mut Value| *v = names[hash(v) % names.len()].clone();
    for link in spec.get_mut("links").and_then(Value::as_array_mut).into_iter().flatten() {
        link.get_mut("from").map(pick);
        link.get_mut("to").map(pick);
    }
    if let Some(hubs) = spec.pointer_mut("/routing/hubs").and_then(Value::as_array_mut) {
        hubs.iter_mut().for_each(pick);
        hubs.sort_by_key(|h| h.to_string());
        hubs.dedup();
    }
}

/// Whether the operator expands `spec` into its links, as the topology reconciler does.
fn topology_expands(spec: &Value) -> Result<(), String> {
    let spec: NetworkTopologySpec = serde_json::from_value(spec.clone()).map_err(|e| e.to_string())?;
    isthmus_operator::topology::expand("generated", &spec).map(|_| ()).map_err(|e| e.to_string())
}

fn spec_schema() -> Value {
    let crd = serde_json::to_value(isthmus_operator::api::crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
}

/// Where generated specs go, and what the operator makes of those admitted.
struct Target {
    api: Api<DynamicObject>,
    resource: ApiResource,
    ns: String,
    /// Whether the operator acts on an admitted spec; the reason when it does not.
    represents: fn(&Value) -> Result<(), String>,
}

fn links(client: kube::Client, ns: &str) -> Target {
    let resource = ApiResource::erase::<NetworkLink>(&());
    let api = Api::namespaced_with(client, ns, &resource);
    Target { api, resource, ns: ns.to_owned(), represents: operator_resolves }
}

/// A stable hash of a generated string: the same spec is wired the same way every run.
fn hash(v: &Value) -> usize {
    v.as_str().unwrap_or("").bytes().fold(7usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize))
}

/// Sends `cases` specs of `strategy` to `target` and requires every one admitted to be represented;
/// (admitted, tried).
async fn admitted_specs_are_represented(
    target: &Target,
    strategy: impl Strategy<Value = Value>,
    cases: u32,
) -> (usize, usize) {
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    // A fixed seed: the same specs every run, so that a gap found is found again, not one run in twenty.
    let mut runner = TestRunner::new_with_rng(config.clone(), TestRng::deterministic_rng(config.rng_algorithm));
    let (admitted, tried) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |spec| {
            tried.fetch_add(1, Ordering::Relaxed);
            match handle.block_on(judge(target, &spec))? {
                Outcome::Represented => admitted.fetch_add(1, Ordering::Relaxed),
                Outcome::Refused => 0,
            };
            Ok(())
        })
    });
    let (admitted, tried) = (admitted.into_inner(), tried.into_inner());
    let plural = &target.api.resource_url();
    println!("{plural}: {admitted} of {tried} generated specs admitted by the API server, every one represented");
    if let Err(e) = result {
        panic!("{plural}: {e}");
    }
    (admitted, tried)
}

/// Tries `spec`, and while the API server refuses it, the spec without the fields the refusal names (at most
/// [`REPAIRS`] times): whatever it then admits is still generated from the schema, and far more specs get
/// through than whole random specs do (most break a rule across fields).
async fn judge(target: &Target, spec: &Value) -> Result<Outcome, TestCaseError> {
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let mut spec = spec.clone();
    let mut repairs = 0;
    let created = loop {
        let mut object = DynamicObject::new("generated", &target.resource).within(&target.ns);
        object.data = serde_json::json!({"spec": spec});
        match target.api.create(&dry_run, &object).await {
            Ok(created) => break created,
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => {
                let named: Vec<String> = s
                    .details
                    .iter()
                    .flat_map(|d| &d.causes)
                    .map(|c| c.field.clone())
                    .filter(|f| !f.is_empty())
                    .collect();
                repairs += 1;
                if repairs > REPAIRS || named.is_empty() || !named.iter().all(|f| remove(&mut spec, f)) {
                    return Ok(Outcome::Refused);
                }
            }
            Err(e) => return Err(TestCaseError::fail(format!("the API server failed on {spec}: {e}"))),
        }
    };
    let stored = serde_json::to_value(&created).unwrap();
    match (target.represents)(&stored["spec"]) {
        Ok(()) => Ok(Outcome::Represented),
        Err(e) => Err(TestCaseError::fail(format!("admitted, but the operator refuses it ({e}): {}", stored["spec"]))),
    }
}

/// Removes the field at `path` (as the API server names it: `spec.to.cidrs[1]`) from `spec`; false when there
/// is none there (a rule on the spec itself, or a path through a map key with a dot).
fn remove(spec: &mut Value, path: &str) -> bool {
    let Some(path) = path.strip_prefix("spec.") else { return false };
    let mut steps: Vec<Step> = Vec::new();
    for part in path.split('.') {
        let (name, indexes) = part.split_once('[').map_or((part, ""), |(n, rest)| (n, rest));
        steps.push(Step::Field(name.to_owned()));
        for index in indexes.split('[').filter(|i| !i.is_empty()) {
            match index.trim_end_matches(']').parse() {
                Ok(i) => steps.push(Step::Index(i)),
                Err(_) => return false,
            }
        }
    }
    let Some((last, parents)) = steps.split_last() else { return false };
    let mut at = spec;
    for step in parents {
        at = match (step, at) {
            (Step::Field(f), Value::Object(m)) => match m.get_mut(f) {
                Some(v) => v,
                None => return false,
            },
            (Step::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(v) => v,
                None => return false,
            },
            _ => return false,
        };
    }
    match (last, at) {
        (Step::Field(f), Value::Object(m)) => m.remove(f).is_some(),
        (Step::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
            true
        }
        _ => false,
    }
}

enum Step {
    Field(String),
    Index(usize),
}
