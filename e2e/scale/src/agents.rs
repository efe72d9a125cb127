//! The agents, one per node, as a harness: each gets its serving certificate the way the agent does (a token
//! bound to its pod, a CertificateSigningRequest the operator approves and signs), listens at its pod's address
//! behind the agent's own TLS listener (the operator's client certificate required), parses each plan with the
//! agent's own parser and answers it as the agent does, every valid pod applied. What it simulates is the
//! kernel: nothing is installed (the agent's own cost per plan is the `agent_apply` benchmark's).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use isthmus_agent::auth::{Caller, Callers, IssuedCertificate, ReloadingTls, TlsSource};
use isthmus_agent::ca_bundle::TrustedBundle;
use isthmus_agent::metrics::Metrics;
use isthmus_agent::node::{PlanPod, RawNodePlan};
use isthmus_agent::server::{Limits, Peer, TlsListener};
use isthmus_agent_api::measure::{MEASURED_PATH, MeasuredState};
use isthmus_agent_api::{ApplyReply, CAPABILITIES_PATH, Capabilities, DatapathKind, PLAN_PATH, PodOutcome, PodResult};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::shape::Shape;
use crate::world::{AgentPod, Places};

/// What an agent answers and what it was sent.
#[derive(Debug)]
pub struct Agent {
    node: String,
    held: Mutex<Held>,
    pub plans: AtomicU64,
    pub plan_bytes: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    in_force: Option<u64>,
    last: Vec<PodResult>,
}

fn capabilities() -> Capabilities {
    Capabilities {
        kernel_release: "harness".into(),
        htb: true,
        tbf: true,
        netem: true,
        u32: true,
        duplicate_restricted: false,
        datapath: DatapathKind::Tc,
    }
}

impl Agent {
    pub fn new(node: String) -> Agent {
        Agent { node, held: Mutex::default(), plans: AtomicU64::new(0), plan_bytes: AtomicU64::new(0) }
    }

    /// The agent's answer to `plan` (`node::Node::apply`'s rules): an older version than the one in force is
    /// stale and changes nothing; otherwise every valid pod is applied and every malformed one fails with the
    /// parser's reason.
    pub fn answer(&self, plan: RawNodePlan) -> ApplyReply {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let stale = held.in_force.is_some_and(|v| plan.version < v);
        if !stale {
            held.in_force = Some(plan.version);
            held.last = plan.pods.iter().enumerate().map(|(index, pod)| result(index, pod)).collect();
        }
        ApplyReply {
            node: self.node.clone(),
            version: held.in_force.unwrap_or(plan.version),
            stale,
            pods: held.last.clone(),
            capabilities: capabilities(),
            leftovers: Vec::new(),
        }
    }

    fn measured(&self) -> MeasuredState {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        MeasuredState {
            node: self.node.clone(),
            version: held.in_force.unwrap_or(0),
            enabled: false,
            links: Vec::new(),
        }
    }
}

fn result(index: usize, pod: &PlanPod) -> PodResult {
    match pod {
        PlanPod::Valid { pod, .. } => PodResult::of(pod, PodOutcome::Applied),
        PlanPod::Malformed(bad) => bad.result(index),
    }
}

fn refuse(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "message": message }))).into_response()
}

/// Only the operator may call: the listener named the caller from its certificate.
fn operator_only(peer: &Peer) -> Option<Response> {
    match &peer.caller {
        Ok(Caller::Operator) => None,
        Ok(Caller::Scraper) => Some(refuse(StatusCode::FORBIDDEN, "the scraper may read /metrics only".into())),
        Err(why) => Some(refuse(StatusCode::FORBIDDEN, why.clone())),
    }
}

async fn put_plan(State(agent): State<Arc<Agent>>, ConnectInfo(peer): ConnectInfo<Peer>, body: Bytes) -> Response {
    if let Some(refused) = operator_only(&peer) {
        return refused;
    }
    agent.plans.fetch_add(1, Ordering::Relaxed);
    agent.plan_bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
    let plan = match RawNodePlan::from_json(&body) {
        Ok(plan) => plan,
        Err(e) => return refuse(StatusCode::UNPROCESSABLE_ENTITY, format!("malformed plan: {e}")),
    };
    if plan.node != agent.node {
        return refuse(
            StatusCode::CONFLICT,
            format!("the plan is for node {:?}; this agent serves {:?}", plan.node, agent.node),
        );
    }
    axum::Json(agent.answer(plan)).into_response()
}

fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route(PLAN_PATH, put(put_plan))
        .route(
            CAPABILITIES_PATH,
            get(|ConnectInfo(peer): ConnectInfo<Peer>| async move {
                operator_only(&peer).unwrap_or_else(|| axum::Json(capabilities()).into_response())
            }),
        )
        .route(
            MEASURED_PATH,
            get(|State(agent): State<Arc<Agent>>, ConnectInfo(peer): ConnectInfo<Peer>| async move {
                operator_only(&peer).unwrap_or_else(|| axum::Json(agent.measured()).into_response())
            }),
        )
        .with_state(agent)
}

/// A client acting as `pod` with a token bound to it, as the agent's projected token makes it act.
async fn as_agent_pod(admin: &Client, places: &Places, pod: &AgentPod) -> anyhow::Result<Client> {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), &places.agent_namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(&places.agent_service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token bound to pod {}", pod.name))?
        .status
        .context("the TokenRequest came back without a token")?
        .token;
    let mut config = kube::Config::infer().await.context("the kubeconfig")?;
    config.auth_info = kube::config::AuthInfo { token: Some(secrecy::SecretString::from(token)), ..Default::default() };
    Ok(Client::try_from(config)?)
}

/// Starts the agent of `pod`'s node at its pod's address on `port`: certificate through the operator, then
/// serving until the process ends.
pub async fn start(
    admin: &Client,
    places: &Places,
    pod: &AgentPod,
    bundle: Arc<TrustedBundle>,
    callers: Callers,
    port: u16,
) -> anyhow::Result<Arc<Agent>> {
    let node = Shape::node_name(pod.node);
    let client = as_agent_pod(admin, places, pod).await?;
    let issued =
        isthmus_agent::csr::request(&client, &node, None).await.with_context(|| format!("{node}'s certificate"))?;
    let certificate = Arc::new(IssuedCertificate::default());
    certificate.set(issued.cert_pem.into_bytes(), issued.key_pem.into_bytes());
    let tls = Arc::new(ReloadingTls::load(TlsSource::Issued { ca: bundle, certificate })?);
    let address = SocketAddr::new(Shape::agent_ip(pod.node).into(), port);
    let tcp = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    let listener = TlsListener::new(tcp, tls, callers, Arc::new(Metrics::new()), Limits::API)?;
    let agent = Arc::new(Agent::new(node));
    let app = router(agent.clone()).into_make_service_with_connect_info::<Peer>();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(%address, error = %e, "a harness agent stopped serving");
        }
    });
    Ok(agent)
}

#[cfg(test)]
mod tests {
    use isthmus_agent_api::{NodePlan, PodErrorKind};

    use super::*;

    fn plan(version: u64, pods: &str) -> RawNodePlan {
        RawNodePlan::from_json(format!(r#"{{"node":"n","version":{version},"pods":[{pods}]}}"#).as_bytes()).unwrap()
    }

    const POD: &str = r#"{"uid":"u1","namespace":"ns","name":"p1","ips":["198.18.0.1"],"groups":[]}"#;

    #[test]
    fn valid_pods_are_applied_and_a_malformed_one_fails_alone_with_the_parser_s_reason() {
        let agent = Agent::new("n".into());
        let reply = agent.answer(plan(1, &format!(r#"{POD},{{"uid":"u2","namespace":"ns","name":"p2"}}"#)));
        assert!(!reply.stale);
        assert_eq!(reply.pods.len(), 2);
        assert_eq!(reply.pods[0].outcome, PodOutcome::Applied);
        match &reply.pods[1].outcome {
            PodOutcome::Failed(e) => {
                assert!(e.kind == PodErrorKind::InvalidPlan && e.message.starts_with("pods[1]: "), "{e:?}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(reply.pods[1].name, "p2");
    }

    #[test]
    fn an_older_plan_is_stale_and_keeps_the_answer_in_force() {
        let agent = Agent::new("n".into());
        agent.answer(plan(5, POD));
        let reply = agent.answer(plan(4, ""));
        assert!(reply.stale);
        assert_eq!((reply.version, reply.pods.len()), (5, 1));
        // The same version again is applied again (a retried call).
        let again = agent.answer(plan(5, ""));
        assert!(!again.stale && again.pods.is_empty());
        assert_eq!(agent.measured().version, 5);
    }

    #[test]
    fn the_plan_the_operator_sends_parses_as_the_agent_parses_it() {
        let sent = NodePlan { node: "n".into(), version: 3, ..NodePlan::default() };
        let reply = Agent::new("n".into()).answer(RawNodePlan::from_json(&serde_json::to_vec(&sent).unwrap()).unwrap());
        assert_eq!((reply.version, reply.stale), (3, false));
    }
}
