//! `rig capture-netem-dumps`: regenerates the datapaths' golden file of the kernel's netem dumps
//! (agent/datapaths/src/datapath/netlink/golden/netem_dumps.txt, read by `kernel_netem_dumps_decode_to_the_model`):
//! boots both kernels with the guest binary's `--capture-netem-dumps` (src/capture.rs), reads each console back
//! and writes the file only when every case came back from both (`isthmus_kernel_tests::netem_dumps`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::anyhow;
use isthmus_kernel_tests::netem_dumps::{self, CASES, KernelDumps, parse_console};
use isthmus_kernel_tests::protocol::{ConsoleLine, parse_line};
use isthmus_kernel_tests::rig::rules::Kernel;

use crate::boot::{Boot, Mode};
use crate::kernels::TempDir;
use crate::{Rig, apt, build, say};

/// Where the golden test reads the dumps.
fn golden_file() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root).join("agent/datapaths/src/datapath/netlink/golden/netem_dumps.txt")
}

/// The golden test's prefix of each kernel's case names, and how the kernel ran.
fn prefix_and_how(kernel: Kernel) -> (&'static str, &'static str) {
    match kernel {
        Kernel::Bookworm => ("bookworm", "QEMU TCG"),
        Kernel::Sid => ("uml", "User-Mode Linux"),
    }
}

pub fn netem_dumps(rig: &mut Rig) -> anyhow::Result<ExitCode> {
    apt::ensure_host_tools(&rig.cache)?;
    let mut entries = Vec::new();
    for kernel in Kernel::ALL {
        entries.push((kernel, rig.entry(kernel, true, false)?));
    }
    let bin = build::static_test_binary(&rig.target)?;
    let run_dir = TempDir::new(&rig.cache, "run")?;
    // the consoles outlive the run directory, for a capture that did not come back
    let kept = rig.target.join("kernel-tests").join("netem-dumps");
    std::fs::create_dir_all(&kept)?;
    let mut kernels = Vec::new();
    for (kernel, entry) in &entries {
        say(&format!("booting {}", kernel.name()));
        let boot = Boot {
            kernel: *kernel,
            entry,
            test_binary: Some(&bin),
            tests: None,
            mode: Mode::NetemDumps,
            run_dir: run_dir.path(),
            timeout: rig.timeout,
            shell: false,
        };
        let (status, console) = boot.run()?;
        let keep = kept.join(format!("{}.console", kernel.name()));
        std::fs::copy(&console, &keep)?;
        let text = String::from_utf8_lossy(&std::fs::read(&keep)?).into_owned();
        let captured = parse_console(&text);
        let exit = text.lines().find_map(|l| match parse_line(l) {
            ConsoleLine::Exit(code) => Some(code.to_string()),
            _ => None,
        });
        say(&format!(
            "{}: {} of {} dumps, {} problems, guest exit {} after {:.1} s (console: {})",
            status.kernel,
            captured.dumps.len(),
            CASES.len(),
            captured.problems.len(),
            exit.unwrap_or_else(|| format!("missing (VM exit {})", status.vm_rc)),
            status.wall_s,
            keep.display()
        ));
        let (prefix, how) = prefix_and_how(*kernel);
        let packages: Vec<String> = entry.packages.iter().map(|p| format!("{} {}", p.package, p.version)).collect();
        let kernel = format!("{} (Debian {}: {}; {how})", entry.release()?, kernel.name(), packages.join(", "));
        kernels.push(KernelDumps { prefix, kernel, captured });
    }
    let file = netem_dumps::render(&kernels)
        .map_err(|e| anyhow!("not writing the dumps: {e} (the consoles are in {})", kept.display()))?;
    let path = golden_file();
    let tmp = path.with_extension("txt.tmp");
    std::fs::write(&tmp, file)?;
    std::fs::rename(&tmp, &path)?;
    println!("wrote {} dumps to {}", kernels.len() * CASES.len(), path.display());
    Ok(ExitCode::SUCCESS)
}
