//! The bounds of what the operator writes into a status, declared once: the CRDs' schemas carry them (so the API
//! server refuses anything longer) and the operator cuts every status to them before it compares or writes one.
//!
//! Why both: a spec is bounded, but what a status repeats of it (selectors, names, kernel messages, the API
//! server's own answers nested in a topology's condition) is not, and a status the server refuses for its size is
//! a status never written. Cutting to the schema's own figures keeps every write admissible, and the schema makes
//! the promise visible to `kubectl explain`. A maximal status stays far below the API server's object size limit
//! (operator/tests/status_bounds.rs measures it).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator};
use serde_json::{Value, json};

/// Conditions one status holds (a link has four types, a topology one).
pub const MAX_CONDITIONS: usize = 8;
/// A condition's type and reason, and a failure's reason: CamelCase words.
pub const MAX_REASON: usize = 64;
/// A condition's or a failure's message, for people.
pub const MAX_MESSAGE: usize = 1024;
/// A summary for a `kubectl get` column (`from`, `to`, latency, loss, bandwidth, round trips, topology summary).
pub const MAX_SUMMARY: usize = 256;
/// A figure: a measured duration, share or window (`121.4ms`, `0.1%–1.6%`), a matrix cell.
pub const MAX_FIGURE: usize = 32;
/// An object's name (a DNS subdomain) or a node's.
pub const MAX_NAME: usize = 253;
/// A region's or a phase's name (a DNS label, or `window N`).
pub const MAX_LABEL: usize = 63;
/// A pod as `namespace/name`.
pub const MAX_POD: usize = 63 + 1 + 253;

/// `s` cut to at most `max` characters (as the API server counts them), the last one `…` where it was cut.
pub fn cut(s: &mut String, max: usize) {
    if s.chars().count() > max {
        *s = s.chars().take(max.saturating_sub(1)).chain(['…']).collect();
    }
}

/// [`cut`] for an optional string.
pub fn cut_opt(s: &mut Option<String>, max: usize) {
    if let Some(s) = s {
        cut(s, max);
    }
}

/// Conditions cut to [`MAX_CONDITIONS`] and their fields to theirs.
pub fn cut_conditions(conditions: &mut Vec<Condition>) {
    conditions.truncate(MAX_CONDITIONS);
    for c in conditions {
        cut(&mut c.type_, MAX_REASON);
        cut(&mut c.reason, MAX_REASON);
        cut(&mut c.message, MAX_MESSAGE);
    }
}

/// `schema_with` for `status.conditions`: Kubernetes' `Condition` as k8s-openapi describes it, with the bounds
/// above and `status` one of the three values the API defines.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = generator.subschema_for::<Vec<Condition>>();
    schema.insert("maxItems".into(), MAX_CONDITIONS.into());
    let properties = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(Value::as_object_mut)
        .expect("k8s-openapi's Condition schema is an object with properties, inlined");
    let mut bound = |field: &str, extra: Value| {
        let property = properties.get_mut(field).and_then(Value::as_object_mut).expect("a Condition field");
        property.extend(extra.as_object().expect("an object").clone());
    };
    bound("type", json!({"maxLength": MAX_REASON}));
    bound("reason", json!({"maxLength": MAX_REASON}));
    bound("message", json!({"maxLength": MAX_MESSAGE}));
    bound("status", json!({"enum": ["True", "False", "Unknown"]}));
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_short_strings_and_ends_long_ones_in_an_ellipsis() {
        let mut short = "é".repeat(5);
        cut(&mut short, 5);
        assert_eq!(short, "ééééé");
        let mut long = "é".repeat(6);
        cut(&mut long, 5);
        assert_eq!(long, "éééé…");
        let mut none = None;
        cut_opt(&mut none, 1);
        assert_eq!(none, None);
    }
}
