//! The cluster smoke test's reading of what commands print (`tests/cluster_smoke/`, run by e2e/cluster/smoke):
//! pure, so that each verdict's parsing is tested here without a cluster. Each function says which shell pipeline
//! of the smoke's bash version it stands for.

/// The last line of a command's output, as `tail -n 1` prints it (without its newline); None when the output is
/// empty (`tail` prints nothing at all).
pub fn tail_line(out: &str) -> Option<&str> {
    if out.is_empty() {
        return None;
    }
    let body = out.strip_suffix('\n').unwrap_or(out);
    Some(body.rsplit('\n').next().unwrap_or(body))
}

/// Whether `ping -c N` answered every echo (`grep -q ' 0% packet loss'`: "100% packet loss" does not count).
pub fn ping_answered(out: &str) -> bool {
    out.contains(" 0% packet loss")
}

/// `kubectl get nodes --no-headers` as `name=STATUS` words (`awk '{print $1 "=" $2}'`).
pub fn nodes_summary(no_headers: &str) -> String {
    no_headers
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(format!("{}={}", f.next()?, f.next().unwrap_or_default()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The answers of a Service's load-balance check, counted as `sort | uniq -c` counts them.
#[derive(Debug, PartialEq, Eq)]
pub struct Tally {
    /// (count, answer), sorted by answer.
    pub counts: Vec<(usize, String)>,
}

impl Tally {
    /// `answers`: each request's last line (`tail_line`); a request that printed nothing is not counted.
    pub fn of(answers: &[Option<String>]) -> Tally {
        let mut sorted: Vec<&str> = answers.iter().flatten().map(String::as_str).collect();
        sorted.sort_unstable();
        let mut counts: Vec<(usize, String)> = Vec::new();
        for a in sorted {
            match counts.last_mut() {
                Some((n, last)) if last == a => *n += 1,
                _ => counts.push((1, a.to_owned())),
            }
        }
        Tally { counts }
    }

    /// `6 hello from a1;6 hello from b1;`
    pub fn seen(&self) -> String {
        self.counts.iter().map(|(n, a)| format!("{n} {a};")).collect()
    }

    /// Whether some answer holds none of `expected`.
    pub fn others(&self, expected: &[&str]) -> bool {
        self.counts.iter().any(|(_, a)| !expected.iter().any(|e| a.contains(e)))
    }

    /// How many requests were answered.
    pub fn answered(&self) -> usize {
        self.counts.iter().map(|(n, _)| n).sum()
    }
}

/// The processes whose listening sockets the host check judges: a line of `ss -p` naming one of them
/// (`grep -E '"(etcd|kube-apiserver|…)'`, a prefix: `kube-controller` is kube-controller-manager).
pub const CLUSTER_PROCESSES: &[&str] =
    &["etcd", "kube-apiserver", "kube-controller", "kube-scheduler", "kubelet", "kube-proxy", "containerd"];

/// The cluster processes' sockets of `ss -lntupH` bound elsewhere than 127.0.0.1 and `bridge_ip` (a wildcard
/// included), each as `local peer process` (the columns after Netid, State, Recv-Q, Send-Q).
pub fn sockets_outside(ss_lntup: &str, bridge_ip: &str) -> Vec<String> {
    let bridge = format!("{bridge_ip}:");
    ss_lntup
        .lines()
        .filter(|l| CLUSTER_PROCESSES.iter().any(|p| l.contains(&format!("\"{p}"))))
        .map(|l| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" "))
        .filter(|rest| {
            let local = rest.split(' ').next().unwrap_or_default();
            !(local.starts_with("127.0.0.1:") || local.starts_with(&bridge))
        })
        .collect()
}

/// Whether `ss -lntpH` shows kube-apiserver listening on `ip:port` (`grep -q "$IP:$PORT .*kube-apiserver"`).
pub fn apiserver_listens(ss_lntp: &str, ip: &str, port: &str) -> bool {
    let at = format!("{ip}:{port} ");
    ss_lntp.lines().any(|l| l.find(&at).is_some_and(|i| l[i..].contains("kube-apiserver")))
}

/// A node's local addresses of `ss -lntuH` (the fifth column) other than loopback, its own addresses in the
/// cluster's range and the wildcards of its own namespace
/// (`grep -vE '^(127\.0\.0\.1|198\.1[89]\.[0-9.]+|\*|0\.0\.0\.0|\[::\]|\[::1\]):'`).
pub fn node_sockets_outside(ss_lntu: &str) -> Vec<String> {
    ss_lntu
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|a| !node_address(a))
        .map(str::to_owned)
        .collect()
}

fn node_address(local: &str) -> bool {
    if ["127.0.0.1:", "*:", "0.0.0.0:", "[::]:", "[::1]:"].iter().any(|p| local.starts_with(p)) {
        return true;
    }
    let Some(rest) = local.strip_prefix("198.18.").or_else(|| local.strip_prefix("198.19.")) else { return false };
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.').len();
    digits > 0 && rest[digits..].starts_with(':')
}

/// The routes of `ip route show` into the cluster's range (`grep -E '^198\.1[89]\.'`).
pub fn cluster_routes(routes: &str) -> Vec<&str> {
    routes.lines().filter(|l| l.starts_with("198.18.") || l.starts_with("198.19.")).collect()
}

/// Whether a route into the cluster's range goes elsewhere than `bridge` (`grep -vE "dev $BRIDGE|^unreachable"`).
pub fn routed_elsewhere(routes: &str, bridge: &str) -> bool {
    let dev = format!("dev {bridge}");
    cluster_routes(routes).iter().any(|l| !l.contains(&dev) && !l.starts_with("unreachable"))
}

/// The IPv4 addresses of `ip -o -4 addr show scope global` on interfaces other than `bridge`.
pub fn global_addresses(ip_o_addr: &str, bridge: &str) -> Vec<String> {
    ip_o_addr
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 3 && f[1] != bridge).then(|| f[3].split('/').next().unwrap_or_default().to_owned())
        })
        .collect()
}

/// A value in a snapshot's `sysctls` file (`sysctl` lines, `net.ipv4.ip_forward = 0`): the third word of the
/// first line naming `key` (`awk '/ip_forward/ {print $3}'`).
pub fn sysctl_in(sysctls: &str, key: &str) -> Option<String> {
    sysctls.lines().find(|l| l.contains(key)).and_then(|l| l.split_whitespace().nth(2)).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_line_is_what_tail_prints() {
        assert_eq!(tail_line(""), None);
        assert_eq!(tail_line("HTTP/1.0 200 OK\r\n\r\nhello from a1\n"), Some("hello from a1"));
        assert_eq!(tail_line("no newline"), Some("no newline"));
        assert_eq!(tail_line("a\n\n"), Some(""));
        assert_eq!(tail_line("\n"), Some(""));
    }

    #[test]
    fn ping_needs_every_echo() {
        assert!(ping_answered("2 packets transmitted, 2 packets received, 0% packet loss\n"));
        assert!(!ping_answered("2 packets transmitted, 0 packets received, 100% packet loss\n"));
        assert!(!ping_answered("2 packets transmitted, 1 packets received, 50% packet loss\n"));
        assert!(!ping_answered("error: unable to upgrade connection"));
    }

    #[test]
    fn nodes_summary_pairs_name_and_status() {
        let out = "smoke-node1   Ready    <none>   20s   v1.34.12\nsmoke-node2   NotReady   <none>   20s   v1.34.12\n";
        assert_eq!(nodes_summary(out), "smoke-node1=Ready smoke-node2=NotReady");
    }

    fn answers(a: &[Option<&str>]) -> Vec<Option<String>> {
        a.iter().map(|x| x.map(str::to_owned)).collect()
    }

    #[test]
    fn tally_counts_as_uniq_c() {
        let t = Tally::of(&answers(&[Some("hello from b1"), Some("hello from a1"), Some("hello from b1")]));
        assert_eq!(t.seen(), "1 hello from a1;2 hello from b1;");
        assert_eq!(t.answered(), 3);
        assert!(!t.others(&["hello from a1", "hello from b1"]));
    }

    #[test]
    fn tally_names_other_answers_and_skips_silent_requests() {
        let t = Tally::of(&answers(&[Some("hello from a1"), None, Some(""), Some("HTTP/1.0 404 Not Found")]));
        assert_eq!(t.answered(), 3, "a request that printed nothing is not an answer");
        assert!(t.others(&["hello from a1", "hello from b1"]));
        assert_eq!(t.seen(), "1 ;1 HTTP/1.0 404 Not Found;1 hello from a1;");
        assert_eq!(Tally::of(&[]).seen(), "");
    }

    const SS_HOST: &str = "\
tcp   LISTEN 0      4096       127.0.0.1:2379       0.0.0.0:*    users:((\"etcd\",pid=11,fd=7))
tcp   LISTEN 0      4096      198.18.0.1:6443       0.0.0.0:*    users:((\"kube-apiserver\",pid=12,fd=3))
tcp   LISTEN 0      4096       127.0.0.1:10257      0.0.0.0:*    users:((\"kube-controller\",pid=13,fd=3))
tcp   LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    users:((\"sshd\",pid=1,fd=3))
udp   UNCONN 0      0         198.18.0.1:10123      0.0.0.0:*    users:((\"chronyd\",pid=14,fd=5))
";

    #[test]
    fn host_sockets_on_loopback_and_the_bridge_pass() {
        assert_eq!(sockets_outside(SS_HOST, "198.18.0.1"), Vec::<String>::new());
        assert!(apiserver_listens(SS_HOST, "198.18.0.1", "6443"));
        assert!(!apiserver_listens(SS_HOST, "198.18.0.1", "644"));
        assert!(!apiserver_listens(SS_HOST, "127.0.0.1", "6443"));
    }

    #[test]
    fn host_sockets_on_a_wildcard_or_elsewhere_are_named() {
        let ss = format!(
            "{SS_HOST}tcp LISTEN 0 4096 *:10250 *:* users:((\"kubelet\",pid=15,fd=20))\n\
             tcp LISTEN 0 4096 198.18.0.10:9000 0.0.0.0:* users:((\"containerd-shim\",pid=16,fd=9))\n\
             tcp LISTEN 0 4096 [::]:2380 [::]:* users:((\"etcd\",pid=11,fd=8))\n"
        );
        assert_eq!(
            sockets_outside(&ss, "198.18.0.1"),
            [
                "*:10250 *:* users:((\"kubelet\",pid=15,fd=20))",
                "198.18.0.10:9000 0.0.0.0:* users:((\"containerd-shim\",pid=16,fd=9))",
                "[::]:2380 [::]:* users:((\"etcd\",pid=11,fd=8))",
            ]
        );
    }

    #[test]
    fn node_sockets_own_addresses_and_wildcards_pass() {
        let ss = "\
tcp LISTEN 0 4096 127.0.0.1:10248 0.0.0.0:*
tcp LISTEN 0 4096 198.18.0.2:10250 0.0.0.0:*
tcp LISTEN 0 4096 198.19.1.1:53 0.0.0.0:*
tcp LISTEN 0 4096 *:10256 *:*
udp UNCONN 0 0 0.0.0.0:8472 0.0.0.0:*
tcp LISTEN 0 4096 [::]:22 [::]:*
tcp LISTEN 0 4096 [::1]:10249 [::]:*
";
        assert_eq!(node_sockets_outside(ss), Vec::<String>::new());
        let bad = "tcp LISTEN 0 4096 10.0.0.5:22 0.0.0.0:*\ntcp LISTEN 0 4096 198.18.:1 0.0.0.0:*\n\
                   tcp LISTEN 0 4096 198.20.0.1:1 0.0.0.0:*\ntcp LISTEN 0 4096 [fe80::1]:1 [::]:*\nshort line\n";
        assert_eq!(node_sockets_outside(bad), ["10.0.0.5:22", "198.18.:1", "198.20.0.1:1", "[fe80::1]:1"]);
    }

    #[test]
    fn cluster_routes_stay_on_the_bridge() {
        let routes = "default via 10.0.0.1 dev eth0\nunreachable 198.18.0.0/15\n\
                      198.18.0.0/24 dev isthbr0 proto kernel scope link src 198.18.0.1\n\
                      198.19.0.0/24 via 198.18.0.2 dev isthbr0\n";
        assert!(!routed_elsewhere(routes, "isthbr0"));
        assert_eq!(cluster_routes(routes).len(), 2);
        let leak = format!("{routes}198.19.1.0/24 via 10.0.0.1 dev eth0\n");
        assert!(routed_elsewhere(&leak, "isthbr0"));
    }

    #[test]
    fn global_addresses_leave_out_the_bridge() {
        let out = "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever\n\
                   5: isthbr0    inet 198.18.0.1/24 scope global isthbr0\\       valid_lft forever\n";
        assert_eq!(global_addresses(out, "isthbr0"), ["10.0.0.5"]);
    }

    #[test]
    fn sysctl_in_reads_the_snapshot_line() {
        let file = "kernel.panic = 0\nnet.ipv4.ip_forward = 1\nvm.overcommit_memory = 1\n";
        assert_eq!(sysctl_in(file, "ip_forward").as_deref(), Some("1"));
        assert_eq!(sysctl_in(file, "route_localnet"), None);
    }
}
