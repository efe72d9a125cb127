//! The e2e cluster's vm-provider nodes (e2e/cluster/lib/vm.sh brings them up and down): the first stage each
//! boots into, and the boot itself. A node is one of the rig's stock kernels with this machine's `/` as its
//! read-only root under a tmpfs, so it runs the very binaries the local provider runs; the kernel's command line
//! is the one the rig's own tests boot with (guest.rs), plus the node's shares and network card.
//!
//! ```text
//! isthmus-rig node-initramfs KERNEL ENTRY OUT
//! isthmus-rig node-boot KERNEL ENTRY --initramfs FILE --mem MIB --tap IFNAME --mac MAC --io DIR
//!                       --uml-dir DIR --umid NAME --guest SCRIPT --node-env FILE
//! ```
//! ENTRY is the kernel's cache entry (`isthmus-rig entry KERNEL`). `node-boot` replaces itself with the
//! emulator (or UML), so that the pid its caller recorded is the guest's.

use std::io::BufWriter;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use isthmus_kernel_tests::rig::cpio::Cpio;
use isthmus_kernel_tests::rig::modules::{load_order, node_first_stage};
use isthmus_kernel_tests::rig::rules::Kernel;

use crate::guest::Guest;
use crate::kernels::read_module;

/// The first stage's PID 1: mounts, shares, overlay, then the node's own init.
const INIT: &str = include_str!("node-init.sh");

/// What the first stage runs, each a link to busybox.
const APPLETS: [&str; 9] = ["sh", "mount", "mkdir", "insmod", "switch_root", "cat", "echo", "sleep", "poweroff"];

/// Writes the first stage to `out` (whole or not at all): busybox, the modules the kernel needs to reach this
/// machine's files (with their dependencies, in load order), and /init.
pub fn write_initramfs(kernel: Kernel, entry: &Path, out: &Path) -> anyhow::Result<()> {
    let modules = module_tree(kernel, entry)?;
    let read = |f: &str| std::fs::read_to_string(modules.join(f));
    let dep = read("modules.dep").with_context(|| format!("{}: no modules.dep", modules.display()))?;
    let order = load_order(&dep, &read("modules.builtin").unwrap_or_default(), node_first_stage(kernel))?;
    let partial = out.with_extension("partial");
    let mut cpio = Cpio::new(BufWriter::new(
        std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?,
    ));
    for d in ["bin", "proc", "sys", "dev", "host", "new", "upper", "modules"] {
        cpio.dir(d)?;
    }
    cpio.file("/bin/busybox", true, &std::fs::read("/bin/busybox").context("reading /bin/busybox")?)?;
    for applet in APPLETS {
        cpio.symlink(&format!("/bin/{applet}"), "busybox")?;
    }
    let mut names = String::new();
    for path in order {
        let (name, bytes) = read_module(&modules, &path)?;
        cpio.file(&format!("/modules/{name}"), false, &bytes)?;
        names.push_str(&name);
        names.push('\n');
    }
    cpio.file("/modules/load.order", false, names.as_bytes())?;
    cpio.file("/init", true, INIT.as_bytes())?;
    cpio.finish()?;
    std::fs::rename(&partial, out).with_context(|| format!("writing {}", out.display()))
}

/// `ENTRY/lib/modules/<release>`, after checking that ENTRY is a prepared entry of this kernel.
fn module_tree(kernel: Kernel, entry: &Path) -> anyhow::Result<PathBuf> {
    let binary = match kernel {
        Kernel::Bookworm => "vmlinux",
        Kernel::Sid => "linux.uml",
    };
    ensure!(
        entry.join(binary).is_file(),
        "{}: not a prepared {} entry (no {binary}; `isthmus-rig entry {}` names one)",
        entry.display(),
        kernel.name(),
        kernel.name()
    );
    let release = std::fs::read_to_string(entry.join("release"))
        .with_context(|| format!("{}: no release file", entry.display()))?;
    Ok(entry.join("lib/modules").join(release.trim()))
}

#[derive(Debug)]
pub struct NodeBoot {
    kernel: Kernel,
    entry: PathBuf,
    initramfs: PathBuf,
    mem_mib: u32,
    tap: String,
    mac: String,
    io: PathBuf,
    uml_dir: PathBuf,
    umid: String,
    guest: PathBuf,
    node_env: PathBuf,
}

impl NodeBoot {
    pub fn parse(args: &[String]) -> anyhow::Result<NodeBoot> {
        let [kernel, entry, flags @ ..] = args else { bail!("node-boot needs KERNEL ENTRY and flags") };
        let kernel =
            Kernel::parse(kernel).with_context(|| format!("KERNEL must be bookworm or sid (got {kernel:?})"))?;
        let mut values = std::collections::BTreeMap::new();
        let mut it = flags.iter();
        while let Some(flag) = it.next() {
            let name = flag.strip_prefix("--").with_context(|| format!("unexpected argument {flag:?}"))?;
            ensure!(FLAGS.contains(&name), "unknown flag {flag} (node-boot takes --{})", FLAGS.join(", --"));
            let value = it.next().with_context(|| format!("{flag} needs a value"))?;
            ensure!(values.insert(name, value.as_str()).is_none(), "{flag} given twice");
        }
        let mut take = |name: &str| -> anyhow::Result<String> {
            let value = values.remove(name).with_context(|| format!("--{name} is required"))?;
            // The values end up in QEMU's comma-separated options and on the kernel's command line, split at
            // spaces: neither has a way to carry these characters through.
            ensure!(
                !value.is_empty() && !value.contains(|c: char| c == ',' || c == '"' || c.is_whitespace()),
                "--{name}: {value:?} must be non-empty without commas, quotes or spaces"
            );
            Ok(value.to_owned())
        };
        let boot = NodeBoot {
            kernel,
            entry: entry.into(),
            initramfs: take("initramfs")?.into(),
            mem_mib: take("mem")?.parse().context("--mem: MiB, a whole number")?,
            tap: take("tap")?,
            mac: take("mac")?,
            io: take("io")?.into(),
            uml_dir: take("uml-dir")?.into(),
            umid: take("umid")?,
            guest: take("guest")?.into(),
            node_env: take("node-env")?.into(),
        };
        ensure!(boot.tap.len() <= 15, "--tap: {:?} is longer than an interface name can be (15)", boot.tap);
        ensure!(is_mac(&boot.mac), "--mac: {:?} is not an Ethernet address (xx:xx:xx:xx:xx:xx)", boot.mac);
        Ok(boot)
    }

    /// The guest's environment, read by node-init.sh and then vm-guest.sh.
    fn env(&self) -> Vec<String> {
        vec![
            format!("ISTHMUS_VM_KERNEL={}", self.kernel.name()),
            format!("ISTHMUS_VM_IO={}", self.io.display()),
            format!("ISTHMUS_VM_GUEST={}", self.guest.display()),
            format!("ISTHMUS_VM_NODE_ENV={}", self.node_env.display()),
        ]
    }

    fn command(&self) -> Command {
        let env = self.env();
        let guest = Guest {
            kernel: self.kernel,
            entry: &self.entry,
            initramfs: &self.initramfs,
            mem_mib: self.mem_mib,
            loglevel: 4,
            uml_dir: &self.uml_dir,
            umid: &self.umid,
            interactive: false,
            env: &env,
        };
        let mut c = guest.command();
        let (tap, mac) = (&self.tap, &self.mac);
        match self.kernel {
            Kernel::Bookworm => {
                c.args(["-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"])
                    .arg("-virtfs")
                    .arg(format!("local,path={},mount_tag=io,security_model=none", self.io.display()))
                    .args(["-netdev", &format!("tap,id=n0,ifname={tap},script=no,downscript=no")])
                    .args(["-device", &format!("virtio-net-pci,netdev=n0,mac={mac}")]);
            }
            Kernel::Sid => {
                c.arg(format!("vec0:transport=tap,ifname={tap},mac={mac}"));
            }
        }
        c
    }

    /// Becomes the guest; returns only if it could not.
    pub fn exec(&self) -> anyhow::Error {
        module_tree(self.kernel, &self.entry)
            .err()
            .unwrap_or_else(|| anyhow::Error::new(self.command().exec()).context("starting the guest"))
    }
}

const FLAGS: [&str; 9] = ["initramfs", "mem", "tap", "mac", "io", "uml-dir", "umid", "guest", "node-env"];

fn is_mac(s: &str) -> bool {
    let parts: Vec<&str> = s.split(':').collect();
    parts.len() == 6 && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kernel: &str, extra: &[&str]) -> Vec<String> {
        let mut a = vec![kernel, "/c/entry", "--initramfs", "/c/i.cpio", "--mem", "2560", "--tap", "isth-t1"];
        a.extend(["--mac", "52:54:00:18:00:01", "--io", "/c/n1/io", "--uml-dir", "/c/n1/uml", "--umid", "x-1"]);
        a.extend(["--guest", "/r/vm-guest.sh", "--node-env", "/c/n1/node.env"]);
        a.extend(extra);
        a.into_iter().map(str::to_owned).collect()
    }

    fn argv(c: &Command) -> Vec<String> {
        c.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn a_bookworm_node_gets_the_shares_the_tap_and_its_environment() {
        let c = NodeBoot::parse(&args("bookworm", &[])).unwrap().command();
        assert_eq!(c.get_program(), "qemu-system-x86_64");
        let a = argv(&c).join(" ");
        for part in [
            "-m 2560 -smp 1",
            "-kernel /c/entry/vmlinux -initrd /c/i.cpio",
            "-append console=ttyS0 panic=-1 quiet loglevel=4 ISTHMUS_VM_KERNEL=bookworm ISTHMUS_VM_IO=/c/n1/io \
             ISTHMUS_VM_GUEST=/r/vm-guest.sh ISTHMUS_VM_NODE_ENV=/c/n1/node.env -virtfs",
            "-virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
            "-virtfs local,path=/c/n1/io,mount_tag=io,security_model=none",
            "-netdev tap,id=n0,ifname=isth-t1,script=no,downscript=no",
            "-device virtio-net-pci,netdev=n0,mac=52:54:00:18:00:01",
        ] {
            assert!(a.contains(part), "{part:?} not in {a}");
        }
    }

    #[test]
    fn a_sid_node_is_uml_with_a_vector_tap() {
        let c = NodeBoot::parse(&args("sid", &[])).unwrap().command();
        assert_eq!(c.get_program(), "/c/entry/linux.uml");
        assert_eq!(c.get_current_dir(), Some(Path::new("/c/entry")));
        let a = argv(&c);
        for word in [
            "mem=2560M",
            "initrd=/c/i.cpio",
            "con0=null,fd:1",
            "umid=x-1",
            "uml_dir=/c/n1/uml",
            "vec0:transport=tap,ifname=isth-t1,mac=52:54:00:18:00:01",
            "loglevel=4",
            "ISTHMUS_VM_KERNEL=sid",
            "ISTHMUS_VM_NODE_ENV=/c/n1/node.env",
        ] {
            assert!(a.iter().any(|w| w == word), "{word:?} not in {a:?}");
        }
    }

    #[test]
    fn bad_flags_are_named() {
        let err = |a: Vec<String>| format!("{:#}", NodeBoot::parse(&a).unwrap_err());
        assert!(err(args("jessie", &[])).contains("KERNEL must be bookworm or sid"));
        assert!(err(args("sid", &["--mem", "1"])).contains("--mem given twice"));
        assert!(err(args("sid", &["--cpus", "2"])).contains("unknown flag --cpus"));
        assert!(err(args("sid", &["--verbose"])).contains("unknown flag --verbose"));
        let mut a = args("sid", &[]);
        a.truncate(a.len() - 2);
        assert!(err(a).contains("--node-env is required"));
        let with = |flag: &str, value: &str| {
            let mut a = args("bookworm", &[]);
            let i = a.iter().position(|x| x == flag).unwrap();
            a[i + 1] = value.to_owned();
            err(a)
        };
        assert!(with("--io", "/a,b").contains("--io: \"/a,b\" must be non-empty without commas"));
        assert!(with("--guest", "/a b").contains("--guest"));
        assert!(with("--mem", "lots").contains("--mem: MiB"));
        assert!(with("--tap", "a-very-long-interface").contains("longer than an interface name"));
        assert!(with("--mac", "52:54:00:18:00").contains("--mac"));
    }
}
