//! Finding a pod's network namespace without asking the container runtime.
//!
//! The plan names a pod by UID and IPs. Every network namespace on the node is reachable either through a
//! process (`/proc/<pid>/ns/net`, which needs `hostPID`) or through a bind mount (`/run/netns/*`, where
//! `ip netns` and containerd's CRI pin sandbox namespaces; other directories are configurable). Namespaces are
//! deduplicated by their [`NetnsId`], and a pod's namespace is the one that holds **all** of its IPs, checked
//! inside the namespace over netlink (`RTM_GETADDR`). Processes whose cgroup path names the pod UID
//! (`pod<uid>`, with `-` or `_`) are looked at first, which usually finds the pod with one dump.
//!
//! A namespace is never handed to a pod it does not belong to (an IP reused by another pod): see [`super::owner`].
//!
//! A found namespace is held by an open descriptor and cached by pod UID. On every apply the cache is checked
//! again: the namespace must still be reachable through a path (a deleted pod's namespace can outlive it only
//! because we hold it) and must still hold the IPs. A restarted sandbox (new namespace, maybe the same IP) is
//! therefore picked up on the next apply.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use super::inventory::{Inventory, inventory_many, read_inventory};
use super::owner::{Conflict, conflicts, pods_of};
use super::{Netns, NetnsId};

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
            if let Ok(id) = NetnsId::of_path(&path) {
                let r = found.entry(id).or_default();
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
                found.entry(NetnsId::of_metadata(&meta)).or_default().paths.push(path);
            }
        }
    }
    found
}

fn open_reachable(id: NetnsId, reachable: &Reachable) -> Option<Netns> {
    reachable.paths.iter().find_map(|path| Netns::open(path).ok().filter(|ns| ns.id() == id))
}

/// Every network namespace reachable on the node, opened (for cleanup and adoption).
pub fn all_namespaces(sources: &Sources) -> io::Result<Vec<Netns>> {
    // A file elsewhere whose inode clashes with a namespace's is not one: nsfs is the device of our own.
    let nsfs = Netns::current()?.id().dev;
    let mut out: Vec<Netns> = reachable(sources)
        .iter()
        .filter(|(id, _)| id.dev == nsfs)
        .filter_map(|(id, r)| open_reachable(*id, r))
        .collect();
    out.sort_by_key(|ns| ns.id());
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
    #[error(
        "the network namespace holding the pod's IPs {ips:?} belongs to pod {owner} (by its processes' cgroups): \
         the IPs were reused; refusing to shape another pod"
    )]
    OwnedByAnotherPod { ips: Vec<IpAddr>, owner: String },
    #[error(
        "pods {uids:?} of the plan all resolve to the network namespace holding {ips:?} and nothing says whose it \
         is (an IP reused while the plan still names its former pod); refusing all of them"
    )]
    SharedByPods { ips: Vec<IpAddr>, uids: Vec<String> },
}

/// Per pod UID, its namespace or why it has none.
pub type Resolved = HashMap<String, Result<Arc<Netns>, ResolveError>>;

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

    /// The agent's own (host) namespace.
    pub fn own_id(&self) -> NetnsId {
        self.own.id()
    }

    /// Which of `ids` are still reachable through a path on the node.
    pub fn still_reachable(&self, ids: impl IntoIterator<Item = NetnsId>) -> HashSet<NetnsId> {
        let live = reachable(&self.sources);
        ids.into_iter().filter(|id| live.contains_key(id)).collect()
    }

    /// Resolves every pod: the cached namespace if it is still reachable and still holds the pod's IPs,
    /// otherwise a search (cgroup-named candidates first, then every namespace on the node, each entered at
    /// most once per call). Blocking: call it from a blocking-capable thread.
    pub fn resolve(&mut self, pods: &[PodIdentity]) -> Resolved {
        let mut search = Search { live: reachable(&self.sources), opened: HashMap::new(), inventories: HashMap::new() };
        let wanted: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        self.cache.retain(|uid, ns| search.live.contains_key(&ns.id()) && wanted.contains(uid.as_str()));
        let (mut results, unresolved) = self.verify_cached(pods, &mut search);
        let mut fresh = HashSet::new();
        if !unresolved.is_empty() {
            let candidates = self.cgroup_candidates(&search.live, &unresolved);
            self.search(&unresolved, &candidates, &mut search);
            for pod in unresolved {
                let result = self.pick(pod, candidates.get(&pod.uid), &search);
                fresh.insert(pod.uid.clone());
                results.insert(pod.uid.clone(), result);
            }
        }
        self.refuse_conflicts(pods, &mut results, &fresh, &search.live);
        results
    }

    /// Takes away from a pod a namespace that is not its own (see [`super::owner`]).
    fn refuse_conflicts(
        &mut self,
        pods: &[PodIdentity],
        results: &mut Resolved,
        fresh: &HashSet<String>,
        live: &HashMap<NetnsId, Reachable>,
    ) {
        let found: Vec<(String, NetnsId)> =
            results.iter().filter_map(|(uid, r)| Some((uid.clone(), r.as_ref().ok()?.id()))).collect();
        let owners = |id: NetnsId| live.get(&id).map(|r| pods_of(&self.sources.proc_root, &r.pids)).unwrap_or_default();
        for (uid, conflict) in conflicts(&found, fresh, owners) {
            self.cache.remove(&uid);
            let ips = pods.iter().find(|p| p.uid == uid).map(|p| p.ips.clone()).unwrap_or_default();
            let error = match conflict {
                Conflict::OwnedBy(owner) => ResolveError::OwnedByAnotherPod { ips, owner },
                Conflict::SharedBy(uids) => ResolveError::SharedByPods { ips, uids },
            };
            results.insert(uid, Err(error));
        }
    }

    /// The pods whose cached namespace still holds their IPs, resolved; the others, still to find.
    fn verify_cached<'p>(&mut self, pods: &'p [PodIdentity], search: &mut Search) -> (Resolved, Vec<&'p PodIdentity>) {
        // All at once.
        let cached: Vec<Arc<Netns>> = pods.iter().filter_map(|p| self.cache.get(&p.uid).cloned()).collect();
        search.inventories.extend(inventory_many(cached.iter().map(|n| n.as_ref()), self.parallelism));
        let mut results = HashMap::new();
        let mut unresolved = Vec::new();
        for pod in pods {
            if pod.ips.is_empty() {
                results.insert(pod.uid.clone(), Err(ResolveError::NoIps));
                continue;
            }
            match self.cache.get(&pod.uid) {
                Some(ns) if search.holds_all(ns.id(), &pod.ips) => {
                    results.insert(pod.uid.clone(), Ok(ns.clone()));
                }
                _ => {
                    self.cache.remove(&pod.uid);
                    unresolved.push(pod);
                }
            }
        }
        // Cached namespaces are not opened again by the search.
        search.opened.extend(self.cache.values().map(|ns| (ns.id(), ns.clone())));
        (results, unresolved)
    }

    /// Reads the namespaces the pods may be in: those whose processes' cgroups name a wanted pod first, every
    /// other one only when that did not find them all.
    fn search(&self, pods: &[&PodIdentity], candidates: &HashMap<String, Vec<NetnsId>>, search: &mut Search) {
        let first: Vec<NetnsId> =
            candidates.values().flatten().copied().filter(|id| !search.inventories.contains_key(id)).collect();
        self.open_and_inventory(first, search);
        let all_found = pods.iter().all(|pod| {
            candidates.get(&pod.uid).is_some_and(|ids| ids.iter().any(|id| search.holds_all(*id, &pod.ips)))
        });
        if !all_found {
            let rest: Vec<NetnsId> =
                search.live.keys().copied().filter(|id| !search.inventories.contains_key(id)).collect();
            self.open_and_inventory(rest, search);
        }
    }

    /// The one namespace that holds all of the pod's IPs (preferring those its cgroups name), cached.
    fn pick(
        &mut self,
        pod: &PodIdentity,
        candidates: Option<&Vec<NetnsId>>,
        search: &Search,
    ) -> Result<Arc<Netns>, ResolveError> {
        let holders: Vec<NetnsId> =
            search.inventories.keys().copied().filter(|id| search.holds_all(*id, &pod.ips)).collect();
        let preferred: Vec<NetnsId> = match candidates {
            Some(c) if holders.iter().any(|h| c.contains(h)) => holders.into_iter().filter(|h| c.contains(h)).collect(),
            _ => holders,
        };
        match preferred.as_slice() {
            [] => Err(ResolveError::NotFound(pod.ips.clone())),
            [id] if *id == self.own.id() => Err(ResolveError::HostNetwork(pod.ips.clone())),
            [id] => match search.opened.get(id) {
                Some(ns) => {
                    self.cache.insert(pod.uid.clone(), ns.clone());
                    Ok(ns.clone())
                }
                None => Err(ResolveError::NotFound(pod.ips.clone())),
            },
            many => Err(ResolveError::Ambiguous { ips: pod.ips.clone(), count: many.len() }),
        }
    }

    /// Opens the namespaces `ids` (once each, and only those on nsfs) and reads what they hold.
    fn open_and_inventory(&self, ids: Vec<NetnsId>, search: &mut Search) {
        let nsfs = self.own.id().dev;
        let mut batch = Vec::new();
        for id in ids {
            if id.dev != nsfs || search.inventories.contains_key(&id) {
                continue;
            }
            if id == self.own.id() {
                // The host namespace is never entered: its addresses are read from here.
                search.inventories.insert(id, read_inventory().ok());
                continue;
            }
            let ns = match search.opened.get(&id) {
                Some(ns) => ns.clone(),
                None => match search.live.get(&id).and_then(|r| open_reachable(id, r)) {
                    Some(ns) => {
                        let ns = Arc::new(ns);
                        search.opened.insert(id, ns.clone());
                        ns
                    }
                    None => {
                        search.inventories.insert(id, None);
                        continue;
                    }
                },
            };
            batch.push(ns);
        }
        search.inventories.extend(inventory_many(batch.iter().map(|n| n.as_ref()), self.parallelism));
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

/// One resolve's view of the node: the namespaces reachable now, those opened so far, and what each holds.
struct Search {
    live: HashMap<NetnsId, Reachable>,
    opened: HashMap<NetnsId, Arc<Netns>>,
    /// `None` for a namespace that could not be entered.
    inventories: HashMap<NetnsId, Option<Inventory>>,
}

impl Search {
    fn holds_all(&self, id: NetnsId, ips: &[IpAddr]) -> bool {
        self.inventories.get(&id).and_then(|i| i.as_ref()).is_some_and(|i| i.holds_all(ips))
    }
}
