//! The prober's loop: follows the node's applied plan (sampling pairs and opening sockets when it changes),
//! sends at its pace, matches answers to probes, times them out, closes windows and publishes the result.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use isthmus_agent_api::measure::ProbeKind;
use isthmus_agent_api::{LinkRef, unix_ms_now};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ProbeConfig;
use super::pacing::{self, Pacer, Slot};
use super::sample::{Pair, SourcePod, sample};
use super::socket::{self, EchoReply, IcmpSocket};
use super::window::{Probed, Windows};
use crate::metrics::Metrics;
use crate::node::Node;
use crate::node::ProbeView;
use crate::probe_path::ProbePath;
use isthmus_datapaths::netns::{Netns, NetnsId};

/// The port TCP SYN probes go to. Whatever it is, the destination's kernel answers: a SYN-ACK where something
/// listens, a reset where nothing does; either is a round trip. 9 is the discard service, which pods rarely run.
pub const TCP_PROBE_PORT: u16 = 9;
/// How often timeouts, windows and the plan are looked at.
const TICK: Duration = Duration::from_millis(200);

/// A probe in flight, by what its answer will carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Icmp { socket: u64, peer: IpAddr, seq: u16 },
    Tcp(u64),
}

#[derive(Debug)]
struct Pending {
    link: Arc<LinkRef>,
    path: ProbePath,
    sent_at: Instant,
    sent_ms: u64,
    deadline: Instant,
}

/// One namespace's echo sockets, opened for the address families its pairs need.
#[derive(Debug, Default)]
struct Sockets {
    v4: Option<IcmpSocket>,
    v6: Option<IcmpSocket>,
    seq: u16,
}

impl Sockets {
    fn of(&self, to: IpAddr) -> Option<&IcmpSocket> {
        if to.is_ipv6() { self.v6.as_ref() } else { self.v4.as_ref() }
    }
}

#[derive(Debug)]
struct Target {
    pair: Pair,
    netns: Arc<Netns>,
    timeout: Duration,
}

struct Prober {
    config: ProbeConfig,
    metrics: Arc<Metrics>,
    view: Option<Arc<ProbeView>>,
    targets: Vec<Target>,
    pacer: Pacer,
    windows: Windows,
    pods: HashMap<NetnsId, Sockets>,
    baseline: Sockets,
    pending: HashMap<Key, Pending>,
    next_key: u64,
    grace: Duration,
    /// A new plan changed the links: publish even though no window closed.
    replanned: bool,
    echo_tx: mpsc::Sender<EchoReply>,
    tcp_tx: mpsc::UnboundedSender<(u64, Option<Duration>)>,
}

pub(super) async fn run(node: Weak<Node>, config: ProbeConfig, metrics: Arc<Metrics>) {
    let (echo_tx, mut echo_rx) = mpsc::channel(1024);
    let (tcp_tx, mut tcp_rx) = mpsc::unbounded_channel();
    let mut prober = Prober {
        windows: Windows::new(config.window),
        pacer: Pacer::new(0, config.rate, 0),
        config,
        metrics,
        view: None,
        targets: Vec::new(),
        pods: HashMap::new(),
        baseline: Sockets::default(),
        pending: HashMap::new(),
        next_key: 0,
        grace: pacing::MAX_TIMEOUT,
        replanned: false,
        echo_tx,
        tcp_tx,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_send = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next_send) => {
                // The gap counts from the actual send, so a late loop never sends two probes closer than 1/rate.
                next_send = Instant::now() + match prober.pacer.next_send() {
                    Some((slot, gap)) => {
                        prober.send(slot);
                        gap
                    }
                    None => TICK,
                };
            }
            Some(reply) = echo_rx.recv() => prober.echo(reply),
            Some((token, rtt)) = tcp_rx.recv() => prober.tcp(token, rtt),
            _ = tick.tick() => {
                let Some(node) = node.upgrade() else { return };
                if let Some(view) = node.probe_view()
                    && !prober.view.as_ref().is_some_and(|v| Arc::ptr_eq(v, &view))
                {
                    prober.refresh(view).await;
                }
                prober.expire();
                if prober.windows.close(unix_ms_now(), prober.grace) || std::mem::take(&mut prober.replanned) {
                    let version = prober.view.as_ref().map_or(0, |v| v.version);
                    node.measurements().publish(version, prober.windows.measurements());
                }
            }
        }
    }
}

impl Prober {
    /// A new plan: sample its pairs, keep the sockets of namespaces still probed, open the missing ones.
    async fn refresh(&mut self, view: Arc<ProbeView>) {
        let sources: Vec<SourcePod<'_>> =
            view.pods.iter().map(|p| SourcePod { uid: &p.uid, destinations: &p.destinations }).collect();
        let pairs = sample(&sources, &view.filter, self.config.pairs_per_link);
        let mut links: BTreeMap<Arc<LinkRef>, Probed> = BTreeMap::new();
        for pair in &pairs {
            let entry = links.entry(pair.link.clone()).or_insert_with(|| Probed {
                link: pair.link.clone(),
                pairs: 0,
                drops_everything: true,
                one_way: Duration::ZERO,
                timeline: view.timelines.get(&*pair.link).cloned(),
            });
            entry.pairs += 1;
            entry.drops_everything &= pacing::drops_everything(&pair.impairment);
            entry.one_way = entry.one_way.max(pacing::one_way(&pair.impairment));
        }
        self.windows.set_links(links.values().cloned());
        self.metrics.probes.retain(&links.keys().map(|l| &**l).collect::<HashSet<&LinkRef>>());
        self.pending.retain(|_, p| links.contains_key(&p.link));

        self.targets = pairs
            .into_iter()
            .map(|pair| Target { netns: view.pods[pair.pod].netns.clone(), timeout: timeout(&view, &pair), pair })
            .collect();
        let mut old = std::mem::take(&mut self.pods);
        let mut failures: Vec<(Arc<LinkRef>, String)> = Vec::new();
        for index in 0..self.targets.len() {
            let (netns, to, link) = {
                let t = &self.targets[index];
                (t.netns.clone(), t.pair.destination, t.pair.link.clone())
            };
            let sockets = self.pods.entry(netns.id()).or_insert_with(|| old.remove(&netns.id()).unwrap_or_default());
            if let Err(e) = open_family(sockets, Some(&netns), to, &mut self.next_key, &self.echo_tx).await {
                failures
                    .push((link.clone(), format!("opening an ICMP socket in the pod's namespace {}: {e}", netns.id())));
            }
            if let Err(e) = open_family(
                &mut self.baseline,
                self.config.baseline_netns.as_ref(),
                to,
                &mut self.next_key,
                &self.echo_tx,
            )
            .await
            {
                failures.push((link, format!("opening an ICMP socket in the node's namespace: {e}")));
            }
        }
        for (link, message) in failures {
            tracing::warn!(link = %format!("{}/{}", link.namespace, link.name), %message, "a link cannot be probed");
            self.windows.failed(&link, message);
        }
        self.grace = self.targets.iter().map(|t| t.timeout).max().unwrap_or(pacing::MAX_TIMEOUT) + TICK * 2;
        self.pacer = Pacer::new(self.targets.len(), self.config.rate, view.version ^ u64::from(std::process::id()));
        tracing::info!(version = view.version, pairs = self.targets.len(), links = links.len(), "probing");
        self.view = Some(view);
        self.replanned = true;
    }

    fn send(&mut self, slot: Slot) {
        let Some(target) = self.targets.get(slot.pair) else { return };
        let (link, to, timeout) = (target.pair.link.clone(), target.pair.destination, target.timeout);
        // Taken before the send: an answer can be read before this function returns.
        let (sent_at, sent_ms) = (Instant::now(), unix_ms_now());
        let key = match self.windows.kind(&link) {
            ProbeKind::IcmpEcho => {
                let sockets = match slot.path {
                    ProbePath::Impaired => self.pods.get_mut(&target.netns.id()),
                    ProbePath::Baseline => Some(&mut self.baseline),
                };
                // No socket: it failed to open, which the link reports; nothing is sent.
                let Some(sockets) = sockets else { return };
                sockets.seq = sockets.seq.wrapping_add(1);
                let seq = sockets.seq;
                let Some(socket) = sockets.of(to) else { return };
                // A send the kernel refuses (no route) counts as sent and lost: the path is broken.
                if let Err(e) = socket.send(to, seq) {
                    tracing::debug!(%to, error = %e, "sending an echo request");
                }
                Key::Icmp { socket: socket.key, peer: to, seq }
            }
            ProbeKind::TcpSyn => {
                self.next_key += 1;
                let token = self.next_key;
                let netns = match slot.path {
                    ProbePath::Impaired => Some(target.netns.clone()),
                    ProbePath::Baseline => self.config.baseline_netns.clone(),
                };
                let answers = self.tcp_tx.clone();
                tokio::spawn(async move {
                    let rtt = socket::tcp_syn(netns, SocketAddr::new(to, TCP_PROBE_PORT), timeout).await;
                    let _ = answers.send((
                        token,
                        rtt.unwrap_or_else(|e| {
                            tracing::debug!(%to, error = %e, "a TCP SYN probe");
                            None
                        }),
                    ));
                });
                Key::Tcp(token)
            }
        };
        self.windows.sent(&link, slot.path, sent_ms);
        self.metrics.probes.sent(&link, slot.path);
        self.pending.insert(key, Pending { link, path: slot.path, sent_at, sent_ms, deadline: sent_at + timeout });
    }

    fn echo(&mut self, reply: EchoReply) {
        // Duplicates and answers after the timeout find nothing pending.
        let key = Key::Icmp { socket: reply.socket, peer: reply.peer, seq: reply.seq };
        if let Some(pending) = self.pending.remove(&key) {
            let rtt = reply.at.saturating_duration_since(pending.sent_at);
            self.answered(pending, rtt);
        }
    }

    fn tcp(&mut self, token: u64, rtt: Option<Duration>) {
        let Some(pending) = self.pending.remove(&Key::Tcp(token)) else { return };
        match rtt {
            Some(rtt) => self.answered(pending, rtt),
            None => self.metrics.probes.lost(&pending.link, pending.path),
        }
    }

    fn answered(&mut self, pending: Pending, rtt: Duration) {
        self.windows.answered(&pending.link, pending.path, pending.sent_ms, rtt, unix_ms_now());
        self.metrics.probes.answered(&pending.link, pending.path, rtt);
    }

    fn expire(&mut self) {
        let now = Instant::now();
        let metrics = &self.metrics;
        self.pending.retain(|_, p| {
            let waiting = p.deadline > now;
            if !waiting {
                metrics.probes.lost(&p.link, p.path);
            }
            waiting
        });
    }
}

/// Opens `sockets`' socket for `to`'s family if it is not open yet.
async fn open_family(
    sockets: &mut Sockets,
    netns: Option<&Arc<Netns>>,
    to: IpAddr,
    next_key: &mut u64,
    replies: &mpsc::Sender<EchoReply>,
) -> std::io::Result<()> {
    let v6 = to.is_ipv6();
    let slot = if v6 { &mut sockets.v6 } else { &mut sockets.v4 };
    if slot.is_some() {
        return Ok(());
    }
    let raw = socket::create_in(netns, move || socket::raw_icmp(v6)).await?;
    *next_key += 1;
    // The identifier tells this agent's echoes from others' (a ping inside the pod) in the same namespace.
    let id = (std::process::id() as u16).wrapping_add((*next_key as u16).wrapping_mul(0x9e37));
    *slot = Some(IcmpSocket::start(raw, *next_key, id, replies.clone())?);
    Ok(())
}

/// How long a pair's probe waits for its answer: as its link's own impairment needs, or for a link that changes
/// with time, its slowest phase.
fn timeout(view: &ProbeView, pair: &Pair) -> Duration {
    let own = pacing::timeout(&pair.impairment);
    let phases = view.timelines.get(&*pair.link).map(|t| t.phases()).unwrap_or_default();
    phases.iter().map(|p| pacing::timeout(&p.impairment)).fold(own, Duration::max)
}
