//! isthmus-kernel-tests: the datapath tests that need a real distribution kernel (netem, drr, prio, …).
//!
//! The rig (`e2e/kernel/rig`) builds this binary statically, puts it into an initramfs and boots it in
//! Debian bookworm's stock kernel (QEMU TCG) and in Debian sid's User-Mode Linux. Inside, each test builds
//! its own network namespaces, drives the project's datapath library (the code the agent runs), measures
//! real traffic, cleans up, and prints one `ISTHMUS-RESULT {json}` line (see `isthmus_kernel_tests::protocol`).
//!
//! ```text
//! isthmus-kernel-tests [--test NAME[,NAME…]] [--kernel LABEL] [--backend qemu-tcg|uml|native]
//! isthmus-kernel-tests --list [--test …]      the selected test names, one a line
//! isthmus-kernel-tests --bench [--list] …      the datapaths' benchmark instead of the tests (src/tests/bench.rs)
//! isthmus-kernel-tests --capture-netem-dumps   the kernel's netem dumps for the datapaths' golden test
//!                                              (src/capture.rs; `rig capture-netem-dumps` writes the file)
//! ```
//! Exit status: 0 when no test failed (every dump was captured), 1 when one did (one was not), 2 for bad arguments.

mod capture;
mod harness;
mod netns;
mod stats;
mod tests;
mod traffic;

use std::process::ExitCode;

use harness::{Backend, RunConfig};

struct Args {
    list: bool,
    bench: bool,
    capture_netem_dumps: bool,
    filter: Option<String>,
    kernel: Option<String>,
    backend: Backend,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        list: false,
        bench: false,
        capture_netem_dumps: false,
        filter: None,
        kernel: None,
        backend: Backend::Native,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| anyhow::anyhow!("{flag} needs a value"));
        match arg.as_str() {
            "--list" => args.list = true,
            "--bench" => args.bench = true,
            "--capture-netem-dumps" => args.capture_netem_dumps = true,
            "--test" => args.filter = Some(value("--test")?),
            "--kernel" => args.kernel = Some(value("--kernel")?),
            "--backend" => args.backend = Backend::parse(&value("--backend")?)?,
            other => anyhow::bail!("unknown argument {other:?} (see the crate documentation)"),
        }
    }
    Ok(args)
}

fn kernel_release() -> String {
    nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default()
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("isthmus-kernel-tests: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.capture_netem_dumps {
        return if capture::run() { ExitCode::SUCCESS } else { ExitCode::from(1) };
    }
    let all = if args.bench { tests::benches() } else { tests::all() };
    let selected = match harness::select(&all, args.filter.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("isthmus-kernel-tests: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.list {
        for t in &selected {
            println!("{}", t.name);
        }
        return ExitCode::SUCCESS;
    }
    let config = RunConfig { kernel: args.kernel.unwrap_or_else(kernel_release), backend: args.backend };
    if harness::run(&selected, &config) { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
