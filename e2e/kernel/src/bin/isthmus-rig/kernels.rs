//! The cache of prepared kernels: `$CACHE/kernel/<kernel>/<entry>/`, one entry per set of resolved packages,
//! each with a `manifest.json` (the packages, versions and hashes it was made from, written last: an entry
//! without one is incomplete and ignored) and what the boot needs: the kernel, its modules, the base initramfs.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};
use isthmus_kernel_tests::rig::cpio::Cpio;
use isthmus_kernel_tests::rig::elf;
use isthmus_kernel_tests::rig::modules::{MODULES, load_order};
use isthmus_kernel_tests::rig::rules::{Kernel, Resolved, RuleId};
use serde::{Deserialize, Serialize};

use crate::apt::{PrivateApt, hex};
use crate::say;

/// What an entry holds; entries of another layout are ignored (and prepared again).
/// 2: the kernel's whole module tree under `lib/modules/<release>/`, for the e2e cluster's nodes.
const LAYOUT: u32 = 2;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    #[serde(default)]
    layout: u32,
    kernel: Kernel,
    packages: Vec<Resolved>,
}

/// A prepared entry.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub dir: PathBuf,
    pub packages: Vec<Resolved>,
}

impl Prepared {
    /// `uname -r` of the prepared kernel.
    pub fn release(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("release"))?.trim().to_owned())
    }
}

pub fn kernel_dir(cache: &Path, kernel: Kernel) -> PathBuf {
    cache.join(kernel.name())
}

/// The complete entries of a kernel, in no particular order.
pub fn list(cache: &Path, kernel: Kernel) -> Vec<Prepared> {
    let Ok(entries) = std::fs::read_dir(kernel_dir(cache, kernel)) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("manifest.json")).ok()?;
            let m: Manifest = serde_json::from_str(&text).ok()?;
            (m.kernel == kernel && m.layout == LAYOUT).then(|| Prepared { dir: e.path(), packages: m.packages })
        })
        .collect()
}

/// Entries an older rig prepared are never chosen again: they only take space. That includes the layout of
/// the shell rig before this one (`bookworm-<version>/`, `uml-<version>-libc<version>/`, `debs/` at the top).
fn remove_old_layouts(dir: &Path) {
    if let Some(top) = dir.parent()
        && let Ok(entries) = std::fs::read_dir(top)
    {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "debs" || (name.starts_with("bookworm-") || name.starts_with("uml-")) && e.path().is_dir() {
                say(&format!("removing {} (prepared by an older rig)", e.path().display()));
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok) {
        let manifest = std::fs::read_to_string(e.path().join("manifest.json")).ok();
        let layout = manifest.and_then(|t| serde_json::from_str::<Manifest>(&t).ok()).map(|m| m.layout);
        if layout.is_some_and(|l| l != LAYOUT) {
            say(&format!("removing {} (prepared by an older rig)", e.path().display()));
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Downloads and unpacks the packages into a new entry (built beside it and renamed into place, so a run
/// that dies half-way leaves nothing that looks complete).
pub fn prepare(cache: &Path, kernel: Kernel, packages: &[Resolved], apt: &PrivateApt) -> anyhow::Result<Prepared> {
    let name = packages.iter().map(|p| format!("{}_{}", p.package, p.version)).collect::<Vec<_>>().join("+");
    let dir = kernel_dir(cache, kernel).join(name.replace([':', '/'], "%"));
    let work = TempDir::new(&kernel_dir(cache, kernel), "prepare")?;
    let work = work.path();
    let debs = work.join("debs");
    std::fs::create_dir_all(&debs)?;
    let staged = work.join("entry");
    std::fs::create_dir_all(&staged)?;
    let mut unpacked = Vec::new();
    for p in packages {
        let deb = apt.download(p, &debs)?;
        let x = work.join(&p.package);
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x))?;
        unpacked.push((p.rule, x));
    }
    let find = |rule| unpacked.iter().find(|(r, _)| *r == rule).map(|(_, x)| x.as_path());
    match kernel {
        Kernel::Bookworm => unpack_bookworm(find(RuleId::BookwormKernel).context("no kernel package")?, &staged)?,
        Kernel::Sid => unpack_uml(
            find(RuleId::SidUml).context("no user-mode-linux package")?,
            find(RuleId::UmlLibc).context("no libc6 package")?,
            &staged,
        )?,
    }
    let manifest = Manifest { layout: LAYOUT, kernel, packages: packages.to_vec() };
    std::fs::write(staged.join("manifest.json"), serde_json::to_string_pretty(&manifest)?)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&staged, &dir)?;
    remove_old_layouts(&kernel_dir(cache, kernel));
    Ok(Prepared { dir, packages: packages.to_vec() })
}

fn unpack_bookworm(x: &Path, out: &Path) -> anyhow::Result<()> {
    let release = only_child(&x.join("lib/modules"))?;
    say(&format!("unpacking bookworm's kernel {release}"));
    // the .deb ships no modules.dep
    run(Command::new("depmod").arg("-b").arg(x).arg(&release))?;
    collect_modules(&x.join("lib/modules").join(&release), out)?;
    keep_module_tree(&x.join("lib/modules").join(&release), out, &release)?;
    // PVH entry of the uncompressed vmlinux: skips the xz decompressor, which is slow under TCG
    let vmlinuz = std::fs::read(x.join("boot").join(format!("vmlinuz-{release}")))?;
    let magic = b"\xfd7zXZ\x00";
    let at = vmlinuz.windows(magic.len()).position(|w| w == magic).context("no xz payload in the vmlinuz")?;
    let vmlinux = std::fs::File::create(out.join("vmlinux"))?;
    let mut xz = Command::new("xz").args(["-dc", "--single-stream"]).stdin(Stdio::piped()).stdout(vmlinux).spawn()?;
    // xz stops reading after its stream; a broken pipe on the rest is expected, only xz's status counts
    let _ = xz.stdin.take().expect("piped").write_all(&vmlinuz[at..]);
    ensure!(xz.wait()?.success(), "xz could not decompress the vmlinuz payload");
    std::fs::write(out.join("release"), &release)?;
    Ok(())
}

fn unpack_uml(uml: &Path, libc: &Path, out: &Path) -> anyhow::Result<()> {
    let lib = libc.join("usr/lib/x86_64-linux-gnu");
    std::fs::copy(lib.join("libc.so.6"), out.join("libc.so.6"))?;
    std::fs::copy(lib.join("ld-linux-x86-64.so.2"), out.join("ld.so"))?;
    // linux.uml needs a newer glibc than the host's. Its ELF interpreter is rewritten in place to the relative
    // path ./ld.so (resolved against the working directory, which the boot sets to this entry), so the newer
    // loader lives only in the cache.
    let mut binary = std::fs::read(uml.join("usr/bin/linux.uml"))?;
    elf::set_interpreter(&mut binary, "./ld.so").context("linux.uml")?;
    write_executable(&out.join("linux.uml"), &binary)?;
    let modules = uml.join("usr/lib/uml/modules");
    let release = only_child(&modules)?;
    say(&format!("unpacking sid's User-Mode Linux {release}"));
    collect_modules(&modules.join(&release), out)?;
    keep_module_tree(&modules.join(&release), out, &release)?;
    std::fs::write(out.join("release"), &release)?;
    Ok(())
}

/// The modules the guest loads, uncompressed, and `load.order` (file names, dependencies first).
fn collect_modules(mdir: &Path, out: &Path) -> anyhow::Result<()> {
    let read = |f: &str| std::fs::read_to_string(mdir.join(f)).unwrap_or_default();
    let order = load_order(&read("modules.dep"), &read("modules.builtin"), &MODULES)?;
    let dest = out.join("modules");
    std::fs::create_dir_all(&dest)?;
    let mut names = String::new();
    for path in order {
        let (name, bytes) = read_module(mdir, &path)?;
        std::fs::write(dest.join(&name), bytes)?;
        names.push_str(&name);
        names.push('\n');
    }
    std::fs::write(dest.join("load.order"), names)?;
    Ok(())
}

/// A module's file name without its compression suffix, and its bytes uncompressed (insmod in busybox reads
/// no compressed module). `path` is relative to `mdir`, as `modules.dep` writes it.
pub fn read_module(mdir: &Path, path: &str) -> anyhow::Result<(String, Vec<u8>)> {
    let file = path.rsplit('/').next().unwrap_or(path);
    let (name, decompress) = match file.rsplit_once('.') {
        Some((stem, "xz")) => (stem, Some("xz")),
        Some((stem, "zst")) => (stem, Some("zstd")),
        Some((stem, "gz")) => (stem, Some("gzip")),
        _ => (file, None),
    };
    let bytes = match decompress {
        Some(tool) => {
            let o = Command::new(tool).arg("-dc").arg(mdir.join(path)).output()?;
            ensure!(o.status.success(), "{tool} -dc {path} failed");
            o.stdout
        }
        None => std::fs::read(mdir.join(path)).with_context(|| format!("reading {}", mdir.join(path).display()))?,
    };
    Ok((name.to_owned(), bytes))
}

/// The whole module tree with its `modules.dep`, at `lib/modules/<release>`: the e2e cluster's nodes boot this
/// kernel with the host's userland and load what containerd, the CNI and kube-proxy ask for with `modprobe`.
fn keep_module_tree(tree: &Path, out: &Path, release: &str) -> anyhow::Result<()> {
    let dest = out.join("lib/modules");
    std::fs::create_dir_all(&dest)?;
    std::fs::rename(tree, dest.join(release)).with_context(|| format!("moving {}", tree.display()))
}

const HOST_USERLAND: [&str; 3] = ["/bin/busybox", "/usr/sbin/ip", "/usr/sbin/tc"];

/// The userland both guests share, cached per entry as `base.cpio`: static busybox, iproute2 (ip and tc with
/// their libraries) for the tests' independent checks, and the entry's modules. It is rebuilt when the
/// host's busybox or iproute2 change.
pub fn base_initramfs(entry: &Prepared) -> anyhow::Result<PathBuf> {
    let path = entry.dir.join("base.cpio");
    let mut key = Vec::new();
    for f in HOST_USERLAND {
        key.extend(std::fs::read(f).with_context(|| format!("reading {f}"))?);
    }
    key.extend(std::fs::read(entry.dir.join("modules/load.order"))?);
    let key = hex(ring::digest::digest(&ring::digest::SHA256, &key).as_ref());
    if path.exists() && std::fs::read_to_string(entry.dir.join("base.key")).is_ok_and(|k| k == key) {
        return Ok(path);
    }
    let mut cpio = Cpio::new(std::io::BufWriter::new(std::fs::File::create(&path)?));
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "run", "tmp", "etc"] {
        cpio.dir(d)?;
    }
    cpio.char_device("/dev/console", 5, 1)?;
    cpio.file("/bin/busybox", true, &std::fs::read("/bin/busybox")?)?;
    let applets = Command::new("/bin/busybox").arg("--list").output()?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        // busybox's ip and tc would shadow iproute2's
        if !matches!(applet, "busybox" | "ip" | "tc" | "") {
            cpio.symlink(&format!("/bin/{applet}"), "busybox")?;
        }
    }
    let mut libs = Vec::new();
    for b in &HOST_USERLAND[1..] {
        cpio.file(b, true, &std::fs::read(b)?)?;
        libs.extend(shared_libraries(b)?);
    }
    libs.sort();
    libs.dedup();
    for l in libs {
        cpio.file(&l, true, &std::fs::read(&l)?)?;
    }
    if let Ok(dists) = std::fs::read_dir("/usr/lib/tc") {
        for d in dists.filter_map(Result::ok).filter(|d| d.path().extension().is_some_and(|e| e == "dist")) {
            cpio.file(&format!("/usr/lib/tc/{}", d.file_name().to_string_lossy()), false, &std::fs::read(d.path())?)?;
        }
    }
    for m in std::fs::read_dir(entry.dir.join("modules"))?.filter_map(Result::ok) {
        cpio.file(&format!("/modules/{}", m.file_name().to_string_lossy()), false, &std::fs::read(m.path())?)?;
    }
    cpio.finish()?;
    std::fs::write(entry.dir.join("base.key"), key)?;
    Ok(path)
}

/// What `ldd` says a dynamic executable loads (its libraries and its interpreter).
fn shared_libraries(binary: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new("ldd").arg(binary).output()?;
    ensure!(out.status.success(), "ldd {binary} failed");
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| match l.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => l.split_whitespace().next().filter(|p| p.starts_with('/')),
        })
        .filter(|p| p.starts_with('/'))
        .map(str::to_owned)
        .collect())
}

fn only_child(dir: &Path) -> anyhow::Result<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("expected exactly one entry in {}, found {names:?}", dir.display()),
    }
}

fn write_executable(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(out.status.success(), "{cmd:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// A fresh directory under `parent`, named after the job and this process, removed when dropped (also when
/// the job fails half-way).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(parent: &Path, job: &str) -> anyhow::Result<TempDir> {
        std::fs::create_dir_all(parent)?;
        for n in 0..1000 {
            let dir = parent.join(format!(".{job}.{}.{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(TempDir(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e.into()),
            }
        }
        bail!("no free temporary directory name under {}", parent.display())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
