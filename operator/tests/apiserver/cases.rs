//! The manifests of the table tests: a valid base spec, patches to it that the API server must refuse naming
//! a field, and valid specs that must round-trip and resolve.

use serde_json::{Value, json};

use super::merge;

pub fn base() -> Value {
    json!({
        "from": {"podSelector": {"matchLabels": {"app": "client"}}},
        "to": {"podSelector": {"matchLabels": {"app": "api"}}},
        "impairment": {"latency": "10ms"},
    })
}

/// (case, patch to the valid base spec, field the server must name).
pub fn invalid_cases() -> Vec<(&'static str, Value, &'static str)> {
    let imp = |v: Value| json!({"impairment": v});
    vec![
        ("latency without unit", imp(json!({"latency": "10"})), "spec.impairment.latency"),
        ("latency with a space", imp(json!({"latency": "10 ms"})), "spec.impairment.latency"),
        ("latency in minutes", imp(json!({"latency": "1m"})), "spec.impairment.latency"),
        ("latency over an hour", imp(json!({"latency": "3601s"})), "spec.impairment.latency"),
        ("negative latency", imp(json!({"latency": "-5ms"})), "spec.impairment.latency"),
        ("latency as a number", imp(json!({"latency": 10})), "spec.impairment.latency"),
        ("jitter without latency", json!({"impairment": {"latency": null, "jitter": "5ms"}}), "spec.impairment.jitter"),
        ("jitter with zero latency", imp(json!({"latency": "0", "jitter": "5ms"})), "spec.impairment.jitter"),
        ("jitter correlation alone", imp(json!({"jitterCorrelation": "25%"})), "spec.impairment.jitterCorrelation"),
        ("loss without %", imp(json!({"loss": {"percent": "0.1"}})), "spec.impairment.loss.percent"),
        ("loss over 100%", imp(json!({"loss": {"percent": "101%"}})), "spec.impairment.loss.percent"),
        ("empty loss", imp(json!({"loss": {}})), "spec.impairment.loss"),
        (
            "random and bursty loss",
            imp(json!({"loss": {"percent": "1%", "gilbertElliott": {"p": "1%", "r": "10%"}}})),
            "spec.impairment.loss",
        ),
        (
            "correlation with bursty loss",
            imp(json!({"loss": {"correlation": "5%", "gilbertElliott": {"p": "1%", "r": "10%"}}})),
            "spec.impairment.loss.correlation",
        ),
        (
            "bursty loss without r",
            imp(json!({"loss": {"gilbertElliott": {"p": "1%"}}})),
            "spec.impairment.loss.gilbertElliott.r",
        ),
        ("duplicate without percent", imp(json!({"duplicate": {}})), "spec.impairment.duplicate.percent"),
        (
            "corrupt percent not a number",
            imp(json!({"corrupt": {"percent": "abc%"}})),
            "spec.impairment.corrupt.percent",
        ),
        (
            "reorder without latency",
            json!({"impairment": {"latency": null, "reorder": {"percent": "5%"}}}),
            "spec.impairment.reorder",
        ),
        ("reorder gap with 0%", imp(json!({"reorder": {"percent": "0%", "gap": 5}})), "spec.impairment.reorder.gap"),
        ("reorder gap 0", imp(json!({"reorder": {"percent": "5%", "gap": 0}})), "spec.impairment.reorder.gap"),
        ("bandwidth in mbps", imp(json!({"bandwidth": "100mbps"})), "spec.impairment.bandwidth"),
        ("bandwidth in MBps", imp(json!({"bandwidth": "100MBps"})), "spec.impairment.bandwidth"),
        ("bandwidth below 8bit", imp(json!({"bandwidth": "4bit"})), "spec.impairment.bandwidth"),
        // The default bucket (3,200 bytes) would take 3,200 s to refill at 8 bit/s; the kernel's holds 274 s.
        ("bandwidth below 100bit", imp(json!({"bandwidth": "8bit"})), "spec.impairment.bandwidth"),
        (
            "burst too deep for the bandwidth",
            imp(json!({"bandwidth": "1kbit", "burst": "34251B"})),
            "spec.impairment.burst",
        ),
        (
            "burst too deep for the profile's uplink",
            json!({"profile": "edge", "impairment": {"burst": "8MiB"}}),
            "spec.impairment.burst",
        ),
        (
            "reverse burst too deep for the profile's downlink",
            json!({"profile": "edge", "reverse": {"burst": "8MiB"}}),
            "spec.reverse.burst",
        ),
        ("jitter wider than netem's", imp(json!({"jitter": "2.2s"})), "spec.impairment.jitter"),
        ("bandwidth above 1000Gbit", imp(json!({"bandwidth": "2000Gbit"})), "spec.impairment.bandwidth"),
        ("bandwidth without unit", imp(json!({"bandwidth": "100"})), "spec.impairment.bandwidth"),
        ("burst without bandwidth", imp(json!({"burst": "32KiB"})), "spec.impairment.burst"),
        ("burst below a packet", imp(json!({"bandwidth": "1Mbit", "burst": "1KiB"})), "spec.impairment.burst"),
        ("burst in ambiguous KB", imp(json!({"bandwidth": "1Mbit", "burst": "32KB"})), "spec.impairment.burst"),
        ("queue limit 0", imp(json!({"queueLimit": 0})), "spec.impairment.queueLimit"),
        ("queue limit negative", imp(json!({"queueLimit": -1})), "spec.impairment.queueLimit"),
        ("neither impairment nor profile", json!({"impairment": null}), "spec.impairment"),
        ("reverse and symmetric", json!({"reverse": {"latency": "5ms"}, "symmetric": true}), "spec.symmetric"),
        ("profile and symmetric", json!({"profile": "lte", "symmetric": true}), "spec.symmetric"),
        ("oneWay and reverse", json!({"oneWay": true, "reverse": {"latency": "5ms"}}), "spec.oneWay"),
        (
            "symmetric across namespaces",
            json!({"symmetric": true, "to": {"namespaceSelector": {}}}),
            "spec.to.namespaceSelector",
        ),
        (
            "profile across namespaces",
            json!({"profile": "dsl", "to": {"namespaceSelector": {}}}),
            "spec.to.namespaceSelector",
        ),
        (
            "reverse towards CIDRs only",
            json!({"symmetric": true, "to": {"podSelector": null, "cidrs": ["10.0.0.0/8"]}}),
            "spec.to.podSelector",
        ),
        ("empty to", json!({"to": {"podSelector": null}}), "spec.to"),
        (
            "namespaceSelector without podSelector",
            json!({"to": {"podSelector": null, "namespaceSelector": {}, "cidrs": ["10.0.0.0/8"]}}),
            "spec.to.namespaceSelector",
        ),
        ("CIDR with host bits", json!({"to": {"cidrs": ["10.0.0.1/8"]}}), "spec.to.cidrs[0]"),
        ("CIDR not a CIDR", json!({"to": {"cidrs": ["10.0.0.0"]}}), "spec.to.cidrs[0]"),
        ("unknown profile", json!({"profile": "5g"}), "spec.profile"),
        ("unknown services mode", json!({"to": {"services": "All"}}), "spec.to.services"),
        ("priority as text", json!({"priority": "high"}), "spec.priority"),
        ("verify as text", json!({"verify": "no"}), "spec.verify"),
        ("reverse jitter without latency", json!({"reverse": {"jitter": "5ms"}}), "spec.reverse.jitter"),
        ("reverse bandwidth in Mbps", json!({"reverse": {"bandwidth": "10Mbps"}}), "spec.reverse.bandwidth"),
        ("unknown field", imp(json!({"delay": "10ms"})), "spec.impairment.delay"),
        ("missing from", json!({"from": null}), "spec.from"),
        (
            "unknown selector operator",
            from_expression(json!({"key": "app", "operator": "Has"})),
            "matchExpressions[0].operator",
        ),
        (
            "In without values",
            from_expression(json!({"key": "app", "operator": "In"})),
            "spec.from.podSelector.matchExpressions[0]",
        ),
        ("only an empty list of CIDRs", json!({"to": {"podSelector": null, "cidrs": []}}), "spec.to"),
        ("a phase under 1ms", schedule(json!({"phases": [{"duration": "999us"}]})), "spec.schedule.phases[0].duration"),
        ("a flap that is never up", schedule(json!({"flap": {"up": "0", "down": "1s"}})), "spec.schedule.flap.up"),
        (
            "a trace window under 10ms",
            schedule(json!({"trace": {"configMap": "t", "uplink": "u", "window": "5ms"}})),
            "spec.schedule.trace.window",
        ),
        (
            "a downlink trace on a one-way link",
            schedule(json!({"trace": {"configMap": "t", "downlink": "d"}})),
            "spec.schedule.trace.downlink",
        ),
        (
            "a reverse ramp on a one-way link",
            schedule(
                json!({"ramp": {"field": "Latency", "from": "0", "to": "9ms", "step": "1ms", "over": "9s", "direction": "Reverse"}}),
            ),
            "spec.schedule.ramp.direction",
        ),
        (
            "a phase's reverse on a one-way link",
            schedule(json!({"phases": [{"duration": "1s", "reverse": {"latency": "1ms"}}]})),
            "spec.schedule.phases",
        ),
        (
            "a phase's reverse on a symmetric link",
            merge(
                &schedule(json!({"phases": [{"duration": "1s", "reverse": {"latency": "1ms"}}]})),
                &json!({"symmetric": true}),
            ),
            "spec.schedule.phases",
        ),
        (
            "a flap jitter of 90%",
            schedule(json!({"flap": {"up": "1s", "down": "1s", "jitter": "90%"}})),
            "spec.schedule.flap.jitter",
        ),
        ("a latency ramp in minutes", ramp("Latency", "0", "1m", "1ms", "60s"), "spec.schedule.ramp.to"),
        ("a loss ramp in ms", ramp("Loss", "10ms", "20%", "1%", "60s"), "spec.schedule.ramp.from"),
        ("a latency ramp past an hour", ramp("Latency", "0", "3601s", "1s", "3600s"), "spec.schedule.ramp.to"),
        (
            "a bandwidth step under 100bit",
            ramp("Bandwidth", "1Mbit", "2Mbit", "50bit", "60s"),
            "spec.schedule.ramp.step",
        ),
        ("a ramp that does not move", ramp("Latency", "0", "10ms", "0", "60s"), "spec.schedule.ramp.step"),
        ("a loss ramp that does not move", ramp("Loss", "0%", "10%", "0.0%", "60s"), "spec.schedule.ramp.step"),
        ("a ramp of 3600 steps", ramp("Latency", "0", "3600ms", "1ms", "3600s"), "spec.schedule.ramp.step"),
        ("a ramp whose steps last under 1ms", ramp("Latency", "0", "10ms", "1ms", "9ms"), "spec.schedule.ramp.over"),
        ("a ramp over less than 1ms", ramp("Latency", "0", "10ms", "10ms", "999us"), "spec.schedule.ramp.over"),
        (
            "a latency ramp to 0 under a jitter",
            merge(&ramp("Latency", "10ms", "0", "1ms", "60s"), &json!({"impairment": {"jitter": "1ms"}})),
            "spec.schedule.ramp",
        ),
        (
            "a latency ramp to 0 under a reverse reorder",
            merge(
                &ramp("Latency", "10ms", "0", "1ms", "60s"),
                &json!({"reverse": {"latency": "5ms", "reorder": {"percent": "1%"}}}),
            ),
            "spec.schedule.ramp",
        ),
        (
            "a jitter ramp without a latency",
            merge(&ramp("Jitter", "0", "5ms", "1ms", "60s"), &json!({"impairment": {"latency": "0"}})),
            "spec.schedule.ramp",
        ),
        ("a jitter ramp wider than netem's", ramp("Jitter", "0", "3s", "1s", "60s"), "spec.schedule.ramp"),
        (
            "a jitter ramp to 0 under a jitter correlation",
            merge(
                &ramp("Jitter", "5ms", "0", "1ms", "60s"),
                &json!({"impairment": {"jitter": "5ms", "jitterCorrelation": "25%"}}),
            ),
            "spec.schedule.ramp",
        ),
        (
            "a bandwidth ramp below what the burst needs",
            merge(
                &ramp("Bandwidth", "1Mbit", "1kbit", "111kbit", "60s"),
                &json!({"impairment": {"bandwidth": "1Mbit", "burst": "1MiB"}}),
            ),
            "spec.schedule.ramp",
        ),
    ]
}

/// A schedule of one ramp.
fn ramp(field: &str, from: &str, to: &str, step: &str, over: &str) -> Value {
    schedule(json!({"ramp": {"field": field, "from": from, "to": to, "step": step, "over": over}}))
}

/// (case, patch to the valid base spec, field the server must name): selectors the API keeps out as it does
/// those of built-in objects (past their bounds, values where none belong), though the operator could evaluate
/// them.
pub fn kept_out_cases() -> Vec<(&'static str, Value, &'static str)> {
    let labels = |n: usize, key: &str, value: &str| {
        let m: serde_json::Map<String, Value> = (0..n).map(|i| (format!("{key}{i}"), json!(value))).collect();
        json!({"from": {"podSelector": {"matchLabels": m}}})
    };
    vec![
        (
            "Exists with values",
            from_expression(json!({"key": "app", "operator": "Exists", "values": ["a"]})),
            "spec.from.podSelector.matchExpressions[0]",
        ),
        ("65 labels", labels(65, "k", "v"), "spec.from.podSelector.matchLabels"),
        ("a label key of 318 characters", labels(1, &"k".repeat(317), "v"), "spec.from.podSelector.matchLabels"),
        ("a label value of 64 characters", labels(1, "k", &"v".repeat(64)), "spec.from.podSelector.matchLabels"),
        (
            "65 values",
            from_expression(
                json!({"key": "app", "operator": "In", "values": (0..65).map(|i| i.to_string()).collect::<Vec<_>>()}),
            ),
            "spec.from.podSelector.matchExpressions[0].values",
        ),
    ]
}

pub fn from_expression(requirement: Value) -> Value {
    json!({"from": {"podSelector": {"matchLabels": null, "matchExpressions": [requirement]}}})
}

pub fn schedule(schedule: Value) -> Value {
    json!({"schedule": schedule})
}

pub fn valid_cases() -> Vec<(&'static str, Value)> {
    vec![
        ("base", json!({})),
        ("zero latency", json!({"impairment": {"latency": "0"}})),
        (
            "every field",
            json!({
                "profile": "lte",
                "priority": 7,
                "impairment": {
                    "latency": "80ms", "jitter": "1.5ms", "jitterCorrelation": "25%",
                    "loss": {"gilbertElliott": {"p": "1%", "r": "20%", "lossInBad": "90%", "lossInGood": "0.1%"}},
                    "duplicate": {"percent": "0.5%", "correlation": "10%"},
                    "corrupt": {"percent": "0.01%"},
                    "reorder": {"percent": "5%", "correlation": "50%", "gap": 3},
                    "bandwidth": "1.5Gbit", "burst": "4095MiB", "queueLimit": 10000
                },
                "reverse": {"latency": "500us", "loss": {"percent": "100%", "correlation": "0%"}, "bandwidth": "64kbit"},
                "to": {"cidrs": ["203.0.113.0/24", "2001:db8::/32"], "services": "Ignore"}
            }),
        ),
        ("symmetric", json!({"symmetric": true, "impairment": {"latency": "3600s", "jitter": "1s"}})),
        (
            "one-way profile across namespaces",
            json!({"profile": "geo-satellite", "oneWay": true, "impairment": null, "to": {"namespaceSelector": {"matchLabels": {"env": "prod"}}}}),
        ),
        ("bandwidth bounds", json!({"impairment": {"bandwidth": "100bit"}, "reverse": {"bandwidth": "1000Gbit"}})),
        ("the deepest burst", json!({"impairment": {"bandwidth": "1kbit", "burst": "34250B"}})),
        ("a burst the profile's uplink sends in time", json!({"profile": "edge", "impairment": {"burst": "6MiB"}})),
        ("the widest jitter", json!({"impairment": {"latency": "3s", "jitter": "2.147483647s"}})),
        ("verification off", json!({"verify": false})),
        ("verification on, said explicitly", json!({"verify": true})),
        ("a latency ramp to 0 without jitter", ramp("Latency", "10ms", "0", "1ms", "60s")),
        ("the most steps, each 1ms", ramp("Latency", "0", "3599ms", "1ms", "3599ms")),
        (
            "a jitter ramp over a profile's latency, both ways",
            merge(&ramp("Jitter", "0", "2.147483647s", "1s", "3s"), &json!({"profile": "lte", "impairment": null})),
        ),
        ("a bandwidth ramp to the bounds", ramp("Bandwidth", "100bit", "1000Gbit", "1000Gbit", "1ms")),
        ("a loss ramp in the finest step", ramp("Loss", "0%", "0.000001%", "0.000000001%", "1000s")),
    ]
}
