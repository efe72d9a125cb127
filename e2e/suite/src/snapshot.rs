//! "down leaves nothing": a machine snapshot (`e2e/cluster/lib/snapshot.sh take`, one file per aspect) taken
//! after a `down` against the one taken before the first `up`. Pure: the cluster smoke's `leaves-nothing` mode
//! (`tests/cluster_smoke/`) reads the files and prints the verdict.
//!
//! Any difference in `iptables`, `sysctls` or `conntrack` is left behind. Elsewhere a changed line is the
//! cluster's when it matches its signature (`cluster_made`); other changed lines are shown as changed meanwhile
//! (other work shares this machine) and do not fail.

/// The aspects in which any difference is the cluster's doing.
pub const STRICT: &[&str] = &["iptables", "sysctls", "conntrack"];

/// Words that mark a line as the cluster's: its names, interfaces, processes, addresses, chains and paths.
const SIGNATURE: &[&str] = &[
    "isthmus",
    "isthbr",
    "linux.uml",
    "qemu-system",
    "198.18.",
    "198.19.",
    "cni0",
    "cni-",
    "KUBE-",
    "kube",
    "etcd",
    "containerd",
    "runc",
    "pause",
    "overlay",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
];
/// Interface name prefixes followed by a node's number: a node's veth (`isth-n<i>`), a guest's tap (`isth-t<i>`).
const NUMBERED: &[&str] = &["isth-n", "isth-t"];

/// Whether `line` matches the cluster's signature (the bash version's `CLUSTER_SIGNATURE`:
/// `isthmus|isthbr|isth-n[0-9]|isth-t[0-9]|linux\.uml|qemu-system|198\.1[89]\.|cni0|cni-|KUBE-|kube|etcd|…`).
pub fn cluster_made(line: &str) -> bool {
    SIGNATURE.iter().any(|w| line.contains(w))
        || NUMBERED
            .iter()
            .any(|p| line.match_indices(p).any(|(i, _)| line[i + p.len()..].starts_with(|c: char| c.is_ascii_digit())))
}

/// The lines that differ between `base` and `cur` as `diff` prints them, `< ` removed and `> ` added, in file
/// order, each run of changes between common lines with its removals first. A longest common subsequence after
/// the common head and tail; where what is left between them is too large for that (more than `LCS_CELLS`), a
/// count of each line on either side instead, which for the sorted aspects is the same answer.
pub fn diff(base: &str, cur: &str) -> Vec<String> {
    let a: Vec<&str> = base.lines().collect();
    let b: Vec<&str> = cur.lines().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..].iter().rev().zip(b[head..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    if (a.len() + 1) * (b.len() + 1) > LCS_CELLS {
        return by_count(a, b);
    }
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let w = b.len() + 1;
    let mut lcs = vec![0u32; (a.len() + 1) * w];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i * w + j] =
                if a[i] == b[j] { lcs[(i + 1) * w + j + 1] + 1 } else { lcs[(i + 1) * w + j].max(lcs[i * w + j + 1]) };
        }
    }
    let (mut out, mut removed, mut added) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.append(&mut removed);
            out.append(&mut added);
            i += 1;
            j += 1;
        } else if j == b.len() || i < a.len() && lcs[(i + 1) * w + j] >= lcs[i * w + j + 1] {
            removed.push(format!("< {}", a[i]));
            i += 1;
        } else {
            added.push(format!("> {}", b[j]));
            j += 1;
        }
    }
    out.append(&mut removed);
    out.append(&mut added);
    out
}

/// Above this many cells (16 MiB of table) `diff` counts lines instead.
const LCS_CELLS: usize = 4 << 20;

fn by_count(a: &[&str], b: &[&str]) -> Vec<String> {
    // Each side's lines less as many of each as the other side holds.
    fn less(side: &[&str], other: &[&str], mark: char) -> Vec<String> {
        let mut count = std::collections::HashMap::<&str, usize>::new();
        for l in other {
            *count.entry(l).or_default() += 1;
        }
        let mut out = Vec::new();
        for l in side {
            match count.get_mut(l) {
                Some(n) if *n > 0 => *n -= 1,
                _ => out.push(format!("{mark} {l}")),
            }
        }
        out
    }
    let mut out = less(a, b, '<');
    out.extend(less(b, a, '>'));
    out
}

/// What one aspect's difference says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Aspect {
    /// Changed lines that are the cluster's (every one, for a `STRICT` aspect): these fail.
    pub left_behind: Vec<String>,
    /// Changed lines that are plainly someone else's: shown, not failing.
    pub meanwhile: Vec<String>,
}

/// Judges the aspect `name` of two snapshots.
pub fn judge(name: &str, base: &str, cur: &str) -> Aspect {
    let changed = diff(base, cur);
    if STRICT.contains(&name) {
        let mut left_behind = changed;
        if left_behind.is_empty() && base.lines().ne(cur.lines()) {
            left_behind.push("(the same lines, in another order)".to_owned());
        }
        return Aspect { left_behind, meanwhile: Vec::new() };
    }
    let (left_behind, meanwhile) = changed.into_iter().partition(|l| cluster_made(l));
    Aspect { left_behind, meanwhile }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_the_clusters() {
        for l in [
            "> /sys/fs/cgroup/memory/isthmus-smoke-node1",
            "< isth-n0",
            "> isth-t12",
            "> 198.19.1.0/24 via 198.18.0.3 dev isthbr0",
            "> /var/lib/kubelet/pods",
            "> kube-apiserver --etcd-servers=…",
            "> linux.uml ubd0=…",
            "> overlay /run/containerd/io.containerd.runtime.v2.task/k8s.io/x/rootfs overlay",
        ] {
            assert!(cluster_made(l), "{l}");
        }
        for l in
            ["> veth1234", "> isth-nx", "> isth-", "> linuxXuml", "> 198.20.0.1", "> /sys/fs/cgroup/cpu/user.slice"]
        {
            assert!(!cluster_made(l), "{l}");
        }
    }

    #[test]
    fn diff_prints_what_diff_prints() {
        assert_eq!(diff("a\nb\nc\n", "a\nb\nc\n"), Vec::<String>::new());
        assert_eq!(diff("a\nb\nc\n", "a\nc\nd\n"), ["< b", "> d"]);
        assert_eq!(diff("a\nx\ny\nc\n", "a\nz\nc\n"), ["< x", "< y", "> z"]);
        assert_eq!(diff("", "a\n"), ["> a"]);
        assert_eq!(diff("a\n", ""), ["< a"]);
        assert_eq!(diff("a\nb\n", "b\na\n").len(), 2, "a reordering is a difference");
    }

    #[test]
    fn diff_of_sorted_files_is_the_same_by_lcs_and_by_count() {
        let base: Vec<String> = (0..300).map(|i| format!("line {i:04}")).collect();
        let mut cur = base.clone();
        cur.retain(|l| !l.ends_with('7'));
        cur.extend(["line 0500".to_owned(), "line 0001".to_owned()]);
        cur.sort();
        let (base, cur) = (base.join("\n"), cur.join("\n"));
        let mut lcs = diff(&base, &cur);
        let (a, b): (Vec<&str>, Vec<&str>) = (base.lines().collect(), cur.lines().collect());
        let mut count = by_count(&a, &b);
        lcs.sort();
        count.sort();
        assert_eq!(lcs, count);
        assert_eq!(lcs.len(), 30 + 2);
    }

    #[test]
    fn strict_aspects_fail_on_any_change() {
        let a = judge("sysctls", "net.ipv4.ip_forward = 0\n", "net.ipv4.ip_forward = 1\n");
        assert_eq!(a.left_behind, ["< net.ipv4.ip_forward = 0", "> net.ipv4.ip_forward = 1"]);
        assert_eq!(judge("conntrack", "0\n", "0\n"), Aspect::default());
        let rules = "iptables-nft-save: -A INPUT -j A\niptables-nft-save: -A INPUT -j B\n";
        let swapped = "iptables-nft-save: -A INPUT -j B\niptables-nft-save: -A INPUT -j A\n";
        assert!(!judge("iptables", rules, swapped).left_behind.is_empty());
    }

    #[test]
    fn other_aspects_fail_only_on_the_clusters_lines() {
        let base = "eth0\nlo\n";
        let a = judge("links", base, "eth0\nisthbr0\nlo\nveth99\n");
        assert_eq!(a.left_behind, ["> isthbr0"]);
        assert_eq!(a.meanwhile, ["> veth99"]);
        let a = judge("links", base, "eth0\nveth99\n");
        assert!(a.left_behind.is_empty());
        assert_eq!(a.meanwhile, ["< lo", "> veth99"]);
    }
}
