//! Built-in datasets of measured round trips between cloud regions. The figures are carried over as published,
//! with their source, date and licence next to them (`azure-rtt.NOTICE.md`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::spec::Dataset;

const AZURE_TSV: &str = include_str!("azure-rtt.tsv");

/// A dataset: round trips in milliseconds between ordered pairs of its regions.
#[derive(Debug)]
pub struct Table {
    rtt_ms: BTreeMap<(String, String), f64>,
    regions: Vec<String>,
}

impl Table {
    /// Parses `from<TAB>to<TAB>rtt_ms` lines; `#` lines and the header are skipped.
    pub fn parse(text: &str) -> Result<Table, String> {
        let mut rtt_ms = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() || line.starts_with("from\t") {
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            let [from, to, ms] = fields[..] else { return Err(format!("line {}: three fields expected", n + 1)) };
            let ms: f64 = ms.trim().parse().map_err(|_| format!("line {}: {ms:?} is not a number", n + 1))?;
            if !(ms.is_finite() && ms > 0.0) || from == to {
                return Err(format!("line {}: a round trip between two regions is above 0", n + 1));
            }
            if rtt_ms.insert((from.to_owned(), to.to_owned()), ms).is_some() {
                return Err(format!("line {}: {from} → {to} twice", n + 1));
            }
        }
        let mut regions: Vec<String> = rtt_ms.keys().flat_map(|(a, b)| [a.clone(), b.clone()]).collect();
        regions.sort();
        regions.dedup();
        Ok(Table { rtt_ms, regions })
    }

    /// The round trip from `from` to `to` (as measured from `from`), if the dataset has it.
    pub fn round_trip(&self, from: &str, to: &str) -> Option<Duration> {
        self.rtt_ms.get(&(from.to_owned(), to.to_owned())).map(|ms| Duration::from_nanos((ms * 1e6).round() as u64))
    }

    pub fn regions(&self) -> &[String] {
        &self.regions
    }
}

static AZURE: LazyLock<Table> = LazyLock::new(|| Table::parse(AZURE_TSV).expect("the built-in Azure table parses"));

/// The table of a dataset.
pub fn table(dataset: Dataset) -> &'static Table {
    match dataset {
        Dataset::Azure => &AZURE,
    }
}

/// A region of a dataset, e.g. `westeurope`. The schema lists every region of every built-in dataset, so the
/// API server refuses a misspelt one with the list of those it knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DatasetRegion(pub String);

impl JsonSchema for DatasetRegion {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "DatasetRegion".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let known: Vec<&String> = table(Dataset::Azure).regions().iter().collect();
        json_schema!({ "type": "string", "enum": known })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_azure_table_is_complete_among_its_regions() {
        let t = table(Dataset::Azure);
        assert!(t.regions().len() >= 10, "{:?}", t.regions());
        for a in t.regions() {
            for b in t.regions() {
                if a != b {
                    assert!(t.round_trip(a, b).is_some(), "{a} → {b} missing");
                }
            }
        }
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        assert!(Table::parse("a\tb\t1\na\tb\t2\n").unwrap_err().contains("line 2"));
        assert!(Table::parse("a\tb\tx\n").unwrap_err().contains("line 1"));
        assert!(Table::parse("a\ta\t1\n").unwrap_err().contains("above 0"));
        assert!(Table::parse("a\tb\n").unwrap_err().contains("three fields"));
    }
}
