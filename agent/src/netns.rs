//! Finding a pod's network namespace without asking the container runtime.
//!
//! The plan names a pod by UID and IPs. Every network namespace on the node is reachable either through a
//! process (`/proc/<pid>/ns/net`, which needs `hostPID`) or through a bind mount (`/run/netns/*`, where
//! `ip netns` and containerd's CRI pin sandbox namespaces; other directories are configurable). Namespaces are
//! deduplicated by (device, inode), and a pod's namespace is the one that holds **all** of its IPs, checked
//! inside the namespace over netlink (`RTM_GETADDR`). Processes whose cgroup path names the pod UID
//! (`pod<uid>`, with `-` or `_`) are looked at first, which usually finds the pod with one dump.
//!
//! A found namespace is held by an open descriptor and cached by pod UID. On every apply the cache is checked
//! again: the namespace must still be reachable through a path (a deleted pod's namespace can outlive it only
//! because we hold it) and must still hold the IPs. A restarted sandbox (new namespace, maybe the same IP) is
//! therefore picked up on the next apply.
//!
//! Entering a namespace is done on a short-lived thread created for that purpose (`setns` affects only the
//! calling thread); no thread of the async runtime ever changes namespace.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use nix::sched::CloneFlags;

/// A network namespace's identity: the (device, inode) of its nsfs file, as `stat -L` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetnsId {
    pub dev: u64,
    pub inode: u64,
}

impl NetnsId {
    fn of_fd(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
        Ok(NetnsId { dev: st.st_dev, inode: st.st_ino })
    }
}

impl std::fmt::Display for NetnsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.inode)
    }
}

/// An open network namespace. Holding it keeps the namespace alive, so the resolver drops it as soon as no
/// path on the node reaches the namespace any more.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    id: NetnsId,
    /// The path it was opened through, for messages.
    path: PathBuf,
}

impl Netns {
    /// Opens the namespace file at `path` (a `/proc/<pid>/ns/net` link or an nsfs bind mount).
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = OwnedFd::from(File::open(path)?);
        let id = NetnsId::of_fd(fd.as_fd())?;
        Ok(Netns { fd, id, path: path.to_owned() })
    }

    /// The namespace of the calling thread.
    pub fn current() -> io::Result<Self> {
        Self::open(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Runs `f` on a new thread that has entered this namespace; the thread ends with `f`.
    pub fn run_inside<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    self.enter_this_thread()?;
                    f()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
        })
    }

    /// Moves the calling thread into the namespace. Only for threads created for that purpose and ended
    /// right after.
    fn enter_this_thread(&self) -> io::Result<()> {
        nix::sched::setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            io::Error::new(io::ErrorKind::PermissionDenied, format!("setns into {}: {e}", self.path.display()))
        })
    }

    /// The addresses and interface names inside the namespace, read over netlink from inside it.
    pub fn inventory(&self) -> io::Result<Inventory> {
        self.run_inside(read_inventory)
    }
}

/// What a namespace holds: its addresses and interfaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    pub addresses: HashSet<IpAddr>,
    pub interfaces: Vec<String>,
}

impl Inventory {
    pub fn holds_all(&self, ips: &[IpAddr]) -> bool {
        !ips.is_empty() && ips.iter().all(|ip| self.addresses.contains(ip))
    }
}

/// Dumps links and addresses of the calling thread's namespace.
fn read_inventory() -> io::Result<Inventory> {
    let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    let mut inventory = Inventory::default();
    for message in dump(&socket, RouteNetlinkMessage::GetLink(LinkMessage::default()), 1)? {
        if let RouteNetlinkMessage::NewLink(link) = message {
            for attribute in link.attributes {
                if let LinkAttribute::IfName(name) = attribute {
                    inventory.interfaces.push(name);
                }
            }
        }
    }
    for message in dump(&socket, RouteNetlinkMessage::GetAddress(AddressMessage::default()), 2)? {
        if let RouteNetlinkMessage::NewAddress(address) = message {
            for attribute in address.attributes {
                // IFA_LOCAL is the interface's own address on point-to-point links; IFA_ADDRESS elsewhere.
                if let AddressAttribute::Address(ip) | AddressAttribute::Local(ip) = attribute {
                    inventory.addresses.insert(ip);
                }
            }
        }
    }
    Ok(inventory)
}

fn dump(
    socket: &netlink_sys::Socket,
    request: RouteNetlinkMessage,
    sequence: u32,
) -> io::Result<Vec<RouteNetlinkMessage>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = sequence;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::from(request));
    message.finalize();
    let mut buffer = vec![0; message.buffer_len()];
    message.serialize(&mut buffer);
    socket.send(&buffer, 0)?;
    let mut replies = Vec::new();
    loop {
        let (bytes, _) = socket.recv_from_full()?;
        let mut offset = 0;
        while offset < bytes.len() {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[offset..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("netlink dump reply: {e}")))?;
            let length = reply.header.length as usize;
            if length == 0 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "netlink message of length 0"));
            }
            offset += (length + 3) & !3;
            match reply.payload {
                NetlinkPayload::Done(_) => return Ok(replies),
                NetlinkPayload::Error(e) => {
                    return Err(e.code.map_or_else(
                        || io::Error::other("netlink dump acknowledged without data"),
                        |c| io::Error::from_raw_os_error(-c.get()),
                    ));
                }
                NetlinkPayload::InnerMessage(m) => replies.push(m),
                _ => {}
            }
        }
    }
}

/// Where namespaces are looked for.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The host's `/proc` (the agent runs with `hostPID`).
    pub proc_root: PathBuf,
    /// Directories of nsfs bind mounts (`/run/netns`, containerd's state dir, ...).
    pub netns_dirs: Vec<PathBuf>,
    /// When set, only processes whose `/proc/<pid>/cgroup` contains this text are considered. Needed where
    /// several simulated nodes share one kernel and one PID namespace.
    pub cgroup_filter: Option<String>,
}

impl Default for Sources {
    fn default() -> Self {
        Self { proc_root: PathBuf::from("/proc"), netns_dirs: vec![PathBuf::from("/run/netns")], cgroup_filter: None }
    }
}

/// A namespace reachable on the node right now, with the processes inside it.
#[derive(Debug, Clone, Default)]
struct Reachable {
    paths: Vec<PathBuf>,
    pids: Vec<u32>,
}

/// Every namespace reachable through `sources`, by identity. Only `stat`s: nothing is opened or entered.
fn reachable(sources: &Sources) -> HashMap<NetnsId, Reachable> {
    let mut found: HashMap<NetnsId, Reachable> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir(&sources.proc_root) {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if let Some(filter) = &sources.cgroup_filter {
                let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
                if !cgroup.contains(filter.as_str()) {
                    continue;
                }
            }
            let path = entry.path().join("ns/net");
            // Fails for exited processes and for those we may not inspect (PID 1 here); both are skipped.
            if let Ok(meta) = std::fs::metadata(&path) {
                let r = found.entry(NetnsId { dev: meta.dev(), inode: meta.ino() }).or_default();
                r.paths.push(path);
                r.pids.push(pid);
            }
        }
    }
    for dir in &sources.netns_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            // An nsfs mount has the namespace's identity; the empty file under it (before mounting) does not
            // live on nsfs and is skipped by the inode check when opened.
            if let Ok(meta) = std::fs::metadata(&path)
                && meta.is_file()
            {
                found.entry(NetnsId { dev: meta.dev(), inode: meta.ino() }).or_default().paths.push(path);
            }
        }
    }
    found
}

/// The device number of nsfs, from the agent's own namespace; a file elsewhere with a clashing inode is not
/// a namespace.
fn nsfs_dev(own: &Netns) -> u64 {
    own.id.dev
}

fn open_reachable(id: NetnsId, reachable: &Reachable) -> Option<Netns> {
    reachable.paths.iter().find_map(|path| Netns::open(path).ok().filter(|ns| ns.id == id))
}

/// Every network namespace reachable on the node, opened (for cleanup and adoption).
pub fn all_namespaces(sources: &Sources) -> io::Result<Vec<Netns>> {
    let own = Netns::current()?;
    let mut out: Vec<Netns> = reachable(sources)
        .iter()
        .filter(|(id, _)| id.dev == nsfs_dev(&own))
        .filter_map(|(id, r)| open_reachable(*id, r))
        .collect();
    out.sort_by_key(|ns| ns.id);
    Ok(out)
}

/// Why a pod's namespace was not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("the pod has no IPs in the plan (ips is empty)")]
    NoIps,
    #[error("no network namespace on this node holds all of the pod's IPs {0:?}")]
    NotFound(Vec<IpAddr>),
    #[error("the pod's IPs {0:?} are in the host's network namespace: it uses the host network")]
    HostNetwork(Vec<IpAddr>),
    #[error("{count} network namespaces hold all of the pod's IPs {ips:?}; refusing to guess")]
    Ambiguous { ips: Vec<IpAddr>, count: usize },
}

/// One pod to find: UID and IPs.
#[derive(Debug, Clone)]
pub struct PodIdentity {
    pub uid: String,
    pub ips: Vec<IpAddr>,
}

/// Finds pods' namespaces and keeps them open between applies.
#[derive(Debug)]
pub struct Resolver {
    sources: Sources,
    own: Netns,
    cache: HashMap<String, Arc<Netns>>,
    /// How many namespaces are entered at once while searching.
    parallelism: usize,
}

impl Resolver {
    pub fn new(sources: Sources) -> io::Result<Self> {
        Ok(Self { sources, own: Netns::current()?, cache: HashMap::new(), parallelism: 16 })
    }

    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The agent's own (host) namespace.
    pub fn own_id(&self) -> NetnsId {
        self.own.id
    }

    /// Which of `ids` are still reachable through a path on the node.
    pub fn still_reachable(&self, ids: impl IntoIterator<Item = NetnsId>) -> HashSet<NetnsId> {
        let live = reachable(&self.sources);
        ids.into_iter().filter(|id| live.contains_key(id)).collect()
    }

    /// Resolves every pod: the cached namespace if it is still reachable and still holds the pod's IPs,
    /// otherwise a search (cgroup-named candidates first, then every namespace on the node, each entered at
    /// most once per call). Blocking: call it from a blocking-capable thread.
    pub fn resolve(&mut self, pods: &[PodIdentity]) -> HashMap<String, Result<Arc<Netns>, ResolveError>> {
        let live = reachable(&self.sources);
        let dev = nsfs_dev(&self.own);
        self.cache.retain(|_, ns| live.contains_key(&ns.id));
        let wanted: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        self.cache.retain(|uid, _| wanted.contains(uid.as_str()));

        let mut results = HashMap::new();
        let mut inventories: HashMap<NetnsId, Option<Inventory>> = HashMap::new();

        // Re-verify cached namespaces, all at once.
        let cached: Vec<Arc<Netns>> = pods.iter().filter_map(|p| self.cache.get(&p.uid).cloned()).collect();
        inventories.extend(inventory_many(cached.iter().map(|n| n.as_ref()), self.parallelism));
        let mut unresolved = Vec::new();
        for pod in pods {
            if pod.ips.is_empty() {
                results.insert(pod.uid.clone(), Err(ResolveError::NoIps));
                continue;
            }
            match self.cache.get(&pod.uid) {
                Some(ns) if inventories.get(&ns.id).and_then(|i| i.as_ref()).is_some_and(|i| i.holds_all(&pod.ips)) => {
                    results.insert(pod.uid.clone(), Ok(ns.clone()));
                }
                _ => {
                    self.cache.remove(&pod.uid);
                    unresolved.push(pod);
                }
            }
        }
        if unresolved.is_empty() {
            return results;
        }

        // Open every reachable namespace once; enter first those whose processes' cgroups name a wanted pod.
        let mut opened: HashMap<NetnsId, Arc<Netns>> = HashMap::new();
        for ns in self.cache.values() {
            opened.insert(ns.id, ns.clone());
        }
        let candidates = self.cgroup_candidates(&live, &unresolved);
        let first: Vec<NetnsId> =
            candidates.values().flatten().copied().filter(|id| !inventories.contains_key(id)).collect();
        self.open_and_inventory(&live, dev, first, &mut opened, &mut inventories);
        let all_found = unresolved.iter().all(|pod| {
            candidates.get(&pod.uid).is_some_and(|ids| {
                ids.iter().any(|id| inventories.get(id).and_then(|i| i.as_ref()).is_some_and(|i| i.holds_all(&pod.ips)))
            })
        });
        if !all_found {
            let rest: Vec<NetnsId> = live.keys().copied().filter(|id| !inventories.contains_key(id)).collect();
            self.open_and_inventory(&live, dev, rest, &mut opened, &mut inventories);
        }

        for pod in unresolved {
            let holders: Vec<NetnsId> = inventories
                .iter()
                .filter(|(_, inv)| inv.as_ref().is_some_and(|i| i.holds_all(&pod.ips)))
                .map(|(id, _)| *id)
                .collect();
            let preferred: Vec<NetnsId> = match candidates.get(&pod.uid) {
                Some(c) if holders.iter().any(|h| c.contains(h)) => {
                    holders.iter().copied().filter(|h| c.contains(h)).collect()
                }
                _ => holders,
            };
            let result = match preferred.as_slice() {
                [] => Err(ResolveError::NotFound(pod.ips.clone())),
                [id] if *id == self.own.id => Err(ResolveError::HostNetwork(pod.ips.clone())),
                [id] => match opened.get(id) {
                    Some(ns) => {
                        self.cache.insert(pod.uid.clone(), ns.clone());
                        Ok(ns.clone())
                    }
                    None => Err(ResolveError::NotFound(pod.ips.clone())),
                },
                many => Err(ResolveError::Ambiguous { ips: pod.ips.clone(), count: many.len() }),
            };
            results.insert(pod.uid.clone(), result);
        }
        results
    }

    fn open_and_inventory(
        &self,
        live: &HashMap<NetnsId, Reachable>,
        dev: u64,
        ids: Vec<NetnsId>,
        opened: &mut HashMap<NetnsId, Arc<Netns>>,
        inventories: &mut HashMap<NetnsId, Option<Inventory>>,
    ) {
        let mut batch = Vec::new();
        for id in ids {
            if id.dev != dev || inventories.contains_key(&id) {
                continue;
            }
            if id == self.own.id {
                // The host namespace is never entered: its addresses are read from here.
                inventories.insert(id, read_inventory().ok());
                continue;
            }
            let ns = match opened.get(&id) {
                Some(ns) => ns.clone(),
                None => match live.get(&id).and_then(|r| open_reachable(id, r)) {
                    Some(ns) => {
                        let ns = Arc::new(ns);
                        opened.insert(id, ns.clone());
                        ns
                    }
                    None => {
                        inventories.insert(id, None);
                        continue;
                    }
                },
            };
            batch.push(ns);
        }
        inventories.extend(inventory_many(batch.iter().map(|n| n.as_ref()), self.parallelism));
    }

    /// Per unresolved pod UID, the namespaces of processes whose cgroup path names the pod.
    fn cgroup_candidates(
        &self,
        live: &HashMap<NetnsId, Reachable>,
        pods: &[&PodIdentity],
    ) -> HashMap<String, Vec<NetnsId>> {
        let needles: Vec<(String, [String; 2])> = pods
            .iter()
            .map(|p| (p.uid.clone(), [format!("pod{}", p.uid), format!("pod{}", p.uid.replace('-', "_"))]))
            .collect();
        let mut out: HashMap<String, Vec<NetnsId>> = HashMap::new();
        for (id, r) in live {
            for pid in &r.pids {
                let Ok(cgroup) = std::fs::read_to_string(self.sources.proc_root.join(pid.to_string()).join("cgroup"))
                else {
                    continue;
                };
                for (uid, [dashed, underscored]) in &needles {
                    if cgroup.contains(dashed.as_str()) || cgroup.contains(underscored.as_str()) {
                        let ids = out.entry(uid.clone()).or_default();
                        if !ids.contains(id) {
                            ids.push(*id);
                        }
                    }
                }
            }
        }
        out
    }
}

/// Inventories of many namespaces, `parallelism` threads at a time. A namespace that cannot be entered maps
/// to `None` (it vanished, or we lack the privilege).
pub fn inventory_many<'a>(
    namespaces: impl Iterator<Item = &'a Netns>,
    parallelism: usize,
) -> HashMap<NetnsId, Option<Inventory>> {
    let namespaces: Vec<&Netns> = namespaces.collect();
    let mut out = HashMap::new();
    for chunk in namespaces.chunks(parallelism.max(1)) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|ns| {
                    (
                        ns.id,
                        scope.spawn(move || {
                            ns.enter_this_thread()?;
                            read_inventory()
                        }),
                    )
                })
                .collect();
            for (id, handle) in handles {
                let inventory = handle.join().ok().and_then(|r| {
                    r.map_err(|e| tracing::debug!(netns = %id, error = %e, "cannot read the namespace's addresses"))
                        .ok()
                });
                out.insert(id, inventory);
            }
        });
    }
    out
}
