//! Throwaway network namespaces joined by a veth pair, for tests that send real traffic through a kernel: built
//! with iproute2 (`ip` and `tc` from `PATH`: an independent tool, never the product's netlink code) and removed on
//! drop, also when a test fails. Root only.
//!
//! Namespace `a` holds [`A_DEV`], the end whose egress a test shapes; namespace `b` holds [`B_DEV`] with the
//! destinations. The stock-kernel rig's guest tests and the agent's host-kernel datapath tests build theirs here.

use std::ffi::c_int;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::process::Command;

/// The veth's end in namespace `a`.
pub const A_DEV: &str = "va";
/// The veth's end in namespace `b`.
pub const B_DEV: &str = "vb";

/// Runs iproute2's `program` (`ip`, `tc`) and returns its stdout; a non-zero status is an error carrying stderr.
pub fn iproute2(program: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("running {program}: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A named namespace (`ip netns add`), held open, deleted on drop with everything in it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    file: File,
}

impl Netns {
    pub fn create(name: impl Into<String>) -> io::Result<Netns> {
        let name = name.into();
        iproute2("ip", &["netns", "add", &name])?;
        let path = format!("/run/netns/{name}");
        match File::open(&path) {
            Ok(file) => Ok(Netns { name, file }),
            Err(e) => {
                let _ = iproute2("ip", &["netns", "del", &name]);
                Err(io::Error::new(e.kind(), format!("opening {path}: {e}")))
            }
        }
    }

    /// As [`Netns::create`], after deleting a namespace of the same name that a killed earlier run left.
    pub fn replace(name: impl Into<String>) -> io::Result<Netns> {
        let name = name.into();
        let _ = iproute2("ip", &["netns", "del", &name]);
        Netns::create(name)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Runs `f` inside this namespace: see [`run_in`].
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        run_in(self.fd(), f).map_err(|e| io::Error::new(e.kind(), format!("entering netns {}: {e}", self.name)))
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> io::Result<String> {
        iproute2("ip", &[&["-n", self.name.as_str()][..], args].concat())
    }

    /// `tc -n NAME ARGS`.
    pub fn tc(&self, args: &[&str]) -> io::Result<String> {
        iproute2("tc", &[&["-n", self.name.as_str()][..], args].concat())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Its interfaces (a veth pair goes with either end) and every qdisc on them go with the namespace.
        let _ = iproute2("ip", &["netns", "del", &self.name]);
    }
}

/// Runs `f` on a short-lived thread that has entered the network namespace `ns`: sockets it creates belong to
/// that namespace for their whole life, whichever thread uses them later. A panic in `f` is resumed on the
/// caller's thread; the only error is failing to enter the namespace.
pub fn run_in<T: Send>(ns: BorrowedFd<'_>, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        let thread = s.spawn(|| {
            enter_net_namespace(ns)?;
            Ok(f())
        });
        thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// `setns(fd, CLONE_NEWNET)` for the calling thread (declared here: std has no binding and this crate stays
/// std only).
fn enter_net_namespace(ns: BorrowedFd<'_>) -> io::Result<()> {
    const CLONE_NEWNET: c_int = 0x4000_0000;
    unsafe extern "C" {
        fn setns(fd: c_int, nstype: c_int) -> c_int;
    }
    // SAFETY: setns reads its two integer arguments only; the descriptor is borrowed, so open for the call.
    if unsafe { setns(ns.as_raw_fd(), CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Namespaces `a` and `b` joined by a veth, [`A_DEV`] in `a` and [`B_DEV`] in `b`, each end with its addresses
/// (IPv6 ones without duplicate address detection, so that they are usable at once); both ends and both
/// loopbacks up. Dropping it deletes both namespaces, and the veth with them.
#[derive(Debug)]
pub struct VethPair {
    pub a: Netns,
    pub b: Netns,
}

impl VethPair {
    /// Namespaces `{base}-a` and `{base}-b`, replacing leftovers of the same names; addresses with their prefix
    /// lengths.
    pub fn new(base: &str, a_addrs: &[(IpAddr, u8)], b_addrs: &[(IpAddr, u8)]) -> io::Result<VethPair> {
        let a = Netns::replace(format!("{base}-a"))?;
        let b = Netns::replace(format!("{base}-b"))?;
        a.ip(&["link", "add", A_DEV, "type", "veth", "peer", "name", B_DEV, "netns", b.name()])?;
        for (ns, dev, addrs) in [(&a, A_DEV, a_addrs), (&b, B_DEV, b_addrs)] {
            for (addr, prefix) in addrs {
                let cidr = format!("{addr}/{prefix}");
                let mut args = vec!["addr", "add", cidr.as_str(), "dev", dev];
                if addr.is_ipv6() {
                    args.push("nodad");
                }
                ns.ip(&args)?;
            }
            ns.ip(&["link", "set", "lo", "up"])?;
            ns.ip(&["link", "set", dev, "up"])?;
        }
        Ok(VethPair { a, b })
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, UdpSocket};
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_failing_command_says_what_failed() {
        let e = iproute2("sh", &["-c", "echo nope >&2; exit 3"]).unwrap_err();
        assert_eq!(e.to_string(), "sh -c echo nope >&2; exit 3 failed (exit status: 3): nope");
        let e = iproute2("/nonexistent/ip", &[]).unwrap_err();
        assert!(e.to_string().starts_with("running /nonexistent/ip: "), "{e}");
    }

    #[test]
    #[ignore = "root only: creates network namespaces (cargo test -p isthmus-test-kit -- --ignored)"]
    fn a_datagram_crosses_the_pair_and_the_namespaces_go_with_it() {
        let base = format!("isth-kit-{}", std::process::id());
        let (src, dst) = (Ipv4Addr::new(10, 78, 0, 1), Ipv4Addr::new(10, 78, 0, 2));
        let pair = VethPair::new(&base, &[(src.into(), 24)], &[(dst.into(), 24)]).unwrap();
        let rx = pair.b.enter(|| UdpSocket::bind((dst, 9000))).unwrap().unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = pair.a.enter(|| UdpSocket::bind((src, 0))).unwrap().unwrap();
        tx.send_to(b"across", (dst, 9000)).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from.ip()), (&b"across"[..], IpAddr::from(src)));
        assert!(pair.a.tc(&["qdisc", "show", "dev", A_DEV]).unwrap().contains("qdisc"));
        drop(pair);
        let left = iproute2("ip", &["netns", "list"]).unwrap();
        assert!(!left.contains(&base), "{left}");
    }
}
