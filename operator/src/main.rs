//! The isthmus operator: watches NetworkLinks and the pods they select, and keeps every node's agent on its
//! node's plan.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use isthmus_agent_api::client::{AgentClient, ClientConfig, TlsFiles};
use isthmus_operator::controller::nodes::DispatchConfig;
use isthmus_operator::controller::version::Backoff;
use isthmus_operator::controller::watch::AgentSelector;
use isthmus_operator::controller::{self, Config, Context};
use isthmus_operator::leader::{Election, LeaderConfig};
use isthmus_operator::metrics::Metrics;
use isthmus_operator::plan::{DEFAULT_DESTINATIONS_PER_LINK, DEFAULT_DESTINATIONS_PER_POD, PlanLimits};
use isthmus_operator::telemetry::{self, HttpState, LogFormat};
use kube::runtime::events::{Recorder, Reporter};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// TCP port of the agents' API on each agent pod's IP.
    #[arg(long, env = "ISTHMUS_AGENT_PORT", default_value_t = 9443)]
    agent_port: u16,
    /// Directory with the operator's client identity for the agents: `ca.crt`, `tls.crt`, `tls.key` (a mounted
    /// `kubernetes.io/tls` Secret). The individual paths below override it.
    #[arg(long, env = "ISTHMUS_AGENT_TLS_DIR", default_value = "/var/run/isthmus/agent-client")]
    agent_tls_dir: PathBuf,
    #[arg(long, env = "ISTHMUS_AGENT_CA")]
    agent_ca: Option<PathBuf>,
    #[arg(long, env = "ISTHMUS_AGENT_CERT")]
    agent_cert: Option<PathBuf>,
    #[arg(long, env = "ISTHMUS_AGENT_KEY")]
    agent_key: Option<PathBuf>,
    /// Label selector of the agent pods.
    #[arg(long, env = "ISTHMUS_AGENT_SELECTOR", default_value = "app.kubernetes.io/name=isthmus-agent")]
    agent_selector: String,
    /// Namespace of the agent pods (all namespaces when empty).
    #[arg(long, env = "ISTHMUS_AGENT_NAMESPACE", default_value = "")]
    agent_namespace: String,
    /// Seconds between full plan resends to every agent.
    #[arg(long, env = "ISTHMUS_RESYNC_SECONDS", default_value_t = 60)]
    resync_seconds: u64,
    /// Seconds a deleted NetworkLink waits for its nodes to confirm the cleanup before its finalizer goes anyway.
    #[arg(long, env = "ISTHMUS_CLEANUP_TIMEOUT_SECONDS", default_value_t = 120)]
    cleanup_timeout_seconds: u64,
    /// Elect a leader among replicas (a single replica may turn it off).
    #[arg(long, env = "ISTHMUS_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    #[arg(long, env = "ISTHMUS_LEASE_NAME", default_value = "isthmus-operator")]
    lease_name: String,
    /// Namespace of the Lease; defaults to POD_NAMESPACE.
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    lease_namespace: String,
    /// This replica's identity in the Lease; defaults to the pod name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "ISTHMUS_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    #[arg(long, env = "ISTHMUS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Most destinations one NetworkLink may select (both directions together); a link beyond it is refused
    /// whole with `TooManyDestinations` (docs/networklink.md#plan-limits).
    #[arg(long, env = "ISTHMUS_MAX_DESTINATIONS_PER_LINK", default_value_t = DEFAULT_DESTINATIONS_PER_LINK)]
    max_destinations_per_link: u32,
    /// Most destinations one pod may have over all its links (at least the per-link limit, at most 4,095);
    /// its links are admitted in rank order and the rest refused for that pod.
    #[arg(long, env = "ISTHMUS_MAX_DESTINATIONS_PER_POD", default_value_t = DEFAULT_DESTINATIONS_PER_POD)]
    max_destinations_per_pod: u32,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Delete every NetworkLink in every namespace and wait until the running operator has removed their
    /// impairments (their finalizers are gone); exits non-zero naming the links left after the timeout.
    /// The chart's pre-delete hook.
    Uninstall {
        #[arg(long, default_value_t = 180)]
        timeout_seconds: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init_logging(args.log_format);
    if let Some(Command::Uninstall { timeout_seconds }) = args.command {
        return uninstall(Duration::from_secs(timeout_seconds)).await;
    }

    let config = args.controller_config()?;
    let agent_client = args.agent_client()?;
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let identity = args.identity();
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));

    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let leadership = args.leadership(&client, &identity).await?;
    let http =
        serve_http(args.metrics_addr, HttpState { metrics: metrics.clone(), ready: ready.clone() }, &shutdown_rx)
            .await?;

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
    let controller = tokio::spawn(controller::run(ctx, shutdown_rx));

    wait_for_signal().await?;
    tracing::info!("shutting down");
    let _ = shutdown_tx.send(true);
    let _ = controller.await;
    leadership.release().await;
    match http.await {
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics server"),
        Err(e) => tracing::warn!(error = %e, "metrics server task"),
        Ok(Ok(())) => {}
    }
    Ok(())
}

async fn uninstall(timeout: Duration) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
    let deleted = isthmus_operator::uninstall::delete_all_and_wait(client, timeout)
        .await
        .context("uninstall: deleting every NetworkLink and waiting for the operator to remove their impairments")?;
    tracing::info!(deleted, "no NetworkLink left");
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

impl Args {
    fn agent_client(&self) -> anyhow::Result<Arc<AgentClient>> {
        let files = TlsFiles {
            ca: self.agent_ca.clone().unwrap_or_else(|| self.agent_tls_dir.join("ca.crt")),
            cert: self.agent_cert.clone().unwrap_or_else(|| self.agent_tls_dir.join("tls.crt")),
            key: self.agent_key.clone().unwrap_or_else(|| self.agent_tls_dir.join("tls.key")),
        };
        let client_config = ClientConfig::new(files).context("loading the agent client identity")?;
        Ok(Arc::new(AgentClient::new(client_config)))
    }

    fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "isthmus-operator".into())
        })
    }

    async fn leadership(&self, client: &kube::Client, identity: &str) -> anyhow::Result<Leadership> {
        if !self.leader_election {
            let (tx, rx) = Election::always_leader();
            return Ok(Leadership { election: None, leader: rx, _fixed: Some(tx) });
        }
        let config = LeaderConfig {
            lease_name: self.lease_name.clone(),
            lease_namespace: self.lease_namespace.clone(),
            identity: identity.to_owned(),
            duration_s: 15,
            grace_s: 5,
        };
        let election = Election::start(client.clone(), &config).await.context("starting leader election")?;
        let leader = election.is_leader.clone();
        Ok(Leadership { election: Some(election), leader, _fixed: None })
    }

    fn controller_config(&self) -> anyhow::Result<Config> {
        let limits = PlanLimits::new(self.max_destinations_per_link, self.max_destinations_per_pod)
            .context("--max-destinations-per-link / --max-destinations-per-pod")?;
        Ok(Config {
            agent_port: self.agent_port,
            agents: AgentSelector {
                namespace: Some(self.agent_namespace.clone()).filter(|n| !n.is_empty()),
                labels: self.agent_selector.clone(),
            },
            dispatch: DispatchConfig { resync: Duration::from_secs(self.resync_seconds), backoff: Backoff::default() },
            cleanup_timeout: Duration::from_secs(self.cleanup_timeout_seconds),
            field_manager: "isthmus-operator".into(),
            limits,
        })
    }
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
