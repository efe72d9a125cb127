//! Test support for the agent's tests: throwaway network namespaces with veths, certificates, and the agent
//! binary run as a child process. Everything created is removed on drop, also when a test fails.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use isthmus_agent_api::client::{AgentClient, ClientConfig, TlsFiles};
use isthmus_agent_api::identity::node_server_name;
use isthmus_agent_api::test_util::https::Answer;
pub use isthmus_agent_api::test_util::https::tls_exchange;
use isthmus_agent_api::tls::crypto_provider;
use isthmus_test_kit::netns::Netns;
use rustls::pki_types::ServerName;

// The datapaths crate's goodput check, so that the agent's tests judge a shaper as the datapath's do.
#[path = "../../datapaths/tests/goodput/mod.rs"]
pub mod goodput;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A unique, short name (interface names are limited to 15 bytes).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}x{}", std::process::id() % 100_000, COUNTER.fetch_add(1, Ordering::SeqCst))
}

pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn ip(args: &[&str]) -> String {
    run("ip", args)
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Self {
        let path = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A temporary directory for one agent under test, with its `netns` (pinned namespaces the agent may see) and
/// `proc` (the processes it may see) directories: (work, netns, proc).
pub fn agent_dirs(prefix: &str) -> (TempDir, PathBuf, PathBuf) {
    let work = TempDir::new(prefix);
    let netns = work.path().join("netns");
    let proc = work.path().join("proc");
    std::fs::create_dir_all(&netns).unwrap();
    std::fs::create_dir_all(&proc).unwrap();
    (work, netns, proc)
}

/// A named namespace (the test kit's [`Netns`]: created with iproute2, deleted on drop with everything in it), with
/// its loopback up, optionally also bind-mounted into a private directory so that an agent under test can be
/// pointed at exactly the namespaces of its test. Many pods hang off one hub in the agent's tests, so namespaces
/// come one at a time here, named by a counter, rather than as the kit's pair.
pub struct Ns {
    pub name: String,
    // Dropped after `Drop::drop` has unmounted the pinned path.
    netns: Netns,
    pinned: Option<PathBuf>,
}

impl Ns {
    pub fn new(prefix: &str) -> Self {
        let name = unique(prefix);
        let netns = Netns::create(name.clone()).unwrap();
        netns.ip(&["link", "set", "lo", "up"]).unwrap();
        Ns { name, netns, pinned: None }
    }

    /// Also pins the namespace at `dir/<name>` (a bind mount of the nsfs file).
    pub fn new_pinned(prefix: &str, dir: &Path) -> Self {
        let mut ns = Self::new(prefix);
        let target = dir.join(&ns.name);
        std::fs::File::create(&target).unwrap();
        run("mount", &["--bind", &format!("/run/netns/{}", ns.name), target.to_str().unwrap()]);
        ns.pinned = Some(target);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    pub fn inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.path()).unwrap().ino()
    }

    /// Runs `f` on a thread inside the namespace, which the caller joins when it wants the answer (the kit's
    /// [`Netns::enter`] waits for it).
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let fd = self.netns.fd().try_clone_to_owned().unwrap();
        std::thread::spawn(move || {
            nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
    }

    pub fn tc(&self, args: &[&str]) -> String {
        self.netns.tc(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `tc qdisc show dev <dev>` inside the namespace.
    pub fn qdiscs(&self, dev: &str) -> String {
        self.tc(&["qdisc", "show", "dev", dev])
    }

    pub fn classes(&self, dev: &str) -> String {
        self.tc(&["class", "show", "dev", dev])
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        if let Some(pinned) = &self.pinned {
            // Lazily: an agent under test may still hold the namespace open through this path.
            let _ = Command::new("umount").arg("--lazy").arg(pinned).status();
            let _ = std::fs::remove_file(pinned);
        }
    }
}

/// A veth pair between two namespaces, `eth0`-like names inside: `a_dev` in `a` with `a_ip`, `b_dev` in `b`
/// with `b_ip`, both /24 (or /64).
pub fn veth(a: &Ns, a_dev: &str, a_ip: IpAddr, b: &Ns, b_dev: &str, b_ip: IpAddr) {
    let tmp_a = unique("va");
    let tmp_b = unique("vb");
    ip(&["link", "add", &tmp_a, "netns", &a.name, "type", "veth", "peer", "name", &tmp_b, "netns", &b.name]);
    ip(&["-n", &a.name, "link", "set", &tmp_a, "name", a_dev]);
    ip(&["-n", &b.name, "link", "set", &tmp_b, "name", b_dev]);
    for (ns, dev, addr) in [(a, a_dev, a_ip), (b, b_dev, b_ip)] {
        let prefix = if addr.is_ipv4() { 24 } else { 64 };
        ip(&["-n", &ns.name, "addr", "add", &format!("{addr}/{prefix}"), "dev", dev, "nodad"]);
        ip(&["-n", &ns.name, "link", "set", dev, "up"]);
    }
}

/// Adds another address to an interface inside a namespace.
pub fn add_addr(ns: &Ns, dev: &str, addr: IpAddr) {
    let prefix = if addr.is_ipv4() { 24 } else { 64 };
    ip(&["-n", &ns.name, "addr", "add", &format!("{addr}/{prefix}"), "dev", dev, "nodad"]);
}

/// Steady-state TCP goodput from `from` to `to_ip` (a listener in `to`), in bit/s: see
/// [`goodput::steady_goodput_bps`].
pub fn tcp_goodput(from: &Ns, to: &Ns, to_ip: IpAddr) -> f64 {
    let port = 5201 + (COUNTER.fetch_add(1, Ordering::SeqCst) % 1000) as u16;
    let listener = to.run_in(move || TcpListener::bind(SocketAddr::new(to_ip, port))).join().unwrap().unwrap();
    let sender = from
        .run_in(move || TcpStream::connect_timeout(&SocketAddr::new(to_ip, port), Duration::from_secs(5)))
        .join()
        .unwrap()
        .unwrap();
    goodput::steady_goodput_bps(listener, sender)
}

/// A CA and certificates issued by it, written as mounted-Secret directories.
pub struct Pki {
    pub ca_cert: rcgen::Certificate,
    pub ca_key: rcgen::KeyPair,
}

pub const OPERATOR: &str = "isthmus-operator.isthmus-system.serviceaccount.isthmus";
/// The metrics scraper's identity the test agents are started with.
pub const SCRAPER: &str = "isthmus-metrics-scraper.isthmus";

impl Pki {
    pub fn new(name: &str) -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca_cert = params.self_signed(&ca_key).unwrap();
        Pki { ca_cert, ca_key }
    }

    /// A leaf certificate with one DNS SAN, for client or server use; returns (cert PEM, key PEM).
    pub fn issue(&self, dns_name: &str, server: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![dns_name.to_owned()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, dns_name);
        params.extended_key_usages = vec![if server {
            rcgen::ExtendedKeyUsagePurpose::ServerAuth
        } else {
            rcgen::ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes ca.crt (this CA, or `trust`'s), tls.crt and tls.key into `dir`.
    pub fn write(&self, dir: &Path, trust: &Pki, leaf: &(String, String)) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("ca.crt"), trust.ca_cert.pem()).unwrap();
        std::fs::write(dir.join("tls.crt"), &leaf.0).unwrap();
        std::fs::write(dir.join("tls.key"), &leaf.1).unwrap();
    }
}

/// Certificates for the agent on one node and its callers, from one CA: the agent's serving certificate names
/// its node, as the operator's signer issues it.
pub struct TestCerts {
    pub dir: TempDir,
    pub ca: Pki,
    pub node: String,
    /// The DNS name the agent's certificate carries and the operator dials it under.
    pub server_name: String,
}

impl TestCerts {
    pub fn new(node: &str) -> Self {
        let dir = TempDir::new("isth-certs-");
        let ca = Pki::new("isthmus test CA");
        let server_name = node_server_name(node).unwrap();
        ca.write(&dir.0.join("agent"), &ca, &ca.issue(&server_name, true));
        ca.write(&dir.0.join("operator"), &ca, &ca.issue(OPERATOR, false));
        ca.write(&dir.0.join("scraper"), &ca, &ca.issue(SCRAPER, false));
        TestCerts { dir, ca, node: node.to_owned(), server_name }
    }

    pub fn agent_dir(&self) -> PathBuf {
        self.dir.0.join("agent")
    }

    /// A client with the certificates in `dir` under the test directory.
    pub fn client_from(&self, dir: &Path) -> AgentClient {
        let mut config = ClientConfig::new(TlsFiles::in_dir(dir)).unwrap();
        config.request_timeout = Duration::from_secs(120);
        AgentClient::new(config)
    }

    pub fn operator(&self) -> AgentClient {
        self.client_from(&self.dir.0.join("operator"))
    }

    /// A TLS client configuration presenting the certificate in `who` (`operator`, `scraper`, or any directory
    /// written under the test directory).
    pub fn tls_config(&self, who: &str) -> rustls::ClientConfig {
        let files = TlsFiles::in_dir(self.dir.0.join(who));
        let material = files.read().unwrap();
        rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(material.root_store(&files).unwrap())
            .with_client_auth_cert(material.certificate_chain(&files).unwrap(), material.private_key(&files).unwrap())
            .unwrap()
    }

    /// `PUT /v1/plan` of any JSON, with the operator's certificate: for plans the typed client cannot send (an
    /// invalid impairment cannot be built). Returns the HTTP status and the body.
    pub async fn put_plan_json(&self, agent: SocketAddr, plan: &serde_json::Value) -> (u16, String) {
        let body = plan.to_string();
        let request = format!(
            "PUT /v1/plan HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.server_name,
            body.len()
        );
        let response =
            tls_exchange(agent, &self.server_name, self.tls_config("operator"), request.as_bytes()).await.unwrap();
        status_and_body(&response)
    }

    /// `GET path` on the API port as `who`, from a plain thread (no runtime needed): status and body.
    pub fn get(&self, agent: SocketAddr, who: &str, path: &str) -> (u16, String) {
        let connection = rustls::ClientConnection::new(
            std::sync::Arc::new(self.tls_config(who)),
            ServerName::try_from(self.server_name.clone()).unwrap(),
        )
        .unwrap();
        let tcp = TcpStream::connect_timeout(&agent, Duration::from_secs(5)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut tls = rustls::StreamOwned::new(connection, tcp);
        write!(tls, "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.server_name).unwrap();
        let mut response = Vec::new();
        // A peer that closes without close_notify after a whole answer still answered.
        let _ = tls.read_to_end(&mut response);
        status_and_body(&String::from_utf8_lossy(&response))
    }

    /// The agent's /metrics text, read with the scraper's certificate.
    pub fn metrics(&self, agent: SocketAddr) -> String {
        let (code, body) = self.get(agent, "scraper", "/metrics");
        assert_eq!(code, 200, "/metrics as the scraper: {body}");
        body
    }
}

fn status_and_body(response: &str) -> (u16, String) {
    let answer = Answer::parse(response);
    (answer.status, answer.body)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The agent binary under test: this build's, or `ISTHMUS_AGENT_BINARY` (e.g. the static release binary that
/// the images ship, for the benchmark).
pub fn agent_binary() -> std::ffi::OsString {
    std::env::var_os("ISTHMUS_AGENT_BINARY").unwrap_or_else(|| env!("CARGO_BIN_EXE_isthmus-agent").into())
}

/// The agent binary running as a child process on loopback.
pub struct Agent {
    pub child: Child,
    pub api: SocketAddr,
    pub health: SocketAddr,
    pub log: PathBuf,
}

pub struct AgentOptions<'a> {
    pub node: &'a str,
    pub tls_dir: &'a Path,
    /// Directory standing in for /proc (an empty one: discovery only through `netns_dir`).
    pub proc: &'a Path,
    pub netns_dir: &'a Path,
    pub log_dir: &'a Path,
    pub extra_env: Vec<(&'a str, String)>,
}

impl<'a> AgentOptions<'a> {
    /// Options over the directories of [`agent_dirs`] (work, pinned namespaces, /proc) and the agent's
    /// certificate directory, with `env` set for the agent.
    pub fn in_dirs(
        node: &'a str,
        tls_dir: &'a Path,
        (work, pinned, proc): &'a (TempDir, PathBuf, PathBuf),
        env: &[(&'a str, &str)],
    ) -> Self {
        let extra_env = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
        AgentOptions { node, tls_dir, proc, netns_dir: pinned, log_dir: work.path(), extra_env }
    }
}

impl Agent {
    pub fn start(options: &AgentOptions<'_>) -> Self {
        Self::start_with_caps(options, None)
    }

    /// Starts the agent with only the capabilities `keep` (e.g. `cap_net_admin`) in its bounding set: every
    /// other capability is dropped with capsh before the agent is executed.
    pub fn start_with_caps(options: &AgentOptions<'_>, keep: Option<&[&str]>) -> Self {
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let health = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let log = options.log_dir.join(unique("agent-log-"));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut cmd = match keep {
            None => Command::new(agent_binary()),
            Some(keep) => {
                let drop: Vec<String> =
                    all_capabilities().into_iter().filter(|c| !keep.contains(&c.as_str())).collect();
                let mut cmd = Command::new("capsh");
                cmd.arg(format!("--drop={}", drop.join(",")))
                    .args(["--", "-c", "exec \"$0\" \"$@\""])
                    .arg(agent_binary());
                cmd
            }
        };
        cmd.arg("serve")
            .arg("--node-name")
            .arg(options.node)
            .arg("--listen")
            .arg(api.to_string())
            .arg("--health-listen")
            .arg(health.to_string())
            .arg("--tls-dir")
            .arg(options.tls_dir)
            .arg("--scraper-identity")
            .arg(SCRAPER)
            .arg("--tls-reload-seconds")
            .arg("1")
            .arg("--proc")
            .arg(options.proc)
            .arg("--netns-dirs")
            .arg(options.netns_dir)
            .arg("--log-format")
            .arg("text")
            .env("RUST_LOG", "info")
            // The tests read the tc trees the agent installs; this kernel has no netem, so `auto` would give
            // every pod the userspace datapath. A test of that one sets ISTHMUS_DATAPATH.
            .env("ISTHMUS_DATAPATH", "tc")
            // Probes would leave the test's namespaces: baseline probes go from the agent's own namespace, the
            // machine's. A test of probing turns it on with a baseline namespace of its own.
            .env("ISTHMUS_VERIFY", "false")
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in &options.extra_env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        let mut agent = Agent { child, api, health, log };
        agent.wait_ready(Duration::from_secs(60));
        agent
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("agent exited with {status}: {}", self.log_text());
            }
            if http_get(self.health, "/readyz").is_some_and(|(code, _)| code == 200) {
                // The API listener is bound right before readiness is set.
                return;
            }
            assert!(start.elapsed() < timeout, "agent not ready after {timeout:?}: {}", self.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident memory of the agent process in KiB (VmRSS) and its peak (VmHWM).
    pub fn rss_kib(&self) -> (u64, u64) {
        let [rss, peak] = self.status_kib(["VmRSS", "VmHWM"]);
        (rss, peak)
    }

    /// The resident size in its two parts: anonymous (the heap, the stacks) and mapped from files (the
    /// binary's code and the libraries' that ran, which no allocation changes).
    pub fn rss_split_kib(&self) -> (u64, u64) {
        let [anon, file] = self.status_kib(["RssAnon", "RssFile"]);
        (anon, file)
    }

    /// Fields of one reading of `/proc/<pid>/status`, in KiB (0 when absent).
    fn status_kib<const N: usize>(&self, names: [&str; N]) -> [u64; N] {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        names.map(|name| isthmus_test_kit::proc::status_kib(&status, name).unwrap_or(0))
    }

    /// Resets the agent's VmHWM to its current resident size (`clear_refs` value 5), so that the next reading
    /// is the peak of what happened in between.
    pub fn reset_peak_rss(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5").unwrap();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A plain HTTP GET (health port): (status code, body); None when nothing answered.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(conn, "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((code, body))
}

/// Many pod namespaces, each with `eth0` (one IP) on a veth whose other end sits in one hub namespace; all
/// pinned in `dir` so that an agent can be pointed at exactly them. No traffic is sent through them.
pub struct Fleet {
    pub hub: Ns,
    pub pods: Vec<Ns>,
    pub ips: Vec<IpAddr>,
}

impl Fleet {
    pub fn new(prefix: &str, count: usize, dir: &Path, base: [u8; 2]) -> Self {
        let hub = Ns::new(&format!("{prefix}h-"));
        let mut pods = Vec::new();
        let mut ips = Vec::new();
        for i in 0..count {
            let ns = Ns::new_pinned(&format!("{prefix}p-"), dir);
            let host_side = format!("h{i}");
            ip(&[
                "link", "add", &host_side, "netns", &hub.name, "type", "veth", "peer", "name", "eth0", "netns",
                &ns.name,
            ]);
            let addr = IpAddr::from([base[0], base[1], (i / 200) as u8, (i % 200 + 10) as u8]);
            ip(&["-n", &ns.name, "addr", "add", &format!("{addr}/16"), "dev", "eth0", "nodad"]);
            ip(&["-n", &ns.name, "link", "set", "eth0", "up"]);
            pods.push(ns);
            ips.push(addr);
        }
        Fleet { hub, pods, ips }
    }
}

/// Counts lines of `tc <object> show dev eth0` containing `needle`.
pub fn count_tc(ns: &Ns, object: &str, needle: &str) -> usize {
    ns.tc(&[object, "show", "dev", "eth0"]).lines().filter(|l| l.contains(needle)).count()
}

/// Every capability in this process's bounding set, by name.
pub fn all_capabilities() -> Vec<String> {
    let out = run("capsh", &["--print"]);
    let line = out.lines().find(|l| l.starts_with("Bounding set =")).expect("capsh prints the bounding set");
    line.trim_start_matches("Bounding set =")
        .split(',')
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

/// Effective capabilities of a process (hex mask from /proc/<pid>/status).
pub fn effective_caps(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status.lines().find(|l| l.starts_with("CapEff:")).unwrap().split_whitespace().nth(1).unwrap().to_owned();
    u64::from_str_radix(&hex, 16).unwrap()
}
