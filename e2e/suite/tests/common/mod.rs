//! What the suite's test binaries share.

use isthmus_e2e::kubectl_json;

pub fn nodes() -> Vec<String> {
    let v = kubectl_json(&["get", "nodes"]);
    let mut names: Vec<String> =
        v["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

/// (first node, the other node or the first again on a one-node cluster)
pub fn two_nodes() -> (String, String) {
    let n = nodes();
    (n[0].clone(), n.get(1).unwrap_or(&n[0]).clone())
}
