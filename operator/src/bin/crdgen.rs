//! Prints the NetworkLink CustomResourceDefinition as YAML:
//! `cargo run -p isthmus-operator --bin crdgen > crds/networklink.yaml`.

fn main() -> anyhow::Result<()> {
    print!("{}", isthmus_operator::api::crd_yaml()?);
    Ok(())
}
