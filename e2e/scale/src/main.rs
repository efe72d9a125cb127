//! `isthmus-scale`: the control plane at scale (issue 32), against a real API server and the real operator
//! process; `make bench-scale` (e2e/scale/run) starts both and runs this.
//!
//! Real: the API server (the suite's control plane), the operator (its release binary, its own process, its
//! CA, signer and agent client), the protocol between them and the agents (mutual TLS, the plan and reply
//! types, the agent's own parser and listener). Simulated: the kubelets (pods and nodes are API objects whose
//! status this program writes: `world`) and the agents' kernels (`agents`: each agent answers every valid pod
//! applied, installing nothing).
//!
//! The run: the nodes and their agents (each certificate requested through the operator); once every agent has
//! been sent its first plan, the pods; then every link at once, as one `kubectl apply` of them would send them,
//! timed from each link's sending to the status that counts each pair applied and to the link's Ready with
//! every pair. Prints a table (the operator's CPU and memory with it) and fails when a link is not Ready in
//! time.

mod agents;
mod scrape;
mod shape;
mod timing;
mod usage;
mod world;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use isthmus_agent::auth::{Callers, Identity};
use isthmus_agent::ca_bundle::{TrustedBundle, bundle_of};
use isthmus_operator::api::NetworkLink;
use isthmus_operator::controller::status::READY;
use isthmus_test_kit::stats::Sorted;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::agents::Agent;
use crate::shape::Shape;
use crate::timing::{PairClock, Seen};
use crate::usage::Usage;
use crate::world::Places;

#[derive(Debug, Parser)]
#[command(about = "apply → every pair Ready at scale, against a real API server and the real operator")]
struct Args {
    #[arg(long, default_value_t = 50)]
    nodes: u32,
    #[arg(long, default_value_t = 1000)]
    pods: u32,
    /// Pods per group; each link joins two groups (group × group pairs).
    #[arg(long, default_value_t = 10)]
    group: u32,
    /// The operator's process, whose CPU time and memory are reported.
    #[arg(long)]
    operator_pid: u32,
    /// The operator's plain metrics listener (host:port), whose counters of status writes and recomputations
    /// are reported.
    #[arg(long)]
    operator_metrics: String,
    /// The port the operator dials on each agent pod's address (its `--agent-port`).
    #[arg(long)]
    agent_port: u16,
    #[arg(long, default_value = "isthmus-scale")]
    namespace: String,
    /// The operator's namespace: its CA bundle, and the agents' pods and ServiceAccount.
    #[arg(long, default_value = "isthmus-system")]
    agent_namespace: String,
    #[arg(long, default_value = "isthmus-agent")]
    agent_service_account: String,
    #[arg(long, default_value = "isthmus-ca-bundle")]
    ca_bundle: String,
    #[arg(long, default_value = "isthmus-operator.isthmus-system.serviceaccount.isthmus")]
    operator_identity: String,
    /// How long every link may take to be Ready.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

/// Certificates requested at once (each waits for the operator to sign it).
const CONCURRENT_AGENTS: usize = 8;
const POLL: Duration = Duration::from_millis(100);

async fn until<T>(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

fn seen(link: &NetworkLink) -> Option<Seen> {
    let status = link.status.as_ref()?;
    let ready = status.conditions.iter().any(|c| c.type_ == READY && c.status == "True");
    Some(Seen { pairs: status.pairs, pairs_applied: status.pairs_applied, ready })
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn quantiles(times: &[Duration]) -> String {
    match Sorted::of(times) {
        Some(s) => format!("{} / {} / {}", ms(s.median()), ms(s.quantile(0.99)), ms(s.max())),
        None => "none".into(),
    }
}

struct Sent {
    plans: u64,
    bytes: u64,
}

fn sent(agents: &[Arc<Agent>]) -> Sent {
    Sent {
        plans: agents.iter().map(|a| a.plans.load(Ordering::Relaxed)).sum(),
        bytes: agents.iter().map(|a| a.plan_bytes.load(Ordering::Relaxed)).sum(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let shape = Shape::new(args.nodes, args.pods, args.group)?;
    let timeout = Duration::from_secs(args.timeout_seconds);
    let places = Places {
        namespace: args.namespace.clone(),
        agent_namespace: args.agent_namespace.clone(),
        agent_service_account: args.agent_service_account.clone(),
    };
    let client = Client::try_default().await.context("the API server (KUBECONFIG)")?;
    let callers =
        Callers { operator: Identity::new(&args.operator_identity).context("--operator-identity")?, scraper: None };

    let started = Instant::now();
    let agent_pods = world::nodes_and_agents(&client, &places, &shape).await.context("the nodes and agent pods")?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.agent_namespace);
    let bundle = until("the operator's CA bundle", timeout, async || {
        bundle_of(&config_maps.get_opt(&args.ca_bundle).await.ok()??).ok()
    })
    .await?;
    let trusted = Arc::new(TrustedBundle::default());
    trusted.set(bundle);
    let agents: Vec<Arc<Agent>> = futures::stream::iter(&agent_pods)
        .map(|pod| agents::start(&client, &places, pod, trusted.clone(), callers.clone(), args.agent_port))
        .buffer_unordered(CONCURRENT_AGENTS)
        .try_collect()
        .await?;
    until("every agent's first plan", timeout, async || {
        agents.iter().all(|a| a.plans.load(Ordering::Relaxed) > 0).then_some(())
    })
    .await?;
    let agents_after = started.elapsed();
    world::pods(&client, &places, &shape).await.context("the pods")?;
    let pods_after = started.elapsed() - agents_after;

    let clock = Arc::new(Mutex::new(PairClock::default()));
    let links_api: Api<NetworkLink> = Api::namespaced(client.clone(), &args.namespace);
    let watching = {
        let clock = clock.clone();
        let mut events = watcher(links_api, watcher::Config::default()).boxed();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let (watcher::Event::Apply(link) | watcher::Event::InitApply(link)) = (match event {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "watching the links");
                        continue;
                    }
                }) else {
                    continue;
                };
                if let Some(seen) = seen(&link) {
                    clock.lock().unwrap_or_else(|p| p.into_inner()).observe(&link.name_any(), Instant::now(), seen);
                }
            }
        })
    };
    let before = Usage::of(args.operator_pid)?;
    let counted_before = scrape::counters(&args.operator_metrics).await?;
    let sent_before = sent(&agents);
    let applying = Instant::now();
    futures::stream::iter(0..shape.links())
        .map(|k| {
            let (client, clock) = (client.clone(), clock.clone());
            let link = world::link(&shape, &args.namespace, k);
            async move {
                clock.lock().unwrap_or_else(|p| p.into_inner()).sent(
                    &Shape::link_name(k),
                    Instant::now(),
                    shape.pairs_per_link(),
                );
                world::create_link(&client, &link).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .context("applying the links")?;
    let all_ready = until("every link Ready with all its pairs", timeout, async || {
        clock.lock().unwrap_or_else(|p| p.into_inner()).all_ready_at()
    })
    .await;
    // The watch's own instant, which the poll sees up to 100 ms later.
    let took = all_ready.as_ref().map_or_else(|_| applying.elapsed(), |at| at.saturating_duration_since(applying));
    // The statuses and plans that follow the last Ready (gates, measurements) count as the apply's work too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = Usage::of(args.operator_pid)?;
    let counted = scrape::counters(&args.operator_metrics).await?.since(counted_before);
    let sent_after = sent(&agents);
    watching.abort();

    let clock = clock.lock().unwrap_or_else(|p| p.into_inner());
    let cpu = after.cpu.saturating_sub(before.cpu);
    println!(
        "\n### apply → every pair Ready: {} pods on {} nodes, {} links, {} pairs\n",
        shape.pods(),
        shape.nodes(),
        shape.links(),
        shape.pairs()
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| apply → a pair counted applied in its link's status, p50 / p99 / max | {} |",
        quantiles(clock.pair_times())
    );
    println!("| apply → a link Ready with every pair, p50 / p99 / max | {} |", quantiles(&clock.link_times()));
    println!("| apply → the last link Ready | {} |", ms(took));
    println!(
        "| operator CPU from apply to 2 s after the last Ready | {:.2} s ({:.2} cores) |",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() / (took + Duration::from_secs(2)).as_secs_f64()
    );
    println!(
        "| operator resident after / peak since its start | {:.1} / {:.1} MiB |",
        after.rss_kib as f64 / 1024.0,
        after.peak_kib as f64 / 1024.0
    );
    println!(
        "| in that time: plans the agents received (their JSON) / link status writes / plan recomputations | {} ({:.1} MiB) / {} / {} |",
        sent_after.plans - sent_before.plans,
        (sent_after.bytes - sent_before.bytes) as f64 / 1048576.0,
        counted.status_writes,
        counted.recomputes
    );
    println!(
        "| before it: nodes, agents certified and first plans / pods running | {} / {} |",
        ms(agents_after),
        ms(pods_after)
    );
    if let Err(e) = all_ready {
        let missing = clock.missing();
        bail!(
            "{e}: {} link(s) not Ready with every pair, e.g. {:?} (name, pairs applied, expected)",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
    }
    Ok(())
}
