//! The binary edge: arguments, the Kubernetes client, printing. `kubectl` finds it on PATH as
//! `kubectl-isthmus` and runs it for `kubectl isthmus …`.

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use isthmus_operator::index::ObjectKey;

use kubectl_isthmus::cluster::{self, AgentLocation};
use kubectl_isthmus::explain::{self, Answer};
use kubectl_isthmus::target::{self, DestArg};
use kubectl_isthmus::{links, matrix};

#[derive(Parser)]
#[command(
    name = "kubectl isthmus",
    version,
    about = "Inspect isthmus NetworkLinks and NetworkTopologies: configured vs measured, and which link decides a pair and why"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One row per NetworkLink: configured latency, loss and bandwidth (forward/reverse), the expected round trip,
    /// the measured RTT p50/p90 and loss per direction, the Conformant condition and pairs applied/total.
    Links {
        /// The namespace to list (default: the kubeconfig context's).
        #[arg(short, long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// List the links of every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// A NetworkTopology's round trips between its regions: configured and measured, one row per `from` region.
    Matrix {
        /// The NetworkTopology.
        topology: String,
        /// Its namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
    },
    /// Which NetworkLink decides the pair POD → DEST, the priority contest it won, the node, the datapath,
    /// the kernel objects installed for it (asked of the node's agent through `pods/exec`) and its last
    /// measurements.
    Explain {
        /// The source pod.
        pod: String,
        /// The destination: a pod of the same namespace, `namespace/pod`, or an address (pod IP, ClusterIP, any).
        dest: String,
        /// The source pod's namespace (default: the kubeconfig context's).
        #[arg(short, long)]
        namespace: Option<String>,
        /// Label selector of the agent pods (the operator's --agent-selector).
        #[arg(long, default_value = "app.kubernetes.io/name=isthmus-agent")]
        agent_selector: String,
        /// Namespace of the agent pods (default: every namespace).
        #[arg(long)]
        agent_namespace: Option<String>,
        /// Do not ask the agent (no exec): the contest and the status only.
        #[arg(long)]
        no_agent: bool,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let client = kube::Client::try_default().await.context("no usable kubeconfig or in-cluster configuration")?;
    match cli.command {
        Command::Links { namespace, all_namespaces } => {
            let ns = (!all_namespaces).then(|| namespace.unwrap_or_else(|| client.default_namespace().to_owned()));
            let stored = cluster::list_links(&client, ns.as_deref()).await?;
            let rows = stored.iter().map(links::LinkRow::from_stored).collect();
            print!("{}", links::render(rows, all_namespaces));
        }
        Command::Matrix { topology, namespace } => {
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let api: kube::Api<isthmus_operator::topology::NetworkTopology> = kube::Api::namespaced(client, &ns);
            let t = api.get(&topology).await.with_context(|| format!("reading NetworkTopology {ns}/{topology}"))?;
            print!("{}", matrix::render(&t));
        }
        Command::Explain { pod, dest, namespace, agent_selector, agent_namespace, no_agent } => {
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let (mut planner, links) = cluster::plan_for(&client, &ns).await?;
            let dest = DestArg::parse(&dest, &ns);
            if let DestArg::Pod(key) = &dest {
                cluster::add_pod(&client, &mut planner, key).await?;
            }
            let source = ObjectKey::new(&ns, &pod);
            let Some(info) = planner.index().pods.get(&source) else { bail!("unknown pod {source}") };
            let destination = target::destination(planner.index(), &dest, &info.ips)?;
            let explanation = planner.explain_pair(&source, destination.ip)?;
            let agent = if no_agent {
                Err("--no-agent".into())
            } else {
                let at = AgentLocation { selector: &agent_selector, namespace: agent_namespace.as_deref() };
                cluster::ask_agent(&client, &at, &explanation.node, &info.uid, &info.ips, destination.ip).await
            };
            print!(
                "{}",
                explain::render(&Answer {
                    source: &source,
                    source_ips: &info.ips,
                    destination: &destination,
                    explanation: &explanation,
                    links: &links,
                    now: k8s_openapi::jiff::Timestamp::now(),
                    agent,
                })
            );
        }
    }
    Ok(())
}
