//! `kubectl isthmus matrix TOPOLOGY`: a NetworkTopology's round trips as a table, one row per `from` region, each
//! cell `configured / measured` (pure rendering of `status.matrix`).

use isthmus_operator::topology::NetworkTopology;

use crate::table::Table;

/// The table, or why there is none yet.
pub fn render(topology: &NetworkTopology) -> String {
    let Some(status) = topology.status.as_ref().filter(|s| !s.matrix.is_empty()) else {
        let why = topology
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "the operator has not written its status yet".into());
        return format!("no matrix for {}: {why}\n", topology.metadata.name.as_deref().unwrap_or_default());
    };
    let regions: Vec<&str> = status.matrix.iter().map(|r| r.from.as_str()).collect();
    let mut table = Table::new(std::iter::once("FROM \\ TO").chain(regions.iter().copied()));
    for row in &status.matrix {
        let cells = row.configured.iter().zip(&row.measured).map(|(c, m)| format!("{c} / {m}"));
        table.push(std::iter::once(row.from.clone()).chain(cells).collect());
    }
    let pods: Vec<String> = status.regions.iter().map(|r| format!("{} {}", r.name, r.pods)).collect();
    format!(
        "{}\nround trip: configured / measured (rttP50 of the link FROM → TO's own probes, network included; - not measured)\npods: {}\n",
        table.render().trim_end(),
        pods.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use isthmus_operator::topology::status::{MatrixRow, RegionStatus};
    use isthmus_operator::topology::{NetworkTopologySpec, NetworkTopologyStatus};

    fn topology(status: Option<NetworkTopologyStatus>) -> NetworkTopology {
        let spec: NetworkTopologySpec = serde_json::from_value(
            serde_json::json!({"regionLabel": "r", "regions": [{"name": "eu"}, {"name": "us"}]}),
        )
        .unwrap();
        let mut t = NetworkTopology::new("world", spec);
        t.status = status;
        t
    }

    #[test]
    fn one_row_per_region_configured_then_measured() {
        let row = |from: &str, c: [&str; 2], m: [&str; 2]| MatrixRow {
            from: from.into(),
            configured: c.map(String::from).to_vec(),
            measured: m.map(String::from).to_vec(),
        };
        let status = NetworkTopologyStatus {
            regions: vec![RegionStatus { name: "eu".into(), pods: 3 }, RegionStatus { name: "us".into(), pods: 2 }],
            matrix: vec![row("eu", ["2ms", "80ms"], ["2.1ms", "80.4ms"]), row("us", ["80ms", "2ms"], ["-", "-"])],
            ..Default::default()
        };
        let out = render(&topology(Some(status)));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "FROM \\ TO   eu            us");
        assert_eq!(lines[1], "eu          2ms / 2.1ms   80ms / 80.4ms");
        assert_eq!(lines[2], "us          80ms / -      2ms / -");
        assert!(out.ends_with("pods: eu 3, us 2\n"), "{out}");
    }

    #[test]
    fn without_a_status_it_says_why() {
        assert!(render(&topology(None)).contains("has not written its status"));
    }
}
