//! A NetworkLink's own measurement, read from its status (`status.measured`, the `Conformant` condition).

use serde_json::Value;

use crate::TestNamespace;

/// One direction of `status.measured`, with the API's strings read into numbers.
#[derive(Clone, Debug)]
pub struct Measured {
    pub rtt_p50_ms: Option<f64>,
    pub rtt_p90_ms: Option<f64>,
    pub baseline_p50_ms: Option<f64>,
    pub expected_rtt_ms: Option<f64>,
    /// As a ratio (0..1).
    pub loss: Option<f64>,
    pub samples: u64,
    pub pairs: u64,
    pub probe: Option<String>,
    pub raw: Value,
}

impl Measured {
    /// `direction` is `forward` or `reverse`; `None` while the status has no measurement for it.
    pub fn of(ns: &TestNamespace, link: &str, direction: &str) -> Option<Measured> {
        let raw = ns.json(&["get", "networklink", link])["status"]["measured"][direction].clone();
        if raw.is_null() {
            return None;
        }
        let ms = |field: &str| raw[field].as_str().map(|s| parse_ms(s).unwrap_or_else(|| panic!("{field}: {s}")));
        Some(Measured {
            rtt_p50_ms: ms("rttP50"),
            rtt_p90_ms: ms("rttP90"),
            baseline_p50_ms: ms("baselineP50"),
            expected_rtt_ms: ms("expectedRtt"),
            loss: raw["loss"].as_str().map(|s| parse_percent(s).unwrap_or_else(|| panic!("loss: {s}")) / 100.0),
            samples: raw["samples"].as_u64().unwrap_or(0),
            pairs: raw["pairs"].as_u64().unwrap_or(0),
            probe: raw["probe"].as_str().map(str::to_owned),
            raw,
        })
    }

    /// The round trip the impairment adds, as the link's own probes saw it: p50 over the baseline's p50.
    pub fn added_ms(&self) -> f64 {
        self.rtt_p50_ms.expect("a measured rttP50") - self.baseline_p50_ms.expect("a measured baselineP50")
    }
}

/// `121.4ms`, `1.5s`, `830us`/`830µs` → milliseconds.
pub fn parse_ms(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = s.split_at(split);
    let v: f64 = number.parse().ok()?;
    match unit {
        "s" => Some(v * 1e3),
        "ms" => Some(v),
        "us" | "µs" => Some(v / 1e3),
        "ns" => Some(v / 1e6),
        _ => None,
    }
}

/// `0.4%` → 0.4.
pub fn parse_percent(s: &str) -> Option<f64> {
    s.trim().strip_suffix('%')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_percentages_read_back() {
        assert_eq!(parse_ms("121.4ms"), Some(121.4));
        assert_eq!(parse_ms("1.5s"), Some(1500.0));
        assert_eq!(parse_ms("830us"), Some(0.83));
        assert_eq!(parse_ms("830µs"), Some(0.83));
        assert_eq!(parse_ms("12 parsecs"), None);
        assert_eq!(parse_percent("0.4%"), Some(0.4));
        assert_eq!(parse_percent("0.4"), None);
    }
}
