//! The operator's command line: every flag with its environment variable and default, the subcommands, and the
//! configurations the flags make, checked before anything starts. `main.rs` wires what they configure; the hold's
//! flags are [`crate::admission::hold_flags`], flattened in.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;

use crate::admission::hold_flags::HoldFlags;
use crate::controller::Config;
use crate::controller::measure::MeasureConfig;
use crate::controller::nodes::DispatchConfig;
use crate::controller::version::Backoff;
use crate::controller::watch::AgentSelector;
use crate::pki::names::ServiceDnsName;
use crate::pki::signer::SignerConfig;
use crate::pki::store::PkiConfig;
use crate::plan::{
    DEFAULT_DESTINATIONS_PER_LINK, DEFAULT_DESTINATIONS_PER_POD, DEFAULT_PAIRS_PER_LINK, DEFAULT_PAIRS_TOTAL,
    PlanLimits,
};
use crate::telemetry::LogFormat;
use crate::uninstall::GatedPodsPolicy;

// No doc comment on `Args`: clap would take it for the command's `about`, which is the package's description.
#[derive(Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// TCP port of the agents' API on each agent pod's IP.
    #[arg(long, env = "ISTHMUS_AGENT_PORT", default_value_t = 9443)]
    pub agent_port: u16,
    /// The Secret (in POD_NAMESPACE) holding the isthmus CA; created by the operator when absent.
    #[arg(long, env = "ISTHMUS_CA_SECRET", default_value = "isthmus-ca")]
    pub ca_secret: String,
    /// The ConfigMap (in POD_NAMESPACE) publishing the CA certificates to the agents (`ca.crt`).
    #[arg(long, env = "ISTHMUS_CA_BUNDLE", default_value = "isthmus-ca-bundle")]
    pub ca_bundle: String,
    /// Lifetime of a CA, in days.
    #[arg(long, env = "ISTHMUS_CA_VALIDITY_DAYS", default_value_t = 3650)]
    pub ca_validity_days: u64,
    /// A new CA is made once the newest has less than this left, in days; the old one stays trusted until it
    /// expires.
    #[arg(long, env = "ISTHMUS_CA_RENEW_BEFORE_DAYS", default_value_t = 30)]
    pub ca_renew_before_days: u64,
    /// Lifetime of the operator's, the agents' and the scraper's certificates, in hours (each is renewed after
    /// two thirds of it).
    #[arg(long, env = "ISTHMUS_CERTIFICATE_VALIDITY_HOURS", default_value_t = 168)]
    pub certificate_validity_hours: u64,
    /// The DNS SAN of the operator's client certificate, which every agent requires.
    #[arg(
        long,
        env = "ISTHMUS_OPERATOR_IDENTITY",
        default_value = "isthmus-operator.isthmus-system.serviceaccount.isthmus"
    )]
    pub operator_identity: String,
    /// The Secret (in POD_NAMESPACE) the operator writes the metrics scraper's certificate into; empty: none.
    #[arg(long, env = "ISTHMUS_SCRAPER_SECRET", default_value = "")]
    pub scraper_secret: String,
    /// The DNS SAN of the metrics scraper's certificate.
    #[arg(long, env = "ISTHMUS_SCRAPER_IDENTITY", default_value = "")]
    pub scraper_identity: String,
    /// The agents' ServiceAccount (in the agents' namespace): the only requester whose certificate requests are
    /// signed.
    #[arg(long, env = "ISTHMUS_AGENT_SERVICE_ACCOUNT", default_value = "isthmus-agent")]
    pub agent_service_account: String,
    /// A DNS name every agent's serving certificate may carry besides its node's, so that a scraper of all
    /// agents can verify them under one name (the chart: the agents' metrics Service, `<service>.<ns>.svc`);
    /// must end in `.svc`. Empty: only the node's name is signed.
    #[arg(long, env = "ISTHMUS_AGENT_SHARED_DNS_NAME", default_value = "")]
    pub agent_shared_dns_name: String,
    /// Label selector of the agent pods.
    #[arg(long, env = "ISTHMUS_AGENT_SELECTOR", default_value = "app.kubernetes.io/name=isthmus-agent")]
    pub agent_selector: String,
    /// Namespace of the agent pods (all namespaces when empty).
    #[arg(long, env = "ISTHMUS_AGENT_NAMESPACE", default_value = "")]
    pub agent_namespace: String,
    /// Seconds between full plan resends to every agent.
    #[arg(long, env = "ISTHMUS_RESYNC_SECONDS", default_value_t = 60)]
    pub resync_seconds: u64,
    /// Seconds a deleted NetworkLink waits for its nodes to confirm the cleanup before its finalizer goes anyway.
    #[arg(long, env = "ISTHMUS_CLEANUP_TIMEOUT_SECONDS", default_value_t = 120)]
    pub cleanup_timeout_seconds: u64,
    /// Elect a leader among replicas (a single replica may turn it off).
    #[arg(long, env = "ISTHMUS_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    #[arg(long, env = "ISTHMUS_LEASE_NAME", default_value = "isthmus-operator")]
    pub lease_name: String,
    /// Namespace of the Lease; defaults to POD_NAMESPACE.
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    pub lease_namespace: String,
    /// This replica's identity in the Lease; defaults to the pod name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The DNS name the API server calls the NetworkTopology admission webhook by (`<service>.<namespace>.svc`),
    /// the name of its serving certificate; empty: no webhook is served.
    #[arg(long, env = "ISTHMUS_WEBHOOK_DNS_NAME", default_value = "")]
    pub webhook_dns_name: String,
    /// Address of the webhook's HTTPS listener.
    #[arg(long, env = "ISTHMUS_WEBHOOK_ADDR", default_value = "0.0.0.0:9444")]
    pub webhook_addr: SocketAddr,
    /// The ValidatingWebhookConfiguration whose `caBundle` the leader keeps; empty: none.
    #[arg(long, env = "ISTHMUS_WEBHOOK_CONFIGURATION", default_value = "")]
    pub webhook_configuration: String,
    /// Port of the webhook's Service (the chart's: 443), which held pods connect to.
    #[arg(long, env = "ISTHMUS_WEBHOOK_SERVICE_PORT", default_value_t = 443)]
    pub webhook_service_port: u16,
    #[command(flatten)]
    pub hold: HoldFlags,
    /// Address of the plain HTTP listener: `/healthz`, `/readyz` and, with `--plain-metrics`, `/metrics`.
    #[arg(long, env = "ISTHMUS_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Whether the plain HTTP listener also serves `/metrics`, to anyone who can reach it; false: `/metrics`
    /// only by ServiceAccount token on the HTTPS listener (`--metrics-dns-name`).
    #[arg(long, env = "ISTHMUS_PLAIN_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub plain_metrics: bool,
    /// The DNS name Prometheus reaches the HTTPS metrics listener by (the chart: `<service>.<namespace>.svc` of
    /// the operator's metrics Service), the name of its serving certificate from the operator's CA; empty: no
    /// HTTPS listener. It serves `/metrics` to a bearer token allowed `get` on the non-resource URL `/metrics`
    /// (TokenReview and SubjectAccessReview).
    #[arg(long, env = "ISTHMUS_METRICS_DNS_NAME", default_value = "")]
    pub metrics_dns_name: String,
    /// Address of the HTTPS metrics listener.
    #[arg(long, env = "ISTHMUS_METRICS_SECURE_ADDR", default_value = "0.0.0.0:8443")]
    pub metrics_secure_addr: SocketAddr,
    #[arg(long, env = "ISTHMUS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Most destinations one NetworkLink may select (both directions together); a link beyond it is refused
    /// whole with `TooManyDestinations` (docs/networklink.md#plan-limits).
    #[arg(long, env = "ISTHMUS_MAX_DESTINATIONS_PER_LINK", default_value_t = DEFAULT_DESTINATIONS_PER_LINK)]
    pub max_destinations_per_link: u32,
    /// Most destinations one pod may have over all its links (at least the per-link limit, at most 4,095);
    /// its links are admitted in rank order and the rest refused for that pod.
    #[arg(long, env = "ISTHMUS_MAX_DESTINATIONS_PER_POD", default_value_t = DEFAULT_DESTINATIONS_PER_POD)]
    pub max_destinations_per_pod: u32,
    /// Most (source pod, destination) pairs one NetworkLink may ask for (both directions); a link beyond it is
    /// refused whole with `TooManyPairs`.
    #[arg(long, env = "ISTHMUS_MAX_PAIRS_PER_LINK", default_value_t = DEFAULT_PAIRS_PER_LINK)]
    pub max_pairs_per_link: u32,
    /// Most pairs of all NetworkLinks together (at least the per-link limit): links are admitted in rank order
    /// while their pairs fit, the rest refused whole with `TooManyPairs` until there is room.
    #[arg(long, env = "ISTHMUS_MAX_PAIRS_TOTAL", default_value_t = DEFAULT_PAIRS_TOTAL)]
    pub max_pairs_total: u32,
    /// Whether links are verified at all: false leaves every link without `status.measured` and `Conformant`
    /// and polls no agent (the chart's `verification.enabled`, which also switches the agents' probes off).
    #[arg(long, env = "ISTHMUS_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub verify: bool,
    /// How often the leader asks every agent for its latest probe windows (e.g. `10s`).
    #[arg(long, env = "ISTHMUS_MEASURE_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub measure_interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    match crate::unit_syntax::parse_duration(s) {
        Ok(d) if d >= Duration::from_secs(1) => Ok(d),
        Ok(_) => Err("must be at least 1s: every poll asks every node's agent".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
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

/// A flag that names a Service's DNS name, or nothing when empty.
pub fn service_name(flag: &str, value: &str) -> anyhow::Result<Option<ServiceDnsName>> {
    if value.is_empty() {
        return Ok(None);
    }
    Ok(Some(ServiceDnsName::new(value).with_context(|| flag.to_owned())?))
}

impl Args {
    pub fn pki_config(&self) -> anyhow::Result<PkiConfig> {
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

    pub fn signer_config(&self, agent_shared_name: Option<ServiceDnsName>) -> SignerConfig {
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

    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "isthmus-operator".into())
        })
    }

    pub fn controller_config(&self) -> anyhow::Result<Config> {
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
