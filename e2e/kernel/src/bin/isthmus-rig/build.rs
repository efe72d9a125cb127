//! The guest's test binary: built statically (the guest has no libraries for it) into its own target
//! directory, shared with e2e/images/build, because its RUSTFLAGS differ from the host builds'.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, ensure};
use isthmus_kernel_tests::rig::elf;

use crate::say;

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

pub fn built_binary(target: &Path) -> anyhow::Result<PathBuf> {
    let bin = target.join("static").join(TRIPLE).join("release/isthmus-kernel-tests");
    ensure!(bin.is_file(), "no test binary at {} (run: e2e/kernel/rig build)", bin.display());
    Ok(bin)
}

pub fn static_test_binary(target: &Path) -> anyhow::Result<PathBuf> {
    let static_target = target.join("static");
    say(&format!("building the static test binary (target dir {})", static_target.display()));
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .args(["build", "-q", "--locked", "--release", "-p", "isthmus-kernel-tests", "--bin", "isthmus-kernel-tests"])
        .args(["--target", TRIPLE, "--target-dir"])
        .arg(&static_target)
        .status()
        .context("running cargo")?;
    ensure!(status.success(), "building the static test binary failed");
    let bin = built_binary(target)?;
    ensure!(elf::is_static(&std::fs::read(&bin)?)?, "{} is not statically linked", bin.display());
    Ok(bin)
}

/// The tests (or with `bench`, the benchmarks) the binary would run for this selection, one name each: what every
/// kernel must report.
pub fn list(bin: &Path, tests: Option<&str>, bench: bool) -> anyhow::Result<Vec<String>> {
    let mut c = Command::new(bin);
    c.arg("--list");
    if bench {
        c.arg("--bench");
    }
    if let Some(t) = tests {
        c.args(["--test", t]);
    }
    let out = c.output()?;
    ensure!(
        out.status.success(),
        "test selection {tests:?} matches nothing: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
}
