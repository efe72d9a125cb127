//! The guest's kernel modules: the ones the datapath (and its probe) may ask of the kernel, with their
//! dependencies from `modules.dep`, in an order `insmod` can load them (dependencies first).

use std::collections::HashSet;

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
}
