//! The guest's test binary: built statically (the guest has no libraries for it) by e2e/images/static-build,
//! together with the images' binaries, so that the crates they share are compiled once with one set of features
//! (its target directory is `$CARGO_TARGET_DIR/static`: its RUSTFLAGS differ from the host builds').

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/static-build");
    say(&format!("building the static test binary with the images' binaries ({})", script.display()));
    let out = Command::new(&script)
        .arg("amd64")
        .env("CARGO_TARGET_DIR", target)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(out.status.success(), "building the static test binary failed");
    let bin = built_binary(target)?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    ensure!(
        bin.parent() == Some(Path::new(&dir)),
        "{} built into {dir}, not beside {}",
        script.display(),
        bin.display()
    );
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
