//! An in-memory API server for the controller's writes, in the manner of kube-rs `controller-rs`'s fixtures: a
//! `kube::Client` whose transport is a function. It keeps the NetworkLinks and the pods created through it,
//! answers status patches (server-side apply), finalizer merge patches (refused with 409 on a stale
//! resourceVersion, as the real one does), pod conditions (server-side apply on `pods/status`, merged by type,
//! refused with 422 for another UID) and Event creation, records each, and feeds every change back to the
//! controller as a watch event would.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use isthmus_operator::api::{NetworkLink, NetworkLinkStatus};
use isthmus_operator::controller::watch::Update;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::client::Body;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One write the controller made.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Status {
        link: String,
        status: Box<NetworkLinkStatus>,
    },
    Finalizers {
        link: String,
        finalizers: Vec<String>,
    },
    Event {
        link: String,
        type_: String,
        reason: String,
    },
    /// A pod condition applied on `pods/status` by a field manager.
    PodCondition {
        pod: String,
        manager: String,
        condition: PodCondition,
    },
}

#[derive(Debug, Default)]
struct State {
    /// "namespace/name" → the object as JSON.
    links: BTreeMap<String, Value>,
    /// "namespace/name" → the pod as JSON.
    pods: BTreeMap<String, Value>,
    writes: Vec<Write>,
    resource_version: u64,
}

#[derive(Clone)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    watch: mpsc::Sender<Update>,
}

impl FakeApiServer {
    pub fn new(watch: mpsc::Sender<Update>) -> Self {
        Self { state: Arc::default(), watch }
    }

    pub fn client(&self) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(server.handle(req).await) }
        });
        kube::Client::new(service, "default")
    }

    /// A new link, as `kubectl apply` would create it.
    pub fn create(&self, link: &NetworkLink) {
        let mut v = serde_json::to_value(link).unwrap();
        v["metadata"]["uid"] = json!(format!("uid-{}", v["metadata"]["name"].as_str().unwrap()));
        v["metadata"]["generation"] = json!(1);
        self.commit(&mut self.state.lock().unwrap(), v);
    }

    /// `kubectl delete`: with a finalizer the object stays, marked for deletion.
    pub fn delete(&self, link: &str) {
        self.modify(link, |v| {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            Ok(())
        })
        .expect("a link to delete");
    }

    /// A spec change: a new generation.
    pub fn patch_spec(&self, link: &str, change: impl FnOnce(&mut Value)) {
        self.modify(link, |v| {
            change(&mut v["spec"]);
            v["metadata"]["generation"] = json!(v["metadata"]["generation"].as_i64().unwrap() + 1);
            Ok(())
        })
        .expect("a link to change");
    }

    /// A pod, as the kubelet would report it; the controller sees it through its pod watch.
    pub fn create_pod(&self, pod: &Pod) {
        let mut state = self.state.lock().unwrap();
        self.commit_pod(&mut state, serde_json::to_value(pod).unwrap());
    }

    /// A pod the server holds without telling the watch: for a test that lists it itself.
    pub fn store_pod(&self, pod: &Pod) {
        let v = serde_json::to_value(pod).unwrap();
        let key =
            format!("{}/{}", v["metadata"]["namespace"].as_str().unwrap(), v["metadata"]["name"].as_str().unwrap());
        self.state.lock().unwrap().pods.insert(key, v);
    }

    pub fn pod(&self, pod: &str) -> Option<Pod> {
        let state = self.state.lock().unwrap();
        state.pods.get(pod).map(|v| serde_json::from_value(v.clone()).unwrap())
    }

    /// The pod conditions written to one pod, in order: (status, reason, message).
    pub fn pod_conditions(&self, pod: &str) -> Vec<(String, String, String)> {
        let pod = format!("{}/{pod}", super::harness::NS);
        (self.writes().into_iter())
            .filter_map(|w| match w {
                Write::PodCondition { pod: p, condition: c, .. } if p == pod => {
                    Some((c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
                }
                _ => None,
            })
            .collect()
    }

    pub fn link(&self, link: &str) -> Option<NetworkLink> {
        let state = self.state.lock().unwrap();
        state.links.get(link).map(|v| serde_json::from_value(v.clone()).unwrap())
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().unwrap().writes.clone()
    }

    /// Changes a stored link in one step, as the API server does; the result is the object as stored.
    fn modify(&self, key: &str, f: impl FnOnce(&mut Value) -> Result<(), Refusal>) -> Result<Value, Refusal> {
        let mut state = self.state.lock().unwrap();
        let Some(mut v) = state.links.get(key).cloned() else {
            return Err(Refusal(StatusCode::NOT_FOUND, key.to_owned()));
        };
        f(&mut v)?;
        Ok(self.commit(&mut state, v))
    }

    /// Stores the object under a new resourceVersion and tells the controller, or deletes it once it is
    /// marked for deletion and has no finalizer left. Under the state's lock, so that the watch sees the
    /// versions in order.
    fn commit(&self, state: &mut State, mut v: Value) -> Value {
        let key =
            format!("{}/{}", v["metadata"]["namespace"].as_str().unwrap(), v["metadata"]["name"].as_str().unwrap());
        state.resource_version += 1;
        v["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        let finalizers = v["metadata"]["finalizers"].as_array().is_some_and(|f| !f.is_empty());
        let event = if v["metadata"]["deletionTimestamp"].is_string() && !finalizers {
            state.links.remove(&key);
            Event::Delete(serde_json::from_value(v.clone()).unwrap())
        } else {
            state.links.insert(key, v.clone());
            Event::Apply(serde_json::from_value(v.clone()).unwrap())
        };
        self.watch.try_send(Update::Link(Box::new(event))).expect("the controller keeps up");
        v
    }

    /// Stores a pod under a new resourceVersion and tells the controller's pod watch.
    fn commit_pod(&self, state: &mut State, mut v: Value) -> Value {
        let key =
            format!("{}/{}", v["metadata"]["namespace"].as_str().unwrap(), v["metadata"]["name"].as_str().unwrap());
        state.resource_version += 1;
        v["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
        state.pods.insert(key, v.clone());
        let pod = serde_json::from_value(v.clone()).unwrap();
        self.watch.try_send(Update::Pod(Event::Apply(pod))).expect("the controller keeps up");
        v
    }

    fn record(&self, write: Write) {
        self.state.lock().unwrap().writes.push(write);
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body: Value = serde_json::from_slice(&body.collect_bytes().await.unwrap()).unwrap_or(Value::Null);
        let path: Vec<&str> = parts.uri.path().trim_matches('/').split('/').collect();
        match (&parts.method, path.as_slice()) {
            (&Method::PATCH, ["apis", "isthmus.dev", "v1alpha1", "namespaces", ns, "networklinks", name, "status"]) => {
                self.patch_status(&format!("{ns}/{name}"), body)
            }
            (&Method::PATCH, ["apis", "isthmus.dev", "v1alpha1", "namespaces", ns, "networklinks", name]) => {
                self.patch_finalizers(&format!("{ns}/{name}"), body)
            }
            (&Method::PATCH, ["api", "v1", "namespaces", ns, "pods", name, "status"]) => {
                let manager = (parts.uri.query().unwrap_or_default().split('&'))
                    .find_map(|q| q.strip_prefix("fieldManager="))
                    .unwrap_or_default();
                self.apply_pod_conditions(&format!("{ns}/{name}"), manager, body)
            }
            (&Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
            | (&Method::PATCH, ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => self.event(body),
            _ => respond(StatusCode::NOT_FOUND, status_body(404, &format!("{} {}", parts.method, parts.uri))),
        }
    }

    fn patch_status(&self, key: &str, body: Value) -> Response<Body> {
        let status: NetworkLinkStatus = serde_json::from_value(body["status"].clone()).unwrap();
        let result = self.modify(key, |v| {
            v["status"] = body["status"].clone();
            Ok(())
        });
        self.answer(result, Write::Status { link: key.to_owned(), status: Box::new(status) })
    }

    fn patch_finalizers(&self, key: &str, body: Value) -> Response<Body> {
        let finalizers: Vec<String> = serde_json::from_value(body["metadata"]["finalizers"].clone()).unwrap();
        let result = self.modify(key, |v| {
            let expected = &body["metadata"]["resourceVersion"];
            if !expected.is_null() && *expected != v["metadata"]["resourceVersion"] {
                return Err(Refusal(StatusCode::CONFLICT, "the object has been modified".into()));
            }
            v["metadata"]["finalizers"] = json!(finalizers);
            Ok(())
        });
        self.answer(result, Write::Finalizers { link: key.to_owned(), finalizers })
    }

    /// Server-side apply of conditions on a pod's status: each replaces the pod's condition of its type (the list is
    /// a map keyed by type), the others stay. A UID in the body that is not the pod's is refused, as the real API
    /// server refuses to change an immutable field.
    fn apply_pod_conditions(&self, key: &str, manager: &str, body: Value) -> Response<Body> {
        let mut state = self.state.lock().unwrap();
        let Some(mut v) = state.pods.get(key).cloned() else {
            return respond(StatusCode::NOT_FOUND, status_body(404, &format!("pods {key} not found")));
        };
        let uid = &body["metadata"]["uid"];
        if !uid.is_null() && *uid != v["metadata"]["uid"] {
            return respond(StatusCode::UNPROCESSABLE_ENTITY, status_body(422, "metadata.uid: field is immutable"));
        }
        let applied: Vec<PodCondition> = serde_json::from_value(body["status"]["conditions"].clone()).unwrap();
        let mut conditions: Vec<Value> = v["status"]["conditions"].as_array().cloned().unwrap_or_default();
        for c in &applied {
            conditions.retain(|o| o["type"] != c.type_.as_str());
            conditions.push(serde_json::to_value(c).unwrap());
        }
        v["status"]["conditions"] = json!(conditions);
        let stored = self.commit_pod(&mut state, v);
        drop(state);
        for condition in applied {
            self.record(Write::PodCondition { pod: key.to_owned(), manager: manager.to_owned(), condition });
        }
        respond(StatusCode::OK, stored)
    }

    /// Records a write that went through, and answers with the stored object or the refusal.
    fn answer(&self, result: Result<Value, Refusal>, write: Write) -> Response<Body> {
        match result {
            Ok(v) => {
                self.record(write);
                respond(StatusCode::OK, v)
            }
            Err(Refusal(code, message)) => respond(code, status_body(code.as_u16(), &message)),
        }
    }

    fn event(&self, body: Value) -> Response<Body> {
        let regarding = &body["regarding"];
        let write = Write::Event {
            link: format!("{}/{}", regarding["namespace"].as_str().unwrap(), regarding["name"].as_str().unwrap()),
            type_: body["type"].as_str().unwrap().to_owned(),
            reason: body["reason"].as_str().unwrap().to_owned(),
        };
        self.record(write);
        respond(StatusCode::CREATED, body)
    }
}

/// Why the API server refuses a write: the HTTP status and its message.
#[derive(Debug)]
struct Refusal(StatusCode, String);

fn status_body(code: u16, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
}

fn respond(status: StatusCode, body: Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}
