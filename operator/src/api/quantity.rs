//! String-typed quantities of the NetworkLink API. Each type carries the text the user wrote (so nothing is
//! lost in a round trip and a malformed object still deserializes and can be reported in its status) and a
//! schema with the same pattern and bounds that [`crate::unit_syntax`] enforces.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::unit_syntax::{self, UnitError};

macro_rules! quantity {
    ($(#[$doc:meta])* $name:ident, $schema_name:literal, $parsed:ty, $parse:path, $schema:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn parse(&self) -> Result<$parsed, UnitError> {
                $parse(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                $schema_name.into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

quantity!(
    /// A duration such as `120ms`, `1.5s`, `500us` or `0`; units ns, us, ms, s; at most 3600s.
    DurationValue,
    "Duration",
    std::time::Duration,
    unit_syntax::parse_duration,
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": unit_syntax::DURATION_PATTERN,
        "x-kubernetes-validations": [{
            "rule": "duration(self) <= duration('3600s')",
            "message": "must be at most 3600s",
        }],
    })
);

quantity!(
    /// A percentage such as `0.1%`, `25%` or `100%`.
    PercentValue,
    "Percent",
    f64,
    unit_syntax::parse_percent,
    json_schema!({
        "type": "string",
        "maxLength": 16,
        "pattern": unit_syntax::PERCENT_PATTERN,
    })
);

quantity!(
    /// A rate in bits per second such as `100Mbit`, `1.5Gbit` or `64kbit` (units bit, kbit, Mbit, Gbit; SI
    /// prefixes). `mbps`, `MBps` and the like are refused as ambiguous: write `Mbit`.
    RateValue,
    "Rate",
    u64,
    unit_syntax::parse_rate,
    json_schema!({
        "type": "string",
        "maxLength": 32,
        // The pattern is checked by CEL rather than `pattern` so that a refused `100mbps` gets the hint.
        "x-kubernetes-validations": [{
            "rule": format!("self.matches(r'{}')", unit_syntax::RATE_PATTERN),
            "message": "must be bits per second such as 100Mbit, 1.5Gbit or 64kbit (units bit, kbit, Mbit, Gbit); mbps, MBps and bps are refused as ambiguous",
        }, {
            "rule": format!("{rate} >= {min:.1} && {rate} <= 1e12", rate = unit_syntax::cel_rate_bits("self"), min = unit_syntax::MIN_RATE_BPS),
            "message": "must be between 100bit and 1000Gbit (bits per second, e.g. 100Mbit; mbps/MBps are ambiguous, write Mbit)",
        }],
    })
);

/// The largest burst the kernel's token bucket accepts (a u32 of bytes).
pub const MAX_BURST_BYTES: u64 = u32::MAX as u64;
/// One full-size packet with headroom; a smaller bucket could never send a full packet.
pub const MIN_BURST_BYTES: u64 = 1600;

quantity!(
    /// A token-bucket size in bytes such as `32KiB`, `1500B` or `1MiB` (units B, KiB, MiB, GiB); between
    /// 1600B (one full-size packet) and 4GiB-1.
    BurstValue,
    "Burst",
    u64,
    unit_syntax::parse_size,
    json_schema!({
        "type": "string",
        "maxLength": 16,
        "pattern": unit_syntax::SIZE_PATTERN,
        "x-kubernetes-validations": [{
            "rule": "int(self.find('^[0-9]+')) * (self.endsWith('GiB') ? 1073741824 : self.endsWith('MiB') ? 1048576 : self.endsWith('KiB') ? 1024 : 1) >= 1600 && int(self.find('^[0-9]+')) * (self.endsWith('GiB') ? 1073741824 : self.endsWith('MiB') ? 1048576 : self.endsWith('KiB') ? 1024 : 1) <= 4294967295",
            "message": "must be between 1600B (one full-size packet) and 4294967295B",
        }],
    })
);

quantity!(
    /// An external destination network in CIDR notation, such as `203.0.113.0/24` or `2001:db8::/32`, with no
    /// host bits set.
    CidrValue,
    "Cidr",
    ipnet::IpNet,
    parse_cidr,
    json_schema!({
        "type": "string",
        "maxLength": 64,
        "x-kubernetes-validations": [{
            "rule": "isCIDR(self) && cidr(self) == cidr(self).masked()",
            "message": "must be a network in CIDR notation with no host bits set, e.g. 203.0.113.0/24 or 2001:db8::/32",
        }],
    })
);

/// Parses a CIDR the way the API server's `isCIDR` + `masked()` rule admits it.
pub fn parse_cidr(input: &str) -> Result<ipnet::IpNet, UnitError> {
    let net: ipnet::IpNet = input.parse().map_err(|_| UnitError {
        input: input.to_owned(),
        reason: "not a network in CIDR notation (e.g. 203.0.113.0/24 or 2001:db8::/32)".into(),
    })?;
    if net.trunc() != net {
        return Err(UnitError {
            input: input.to_owned(),
            reason: format!("has host bits set; the network is {}", net.trunc()),
        });
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(parse_cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(parse_cidr("2001:DB8::/32").unwrap().to_string(), "2001:db8::/32");
        assert!(parse_cidr("10.0.0.1/8").unwrap_err().reason.contains("10.0.0.0/8"));
        assert!(parse_cidr("10.0.0.0").is_err());
        assert!(parse_cidr("10.0.0.0/33").is_err());
    }
}
