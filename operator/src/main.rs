//! The isthmus operator: watches NetworkLinks and the pods they select, and keeps every node's agent on its
//! node's plan.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use isthmus_agent_api::client::{AgentClient, ClientConfig};
use isthmus_agent_api::metrics_auth::{DecisionCache, KubeReviewer, MetricsAuth};
use isthmus_operator::admission;
use isthmus_operator::admission::hold_flags::{Hold, HoldFlags};
use isthmus_operator::admission::links_applied::HeldPods;
use isthmus_operator::admission::server::{HoldServing, ServingCertificate};
use isthmus_operator::admission::upkeep::{ServingConfig, WebhookConfiguration};
use isthmus_operator::controller::measure::MeasureConfig;
use isthmus_operator::controller::nodes::DispatchConfig;
use isthmus_operator::controller::version::Backoff;
use isthmus_operator::controller::watch::AgentSelector;
use isthmus_operator::controller::{self, Config, Context};
use isthmus_operator::leader::{Election, LeaderConfig};
use isthmus_operator::metrics::Metrics;
use isthmus_operator::metrics_https;
use isthmus_operator::pki::names::ServiceDnsName;
use isthmus_operator::pki::signer::{self, SignerConfig};
use isthmus_operator::pki::store::{Pki, PkiConfig};
use isthmus_operator::plan::{
    DEFAULT_DESTINATIONS_PER_LINK, DEFAULT_DESTINATIONS_PER_POD, DEFAULT_PAIRS_PER_LINK, DEFAULT_PAIRS_TOTAL,
    PlanLimits,
};
use isthmus_operator::telemetry::{self, HttpState, LogFormat};
use isthmus_operator::uninstall::GatedPodsPolicy;
use isthmus_operator::wait_for_links;
use kube::runtime::events::{Recorder, Reporter};

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// TCP port of the agents' API on each agent pod's IP.
    #[arg(long, env = "ISTHMUS_AGENT_PORT", default_value_t = 9443)]
    agent_port: u16,
    /// The Secret (in POD_NAMESPACE) holding the isthmus CA; created by the operator when absent.
    #[arg(long, env = "ISTHMUS_CA_SECRET", default_value = "isthmus-ca")]
    ca_secret: String,
    /// The ConfigMap (in POD_NAMESPACE) publishing the CA certificates to the agents (`ca.crt`).
    #[arg(long, env = "ISTHMUS_CA_BUNDLE", default_value = "isthmus-ca-bundle")]
    ca_bundle: String,
    /// Lifetime of a CA, in days.
    #[arg(long, env = "ISTHMUS_CA_VALIDITY_DAYS", default_value_t = 3650)]
    ca_validity_days: u64,
    /// A new CA is made once the newest has less than this left, in days; the old one stays trusted until it
    /// expires.
    #[arg(long, env = "ISTHMUS_CA_RENEW_BEFORE_DAYS", default_value_t = 30)]
    ca_renew_before_days: u64,
    /// Lifetime of the operator's, the agents' and the scraper's certificates, in hours (each is renewed after
    /// two thirds of it).
    #[arg(long, env = "ISTHMUS_CERTIFICATE_VALIDITY_HOURS", default_value_t = 168)]
    certificate_validity_hours: u64,
    /// The DNS SAN of the operator's client certificate, which every agent requires.
    #[arg(
        long,
        env = "ISTHMUS_OPERATOR_IDENTITY",
        default_value = "isthmus-operator.isthmus-system.serviceaccount.isthmus"
    )]
    operator_identity: String,
    /// The Secret (in POD_NAMESPACE) the operator writes the metrics scraper's certificate into; empty: none.
    #[arg(long, env = "ISTHMUS_SCRAPER_SECRET", default_value = "")]
    scraper_secret: String,
    /// The DNS SAN of the metrics scraper's certificate.
    #[arg(long, env = "ISTHMUS_SCRAPER_IDENTITY", default_value = "")]
    scraper_identity: String,
    /// The agents' ServiceAccount (in the agents' namespace): the only requester whose certificate requests are
    /// signed.
    #[arg(long, env = "ISTHMUS_AGENT_SERVICE_ACCOUNT", default_value = "isthmus-agent")]
    agent_service_account: String,
    /// A DNS name every agent's serving certificate may carry besides its node's, so that a scraper of all
    /// agents can verify them under one name (the chart: the agents' metrics Service, `<service>.<ns>.svc`);
    /// must end in `.svc`. Empty: only the node's name is signed.
    #[arg(long, env = "ISTHMUS_AGENT_SHARED_DNS_NAME", default_value = "")]
    agent_shared_dns_name: String,
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
    /// The DNS name the API server calls the NetworkTopology admission webhook by (`<service>.<namespace>.svc`),
    /// the name of its serving certificate; empty: no webhook is served.
    #[arg(long, env = "ISTHMUS_WEBHOOK_DNS_NAME", default_value = "")]
    webhook_dns_name: String,
    /// Address of the webhook's HTTPS listener.
    #[arg(long, env = "ISTHMUS_WEBHOOK_ADDR", default_value = "0.0.0.0:9444")]
    webhook_addr: SocketAddr,
    /// The ValidatingWebhookConfiguration whose `caBundle` the leader keeps; empty: none.
    #[arg(long, env = "ISTHMUS_WEBHOOK_CONFIGURATION", default_value = "")]
    webhook_configuration: String,
    /// Port of the webhook's Service (the chart's: 443), which held pods connect to.
    #[arg(long, env = "ISTHMUS_WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    webhook_service_port: u16,
    #[command(flatten)]
    hold: HoldFlags,
    /// Address of the plain HTTP listener: `/healthz`, `/readyz` and, with `--plain-metrics`, `/metrics`.
    #[arg(long, env = "ISTHMUS_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Whether the plain HTTP listener also serves `/metrics`, to anyone who can reach it; false: `/metrics`
    /// only by ServiceAccount token on the HTTPS listener (`--metrics-dns-name`).
    #[arg(long, env = "ISTHMUS_PLAIN_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    plain_metrics: bool,
    /// The DNS name Prometheus reaches the HTTPS metrics listener by (the chart: `<service>.<namespace>.svc` of
    /// the operator's metrics Service), the name of its serving certificate from the operator's CA; empty: no
    /// HTTPS listener. It serves `/metrics` to a bearer token allowed `get` on the non-resource URL `/metrics`
    /// (TokenReview and SubjectAccessReview).
    #[arg(long, env = "ISTHMUS_METRICS_DNS_NAME", default_value = "")]
    metrics_dns_name: String,
    /// Address of the HTTPS metrics listener.
    #[arg(long, env = "ISTHMUS_METRICS_SECURE_ADDR", default_value = "0.0.0.0:8443")]
    metrics_secure_addr: SocketAddr,
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
    /// Most (source pod, destination) pairs one NetworkLink may ask for (both directions); a link beyond it is
    /// refused whole with `TooManyPairs`.
    #[arg(long, env = "ISTHMUS_MAX_PAIRS_PER_LINK", default_value_t = DEFAULT_PAIRS_PER_LINK)]
    max_pairs_per_link: u32,
    /// Most pairs of all NetworkLinks together (at least the per-link limit): links are admitted in rank order
    /// while their pairs fit, the rest refused whole with `TooManyPairs` until there is room.
    #[arg(long, env = "ISTHMUS_MAX_PAIRS_TOTAL", default_value_t = DEFAULT_PAIRS_TOTAL)]
    max_pairs_total: u32,
    /// Whether links are verified at all: false leaves every link without `status.measured` and `Conformant`
    /// and polls no agent (the chart's `verification.enabled`, which also switches the agents' probes off).
    #[arg(long, env = "ISTHMUS_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    verify: bool,
    /// How often the leader asks every agent for its latest probe windows (e.g. `10s`).
    #[arg(long, env = "ISTHMUS_MEASURE_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    measure_interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    match isthmus_operator::unit_syntax::parse_duration(s) {
        Ok(d) if d >= Duration::from_secs(1) => Ok(d),
        Ok(_) => Err("must be at least 1s: every poll asks every node's agent".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Delete every NetworkLink in every namespace and wait until the running operator has removed their
    /// impairments (their finalizers are gone); exits non-zero naming the links left after the timeout.
    /// The chart's pre-delete hook.
    Uninstall {
        #[arg(long, default_value_t = 180)]
        timeout_seconds: u64,
        /// Pods that declare the readiness gate `isthmus.dev/links-applied`: `refuse` uninstalls nothing while
        /// one exists (naming them), `release` uninstalls and then sets their condition True (`Uninstalled`).
        #[arg(long, value_enum, default_value_t = GatedPodsPolicy::Refuse)]
        gated_pods: GatedPodsPolicy,
    },
    /// Wait until this pod's links are applied: the first init container of a held pod, configured by the
    /// environment the hold's webhook gives it. Exits non-zero at its timeout, naming it.
    WaitForLinks,
}

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

/// A flag that names a Service's DNS name, or nothing when empty.
fn service_name(flag: &str, value: &str) -> anyhow::Result<Option<ServiceDnsName>> {
    if value.is_empty() {
        return Ok(None);
    }
    Ok(Some(ServiceDnsName::new(value).with_context(|| flag.to_owned())?))
}

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
    let leadership = args.leadership(&client, &identity).await?;
    let upkeep = pki.clone().spawn_refresh(
        client.clone(),
        leadership.leader.clone(),
        shutdown_rx.clone(),
        Duration::from_secs(60),
        args.signer_config(agent_shared_name.clone()),
    );
    let serving =
        Serving { client: &client, pki: &pki, metrics: &metrics, leadership: &leadership, shutdown: &shutdown_rx };
    let webhook = args.start_webhook(&serving, hold).await?;
    let metrics_https = match &metrics_dns_name {
        Some(name) => Some(args.start_metrics_https(&serving, name).await?),
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

impl Args {
    fn pki_config(&self) -> anyhow::Result<PkiConfig> {
        const DAY: u64 = 86_400;
        if self.ca_validity_days == 0 || self.ca_renew_before_days * 2 > self.ca_validity_days {
            anyhow::bail!(
                "--ca-renew-before-days ({}) must be at most half of --ca-validity-days ({}), so that a CA and its \
                 successor overlap at most two at a time",
                self.ca_renew_before_days,
                self.ca_validity_days
            );
        }
        if self.certificate_validity_hours == 0 || self.certificate_validity_hours > self.ca_renew_before_days * 24 {
            anyhow::bail!(
                "--certificate-validity-hours ({}) must be between 1 and --ca-renew-before-days in hours ({}): a \
                 certificate must be renewed from the new CA before the old one expires",
                self.certificate_validity_hours,
                self.ca_renew_before_days * 24
            );
        }
        let scraper = match (self.scraper_secret.as_str(), self.scraper_identity.as_str()) {
            ("", _) => None,
            (_, "") => anyhow::bail!("--scraper-secret needs --scraper-identity"),
            (secret, identity) => Some((secret.to_owned(), identity.to_owned())),
        };
        Ok(PkiConfig {
            namespace: self.lease_namespace.clone(),
            ca_secret: self.ca_secret.clone(),
            bundle_configmap: self.ca_bundle.clone(),
            operator_identity: self.operator_identity.clone(),
            scraper,
            ca_validity: Duration::from_secs(self.ca_validity_days * DAY),
            renew_before: Duration::from_secs(self.ca_renew_before_days * DAY),
            leaf_validity: Duration::from_secs(self.certificate_validity_hours * 3600),
        })
    }

    /// A serving certificate for `dns_name` from the operator's CA, kept renewed until shutdown (and, with a
    /// `configurations`, their `caBundle`): the certificate a listener presents, and the
    /// upkeep's task.
    fn serving_certificate(
        &self,
        cx: &Serving<'_>,
        dns_name: &str,
        configurations: Vec<WebhookConfiguration>,
    ) -> anyhow::Result<(Arc<ServingCertificate>, tokio::task::JoinHandle<()>)> {
        let config = ServingConfig {
            dns_name: dns_name.to_owned(),
            configurations,
            validity: Duration::from_secs(self.certificate_validity_hours * 3600),
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
    async fn start_webhook(&self, cx: &Serving<'_>, hold: Option<Hold>) -> anyhow::Result<Option<Listening>> {
        if self.webhook_dns_name.is_empty() {
            tracing::info!("no --webhook-dns-name: the NetworkTopology admission webhook is not served");
            return Ok(None);
        }
        let dns_name = service_name("--webhook-dns-name", &self.webhook_dns_name)?.expect("not empty");
        let mut configurations = Vec::new();
        if !self.webhook_configuration.is_empty() {
            configurations.push(WebhookConfiguration::Validating(self.webhook_configuration.clone()));
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
                self.webhook_service_port,
                Arc::new(move || pki.ca().bundle()),
                hold.default_timeout,
                hold.max_timeout,
            ))
        });
        let (certificate, upkeep) = self.serving_certificate(cx, dns_name.as_str(), configurations)?;
        let (_, serving) =
            admission::server::bind(self.webhook_addr, certificate, cx.metrics.clone(), hold, cx.shutdown.clone())
                .await
                .with_context(|| format!("binding --webhook-addr {}", self.webhook_addr))?;
        Ok(Some((tokio::spawn(serving), upkeep)))
    }

    /// `/metrics` by token on its HTTPS listener, with a certificate for `name`, and the certificate's upkeep.
    async fn start_metrics_https(&self, cx: &Serving<'_>, name: &ServiceDnsName) -> anyhow::Result<Listening> {
        let (certificate, upkeep) = self.serving_certificate(cx, name.as_str(), Vec::new())?;
        let auth = Arc::new(MetricsAuth::new(KubeReviewer::new(cx.client.clone()), DecisionCache::default()));
        let (bound, serving) =
            metrics_https::bind(self.metrics_secure_addr, certificate, cx.metrics.clone(), auth, cx.shutdown.clone())
                .await
                .with_context(|| format!("binding --metrics-secure-addr {}", self.metrics_secure_addr))?;
        tracing::info!(addr = %bound, dns_name = %name, "serving /metrics by ServiceAccount token");
        Ok((tokio::spawn(serving), upkeep))
    }

    fn signer_config(&self, agent_shared_name: Option<ServiceDnsName>) -> SignerConfig {
        SignerConfig {
            agent_namespace: Some(self.agent_namespace.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| self.lease_namespace.clone()),
            agent_service_account: self.agent_service_account.clone(),
            agent_labels: self.agent_selector.clone(),
            validity: Duration::from_secs(self.certificate_validity_hours * 3600),
            agent_shared_name,
        }
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
            .context("--max-destinations-per-link / --max-destinations-per-pod")?
            .with_pairs(self.max_pairs_per_link, self.max_pairs_total)
            .context("--max-pairs-per-link / --max-pairs-total")?;
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
            measure: MeasureConfig { enabled: self.verify, interval: self.measure_interval },
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
