//! apt, as the rig uses it: the system's apt for the host's own tools, and a private configuration under the
//! cache for the guests' packages (bookworm, trixie, sid and their security suites), so the system's sources,
//! lists and status are never written. apt verifies every index against its suite's signed `InRelease` and
//! every download against its index's SHA256; the rig checks the hash once more before unpacking.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use isthmus_kernel_tests::rig::packages::Index;
use isthmus_kernel_tests::rig::rules::{Kernel, Resolved};

use crate::say;

const SOURCES: &str = "\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm trixie sid
Components: main
Targets: Packages
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security trixie-security
Components: main
Targets: Packages
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

pub struct PrivateApt {
    dir: PathBuf,
}

impl PrivateApt {
    pub fn new(cache: &Path) -> PrivateApt {
        PrivateApt { dir: cache.join("apt") }
    }

    fn command(&self) -> Command {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut c = Command::new("apt-get");
        for (k, v) in [
            ("Dir::Etc::SourceList", "/dev/null".to_owned()),
            ("Dir::Etc::SourceParts", d("sources")),
            ("Dir::State::Lists", d("lists")),
            ("Dir::Cache", d("cache")),
            ("Dir::Etc::Preferences", "/dev/null".to_owned()),
            ("Dir::Etc::PreferencesParts", d("preferences")),
            ("Dir::State::status", "/var/lib/dpkg/status".to_owned()),
            ("APT::Sandbox::User", "root".to_owned()),
            ("Acquire::Languages", "none".to_owned()),
        ] {
            c.arg("-o").arg(format!("{k}={v}"));
        }
        c
    }

    /// `apt-get update` into the private lists, then the verified indexes, reduced to what the rules read.
    pub fn index(&self) -> anyhow::Result<Index> {
        for sub in ["sources", "preferences", "lists/partial", "cache/archives/partial"] {
            std::fs::create_dir_all(self.dir.join(sub))?;
        }
        std::fs::write(self.dir.join("sources/rig.sources"), SOURCES)?;
        say("apt-get update (private lists under the cache)");
        let log = self.dir.join("update.log");
        // apt-get update exits 0 when fetches fail (stale or no lists): an archive it could not read must say so
        let out = self.command().args(["update", "-q", "--error-on=any"]).output().context("running apt-get")?;
        std::fs::write(&log, [out.stdout, out.stderr].concat())?;
        ensure!(out.status.success(), "private apt-get update failed ({}), see {}", out.status, log.display());
        let targets = self
            .command()
            .args(["indextargets", "--format", "$(FILENAME) $(CODENAME)", "Identifier: Packages"])
            .output()
            .context("running apt-get indextargets")?;
        ensure!(targets.status.success(), "apt-get indextargets failed: {}", String::from_utf8_lossy(&targets.stderr));
        let mut index = Index::default();
        for line in String::from_utf8_lossy(&targets.stdout).lines() {
            let Some((file, suite)) = line.rsplit_once(' ') else { continue };
            // apt stores lists compressed or not, as configured; apt-helper reads either
            let text = Command::new("/usr/lib/apt/apt-helper").args(["cat-file", file]).output()?;
            ensure!(text.status.success(), "apt-helper cat-file {file} failed");
            index.add_suite(suite, &String::from_utf8_lossy(&text.stdout), Kernel::wanted)?;
        }
        Ok(index)
    }

    /// Downloads the resolved package into `dir` and checks its SHA256 against the index's.
    pub fn download(&self, package: &Resolved, dir: &Path) -> anyhow::Result<PathBuf> {
        say(&format!("downloading {} {} from {}", package.package, package.version, package.suite));
        let out = self
            .command()
            .current_dir(dir)
            .args(["download", "-q", &format!("{}={}", package.package, package.version)])
            .output()
            .context("running apt-get download")?;
        if !out.status.success() {
            bail!(
                "apt-get download {}={} failed: {}",
                package.package,
                package.version,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let deb = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                name.starts_with(&format!("{}_", package.package)) && name.ends_with(".deb")
            })
            .with_context(|| format!("apt-get download left no {} .deb in {}", package.package, dir.display()))?;
        let got = sha256_file(&deb)?;
        ensure!(
            got == package.sha256,
            "{}: sha256 {got} is not the index's {} (the download is corrupt or the archive changed under us)",
            deb.display(),
            package.sha256
        );
        Ok(deb)
    }
}

pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The host's tools, installed with the system's apt where missing (one `apt-get update` if the first try
/// fails on stale lists).
pub fn ensure_host_tools(log_dir: &Path) -> anyhow::Result<()> {
    let on_path =
        |cmd: &str| std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()));
    let mut missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("depmod", "kmod"),
        ("xz", "xz-utils"),
        ("zstd", "zstd"),
        ("dpkg-deb", "dpkg"),
    ]
    .into_iter()
    .filter(|(cmd, _)| !on_path(cmd))
    .map(|(_, pkg)| pkg)
    .collect();
    if !Path::new("/usr/sbin/ip").exists() || !Path::new("/usr/sbin/tc").exists() {
        missing.push("iproute2");
    }
    // the static test binary links against glibc's static libraries
    if !Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists() {
        missing.push("libc6-dev");
    }
    if !Path::new("/usr/share/keyrings/debian-archive-keyring.gpg").exists() {
        missing.push("debian-archive-keyring");
    }
    // the guest's userland is busybox: it must be the static build (no libraries in the initramfs for it)
    let busybox_static = std::fs::read("/bin/busybox")
        .ok()
        .is_some_and(|b| isthmus_kernel_tests::rig::elf::is_static(&b).unwrap_or(false));
    if !busybox_static {
        missing.push("busybox-static");
    }
    if missing.is_empty() {
        return Ok(());
    }
    say(&format!("installing host tools: {}", missing.join(" ")));
    std::fs::create_dir_all(log_dir)?;
    let log = log_dir.join("apt-install.log");
    let install = |log_append: bool| -> anyhow::Result<bool> {
        let out = Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .output()?;
        append(&log, &out.stdout, &out.stderr, log_append)?;
        Ok(out.status.success())
    };
    if install(false)? {
        return Ok(());
    }
    let out = Command::new("apt-get").args(["-o", "DPkg::Lock::Timeout=300", "update", "-q"]).output()?;
    append(&log, &out.stdout, &out.stderr, true)?;
    ensure!(install(true)?, "apt-get install {} failed, see {}", missing.join(" "), log.display());
    Ok(())
}

fn append(log: &Path, stdout: &[u8], stderr: &[u8], append: bool) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).write(true).append(append).truncate(!append).open(log)?;
    f.write_all(stdout)?;
    f.write_all(stderr)
}
