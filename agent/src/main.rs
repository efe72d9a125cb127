//! `isthmus-agent`: the node agent (DaemonSet).
//!
//! - `isthmus-agent [serve]`: adopt installed trees, then serve the operator's API over mutual TLS and health
//!   and metrics over plain HTTP. SIGTERM/SIGINT stop it gracefully and leave every impairment in place.
//! - `isthmus-agent cleanup`: remove every isthmus tree from every interface of every network namespace on the
//!   node, then exit (the Helm uninstall hook).
//! - `isthmus-agent explain`: print, as JSON, what is installed in one pod's namespace for one destination
//!   (run by `kubectl isthmus explain` through the exec API; `isthmus_agent::explain`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use isthmus_agent::auth::{Callers, DEFAULT_OPERATOR_IDENTITY, Identity, IssuedCertificate, ReloadingTls, TlsSource};
use isthmus_agent::ca_bundle::TrustedBundle;
use isthmus_agent::measure::{self, ProbeConfig};
use isthmus_agent::metrics::Metrics;
use isthmus_agent::node::{self, DatapathChoice, Node, NodeConfig};
use isthmus_agent::server::{self, Health, Limits, MetricsTlsListener, PlainListener, TlsListener};
use isthmus_agent_api::metrics_auth::{DecisionCache, KubeReviewer, MetricsAuth};
use isthmus_agent_api::tls::TlsFiles;
use isthmus_datapaths::datapath::QueueBudget;
use isthmus_datapaths::datapath::queue::{DEFAULT_BYTES_PER_DESTINATION, DEFAULT_BYTES_PER_POD};
use isthmus_datapaths::netns::{Netns, Sources};

#[derive(Debug, Parser)]
#[command(name = "isthmus-agent", version, about = "isthmus node agent", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    common: CommonArgs,
}

// Parsed once at start-up: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Mode {
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
enum DatapathArg {
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
enum TlsSourceArg {
    /// `ca.crt`, `tls.crt`, `tls.key` in --tls-dir.
    Files,
    /// A CertificateSigningRequest for this node (signed by the operator), trusting the CAs of the operator's
    /// bundle ConfigMap (--ca-bundle in --namespace).
    Csr,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, Args)]
struct CommonArgs {
    /// Log format.
    #[arg(long, env = "ISTHMUS_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
    /// The host's /proc (the agent runs with hostPID).
    #[arg(long, env = "ISTHMUS_PROC", default_value = "/proc")]
    proc: PathBuf,
    /// Directories of pinned network namespaces, comma-separated (empty: none).
    #[arg(long, env = "ISTHMUS_NETNS_DIRS", default_value = "/run/netns", value_delimiter = ',')]
    netns_dirs: Vec<PathBuf>,
    /// Consider only processes whose /proc/<pid>/cgroup contains this text (for several simulated nodes
    /// sharing one kernel).
    #[arg(long, env = "ISTHMUS_CGROUP_FILTER")]
    cgroup_filter: Option<String>,
    /// Pods (namespaces) worked on at once.
    #[arg(long, env = "ISTHMUS_PARALLELISM", default_value_t = 16)]
    parallelism: usize,
}

#[derive(Debug, Clone, Args)]
struct ServeArgs {
    /// The node this agent runs on (from the downward API); plans for other nodes are refused.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Address of the operator API (mutual TLS).
    #[arg(long, env = "ISTHMUS_LISTEN", default_value = "0.0.0.0:9443")]
    listen: SocketAddr,
    /// Address of /healthz and /readyz (plain HTTP).
    #[arg(long, env = "ISTHMUS_HEALTH_LISTEN", default_value = "0.0.0.0:9464")]
    health_listen: SocketAddr,
    /// Address of /metrics for a ServiceAccount token (HTTPS with the serving certificate, no client
    /// certificate; the token's user must be allowed `get` on the non-resource URL /metrics, checked with a
    /// TokenReview and a SubjectAccessReview). Unset: not served (/metrics stays on the API port, mutual TLS).
    #[arg(long, env = "ISTHMUS_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// With `--tls-source csr`: a DNS name the serving certificate carries besides the node's, the same on every
    /// node (the chart: the agents' metrics Service, `<service>.<namespace>.svc`), so that a scraper can verify
    /// every agent under one name. The operator must be configured with the same name (its
    /// `--agent-shared-dns-name`), or it denies the request. Empty: the node's name only.
    #[arg(long, env = "ISTHMUS_SHARED_DNS_NAME", default_value = "")]
    shared_dns_name: String,
    /// Where the serving certificate comes from.
    #[arg(long, env = "ISTHMUS_TLS_SOURCE", value_enum, default_value = "files")]
    tls_source: TlsSourceArg,
    /// With `--tls-source files`: directory with ca.crt (the operator's CA), tls.crt and tls.key (the agent's
    /// serving certificate, for its node's DNS name).
    #[arg(long, env = "ISTHMUS_TLS_DIR", default_value = "/etc/isthmus/tls")]
    tls_dir: PathBuf,
    /// With `--tls-source csr`: the ConfigMap whose `ca.crt` the operator publishes (the CAs trusted for callers),
    /// read and watched through the API.
    #[arg(long, env = "ISTHMUS_CA_BUNDLE", default_value = "isthmus-ca-bundle")]
    ca_bundle: String,
    /// With `--tls-source csr`: the namespace of --ca-bundle (the agent's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "isthmus-system")]
    namespace: String,
    /// The DNS SAN the operator's client certificate carries.
    #[arg(long, env = "ISTHMUS_OPERATOR_IDENTITY", default_value = DEFAULT_OPERATOR_IDENTITY)]
    operator_identity: String,
    /// The DNS SAN of a client certificate that may read /metrics on the API port (and nothing else); empty:
    /// only the operator may.
    #[arg(long, env = "ISTHMUS_SCRAPER_IDENTITY", default_value = "")]
    scraper_identity: String,
    /// How often the TLS files are checked for changes, in seconds.
    #[arg(long, env = "ISTHMUS_TLS_RELOAD_SECONDS", default_value_t = 5)]
    tls_reload_seconds: u64,
    /// How often every pod's tree is read back from the kernel and repaired where it drifted (plans in between
    /// only send what changed, trusting what the agent installed), in seconds; 0 turns the resync off.
    #[arg(long, env = "ISTHMUS_RESYNC_SECONDS", default_value_t = 60)]
    resync_seconds: u64,
    /// How long in-flight requests may take after SIGTERM, in seconds.
    #[arg(long, env = "ISTHMUS_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    shutdown_grace_seconds: u64,
    /// Bytes one destination's queue may hold (netem's packet limit is this over 1,514-byte frames); a
    /// `queueLimit` beyond it is cut and reported.
    #[arg(long, env = "ISTHMUS_QUEUE_BYTES_PER_DESTINATION", default_value_t = DEFAULT_BYTES_PER_DESTINATION)]
    queue_bytes_per_destination: u64,
    /// Bytes the queues of one pod's interface may hold together, split evenly over its destinations (at least
    /// 4,095 frames, one per destination an interface may have).
    #[arg(long, env = "ISTHMUS_QUEUE_BYTES_PER_POD", default_value_t = DEFAULT_BYTES_PER_POD)]
    queue_bytes_per_pod: u64,
    /// Bytes the userspace datapath's queues may hold on this node, every pod's and every draining pipeline's
    /// together; past it packets are dropped and counted (isthmus_agent_userspace_lost{reason="queue_budget"}).
    /// Must leave 32 MiB of --memory-limit; unset, half of --memory-limit, or 128 MiB without one.
    #[arg(long, env = "ISTHMUS_USERSPACE_QUEUE_BYTES")]
    userspace_queue_bytes: Option<u64>,
    /// The agent container's memory limit in bytes (the chart passes resources.limits.memory through the
    /// Downward API), which the userspace queues' budget must leave room in.
    #[arg(long, env = "ISTHMUS_MEMORY_LIMIT")]
    memory_limit: Option<u64>,
    /// The datapath every pod of this node gets (docs/datapaths.md).
    #[arg(long, env = "ISTHMUS_DATAPATH", value_enum, default_value = "auto")]
    datapath: DatapathArg,
    /// Probe the applied links and report what they measure (`GET /v1/measured`, the isthmus_link_rtt_seconds
    /// and isthmus_link_probes_* metrics); `--verify=false` sends no probe at all.
    #[arg(long, env = "ISTHMUS_VERIFY", default_value_t = true, action = clap::ArgAction::Set)]
    verify: bool,
    /// Probes per second this node sends at most, every link and both paths together (on average it sends
    /// three quarters of this, see docs/datapaths.md#probing).
    #[arg(long, env = "ISTHMUS_PROBE_RATE", default_value_t = 10.0, value_parser = positive_rate)]
    probe_rate: f64,
    /// (source pod, destination) pairs probed per link direction on this node.
    #[arg(long, env = "ISTHMUS_PROBE_PAIRS_PER_LINK", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    probe_pairs_per_link: u32,
    /// The measurement window (e.g. `30s`, `2m`): a probe counts in the window it was sent in, and the last
    /// complete window is reported.
    #[arg(long, env = "ISTHMUS_PROBE_WINDOW", default_value = "30s", value_parser = window)]
    probe_window: Duration,
    /// The network namespace baseline probes are sent from (a path such as /run/netns/node); empty: the
    /// agent's own, the host's. For several simulated nodes sharing one kernel.
    #[arg(long, env = "ISTHMUS_PROBE_BASELINE_NETNS")]
    probe_baseline_netns: Option<PathBuf>,
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

fn sources(common: &CommonArgs) -> Sources {
    Sources {
        proc_root: common.proc.clone(),
        netns_dirs: common.netns_dirs.iter().filter(|d| !d.as_os_str().is_empty()).cloned().collect(),
        cgroup_filter: common.cgroup_filter.clone().filter(|f| !f.is_empty()),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    limit_malloc_arenas();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.mode {
        None => runtime.block_on(serve(cli.serve, cli.common)),
        Some(Mode::Serve { serve: args, common }) => runtime.block_on(serve(args, common)),
        Some(Mode::Cleanup { common }) => runtime.block_on(cleanup(common)),
        Some(Mode::Explain { request, common }) => {
            let report = runtime.block_on(isthmus_agent::explain::explain(sources(&common), request))?;
            println!("{}", serde_json::to_string(&report).context("encoding the report")?);
            Ok(())
        }
    }
}

async fn cleanup(common: CommonArgs) -> anyhow::Result<()> {
    init_logging(common.log_format);
    let (removed, errors) = node::cleanup(&sources(&common), common.parallelism).await.context("listing namespaces")?;
    tracing::info!(removed, errors = errors.len(), "cleanup finished");
    if !errors.is_empty() {
        anyhow::bail!("{} trees could not be removed: {}", errors.len(), errors.join("; "));
    }
    Ok(())
}

async fn serve(args: ServeArgs, common: CommonArgs) -> anyhow::Result<()> {
    init_logging(common.log_format);
    let node_name = args.node_name.clone().context("--node-name (or NODE_NAME) is required")?;
    let callers = Callers {
        operator: Identity::new(&args.operator_identity).context("--operator-identity")?,
        scraper: match args.scraper_identity.as_str() {
            "" => None,
            name => Some(Identity::new(name).context("--scraper-identity")?),
        },
    };
    let queue_budget = QueueBudget::new(args.queue_bytes_per_destination, args.queue_bytes_per_pod)
        .context("--queue-bytes-per-destination / --queue-bytes-per-pod")?;
    let userspace_queue_bytes =
        isthmus_datapaths::userspace::budget::resolve(args.userspace_queue_bytes, args.memory_limit)?;
    // One client for the API server, made when something needs it (the CSR, the metrics listener's reviews).
    let mut kube_client: Option<kube::Client> = None;
    // With files, a broken set stops the agent at once; an issued certificate is waited for below.
    let (tls_source, files_tls) = match args.tls_source {
        TlsSourceArg::Files => {
            let source = TlsSource::Files(TlsFiles::in_dir(&args.tls_dir));
            (source.clone(), Some(ReloadingTls::load(source).context("loading the TLS files")?))
        }
        TlsSourceArg::Csr => {
            let certificate = Arc::new(IssuedCertificate::default());
            let client = kube::Client::try_default().await.context("connecting to the Kubernetes API")?;
            kube_client = Some(client.clone());
            let ca = Arc::new(TrustedBundle::default());
            // Both run for the agent's lifetime (renewing the certificate, following the bundle); nothing waits
            // for them.
            let shared_name = Some(args.shared_dns_name.clone()).filter(|n| !n.is_empty());
            drop(isthmus_agent::csr::spawn(
                client.clone(),
                node_name.clone(),
                shared_name,
                certificate.clone(),
                ca.clone(),
            ));
            drop(isthmus_agent::ca_bundle::spawn(client, args.namespace.clone(), args.ca_bundle.clone(), ca.clone()));
            (TlsSource::Issued { ca, certificate }, None)
        }
    };
    let metrics = Arc::new(Metrics::new());

    // Health first, so that liveness holds while the kernel is probed and installed trees are adopted.
    let health = Health::default();
    let health_listener = tokio::net::TcpListener::bind(args.health_listen)
        .await
        .with_context(|| format!("binding --health-listen {}", args.health_listen))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let health_task = {
        let mut stop = stop_rx.clone();
        let router = server::health_router(health.clone());
        let metrics = metrics.clone();
        tokio::spawn(async move {
            axum::serve(PlainListener::new(health_listener, metrics.clone(), Limits::HEALTH), router)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        })
    };

    let node = Node::start(
        NodeConfig {
            name: node_name.clone(),
            sources: sources(&common),
            parallelism: common.parallelism,
            queue_budget,
            userspace_queue_bytes,
            datapath: args.datapath.into(),
            verify: args.verify,
        },
        metrics.clone(),
    )
    .await
    .context("starting the node (adopting installed trees)")?;
    let reload_interval = Duration::from_secs(args.tls_reload_seconds.max(1));
    let tls = Arc::new(match files_tls {
        Some(tls) => tls,
        None => ReloadingTls::load_when_complete(tls_source, reload_interval).await,
    });
    let _reload = tls.clone().watch(reload_interval);
    let _prober = if args.verify {
        let baseline_netns = match args.probe_baseline_netns.as_ref().filter(|p| !p.as_os_str().is_empty()) {
            None => None,
            Some(path) => Some(Arc::new(Netns::open(path).context("opening --probe-baseline-netns")?)),
        };
        let config = ProbeConfig {
            rate: args.probe_rate,
            pairs_per_link: args.probe_pairs_per_link as usize,
            window: args.probe_window,
            baseline_netns,
        };
        tracing::info!(rate = config.rate, pairs_per_link = config.pairs_per_link, window = ?config.window, "probing the applied links");
        Some(measure::spawn(node.clone(), config, metrics.clone()))
    } else {
        None
    };
    let _resync = (args.resync_seconds > 0).then(|| node.spawn_resync(Duration::from_secs(args.resync_seconds)));
    let _phases = node.spawn_phases();
    let _loop_watch = node.spawn_loop_watch(Duration::from_secs(1), {
        let health = health.clone();
        move |why| health.set_failed(why)
    });

    let tcp = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let metrics_server = match args.metrics_listen {
        None => None,
        Some(addr) => {
            let client = match kube_client {
                Some(client) => client,
                None => kube::Client::try_default().await.context("connecting to the Kubernetes API")?,
            };
            let auth = Arc::new(MetricsAuth::new(KubeReviewer::new(client), DecisionCache::default()));
            let tcp = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding --metrics-listen {addr}"))?;
            let listener = MetricsTlsListener::new(tcp, tls.clone(), metrics.clone(), Limits::METRICS)?;
            let mut stop = stop_rx.clone();
            Some(tokio::spawn(server::serve_metrics(listener, node.clone(), metrics.clone(), auth, async move {
                let _ = stop.wait_for(|s| *s).await;
            })))
        }
    };
    let operator = callers.operator.name();
    let scraper = callers.scraper.as_ref().map(Identity::name);
    let listener = TlsListener::new(tcp, tls, callers, metrics.clone(), Limits::API)?;
    health.set_ready();
    tracing::info!(
        node = %node_name,
        api = %args.listen,
        health = %args.health_listen,
        metrics = ?args.metrics_listen,
        %operator,
        ?scraper,
        queue_bytes_per_destination = queue_budget.per_destination(),
        queue_bytes_per_pod = queue_budget.per_pod(),
        userspace_queue_bytes,
        "serving"
    );

    let mut stop = stop_rx.clone();
    let api = tokio::spawn(server::serve_api(listener, node, metrics, async move {
        let _ = stop.wait_for(|s| *s).await;
    }));
    shutdown_signal().await;
    tracing::info!("shutting down; impairments stay installed");
    let _ = stop_tx.send(true);
    let grace = Duration::from_secs(args.shutdown_grace_seconds);
    if tokio::time::timeout(grace, async {
        let _ = api.await;
        let _ = health_task.await;
        if let Some(metrics_server) = metrics_server {
            let _ = metrics_server.await;
        }
    })
    .await
    .is_err()
    {
        tracing::warn!(?grace, "requests still running after the grace period; exiting anyway");
    }
    Ok(())
}

/// glibc gives every thread that allocates its own arena; the agent enters namespaces from many short-lived
/// threads, and the arenas' freed memory stays resident. Two arenas keep the footprint small.
///
/// glibc also raises its mmap threshold each time a large block is freed, so that after the first big plan or
/// dump, megabyte buffers come from the heap, where small long-lived objects (the pods' records) pin their
/// pages. A fixed threshold keeps every block of 64 KiB or more (plan and reply buffers, dumps, each netlink
/// connection's receive buffer) in its own mapping, returned to the system when freed (agent benchmark, one run:
/// peak 35 → 33 MiB).
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator tunables; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing the SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
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
