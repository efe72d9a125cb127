//! Throwaway network namespaces inside the guest, joined by a veth pair, built with iproute2 (the test's
//! scaffolding, not the product) and removed by Drop, also when a test fails.
//!
//! Namespace `a` holds the source interface `va` (10.77.0.1) whose egress the datapath shapes; namespace `b`
//! holds `vb` with the destination addresses 10.77.0.2, .3, ….

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd};
use std::process::Command;

use anyhow::{Context, bail};
use nix::sched::{CloneFlags, setns};

pub const IP: &str = "/usr/sbin/ip";
pub const TC: &str = "/usr/sbin/tc";
/// The shaped interface, in namespace `a`.
pub const SOURCE_IF: &str = "va";
pub const SOURCE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// Runs iproute2 and returns its stdout; a non-zero status is an error carrying stderr.
pub fn iproute2(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub struct Netns {
    pub name: String,
    file: File,
}

impl Netns {
    pub fn create(name: String) -> anyhow::Result<Netns> {
        iproute2(IP, &["netns", "add", &name])?;
        let file = match File::open(format!("/run/netns/{name}")) {
            Ok(f) => f,
            Err(e) => {
                let _ = iproute2(IP, &["netns", "del", &name]);
                return Err(e).with_context(|| format!("opening /run/netns/{name}"));
            }
        };
        Ok(Netns { name, file })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Runs `f` on a short-lived thread that has entered this namespace: sockets it creates belong to the
    /// namespace for their whole life, whichever thread uses them later.
    pub fn enter<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let ns = self.file.try_clone()?;
        let name = self.name.clone();
        std::thread::spawn(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering netns {name}"))?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("thread in netns {} panicked", self.name))?
    }

    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        iproute2(IP, &full)
    }

    pub fn tc(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        iproute2(TC, &full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The veth pair and every qdisc on it go with the namespaces.
        let _ = iproute2(IP, &["netns", "del", &self.name]);
    }
}

/// Two namespaces joined by veth: the source `a` and the destinations in `b`.
pub struct Link {
    pub a: Netns,
    pub b: Netns,
    pub destinations: Vec<Ipv4Addr>,
}

impl Link {
    pub fn new(test: &str, destinations: usize) -> anyhow::Result<Link> {
        let pid = std::process::id();
        let a = Netns::create(format!("isth-{test}-{pid}-a"))?;
        let b = Netns::create(format!("isth-{test}-{pid}-b"))?;
        a.ip(&["link", "add", SOURCE_IF, "type", "veth", "peer", "name", "vb", "netns", &b.name])?;
        a.ip(&["addr", "add", &format!("{SOURCE_ADDR}/24"), "dev", SOURCE_IF])?;
        let destinations: Vec<Ipv4Addr> = (0..destinations).map(|i| Ipv4Addr::new(10, 77, 0, 2 + i as u8)).collect();
        for d in &destinations {
            b.ip(&["addr", "add", &format!("{d}/24"), "dev", "vb"])?;
        }
        for (ns, dev) in [(&a, SOURCE_IF), (&b, "vb")] {
            ns.ip(&["link", "set", "lo", "up"])?;
            ns.ip(&["link", "set", dev, "up"])?;
        }
        Ok(Link { a, b, destinations })
    }

    /// `tc -s qdisc/class/filter show dev va` in `a`: the kernel's own account, independent of the library.
    pub fn tc_show(&self, object: &str) -> anyhow::Result<String> {
        self.a.tc(&["-s", object, "show", "dev", SOURCE_IF])
    }
}
