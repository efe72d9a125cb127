//! Named link presets: access networks with their uplink (from → to) and downlink (to → from).
//!
//! The numbers are the classic dummynet preset table (Luigi Rizzo's dummynet, as used in "Dummynet revisited",
//! Carbone & Rizzo, ACM SIGCOMM CCR 40(2), 2010, and in the tools built on it), as quoted in isthmus issue 5,
//! where each entry lists the downlink first: Edge 240/200 kbit/s 400/440 ms; 3G 780/330 kbit/s 100/100 ms;
//! LTE 50/10 Mbit/s 50/65 ms; DSL 2 Mbit/s / 256 kbit/s 10/10 ms; VDSL 50/10 Mbit/s 10/10 ms; geo-satellite
//! 10/2 Mbit/s 325/325 ms. The delays are one-way. These presets carry no loss or jitter: the table has none,
//! and inventing numbers would make results look more precise than they are.

use std::time::Duration;

use isthmus_agent_api::ImpairmentFields;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A preset access network. The client (the `from` pods) sits at the subscriber end: `from → to` gets the
/// uplink, `to → from` the downlink. Explicit fields in `impairment` and `reverse` override the preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Profile {
    /// EDGE (2.5G): uplink 200 kbit/s, 440 ms; downlink 240 kbit/s, 400 ms.
    #[serde(rename = "edge")]
    Edge,
    /// 3G (UMTS): uplink 330 kbit/s, 100 ms; downlink 780 kbit/s, 100 ms.
    #[serde(rename = "3g")]
    ThreeG,
    /// LTE (4G): uplink 10 Mbit/s, 65 ms; downlink 50 Mbit/s, 50 ms.
    #[serde(rename = "lte")]
    Lte,
    /// ADSL: uplink 256 kbit/s, 10 ms; downlink 2 Mbit/s, 10 ms.
    #[serde(rename = "dsl")]
    Dsl,
    /// VDSL: uplink 10 Mbit/s, 10 ms; downlink 50 Mbit/s, 10 ms.
    #[serde(rename = "vdsl")]
    Vdsl,
    /// Geostationary satellite: uplink 2 Mbit/s, 325 ms; downlink 10 Mbit/s, 325 ms.
    #[serde(rename = "geo-satellite")]
    GeoSatellite,
}

/// One direction of a preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresetDirection {
    pub rate_bps: u64,
    pub latency: Duration,
}

impl PresetDirection {
    /// The preset's fields, before the user's overrides and the checks.
    pub fn impairment(self) -> ImpairmentFields {
        ImpairmentFields { latency: Some(self.latency), rate_bps: Some(self.rate_bps), ..Default::default() }
    }
}

const fn dir(rate_bps: u64, latency_ms: u64) -> PresetDirection {
    PresetDirection { rate_bps, latency: Duration::from_millis(latency_ms) }
}

impl Profile {
    pub const ALL: [Profile; 6] =
        [Profile::Edge, Profile::ThreeG, Profile::Lte, Profile::Dsl, Profile::Vdsl, Profile::GeoSatellite];

    /// (uplink, downlink).
    pub fn directions(self) -> (PresetDirection, PresetDirection) {
        match self {
            Profile::Edge => (dir(200_000, 440), dir(240_000, 400)),
            Profile::ThreeG => (dir(330_000, 100), dir(780_000, 100)),
            Profile::Lte => (dir(10_000_000, 65), dir(50_000_000, 50)),
            Profile::Dsl => (dir(256_000, 10), dir(2_000_000, 10)),
            Profile::Vdsl => (dir(10_000_000, 10), dir(50_000_000, 10)),
            Profile::GeoSatellite => (dir(2_000_000, 325), dir(10_000_000, 325)),
        }
    }

    pub fn uplink(self) -> PresetDirection {
        self.directions().0
    }

    pub fn downlink(self) -> PresetDirection {
        self.directions().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_follow_the_table_downlink_first() {
        // (name, downlink kbit/s, uplink kbit/s, downlink ms, uplink ms) exactly as the table lists them.
        let table = [
            ("edge", 240, 200, 400, 440),
            ("3g", 780, 330, 100, 100),
            ("lte", 50_000, 10_000, 50, 65),
            ("dsl", 2_000, 256, 10, 10),
            ("vdsl", 50_000, 10_000, 10, 10),
            ("geo-satellite", 10_000, 2_000, 325, 325),
        ];
        for (name, down_k, up_k, down_ms, up_ms) in table {
            let p: Profile = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(p.downlink(), dir(down_k * 1000, down_ms), "{name} downlink");
            assert_eq!(p.uplink(), dir(up_k * 1000, up_ms), "{name} uplink");
            assert!(isthmus_agent_api::Impairment::try_from(p.uplink().impairment()).is_ok());
        }
        assert_eq!(table.len(), Profile::ALL.len());
    }
}
