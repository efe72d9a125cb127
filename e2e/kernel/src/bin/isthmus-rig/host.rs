//! The userspace datapath's fidelity tests on this machine's own kernel, beside the guests: the kernel CI runs
//! on has no netem, which is what that datapath is for, so its column of the parity table is measured here
//! too. The same static test binary runs natively (its tests make their own namespaces and clean them up),
//! writing the same protocol lines the guests write on their consoles.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use isthmus_kernel_tests::protocol::{EXIT_PREFIX, USERSPACE_SUFFIX};
use isthmus_kernel_tests::rig::report::VmStatus;

use crate::boot::supervise;

/// The expected tests the host runs: the userspace datapath's.
pub fn tests(expected: &[String]) -> Vec<String> {
    expected.iter().filter(|t| t.ends_with(USERSPACE_SUFFIX)).cloned().collect()
}

/// Runs `tests` natively; returns the status and the output file (read as a console).
pub fn run(
    bin: &Path,
    tests: &[String],
    bench: bool,
    run_dir: &Path,
    timeout: Duration,
) -> anyhow::Result<(VmStatus, PathBuf)> {
    let release = nix::sys::utsname::uname()?.release().to_string_lossy().into_owned();
    let label = format!("host-{release}");
    let console = run_dir.join("host.console");
    let out = File::create(&console)?;
    let mut cmd = Command::new(bin);
    cmd.args(["--kernel", &label, "--backend", "native", "--test", &tests.join(",")])
        .args(bench.then_some("--bench"))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    let (rc, wall_s, host_load) = supervise(&mut cmd, timeout)?;
    // what a guest's /init adds after the binary, so that the report reads both alike
    if rc != 124 && rc != 137 {
        writeln!(std::fs::OpenOptions::new().append(true).open(&console)?, "{EXIT_PREFIX}{rc}")?;
    }
    Ok((VmStatus { kernel: label, backend: "native".into(), host_load, vm_rc: rc, wall_s }, console))
}
