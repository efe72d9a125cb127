//! The guest's kernel modules: the ones the datapath (and its probe) may ask of the kernel, with their
//! dependencies from `modules.dep`, in an order `insmod` can load them (dependencies first).

use std::collections::HashSet;

use crate::rig::rules::Kernel;

/// What the datapath may ask of the kernel, and what the kernel tests check is there.
pub const MODULES: [&str; 11] = [
    "sch_netem",
    "sch_htb",
    "sch_tbf",
    "sch_drr",
    "sch_prio",
    "cls_u32",
    "cls_flower",
    "cls_matchall",
    "veth",
    "ifb",
    "dummy",
];

/// What an e2e cluster node's first stage (the vm provider's) loads before it can mount this machine's files:
/// overlayfs for the writable layer, and under QEMU the virtio PCI transport and 9p for the shares (UML's
/// hostfs and its console are built in). The rest of the node's modules come later, from its own module tree.
pub fn node_first_stage(kernel: Kernel) -> &'static [&'static str] {
    match kernel {
        Kernel::Bookworm => &["virtio_pci", "9pnet_virtio", "9p", "overlay"],
        Kernel::Sid => &["overlay"],
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("module {0} is neither a module nor built into this kernel")]
pub struct MissingModule(pub String);

fn module_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file)
}

/// Paths (relative to the modules directory, as `modules.dep` writes them) to load in order; built-in
/// modules need nothing.
pub fn load_order(modules_dep: &str, modules_builtin: &str, wanted: &[&str]) -> Result<Vec<String>, MissingModule> {
    let deps: Vec<(&str, Vec<&str>)> = modules_dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(path, deps)| (path.trim(), deps.split_whitespace().collect()))
        .collect();
    let builtin: HashSet<&str> = modules_builtin.lines().map(|l| module_name(l.trim())).collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    fn visit<'a>(
        path: &'a str,
        deps: &'a [(&'a str, Vec<&'a str>)],
        seen: &mut HashSet<&'a str>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(path) {
            return;
        }
        if let Some((_, ds)) = deps.iter().find(|(p, _)| *p == path) {
            for d in ds {
                visit(d, deps, seen, order);
            }
        }
        order.push(path.to_owned());
    }
    for name in wanted {
        match deps.iter().find(|(path, _)| module_name(path) == *name) {
            Some((path, _)) => visit(path, &deps, &mut seen, &mut order),
            None if builtin.contains(name) => {}
            None => return Err(MissingModule((*name).to_owned())),
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_first_each_once_builtins_skipped() {
        let dep = "kernel/net/sched/sch_netem.ko.xz:\n\
                   kernel/net/sched/cls_flower.ko.xz: kernel/net/sched/act_ct.ko.xz kernel/net/netfilter/nf_conntrack.ko.xz\n\
                   kernel/net/sched/act_ct.ko.xz: kernel/net/netfilter/nf_conntrack.ko.xz\n\
                   kernel/net/netfilter/nf_conntrack.ko.xz:\n\
                   kernel/drivers/net/veth.ko.xz:\n";
        let builtin = "kernel/net/sched/sch_htb.ko\n";
        let order = load_order(dep, builtin, &["sch_htb", "cls_flower", "sch_netem", "veth", "cls_flower"]).unwrap();
        assert_eq!(
            order,
            [
                "kernel/net/netfilter/nf_conntrack.ko.xz",
                "kernel/net/sched/act_ct.ko.xz",
                "kernel/net/sched/cls_flower.ko.xz",
                "kernel/net/sched/sch_netem.ko.xz",
                "kernel/drivers/net/veth.ko.xz",
            ]
        );
        assert_eq!(load_order(dep, builtin, &["sch_fq"]), Err(MissingModule("sch_fq".into())));
    }

    /// bookworm 6.1's own `modules.dep` lines for the node's first stage: each module comes after what it needs
    /// (the vm provider listed these eleven by hand before they were derived).
    #[test]
    fn a_bookworm_node_loads_virtio_and_9p_before_the_overlay() {
        let dep = "kernel/fs/overlayfs/overlay.ko:\n\
                   kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko\n\
                   kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko \
                   kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko \
                   kernel/drivers/virtio/virtio_ring.ko\n\
                   kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio.ko \
                   kernel/drivers/virtio/virtio_ring.ko\n\
                   kernel/drivers/virtio/virtio_pci_legacy_dev.ko:\nkernel/drivers/virtio/virtio_pci_modern_dev.ko:\n\
                   kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko\n\
                   kernel/drivers/virtio/virtio_ring.ko:\nkernel/net/9p/9pnet.ko:\n\
                   kernel/fs/fscache/fscache.ko: kernel/fs/netfs/netfs.ko\nkernel/fs/netfs/netfs.ko:\n";
        let names: Vec<String> = load_order(dep, "", node_first_stage(Kernel::Bookworm))
            .unwrap()
            .iter()
            .map(|p| module_name(p).to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "virtio_pci_legacy_dev",
                "virtio_pci_modern_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "fscache",
                "9p",
                "overlay"
            ]
        );
        let uml = load_order("kernel/fs/overlayfs/overlay.ko:\n", "", node_first_stage(Kernel::Sid)).unwrap();
        assert_eq!(uml, ["kernel/fs/overlayfs/overlay.ko"]);
    }
}
