//! Whose namespace is it: a pod's namespace is found by its IPs, and an IP can move to another pod (the pod was
//! deleted and its address reused while the operator's plan still names it, or a sandbox restarted). Shaping
//! the wrong pod's traffic is worse than shaping none, so a namespace is refused to a pod when the cgroups of
//! the processes inside name another pod, and when two pods of one plan resolve to it and nothing says which
//! one it belongs to. Pure, except [`pods_of`], which reads `/proc/<pid>/cgroup`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use super::NetnsId;

/// The pod UIDs that a cgroup file (`/proc/<pid>/cgroup`) names: `pod<uid>` as kubelet writes it with the
/// cgroupfs driver (`…/pod0b4e…-…/…`) or the systemd one (`…-pod0b4e…_…slice`), normalised to lowercase with
/// dashes. A static pod's cgroup carries its manifest's hash (32 hex digits, no dashes), not the UID of its
/// mirror pod in the API, so it names nobody and its namespace is judged by IPs alone, as before.
pub fn pod_uids_in_cgroup(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in text.match_indices("pod") {
        let rest = &text[at + 3..];
        let Some(candidate) = rest.get(..36) else { continue };
        let uid: String = candidate.chars().map(|c| if c == '_' { '-' } else { c.to_ascii_lowercase() }).collect();
        if is_uuid(&uid) {
            out.insert(uid);
        }
    }
    out
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The pods named by the cgroups of `pids` (read under `proc_root`); processes that exited are skipped.
pub fn pods_of(proc_root: &Path, pids: &[u32]) -> BTreeSet<String> {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok())
        .flat_map(|text| pod_uids_in_cgroup(&text))
        .collect()
}

/// Why a pod may not have the namespace its IPs were found in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// The processes inside belong to this other pod.
    OwnedBy(String),
    /// These pods of the plan (this one included) all resolved to it, and no process says whose it is.
    SharedBy(Vec<String>),
}

/// The pods of `found` (pod UID → its namespace) that must be refused it. `owners` gives the pods a namespace's
/// processes belong to (empty when none says); it is asked only for the namespaces of `fresh` pods (those
/// found by a search rather than verified from the cache, whose owner was checked when they were found) and of
/// pods that share a namespace.
pub fn conflicts(
    found: &[(String, NetnsId)],
    fresh: &HashSet<String>,
    mut owners: impl FnMut(NetnsId) -> BTreeSet<String>,
) -> BTreeMap<String, Conflict> {
    let mut by_namespace: BTreeMap<NetnsId, Vec<&str>> = BTreeMap::new();
    for (uid, id) in found {
        by_namespace.entry(*id).or_default().push(uid);
    }
    let mut out = BTreeMap::new();
    for (id, uids) in by_namespace {
        if uids.len() == 1 && !fresh.contains(uids[0]) {
            continue;
        }
        let owners = owners(id);
        let claimed: Vec<&str> =
            uids.iter().copied().filter(|uid| owners.contains(&uid.to_ascii_lowercase())).collect();
        for uid in &uids {
            let conflict = match (owners.iter().next(), claimed.as_slice()) {
                (Some(_), [owner]) if owner == uid => continue,
                (Some(owner), []) => Conflict::OwnedBy(owner.clone()),
                (Some(_), [owner]) => Conflict::OwnedBy((*owner).to_owned()),
                (None, _) if uids.len() == 1 => continue,
                // No owner, or several pods of the plan each named by the processes inside: nobody can tell.
                _ => Conflict::SharedBy(uids.iter().map(|u| (*u).to_owned()).collect()),
            };
            out.insert((*uid).to_owned(), conflict);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0b4e5d2c-1111-4a5b-9c8d-0123456789ab";
    const B: &str = "7f00aa11-2222-4b6c-8d9e-abcdefabcdef";

    fn ns(inode: u64) -> NetnsId {
        NetnsId { dev: 4, inode }
    }

    fn set(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn pod_uids_are_read_from_both_cgroup_drivers() {
        let cgroupfs =
            format!("12:cpu:/kubepods/burstable/pod{A}/e3f1c0\n1:name=systemd:/kubepods/burstable/pod{A}/e3f1c0\n");
        assert_eq!(pod_uids_in_cgroup(&cgroupfs), set(&[A]));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-9a.scope\n",
            B.replace('-', "_")
        );
        assert_eq!(pod_uids_in_cgroup(&systemd), set(&[B]));
        let upper = format!("0::/kubepods/pod{}/x", A.to_ascii_uppercase());
        assert_eq!(pod_uids_in_cgroup(&upper), set(&[A]));
    }

    #[test]
    fn text_that_only_looks_like_a_pod_is_no_pod() {
        for text in [
            "0::/system.slice/podman.service",
            "0::/pod1234/x",
            "0::/kubepods/pod",
            "",
            "pod0b4e5d2c-1111-4a5b-9c8d-0123456789a",
        ] {
            assert!(pod_uids_in_cgroup(text).is_empty(), "{text}");
        }
    }

    #[test]
    fn a_namespace_whose_processes_name_another_pod_is_refused() {
        let found = vec![(A.to_owned(), ns(1))];
        let verdicts = conflicts(&found, &set(&[A]).into_iter().collect(), |_| set(&[B]));
        assert_eq!(verdicts[A], Conflict::OwnedBy(B.to_owned()));
        // Its own processes: kept; no processes: kept.
        assert!(conflicts(&found, &set(&[A]).into_iter().collect(), |_| set(&[A])).is_empty());
        assert!(conflicts(&found, &set(&[A]).into_iter().collect(), |_| set(&[])).is_empty());
    }

    #[test]
    fn a_cached_namespace_alone_is_not_asked_about() {
        let found = vec![(A.to_owned(), ns(1))];
        let verdicts = conflicts(&found, &HashSet::new(), |_| panic!("a verified cached namespace is not read again"));
        assert!(verdicts.is_empty());
    }

    #[test]
    fn two_pods_in_one_namespace_keep_it_only_for_the_owner() {
        // B is cached (found earlier), A is new with B's reused IP: both point at B's namespace.
        let found = vec![(A.to_owned(), ns(7)), (B.to_owned(), ns(7))];
        let fresh: HashSet<String> = set(&[A]).into_iter().collect();
        let verdicts = conflicts(&found, &fresh, |_| set(&[B]));
        assert_eq!(verdicts.len(), 1);
        assert_eq!(verdicts[A], Conflict::OwnedBy(B.to_owned()));
        // Nothing says whose it is (a pinned namespace without processes): both are refused.
        let verdicts = conflicts(&found, &fresh, |_| set(&[]));
        let both = Conflict::SharedBy(vec![A.to_owned(), B.to_owned()]);
        assert_eq!((&verdicts[A], &verdicts[B]), (&both, &both));
        // The processes name both (cannot happen with Kubernetes' sandboxes): nobody can tell either.
        assert_eq!(conflicts(&found, &fresh, |_| set(&[A, B]))[A], both);
    }

    #[test]
    fn pods_in_namespaces_of_their_own_are_untouched() {
        let found = vec![(A.to_owned(), ns(1)), (B.to_owned(), ns(2))];
        let fresh: HashSet<String> = set(&[A, B]).into_iter().collect();
        let verdicts = conflicts(&found, &fresh, |id| if id == ns(1) { set(&[A]) } else { set(&[B]) });
        assert!(verdicts.is_empty());
    }
}
