//! `--capture-netem-dumps`: the guest's half of `rig capture-netem-dumps` (the pure parts, the cases and the
//! lines are in `isthmus_kernel_tests::netem_dumps`). A veth `v0` (up, its peer `v1` down, so nothing is ever
//! sent through the qdisc and its counters stay zero); per case the netem root qdisc added by iproute2's `tc`,
//! then the qdiscs dumped over a route netlink socket as `tc qdisc show dev v0` asks, and the netem's
//! RTM_NEWQDISC message printed whole, as hex, on the console.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::Command;

use anyhow::{Context, bail, ensure};
use isthmus_kernel_tests::netem_dumps::{CASES, FAILED_PREFIX, TC_PREFIX, dump_line, dump_request, read_datagram};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto, socket,
};

/// Prints every case's line; false when one could not be captured.
pub fn run() -> bool {
    match capture() {
        Ok(ok) => ok,
        Err(e) => {
            print_line(&format!("{FAILED_PREFIX}setup {e:#}\n"));
            false
        }
    }
}

fn capture() -> anyhow::Result<bool> {
    let version = command("tc", &["-V"])?;
    print_line(&format!("{TC_PREFIX}{}\n", version.trim()));
    command("ip", &["link", "add", "v0", "type", "veth", "peer", "name", "v1"])?;
    command("ip", &["link", "set", "v0", "up"])?;
    let ifindex: i32 = std::fs::read_to_string("/sys/class/net/v0/ifindex")?.trim().parse().context("v0's ifindex")?;
    let mut ok = true;
    for (seq, (case, args)) in (1..).zip(CASES) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "v0", "root"]).output();
        let mut add = vec!["qdisc", "add", "dev", "v0", "root", "handle", "20:", "netem"];
        add.extend(args.split_whitespace());
        match command("tc", &add).and_then(|_| dump_netem(seq, ifindex)) {
            Ok(message) => print_line(&dump_line(case, &message)),
            Err(e) => {
                print_line(&format!("{FAILED_PREFIX}{case} {e:#}\n"));
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// The one netem RTM_NEWQDISC message of a qdisc dump.
fn dump_netem(seq: u32, ifindex: i32) -> anyhow::Result<Vec<u8>> {
    let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    let kernel = NetlinkAddr::new(0, 0);
    bind(fd.as_raw_fd(), &kernel)?;
    sendto(fd.as_raw_fd(), &dump_request(seq, ifindex), &kernel, MsgFlags::empty())?;
    let mut netem = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = recv(fd.as_raw_fd(), &mut buffer, MsgFlags::empty())?;
        ensure!(n > 0, "the socket closed before the dump ended");
        let datagram = read_datagram(&buffer[..n]).map_err(anyhow::Error::msg)?;
        netem.extend(datagram.netem.iter().map(|m| m.to_vec()));
        if datagram.done {
            break;
        }
    }
    match <[Vec<u8>; 1]>::try_from(netem) {
        Ok([message]) => Ok(message),
        Err(found) => bail!("the dump holds {} netem qdiscs, not one", found.len()),
    }
}

/// Runs a command; its standard output, or why it failed.
fn command(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {}: {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One line in a single write, as `protocol::emit` writes, so that nothing else on the console splits it.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}
