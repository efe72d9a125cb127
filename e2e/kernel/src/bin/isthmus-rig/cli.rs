//! The rig's command line (the usage is at the top of main.rs), read whole into what to do before anything
//! runs: a typo stops the rig with exit status 2 and a line naming it, never half-way through a run.

use std::path::PathBuf;

use anyhow::{Context, bail, ensure};
use isthmus_kernel_tests::rig::rules::Kernel;

use crate::node::NodeBoot;

pub enum Command {
    Rig(RigCommand),
    /// The e2e cluster's vm nodes (node.rs), which need neither the cache's lock nor the host tools.
    Node(NodeCommand),
}

pub enum RigCommand {
    /// Boot the kernels with the test binary and report: `all` (the default) and `bench` fetch what is missing,
    /// `run` uses only the cache.
    Run {
        options: Options,
        online: bool,
        bench: bool,
    },
    Fetch(Options),
    Build,
    List,
    Resolve,
    CaptureNetemDumps,
    Shell(Kernel),
    Entry(Kernel),
}

pub enum NodeCommand {
    Initramfs { kernel: Kernel, entry: PathBuf, out: PathBuf },
    Boot(NodeBoot),
}

pub struct Options {
    pub kernels: Vec<Kernel>,
    /// The userspace datapath's tests natively on this machine's kernel too.
    pub host: bool,
    pub tests: Option<String>,
    pub parallel: bool,
    pub rerun_failed: bool,
    pub refresh: bool,
}

const COMMANDS: &str =
    "all, bench, capture-netem-dumps, fetch, build, run, list, shell, resolve, entry, node-initramfs, node-boot";

pub fn parse(args: &[String]) -> anyhow::Result<Command> {
    let (command, rest) = match args.first().map(String::as_str) {
        Some(a) if !a.starts_with("--") => (a, &args[1..]),
        _ => ("all", args),
    };
    let rig = |c| Ok(Command::Rig(c));
    match command {
        "all" => rig(RigCommand::Run { options: options(rest)?, online: true, bench: false }),
        "bench" => rig(RigCommand::Run { options: options(rest)?, online: true, bench: true }),
        "run" => rig(RigCommand::Run { options: options(rest)?, online: false, bench: false }),
        "fetch" => rig(RigCommand::Fetch(options(rest)?)),
        "build" | "list" | "resolve" | "capture-netem-dumps" => {
            ensure!(rest.is_empty(), "{command} takes no argument (got {})", rest.join(" "));
            rig(match command {
                "build" => RigCommand::Build,
                "list" => RigCommand::List,
                "resolve" => RigCommand::Resolve,
                _ => RigCommand::CaptureNetemDumps,
            })
        }
        "shell" => rig(RigCommand::Shell(one_kernel(command, rest)?)),
        "entry" => rig(RigCommand::Entry(one_kernel(command, rest)?)),
        "node-initramfs" => {
            let [kernel, entry, out] = rest else { bail!("usage: node-initramfs KERNEL ENTRY OUT") };
            let kernel = kernel_named(kernel)?;
            Ok(Command::Node(NodeCommand::Initramfs { kernel, entry: entry.into(), out: out.into() }))
        }
        "node-boot" => Ok(Command::Node(NodeCommand::Boot(NodeBoot::parse(rest)?))),
        other => bail!("unknown command {other} ({COMMANDS})"),
    }
}

fn kernel_named(name: &str) -> anyhow::Result<Kernel> {
    Kernel::parse(name).with_context(|| format!("unknown kernel {name} (bookworm or sid)"))
}

fn one_kernel(command: &str, rest: &[String]) -> anyhow::Result<Kernel> {
    let [kernel] = rest else { bail!("usage: {command} bookworm|sid") };
    kernel_named(kernel)
}

fn options(args: &[String]) -> anyhow::Result<Options> {
    let mut o =
        Options { kernels: Vec::new(), host: false, tests: None, parallel: false, rerun_failed: false, refresh: false };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--kernel" => {
                let k = it.next().context("--kernel needs a value")?;
                if k == "host" {
                    o.host = true;
                } else {
                    let kernel =
                        Kernel::parse(k).with_context(|| format!("unknown kernel {k} (bookworm, sid or host)"))?;
                    o.kernels.push(kernel);
                }
            }
            "--test" => o.tests = Some(it.next().context("--test needs a value")?.clone()),
            "--parallel" => o.parallel = true,
            "--rerun-failed" => o.rerun_failed = true,
            "--refresh" => o.refresh = true,
            other => bail!("unknown argument {other} (see the usage at the top of src/bin/isthmus-rig/main.rs)"),
        }
    }
    if o.kernels.is_empty() && !o.host {
        o.kernels = Kernel::ALL.to_vec();
        o.host = true;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(line: &str) -> anyhow::Result<Command> {
        parse(&line.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    fn error(line: &str) -> String {
        match parsed(line) {
            Ok(_) => panic!("{line:?} parsed"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn no_command_runs_everything_online() {
        let Command::Rig(RigCommand::Run { options, online: true, bench: false }) = parsed("").unwrap() else {
            panic!("not all")
        };
        assert_eq!(options.kernels, Kernel::ALL);
        assert!(options.host);
        let Command::Rig(RigCommand::Run { options, online: true, .. }) = parsed("--kernel sid --test a,b").unwrap()
        else {
            panic!("options alone are `all`")
        };
        assert_eq!((options.kernels, options.host, options.tests.as_deref()), (vec![Kernel::Sid], false, Some("a,b")));
    }

    #[test]
    fn each_command_reads_its_own_arguments() {
        assert!(matches!(
            parsed("run --kernel host").unwrap(),
            Command::Rig(RigCommand::Run { online: false, bench: false, .. })
        ));
        assert!(matches!(parsed("bench").unwrap(), Command::Rig(RigCommand::Run { online: true, bench: true, .. })));
        assert!(matches!(
            parsed("fetch --refresh").unwrap(),
            Command::Rig(RigCommand::Fetch(Options { refresh: true, .. }))
        ));
        assert!(matches!(parsed("entry bookworm").unwrap(), Command::Rig(RigCommand::Entry(Kernel::Bookworm))));
        assert!(matches!(parsed("shell sid").unwrap(), Command::Rig(RigCommand::Shell(Kernel::Sid))));
        let Command::Node(NodeCommand::Initramfs { kernel: Kernel::Sid, entry, out }) =
            parsed("node-initramfs sid /e /o").unwrap()
        else {
            panic!("not node-initramfs")
        };
        assert_eq!((entry, out), (PathBuf::from("/e"), PathBuf::from("/o")));
    }

    #[test]
    fn usage_errors_name_what_is_wrong() {
        assert!(error("frobnicate").contains("unknown command frobnicate (all, bench,"));
        assert!(error("run --kernel").contains("--kernel needs a value"));
        assert!(error("run --kernel jessie").contains("unknown kernel jessie (bookworm, sid or host)"));
        assert!(error("all --fast").contains("unknown argument --fast"));
        assert!(error("entry").contains("usage: entry bookworm|sid"));
        assert!(error("shell host").contains("unknown kernel host (bookworm or sid)"));
        assert!(error("list extra").contains("list takes no argument (got extra)"));
        assert!(error("capture-netem-dumps x").contains("capture-netem-dumps takes no argument"));
        assert!(error("node-initramfs sid /e").contains("usage: node-initramfs KERNEL ENTRY OUT"));
        assert!(error("node-boot sid /e").contains("--initramfs is required"));
    }
}
