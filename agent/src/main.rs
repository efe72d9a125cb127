//! `isthmus-agent`: the node agent (DaemonSet).
//!
//! - `isthmus-agent [serve]`: adopt installed trees, then serve the operator's API over mutual TLS and health
//!   and metrics over plain HTTP. SIGTERM/SIGINT stop it gracefully and leave every impairment in place.
//! - `isthmus-agent cleanup`: remove every isthmus tree from every interface of every network namespace on the
//!   node, then exit (the Helm uninstall hook).
//! - `isthmus-agent explain`: print, as JSON, what is installed in one pod's namespace for one destination
//!   (run by `kubectl isthmus explain` through the exec API; `isthmus_agent::explain`).
//!
//! The flags are [`flags`]; this file wires what they configure.

mod flags;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use isthmus_agent::auth::{Identity, IssuedCertificate, ReloadingTls, TlsSource};
use isthmus_agent::ca_bundle::TrustedBundle;
use isthmus_agent::measure;
use isthmus_agent::metrics::Metrics;
use isthmus_agent::node::{self, Node, NodeConfig};
use isthmus_agent::server::{self, Health, Limits, MetricsTlsListener, PlainListener, TlsListener};
use isthmus_agent_api::metrics_auth::{DecisionCache, KubeReviewer, MetricsAuth};
use isthmus_agent_api::tls::TlsFiles;

use crate::flags::{Cli, CommonArgs, LogFormat, Mode, ServeArgs, TlsSourceArg};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
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
            let report = runtime.block_on(isthmus_agent::explain::explain(common.sources(), request))?;
            println!("{}", serde_json::to_string(&report).context("encoding the report")?);
            Ok(())
        }
    }
}

async fn cleanup(common: CommonArgs) -> anyhow::Result<()> {
    init_logging(common.log_format);
    let (removed, errors) = node::cleanup(&common.sources(), common.parallelism).await.context("listing namespaces")?;
    tracing::info!(removed, errors = errors.len(), "cleanup finished");
    if !errors.is_empty() {
        anyhow::bail!("{} trees could not be removed: {}", errors.len(), errors.join("; "));
    }
    Ok(())
}

async fn serve(args: ServeArgs, common: CommonArgs) -> anyhow::Result<()> {
    init_logging(common.log_format);
    let node_name = args.node_name()?;
    let callers = args.callers()?;
    let queue_budget = args.queue_budget()?;
    let userspace_queue_bytes = args.userspace_queue_bytes()?;
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
            drop(isthmus_agent::csr::spawn(
                client.clone(),
                node_name.clone(),
                args.shared_dns_name(),
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
            sources: common.sources(),
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
    let reload_interval = args.tls_reload_interval();
    let tls = Arc::new(match files_tls {
        Some(tls) => tls,
        None => ReloadingTls::load_when_complete(tls_source, reload_interval).await,
    });
    let _reload = tls.clone().watch(reload_interval);
    let _prober = if args.verify {
        let config = args.probe_config()?;
        tracing::info!(rate = config.rate, pairs_per_link = config.pairs_per_link, window = ?config.window, "probing the applied links");
        Some(measure::spawn(node.clone(), config, metrics.clone()))
    } else {
        None
    };
    let _resync = args.resync_interval().map(|interval| node.spawn_resync(interval));
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
    let grace = args.shutdown_grace();
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
