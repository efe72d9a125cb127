//! isthmus-rig: the host side of the stock-kernel rig (e2e/kernel/README.md). It resolves and caches the
//! Debian kernels by rule, builds the static test binary, boots each kernel with it, reads the results back
//! from the consoles, gives failed tests one fresh boot, and writes the report.
//!
//! ```text
//! isthmus-rig [all] [--kernel bookworm|sid|host]... [--test NAME[,NAME…]] [--parallel] [--rerun-failed] [--refresh]
//! isthmus-rig bench [--kernel …]… the datapaths' benchmark side by side in each kernel (src/tests/bench.rs)
//! isthmus-rig capture-netem-dumps  both kernels' netem dumps into the datapaths' golden file (capture.rs)
//! isthmus-rig fetch [--refresh]     host tools + resolved packages + prepared kernels (cached)
//! isthmus-rig build                 the static test binary
//! isthmus-rig run [opts]            boot the cached kernels with the binary built last, and report
//! isthmus-rig list                  the test names
//! isthmus-rig shell KERNEL          a shell in the guest on this terminal (`poweroff -f` to leave)
//! isthmus-rig resolve               each rule, and what the cache and the archive answer today
//! isthmus-rig entry KERNEL          the prepared kernel's cache directory (fetched if needed), for the e2e
//!                                   cluster's nodes: `vmlinux` or `linux.uml`, `lib/modules/<release>`, `release`
//! isthmus-rig node-initramfs …      an e2e cluster node's first stage, and
//! isthmus-rig node-boot …           its boot (the vm provider's; usage in node.rs)
//! ```
//! `host` is this machine's own kernel, where the userspace datapath's tests run natively (src/bin/isthmus-rig/
//! host.rs); without `--kernel` all three run.
//! Environment: `CACHE` (default ~/.cache/isthmus), `CARGO_TARGET_DIR` (reports go to
//! `$CARGO_TARGET_DIR/kernel-tests/`), `ISTHMUS_VM_TIMEOUT` (seconds per VM, default 300).
//! Exit status: 0 when every expected test passed (or was skipped) on every kernel, 1 otherwise, 2 for usage.

mod apt;
mod boot;
mod build;
mod capture;
mod cli;
mod guest;
mod host;
mod kernels;
mod node;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use isthmus_kernel_tests::rig::packages::Index;
use isthmus_kernel_tests::rig::parity;
use isthmus_kernel_tests::rig::report::{KernelReport, junit, summary_json};
use isthmus_kernel_tests::rig::rules::{Choice, Kernel, ResolveError, choose};

use crate::apt::PrivateApt;
use crate::boot::{Boot, Mode};
use crate::cli::{Command, NodeCommand, Options, RigCommand};
use crate::kernels::{Prepared, TempDir};

pub fn say(what: &str) {
    eprintln!("rig: {what}");
}

struct Rig {
    /// `$CACHE/kernel`
    cache: PathBuf,
    target: PathBuf,
    timeout: Duration,
    apt: PrivateApt,
    /// Read at most once per run, and only when a rule needs the archive.
    index: Option<Result<Index, String>>,
    /// The benchmark instead of the tests (`rig bench`).
    bench: bool,
}

fn main() -> ExitCode {
    boot::install_interrupt_handler();
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rig: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> anyhow::Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match cli::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rig: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    match command {
        Command::Node(NodeCommand::Initramfs { kernel, entry, out }) => {
            node::write_initramfs(kernel, &entry, &out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Node(NodeCommand::Boot(boot)) => Err(boot.exec()),
        Command::Rig(command) => Rig::from_env()?.main(command),
    }
}

impl Rig {
    fn main(&mut self, command: RigCommand) -> anyhow::Result<ExitCode> {
        let rig = self;
        match command {
            RigCommand::Entry(kernel) => {
                apt::ensure_host_tools(&rig.cache)?;
                println!("{}", rig.entry(kernel, true, false)?.dir.display());
                Ok(ExitCode::SUCCESS)
            }
            RigCommand::CaptureNetemDumps => capture::netem_dumps(rig),
            RigCommand::Shell(kernel) => rig.shell(kernel),
            RigCommand::Fetch(options) => {
                apt::ensure_host_tools(&rig.cache)?;
                let mut failed = false;
                for k in &options.kernels {
                    if let Err(e) = rig.entry(*k, true, options.refresh) {
                        say(&format!("{}: {e}", k.name()));
                        failed = true;
                    }
                }
                Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
            }
            RigCommand::Build => build::static_test_binary(&rig.target).map(|_| ExitCode::SUCCESS),
            RigCommand::List => {
                let bin = build::static_test_binary(&rig.target)?;
                print!("{}", build::list(&bin, None, false)?.join("\n") + "\n");
                Ok(ExitCode::SUCCESS)
            }
            RigCommand::Resolve => rig.resolve(),
            RigCommand::Run { options, online, bench } => {
                rig.bench = bench;
                if online {
                    apt::ensure_host_tools(&rig.cache)?;
                }
                rig.run(&options, online)
            }
        }
    }

    fn from_env() -> anyhow::Result<Rig> {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
        let cache =
            std::env::var_os("CACHE").map(PathBuf::from).unwrap_or_else(|| home.join(".cache/isthmus")).join("kernel");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
        let timeout = match std::env::var("ISTHMUS_VM_TIMEOUT") {
            Ok(s) => Duration::from_secs(s.parse().context("ISTHMUS_VM_TIMEOUT: seconds")?),
            Err(_) => Duration::from_secs(300),
        };
        std::fs::create_dir_all(&cache)?;
        Ok(Rig { apt: PrivateApt::new(&cache), cache, target, timeout, index: None, bench: false })
    }

    /// The prepared entry a kernel boots: from the cache, or resolved from the archive and prepared.
    /// `online: false` never reads the archive (`rig run`).
    fn entry(&mut self, kernel: Kernel, online: bool, refresh: bool) -> anyhow::Result<Prepared> {
        let _lock = lock(&self.cache)?;
        let prepared = kernels::list(&self.cache, kernel);
        let packages: Vec<_> = prepared.iter().map(|p| p.packages.clone()).collect();
        let (apt, slot) = (&self.apt, &mut self.index);
        let choice = choose(kernel, &packages, refresh, || {
            if !online {
                return Err("`rig run` uses only the cache; `rig fetch` fills it".to_owned());
            }
            slot.get_or_insert_with(|| apt.index().map_err(|e| format!("{e:#}"))).as_ref().map_err(Clone::clone)
        })?;
        Ok(match choice {
            Choice::Cached(i, packages) | Choice::Current(i, packages) => Prepared { packages, ..prepared[i].clone() },
            Choice::Fetch(packages) => kernels::prepare(&self.cache, kernel, &packages, &self.apt)?,
        })
    }

    fn resolve(&mut self) -> anyhow::Result<ExitCode> {
        let mut ok = true;
        for kernel in Kernel::ALL {
            for rule in kernel.rules() {
                println!("rule {rule}\n  why: {}", rule.reason);
            }
            let prepared = kernels::list(&self.cache, kernel);
            for p in &prepared {
                let versions: Vec<String> = p.packages.iter().map(|r| format!("{} {}", r.package, r.version)).collect();
                println!("  cached: {} ({})", versions.join(", "), p.dir.display());
            }
            let index = self.index.get_or_insert_with(|| self.apt.index().map_err(|e| format!("{e:#}")));
            match index.as_ref().map_err(|e| ResolveError::NoArchive { rule: kernel.rules()[0].id, why: e.clone() }) {
                Ok(index) => match kernel.from_index(index) {
                    Ok(r) => r.iter().for_each(|p| {
                        println!("  archive: {} {} from {} sha256 {}", p.package, p.version, p.suite, p.sha256)
                    }),
                    Err(e) => {
                        println!("  archive: {e}");
                        ok = false;
                    }
                },
                Err(e) => {
                    println!("  archive: {e}");
                    ok = false;
                }
            }
        }
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    }

    fn run(&mut self, o: &Options, online: bool) -> anyhow::Result<ExitCode> {
        // Resolve every kernel first: one that cannot be had is reported, the others still run.
        let entries: Vec<(Kernel, Result<Prepared, String>)> = o
            .kernels
            .iter()
            .map(|&k| (k, self.entry(k, online, o.refresh).map_err(|e| format!("packages: {e:#}"))))
            .collect();
        let bin = if online { build::static_test_binary(&self.target)? } else { build::built_binary(&self.target)? };
        let expected = build::list(&bin, o.tests.as_deref(), self.bench)?;
        let run_dir = TempDir::new(&self.cache, "run")?;
        let mut reports = self.boot_all(&entries, &bin, o.tests.as_deref(), &expected, run_dir.path(), o.parallel)?;
        if o.rerun_failed {
            for (k, report) in entries.iter().map(|(k, _)| k).zip(reports.iter_mut()) {
                if !report.retriable() {
                    continue;
                }
                // Guests under TCG or UML share the host's two CPUs; now and then a whole boot runs with stalled
                // timers and several delay tests fail together, each passing alone at once. A datapath fault
                // fails the fresh boot too.
                let failed: Vec<String> = report.failed().iter().map(|s| s.to_string()).collect();
                say(&format!("{}: {} once more in a fresh boot", k.name(), failed.join(",")));
                let entry = entries.iter().filter(|(e, _)| e == k).cloned().collect::<Vec<_>>();
                let again = self.boot_all(&entry, &bin, Some(&failed.join(",")), &failed, run_dir.path(), false)?;
                report.merge_rerun(again.into_iter().next().expect("one kernel"));
            }
        }
        let host_tests = if o.host { host::tests(&expected) } else { Vec::new() };
        if !host_tests.is_empty() {
            reports.push(self.run_host(&bin, &host_tests, run_dir.path(), o.rerun_failed)?);
        }
        self.write_reports(&reports, run_dir.path())
    }

    /// The userspace datapath's tests on this machine's kernel; failed ones once more when asked, as a guest's.
    fn run_host(&self, bin: &Path, tests: &[String], run_dir: &Path, rerun: bool) -> anyhow::Result<KernelReport> {
        let once = |tests: &[String]| -> anyhow::Result<KernelReport> {
            say(&format!("running {} tests natively on this machine's kernel", tests.len()));
            let (status, console) = host::run(bin, tests, self.bench, run_dir, self.timeout)?;
            let text = std::fs::read_to_string(&console)?;
            Ok(KernelReport::from_console(tests, status, Vec::new(), &console.display().to_string(), &text))
        };
        let mut report = once(tests)?;
        if rerun && report.retriable() {
            let failed: Vec<String> = report.failed().iter().map(|s| s.to_string()).collect();
            let again = once(&failed)?;
            report.merge_rerun(again);
        }
        Ok(report)
    }

    fn boot_all(
        &self,
        entries: &[(Kernel, Result<Prepared, String>)],
        bin: &Path,
        tests: Option<&str>,
        expected: &[String],
        run_dir: &Path,
        parallel: bool,
    ) -> anyhow::Result<Vec<KernelReport>> {
        let boot = |kernel: Kernel, entry: &Prepared| -> anyhow::Result<KernelReport> {
            let b = Boot {
                kernel,
                entry,
                test_binary: Some(bin),
                tests,
                mode: if self.bench { Mode::Bench } else { Mode::Tests },
                run_dir,
                timeout: self.timeout,
                shell: false,
            };
            let (status, console) = b.run()?;
            let text = String::from_utf8_lossy(&std::fs::read(&console)?).into_owned();
            Ok(KernelReport::from_console(
                expected,
                status,
                entry.packages.clone(),
                &console.display().to_string(),
                &text,
            ))
        };
        let one = |(kernel, entry): &(Kernel, Result<Prepared, String>)| match entry {
            Ok(entry) => {
                if !parallel {
                    say(&format!("booting {}", kernel.name()));
                }
                boot(*kernel, entry)
            }
            Err(problem) => Ok(KernelReport::unavailable(kernel.name(), expected, problem.clone())),
        };
        if parallel {
            std::thread::scope(|s| {
                let handles: Vec<_> = entries.iter().map(|e| s.spawn(move || one(e))).collect();
                handles.into_iter().map(|h| h.join().expect("a boot thread")).collect()
            })
        } else {
            entries.iter().map(one).collect()
        }
    }

    fn write_reports(&self, reports: &[KernelReport], run_dir: &Path) -> anyhow::Result<ExitCode> {
        let root = self.target.join("kernel-tests");
        let out = root.join(jiff::Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string());
        std::fs::create_dir_all(&out)?;
        let mut reports = reports.to_vec();
        for r in &mut reports {
            // the consoles move from the run directory (removed on exit) into the report
            for (from, to) in [
                ("bookworm.console", "bookworm.console"),
                ("sid.console", "sid.console"),
                ("host.console", "host.console"),
            ] {
                if r.console.ends_with(from) {
                    std::fs::copy(run_dir.join(from), out.join(to))?;
                    r.console = out.join(to).display().to_string();
                }
            }
            print!("{}", r.render());
        }
        print!("{}", if self.bench { parity::render_bench(&reports) } else { parity::render(&reports) });
        std::fs::write(out.join("summary.json"), summary_json(&reports))?;
        std::fs::write(out.join("junit.xml"), junit(&reports))?;
        let latest = root.join("latest");
        let _ = std::fs::remove_file(&latest);
        std::os::unix::fs::symlink(out.file_name().expect("named"), &latest)?;
        let ok = reports.iter().all(KernelReport::ok);
        println!("\nreports: {0}/summary.json {0}/junit.xml", out.display());
        for line in reports.iter().flat_map(KernelReport::failure_lines) {
            println!("{line}");
        }
        println!("RESULT: {}", if ok { "PASS" } else { "FAIL" });
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
    }

    fn shell(&mut self, kernel: Kernel) -> anyhow::Result<ExitCode> {
        apt::ensure_host_tools(&self.cache)?;
        let entry = self.entry(kernel, true, false)?;
        let run_dir = TempDir::new(&self.cache, "shell")?;
        let b = Boot {
            kernel,
            entry: &entry,
            test_binary: None,
            tests: None,
            mode: Mode::Tests,
            run_dir: run_dir.path(),
            timeout: Duration::from_secs(24 * 3600),
            shell: true,
        };
        b.run()?;
        Ok(ExitCode::SUCCESS)
    }
}

/// One rig at a time prepares the cache (a CI run and a developer's run on one machine).
fn lock(cache: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(cache.join("lock"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e.into())
}
