//! A guest's command line, shared by the rig's test boots (boot.rs) and the e2e cluster's nodes (node.rs):
//! bookworm's kernel under QEMU's full emulation (TCG, since KVM runs no ordinary guest here), sid's User-Mode
//! Linux as an ordinary process. What differs between the two uses (a debug-exit port, shares and a network
//! card, CPU pinning) the caller adds to the command this returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use isthmus_kernel_tests::rig::rules::Kernel;

pub struct Guest<'a> {
    pub kernel: Kernel,
    /// The prepared kernel entry: `vmlinux`, or `linux.uml` with the `ld.so` it is patched to use.
    pub entry: &'a Path,
    pub initramfs: &'a Path,
    pub mem_mib: u32,
    /// The console's log level: the rig reads its tests' lines from the console, so it keeps the kernel quiet.
    pub loglevel: u8,
    /// UML's directory for its instance files (created here), and the name of this instance in it.
    pub uml_dir: &'a Path,
    pub umid: &'a str,
    /// UML's console reads this terminal too (the rig's shell).
    pub interactive: bool,
    /// Kernel command-line words the kernel does not know, which become /init's environment.
    pub env: &'a [String],
}

impl Guest<'_> {
    pub fn command(&self) -> Command {
        let quiet = format!("quiet loglevel={}", self.loglevel);
        match self.kernel {
            Kernel::Bookworm => {
                let mut c = Command::new("qemu-system-x86_64");
                c.args(["-accel", "tcg", "-cpu", "max", "-m", &self.mem_mib.to_string(), "-smp", "1"])
                    .args(["-nodefaults", "-no-reboot", "-display", "none", "-monitor", "none", "-serial", "stdio"])
                    .arg("-kernel")
                    .arg(self.entry.join("vmlinux"))
                    .arg("-initrd")
                    .arg(self.initramfs)
                    .arg("-append")
                    .arg(format!("console=ttyS0 panic=-1 {quiet} {}", self.env.join(" ")));
                c
            }
            Kernel::Sid => {
                let _ = std::fs::create_dir_all(self.uml_dir);
                // UML's memory is a file it unlinks right after creating it; on tmpfs it never reaches the disk
                let memdir = if is_tmpfs("/dev/shm") { PathBuf::from("/dev/shm") } else { self.uml_dir.to_owned() };
                // cwd = the entry: the patched ELF interpreter is ./ld.so
                let mut c = Command::new(self.entry.join("linux.uml"));
                c.current_dir(self.entry)
                    .env("LD_LIBRARY_PATH", self.entry)
                    .env("TMPDIR", memdir)
                    .arg(format!("mem={}M", self.mem_mib))
                    .arg(format!("initrd={}", self.initramfs.display()))
                    .arg(format!("con0={}", if self.interactive { "fd:0,fd:1" } else { "null,fd:1" }))
                    .args(["con=null", "ssl=null"])
                    .args(quiet.split(' '))
                    .arg(format!("uml_dir={}", self.uml_dir.display()))
                    .arg(format!("umid={}", self.umid))
                    .args(self.env);
                c
            }
        }
    }
}

fn is_tmpfs(path: &str) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}
