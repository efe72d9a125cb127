//! The stock-kernel rig's shared code: the line protocol between the guest test binary (`src/main.rs`) and
//! the host tool (`src/bin/isthmus-rig`), the host tool's pure parts, and the pure parts of capturing the kernel's
//! netem dumps (`rig capture-netem-dumps`).

pub mod netem_dumps;
pub mod protocol;

/// The host side's pure logic: package rules, Debian versions and indexes, module order, ELF and cpio
/// writing, the report. The I/O around them is in `src/bin/isthmus-rig`.
pub mod rig {
    pub mod cpio;
    pub mod debver;
    pub mod elf;
    pub mod modules;
    pub mod packages;
    pub mod parity;
    pub mod report;
    pub mod rules;
}
