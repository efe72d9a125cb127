//! Prints a CustomResourceDefinition as YAML: `cargo run -p isthmus-operator --bin crdgen > crds/networklink.yaml`,
//! `cargo run -p isthmus-operator --bin crdgen -- topology > crds/networktopology.yaml`.

fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        None | Some("link") => print!("{}", isthmus_operator::api::crd_yaml()?),
        Some("topology") => print!("{}", isthmus_operator::topology::crd_yaml()?),
        Some(other) => anyhow::bail!("unknown CRD {other:?}: link (the default) or topology"),
    }
    Ok(())
}
