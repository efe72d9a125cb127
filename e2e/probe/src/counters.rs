//! The network namespace's `/proc/net/snmp` IP and UDP counters, for counting at the receiver what a
//! corrupting link did: a flipped bit in a UDP datagram fails its checksum there (`Udp: InCsumErrors`), one in
//! the IP header fails the header checksum (`Ip: InHdrErrors`).

use serde_json::{Map, Value, json};

use crate::error::{Context, ProbeError, Result};

pub fn read() -> Result<Value> {
    let text = std::fs::read_to_string("/proc/net/snmp").context(|| "reading /proc/net/snmp".into())?;
    parse(&text)
}

/// `Proto: Name Name…` followed by `Proto: value value…`, for the protocols this probe reports.
fn parse(text: &str) -> Result<Value> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Map::new();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (Some((proto, names)), Some((_, values))) = (names.split_once(':'), values.split_once(':')) else {
            continue;
        };
        let key = match proto {
            "Ip" => "ip",
            "Udp" => "udp",
            _ => continue,
        };
        let mut counters = Map::new();
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            let v: i64 =
                value.parse().map_err(|_| ProbeError::new(format!("/proc/net/snmp: {proto} {name}: {value:?}")))?;
            counters.insert(name.to_owned(), json!(v));
        }
        out.insert(key.to_owned(), Value::Object(counters));
    }
    if !out.contains_key("udp") {
        return Err(ProbeError::new("/proc/net/snmp has no Udp counters"));
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_and_udp_counters_by_name() {
        let text = "Ip: Forwarding DefaultTTL InReceives InHdrErrors\nIp: 1 64 120 3\n\
                    Icmp: InMsgs\nIcmp: 7\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\n\
                    Udp: 100 1 12 100 0 0 11\n";
        let v = parse(text).unwrap();
        assert_eq!(v["udp"]["InCsumErrors"], 11);
        assert_eq!(v["ip"]["InHdrErrors"], 3);
        assert!(v.get("icmp").is_none());
        assert!(parse("Ip: A\nIp: 1\n").is_err(), "no Udp line");
        assert!(parse("Udp: A\nUdp: x\n").unwrap_err().to_string().contains("Udp A"));
    }
}
