//! Booting a test guest (its command line is guest.rs's), with the console captured to a file, a time limit,
//! and the whole process group killed when it is reached, when the rig is interrupted, or when the rig itself
//! fails.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use isthmus_kernel_tests::rig::cpio::Cpio;
use isthmus_kernel_tests::rig::report::VmStatus;
use isthmus_kernel_tests::rig::rules::Kernel;
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::unistd::Pid;

use crate::guest::Guest;
use crate::kernels::{Prepared, base_initramfs};

/// PID 1 of the guest: mount, load the datapath's modules, run the tests, report, power off.
const INIT: &str = r#"#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev 2>/dev/null; mount -t tmpfs run /run
mount -t tmpfs tmp /tmp; mkdir -p /run/netns
for m in $(cat /modules/load.order); do
  out=$(insmod "/modules/$m" 2>&1) || echo "ISTHMUS-LOG insmod $m failed: $out"
done
/usr/sbin/ip link set lo up
if [ -n "$ISTHMUS_SHELL" ]; then setsid cttyhack sh; rc=0
else
  /isthmus-kernel-tests --kernel "$ISTHMUS_KERNEL" --backend "$ISTHMUS_BACKEND" ${ISTHMUS_TESTS:+--test "$ISTHMUS_TESTS"} ${ISTHMUS_MODE:+--$ISTHMUS_MODE}
  rc=$?
fi
echo "ISTHMUS-EXIT $rc"
# QEMU: isa-debug-exit makes the status qemu's exit code ((rc << 1) | 1); UML has no /dev/port.
[ -e /dev/port ] && printf "\\$(printf %o "$rc")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
poweroff -f
"#;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the running VM (its own process group does not get the terminal's signal) and then
/// the rig, whose guards remove the run's files.
pub fn install_interrupt_handler() {
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { signal(s, SigHandler::Handler(on_signal)) }.expect("installing a signal handler");
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// What the guest binary does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Tests,
    /// The benchmark instead of the tests (`--bench`).
    Bench,
    /// The kernel's netem dumps for the datapaths' golden test (`--capture-netem-dumps`, src/capture.rs).
    NetemDumps,
}

impl Mode {
    /// The guest binary's flag, without its `--`.
    fn flag(self) -> Option<&'static str> {
        match self {
            Mode::Tests => None,
            Mode::Bench => Some("bench"),
            Mode::NetemDumps => Some("capture-netem-dumps"),
        }
    }
}

pub struct Boot<'a> {
    pub kernel: Kernel,
    pub entry: &'a Prepared,
    pub test_binary: Option<&'a Path>,
    /// `--test` for the guest binary.
    pub tests: Option<&'a str>,
    pub mode: Mode,
    pub run_dir: &'a Path,
    pub timeout: Duration,
    /// An interactive shell on this terminal instead of the tests.
    pub shell: bool,
}

impl Boot<'_> {
    pub fn label(&self) -> anyhow::Result<String> {
        let release = self.entry.release()?;
        Ok(match self.kernel {
            Kernel::Bookworm => format!("bookworm-{release}"),
            Kernel::Sid => format!("sid-uml-{release}"),
        })
    }

    fn backend(&self) -> &'static str {
        match self.kernel {
            Kernel::Bookworm => "qemu-tcg",
            Kernel::Sid => "uml",
        }
    }

    /// The cached base archive followed by one with /init and the test binary.
    fn initramfs(&self) -> anyhow::Result<PathBuf> {
        let path = self.run_dir.join(format!("{}.cpio", self.kernel.name()));
        std::fs::copy(base_initramfs(self.entry)?, &path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        let mut cpio = Cpio::new(std::io::BufWriter::new(file));
        cpio.file("/init", true, INIT.as_bytes())?;
        if let Some(bin) = self.test_binary {
            cpio.file("/isthmus-kernel-tests", true, &std::fs::read(bin).context("reading the test binary")?)?;
        }
        cpio.finish()?;
        Ok(path)
    }

    /// Kernel command-line words that become /init's environment.
    fn guest_env(&self, label: &str) -> Vec<String> {
        let mut env = vec![format!("ISTHMUS_KERNEL={label}"), format!("ISTHMUS_BACKEND={}", self.backend())];
        env.extend(self.tests.map(|t| format!("ISTHMUS_TESTS={t}")));
        env.extend(self.mode.flag().map(|f| format!("ISTHMUS_MODE={f}")));
        env.extend(self.shell.then(|| "ISTHMUS_SHELL=1".to_owned()));
        env
    }

    fn command(&self, label: &str, initramfs: &Path) -> Command {
        let uml_dir = self.run_dir.join("uml");
        let env = self.guest_env(label);
        let guest = Guest {
            kernel: self.kernel,
            entry: &self.entry.dir,
            initramfs,
            mem_mib: 512,
            loglevel: 1,
            uml_dir: &uml_dir,
            umid: "rig",
            interactive: self.shell,
            env: &env,
        };
        let mut c = guest.command();
        match self.kernel {
            Kernel::Bookworm => {
                c.args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"]);
            }
            Kernel::Sid => pin_to_one_cpu(&mut c),
        }
        c
    }

    /// Boots, waits (at most `timeout`), and returns the status and the console file.
    pub fn run(&self) -> anyhow::Result<(VmStatus, PathBuf)> {
        let label = self.label()?;
        let initramfs = self.initramfs()?;
        let console = self.run_dir.join(format!("{}.console", self.kernel.name()));
        let mut cmd = self.command(&label, &initramfs);
        if self.shell {
            cmd.stdin(Stdio::inherit()).stdout(Stdio::inherit()).stderr(Stdio::inherit());
        } else {
            let out = File::create(&console)?;
            cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
        }
        let (vm_rc, wall_s, host_load) = supervise(&mut cmd, self.timeout)?;
        let status = VmStatus { kernel: label, backend: self.backend().into(), host_load, vm_rc, wall_s };
        Ok((status, console))
    }
}

/// Runs `cmd` in its own process group (set by the caller) for at most `timeout`; the whole group is killed at
/// the end, on timeout or when the rig is interrupted. Returns the exit status (124/137 as timeout(1) reports a
/// TERM or a KILL), the wall time and the host's load before..after.
pub fn supervise(cmd: &mut Command, timeout: Duration) -> anyhow::Result<(i32, f64, String)> {
    let load = host_load();
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let group = Pid::from_raw(-(child.id() as i32));
    let mut rc = None;
    while rc.is_none() {
        if let Some(status) = child.try_wait()? {
            rc = Some(status.code().unwrap_or(128 + 9));
        } else if start.elapsed() > timeout || interrupted() {
            let _ = kill(group, Signal::SIGTERM);
            let grace = Instant::now();
            while child.try_wait()?.is_none() && grace.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let killed = child.try_wait()?.is_none();
            let _ = kill(group, Signal::SIGKILL);
            let _ = child.wait();
            rc = Some(if killed { 137 } else { 124 });
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // UML's helpers may outlive its main process for a moment
    let _ = kill(group, Signal::SIGKILL);
    Ok((rc.unwrap_or_default(), start.elapsed().as_secs_f64(), format!("{load}..{}", host_load())))
}

/// Keeps the process and everything it forks on one host CPU: the last of those the rig may use.
///
/// Why: UML runs the guest's kernel and each guest process as host processes that hand the CPU to each other at
/// every guest system call and page fault. Left to the host's scheduler, the two sides of a hand-off often sit
/// on different CPUs, and each hand-off then wakes the other CPU; in a virtual machine (this one is a
/// Firecracker guest) that wake-up is an exit to its hypervisor, and the guest's system calls slowed by up to
/// ten times, for seconds at a time, at random. Measured 2026-11-29 with `e2e/kernel/rig run --kernel sid` on
/// a quiet host: unpinned, two runs of the suite needed 2 and 7 retries and failed a test each (the flood test's
/// sender managed 5,456 datagrams in 10 s where the schedule asks 60,000; a 2,000 a second stream through the
/// userspace datapath lost 1–6 % to capture overruns); under `taskset -c 1`, two runs passed every test with
/// no retry (59,998 datagrams). One emulated CPU needs no more than one host CPU.
fn pin_to_one_cpu(command: &mut Command) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else { return };
    let Some(last) = (0..CpuSet::count()).rev().find(|&cpu| allowed.is_set(cpu).unwrap_or(false)) else { return };
    let mut one = CpuSet::new();
    if one.set(last).is_err() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec and makes one system call (sched_setaffinity),
    // which is async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        command.pre_exec(move || sched_setaffinity(Pid::from_raw(0), &one).map_err(std::io::Error::from));
    }
}

/// The host's 1-minute load average: the guests' timing depends on it.
fn host_load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
