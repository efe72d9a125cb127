//! The isthmus operator: watches NetworkLinks and the pods they select, and keeps every node's agent on its
//! node's plan. The flags are [`isthmus_operator::flags`]; this file wires what they configure.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use isthmus_agent_api::client::{AgentClient, ClientConfig};
use isthmus_agent_api::metrics_auth::{DecisionCache, KubeReviewer, MetricsAuth};
use isthmus_operator::admission;
use isthmus_operator::admission::hold_flags::Hold;
use isthmus_operator::admission::links_applied::HeldPods;
use isthmus_operator::admission::server::{HoldServing, ServingCertificate};
use isthmus_operator::admission::upkeep::{ServingConfig, WebhookConfiguration};
use isthmus_operator::controller::{self, Context};
use isthmus_operator::flags::{Args, Command, service_name};
use isthmus_operator::leader::{Election, LeaderConfig};
use isthmus_operator::metrics::Metrics;
use isthmus_operator::metrics_https;
use isthmus_operator::pki::names::ServiceDnsName;
use isthmus_operator::pki::signer;
use isthmus_operator::pki::store::Pki;
use isthmus_operator::telemetry::{self, HttpState};
use isthmus_operator::uninstall::GatedPodsPolicy;
use isthmus_operator::wait_for_links;
use kube::runtime::events::{Recorder, Reporter};

/// What the operator's HTTPS listeners are started with.
struct Serving<'a> {
    client: &'a kube::Client,
    pki: &'a Arc<Pki>,
    metrics: &'a Arc<Metrics>,
    leadership: &'a Leadership,
    shutdown: &'a tokio::sync::watch::Receiver<bool>,
}

/// A listener's serving task and its certificate's upkeep.
type Listening = (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init_logging(args.log_format);
    match args.command {
        Some(Command::Uninstall { timeout_seconds, gated_pods }) => {
            return uninstall(Duration::from_secs(timeout_seconds), gated_pods).await;
        }
        Some(Command::WaitForLinks) => {
            let config = wait_for_links::WaitConfig::from_env(|name| std::env::var(name).ok())?;
            return Ok(wait_for_links::run(config).await?);
        }
        None => {}
    }

    let config = args.controller_config()?;
    let pki_config = args.pki_config()?;
    let hold = args.hold.hold(!args.webhook_dns_name.is_empty())?;
    // Service names are checked before anything is started, and once.
    let agent_shared_name = service_name("--agent-shared-dns-name", &args.agent_shared_dns_name)?;
    let metrics_dns_name = service_name("--metrics-dns-name", &args.metrics_dns_name)?;
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let pki = Pki::start(&client, pki_config).await.context("loading or creating the isthmus CA")?;
    let agent_client = Arc::new(AgentClient::new(ClientConfig::with_credentials(pki.credentials.clone())));
    let identity = args.identity();
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let leadership = leadership(&args, &client, &identity).await?;
    let upkeep = pki.clone().spawn_refresh(
        client.clone(),
        leadership.leader.clone(),
        shutdown_rx.clone(),
        Duration::from_secs(60),
        args.signer_config(agent_shared_name.clone()),
    );
    let serving =
        Serving { client: &client, pki: &pki, metrics: &metrics, leadership: &leadership, shutdown: &shutdown_rx };
    let webhook = start_webhook(&args, &serving, hold).await?;
    let metrics_https = match &metrics_dns_name {
        Some(name) => Some(start_metrics_https(&args, &serving, name).await?),
        None => {
            tracing::info!("no --metrics-dns-name: /metrics is not served by token");
            None
        }
    };
    let signer = tokio::spawn(signer::run(
        client.clone(),
        pki,
        args.signer_config(agent_shared_name.clone()),
        leadership.leader.clone(),
        shutdown_rx.clone(),
    ));
    let state = HttpState { metrics: metrics.clone(), ready: ready.clone(), plain_metrics: args.plain_metrics };
    let http = serve_http(args.metrics_addr, state, &shutdown_rx).await?;

    let ctx = Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter { controller: "isthmus-operator".into(), instance: Some(identity) },
        ),
        client,
        metrics,
        agent_api: agent_client,
        config,
        leader: leadership.leader.clone(),
        ready,
    };
    let topologies = tokio::spawn(isthmus_operator::topology::reconcile::run(
        ctx.client.clone(),
        leadership.leader.clone(),
        shutdown_rx.clone(),
    ));
    let controller = tokio::spawn(controller::run(ctx, shutdown_rx));

    wait_for_signal().await?;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    let _ = tokio::join!(controller, topologies);
    let _ = tokio::join!(upkeep, signer);
    for (serving, upkeep) in [webhook, metrics_https].into_iter().flatten() {
        let _ = tokio::join!(serving, upkeep);
    }
    leadership.release().await;
    match http.await {
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics server"),
        Err(e) => tracing::warn!(error = %e, "metrics server task"),
        Ok(Ok(())) => {}
    }
    Ok(())
}

async fn uninstall(timeout: Duration, gated_pods: GatedPodsPolicy) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let done = isthmus_operator::uninstall::uninstall(client, timeout, gated_pods).await.context("uninstall")?;
    tracing::info!(deleted = done.deleted, released = done.released, "no NetworkLink left");
    Ok(())
}

/// Whether this replica leads: from the Lease, or always when election is off.
struct Leadership {
    election: Option<Election>,
    leader: tokio::sync::watch::Receiver<bool>,
    /// Keeps a fixed answer alive while election is off.
    _fixed: Option<tokio::sync::watch::Sender<bool>>,
}

impl Leadership {
    async fn release(self) {
        let Some(election) = self.election else { return };
        // A dispatcher finishing a call still holds the leadership flag; do not outwait the pod's grace period.
        if tokio::time::timeout(Duration::from_secs(10), election.release(vec![self.leader])).await.is_err() {
            tracing::warn!("leader lease not released within 10 s; it expires on its own");
        }
    }
}

/// A serving certificate for `dns_name` from the operator's CA, kept renewed until shutdown (and, with a
/// `configurations`, their `caBundle`): the certificate a listener presents, and the
/// upkeep's task.
fn serving_certificate(
    args: &Args,
    cx: &Serving<'_>,
    dns_name: &str,
    configurations: Vec<WebhookConfiguration>,
) -> anyhow::Result<(Arc<ServingCertificate>, tokio::task::JoinHandle<()>)> {
    let config = ServingConfig {
        dns_name: dns_name.to_owned(),
        configurations,
        validity: Duration::from_secs(args.certificate_validity_hours * 3600),
    };
    let certificate = Arc::new(ServingCertificate::default());
    let upkeep = admission::upkeep::start(
        cx.client.clone(),
        cx.pki.clone(),
        config,
        certificate.clone(),
        cx.leadership.leader.clone(),
        cx.shutdown.clone(),
    )
    .with_context(|| format!("issuing the serving certificate for {dns_name}"))?;
    Ok((certificate, upkeep))
}

/// The webhooks' listener and its certificate's upkeep, when a DNS name is given; with the hold's routes
/// when its image is.
async fn start_webhook(args: &Args, cx: &Serving<'_>, hold: Option<Hold>) -> anyhow::Result<Option<Listening>> {
    if args.webhook_dns_name.is_empty() {
        tracing::info!("no --webhook-dns-name: the NetworkTopology admission webhook is not served");
        return Ok(None);
    }
    let dns_name = service_name("--webhook-dns-name", &args.webhook_dns_name)?.expect("not empty");
    let mut configurations = Vec::new();
    if !args.webhook_configuration.is_empty() {
        configurations.push(WebhookConfiguration::Validating(args.webhook_configuration.clone()));
    }
    let hold = hold.map(|hold| {
        if let Some(name) = hold.configuration {
            configurations.push(WebhookConfiguration::Mutating(name));
        }
        let pki = cx.pki.clone();
        Arc::new(HoldServing::new(
            HeldPods::watch(cx.client.clone(), cx.shutdown.clone()),
            cx.client.clone(),
            hold.image,
            hold.image_pull_policy,
            dns_name.clone(),
            args.webhook_service_port,
            Arc::new(move || pki.ca().bundle()),
            hold.default_timeout,
            hold.max_timeout,
        ))
    });
    let (certificate, upkeep) = serving_certificate(args, cx, dns_name.as_str(), configurations)?;
    let (_, serving) =
        admission::server::bind(args.webhook_addr, certificate, cx.metrics.clone(), hold, cx.shutdown.clone())
            .await
            .with_context(|| format!("binding --webhook-addr {}", args.webhook_addr))?;
    Ok(Some((tokio::spawn(serving), upkeep)))
}

/// `/metrics` by token on its HTTPS listener, with a certificate for `name`, and the certificate's upkeep.
async fn start_metrics_https(args: &Args, cx: &Serving<'_>, name: &ServiceDnsName) -> anyhow::Result<Listening> {
    let (certificate, upkeep) = serving_certificate(args, cx, name.as_str(), Vec::new())?;
    let auth = Arc::new(MetricsAuth::new(KubeReviewer::new(cx.client.clone()), DecisionCache::default()));
    let (bound, serving) =
        metrics_https::bind(args.metrics_secure_addr, certificate, cx.metrics.clone(), auth, cx.shutdown.clone())
            .await
            .with_context(|| format!("binding --metrics-secure-addr {}", args.metrics_secure_addr))?;
    tracing::info!(addr = %bound, dns_name = %name, "serving /metrics by ServiceAccount token");
    Ok((tokio::spawn(serving), upkeep))
}

async fn leadership(args: &Args, client: &kube::Client, identity: &str) -> anyhow::Result<Leadership> {
    if !args.leader_election {
        let (tx, rx) = Election::always_leader();
        return Ok(Leadership { election: None, leader: rx, _fixed: Some(tx) });
    }
    let config = LeaderConfig {
        lease_name: args.lease_name.clone(),
        lease_namespace: args.lease_namespace.clone(),
        identity: identity.to_owned(),
        duration_s: 15,
        grace_s: 5,
    };
    let election = Election::start(client.clone(), &config).await.context("starting leader election")?;
    let leader = election.is_leader.clone();
    Ok(Leadership { election: Some(election), leader, _fixed: None })
}

/// `/metrics`, `/healthz` and `/readyz` until shutdown.
async fn serve_http(
    addr: SocketAddr,
    state: HttpState,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding --metrics-addr {addr}"))?;
    let mut rx = shutdown.clone();
    Ok(tokio::spawn(telemetry::serve(listener, state, async move {
        let _ = rx.wait_for(|s| *s).await;
    })))
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
    }
    Ok(())
}
