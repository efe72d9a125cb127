//! The committed CRD must be what the Rust types generate, and must carry the validation the API server
//! enforces.

use isthmus_operator::api::crd_yaml;

#[test]
fn committed_crd_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/networklink.yaml");
    let committed = std::fs::read_to_string(path).expect("crds/networklink.yaml exists");
    let generated = crd_yaml().unwrap();
    assert!(
        committed == generated,
        "crds/networklink.yaml is stale: run `cargo run -p isthmus-operator --bin crdgen > crds/networklink.yaml`"
    );
}

#[test]
fn committed_topology_crd_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/networktopology.yaml");
    let committed = std::fs::read_to_string(path).expect("crds/networktopology.yaml exists");
    assert!(
        committed == isthmus_operator::topology::crd_yaml().unwrap(),
        "crds/networktopology.yaml is stale: run `cargo run -p isthmus-operator --bin crdgen -- topology > crds/networktopology.yaml`"
    );
}

#[test]
fn schema_carries_the_unit_patterns_and_rules() {
    let yaml = crd_yaml().unwrap();
    for needle in [
        isthmus_operator::unit_syntax::DURATION_PATTERN,
        isthmus_operator::unit_syntax::PERCENT_PATTERN,
        isthmus_operator::unit_syntax::RATE_PATTERN,
        isthmus_operator::unit_syntax::SIZE_PATTERN,
        "isCIDR(self)",
        "fieldPath: .to.namespaceSelector",
        "shortNames",
    ] {
        assert!(yaml.contains(needle), "the CRD lacks {needle}");
    }
}
