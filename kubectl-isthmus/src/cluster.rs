//! The Kubernetes side: listing NetworkLinks as the operator reads them (one object at a time, so one
//! unreadable link does not hide the others), feeding the operator's planner, and asking the node's agent
//! through the exec API.

use std::collections::BTreeMap;

use isthmus_agent_api::explain::ExplainReport;
use isthmus_operator::api::{NetworkLink, StoredLink};
use isthmus_operator::index::ObjectKey;
use isthmus_operator::plan::Planner;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{Api, AttachParams, DynamicObject, ListParams};
use kube::client::UpgradeConnectionError;
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use tokio::io::AsyncReadExt;

use crate::explain::AgentView;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{what}: forbidden ({message}); ask for list/get on it, or use -n with a namespace you may read")]
    Forbidden { what: String, message: String },
    #[error("{what}: {source}")]
    Api { what: String, source: kube::Error },
    #[error("NetworkLink {key} cannot be read ({reason})")]
    Unreadable { key: String, reason: String },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let what = what.into();
    move |source| match source {
        kube::Error::Api(status) if status.code == 403 => ClusterError::Forbidden { what, message: status.message },
        source => ClusterError::Api { what, source },
    }
}

/// Every NetworkLink of `namespace` (all namespaces for `None`), each decoded on its own.
pub async fn list_links(client: &Client, namespace: Option<&str>) -> Result<Vec<StoredLink>, ClusterError> {
    let resource = ApiResource::erase::<NetworkLink>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let what = format!("listing NetworkLinks in {}", namespace.unwrap_or("all namespaces"));
    let list = api.list(&ListParams::default()).await.map_err(api_error(what))?;
    let mut links = Vec::with_capacity(list.items.len());
    for object in list.items {
        let key = format!("{}/{}", object.namespace().unwrap_or_default(), object.name_any());
        let value = serde_json::to_value(object)
            .map_err(|e| ClusterError::Unreadable { key: key.clone(), reason: e.to_string() })?;
        links.push(StoredLink::from_value(value).map_err(|e| ClusterError::Unreadable { key, reason: e.to_string() })?);
    }
    Ok(links)
}

/// The operator's planner fed with what decides the egress of `namespace`'s pods: its links, and the pods,
/// Services and Namespaces they can select (cluster-wide only where a link has a `namespaceSelector`). Returns
/// the links that could be read too, for their status.
pub async fn plan_for(
    client: &Client,
    namespace: &str,
) -> Result<(Planner, BTreeMap<ObjectKey, NetworkLink>), ClusterError> {
    let links: BTreeMap<ObjectKey, NetworkLink> = list_links(client, Some(namespace))
        .await?
        .into_iter()
        // An unreadable link is planned by nobody: the operator applies nothing for it either.
        .filter_map(|s| s.decoded.ok())
        .map(|l| (ObjectKey::new(namespace, l.name_any()), l))
        .collect();
    let cluster_wide = links.values().any(|l| l.spec.to.namespace_selector.is_some());
    let scope = if cluster_wide { None } else { Some(namespace) };
    let mut planner = Planner::new();
    let lp = ListParams::default();
    if cluster_wide {
        let namespaces =
            Api::<Namespace>::all(client.clone()).list(&lp).await.map_err(api_error("listing namespaces"))?;
        namespaces.items.iter().for_each(|n| planner.apply_namespace(n));
    }
    let scoped = |what: &str| format!("listing {what} in {}", scope.unwrap_or("all namespaces"));
    let pods: Api<Pod> = scope.map_or_else(|| Api::all(client.clone()), |ns| Api::namespaced(client.clone(), ns));
    pods.list(&lp).await.map_err(api_error(scoped("pods")))?.items.iter().for_each(|p| planner.apply_pod(p));
    let services: Api<Service> =
        scope.map_or_else(|| Api::all(client.clone()), |ns| Api::namespaced(client.clone(), ns));
    services
        .list(&lp)
        .await
        .map_err(api_error(scoped("services")))?
        .items
        .iter()
        .for_each(|s| planner.apply_service(s));
    links.values().for_each(|l| planner.apply_link(l));
    planner.recompute();
    Ok((planner, links))
}

/// Where the agents run, as the operator's `--agent-selector` and `--agent-namespace` say.
pub struct AgentLocation<'a> {
    pub selector: &'a str,
    /// `None`: every namespace.
    pub namespace: Option<&'a str>,
}

/// Asks the agent on `node` what is installed for the pod (`uid`, `ips`) towards `destination`. The outer
/// error says why no agent could be asked; the inner one, why the asked agent gave no report.
pub async fn ask_agent(
    client: &Client,
    at: &AgentLocation<'_>,
    node: &str,
    uid: &str,
    ips: &[std::net::IpAddr],
    destination: std::net::IpAddr,
) -> Result<AgentView, String> {
    let pods: Api<Pod> =
        at.namespace.map_or_else(|| Api::all(client.clone()), |ns| Api::namespaced(client.clone(), ns));
    let lp = ListParams::default().labels(at.selector).fields(&format!("spec.nodeName={node}"));
    let list = pods.list(&lp).await.map_err(|e| api_error("listing agent pods")(e).to_string())?;
    let agent = list.items.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
    let Some(agent) = agent else {
        return Err(format!("no running agent pod ({}) on node {node}", at.selector));
    };
    let key = ObjectKey::new(agent.namespace().unwrap_or_default(), agent.name_any());
    let container = agent.spec.as_ref().and_then(|s| s.containers.first());
    let setting = container
        .and_then(|c| c.env.as_ref())
        .and_then(|env| env.iter().find(|e| e.name == "ISTHMUS_DATAPATH"))
        .and_then(|e| e.value.clone());
    let mut command = vec!["/usr/local/bin/isthmus-agent".to_string(), "explain".into(), "--uid".into(), uid.into()];
    for ip in ips {
        command.extend(["--ip".to_string(), ip.to_string()]);
    }
    command.extend(["--destination".to_string(), destination.to_string(), "--log-format".into(), "text".into()]);
    let params = AttachParams::default()
        .container(container.map(|c| c.name.clone()).unwrap_or_default())
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
    let report = exec(&api, &key.name, command, &params).await;
    Ok(AgentView { pod: key, setting, report })
}

async fn exec(api: &Api<Pod>, pod: &str, command: Vec<String>, params: &AttachParams) -> Result<ExplainReport, String> {
    let mut process = api.exec(pod, command, params).await.map_err(|e| match e {
        kube::Error::Api(status) if status.code == 403 => {
            format!("exec forbidden: you may not create pods/exec on the agent pod ({})", status.message)
        }
        kube::Error::UpgradeConnection(UpgradeConnectionError::ProtocolSwitch(code)) if code.as_u16() == 403 => {
            "exec forbidden: you may not create pods/exec on the agent pod".into()
        }
        e => format!("exec in the agent pod failed: {e}"),
    })?;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let out = process.stdout().ok_or("the exec gave no stdout")?;
    let err = process.stderr().ok_or("the exec gave no stderr")?;
    let status = process.take_status().ok_or("the exec gave no status")?;
    let (r1, r2) = tokio::join!(
        async move { tokio::io::BufReader::new(out).read_to_string(&mut stdout).await.map(|_| stdout) },
        async move { tokio::io::BufReader::new(err).read_to_string(&mut stderr).await.map(|_| stderr) },
    );
    let status = status.await;
    let (stdout, stderr) = (r1.map_err(|e| e.to_string())?, r2.map_err(|e| e.to_string())?);
    if let Some(s) = status.filter(|s| s.status.as_deref() == Some("Failure")) {
        let detail =
            stderr.lines().rev().find(|l| !l.trim().is_empty()).or(s.message.as_deref()).unwrap_or("no message");
        return Err(format!("the agent's explain failed: {detail}"));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| format!("the agent's report does not parse ({e}): {stdout}"))
}

/// Adds a destination pod of another namespace that [`plan_for`] did not list (no link there looks beyond its
/// own namespace, so the plan cannot change): its address is all that is wanted. A pod that does not exist is
/// left out, and the caller's lookup then names it unknown.
pub async fn add_pod(client: &Client, planner: &mut Planner, key: &ObjectKey) -> Result<(), ClusterError> {
    if planner.index().pods.contains_key(key) {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
    if let Some(pod) = pods.get_opt(&key.name).await.map_err(api_error(format!("getting pod {key}")))? {
        planner.apply_pod(&pod);
        planner.recompute();
    }
    Ok(())
}
