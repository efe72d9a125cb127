//! The agent's command line: every flag with its environment variable and default, the subcommands, and the
//! configurations the flags make, with their checks. `main.rs` wires what they configure and runs the checks
//! before it starts anything, all but `probe_config`'s, which opens a namespace and so waits until probing starts.
//! The command line is the binary's, not `isthmus_agent`'s: only the binary reads one, and the library takes its
//! configurations by value. The `explain` subcommand's own flags are the request the library answers,
//! [`isthmus_agent::explain::ExplainRequest`], flattened in.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use isthmus_agent::auth::{Callers, DEFAULT_OPERATOR_IDENTITY, Identity};
use isthmus_agent::measure::ProbeConfig;
use isthmus_agent::node::DatapathChoice;
use isthmus_datapaths::datapath::QueueBudget;
use isthmus_datapaths::datapath::queue::{DEFAULT_BYTES_PER_DESTINATION, DEFAULT_BYTES_PER_POD};
use isthmus_datapaths::netns::{Netns, Sources};
use isthmus_datapaths::userspace::budget::NodeBudgetError;

#[derive(Debug, Parser)]
#[command(name = "isthmus-agent", version, about = "isthmus node agent", args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub mode: Option<Mode>,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

// Parsed once at start-up: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Mode {
    /// Serve the operator's API (the default).
    Serve {
        #[command(flatten)]
        serve: ServeArgs,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Remove every isthmus tree from every pod network namespace on the node, then exit.
    Cleanup {
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Print, as JSON, what is installed in a pod's network namespace for one destination address.
    Explain {
        #[command(flatten)]
        request: isthmus_agent::explain::ExplainRequest,
        #[command(flatten)]
        common: CommonArgs,
    },
}

/// `--datapath`: which datapath the agent gives its pods.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DatapathArg {
    /// The tc tree where the kernel has sch_netem, the agent's own emulator where it has not.
    Auto,
    /// Always the tc tree (links that need netem fail on kernels without it).
    Tc,
    /// Always the agent's own emulator.
    Userspace,
}

impl From<DatapathArg> for DatapathChoice {
    fn from(arg: DatapathArg) -> Self {
        match arg {
            DatapathArg::Auto => DatapathChoice::Auto,
            DatapathArg::Tc => DatapathChoice::Tc,
            DatapathArg::Userspace => DatapathChoice::Userspace,
        }
    }
}

/// `--tls-source`: where the serving certificate comes from.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TlsSourceArg {
    /// `ca.crt`, `tls.crt`, `tls.key` in --tls-dir.
    Files,
    /// A CertificateSigningRequest for this node (signed by the operator), trusting the CAs of the operator's
    /// bundle ConfigMap (--ca-bundle in --namespace).
    Csr,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Log format.
    #[arg(long, env = "ISTHMUS_LOG_FORMAT", value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// The host's /proc (the agent runs with hostPID).
    #[arg(long, env = "ISTHMUS_PROC", default_value = "/proc")]
    pub proc: PathBuf,
    /// Directories of pinned network namespaces, comma-separated (empty: none).
    #[arg(long, env = "ISTHMUS_NETNS_DIRS", default_value = "/run/netns", value_delimiter = ',')]
    pub netns_dirs: Vec<PathBuf>,
    /// Consider only processes whose /proc/<pid>/cgroup contains this text (for several simulated nodes
    /// sharing one kernel).
    #[arg(long, env = "ISTHMUS_CGROUP_FILTER")]
    pub cgroup_filter: Option<String>,
    /// Pods (namespaces) worked on at once.
    #[arg(long, env = "ISTHMUS_PARALLELISM", default_value_t = 16)]
    pub parallelism: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The node this agent runs on (from the downward API); plans for other nodes are refused.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Address of the operator API (mutual TLS).
    #[arg(long, env = "ISTHMUS_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// Address of /healthz and /readyz (plain HTTP).
    #[arg(long, env = "ISTHMUS_HEALTH_LISTEN", default_value = "0.0.0.0:9464")]
    pub health_listen: SocketAddr,
    /// Address of /metrics for a ServiceAccount token (HTTPS with the serving certificate, no client
    /// certificate; the token's user must be allowed `get` on the non-resource URL /metrics, checked with a
    /// TokenReview and a SubjectAccessReview). Unset: not served (/metrics stays on the API port, mutual TLS).
    #[arg(long, env = "ISTHMUS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// With `--tls-source csr`: a DNS name the serving certificate carries besides the node's, the same on every
    /// node (the chart: the agents' metrics Service, `<service>.<namespace>.svc`), so that a scraper can verify
    /// every agent under one name. The operator must be configured with the same name (its
    /// `--agent-shared-dns-name`), or it denies the request. Empty: the node's name only.
    #[arg(long, env = "ISTHMUS_SHARED_DNS_NAME", default_value = "")]
    pub shared_dns_name: String,
    /// Where the serving certificate comes from.
    #[arg(long, env = "ISTHMUS_TLS_SOURCE", value_enum, default_value = "files")]
    pub tls_source: TlsSourceArg,
    /// With `--tls-source files`: directory with ca.crt (the operator's CA), tls.crt and tls.key (the agent's
    /// serving certificate, for its node's DNS name).
    #[arg(long, env = "ISTHMUS_TLS_DIR", default_value = "/etc/isthmus/tls")]
    pub tls_dir: PathBuf,
    /// With `--tls-source csr`: the ConfigMap whose `ca.crt` the operator publishes (the CAs trusted for callers),
    /// read and watched through the API.
    #[arg(long, env = "ISTHMUS_CA_BUNDLE", default_value = "isthmus-ca-bundle")]
    pub ca_bundle: String,
    /// With `--tls-source csr`: the namespace of --ca-bundle (the agent's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    pub namespace: String,
    /// The DNS SAN the operator's client certificate carries.
    #[arg(long, env = "ISTHMUS_OPERATOR_IDENTITY", default_value = DEFAULT_OPERATOR_IDENTITY)]
    pub operator_identity: String,
    /// The DNS SAN of a client certificate that may read /metrics on the API port (and nothing else); empty:
    /// only the operator may.
    #[arg(long, env = "ISTHMUS_SCRAPER_IDENTITY", default_value = "")]
    pub scraper_identity: String,
    /// How often the TLS files are checked for changes, in seconds.
    #[arg(long, env = "ISTHMUS_TLS_RELOAD_SECONDS", default_value_t = 5)]
    pub tls_reload_seconds: u64,
    /// How often every pod's tree is read back from the kernel and repaired where it drifted (plans in between
    /// only send what changed, trusting what the agent installed), in seconds; 0 turns the resync off.
    #[arg(long, env = "ISTHMUS_RESYNC_SECONDS", default_value_t = 60)]
    pub resync_seconds: u64,
    /// How long in-flight requests may take after SIGTERM, in seconds.
    #[arg(long, env = "ISTHMUS_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// Bytes one destination's queue may hold (netem's packet limit is this over 1,514-byte frames); a
    /// `queueLimit` beyond it is cut and reported.
    #[arg(long, env = "ISTHMUS_QUEUE_BYTES_PER_DESTINATION", default_value_t = DEFAULT_BYTES_PER_DESTINATION)]
    pub queue_bytes_per_destination: u64,
    /// Bytes the queues of one pod's interface may hold together, split evenly over its destinations (at least
    /// 4,095 frames, one per destination an interface may have).
    #[arg(long, env = "ISTHMUS_QUEUE_BYTES_PER_POD", default_value_t = DEFAULT_BYTES_PER_POD)]
    pub queue_bytes_per_pod: u64,
    /// Bytes the userspace datapath's queues may hold on this node, every pod's and every draining pipeline's
    /// together; past it packets are dropped and counted (isthmus_agent_userspace_lost{reason="queue_budget"}).
    /// Must leave 32 MiB of --memory-limit; unset, half of --memory-limit, or 128 MiB without one.
    #[arg(long, env = "ISTHMUS_USERSPACE_QUEUE_BYTES")]
    pub userspace_queue_bytes: Option<u64>,
    /// The agent container's memory limit in bytes (the chart passes resources.limits.memory through the
    /// Downward API), which the userspace queues' budget must leave room in.
    #[arg(long, env = "ISTHMUS_MEMORY_LIMIT")]
    pub memory_limit: Option<u64>,
    /// The datapath every pod of this node gets (docs/datapaths.md).
    #[arg(long, env = "ISTHMUS_DATAPATH", value_enum, default_value = "auto")]
    pub datapath: DatapathArg,
    /// Probe the applied links and report what they measure (`GET /v1/measured`, the isthmus_link_rtt_seconds
    /// and isthmus_link_probes_* metrics); `--verify=false` sends no probe at all.
    #[arg(long, env = "ISTHMUS_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    pub verify: bool,
    /// Probes per second this node sends at most, every link and both paths together (on average it sends
    /// three quarters of this, see docs/datapaths.md#probing).
    #[arg(long, env = "ISTHMUS_PROBE_RATE", default_value_t = 10.0, value_parser = positive_rate)]
    pub probe_rate: f64,
    /// (source pod, destination) pairs probed per link direction on this node.
    #[arg(long, env = "ISTHMUS_PROBE_PAIRS_PER_LINK", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub probe_pairs_per_link: u32,
    /// The measurement window (e.g. `30s`, `2m`): a probe counts in the window it was sent in, and the last
    /// complete window is reported.
    #[arg(long, env = "ISTHMUS_PROBE_WINDOW", default_value = "30s", value_parser = window)]
    pub probe_window: Duration,
    /// The network namespace baseline probes are sent from (a path such as /run/netns/node); empty: the
    /// agent's own, the host's. For several simulated nodes sharing one kernel.
    #[arg(long, env = "ISTHMUS_PROBE_BASELINE_NETNS")]
    pub probe_baseline_netns: Option<PathBuf>,
}

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 && rate <= 10_000.0 => Ok(rate),
        Ok(rate) => Err(format!("{rate} is not a rate between 0 (excluded) and 10000 probes per second")),
        Err(e) => Err(e.to_string()),
    }
}

/// `30s`, `2m`, `500ms`, `1h`: at least one second, so that a window holds more than a few probes.
fn window(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("{text:?}: expected a number and a unit, e.g. 30s"))?;
    let window = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{text:?}: the unit is one of ms, s, m, h")),
    };
    if window < Duration::from_secs(1) {
        return Err(format!("{text:?}: a window is at least 1s"));
    }
    Ok(window)
}

impl CommonArgs {
    /// Where pods' namespaces are found. An empty directory or filter counts as unset, so that an environment
    /// variable set to "" (as a chart leaves a blank value) means none.
    pub fn sources(&self) -> Sources {
        Sources {
            proc_root: self.proc.clone(),
            netns_dirs: self.netns_dirs.iter().filter(|d| !d.as_os_str().is_empty()).cloned().collect(),
            cgroup_filter: self.cgroup_filter.clone().filter(|f| !f.is_empty()),
        }
    }
}

impl ServeArgs {
    pub fn node_name(&self) -> anyhow::Result<String> {
        self.node_name.clone().context("--node-name (or NODE_NAME) is required")
    }

    pub fn callers(&self) -> anyhow::Result<Callers> {
        Ok(Callers {
            operator: Identity::new(&self.operator_identity).context("--operator-identity")?,
            scraper: match self.scraper_identity.as_str() {
                "" => None,
                name => Some(Identity::new(name).context("--scraper-identity")?),
            },
        })
    }

    pub fn queue_budget(&self) -> anyhow::Result<QueueBudget> {
        QueueBudget::new(self.queue_bytes_per_destination, self.queue_bytes_per_pod)
            .context("--queue-bytes-per-destination / --queue-bytes-per-pod")
    }

    pub fn userspace_queue_bytes(&self) -> Result<u64, NodeBudgetError> {
        isthmus_datapaths::userspace::budget::resolve(self.userspace_queue_bytes, self.memory_limit)
    }

    /// The extra name the issued certificate asks for; empty is none.
    pub fn shared_dns_name(&self) -> Option<String> {
        Some(self.shared_dns_name.clone()).filter(|n| !n.is_empty())
    }

    /// At least a second: 0 would be a zero period, which tokio's interval refuses by panicking.
    pub fn tls_reload_interval(&self) -> Duration {
        Duration::from_secs(self.tls_reload_seconds.max(1))
    }

    /// `None` for 0, which turns the resync off.
    pub fn resync_interval(&self) -> Option<Duration> {
        (self.resync_seconds > 0).then(|| Duration::from_secs(self.resync_seconds))
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_seconds)
    }

    /// Opens the baseline namespace, so it is only called when probing is on (`--verify`).
    pub fn probe_config(&self) -> anyhow::Result<ProbeConfig> {
        let baseline_netns = match self.probe_baseline_netns.as_ref().filter(|p| !p.as_os_str().is_empty()) {
            None => None,
            Some(path) => Some(Arc::new(Netns::open(path).context("opening --probe-baseline-netns")?)),
        };
        Ok(ProbeConfig {
            rate: self.probe_rate,
            pairs_per_link: self.probe_pairs_per_link as usize,
            window: self.probe_window,
            baseline_netns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_flags_parse_with_their_defaults_and_refuse_nonsense() {
        let cli = Cli::parse_from(["isthmus-agent", "--node-name", "n"]);
        assert!(cli.serve.verify);
        assert_eq!((cli.serve.probe_rate, cli.serve.probe_pairs_per_link), (10.0, 4));
        assert_eq!(cli.serve.probe_window, Duration::from_secs(30));
        assert_eq!(cli.serve.probe_baseline_netns, None);
        let cli = Cli::parse_from([
            "isthmus-agent",
            "--verify=false",
            "--probe-rate",
            "2.5",
            "--probe-pairs-per-link",
            "1",
            "--probe-window",
            "2m",
        ]);
        assert!(!cli.serve.verify);
        assert_eq!((cli.serve.probe_rate, cli.serve.probe_pairs_per_link), (2.5, 1));
        assert_eq!(cli.serve.probe_window, Duration::from_secs(120));
        assert_eq!(window("1500ms"), Ok(Duration::from_millis(1500)));
        for bad in ["", "30", "30d", "500ms", "s"] {
            assert!(window(bad).is_err(), "{bad:?}");
        }
        for bad in ["0", "-1", "NaN", "inf", "20000"] {
            assert!(positive_rate(bad).is_err(), "{bad:?}");
        }
        assert!(Cli::try_parse_from(["isthmus-agent", "--probe-pairs-per-link", "0"]).is_err());
    }
}
