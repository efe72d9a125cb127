//! "down leaves nothing": the machine's snapshot after a `down` against the one before the first `up`, aspect by
//! aspect (the files `e2e/cluster/lib/snapshot.sh take` writes), judged by `isthmus_e2e::snapshot::judge`.

use std::path::Path;

use isthmus_e2e::snapshot::judge;

use crate::pass;

/// A snapshot's file as text (a mount point or a command line need not be UTF-8); None when it is missing.
fn read(path: &Path) -> Option<String> {
    path.is_file().then(|| std::fs::read(path).ok()).flatten().map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The aspects of BASE (its files, by name), each read in BASE and CUR; prints the differences (stderr) and
/// fails when one is the cluster's.
pub fn leaves_nothing(label: &str, base: &str, cur: &str) {
    let mut names: Vec<String> = std::fs::read_dir(base)
        .unwrap_or_else(|e| panic!("{label}: cannot read the snapshot {base}: {e}"))
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(!names.is_empty(), "{label}: the snapshot {base} holds no aspect");
    let mut bad = false;
    for name in &names {
        let Some(now) = read(&Path::new(cur).join(name)) else {
            bad = true;
            eprintln!("snapshot {cur} lacks '{name}'");
            continue;
        };
        let before = read(&Path::new(base).join(name)).unwrap_or_else(|| panic!("{label}: cannot read {base}/{name}"));
        let aspect = judge(name, &before, &now);
        if !aspect.left_behind.is_empty() {
            bad = true;
            eprintln!("LEFT BEHIND ({name}):");
            aspect.left_behind.iter().for_each(|l| eprintln!("  {l}"));
        }
        if !aspect.meanwhile.is_empty() {
            eprintln!("changed meanwhile, not by the cluster ({name}):");
            aspect.meanwhile.iter().for_each(|l| eprintln!("  {l}"));
        }
    }
    assert!(!bad, "{label}: down left state behind (see above)");
    pass(&format!(
        "{label}: nothing left behind (processes, mounts, netns, links, routes, iptables, cgroups, sysctls, paths)"
    ));
}
